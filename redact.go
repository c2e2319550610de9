package bgjob

import (
	"cmp"
	"context"
	"regexp"
	"slices"
	"strconv"
	"strings"
)

// Redactor is an [Admitter] that masks the secrets a secret scanner
// would find in a job's output, and admits everything else as it is.
// Each secret is replaced by a fixed marker that names its kind:
//
//	[REDACTED:aws-key]           AWS access key IDs: AKIA, ASIA, ABIA, ACCA and 16 upper-case letters or digits
//	[REDACTED:github-token]      GitHub tokens: ghp_, gho_, ghu_, ghs_, ghr_ (whose CRC32 checksum must hold), github_pat_
//	[REDACTED:npm-token]         npm tokens: npm_ (checksum checked as GitHub's)
//	[REDACTED:slack-token]       Slack tokens: xoxa-, xoxb-, xoxe-, xoxo-, xoxp-, xoxr-, xoxs-, xapp-, xoxe.xox?-
//	[REDACTED:slack-webhook]     Slack webhook URLs (hooks.slack.com/services/..., workflows, triggers)
//	[REDACTED:openai-key]        OpenAI keys, and other sk- keys: sk-proj-, sk-svcacct-, sk-admin-, sk-...
//	[REDACTED:anthropic-key]     Anthropic keys: sk-ant-
//	[REDACTED:gitlab-token]      GitLab tokens: glpat-, glrt-, gldt-, glptt-, glft-, glcbt-, glimt-, glagent-, gloas-, glsoat-, glffct-, GR1348941
//	[REDACTED:pypi-token]        PyPI tokens: pypi-
//	[REDACTED:sendgrid-key]      SendGrid keys: SG.<22>.<43>
//	[REDACTED:huggingface-token] Hugging Face tokens: hf_, api_org_
//	[REDACTED:stripe-key]        Stripe keys: sk_live_, sk_test_, sk_prod_, rk_live_, rk_test_, whsec_
//	[REDACTED:google-key]        Google API keys (AIza), OAuth access tokens (ya29.) and client secrets (GOCSPX-)
//	[REDACTED:vault-token]       HashiCorp Vault tokens: hvs., hvb., hvr.
//	[REDACTED:azure-secret]      Azure AD client secrets (<3><digit>Q~<31 to 34>)
//	[REDACTED:jwt]               JSON Web Tokens: three base64url parts, the first a JSON header with "alg", "typ" or "kid"
//	[REDACTED:age-key]           age secret keys: AGE-SECRET-KEY-1
//	[REDACTED:telegram-token]    Telegram bot tokens: <bot id>:AA<33>
//	[REDACTED:api-key]           other vendors' keys by their prefix: Shopify, DigitalOcean, Doppler, Databricks,
//	                             Linear, Postman, Twilio (SK), Mailgun (key-), New Relic, Grafana, Atlassian, Square,
//	                             Fly.io, Pulumi, Docker Hub, Terraform Cloud, Alibaba (LTAI), Tailscale, Supabase,
//	                             Sourcegraph, Perplexity, RubyGems, NuGet, Clojars, PlanetScale, Prefect, Dynatrace,
//	                             OpenShift (sha256~), Sentry, Groq, xAI, ReadMe, 1Password
//	[REDACTED:bearer]            the token after "Bearer" (in an Authorization header or alone)
//	[REDACTED:authorization]     other Authorization header credentials (Basic, token, ...)
//	[REDACTED:private-key]       every non-empty line of a PEM private key block
//	[REDACTED:password]          the value of a password key, a password flag, and the password of scheme://user:password@host
//	[REDACTED:aws-secret]        the value of aws_secret_access_key = ... (and SecretAccessKey: ...)
//	[REDACTED:token]             the value of a token key (any key ending in "token", "jwt")
//	[REDACTED:secret]            the value of other secret keys, cookies, and base64 values that decode to a secret
//	[REDACTED]                   a match of one of the Extra patterns
//
// Vendor tokens are found by their shape alone, with no key next to
// them: a prefix, then a body of the vendor's alphabet and length. A
// body must look drawn at random (enough distinct characters, not a run
// of one filler or of consecutive characters), or, for GitHub and npm,
// carry its CRC32 checksum, so that placeholders such as "xoxb-xxxx",
// "ghp_xxxx...", "sk_test_xxxxxxxx" are left alone.
//
// Secrets without a shape of their own are found by the key before
// them. A key is secret-bearing when its letters and digits, in lower
// case, end in password, passwd, passphrase, token, secret, salt,
// apikey, secretkey, privatekey, encryptionkey, signingkey, masterkey,
// accesskey, accountkey, appkey, authkey, clientkey, licensekey,
// sessionkey, storagekey, secretaccesskey or authorization; its value
// is then masked unless it is a placeholder. Keys that end in pwd,
// pass (after a prefix: DB_PASS, MYSQL_PWD, not PWD or PASS), key,
// auth, credentials, creds, sig, signature or jwt are weaker: their
// value is masked only if it looks random (mixed letters and digits,
// not a word, a path, a URL or a number). "key" alone counts only in a
// query string (?key=) or with a quoted value. Keys that name public or
// structural things (public_key, primary_key, sort_key, ...) never
// count. The forms recognised are:
//
//   - KEY=v, key: v, "key": "v", key := v, key => v, and make's and
//     PHP's ?=, ::=, +=, .= (not the comparisons ==, !=, <=, >=);
//     x["KEY"] = v; a type between key and value (var key string = v,
//     const KEY: &str = v, KEY:STRING=v); value="v" in an XML element
//     whose key or name attribute is secret-bearing;
//   - flags: --password v, --api-key=v, -storepass v, -passin pass:v,
//     and for the commands that give them that meaning -p v (sshpass,
//     docker, twine, az, ...), -pv (mysql), -a v (redis-cli), -w v
//     (ldapsearch), -N v (ssh-keygen), -u user:v (curl, wget), and the
//     v of `echo v | ... --password-stdin`;
//   - a name with '_' or '-' followed by blanks and a random-looking
//     value (secret_access_key v), and the first word of a line
//     followed by a single random-looking or quoted value (a table's
//     "password    v", .netrc's "password v", Gradle's storePassword
//     "v");
//   - <password>v</password> and <entry key="api.token">v</entry>;
//   - a quoted key, a comma and a quoted random-looking value:
//     setProperty("X_TOKEN", "v"), define('AUTH_KEY', 'v');
//   - Cookie and Set-Cookie headers (and curl's --cookie): the values of
//     their pairs of 8 bytes or more, not the attributes;
//   - URLs: the password of scheme://user:password@host, which may hold
//     '@', '/' or ':' (the host starts after the last '@' before the
//     query), and a user that looks like a key (a Sentry DSN);
//   - a YAML or JSON value that is base64 of text holding a secret (a
//     Kubernetes Secret's data, .dockerconfigjson, kubeconfig's
//     client-key-data): the whole value.
//
// An unquoted value runs to the next blank, quote or ';' (and '&' in a
// query string, ',' before another key=); a quoted one to its closing
// quote or the end of the line. A placeholder is never masked: a
// variable (${TOKEN}, $TOKEN, %TOKEN%, $(cmd)), a template ({{
// .Values.password }}, <your-token>), a filler (xxxx, ****, sk-...),
// an upper-case word (REDACTED, DATA+OMITTED), a literal (true, null,
// none), and, unquoted, code (process.env.TOKEN, os.Getenv("TOKEN")).
// After ':' or a blank, a word or number followed by more words is
// taken for prose ("password authentication failed"). The key is kept,
// so the output still says what was there. A standalone "Bearer"
// (written in lower, Title or upper case) is only taken to introduce a
// token when the token is at least 8 characters long and holds a digit,
// so that prose such as "the bearer of" is left alone.
//
// Redactor never adds or removes a line break: it preserves the number
// of lines of every text, so that [Registry.Read] can go on mapping raw
// offsets to the admitted text line for line after a job has ended. A
// PEM block (from its -----BEGIN ... PRIVATE KEY----- line to its
// -----END ... PRIVATE KEY----- line, inclusive) is masked line by line,
// keeping its line breaks. A BEGIN without an END masks to the end of the
// text, and an END without a BEGIN masks from the start of the text,
// since a text may be a piece of the stream: a Read chunk, or the head or
// tail around the omission line (which Redactor never masks: a block
// open at an omission line is masked up to it, and the tail after it
// counts as the start of a text). A piece that lies wholly inside a PEM
// body, holding neither its BEGIN nor its END line, cannot be recognised
// and passes unmasked. Read serves whole lines, and after the job's end
// serves pieces of the text admitted as a whole, so this only happens to
// a Read chunk of a running job that is smaller than the key.
//
// When something was masked, Admit sets [Admitted.Notice] to a count
// such as "redacted 2 secrets", which says nothing of the secrets. When
// nothing matched, the text is admitted unchanged (the same string) with
// no notice. Text already redacted is left as it is (a value that holds
// a marker is taken as masked): redaction is idempotent, so
// [Registry.Readmit] does not stack markers or count secrets twice.
//
// Redactor is cheap where there is nothing to mask: vendor tokens are
// found by probing one byte in 16 (every token holds a run of 17 letters,
// digits, '_' or '-' at least), keys by looking back from each '=' and
// ':' (and from each '-' and '_' for flags, and each line's start), and
// the other forms by fast scans for rare bytes ('@', "</", "\","); a key
// is rejected by its last two letters before it is read. Every scan is
// linear in the text, whatever it holds. BenchmarkRedactor measures
// about 1.7 ms per MiB of clean build-log text, and TestRedactorCorpus the
// share of secrets caught and of ordinary output touched (see the
// README's "Output policy").
//
// Redactor is a best-effort filter for accidental leaks, not a defence
// against a command that means to disclose a secret (it could print it
// encoded or split across lines). A secret with no shape of its own
// printed with no key before it (a bare password, an AWS secret key or
// an Azure storage key alone on a line) cannot be told from a hash and
// passes.
//
// The zero Redactor is ready to use, as a value or a pointer. A Redactor
// is safe for concurrent use by multiple goroutines, as long as Extra is
// not modified once it is in use.
type Redactor struct {
	// Extra holds further patterns to mask, each match replaced by
	// "[REDACTED]". If a pattern has a capturing group, only the text of
	// its first group is masked (so `(?i)session_id=(\S+)` keeps the
	// name). A match that spans line breaks is masked line by line,
	// keeping them. If Extra is nil, only the built-in kinds are masked.
	Extra []*regexp.Regexp
}

