package bgjob_test

import (
	"context"
	"encoding/base64"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
	"unsafe"

	"github.com/bgjob/bgjob"
	"go.uber.org/goleak"
)

// Both a Redactor and a pointer to one are Admitters.
var (
	_ bgjob.Admitter = bgjob.Redactor{}
	_ bgjob.Admitter = &bgjob.Redactor{}
)

// Fake secrets, built by concatenation so that secret scanners do not
// flag this file. The AWS ones are the examples of AWS's documentation.
var (
	fakeAWSKey    = "AKIA" + "IOSFODNN7EXAMPLE"
	fakeAWSTemp   = "ASIA" + "Y34FZKBOKMUTVV7A"
	fakeAWSSecret = "wJalrXUtnFEMI/K7MDENG/" + "bPxRfiCYEXAMPLEKEY"
	fakeGHP       = fakeGitHub("ghp", "k3J9xQ2mZ7vB1nR5tW8yL4pD6sF0hG")
	fakeGHS       = fakeGitHub("ghs", "Pq8Wz3Lr6Tn1Vb4Xc7Hm2Jd5Kf9Gs0")
	fakeGHPAT     = "github" + "_pat_" + "11ABCDEFG0" + strings.Repeat("aB3_", 18)
	fakeSlack     = "xox" + "b-730184526193-4820596317042-" + "Qm7TzR2vXk9LpW4sNc8YhB3d"
	fakeJWT       = "eyJhbGciOiJIUzI1NiJ9" + ".eyJzdWIiOiIxMjM0In0.dBjftJeZ4CVPmB92K27uhbUJU1p1r_wW1gFWFOEjXk"
	pemBody       = []string{
		"MIIEpAIBAAKCAQEA3Tz2mr7SZiAMfQyuvBjM9Oi4b2Lh5yZ8Ch4p6bnYxKqZ0vWl",
		"k7aHkZ2nq1Xw0BvNwPz3q1kGmXH2VdWx8Gf0m7S9eYkNfQ3uC2k1mXq9Ym4Lh0aQ",
		"p2Jc8lQ==",
	}
)

// fakeGitHub returns a token of GitHub's shape: the prefix, 30 random
// characters and their CRC32 in base62, which the Redactor checks.
func fakeGitHub(prefix, random30 string) string {
	const base62 = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	c := crc32.ChecksumIEEE([]byte(random30))
	sum := make([]byte, 6)
	for i := 5; i >= 0; i-- {
		sum[i] = base62[c%62]
		c /= 62
	}
	return prefix + "_" + random30 + string(sum)
}

func pemBlock(kind string) []string {
	lines := []string{"-----BEGIN " + kind + "PRIVATE KEY-----"}
	lines = append(lines, pemBody...)
	return append(lines, "-----END "+kind+"PRIVATE KEY-----")
}

func redact(t *testing.T, r bgjob.Redactor, in string) (string, string) {
	t.Helper()
	a, err := r.Admit(context.Background(), bgjob.AdmitRequest{Text: in})
	if err != nil || a.Withhold {
		t.Fatalf("Admit: err %v, withhold %v; want neither", err, a.Withhold)
	}
	return a.Text, a.Notice
}

