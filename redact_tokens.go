package bgjob

import (
	"encoding/base64"
	"hash/crc32"
	"strings"
)

// Vendor tokens are found by their own shape, with no key name next to
// them: a prefix that names the vendor (ghp_, sk-ant-, glpat-, hvs.,
// ...) and a body of a known alphabet and length, checked for a
// checksum where the vendor has one (GitHub and npm end theirs with a
// CRC32) and otherwise for randomness, so that placeholders such as
// "xoxb-xxxx" or "sk_test_xxxxxxxx" are left alone.
//
// Finding them must cost little on text that holds none. Every token
// is at least minToken bytes of tokenChars, so scanTokens probes one
// byte in every minRun: a run of tokenChars that long covers a probe.
// Text of short words, hashes and paths costs a probe and a short walk
// per minRun bytes; only a long run is looked at closely, and only at
// its word starts.

const (
	minRun     = 16 // the probe's stride: no token is shorter
	minToken   = 20
	minStretch = 17 // letters, digits, '_' and '-' in a row
)

var wordTable = func() (t [256]bool) {
	for c := range 256 {
		t[c] = isAlnum(byte(c)) || c == '_' || c == '-'
	}
	return t
}()

// tokenChars are the bytes a run may hold: those of every vendor's
// alphabet, plus the separators that some use inside a token.
var tokenChars = func() (t [256]bool) {
	for c := range 256 {
		t[c] = isAlnum(byte(c)) || strings.IndexByte("_-.~+/=", byte(c)) >= 0
	}
	return t
}()

// family is one vendor's token shape.
type family struct {
	prefix string
	marker string
	body   string // the body's alphabet (a class name, see inClass)
	min    int    // body length, after the prefix
	max    int    // 0: no maximum
	check  func(tok string) bool
}

// Body alphabets.
const (
	clsAlnum   = "alnum"   // A-Z a-z 0-9
	clsWord    = "word"    // alnum _ -
	clsWordDot = "worddot" // alnum _ - .
	clsHex     = "hex"     // 0-9 a-f
	clsUpperNm = "uppernum"
	clsLetters = "letters"
	clsB64     = "b64" // alnum + / = _ -
	clsLowerNm = "lowernum"
	clsAWS     = "aws" // A-Z 0-9
	clsBech32  = "bech32"
)

func inClass(cls string, c byte) bool {
	switch cls {
	case clsAlnum:
		return isAlnum(c)
	case clsWord:
		return isAlnum(c) || c == '_' || c == '-'
	case clsWordDot:
		return isAlnum(c) || c == '_' || c == '-' || c == '.'
	case clsHex:
		return '0' <= c && c <= '9' || 'a' <= c && c <= 'f'
	case clsUpperNm, clsAWS:
		return isUpperAlnum(c)
	case clsLetters:
		return 'a' <= c|0x20 && c|0x20 <= 'z'
	case clsB64:
		return isAlnum(c) || c == '+' || c == '/' || c == '=' || c == '_' || c == '-'
	case clsLowerNm:
		return 'a' <= c && c <= 'z' || '0' <= c && c <= '9'
	case clsBech32:
		return strings.IndexByte("QPZRY9X8GF2TVDW0S3JN54KHCE6MUA7L", c) >= 0
	}
	return false
}

// The markers of vendor tokens.
const (
	markAPIKey       = "[REDACTED:api-key]"
	markOpenAI       = "[REDACTED:openai-key]"
	markAnthropic    = "[REDACTED:anthropic-key]"
	markGitLab       = "[REDACTED:gitlab-token]"
	markNPM          = "[REDACTED:npm-token]"
	markPyPI         = "[REDACTED:pypi-token]"
	markSendGrid     = "[REDACTED:sendgrid-key]"
	markHuggingFace  = "[REDACTED:huggingface-token]"
	markStripe       = "[REDACTED:stripe-key]"
	markGoogle       = "[REDACTED:google-key]"
	markVault        = "[REDACTED:vault-token]"
	markJWT          = "[REDACTED:jwt]"
	markSlackWebhook = "[REDACTED:slack-webhook]"
	markAzure        = "[REDACTED:azure-secret]"
	markAge          = "[REDACTED:age-key]"
	markTelegram     = "[REDACTED:telegram-token]"
)