// The markers that stand for masked secrets.
const (
	markAWSKey        = "[REDACTED:aws-key]"
	markAWSSecret     = "[REDACTED:aws-secret]"
	markGitHub        = "[REDACTED:github-token]"
	markSlack         = "[REDACTED:slack-token]"
	markBearer        = "[REDACTED:bearer]"
	markAuthorization = "[REDACTED:authorization]"
	markPrivateKey    = "[REDACTED:private-key]"
	markPassword      = "[REDACTED:password]"
	markToken         = "[REDACTED:token]"
	markSecret        = "[REDACTED:secret]"
	markExtra         = "[REDACTED]"
)

// Admit masks the secrets in req.Text; see [Redactor]. It never fails
// and never withholds.
func (r Redactor) Admit(_ context.Context, req AdmitRequest) (Admitted, error) {
	text, n := r.Redact(req.Text)
	if n == 0 {
		return Admitted{Text: req.Text}, nil
	}
	return Admitted{Text: text, Notice: redactNotice(n)}, nil
}

// Redact returns text with its secrets masked, and how many it masked.
// If it masked none, it returns text itself.
func (r Redactor) Redact(text string) (string, int) {
	return r.redact(text, 0)
}

// redact is Redact; depth is 1 for text decoded from a base64 value,
// which is not searched for base64 in turn.
func (r Redactor) redact(text string, depth int) (string, int) {
	if text == "" {
		return text, 0
	}
	var es []edit
	for i := range tokenRules {
		es = tokenRules[i].scan(text, es)
	}
	es = scanTokens(text, es)
	es = scanURLs(text, es)
	es = scanAssignments(text, depth, es)
	es = scanWordKeys(text, es)
	es = scanXML(text, es)
	es = scanQuotedPairs(text, es)
	es = scanPEM(text, es)
	for _, re := range r.Extra {
		if re != nil {
			es = scanExtra(text, re, es)
		}
	}
	return applyEdits(text, es)
}