func TestRedactorKinds(t *testing.T) {
	const (
		aws  = "[REDACTED:aws-key]"
		awsS = "[REDACTED:aws-secret]"
		gh   = "[REDACTED:github-token]"
		sl   = "[REDACTED:slack-token]"
		br   = "[REDACTED:bearer]"
		au   = "[REDACTED:authorization]"
		pw   = "[REDACTED:password]"
		tok  = "[REDACTED:token]"
		sec  = "[REDACTED:secret]"
	)
	for _, tc := range []struct {
		name, in, want string
		n              int
	}{
		{"aws-key", "id " + fakeAWSKey + " ok", "id " + aws + " ok", 1},
		{"aws-key-temporary", "AccessKeyId: " + fakeAWSTemp, "AccessKeyId: " + aws, 1},
		{"aws-key-in-assignment", "aws_access_key_id=" + fakeAWSKey, "aws_access_key_id=" + aws, 1},
		{"aws-secret-ini", "aws_secret_access_key = " + fakeAWSSecret, "aws_secret_access_key = " + awsS, 1},
		{"aws-secret-env", "AWS_SECRET_ACCESS_KEY=" + fakeAWSSecret + " aws s3 ls", "AWS_SECRET_ACCESS_KEY=" + awsS + " aws s3 ls", 1},
		{"aws-secret-json", `"SecretAccessKey": "` + fakeAWSSecret + `",`, `"SecretAccessKey": "` + awsS + `",`, 1},
		{"github-ghp", "token " + fakeGHP + " end", "token " + gh + " end", 1},
		{"github-in-url", "remote: https://x-access-token:" + fakeGHS + "@github.com/o/r", "remote: https://x-access-token:" + gh + "@github.com/o/r", 1},
		{"github-after-key", "GITHUB_TOKEN=" + fakeGHS, "GITHUB_TOKEN=" + gh, 1},
		{"github-prefixes", "gho_" + fakeGHP[4:] + " ghu_" + fakeGHP[4:] + " ghr_" + fakeGHP[4:], gh + " " + gh + " " + gh, 3},
		{"github-pat", "GH=" + fakeGHPAT, "GH=" + gh, 1},
		{"slack", "slack " + fakeSlack + ".", "slack " + sl + ".", 1},
		{"slack-user", "xox" + "p-4917263058-7f3a9c2e1b", sl, 1},
		{"authorization-bearer", "Authorization: Bearer " + fakeJWT, "Authorization: Bearer " + br, 1},
		{"authorization-bearer-lower", "authorization: bearer abcdefgh", "authorization: bearer " + br, 1},
		{"authorization-bearer-mixed-case", "AUTHORIZATION: BeArEr abcdefgh", "AUTHORIZATION: BeArEr " + br, 1},
		{"authorization-curl", `curl -H "Authorization: Bearer 0a1b2c3d4e" https://x`, `curl -H "Authorization: Bearer ` + br + `" https://x`, 1},
		{"authorization-json", `{"authorization": "Bearer abc def"}`, `{"authorization": "Bearer ` + br + `"}`, 1},
		{"authorization-basic", "> Authorization: Basic dXNlcjpwYXNz", "> Authorization: Basic " + au, 1},
		{"authorization-bare", "authorization=c2VjcmV0", "authorization=" + au, 1},
		{"bearer-alone", "using Bearer " + fakeJWT + " now", "using Bearer " + br + " now", 1},
		{"password-eq", "password=hunter2 next", "password=" + pw + " next", 1},
		{"password-colon", "password: hunter2", "password: " + pw, 1},
		{"password-upper-prefixed", "export DB_PASSWORD=s3cr3t!", "export DB_PASSWORD=" + pw, 1},
		{"password-flag", "mysql --password=hunter2 -u root", "mysql --password=" + pw + " -u root", 1},
		{"password-quoted-spaces", `password = "correct horse battery"`, `password = "` + pw + `"`, 1},
		{"password-quoted-unclosed", `password: 'correct horse`, `password: '` + pw, 1},
		{"password-json", `{"user": "bob", "Password": "hunter2"}`, `{"user": "bob", "Password": "` + pw + `"}`, 1},
		{"password-walrus", `password := "hunter2"`, `password := "` + pw + `"`, 1},
		{"password-arrow", `'password' => 'hunter2',`, `'password' => '` + pw + `',`, 1},
		{"passwd", "passwd=hunter2", "passwd=" + pw, 1},
		{"secret", "secret=abc123", "secret=" + sec, 1},
		{"client-secret-yaml", "  client_secret: abc123", "  client_secret: " + sec, 1},
		{"api-key", "curl https://api.example.com/?api_key=abc123&x=1", "curl https://api.example.com/?api_key=" + sec + "&x=1", 1},
		{"token", "token=abc123", "token=" + tok, 1},
		{"access-token-json", `"access_token":"abc.def.ghi"`, `"access_token":"` + tok + `"`, 1},
		{"header-token", "X-Auth-Token: 5f2b9c", "X-Auth-Token: " + tok, 1},
		{"url-userinfo", "cloning https://bob:hunter2@example.com/repo.git", "cloning https://bob:" + pw + "@example.com/repo.git", 1},
		{"crlf-kept", "password=hunter2\r\nok\r\n", "password=" + pw + "\r\nok\r\n", 1},
		{"several-per-line",
			"AKIA: " + fakeAWSKey + " gh " + fakeGHP + " password=x token=y " + fakeSlack,
			"AKIA: " + aws + " gh " + gh + " password=" + pw + " token=" + tok + " " + sl, 5},
		{"overlapping-counts-once", "password=" + fakeAWSKey, "password=" + aws, 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, n := bgjob.Redactor{}.Redact(tc.in)
			if got != tc.want || n != tc.n {
				t.Errorf("Redact(%q)\ngot  %q, %d\nwant %q, %d", tc.in, got, n, tc.want, tc.n)
			}
		})
	}
}