var families = []family{
	// GitHub: 30 random characters and their CRC32 in base62.
	{prefix: "ghp_", marker: markGitHub, body: clsAlnum, min: 36, max: 36, check: crcValid},
	{prefix: "gho_", marker: markGitHub, body: clsAlnum, min: 36, max: 36, check: crcValid},
	{prefix: "ghu_", marker: markGitHub, body: clsAlnum, min: 36, max: 36, check: crcValid},
	{prefix: "ghs_", marker: markGitHub, body: clsAlnum, min: 36, max: 36, check: crcValid},
	{prefix: "ghr_", marker: markGitHub, body: clsAlnum, min: 36, max: 36, check: crcValid},
	{prefix: "github_pat_", marker: markGitHub, body: clsWord, min: 30},
	{prefix: "npm_", marker: markNPM, body: clsAlnum, min: 36, max: 36, check: crcValid},
	{prefix: "AKIA", marker: markAWSKey, body: clsAWS, min: 16, max: 16},
	{prefix: "ASIA", marker: markAWSKey, body: clsAWS, min: 16, max: 16},
	{prefix: "ABIA", marker: markAWSKey, body: clsAWS, min: 16, max: 16},
	{prefix: "ACCA", marker: markAWSKey, body: clsAWS, min: 16, max: 16},
	{prefix: "xoxa-", marker: markSlack, body: clsWord, min: 10},
	{prefix: "xoxb-", marker: markSlack, body: clsWord, min: 10},
	{prefix: "xoxe-", marker: markSlack, body: clsWord, min: 10},
	{prefix: "xoxe.xox", marker: markSlack, body: clsWord, min: 20},
	{prefix: "xoxo-", marker: markSlack, body: clsWord, min: 10},
	{prefix: "xoxp-", marker: markSlack, body: clsWord, min: 10},
	{prefix: "xoxr-", marker: markSlack, body: clsWord, min: 10},
	{prefix: "xoxs-", marker: markSlack, body: clsWord, min: 10},
	{prefix: "xapp-", marker: markSlack, body: clsWord, min: 20},
	{prefix: "hooks.slack.com/services/", marker: markSlackWebhook, body: clsB64, min: 20},
	{prefix: "hooks.slack.com/workflows/", marker: markSlackWebhook, body: clsB64, min: 20},
	{prefix: "hooks.slack.com/triggers/", marker: markSlackWebhook, body: clsB64, min: 20},
	{prefix: "sk-ant-", marker: markAnthropic, body: clsWord, min: 40},
	{prefix: "sk-", marker: markOpenAI, body: clsWord, min: 32},
	{prefix: "glpat-", marker: markGitLab, body: clsWord, min: 20},
	{prefix: "glrt-", marker: markGitLab, body: clsWord, min: 20},
	{prefix: "gldt-", marker: markGitLab, body: clsWord, min: 20},
	{prefix: "glptt-", marker: markGitLab, body: clsWord, min: 20},
	{prefix: "glft-", marker: markGitLab, body: clsWord, min: 20},
	{prefix: "glcbt-", marker: markGitLab, body: clsWord, min: 20},
	{prefix: "glimt-", marker: markGitLab, body: clsWord, min: 20},
	{prefix: "glagent-", marker: markGitLab, body: clsWord, min: 20},
	{prefix: "gloas-", marker: markGitLab, body: clsWord, min: 20},
	{prefix: "glsoat-", marker: markGitLab, body: clsWord, min: 20},
	{prefix: "glffct-", marker: markGitLab, body: clsWord, min: 20},
	{prefix: "GR1348941", marker: markGitLab, body: clsWord, min: 20},
	{prefix: "pypi-", marker: markPyPI, body: clsWord, min: 50},
	{prefix: "SG.", marker: markSendGrid, body: clsWordDot, min: 60, check: sendGridShape},
	{prefix: "hf_", marker: markHuggingFace, body: clsLetters, min: 30, max: 40},
	{prefix: "api_org_", marker: markHuggingFace, body: clsLetters, min: 30, max: 40},
	{prefix: "sk_live_", marker: markStripe, body: clsAlnum, min: 20},
	{prefix: "sk_test_", marker: markStripe, body: clsAlnum, min: 20},
	{prefix: "sk_prod_", marker: markStripe, body: clsAlnum, min: 20},
	{prefix: "rk_live_", marker: markStripe, body: clsAlnum, min: 20},
	{prefix: "rk_test_", marker: markStripe, body: clsAlnum, min: 20},
	{prefix: "whsec_", marker: markStripe, body: clsAlnum, min: 24},
	{prefix: "AIza", marker: markGoogle, body: clsWord, min: 35, max: 35},
	{prefix: "ya29.", marker: markGoogle, body: clsWordDot, min: 30},
	{prefix: "GOCSPX-", marker: markGoogle, body: clsWord, min: 24},
	{prefix: "hvs.", marker: markVault, body: clsWord, min: 24},
	{prefix: "hvb.", marker: markVault, body: clsWord, min: 24},
	{prefix: "hvr.", marker: markVault, body: clsWord, min: 24},
	{prefix: "shpat_", marker: markAPIKey, body: clsHex, min: 32, max: 32},
	{prefix: "shpss_", marker: markAPIKey, body: clsHex, min: 32, max: 32},
	{prefix: "shpca_", marker: markAPIKey, body: clsHex, min: 32, max: 32},
	{prefix: "shppa_", marker: markAPIKey, body: clsHex, min: 32, max: 32},
	{prefix: "dop_v1_", marker: markAPIKey, body: clsHex, min: 64, max: 64},
	{prefix: "doo_v1_", marker: markAPIKey, body: clsHex, min: 64, max: 64},
	{prefix: "dor_v1_", marker: markAPIKey, body: clsHex, min: 64, max: 64},
	{prefix: "dp.pt.", marker: markAPIKey, body: clsAlnum, min: 40},
	{prefix: "dp.st.", marker: markAPIKey, body: clsWordDot, min: 40},
	{prefix: "dp.sa.", marker: markAPIKey, body: clsAlnum, min: 40},
	{prefix: "dp.ct.", marker: markAPIKey, body: clsAlnum, min: 40},
	{prefix: "dapi", marker: markAPIKey, body: clsHex, min: 32, max: 32},
	{prefix: "lin_api_", marker: markAPIKey, body: clsAlnum, min: 40, max: 40},
	{prefix: "PMAK-", marker: markAPIKey, body: clsWord, min: 59, max: 59},
	{prefix: "SK", marker: markAPIKey, body: clsHex, min: 32, max: 32},
	{prefix: "key-", marker: markAPIKey, body: clsHex, min: 32, max: 32},
	{prefix: "NRAK-", marker: markAPIKey, body: clsUpperNm, min: 27, max: 27},
	{prefix: "glsa_", marker: markAPIKey, body: clsWord, min: 41},
	{prefix: "glc_", marker: markAPIKey, body: clsB64, min: 32},
	{prefix: "ATATT3", marker: markAPIKey, body: clsB64, min: 150},
	{prefix: "AGE-SECRET-KEY-1", marker: markAge, body: clsBech32, min: 58, max: 58},
	{prefix: "EAAA", marker: markAPIKey, body: clsWord, min: 60, max: 60},
	{prefix: "sq0atp-", marker: markAPIKey, body: clsWord, min: 22},
	{prefix: "sq0csp-", marker: markAPIKey, body: clsWord, min: 40},
	{prefix: "fo1_", marker: markAPIKey, body: clsWord, min: 40},
	{prefix: "pul-", marker: markAPIKey, body: clsHex, min: 40, max: 40},
	{prefix: "dckr_pat_", marker: markAPIKey, body: clsWord, min: 24},
	{prefix: "dckr_oat_", marker: markAPIKey, body: clsWord, min: 24},
	{prefix: "LTAI", marker: markAPIKey, body: clsAlnum, min: 16, max: 24},
	{prefix: "tskey-", marker: markAPIKey, body: clsWord, min: 30},
	{prefix: "sbp_", marker: markAPIKey, body: clsHex, min: 40},
	{prefix: "sgp_", marker: markAPIKey, body: clsWord, min: 40},
	{prefix: "pplx-", marker: markAPIKey, body: clsAlnum, min: 40},
	{prefix: "rubygems_", marker: markAPIKey, body: clsHex, min: 48, max: 48},
	{prefix: "oy2", marker: markAPIKey, body: clsLowerNm, min: 43, max: 43},
	{prefix: "CLOJARS_", marker: markAPIKey, body: clsHex, min: 60, max: 60},
	{prefix: "pscale_tkn_", marker: markAPIKey, body: clsWordDot, min: 32},
	{prefix: "pscale_pw_", marker: markAPIKey, body: clsWordDot, min: 32},
	{prefix: "pnu_", marker: markAPIKey, body: clsAlnum, min: 36, max: 36},
	{prefix: "dt0c01.", marker: markAPIKey, body: clsWordDot, min: 89, max: 89},
	{prefix: "sha256~", marker: markAPIKey, body: clsWord, min: 43, max: 43},
	{prefix: "sntrys_", marker: markAPIKey, body: clsB64, min: 60},
	{prefix: "sntryu_", marker: markAPIKey, body: clsHex, min: 64, max: 64},
	{prefix: "gsk_", marker: markAPIKey, body: clsAlnum, min: 50},
	{prefix: "xai-", marker: markAPIKey, body: clsAlnum, min: 70},
	{prefix: "rdme_", marker: markAPIKey, body: clsLowerNm, min: 70},
	{prefix: "ops_eyJ", marker: markAPIKey, body: clsB64, min: 50},
}