func redactNotice(n int) string {
	if n == 1 {
		return "redacted 1 secret"
	}
	return "redacted " + strconv.Itoa(n) + " secrets"
}

// edit replaces text[start:end], which never holds a line break, by
// marker. first is set on the first edit of a secret, so that a PEM block
// masked line by line counts once.
type edit struct {
	start, end int
	marker     string
	first      bool
}

// addEdit appends the edit unless it is empty or holds a marker. A
// marker there means the text was redacted before, and a second pass
// may see a value run on past it (once the quote that ended it is
// masked, say): what lies next to the marker was judged clean the first
// time, so leaving it keeps redaction idempotent.
func addEdit(es []edit, text string, start, end int, marker string, first bool) []edit {
	if end <= start || holdsMarker(text[start:end]) {
		return es
	}
	return append(es, edit{start, end, marker, first})
}

// holdsMarker reports whether s holds a marker.
func holdsMarker(s string) bool {
	for {
		i := strings.Index(s, "[REDACTED")
		if i < 0 {
			return false
		}
		s = s[i:]
		if j := strings.IndexByte(s[:min(len(s), 64)], ']'); j >= 0 && isMarker(s[:j+1]) {
			return true
		}
		s = s[1:]
	}
}

func isMarker(s string) bool {
	return strings.HasPrefix(s, "[REDACTED") && strings.HasSuffix(s, "]") &&
		len(s) <= 64 && !strings.ContainsAny(s[1:len(s)-1], "[] \t")
}