func TestRedactorPEM(t *testing.T) {
	const pk = "[REDACTED:private-key]"
	masked := func(n int) []string {
		s := make([]string, n)
		for i := range s {
			s[i] = pk
		}
		return s
	}
	block := pemBlock("RSA ")
	cat := func(parts ...[]string) string {
		var all []string
		for _, p := range parts {
			all = append(all, p...)
		}
		return strings.Join(all, "\n") + "\n"
	}
	// What the registry puts between head and tail when it dropped bytes.
	omission := []string{"[... 4096 bytes omitted ...]"}
	for _, tc := range []struct {
		name, in, want string
		n              int
	}{
		{"block", cat([]string{"before"}, block, []string{"after"}),
			cat([]string{"before"}, masked(len(block)), []string{"after"}), 1},
		{"kinds", cat(pemBlock(""), pemBlock("EC "), pemBlock("OPENSSH "), pemBlock("ENCRYPTED "), pemBlock("PGP ")),
			cat(masked(5 * len(block))), 5},
		{"pgp-block", "-----BEGIN PGP PRIVATE KEY BLOCK-----\nabc\n-----END PGP PRIVATE KEY BLOCK-----\n", cat(masked(3)), 1},
		{"begin-without-end", cat([]string{"before"}, block[:2]), cat([]string{"before"}, masked(2)), 1},
		{"end-without-begin", cat(block[2:], []string{"after"}), cat(masked(len(block)-2), []string{"after"}), 1},
		{"lone-end-after-block", cat(block, []string{"x"}, block[2:]), cat(masked(len(block)), masked(1), masked(len(block)-2)), 2},
		{"empty-lines-kept", "-----BEGIN PRIVATE KEY-----\n\nabc\n-----END PRIVATE KEY-----\n", pk + "\n\n" + pk + "\n" + pk + "\n", 1},
		{"crlf", "-----BEGIN PRIVATE KEY-----\r\nabc\r\n-----END PRIVATE KEY-----\r\nok\r\n", pk + "\r\n" + pk + "\r\n" + pk + "\r\nok\r\n", 1},
		{"one-line-json", `{"private_key": "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n", "x": 1}` + "\n" + "next\n",
			pk + "\nnext\n", 1},
		{"no-final-newline", "a\n-----BEGIN PRIVATE KEY-----\nabc", "a\n" + pk + "\n" + pk, 1},
		{"omission-ends-section", cat([]string{"head"}, block[:3], omission, block[3:], []string{"tail"}),
			cat([]string{"head"}, masked(3), omission, masked(len(block)-3), []string{"tail"}), 2},
		{"omission-after-block", cat(block, omission, []string{"tail"}), cat(masked(len(block)), omission, []string{"tail"}), 1},
		{"omission-open-block-tail-clean", cat(block[:2], omission, []string{"tail"}), cat(masked(2), omission, []string{"tail"}), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, n := bgjob.Redactor{}.Redact(tc.in)
			if got != tc.want || n != tc.n {
				t.Errorf("Redact(%q)\ngot  %q, %d\nwant %q, %d", tc.in, got, n, tc.want, tc.n)
			}
		})
	}
}

// Text that holds no secret comes back as the very same string, with no
// notice.
func TestRedactorNoFalsePositives(t *testing.T) {
	for _, in := range []string{
		"",
		"hello, world\n",
		"commit 9fceb02d0ae598e95dc970b74767f19372d61af8\nAuthor: Bob <bob@example.com>\nDate:   Mon Jan 2 15:04:05 2006 -0700\n",
		"sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855  go.sum\n",
		"md5 d41d8cd98f00b204e9800998ecf8427e, blake3 af1349b9f5f9a1a6a0404dea36dcc9499bcb25c9adc112b7cc9a93cae41f3262\n",
		"2024-01-02T15:04:05Z INFO listening on http://127.0.0.1:8080/path?q=1&r=2\n",
		"ssh://git@github.com:22/org/repo.git\n",
		"if token == nil || secret != want || passwd <= 3 {\n",
		"let t = Token::new(); token_count: 5, max_tokens=4096, secrets: inherit\n",
		"the bearer of this letter; bearer authentication is described in RFC 6750\n",
		"ASIA and AKIA are just words; AKIAIOSFODNN7EXAMPLEX is too long\n",
		"load the PRIVATE KEY from disk; -----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n",
		"-----BEGIN PUBLIC KEY-----\nMFkw\n-----END PUBLIC KEY-----\n",
		"password:\nsecret =\ntoken: \"\"\n",
		"ghp_short xoxb-short github_pat_short\n",
		"[REDACTED:password] [REDACTED] [... 12 bytes omitted ...]\n",
		"\x00\xff\xfe binary = : \x00\n",
	} {
		got, notice := redact(t, bgjob.Redactor{}, in)
		if got != in || notice != "" {
			t.Errorf("Admit(%q) = %q, notice %q; want the text unchanged, no notice", in, got, notice)
		}
		if len(in) > 0 && unsafe.StringData(got) != unsafe.StringData(in) {
			t.Errorf("Admit(%q) returned a copy; want the same string", in)
		}
	}
}

func TestRedactorNotice(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"clean", ""},
		{"password=x", "redacted 1 secret"},
		{"password=x\n" + strings.Join(pemBlock(""), "\n") + "\n" + fakeAWSKey, "redacted 3 secrets"},
	} {
		_, notice := redact(t, bgjob.Redactor{}, tc.in)
		if notice != tc.want {
			t.Errorf("Admit(%q).Notice = %q; want %q", tc.in, notice, tc.want)
		}
	}
	// A pointer works as well as a value.
	var a bgjob.Admitter = &bgjob.Redactor{}
	got, err := a.Admit(context.Background(), bgjob.AdmitRequest{Text: "token=abc", Partial: true})
	if err != nil || got.Text != "token=[REDACTED:token]" || got.Notice != "redacted 1 secret" {
		t.Errorf("(*Redactor).Admit = %+v, %v; want the token masked", got, err)
	}
}

