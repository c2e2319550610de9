package bgjob

import (
	"encoding/base64"
	"strings"
)

// Secrets under a telling name: the value of a key whose name ends in
// a secret-bearing word, in the many ways output writes a key and its
// value (KEY=v, key: v, "key": "v", key := v, KEY ?= v, --key v,
// <key>v</key>, setProperty("KEY", "v"), ...).

// keyClass is how far a key's name vouches for its value.
type keyClass uint8

const (
	keyNone   keyClass = iota
	keyWeak            // the value is masked if it looks random (*_KEY, AUTH, *_CREDENTIALS)
	keyStrong          // the value is masked unless it is a placeholder (PASSWORD, *_TOKEN, *_SECRET)
	keyAuthorization
	keyCookie
)

// keyEndings are the endings of secret-bearing keys, compared with the
// key's letters and digits in lower case (so DB_PASSWORD, dbPassword
// and db.password all end in "password"). Longer endings come first
// where they overlap.
var keyEndings = []struct {
	suffix string
	class  keyClass
	marker string
}{
	{"authorization", keyAuthorization, ""},
	{"setcookie", keyCookie, ""},
	{"cookie", keyCookie, ""},
	{"secretaccesskey", keyStrong, markAWSSecret},
	{"password", keyStrong, markPassword},
	{"passwd", keyStrong, markPassword},
	{"passphrase", keyStrong, markPassword},
	{"pwd", keyWeak, markPassword},
	{"pass", keyWeak, markPassword},
	{"token", keyStrong, markToken},
	{"authtoken", keyStrong, markToken},
	{"secret", keyStrong, markSecret},
	{"secretkeybase", keyStrong, markSecret},
	{"salt", keyStrong, markSecret},
	{"apikey", keyStrong, markSecret},
	{"secretkey", keyStrong, markSecret},
	{"privatekey", keyStrong, markSecret},
	{"encryptionkey", keyStrong, markSecret},
	{"signingkey", keyStrong, markSecret},
	{"masterkey", keyStrong, markSecret},
	{"accesskey", keyStrong, markSecret},
	{"accountkey", keyStrong, markSecret},
	{"appkey", keyStrong, markSecret},
	{"authkey", keyStrong, markSecret},
	{"clientkey", keyStrong, markSecret},
	{"licensekey", keyStrong, markSecret},
	{"sessionkey", keyStrong, markSecret},
	{"storagekey", keyStrong, markSecret},
	{"credentials", keyWeak, markSecret},
	{"credential", keyWeak, markSecret},
	{"creds", keyWeak, markSecret},
	{"auth", keyWeak, markSecret},
	{"signature", keyWeak, markSecret},
	{"sig", keyWeak, markSecret},
	{"jwt", keyWeak, markToken},
	{"key", keyWeak, markSecret},
}

// notSecretKeys end in "key" (or another ending above) but name
// something public or an identifier.
var notSecretKeys = []string{
	"publickey", "pubkey", "primarykey", "foreignkey", "sortkey", "partitionkey",
	"cachekey", "idempotencykey", "hashkey", "rangekey", "routingkey", "sshkey",
	"hostkey", "gpgkey", "monkey", "turkey", "hotkey", "keykey", "bypass", "compass",
	"oldpwd", "sessionsig", "nextkey", "objectkey", "bucketkey", "groupkey",
}

// endingsByLast indexes keyEndings and notSecretKeys by their last
// letter, so that most keys are rejected by one lookup.
var endingsByLast, notSecretByLast = func() (e, n [256][]int) {
	for i, k := range keyEndings {
		c := k.suffix[len(k.suffix)-1]
		e[c] = append(e[c], i)
	}
	for i, k := range notSecretKeys {
		c := k[len(k)-1]
		n[c] = append(n[c], i)
	}
	return e, n
}()