// applyEdits makes the edits, merging overlapping ones (the edit that
// starts first keeps its marker), and counts the secrets masked. Edits
// that would touch an omission line are dropped: the registry finds the
// head and the tail of an admitted text by that line.
func applyEdits(text string, es []edit) (string, int) {
	if len(es) == 0 {
		return text, 0
	}
	// Stable, so that of two edits with the same span the rule that
	// ran first names the secret.
	slices.SortStableFunc(es, func(a, b edit) int {
		return cmp.Or(cmp.Compare(a.start, b.start), cmp.Compare(b.end, a.end))
	})
	if om := omissionLines(text); len(om) > 0 {
		// Both are in order, and an edit lies within one line.
		es = slices.DeleteFunc(es, func(e edit) bool {
			for len(om) > 0 && om[0].end <= e.start {
				om = om[1:]
			}
			return len(om) > 0 && om[0].start < e.end
		})
	}
	merged := es[:0]
	for _, e := range es {
		if k := len(merged) - 1; k >= 0 && e.start < merged[k].end {
			merged[k].end = max(merged[k].end, e.end)
			merged[k].first = merged[k].first || e.first
			continue
		}
		merged = append(merged, e)
	}
	if len(merged) == 0 {
		return text, 0
	}
	var sb strings.Builder
	size := len(text)
	for _, e := range merged {
		size += len(e.marker) - (e.end - e.start)
	}
	sb.Grow(size)
	n, last := 0, 0
	for _, e := range merged {
		sb.WriteString(text[last:e.start])
		sb.WriteString(e.marker)
		last = e.end
		if e.first {
			n++
		}
	}
	sb.WriteString(text[last:])
	// Every secret has a first edit, unless that edit was dropped (it
	// touched an omission line): the text changed, so count at least one.
	return sb.String(), max(n, 1)
}

// span is a range of a text.
type span struct{ start, end int }

// omissionLines returns the lines of text (without their line break)
// that read like the registry's omission line, "[... N bytes omitted ...]".
func omissionLines(text string) []span {
	const open, mid = "[... ", " bytes omitted ...]"
	var om []span
	for pos := 0; ; {
		i := strings.Index(text[pos:], open)
		if i < 0 {
			return om
		}
		i += pos
		pos = i + len(open)
		if i > 0 && text[i-1] != '\n' {
			continue
		}
		e := textLineEnd(text, i)
		line := text[i:e]
		digits, ok := strings.CutSuffix(line[len(open):], mid)
		n, err := strconv.ParseInt(digits, 10, 64)
		if ok && err == nil && omissionLine(n) == line+"\n" {
			om = append(om, span{i, e})
		}
	}
}