// byFirst indexes the families by their prefix's first byte.
var byFirst = func() (t [256][]*family) {
	for i := range families {
		f := &families[i]
		t[f.prefix[0]] = append(t[f.prefix[0]], f)
	}
	return t
}()

// scanTokens appends the edits for the vendor tokens in text.
func scanTokens(text string, es []edit) []edit {
	n := len(text)
	for p := minRun - 1; p < n; p += minRun {
		if !wordTable[text[p]] {
			continue
		}
		// The stretch of word bytes around the probe: every token has
		// one of minStretch at least, longer than the stride, so one
		// probe lands in it; shorter words are passed over. A stretch of
		// 17 that holds p holds p-8 or p+8: two lookups pass over most
		// short words before they are walked.
		if (p < 8 || !wordTable[text[p-8]]) && (p+8 >= n || !wordTable[text[p+8]]) {
			continue
		}
		a, b := p, p+1
		for a > 0 && wordTable[text[a-1]] {
			a--
		}
		for b < n && wordTable[text[b]] {
			b++
		}
		if b-a >= minStretch {
			// The whole run, separators (. / = + ~) included: its start
			// here, its end as scanRun reads it.
			for a > 0 && tokenChars[text[a-1]] {
				a--
			}
			es, b = scanRun(text, a, es)
		}
		if b > p {
			p += (b - p) / minRun * minRun
		}
	}
	// Azure's client secrets hold '~' and '.', which may cut them into
	// stretches shorter than minStretch.
	for pos := 0; ; {
		i := strings.Index(text[pos:], "Q~")
		if i < 0 {
			break
		}
		i += pos
		a, b := i, i+2
		for a > 0 && tokenChars[text[a-1]] {
			a--
		}
		for b < n && tokenChars[text[b]] {
			b++
		}
		es = azureSecrets(text, a, b, es)
		pos = b
	}
	return es
}

