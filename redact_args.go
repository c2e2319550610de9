package bgjob

import "strings"

// Secrets whose key and value are separated by blanks rather than by
// '=' or ':': command-line flags (--password X, -p X of sshpass),
// names with '_' or '-' (secret_access_key X, add-authtoken X), the
// first word of a line (a table's "password    s3cr3t", .netrc's
// "password X", Gradle's storePassword "X"), XML
// elements (<password>X</password>) and quoted pairs
// (setProperty("X_TOKEN", "X")).

// shortFlags are the single-letter flags whose value is a secret, for
// the commands that give them that meaning.
var shortFlags = []struct {
	flag     byte
	commands []string
	attached bool // -pSECRET, no blank
}{
	{'p', []string{"sshpass", "docker", "podman", "twine", "az", "nuget", "mc", "nerdctl", "helm", "oras", "skopeo", "buildah", "crane"}, false},
	{'p', []string{"mysql", "mysqldump", "mysqladmin", "mariadb", "mariadb-dump"}, true},
	{'a', []string{"redis-cli", "valkey-cli", "keydb-cli"}, false},
	{'w', []string{"ldapsearch", "ldapadd", "ldapmodify", "ldapdelete", "ldapwhoami", "ldappasswd"}, false},
	{'N', []string{"ssh-keygen"}, false},
	{'P', []string{"ssh-keygen"}, false},
	{'t', []string{"codecov"}, false},
}

// scanWordKeys appends the edits for keys followed by blanks and a
// value. Flags and names with '_' or '-' are found from their '-' and
// '_' (IndexByte, so a text without them costs nothing), first words
// from each line's start.
func scanWordKeys(text string, es []edit) []edit {
	done := 0 // the end of the last word looked at
	for _, sep := range []byte{'-', '_'} {
		done = 0
		for pos := 0; pos < len(text); {
			i := strings.IndexByte(text[pos:], sep)
			if i < 0 {
				break
			}
			i += pos
			pos = i + 1
			// Dates, versions and identifiers: 2024-01-02, x_1.
			if i < done || i+1 < len(text) && isDigit(text[i+1]) {
				continue
			}
			// The word holding it: its end first, since a word inside
			// which the separator is (not a flag) must be followed by a
			// blank and end in a secret-bearing word to matter.
			e := i + 1
			for e < len(text) && isFlagByte(text[e]) {
				e++
			}
			done, pos = e, e
			if i > 0 && isFlagByte(text[i-1]) && !innerKey(text, e) {
				continue
			}
			s := i
			for s > 0 && isFlagByte(text[s-1]) {
				s--
			}
			if s > 0 && !isBlank(text[s-1]) && !isQuote(text[s-1]) && text[s-1] != '\n' {
				continue
			}
			n := len(es)
			var end int
			es, end = wordKeyAt(text, s, e, es)
			// Past the value read, so that its bytes are not read again
			// ("--password '" or "--cookie " a thousand times on a line).
			if len(es) > n {
				end = max(end, es[len(es)-1].end)
			}
			done = max(done, end)
			pos = done
		}
	}
	// First words of lines.
	for ls := 0; ls < len(text); {
		le := textLineEnd(text, ls)
		es = firstWord(text, ls, le, es)
		ls = le + 1
	}
	return es
}

// firstWord looks at the first word of the line text[ls:le].
func firstWord(text string, ls, le int, es []edit) []edit {
	s := ls
	for s < le && (isBlank(text[s]) || text[s] == '-' && s+1 < le && text[s+1] == ' ') {
		s++
	}
	if s >= le || !isAlpha(text[s:s+1]) && text[s] != '_' {
		return es // a time stamp, a number, a symbol: no key
	}
	e := s
	for e < le && isKeyByte(text[e]) {
		e++
	}
	if e-s <= 40 && len(endingsByLast[text[e-1]|0x20]) > 0 {
		es = firstWordAt(text, s, e, le, es)
	}
	return es
}