// keyOf classifies a key by its ending: what its value is, and the
// marker for it. In a query string (after '?' or '&'), "key" alone
// counts too.
func keyOf(key string, query bool) (keyClass, string) {
	i := len(key) - 1
	for i >= 0 && !isAlnum(key[i]) {
		i--
	}
	if i < 0 {
		return keyNone, ""
	}
	last := key[i]
	if 'A' <= last && last <= 'Z' {
		last |= 0x20
	}
	bucket := endingsByLast[last]
	if len(bucket) == 0 {
		return keyNone, ""
	}
	// Most keys share no more than their last letter with an ending:
	// compare the second-to-last letter before building anything.
	j := i - 1
	for j >= 0 && !isAlnum(key[j]) {
		j--
	}
	if j < 0 {
		return keyNone, ""
	}
	if c := key[j] | 0x20; !secondLast[last][c] {
		return keyNone, ""
	}
	// The key's letters and digits in lower case, from its end.
	var buf [40]byte
	n := 0
	for ; i >= 0 && n < len(buf); i-- {
		c := key[i]
		switch {
		case 'A' <= c && c <= 'Z':
			buf[len(buf)-1-n] = c | 0x20
			n++
		case 'a' <= c && c <= 'z' || '0' <= c && c <= '9':
			buf[len(buf)-1-n] = c
			n++
		}
	}
	norm := buf[len(buf)-n:]
	for _, ki := range bucket {
		k := &keyEndings[ki]
		if !hasSuffix(norm, k.suffix) {
			continue
		}
		for _, ni := range notSecretByLast[last] {
			if hasSuffix(norm, notSecretKeys[ni]) {
				return keyNone, ""
			}
		}
		// PWD and OLDPWD are directories, PASS a test's verdict; a bare
		// "key" is too common a name but in a query string (?key=).
		if w := string(norm); w == "pwd" || w == "pass" || w == "key" && !query {
			return keyNone, ""
		}
		return k.class, k.marker
	}
	return keyNone, ""
}

// secondLast[l][c] reports whether an ending ends in c, l.
var secondLast = func() (t [256][256]bool) {
	for _, k := range keyEndings {
		n := len(k.suffix)
		if n >= 2 {
			t[k.suffix[n-1]][k.suffix[n-2]] = true
		}
	}
	return t
}()

func hasSuffix(b []byte, s string) bool {
	return len(b) >= len(s) && string(b[len(b)-len(s):]) == s
}

// scanAssignments appends the edits for the values of secret-bearing
// keys. It visits every '=' and ':' of text (found with IndexByte, so a
// text without them costs nothing) and looks back at the key before it;
// a regexp would have to try every position of the text instead.
func scanAssignments(text string, depth int, es []edit) []edit {
	eq, colon := strings.IndexByte(text, '='), strings.IndexByte(text, ':')
	skip := 0 // the end of the last value: separators inside it are part of it
	for eq >= 0 || colon >= 0 {
		var i int
		if colon < 0 || (eq >= 0 && eq < colon) {
			i, eq = eq, nextByte(text, eq, '=')
		} else {
			i, colon = colon, nextByte(text, colon, ':')
		}
		if i >= skip {
			es, skip = assignmentAt(text, i, depth, es)
		}
	}
	return es
}

func nextByte(text string, i int, c byte) int {
	if j := strings.IndexByte(text[i+1:], c); j >= 0 {
		return i + 1 + j
	}
	return -1
}