// scanRun looks for tokens at the word starts of the run of tokenChars
// that starts at text[a]: its start, and every letter or digit after a
// separator that never begins a token (=, /, ., ~, +). It returns the
// edits and the run's end, found in the same pass. A token's alphabet
// is a part of tokenChars, so a token never runs past the run.
func scanRun(text string, a int, es []edit) ([]edit, int) {
	n := len(text)
	if a > 0 && text[a-1] == ':' {
		es = telegramAt(text, a, es)
	}
	atlas := false
	i := a
	for ; i < n && tokenChars[text[i]]; i++ {
		c := text[i]
		if i > a {
			p := text[i-1]
			atlas = atlas || p == '.' && c == 'a'
			if !startsAfter[p] {
				continue
			}
		}
		if len(byFirst[c]) == 0 && c != 'e' {
			continue
		}
		if c == 'e' && strings.HasPrefix(text[i:], "eyJ") {
			if e := jwtEnd(text, i, n); e > 0 {
				es = addEdit(es, text, i, e, markJWT, true)
				i = e - 1
				continue
			}
		}
		var c1 byte
		if i+1 < n {
			c1 = text[i+1]
		}
		for _, f := range byFirst[c] {
			if f.prefix[1] != c1 {
				continue
			}
			if e, ok := f.match(text, i, n); ok {
				s := i
				if f.marker == markSlackWebhook { // the whole URL
					for _, sch := range []string{"https://", "http://"} {
						if strings.HasSuffix(text[:s], sch) {
							s -= len(sch)
							break
						}
					}
				}
				es = addEdit(es, text, s, e, f.marker, true)
				i = e - 1
				break
			}
		}
	}
	if atlas {
		if k := strings.Index(text[a:i], ".atlasv1."); k >= 0 {
			es = terraformAt(text, a, a+k, i, es)
		}
	}
	return es, i
}