// textLineStart returns the start of the line that holds text[i].
func textLineStart(text string, i int) int {
	return strings.LastIndexByte(text[:i], '\n') + 1
}

// textLineEnd returns the index of the line break that ends the line holding
// text[i], or len(text).
func textLineEnd(text string, i int) int {
	if j := strings.IndexByte(text[i:], '\n'); j >= 0 {
		return i + j
	}
	return len(text)
}

// tokenRule finds secrets that have a shape of their own. The regexp
// runs only on the lines that hold one of the triggers, found with
// strings.Index, so a text without them costs a few fast scans. The
// triggers start with bytes that are rare in output (strings.Index is
// at its fastest when the first byte is rare).
type tokenRule struct {
	triggers []string
	find     func(s string) int // if set, finds a trigger instead: its index in s, or -1
	re       *regexp.Regexp     // if it has a group, the first group is masked
	marker   string
	ok       func(line string, start, end int) bool // if set, must accept the match
}

var tokenRules = []tokenRule{
	{
		// The spellings of the triggers and no others: a case-blind
		// regexp found "BeArer x1..." only on a second pass, on a line
		// that the marker's own "bearer" had let it scan (FuzzRedactor).
		// After "Authorization:" any case counts (scanAssignments).
		triggers: []string{"bearer", "Bearer", "BEARER"},
		re:       regexp.MustCompile(`\b(?:bearer|Bearer|BEARER)[ \t]+([A-Za-z0-9\-._~+/]+=*)`),
		marker:   markBearer,
		// A token, not a word of prose.
		ok: func(line string, start, end int) bool {
			return end-start >= 8 && strings.ContainsAny(line[start:end], "0123456789")
		},
	},
}

// scan appends the edits for the rule's matches in text.
func (r *tokenRule) scan(text string, es []edit) []edit {
	var lines []int // starts of the lines that hold a trigger
	collect := func(find func(string) int) {
		for pos := 0; pos < len(text); {
			i := find(text[pos:])
			if i < 0 {
				break
			}
			i += pos
			lines = append(lines, textLineStart(text, i))
			pos = textLineEnd(text, i) + 1
		}
	}
	if r.find != nil {
		collect(r.find)
	}
	for _, t := range r.triggers {
		collect(func(s string) int { return strings.Index(s, t) })
	}
	if len(lines) == 0 {
		return es
	}
	if len(r.triggers) > 1 {
		slices.Sort(lines)
		lines = slices.Compact(lines)
	}
	g := 0
	if r.re.NumSubexp() > 0 {
		g = 2
	}
	for _, ls := range lines {
		line := text[ls:textLineEnd(text, ls)]
		for _, m := range r.re.FindAllStringSubmatchIndex(line, -1) {
			start, end := m[g], m[g+1]
			if start < 0 || (r.ok != nil && !r.ok(line, start, end)) {
				continue
			}
			es = addEdit(es, text, ls+start, ls+end, r.marker, true)
		}
	}
	return es
}

// pemLabel is what every PEM private key's BEGIN and END lines hold,
// after the key's type ("RSA ", "EC ", "OPENSSH ", "ENCRYPTED ", "PGP ").
const pemLabel = "PRIVATE KEY"