// lineStartNear returns the start of the line that holds text[i], or
// i-near if the line started earlier: what is looked for before a flag
// or a tag is near it, and the bound keeps a long line linear. It
// searches forward, with IndexByte, which is fast where LastIndexByte
// is not.
func lineStartNear(text string, i, near int) int {
	from := max(0, i-near)
	for {
		k := strings.IndexByte(text[from:i], '\n')
		if k < 0 {
			return from
		}
		from += k + 1
	}
}

// innerKey reports whether a word ending at text[e] may be a key
// followed by its value: a blank follows, and its last two letters are
// those of a secret-bearing key's (or it holds a short flag's value).
func innerKey(text string, e int) bool {
	if e >= len(text) || !isBlank(text[e]) || e < 2 {
		return e < len(text) && !isBlank(text[e]) // -pSECRET%x: the flag reads on
	}
	last := text[e-1] | 0x20
	return len(endingsByLast[last]) > 0 && (!isAlnum(text[e-2]) || secondLast[last][text[e-2]|0x20])
}

// isFlagByte: the bytes of a flag or a key written before a blank
// (--password, secret_access_key, //registry.npmjs.org/:_authToken).
func isFlagByte(c byte) bool { return flagByteTable[c] }

var flagByteTable = func() (t [256]bool) {
	for c := range 256 {
		t[c] = isKeyByte(byte(c)) || c == ':' || c == '/'
	}
	return t
}()

// wordKeyAt looks at the word text[s:e], which holds a '-' or '_': a
// flag (-p, --password, -storepass), or a key (secret_access_key,
// add-authtoken), followed by blanks and its value. It returns the end
// of what it read.
func wordKeyAt(text string, s, e int, es []edit) ([]edit, int) {
	w := text[s:e]
	if len(w) > 2 && w[0] == '-' && w[1] != '-' && isAlpha(w[1:2]) && (e == len(text) || !isBlank(text[e])) {
		return shortFlagAt(text, s, e, es), e // -pSEC%RET
	}
	if e >= len(text) || !isBlank(text[e]) {
		return es, e
	}
	switch {
	case strings.HasPrefix(w, "--") && len(w) > 2, strings.HasPrefix(w, "-") && len(w) > 2 && isAlpha(w[1:]):
		// --password X, -storepass X, -passin pass:X
		name := strings.TrimLeft(w, "-")
		switch name {
		case "user", "proxy-user":
			return userPassAt(text, s, e, es), e
		case "password-stdin":
			return echoedAt(text, s, es), e
		}
		if name == "passin" || name == "passout" || name == "pass" {
			v := e
			for v < len(text) && isBlank(text[v]) {
				v++
			}
			if strings.HasPrefix(text[v:], "pass:") {
				ve := valueEnd(text, v+5, 0, false, false)
				return addEdit(es, text, v+5, ve, markPassword, true), ve
			}
			return es, e
		}
		c, m := keyOf(name, false)
		if c == keyCookie {
			v := e
			for v < len(text) && isBlank(text[v]) {
				v++
			}
			var q byte
			if v < len(text) && isQuote(text[v]) {
				q = text[v]
				v++
			}
			return cookieValues(text, v, q, es)
		}
		if c == keyWeak && strings.HasPrefix(w, "--") {
			c = keyStrong // --auth X, --api-key X: the flag says what X is
		}
		if c == keyStrong || c == keyWeak {
			return blankValue(text, e, c, m, es)
		}
		return es, e
	case len(w) == 2 && w[0] == '-', len(w) > 2 && w[0] == '-' && w[1] != '-':
		return shortFlagAt(text, s, e, es), e
	case w[0] != '-':
		// secret_access_key X, add-authtoken X: only a value that looks
		// random, since prose has "access_token expired".
		if c, m := keyOf(w, false); c == keyStrong || c == keyWeak {
			return blankValue(text, e, keyWeak, m, es)
		}
	}
	return es, e
}