// assignmentAt appends the edit for the value assigned by the separator
// at text[i], if its key bears a secret (or the value is base64 that
// hides one), and returns the end of the value it read (so that
// "token=token=token=..." is read once, not once per separator).
func assignmentAt(text string, i, depth int, es []edit) ([]edit, int) {
	// The key first: it rejects most separators cheaply.
	k := i
	var next byte
	if i+1 < len(text) {
		next = text[i+1]
	}
	j := i + 1 // where the value may start
	switch text[i] {
	case '=':
		if next == '=' || next == '~' {
			return es, i // ==, =~
		}
		// Operators before '=': a comparison (!=, <=, >=, ==) is no
		// assignment; ?=, +=, .= and := or ::= (make, PHP) are.
		for k > 0 && i-k < 3 {
			if c := text[k-1]; c != '?' && c != '+' && c != '.' && c != ':' {
				break
			}
			k--
		}
		if k > 0 {
			if c := text[k-1]; c == '=' || c == '!' || c == '<' || c == '>' {
				return es, i
			}
		}
		if next == '>' { // key => value
			j++
		}
	case ':':
		// A path (Token::new), not an assignment; "::=" is handled at '='.
		if next == ':' || next == '=' || (i > 0 && text[i-1] == ':') {
			return es, i
		}
	}
	for k > 0 && isBlank(text[k-1]) {
		k--
	}
	if k > 0 && text[k-1] == ']' { // x["KEY"] = v
		k--
	}
	if k > 0 && isQuote(text[k-1]) {
		k--
		if k > 0 && text[k-1] == '\\' { // \"key\": in JSON inside a string
			k--
		}
	}
	if k == 0 || !isKeyByte(text[k-1]) {
		return es, i
	}
	// Most separators follow keys that end in no secret-bearing word
	// (times, line numbers, key=value logs) and precede no base64: two
	// byte lookups reject them before the key is read.
	last := text[k-1] | 0x20
	reject := len(endingsByLast[last]) == 0
	if !reject && k >= 2 && isAlnum(text[k-2]) && !secondLast[last][text[k-2]|0x20] {
		reject = true
	}
	if reject && !maybeBase64(text, i, j, depth) && !endsInType(text[:k], last) {
		return es, i
	}
	ke := k
	ks := keyStart(text, ke)
	key := text[ks:ke]
	if strings.HasSuffix(text[:ks], "[REDACTED:") {
		return es, i // a marker's word, as in "[REDACTED:password] :x"
	}
	// A type between the key and '=' (var x string = v, KEY:STRING=v).
	if t := typeName(key); t && ks > 0 {
		kk := ks
		for kk > 0 && (text[kk-1] == '&' || text[kk-1] == '*') {
			kk--
		}
		for kk > 0 && (isBlank(text[kk-1]) || text[kk-1] == ':') {
			kk--
		}
		if kk < ks && kk > 0 && isKeyByte(text[kk-1]) {
			ke = kk
			ks = keyStart(text, ke)
			key = text[ks:ke]
		}
	}
	// The user of scheme://user:password@host: the URL rule masks the
	// password, and the value here would run on over the host.
	if strings.HasSuffix(text[:ks], "://") {
		return es, i
	}
	query := ks > 0 && (text[ks-1] == '?' || text[ks-1] == '&')
	// A bare "key" counts in a query string, or with a quoted value
	// ("Key": "..."), which must then look random.
	quotedValue := false
	for v := j; v < len(text) && v < j+3; v++ {
		if isQuote(text[v]) {
			quotedValue = true
			break
		}
		if !isBlank(text[v]) {
			break
		}
	}
	class, marker := keyOf(key, query || quotedValue && strings.EqualFold(key, "key"))
	if class == keyNone && (key == "value" || key == "Value") {
		class, marker = attributeKey(text, ks)
	}
	for j < len(text) && isBlank(text[j]) {
		j++
	}
	if class == keyNone {
		// A value that is base64 may hide a secret (Kubernetes data,
		// docker's auths).
		if maybeBase64(text, i, i+1, depth) {
			if es2, masked := base64Value(text, j, es); masked {
				return es2, j
			}
		}
		return es, i
	}
	return valueEdit(text, j, class, marker, query, text[i] == ':', es)
}

