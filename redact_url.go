package bgjob

import "strings"

// scanURLs appends the edits for the credentials in URLs: the password
// of scheme://user:password@host, which may hold '@', '/' or ':' (the
// host starts after the last '@' of the authority), and a user that
// is a key (a Sentry DSN's https://KEY@host). It visits every '@'.
func scanURLs(text string, es []edit) []edit {
	for pos := 0; pos < len(text); {
		i := strings.IndexByte(text[pos:], '@')
		if i < 0 {
			break
		}
		i += pos
		pos = i + 1
		// The URL's start: "://" before the '@', in the same word.
		ws := i
		for ws > 0 && i-ws < 512 && !urlStop(text[ws-1]) {
			ws--
		}
		we := i
		for we < len(text) && !urlStop(text[we]) {
			we++
		}
		// The other '@'s of this word share its start: look once.
		pos = we
		u := strings.LastIndex(text[ws:i], "://")
		if u < 0 {
			continue
		}
		u += ws + 3
		// The authority ends at the last '@' before the query.
		lim := we
		if k := strings.IndexAny(text[i:we], "?#"); k >= 0 {
			lim = i + k
		}
		at := i + strings.LastIndexByte(text[i:lim], '@')
		info := text[u:at]
		if holdsMarker(info) {
			continue // redacted before: idempotence
		}
		if c := strings.IndexByte(info, ':'); c >= 0 {
			if strings.IndexByte(info[:c], '/') >= 0 || c+1 == len(info) {
				continue
			}
			if p := info[c+1:]; !placeholder(p, true) {
				es = addEdit(es, text, u+c+1, at, markPassword, true)
			}
			continue
		}
		if len(info) >= 16 && strings.IndexByte(info, '/') < 0 && randomValue(info) {
			es = addEdit(es, text, u, at, markToken, true)
		}
	}
	return es
}

// urlStop reports whether c ends a URL as output writes it.
func urlStop(c byte) bool {
	return isSpace(c) || isQuote(c) || c == '<' || c == '>' || c == '(' || c == ')' || c == '"' || c == '\\'
}