// shortFlagAt handles -p X, -pX and the like, for the commands that
// give the flag a secret (shortFlags), named earlier on the line.
func shortFlagAt(text string, s, e int, es []edit) []edit {
	flag := text[s+1]
	attachedValue := e-s > 2
	if attachedValue { // -pSECRET runs to the next blank
		e = valueEnd(text, s+2, 0, false, false)
	}
	line := text[lineStartNear(text, s, 160):s]
	if flag == 'u' && !attachedValue || flag == 'U' {
		return userPassAt(text, s, e, es)
	}
	for _, sf := range shortFlags {
		if sf.flag != flag || sf.attached != attachedValue {
			continue
		}
		if !commandIn(line, sf.commands) {
			continue
		}
		if attachedValue {
			return addEdit(es, text, s+2, e, markPassword, true)
		}
		es, _ = blankValue(text, e, keyStrong, markPassword, es)
		return es
	}
	return es
}

// userPassAt masks the password of curl's -u user:password (and
// --user, --proxy-user) whose flag is text[s:e].
func userPassAt(text string, s, e int, es []edit) []edit {
	if !commandIn(text[lineStartNear(text, s, 160):s], []string{"curl", "wget", "http"}) {
		return es
	}
	v := e
	for v < len(text) && isBlank(text[v]) {
		v++
	}
	var q byte
	if v < len(text) && isQuote(text[v]) {
		q = text[v]
		v++
	}
	ve := valueEnd(text, v, q, false, false)
	c := strings.IndexByte(text[v:ve], ':')
	if c < 0 || v+c+1 == ve || placeholder(text[v+c+1:ve], q != 0) {
		return es
	}
	return addEdit(es, text, v+c+1, ve, markPassword, true)
}

// echoedAt masks X in `echo X | docker login --password-stdin`, whose
// flag starts at text[s].
func echoedAt(text string, s int, es []edit) []edit {
	ls := lineStartNear(text, s, 160)
	line := text[ls:s]
	k := strings.Index(line, "echo ")
	p := strings.LastIndexByte(line, '|')
	if k < 0 || p < k {
		return es
	}
	v := ls + k + len("echo ")
	for v < ls+p && (isBlank(text[v]) || text[v] == '-' && v+1 < len(text) && text[v+1] == 'n') {
		if text[v] == '-' {
			v++
		}
		v++
	}
	var q byte
	if isQuote(text[v]) {
		q = text[v]
		v++
	}
	ve := valueEnd(text, v, q, false, false)
	if ve > ls+p || placeholder(text[v:ve], q != 0) {
		return es
	}
	return addEdit(es, text, v, ve, markPassword, true)
}

// commandIn reports whether one of the commands is one of the last
// ten words of line (the words just before a flag: "sshpass -p",
// "mysql -h db -u root -p").
func commandIn(line string, commands []string) bool {
	e := len(line)
	for range 10 {
		for e > 0 && commandStop(line[e-1]) {
			e--
		}
		if e == 0 {
			return false
		}
		i := e
		for i > 0 && !commandStop(line[i-1]) {
			i--
		}
		if w := line[i:e]; len(w) >= 2 {
			for _, c := range commands {
				if w == c {
					return true
				}
			}
		}
		e = i
	}
	return false
}

func commandStop(c byte) bool {
	return isBlank(c) || c == '/' || c == '\'' || c == '"' || c == '(' || c == ';' || c == '|' || c == '&'
}

// blankValue masks the value after the blanks that follow text[e], for
// a key of the given class, and returns its end.
func blankValue(text string, e int, class keyClass, marker string, es []edit) ([]edit, int) {
	v := e
	for v < len(text) && isBlank(text[v]) {
		v++
	}
	if v == e || v >= len(text) || text[v] == '-' || text[v] == '\n' || text[v] == '=' || text[v] == ':' || text[v] == '<' || text[v] == '|' || text[v] == '\\' {
		return es, v
	}
	return valueEdit(text, v, class, marker, false, true, es)
}