// valueEdit appends the edit for a value of the given class starting at
// text[j] (blanks skipped) and returns the value's end. With words set
// (after ':' or a blank, where prose puts words too) a lone word or
// number followed by more words is taken for prose.
func valueEdit(text string, j int, class keyClass, marker string, query, words bool, es []edit) ([]edit, int) {
	if j+1 < len(text) && (text[j] == '@' || text[j] == '\\') && isQuote(text[j+1]) { // C# @"...", \"...\"
		j++
	}
	var q byte
	if j < len(text) && isQuote(text[j]) {
		q = text[j]
		j++
	}
	switch class {
	case keyCookie:
		return cookieValues(text, j, q, es)
	case keyAuthorization:
		// A scheme word and the credentials, or the credentials alone.
		e := valueEnd(text, j, q, true, false)
		if w := text[j:e]; isAlpha(w) {
			c := e
			for c < len(text) && isBlank(text[c]) {
				c++
			}
			if d := valueEnd(text, c, q, false, false); c > e && d > c {
				if placeholder(text[c:d], q != 0) {
					return es, d
				}
				m := markAuthorization
				if strings.EqualFold(w, "bearer") {
					m = markBearer
				}
				return addEdit(es, text, c, d, m, true), d
			}
		}
		if placeholder(text[j:e], q != 0) || authScheme(text[j:e]) {
			return es, e
		}
		return addEdit(es, text, j, e, markAuthorization, true), e
	}
	e := valueEnd(text, j, q, false, query)
	if q == '"' && e > j && text[e-1] == '\\' { // \"value\"
		e--
	}
	v := text[j:e]
	if q == 0 {
		// A call with a literal (String::from("v")): the literal.
		// A literal that reads as a name (getenv("API_TOKEN", ...)) is
		// not the value, so the literal must look random.
		if c := strings.IndexByte(v, '('); c > 0 && j+c+1 < len(text) && isQuote(text[j+c+1]) && codeRef(v[:c+1]) {
			return valueEdit(text, j+c+1, keyWeak, marker, query, false, es)
		}
		if words && prose(text, j, e) {
			return es, e
		}
	}
	if v == "" || placeholder(v, q != 0) {
		return es, e
	}
	if class == keyWeak && !randomValue(v) {
		return es, e
	}
	return addEdit(es, text, j, e, marker, true), e
}

// prose reports whether the unquoted value text[j:e] is a word or a
// number of a sentence ("password authentication failed", "token:
// split into", "password:      16 bytes") rather than a value: it is
// letters only or digits only, and another word follows on its line.
func prose(text string, j, e int) bool {
	letters, digits, inner := true, true, false
	for k := j; k < e; k++ {
		c := text[k]
		letters = letters && 'a' <= c|0x20 && c|0x20 <= 'z'
		digits = digits && isDigit(c)
		inner = inner || k > j+1 && 'a' <= c|0x20 && c|0x20 <= 'z' && c&0x20 != text[k-1]&0x20
	}
	// A word is in one case, or Capitalized; random letters change case.
	if !(letters && !inner) && !(digits && e-j <= 8) {
		return false
	}
	k := e
	for k < len(text) && isBlank(text[k]) {
		k++
	}
	return k > e && k < len(text) && (isAlnum(text[k]) || text[k] == '`' || text[k] == '(')
}

// authScheme reports whether w is an HTTP authentication scheme (with
// no credentials after it).
func authScheme(w string) bool {
	switch strings.ToLower(w) {
	case "basic", "bearer", "token", "digest", "negotiate", "ntlm", "hoba", "mutual", "aws4-hmac-sha256":
		return true
	}
	return false
}

// keyStart returns the start of the key that ends at text[end].
func keyStart(text string, end int) int {
	s := end
	for s > 0 && end-s < 64 && isKeyByte(text[s-1]) {
		s--
	}
	return s
}

func isKeyByte(c byte) bool { return keyByteTable[c] }

var keyByteTable = func() (t [256]bool) {
	for c := range 256 {
		t[c] = isAlnum(byte(c)) || c == '_' || c == '-' || c == '.'
	}
	return t
}()

// endsInType reports whether s ends in a type name (typeName), whose
// last letter, in lower case, is last.
func endsInType(s string, last byte) bool {
	switch last {
	case 'r', 'g', 't':
		w := s[keyStart(s, len(s)):]
		return typeName(w)
	}
	return false
}

// typeName reports whether w is a type that code writes between a
// variable and its value.
func typeName(w string) bool {
	switch w {
	case "string", "String", "str", "STRING", "var", "char", "text":
		return true
	}
	return false
}