// scanPEM appends the edits that mask PEM private key blocks line by
// line. Omission lines split the text into sections, each handled as a
// text of its own: a block open at the end of a section is masked to
// its end, and an END without a BEGIN masks from the section's start (or
// from the line after the section's last END).
func scanPEM(text string, es []edit) []edit {
	if !strings.Contains(text, pemLabel) {
		return es
	}
	bounds := omissionLines(text)
	// open is the line start of the open BEGIN, or -1. Lines before
	// from are done (masked, or the section before an omission line): a
	// lone END masks from there, and a block never masks them again, so
	// that each line is looked at once however many markers it holds.
	open, from := -1, 0
	cut := func(b span) { // the section ends at omission line b
		if open >= 0 {
			es = maskLines(text, open, b.start, es)
			open = -1
		}
		from = min(b.end+1, len(text))
	}
	ls, le := 0, -1 // the line of the last marker
	for pos := 0; ; {
		i := strings.Index(text[pos:], pemLabel)
		if i < 0 {
			break
		}
		i += pos
		pos = i + len(pemLabel)
		begin, ok := pemMarker(text, i)
		if !ok {
			continue
		}
		for len(bounds) > 0 && bounds[0].start < i {
			cut(bounds[0])
			bounds = bounds[1:]
		}
		if i > le {
			ls, le = textLineStart(text, i), textLineEnd(text, i)
		}
		switch {
		case begin:
			if open < 0 {
				open = max(ls, from)
			}
		case open >= 0:
			es = maskLines(text, open, pos, es)
			open, from = -1, min(le+1, len(text))
		default:
			es = maskLines(text, from, pos, es)
			from = min(le+1, len(text))
		}
	}
	for _, b := range bounds {
		cut(b)
	}
	if open >= 0 {
		es = maskLines(text, open, len(text), es)
	}
	return es
}

// pemMarker reports whether the "PRIVATE KEY" at text[i] is part of a
// "-----BEGIN ... PRIVATE KEY-----" (begin) or "-----END ... PRIVATE
// KEY-----" line.
func pemMarker(text string, i int) (begin, ok bool) {
	rest := strings.TrimPrefix(text[i+len(pemLabel):], " BLOCK") // PGP
	if !strings.HasPrefix(rest, "-----") {
		return false, false
	}
	// The type is a few words: looking back further than that would
	// make a line of "PRIVATE KEYPRIVATE KEY..." cost quadratic time.
	k, stop := i, max(0, i-64)
	for k > stop && (isUpperAlnum(text[k-1]) || text[k-1] == ' ') {
		k--
	}
	if !strings.HasSuffix(text[:k], "-----") {
		return false, false
	}
	switch label := text[k:i]; {
	case strings.HasPrefix(label, "BEGIN "):
		return true, true
	case strings.HasPrefix(label, "END "):
		return false, true
	}
	return false, false
}

// maskLines appends an edit for every non-empty line that starts in
// [from, to), each replaced by the private key marker; the first counts
// as the secret. A line's trailing '\r' is kept.
func maskLines(text string, from, to int, es []edit) []edit {
	first := true
	for s := from; s < to && s < len(text); {
		e := textLineEnd(text, s)
		c := e
		if c > s && text[c-1] == '\r' {
			c--
		}
		if c > s && !isMarker(text[s:c]) {
			es = append(es, edit{s, c, markPrivateKey, first})
			first = false
		}
		s = e + 1
	}
	return es
}

// scanExtra appends the edits for the matches of re (or of its first
// group), split at line breaks.
func scanExtra(text string, re *regexp.Regexp, es []edit) []edit {
	g := 0
	if re.NumSubexp() > 0 {
		g = 2
	}
	for _, m := range re.FindAllStringSubmatchIndex(text, -1) {
		start, end := m[g], m[g+1]
		if start < 0 {
			continue
		}
		first := true
		for s := start; s < end; {
			e := min(textLineEnd(text, s), end)
			n := len(es)
			if es = addEdit(es, text, s, e, markExtra, first); len(es) > n {
				first = false
			}
			s = e + 1
		}
	}
	return es
}

func isBlank(c byte) bool { return c == ' ' || c == '\t' }

func isSpace(c byte) bool {
	return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'
}

func isQuote(c byte) bool { return c == '"' || c == '\'' || c == '`' }

func isUpperAlnum(c byte) bool { return 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' }

func isKeyChar(c byte) bool {
	return 'a' <= c|0x20 && c|0x20 <= 'z' || '0' <= c && c <= '9' || c == '_' || c == '-' || c == '.'
}

func isAlpha(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i] | 0x20; c < 'a' || c > 'z' {
			return false
		}
	}
	return s != ""
}