// firstWordAt handles a line that starts (after its indent) with the
// key text[s:e] followed by blanks and a single value: a table's row
// (password    s3cr3t), .netrc's "password X", Gradle's storePassword
// "X". With one blank, only a value that looks random or is quoted.
func firstWordAt(text string, s, e, le int, es []edit) []edit {
	if e >= le || !isBlank(text[e]) {
		return es
	}
	c, m := keyOf(text[s:e], false)
	if c != keyStrong && c != keyWeak {
		return es
	}
	v := e
	for v < le && isBlank(text[v]) {
		v++
	}
	if v >= le {
		return es
	}
	// A single value: nothing but blanks after it.
	var q byte
	if isQuote(text[v]) {
		q = text[v]
	}
	ve := valueEnd(text, v+min(1, int(q)), q, false, false)
	if q != 0 && ve < le {
		ve++
	}
	for k := ve; k < le; k++ {
		if !isBlank(text[k]) && text[k] != '\r' {
			return es
		}
	}
	if q == 0 {
		c = keyWeak
	}
	es, _ = valueEdit(text, v, c, m, false, true, es)
	return es
}

// scanXML appends the edits for the text of elements named like a
// secret (<password>X</password>), or whose key or name attribute is
// (<entry key="api.token">X</entry>). It visits every "</".
func scanXML(text string, es []edit) []edit {
	for pos := 0; ; {
		i := strings.Index(text[pos:], "</")
		if i < 0 {
			return es
		}
		i += pos
		pos = i + 2
		e := pos
		for e < len(text) && isKeyByte(text[e]) {
			e++
		}
		if e == pos || e >= len(text) || text[e] != '>' {
			continue
		}
		name := text[pos:e]
		// The value: from the '>' that ends the opening tag.
		ls := lineStartNear(text, i, 512)
		gt := strings.LastIndexByte(text[ls:i], '>')
		if gt < 0 {
			continue
		}
		gt += ls
		open := strings.LastIndexByte(text[ls:gt], '<')
		if open < 0 || !strings.HasPrefix(text[ls+open+1:], name) {
			continue
		}
		c, m := keyOf(name, false)
		if c == keyNone {
			c, m = attributeKey(text, gt)
		}
		if c == keyCookie || c == keyAuthorization {
			c, m = keyStrong, markSecret
		}
		if c == keyNone {
			continue
		}
		v := text[gt+1 : i]
		if v == "" || strings.ContainsAny(v, "<>") || placeholder(v, true) || (c == keyWeak && !randomValue(v)) {
			continue
		}
		es = addEdit(es, text, gt+1, i, m, true)
	}
}

// scanQuotedPairs appends the edits for a quoted key followed by a comma
// and a quoted value: setProperty("X_TOKEN", "v"), { "AccountKey", "v"
// }, getenv("API_TOKEN", "v"), define('AUTH_KEY', 'v').
func scanQuotedPairs(text string, es []edit) []edit {
	for _, pair := range []string{"\",", "',"} {
		q := pair[0]
		for pos := 0; ; {
			i := strings.Index(text[pos:], pair)
			if i < 0 {
				break
			}
			i += pos
			pos = i + 2
			ls := lineStartNear(text, i, 80)
			ks := strings.LastIndexByte(text[ls:i], q)
			if ks < 0 {
				continue
			}
			ks += ls + 1
			c, m := keyOf(text[ks:i], false)
			if c == keyNone || c == keyCookie || c == keyAuthorization || i-ks > 64 || !isKeyText(text[ks:i]) {
				continue
			}
			if c == keyStrong {
				// Code lists names in pairs too ("Authorization",
				// "Cookie"): only a value that looks random.
				c = keyWeak
			}
			v := i + 2
			for v < len(text) && isBlank(text[v]) {
				v++
			}
			if v < len(text) && isQuote(text[v]) {
				es, _ = valueEdit(text, v, c, m, false, false, es)
			}
		}
	}
	return es
}

// isKeyText reports whether s can be a key: key bytes only.
func isKeyText(s string) bool {
	for i := 0; i < len(s); i++ {
		if !isKeyByte(s[i]) {
			return false
		}
	}
	return s != ""
}