// attributeKey classifies the value of value="..." by the key="..." or
// name="..." attribute of the same element (<add key="ApiToken"
// value="..."/>, <property name="password" value="..."/>).
func attributeKey(text string, ks int) (keyClass, string) {
	// The element's start, near: a '<' with no '>' after it.
	tag := -1
	for k := ks - 1; k >= 0 && k >= ks-160; k-- {
		if c := text[k]; c == '<' {
			tag = k
			break
		} else if c == '>' || c == '\n' {
			break
		}
	}
	if tag < 0 {
		return keyNone, ""
	}
	el := text[tag:ks]
	for _, attr := range []string{"key=\"", "name=\"", "Key=\"", "Name=\""} {
		if a := strings.Index(el, attr); a >= 0 {
			rest := el[a+len(attr):]
			if e := strings.IndexByte(rest, '"'); e > 0 {
				c, m := keyOf(rest[:e], false)
				if c == keyCookie || c == keyAuthorization {
					return keyStrong, markSecret
				}
				return c, m
			}
		}
	}
	return keyNone, ""
}

// valueEnd returns the end of the value that starts at text[j]: the
// closing quote q (or the end of the line) when it was quoted, else the
// next blank or quote or ';'. With word set, a blank ends a quoted
// value too. In a query string '&' ends a value.
func valueEnd(text string, j int, q byte, word, query bool) int {
	start := j
	for ; j < len(text); j++ {
		c := text[j]
		switch {
		case c == '\n' || c == '\r':
			return j
		case q != 0:
			if c == q || (word && isBlank(c)) {
				return j
			}
		case isSpace(c) || isQuote(c) || c == ';':
			return j
		case c == '&' && query:
			return j
		case c == ',' && nextIsAssignment(text, j+1):
			return j
		case c == '<' && j > start:
			return j
		}
	}
	return j
}

// nextIsAssignment reports whether text[j:] starts with key= (the next
// pair of "a=1,b=2").
func nextIsAssignment(text string, j int) bool {
	k := j
	for k < len(text) && k-j < 40 && (isKeyByte(text[k])) {
		k++
	}
	return k > j && k < len(text) && text[k] == '='
}

// placeholder reports whether v stands for a secret rather than being
// one: a variable (${TOKEN}, $TOKEN, %TOKEN%, $(cmd)), a template ({{
// .Values.password }}, <your-token>), a run of one filler character
// (xxxx, ****, sk-...), an upper-case word (REDACTED, DATA+OMITTED), a
// literal (true, null, None), or, unquoted, code (var.db_password,
// process.env.TOKEN, os.Getenv("TOKEN")).
func placeholder(v string, quoted bool) bool {
	if v == "" {
		return true
	}
	switch v[0] {
	case '$', '%':
		return true
	case '<':
		return strings.HasSuffix(v, ">") || !quoted
	case '{':
		return strings.HasPrefix(v, "{{") || !quoted
	case '(', '[':
		return !quoted || strings.HasPrefix(v, "[REDACTED")
	case '&', '*':
		return !quoted // &str, *string
	}
	if strings.Contains(v, "{{") || strings.Contains(v, "${") {
		return true
	}
	alnum := false
	for i := 0; i < len(v) && !alnum; i++ {
		alnum = isAlnum(v[i])
	}
	if !alnum {
		return true
	}
	switch v {
	case "string", "bool", "int", "[]byte", "*string", "str", "String", "byte", "uint":
		return true
	}
	// Filler after an optional short prefix: xoxb-xxxx, sk-...,
	// sk_test_xxxx, ****.
	rest := v
	for range 2 {
		if k := strings.IndexAny(rest, "-_."); k > 0 && k <= 6 && isAlnum(rest[0]) {
			rest = rest[k+1:]
		}
	}
	filler := len(rest) >= 2
	for i := 0; i < len(rest) && filler; i++ {
		filler = strings.IndexByte("xX*.#-_", rest[i]) >= 0
	}
	if filler {
		return true
	}
	if len(v) > 64 {
		return false // other placeholders are short; a long value is data
	}
	upper, hasDigit, hasLower := true, false, false
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case 'a' <= c && c <= 'z':
			hasLower = true
		case isDigit(c):
			hasDigit = true
		case 'A' <= c && c <= 'Z', c == '_', c == '+', c == '-':
		default:
			upper = false
		}
	}
	if upper && !hasDigit && !hasLower && len(v) <= 32 {
		return true
	}
	if len(v) <= 11 && strings.IndexByte("tfnuryoeh(TFNURYOEH", v[0]) >= 0 {
		for _, lit := range []string{"true", "false", "null", "nil", "none", "undefined", "required",
			"optional", "yes", "no", "on", "off", "empty", "(protected)", "hidden", "redacted"} {
			if strings.EqualFold(v, lit) {
				return true
			}
		}
	}
	// your-api-key-here, YOUR_TOKEN: a word of "your" and of what to put.
	if k := indexFold(v, "your"); k >= 0 {
		rest := v[k+4:]
		if indexFold(rest, "here") >= 0 || indexFold(rest, "key") >= 0 || indexFold(rest, "token") >= 0 {
			return true
		}
	}
	if !quoted && codeRef(v) {
		return true
	}
	return false
}