// startsAfter are the bytes after which a token may start inside a run.
var startsAfter = func() (t [256]bool) {
	for _, c := range []byte("=/.~+") {
		t[c] = true
	}
	return t
}()

// match reports the end of f's token starting at text[i], within the run
// ending at b.
func (f *family) match(text string, i, b int) (int, bool) {
	if !strings.HasPrefix(text[i:b], f.prefix) {
		return 0, false
	}
	s := i + len(f.prefix)
	e := s
	for e < b && inClass(f.body, text[e]) {
		e++
	}
	// A trailing dot ends a sentence, not a token.
	for e > s && text[e-1] == '.' && f.body != clsB64 {
		e--
	}
	// The token must end at a boundary: a longer run of its alphabet is
	// something else (AKIA... inside a longer upper-case word).
	if e < b && isAlnum(text[e]) {
		return 0, false
	}
	n := e - s
	if n < f.min || (f.max > 0 && n > f.max) {
		return 0, false
	}
	// GitLab's routable tokens end in .<9 base-36 characters>.
	if f.marker == markGitLab && e+10 <= b && text[e] == '.' {
		k := e + 1
		for k < e+10 && ('a' <= text[k] && text[k] <= 'z' || '0' <= text[k] && text[k] <= '9') {
			k++
		}
		if k == e+10 && (k == b || !isAlnum(text[k])) {
			e = k
		}
	}
	tok := text[i:e]
	if f.check != nil {
		if !f.check(tok) {
			return 0, false
		}
	} else if !randomBody(text[s:e]) {
		return 0, false
	}
	return e, true
}

// crcValid reports whether the last 6 characters of the token's body are
// the base62 CRC32 of the rest, as in GitHub's and npm's tokens.
func crcValid(tok string) bool {
	body := tok[strings.IndexByte(tok, '_')+1:]
	if len(body) != 36 {
		return false
	}
	const dict = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
	c := crc32.ChecksumIEEE([]byte(body[:30]))
	for k := 35; k >= 30; k-- {
		if body[k] != dict[c%62] {
			return false
		}
		c /= 62
	}
	return true
}

// sendGridShape: SG.<about 22>.<about 43>.
func sendGridShape(tok string) bool {
	parts := strings.Split(tok, ".")
	return len(parts) == 3 && len(parts[1]) >= 16 && len(parts[2]) >= 30 && randomBody(parts[1]+parts[2])
}

// randomBody reports whether s looks drawn at random rather than typed:
// enough distinct characters, not a run of one repeated unit or of
// consecutive characters ("xxxx", "XXXX-XXXX", "1234567890abcdef").
func randomBody(s string) bool {
	var seen [256]bool
	distinct, steps, alnum := 0, 0, 0
	var prev byte
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !isAlnum(c) {
			continue
		}
		alnum++
		if !seen[c] {
			seen[c] = true
			distinct++
		}
		if c == prev+1 {
			steps++
		}
		prev = c
	}
	if alnum < 8 {
		return false
	}
	return distinct >= min(10, alnum/2) && steps*3 < alnum
}