func TestRedactorExtra(t *testing.T) {
	r := bgjob.Redactor{Extra: []*regexp.Regexp{
		regexp.MustCompile(`(?i)session_id=(\S+)`),
		regexp.MustCompile(`ACME-[0-9]{6}`),
		regexp.MustCompile(`(?s)<<SECRET.*?SECRET>>`),
		regexp.MustCompile(`(unmatched)?xyz`), // a group that does not take part
		nil,                                   // ignored
	}}
	for _, tc := range []struct {
		name, in, want string
		n              int
	}{
		{"group", "SESSION_ID=abc123 ok", "SESSION_ID=[REDACTED] ok", 1},
		{"whole-match", "license ACME-123456 and ACME-654321", "license [REDACTED] and [REDACTED]", 2},
		{"multi-line-keeps-newlines", "a <<SECRET\nline\n\nSECRET>> b\n", "a [REDACTED]\n[REDACTED]\n\n[REDACTED] b\n", 1},
		{"empty-group-skipped", "xyz", "xyz", 0},
		{"with-builtin", "password=ACME-123456", "password=[REDACTED:password]", 1},
		{"omission-line-protected", "[... 123456 bytes omitted ...]\n", "[... 123456 bytes omitted ...]\n", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.name == "omission-line-protected" {
				r := bgjob.Redactor{Extra: []*regexp.Regexp{regexp.MustCompile(`\d+ bytes`)}}
				got, n := r.Redact(tc.in)
				if got != tc.want || n != tc.n {
					t.Errorf("got %q, %d; want %q, %d", got, n, tc.want, tc.n)
				}
				return
			}
			got, n := r.Redact(tc.in)
			if got != tc.want || n != tc.n {
				t.Errorf("Redact(%q)\ngot  %q, %d\nwant %q, %d", tc.in, got, n, tc.want, tc.n)
			}
		})
	}
}

// secretLines are lines that each hold at least one secret.
var secretLines = []string{
	"export AWS_ACCESS_KEY_ID=" + fakeAWSKey,
	"aws_secret_access_key = " + fakeAWSSecret,
	"remote: https://x-access-token:" + fakeGHS + "@github.com/o/r",
	"GITHUB_TOKEN=" + fakeGHP + " " + fakeGHPAT,
	"SLACK=" + fakeSlack,
	"> Authorization: Bearer " + fakeJWT,
	`{"password": "p4ss w0rd", "api_key": "k"}`,
	"postgres://app:hunter2@db:5432/app token: t0k",
	strings.Join(pemBlock("OPENSSH "), "\n"),
}

var plainLines = []string{
	"ok  \tgithub.com/bgjob/bgjob\t0.512s",
	"commit 9fceb02d0ae598e95dc970b74767f19372d61af8",
	"2024-01-02T15:04:05Z INFO request id=42 path=/v1/jobs status=200 dur=3ms",
	"",
	"\tat main.go:12: if err != nil {",
}

// The number of lines never changes, no secret survives, and a second
// pass changes nothing.
func TestRedactorLinesAndIdempotence(t *testing.T) {
	rnd := rand.New(rand.NewPCG(1, 2))
	for i := range 200 {
		var lines []string
		for range rnd.IntN(30) {
			if rnd.IntN(3) == 0 {
				lines = append(lines, secretLines[rnd.IntN(len(secretLines))])
			} else {
				lines = append(lines, plainLines[rnd.IntN(len(plainLines))])
			}
		}
		in := strings.Join(lines, "\n")
		if i%2 == 0 {
			in += "\n"
		}
		out, _ := bgjob.Redactor{}.Redact(in)
		if got, want := strings.Count(out, "\n"), strings.Count(in, "\n"); got != want {
			t.Fatalf("Redact(%q): %d line breaks; want %d", in, got, want)
		}
		for _, s := range []string{fakeAWSKey, fakeAWSSecret, fakeGHS, fakeGHP, fakeGHPAT, fakeSlack, fakeJWT, "p4ss", "hunter2", "t0k", pemBody[0]} {
			if strings.Contains(out, s) {
				t.Fatalf("Redact(%q) = %q; holds %q", in, out, s)
			}
		}
		again, n := bgjob.Redactor{}.Redact(out)
		if again != out || n != 0 {
			t.Fatalf("second pass over %q = %q, %d; want it unchanged, 0", out, again, n)
		}
	}
}

func FuzzRedactor(f *testing.F) {
	for _, s := range append(secretLines, plainLines...) {
		f.Add(s + "\n")
	}
	f.Add(strings.Join(pemBlock("RSA "), "\n"))
	f.Add("a\n-----END PRIVATE KEY-----\n[... 3 bytes omitted ...]\n-----BEGIN PRIVATE KEY-----\nb")
	f.Fuzz(func(t *testing.T, in string) {
		out, n := bgjob.Redactor{}.Redact(in)
		if strings.Count(out, "\n") != strings.Count(in, "\n") {
			t.Fatalf("Redact(%q) = %q: line breaks changed", in, out)
		}
		if n == 0 && out != in {
			t.Fatalf("Redact(%q) = %q with no secret counted", in, out)
		}
		if again, m := (bgjob.Redactor{}).Redact(out); again != out || m != 0 {
			t.Fatalf("Redact(%q) = %q; again %q, %d; want idempotent", in, out, again, m)
		}
	})
}