// indexFold returns the index of the first match of the lower-case word
// w in s, in any case, or -1.
func indexFold(s, w string) int {
	for i := 0; i+len(w) <= len(s); i++ {
		if s[i]|0x20 == w[0] && strings.EqualFold(s[i:i+len(w)], w) {
			return i
		}
	}
	return -1
}

// codeRef reports whether v reads as code rather than a literal: an
// identifier path with a dot, or a call or index (x.y, f(, x[).
func codeRef(v string) bool {
	dot := false
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case c == ':' && i+1 < len(v) && v[i+1] == ':' && i > 0: // String::from
			dot = true
			i++
		case c == '.':
			if i == 0 || i+1 == len(v) || v[i-1] == '.' {
				return false
			}
			dot = true
		case c == '(' || c == '[':
			return i > 0
		case 'a' <= c|0x20 && c|0x20 <= 'z' || c == '_':
		case isDigit(c):
			if i == 0 || v[i-1] == '.' {
				return false
			}
		default:
			return false
		}
	}
	return dot
}

// randomValue reports whether a value under a weak key (auth, *_key,
// credentials) looks like a secret: long enough, of mixed characters,
// and not a path, a URL, a word or a number.
func randomValue(v string) bool {
	if len(v) < 8 || strings.Contains(v, "://") {
		return false
	}
	switch v[0] {
	case '/', '~', '.':
		return false
	}
	var lower, upper, digit, other int
	for i := 0; i < len(v); i++ {
		c := v[i]
		switch {
		case 'a' <= c && c <= 'z':
			lower++
		case 'A' <= c && c <= 'Z':
			upper++
		case isDigit(c):
			digit++
		default:
			other++
		}
	}
	classes := 0
	for _, n := range []int{lower, upper, digit} {
		if n > 0 {
			classes++
		}
	}
	if classes < 2 || lower+upper+digit < 8 {
		return false
	}
	// Dates, versions and addresses: digits and punctuation.
	if lower+upper <= 2 {
		return digit >= 16 // a long number is a key, 2024-05-01T10:11Z is not
	}
	if digit == 0 && camelWords(v) {
		return false
	}
	return randomBody(v)
}

// camelWords reports whether v is words run together or joined by
// '-', '_' or '.' (TestDecoderBuffering, StripeSecretKey,
// Www-Authenticate): each a capital and two or more small letters, or
// small letters alone.
func camelWords(v string) bool {
	for i := 0; i < len(v); {
		c := v[i]
		switch {
		case c == '-' || c == '_' || c == '.':
			i++
		case 'A' <= c && c <= 'Z':
			k := i + 1
			for k < len(v) && 'a' <= v[k] && v[k] <= 'z' {
				k++
			}
			if k-i < 3 {
				return false
			}
			i = k
		case 'a' <= c && c <= 'z':
			k := i
			for k < len(v) && 'a' <= v[k] && v[k] <= 'z' {
				k++
			}
			if k-i < 2 {
				return false
			}
			i = k
		default:
			return false
		}
	}
	return true
}