// jwtEnd returns the end of the JSON Web Token at text[i] (within the run
// ending at b), or 0: three base64url parts, the first of which decodes
// to a JSON header that names its algorithm or type; the signature may
// be empty (an unsigned token).
func jwtEnd(text string, i, b int) int {
	seg := func(k int) int {
		for k < b && (isAlnum(text[k]) || text[k] == '_' || text[k] == '-') {
			k++
		}
		return k
	}
	h := seg(i)
	if h-i < 10 || h >= b || text[h] != '.' {
		return 0
	}
	p := seg(h + 1)
	if p-h-1 < 10 || p >= b || text[p] != '.' {
		return 0
	}
	s := seg(p + 1)
	head := text[i:h]
	dec, err := base64.RawURLEncoding.DecodeString(head[:len(head)/4*4])
	if err != nil {
		return 0
	}
	if hd := string(dec); !strings.Contains(hd, `"alg"`) && !strings.Contains(hd, `"typ"`) && !strings.Contains(hd, `"kid"`) {
		return 0
	}
	return s
}

// azureSecrets finds Azure AD client secrets in the run text[a:b]: three
// characters, a digit, "Q~", and 31 to 34 more.
func azureSecrets(text string, a, b int, es []edit) []edit {
	isSecretChar := func(c byte) bool { return isAlnum(c) || c == '_' || c == '~' || c == '.' || c == '-' }
	for k := a; ; {
		q := strings.Index(text[k:b], "Q~")
		if q < 0 {
			return es
		}
		q += k
		k = q + 2
		s := q - 4
		if s < a || !isDigit(text[q-1]) {
			continue
		}
		ok := true
		for j := s; j < q-1; j++ {
			ok = ok && (isAlnum(text[j]) || text[j] == '_' || text[j] == '~' || text[j] == '.')
		}
		if !ok || (s > a && isSecretChar(text[s-1])) {
			continue
		}
		e := q + 2
		for e < b && isSecretChar(text[e]) {
			e++
		}
		if n := e - q - 2; n < 31 || n > 34 || !randomBody(text[q+2:e]) {
			continue
		}
		es = addEdit(es, text, s, e, markAzure, true)
		k = e
	}
}

// terraformAt masks a Terraform Cloud token, <14>.atlasv1.<60 or more>,
// whose ".atlasv1." is at text[d].
func terraformAt(text string, a, d, b int, es []edit) []edit {
	s := d
	for s > a && isAlnum(text[s-1]) {
		s--
	}
	e := d + len(".atlasv1.")
	for e < b && (isAlnum(text[e]) || text[e] == '_' || text[e] == '-' || text[e] == '=') {
		e++
	}
	if d-s >= 12 && e-d-9 >= 60 {
		es = addEdit(es, text, s, e, markAPIKey, true)
	}
	return es
}

// telegramAt masks a Telegram bot token, <bot id>:AA<33>, whose part
// after the colon starts at text[a].
func telegramAt(text string, a int, es []edit) []edit {
	b := len(text)
	if !strings.HasPrefix(text[a:], "AA") {
		return es
	}
	s := a - 1
	for s > 0 && isDigit(text[s-1]) {
		s--
	}
	e := a
	for e < b && (isAlnum(text[e]) || text[e] == '_' || text[e] == '-') {
		e++
	}
	if n := a - 1 - s; n >= 8 && n <= 10 && e-a == 35 && randomBody(text[a+2:e]) {
		es = addEdit(es, text, s, e, markTelegram, true)
	}
	return es
}

func isAlnum(c byte) bool { return alnumTable[c] }

var alnumTable = func() (t [256]bool) {
	for c := range 256 {
		b := byte(c)
		t[c] = 'a' <= b|0x20 && b|0x20 <= 'z' || '0' <= b && b <= '9'
	}
	return t
}()

func isDigit(c byte) bool { return '0' <= c && c <= '9' }
