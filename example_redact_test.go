package bgjob_test

import (
	"context"
	"fmt"

	"github.com/bgjob/bgjob"
)

// A Redactor masks secrets in output and keeps every line break, so a
// registry configured with it (Config{Admitter: bgjob.Redactor{}}) still
// maps Read offsets line by line. Placeholders such as ${NPM_TOKEN} are
// left as they are. Here it is called directly.
func ExampleRedactor() {
	out := "deploying as deploy@example.com\n" +
		"export AWS_ACCESS_KEY_ID=AKIA" + "IOSFODNN7EXAMPLE\n" +
		"curl -H 'Authorization: Bearer eyJhbGciOiJIUzI1NiJ9.e30.sig123' https://api.example.com\n" +
		"-----BEGIN RSA PRIVATE KEY-----\n" +
		"MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM\n" +
		"-----END RSA PRIVATE KEY-----\n" +
		"db: password=hunter2 host=db.internal\n" +
		"sshpass -p hunter2 ssh deploy@10.0.3.7\n" +
		"//registry.npmjs.org/:_authToken=${NPM_TOKEN}\n"

	a, err := bgjob.Redactor{}.Admit(context.Background(), bgjob.AdmitRequest{Text: out})
	if err != nil {
		panic(err)
	}
	fmt.Print(a.Text)
	fmt.Println(a.Notice)
	// Output:
	// deploying as deploy@example.com
	// export AWS_ACCESS_KEY_ID=[REDACTED:aws-key]
	// curl -H 'Authorization: Bearer [REDACTED:bearer]' https://api.example.com
	// [REDACTED:private-key]
	// [REDACTED:private-key]
	// [REDACTED:private-key]
	// db: password=[REDACTED:password] host=db.internal
	// sshpass -p [REDACTED:password] ssh deploy@10.0.3.7
	// //registry.npmjs.org/:_authToken=${NPM_TOKEN}
	// redacted 5 secrets
}