// maybeBase64 reports whether the value after the separator at text[i]
// (from text[j]) may be base64 worth decoding: written as a YAML or
// JSON value (": v", ": \"v\"", "=\"v\"") and 16 bytes long at least.
func maybeBase64(text string, i, j, depth int) bool {
	if depth > 0 || j+16 > len(text) {
		return false
	}
	c := text[j]
	if text[i] == ':' {
		return isBlank(c) || isQuote(c)
	}
	return isQuote(c)
}

// base64Value masks the value at text[j] if it is base64 whose decoded
// text holds a secret (a Kubernetes Secret's data, a .dockerconfigjson,
// a kubeconfig's client-key-data). It returns the value's end.
func base64Value(text string, j int, es []edit) ([]edit, bool) {
	var q byte
	if j < len(text) && isQuote(text[j]) {
		q = text[j]
		j++
	}
	e := j
	upper, lower := false, false
	for e < len(text) && b64Table[text[e]] {
		upper = upper || 'A' <= text[e] && text[e] <= 'Z'
		lower = lower || 'a' <= text[e] && text[e] <= 'z'
		e++
	}
	// Base64 of text has both cases and whole quanta; hashes in hex
	// and most words do not.
	if e-j < 16 || !upper || !lower || (e-j)%4 != 0 || (e < len(text) && !isSpace(text[e]) && text[e] != q && text[e] != ',' && text[e] != ';' && text[e] != '\\') {
		return es, false
	}
	dec := decodeBase64(text[j:e])
	if dec == "" {
		return es, false
	}
	if _, n := (Redactor{}).redact(dec, 1); n > 0 {
		return addEdit(es, text, j, e, markSecret, true), true
	}
	return es, false
}

var b64Table = func() (t [256]bool) {
	for c := range 256 {
		t[c] = isAlnum(byte(c)) || strings.IndexByte("+/=-_", byte(c)) >= 0
	}
	return t
}()

// decodeBase64 returns the text that s encodes, or "" if s is not base64
// of printable text.
func decodeBase64(s string) string {
	s = strings.TrimRight(s, "=")
	var b []byte
	var err error
	if strings.ContainsAny(s, "-_") {
		b, err = base64.RawURLEncoding.DecodeString(s)
	} else {
		b, err = base64.RawStdEncoding.DecodeString(s)
	}
	if err != nil || len(b) < 8 {
		return ""
	}
	for _, c := range b {
		if c < 0x20 && c != '\n' && c != '\r' && c != '\t' || c == 0x7f {
			return ""
		}
	}
	return string(b)
}

// cookieValues masks the values of a Cookie or Set-Cookie header's
// pairs (name=value; ...) from text[j], but not the attributes (Path,
// Domain, Expires, ...) nor short values.
func cookieValues(text string, j int, q byte, es []edit) ([]edit, int) {
	end := j
	for end < len(text) && text[end] != '\n' && text[end] != '\r' && (q == 0 || text[end] != q) {
		end++
	}
	for s := j; s < end; {
		for s < end && (isBlank(text[s]) || text[s] == ';') {
			s++
		}
		eq := s
		for eq < end && text[eq] != '=' && text[eq] != ';' {
			eq++
		}
		if eq >= end || text[eq] != '=' {
			s = eq
			continue
		}
		v := eq + 1
		ve := v
		for ve < end && text[ve] != ';' && !isBlank(text[ve]) {
			ve++
		}
		switch strings.ToLower(strings.TrimSpace(text[s:eq])) {
		case "path", "domain", "expires", "max-age", "samesite", "priority", "version", "comment":
		default:
			if ve-v >= 8 && !placeholder(text[v:ve], false) {
				es = addEdit(es, text, v, ve, markSecret, true)
			}
		}
		s = ve
	}
	return es, end
}