func TestRedactorConcurrent(t *testing.T) {
	defer goleak.VerifyNone(t)
	r := &bgjob.Redactor{Extra: []*regexp.Regexp{regexp.MustCompile(`ACME-[0-9]+`)}}
	in := strings.Join(secretLines, "\n") + "\nACME-42\n"
	want, _ := r.Redact(in)
	var wg sync.WaitGroup
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 50 {
				a, err := r.Admit(context.Background(), bgjob.AdmitRequest{Text: in, Partial: true})
				if err != nil || a.Text != want {
					t.Errorf("concurrent Admit = %q, %v; want %q", a.Text, err, want)
					return
				}
			}
		}()
	}
	wg.Wait()
}

// Through a Registry: the final text is redacted around the omission
// line, which stays whole, and Read after the job's end maps raw offsets
// to the redacted text line for line.
func TestRedactorRegistry(t *testing.T) {
	if runtime.GOOS == "windows" {
		t.Skip("the command is a /bin/sh script")
	}
	defer goleak.VerifyNone(t)
	r, err := bgjob.New(bgjob.Config{Admitter: bgjob.Redactor{}, HeadBytes: 120, TailBytes: 400, KillGrace: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	defer func() {
		if err := r.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()
	first := "start password=hunter2"
	lines := []string{first, "-----BEGIN RSA PRIVATE KEY-----"}
	for range 12 {
		lines = append(lines, pemBody[0])
	}
	lines = append(lines, "-----END RSA PRIVATE KEY-----", "done token=t0k")
	var cmd strings.Builder
	cmd.WriteString("printf '%s\\n'")
	for _, l := range lines {
		cmd.WriteString(" '" + l + "'")
	}
	s, err := r.Start(ctx, bgjob.Spec{Command: cmd.String()})
	if err != nil {
		t.Fatal(err)
	}
	s, err = r.Wait(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	out := s.Output
	if out.Omitted == 0 || !strings.Contains(out.Text, fmt.Sprintf("[... %d bytes omitted ...]\n", out.Omitted)) {
		t.Fatalf("Text %q, Omitted %d; want an omission line", out.Text, out.Omitted)
	}
	for _, secret := range []string{"hunter2", "t0k", pemBody[0][:16]} {
		if strings.Contains(out.Text, secret) {
			t.Errorf("Text %q holds %q", out.Text, secret)
		}
	}
	if !strings.Contains(out.Notice, "redacted") {
		t.Errorf("Notice %q; want a redaction count", out.Notice)
	}
	// Read line by line: each chunk is one admitted line whose offsets
	// are those of the raw line.
	c, err := r.Read(s.ID, 0, 1)
	if err != nil {
		t.Fatal(err)
	}
	if want := "start password=[REDACTED:password]\n"; c.Data != want || c.Offset != 0 || c.Next != int64(len(first)+1) {
		t.Errorf("Read(0, 1) = %+v; want Data %q, Offset 0, Next %d", c, want, len(first)+1)
	}
	var data strings.Builder
	skipped := int64(0)
	for off := int64(0); ; {
		c, err := r.Read(s.ID, off, 64)
		if err != nil {
			t.Fatal(err)
		}
		data.WriteString(c.Data)
		skipped += c.Skipped
		if c.Done {
			break
		}
		if c.Next <= off {
			t.Fatalf("Read(%d) = %+v: no progress", off, c)
		}
		off = c.Next
	}
	if skipped != out.Omitted {
		t.Errorf("Read skipped %d bytes; want %d", skipped, out.Omitted)
	}
	if got, want := data.String(), strings.Replace(out.Text, fmt.Sprintf("[... %d bytes omitted ...]\n", out.Omitted), "", 1); got != want {
		t.Errorf("chunks joined = %q; want the text without its omission line %q", got, want)
	}
}

// BenchmarkRedactor measures Admit over 1 MiB of build-log-like text,
// clean and with a secret about every 64 lines, and over 1 MiB of the
// corpus (testdata/redact): its ordinary output, and its shell output,
// where a secret is on about every third line.
func BenchmarkRedactor(b *testing.B) {
	clean := benchText(1<<20, nil)
	dirty := benchText(1<<20, secretLines)
	for _, bc := range []struct {
		name string
		text string
	}{
		{"clean-1MiB", clean}, {"secrets-1MiB", dirty},
		{"corpus-clean-1MiB", corpusText(b, "clean")}, {"corpus-shell-1MiB", corpusText(b, "shell")},
	} {
		b.Run(bc.name, func(b *testing.B) {
			var r bgjob.Redactor
			req := bgjob.AdmitRequest{Text: bc.text}
			b.SetBytes(int64(len(bc.text)))
			b.ReportAllocs()
			for b.Loop() {
				if _, err := r.Admit(context.Background(), req); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// corpusText returns 1 MiB of the files of a part of the corpus, one
// after the other (and again), without their annotations.
func corpusText(b *testing.B, part string) string {
	files, err := filepath.Glob(filepath.Join("testdata", "redact", part, "*"))
	if err != nil || len(files) == 0 {
		b.Fatalf("corpus %s: %v", part, err)
	}
	strip := strings.NewReplacer("⟦", "", "⟧", "", "⟪", "", "⟫", "")
	var sb strings.Builder
	for sb.Len() < 1<<20 {
		for _, f := range files {
			data, err := os.ReadFile(f)
			if err != nil {
				b.Fatal(err)
			}
			sb.WriteString(strip.Replace(string(data)))
		}
	}
	return sb.String()[:1<<20]
}

func benchText(size int, secrets []string) string {
	var sb strings.Builder
	for i := 0; sb.Len() < size; i++ {
		if len(secrets) > 0 && i%64 == 63 {
			sb.WriteString(secrets[(i/64)%len(secrets)])
		} else {
			fmt.Fprintf(&sb, "2024-01-02T15:04:%02dZ INFO compile pkg=%d file=src/mod%d/file.go:%d hash=%016x ok\n", i%60, i, i%97, i%1000, uint64(i)*0x9e3779b97f4a7c15)
			continue
		}
		sb.WriteByte('\n')
	}
	return sb.String()
}

// Inputs that once cost quadratic time (every marker of a long line
// looked back to the line's start) must take about linear time.
// pathological are inputs that once took quadratic time: 1 MiB of one
// repeated unit. BenchmarkRedactorPathological times them next to clean
// text, so a regression shows as a ratio, not as a flaky timed test.
var pathological = []string{
	"-----BEGIN PRIVATE KEY-----", "-----END PRIVATE KEY-----", "PRIVATE KEY",
	"token=", "password='", "[... ", "[REDACTED", "ghp_",
	// The scanners of vendor shapes, flags, URLs, XML, pairs, base64.
	"@", "://u:p@h", "sshpass -p ", "--password '", "-pX", "a_token ", "value=", "</",
	`"token", "`, "Q~", "eyJhbGciOiJIUzI1NiJ9.", "=sk-", "xoxb-", "AKIAAAAAAAAAAAAAAAAA",
	"Cookie: a=", "--cookie ", "key: \"", "data: YWJjZGVmZ2hpamtsbW5vcA==\n", "  password ",
	"aB3dE6gH9jK2mN5pQ8sT", "curl -u a:",
}

func TestRedactorPathologicalInputs(t *testing.T) {
	for _, unit := range pathological {
		in := strings.Repeat(unit, (64<<10)/len(unit))
		out, _ := bgjob.Redactor{}.Redact(in)
		if strings.Count(out, "\n") != strings.Count(in, "\n") {
			t.Errorf("Redact(64 KiB of %q): line breaks changed", unit)
		}
	}
}

func BenchmarkRedactorPathological(b *testing.B) {
	units := append([]string{"clean text line\n"}, pathological...)
	for _, unit := range units {
		in := strings.Repeat(unit, (1<<20)/len(unit))
		b.Run(fmt.Sprintf("%q", unit), func(b *testing.B) {
			b.SetBytes(int64(len(in)))
			for i := 0; i < b.N; i++ {
				bgjob.Redactor{}.Redact(in)
			}
		})
	}
}

// Pieces of fake secrets, random-looking so that the Redactor takes
// them for real ones, and put together at run time so that secret
// scanners do not flag this file.
const (
	fakeRand   = "q7Zk2Lm9Xv4Tn8Rb3Wc6Yp1Hd5Jf0GsA"
	fakeRandLo = "k2m9v4t8b3c6p1d5f0s7z2l9x4n8r3w6"
)

func b64(s string) string { return base64.StdEncoding.EncodeToString([]byte(s)) }

// TestRedactorShapes covers the vendor tokens found by their shape alone,
// and the placeholders of the same shapes that are left alone.
func TestRedactorShapes(t *testing.T) {
	openai := "sk-" + "proj-" + fakeRand + fakeRand + "T3BlbkFJ" + fakeRandLo + fakeRand
	anthropic := "sk-" + "ant-api03-" + fakeRand + fakeRandLo + fakeRand + "Ab_c-" + "AA"
	npm := fakeGitHub("npm", "Lr6Tn1Vb4Xc7Hm2Jd5Kf9Gs0Pq8Wz3")
	jwt := "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ" + ".eyJzdWIiOiJzeXN0ZW06c2VydmljZWFjY291bnQ6ZGVmYXVsdCJ9." + fakeRand + fakeRandLo
	hook := "https://hooks." + "slack.com/services/T0" + "8Q2L6Z3/B07X9K1M4P/" + fakeRand[:24]
	for _, tc := range []struct {
		name, in, want string
	}{
		{"openai", "created " + openai + " for ci", "created [REDACTED:openai-key] for ci"},
		{"anthropic", anthropic, "[REDACTED:anthropic-key]"},
		{"gitlab", "glpat" + "-" + fakeRand[:20], "[REDACTED:gitlab-token]"},
		{"npm-checksum-valid", npm, "[REDACTED:npm-token]"},
		{"npm-checksum-wrong", npm[:len(npm)-1] + "x", npm[:len(npm)-1] + "x"},
		{"github-checksum-wrong", "ghp" + "_" + fakeRand[:30] + "abcdef", "ghp" + "_" + fakeRand[:30] + "abcdef"},
		{"pypi", "pypi" + "-AgEIcHlwaS5vcmc" + fakeRand + fakeRandLo, "[REDACTED:pypi-token]"},
		{"sendgrid", "SG" + "." + fakeRand[:22] + "." + fakeRandLo + fakeRand[:11], "[REDACTED:sendgrid-key]"},
		{"huggingface", "hf" + "_" + "qZkLmXvTnRbWcYpHdJfGsAkMvTbCpDfQkL", "[REDACTED:huggingface-token]"},
		{"stripe", "sk" + "_live_" + fakeRand, "[REDACTED:stripe-key]"},
		{"stripe-placeholder", "sk" + "_test_xxxxxxxxxxxxxxxxxxxxxxxx", "sk" + "_test_xxxxxxxxxxxxxxxxxxxxxxxx"},
		{"azure-ad", "(" + "bP8" + "8Q~" + fakeRand + "." + ")", "([REDACTED:azure-secret])"},
		{"google", "AI" + "za" + fakeRand + "_x9", "[REDACTED:google-key]"},
		{"vault", "vault login hvs" + "." + fakeRand + fakeRandLo, "vault login [REDACTED:vault-token]"},
		{"jwt", jwt, "[REDACTED:jwt]"},
		{"jwt-truncated", "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ", "eyJhbGciOiJSUzI1NiIsImtpZCI6IjEifQ"},
		{"slack-webhook", "POST " + hook + " 404", "POST [REDACTED:slack-webhook] 404"},
		{"slack-placeholder", "xox" + "b-xxxxxxxxx-xxxxxxxxxx-xxxxxxxxxxxx", "xox" + "b-xxxxxxxxx-xxxxxxxxxx-xxxxxxxxxxxx"},
		{"aws-placeholder", "AKIA" + "XXXXXXXXXXXXXXXX", "AKIA" + "XXXXXXXXXXXXXXXX"},
		{"sha-and-uuid", "9fceb02d0ae598e95dc970b74767f19372d61af8 5b1d9c2e-7f3a-4e8b-9c0d-1e2f3a4b5c6d",
			"9fceb02d0ae598e95dc970b74767f19372d61af8 5b1d9c2e-7f3a-4e8b-9c0d-1e2f3a4b5c6d"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := (bgjob.Redactor{}).Redact(tc.in); got != tc.want {
				t.Errorf("Redact(%q)\ngot  %q\nwant %q", tc.in, got, tc.want)
			}
		})
	}
}

// TestRedactorForms covers the ways output writes a key and its value.
func TestRedactorForms(t *testing.T) {
	const (
		pw  = "[REDACTED:password]"
		tok = "[REDACTED:token]"
		sec = "[REDACTED:secret]"
	)
	pem := "-----BEGIN RSA " + "PRIVATE KEY-----\n" + strings.Join(pemBody, "\n") + "\n-----END RSA " + "PRIVATE KEY-----\n"
	for _, tc := range []struct {
		name, in, want string
	}{
		{"env-secret-key", "DJANGO_SECRET_KEY=" + fakeRand, "DJANGO_SECRET_KEY=" + sec},
		{"env-encryption-key", "ENCRYPTION_KEY=" + fakeRand, "ENCRYPTION_KEY=" + sec},
		{"env-mysql-pwd", "MYSQL_PWD=hunter2x9", "MYSQL_PWD=" + pw},
		{"env-pwd-is-a-directory", "PWD=/home/dev/src OLDPWD=/home/dev", "PWD=/home/dev/src OLDPWD=/home/dev"},
		{"env-auth-random", "REDIS_AUTH=" + fakeRand, "REDIS_AUTH=" + sec},
		{"env-auth-word", "auth: required", "auth: required"},
		{"env-credentials", "SERVICE_CREDENTIALS=" + fakeRand, "SERVICE_CREDENTIALS=" + sec},
		{"env-credentials-path", "GOOGLE_APPLICATION_CREDENTIALS=/var/secrets/key.json", "GOOGLE_APPLICATION_CREDENTIALS=/var/secrets/key.json"},
		{"test-verdict", "--- PASS: TestEncoderBuffering (0.00s)", "--- PASS: TestEncoderBuffering (0.00s)"},
		{"make-conditional", "API_TOKEN ?= abc123", "API_TOKEN ?= " + tok},
		{"make-immediate", "DB_PASSWORD ::= s3cr3t", "DB_PASSWORD ::= " + pw},
		{"php-append", "$secret .= 'abc123';", "$secret .= '" + sec + "';"},
		{"php-index", "$config['api_key'] = \"" + fakeRandLo + "\";", "$config['api_key'] = \"" + sec + "\";"},
		{"go-typed-var", `var dbPassword string = "s3cr3t"`, `var dbPassword string = "` + pw + `"`},
		{"rust-typed-const", `const API_KEY: &str = "` + fakeRandLo + `";`, `const API_KEY: &str = "` + sec + `";`},
		{"xml-element", "<password>s3cr3t</password>", "<password>" + pw + "</password>"},
		{"xml-attribute-pair", `<add key="ApiToken" value="` + fakeRand + `" />`, `<add key="ApiToken" value="` + tok + `" />`},
		{"quoted-pair", `props.setProperty("X_TOKEN", "` + fakeRand + `");`, `props.setProperty("X_TOKEN", "` + tok + `");`},
		{"quoted-pair-names", `case "Authorization", "Www-Authenticate", "Cookie":`, `case "Authorization", "Www-Authenticate", "Cookie":`},
		{"flag-long", "mysqldump --password s3cr3t app", "mysqldump --password " + pw + " app"},
		{"flag-sshpass", "sshpass -p s3cr3t ssh deploy@host", "sshpass -p " + pw + " ssh deploy@host"},
		{"flag-mysql-attached", "mysql -uroot -ps3cr3t%x app", "mysql -uroot -p" + pw + " app"},
		{"flag-p-elsewhere", "mkdir -p build", "mkdir -p build"},
		{"flag-curl-user", "curl -u admin:s3cr3t https://x", "curl -u admin:" + pw + " https://x"},
		{"flag-password-stdin", `echo "s3cr3t" | docker login -u ci --password-stdin reg`, `echo "` + pw + `" | docker login -u ci --password-stdin reg`},
		{"flag-prose", "WARNING! Using --password via the CLI is insecure.", "WARNING! Using --password via the CLI is insecure."},
		{"openssl-passin", "openssl rsa -in k.pem -passin pass:s3cr3t", "openssl rsa -in k.pem -passin pass:" + pw},
		{"underscore-key-blank", "rclone config create s3 s3 secret_access_key " + fakeRand, "rclone config create s3 s3 secret_access_key [REDACTED:aws-secret]"},
		{"table-row", "password    " + fakeRandLo, "password    " + pw},
		{"prose-after-colon", "error: password authentication failed for user", "error: password authentication failed for user"},
		{"url-password-with-at-and-slash", "postgres://app:p@ss/w0rd@db:5432/app", "postgres://app:" + pw + "@db:5432/app"},
		{"url-query-email", "https://u:s3cr3t@host/p?email=a@b.com", "https://u:" + pw + "@host/p?email=a@b.com"},
		{"url-dsn-key", "https://" + fakeRandLo + "@o1.ingest.sentry.io/4", "https://" + tok + "@o1.ingest.sentry.io/4"},
		{"url-placeholder", "https://ci:${CI_JOB_TOKEN}@gitlab.example.com", "https://ci:${CI_JOB_TOKEN}@gitlab.example.com"},
		{"query-sig", "https://a.blob.core.windows.net/c/f?sp=r&sig=" + fakeRand + "%3D&sr=b", "https://a.blob.core.windows.net/c/f?sp=r&sig=" + sec + "&sr=b"},
		{"query-key", "https://maps.example.com/geo?address=x&key=" + fakeRand, "https://maps.example.com/geo?address=x&key=" + sec},
		{"connection-string", "AccountName=st;AccountKey=" + fakeRand + "==;EndpointSuffix=core.windows.net", "AccountName=st;AccountKey=" + sec + ";EndpointSuffix=core.windows.net"},
		{"set-cookie", "< Set-Cookie: session=" + fakeRand + "; Path=/; HttpOnly", "< Set-Cookie: session=" + sec + "; Path=/; HttpOnly"},
		{"cookie-short-values", "Cookie: theme=dark; lang=en", "Cookie: theme=dark; lang=en"},
		{"k8s-data-url", "  DATABASE_URL: " + b64("postgres://app:s3cr3t@db/app"), "  DATABASE_URL: " + sec},
		{"k8s-data-key", "  tls.key: " + b64(pem), "  tls.key: " + sec},
		{"k8s-data-plain", "  username: " + b64("administrator"), "  username: " + b64("administrator")},
		{"docker-auth", `"auth": "` + b64("ci:"+fakeRand) + `"`, `"auth": "` + sec + `"`},
		{"placeholder-env", "API_TOKEN=${API_TOKEN}", "API_TOKEN=${API_TOKEN}"},
		{"placeholder-template", "password: {{ .Values.password }}", "password: {{ .Values.password }}"},
		{"placeholder-filler", "SLACK_BOT_TOKEN=xox" + "b-xxxx", "SLACK_BOT_TOKEN=xox" + "b-xxxx"},
		{"placeholder-code", `token := os.Getenv("GITHUB_TOKEN")`, `token := os.Getenv("GITHUB_TOKEN")`},
		{"placeholder-angle", "api_key: <YOUR_API_KEY>", "api_key: <YOUR_API_KEY>"},
		{"placeholder-masked", "token: ***", "token: ***"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, _ := bgjob.Redactor{}.Redact(tc.in)
			if got != tc.want {
				t.Errorf("Redact(%q)\ngot  %q\nwant %q", tc.in, got, tc.want)
			}
			if again, n := (bgjob.Redactor{}).Redact(got); again != got || n != 0 {
				t.Errorf("second pass over %q = %q, %d; want it unchanged", got, again, n)
			}
		})
	}
}
