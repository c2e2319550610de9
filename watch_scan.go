package bgjob

import (
	"bytes"
	"regexp"
	"regexp/syntax"
	"slices"
	"unicode/utf8"
)

// Matching a stream's lines against watches, cheaply.
//
// A line ends at '\n'; the "\n" and a "\r" before it are not part of the
// text a pattern sees, so `ready$` matches "ready\r\n". A line longer than
// maxLine bytes is cut into pieces of maxLine bytes from its start, each
// matched on its own (the last one without its line ending, and not at
// all if that leaves it empty); a match that would straddle two pieces is
// missed.
//
// Running a regexp on every line is far too slow for a job that prints a
// gigabyte (Go's regexp needs about a microsecond per line for the usual
// `(?i)error|listening on|ready in`, and a 64-byte-line gigabyte has 16
// million lines). So each pattern is taken apart (regexp/syntax) for
// literals one of which every match must contain ("error", "listening on",
// "ready in", case-folded), one byte of each literal is chosen as its
// anchor, and a chunk of output is searched for the anchors with
// bytes.IndexByte (vectorised: tens of GB/s), once per distinct anchor
// byte over the whole chunk's complete lines. Only where an anchor's
// literal is really there is the line found (its start and end) and the
// regexp run on it. A pattern with no such literal (`^\d+ms$`, `.*`)
// makes every line go to the regexps, which costs what regexps cost.

// maxLine is the longest line matched whole; longer ones are matched in
// pieces of this many bytes. It also bounds a Match's Line and the bytes a
// job's watcher holds.
const maxLine = 4 << 10

// watch is a watch of a job, or a WaitFor caller's pattern, as its
// watcher keeps it. Its fields are guarded by the watcher's mutex.
type watch struct {
	name  string
	re    *regexp.Regexp
	every bool
	// from: lines and pieces that start before it are not matched (where
	// a Watch call or a WaitFor began).
	from int64
	// last is the offset of the watch's last match, -1 if none: a
	// restarted host that reads the output again skips what it matched
	// before (durable mode).
	last  int64
	fired bool // a watch without every has matched: it is done
	// wait is the WaitFor caller this pattern belongs to; nil for a
	// watch, whose matches are delivered (deliver.go).
	wait *waiter
	lits []lit // literals one of which every match holds; nil: none known
}

// done reports that the watch matches nothing more.
func (w *watch) done() bool { return w.fired && !w.every }

// lit is a literal that a match of a pattern must contain. A folded one
// (of a (?i) pattern) is ASCII and lower case, and matches either case.
type lit struct {
	s    string
	fold bool
}

// in reports whether text holds the literal.
func (l lit) in(text []byte) bool {
	if !l.fold {
		return bytes.Contains(text, []byte(l.s))
	}
	for i := 0; i+len(l.s) <= len(text); i++ {
		if lower(text[i]) == l.s[0] && l.at(text[i:]) {
			return true
		}
	}
	return false
}

// at reports whether text begins with the literal; text may be longer.
func (l lit) at(text []byte) bool {
	if len(text) < len(l.s) {
		return false
	}
	if !l.fold {
		return string(text[:len(l.s)]) == l.s
	}
	for i := 0; i < len(l.s); i++ {
		if lower(text[i]) != l.s[i] {
			return false
		}
	}
	return true
}

func lower(c byte) byte {
	if 'A' <= c && c <= 'Z' {
		return c + 'a' - 'A'
	}
	return c
}

func isLetter(c byte) bool { return 'a' <= lower(c) && lower(c) <= 'z' }

// maxLits bounds the literals taken from one pattern; a pattern that
// needs more is treated as having none.
const maxLits = 64

// literals returns literals one of which every match of re contains, or
// nil if it finds none (re may match the empty string, or anything). It
// never returns too few: a line that holds none of them cannot match.
// Every call parses the pattern again, so a watch calls it once.
func literals(re *regexp.Regexp) []lit {
	// The source parses as it did when it was compiled: regexp.Compile
	// uses syntax.Perl; CompilePOSIX's syntax is a subset of it whose
	// shared forms mean the same, and leftmost-longest changes which
	// match is found, never whether there is one.
	t, err := syntax.Parse(re.String(), syntax.Perl)
	if err != nil {
		return nil
	}
	ls, ok := required(t.Simplify())
	if !ok {
		return nil
	}
	if ls == nil {
		// re can never match (an empty class): an empty, non-nil set
		// makes no line a candidate.
		ls = []lit{}
	}
	return ls
}

// required is literals on a parsed pattern: ok is false when a match
// need not contain any literal it can name.
func required(re *syntax.Regexp) (ls []lit, ok bool) {
	switch re.Op {
	case syntax.OpNoMatch:
		return nil, true
	case syntax.OpLiteral:
		return literalOf(re.Rune, re.Flags&syntax.FoldCase != 0)
	case syntax.OpCharClass:
		// A small class: any of its characters.
		n := 0
		for i := 0; i < len(re.Rune); i += 2 {
			n += int(re.Rune[i+1]-re.Rune[i]) + 1
			if n > 8 {
				return nil, false
			}
		}
		for i := 0; i < len(re.Rune); i += 2 {
			for r := re.Rune[i]; r <= re.Rune[i+1]; r++ {
				ls = append(ls, lit{s: string(r)})
			}
		}
		return ls, true
	case syntax.OpCapture, syntax.OpPlus:
		return required(re.Sub[0])
	case syntax.OpRepeat:
		if re.Min >= 1 {
			return required(re.Sub[0])
		}
	case syntax.OpConcat:
		// Any one part's literals will do: take the best.
		found := false
		for _, sub := range re.Sub {
			sl, sok := required(sub)
			if sok && (!found || better(sl, ls)) {
				ls, found = sl, true
			}
		}
		return ls, found
	case syntax.OpAlternate:
		for _, sub := range re.Sub {
			sl, sok := required(sub)
			if !sok || len(ls)+len(sl) > maxLits {
				return nil, false
			}
			ls = append(ls, sl...)
		}
		return ls, true
	}
	return nil, false
}

// better reports whether the literal set a is a better filter than b: a
// longer shortest literal, then fewer literals.
func better(a, b []lit) bool {
	short := func(ls []lit) int {
		m := 1 << 30
		if len(ls) == 0 {
			return m // no match at all: the best filter there is
		}
		for _, l := range ls {
			m = min(m, len(l.s))
		}
		return m
	}
	if sa, sb := short(a), short(b); sa != sb {
		return sa > sb
	}
	return len(a) < len(b)
}

// literalOf turns a literal's runes into a literal. A case-folded literal
// keeps its longest run of ASCII characters that fold only to ASCII:
// 'k' and 's' fold to U+212A (Kelvin) and U+017F (long s) too, so a
// (?i)s in the pattern matches "ſ", which a byte search for s or S would
// miss; they, and any other character that is not ASCII, end a run.
func literalOf(runes []rune, fold bool) ([]lit, bool) {
	if !fold {
		return []lit{{s: string(runes)}}, true
	}
	var best, cur []byte
	for _, r := range runes {
		if r >= utf8.RuneSelf || r == 'k' || r == 'K' || r == 's' || r == 'S' {
			cur = cur[:0]
			continue
		}
		cur = append(cur, lower(byte(r)))
		if len(cur) > len(best) {
			best = append(best[:0], cur...)
		}
	}
	if len(best) == 0 {
		return nil, false
	}
	return []lit{{s: string(best), fold: true}}, true
}

// byteFreq is roughly how often each byte occurs in program output, in
// parts per 10,000: English text, code, paths, numbers and hex. It only
// steers the choice of anchors; a wrong guess costs time, never a match.
var byteFreq = func() [256]uint16 {
	var f [256]uint16
	for c := range f {
		f[c] = 2 // control bytes, non-ASCII
	}
	lowerFreq := map[byte]uint16{
		'e': 900, 't': 650, 'a': 600, 'o': 600, 'i': 550, 'n': 550, 's': 500, 'r': 500,
		'h': 350, 'l': 350, 'd': 300, 'c': 250, 'u': 250, 'm': 200, 'f': 180, 'p': 170,
		'g': 150, 'w': 140, 'y': 140, 'b': 120, 'v': 80, 'k': 60, 'x': 20, 'j': 10, 'q': 10, 'z': 10,
	}
	for c, n := range lowerFreq {
		f[c] = n
		f[c-'a'+'A'] = n/10 + 10
	}
	for c := '0'; c <= '9'; c++ {
		f[c] = 150
	}
	for _, p := range []struct {
		c byte
		n uint16
	}{{' ', 1500}, {'.', 150}, {'/', 100}, {',', 80}, {':', 80}, {'-', 80}, {'_', 50},
		{'=', 40}, {'"', 40}, {'\'', 30}, {'(', 30}, {')', 30}, {'[', 20}, {']', 20},
		{'\t', 50}, {'\r', 10}, {'{', 10}, {'}', 10}, {';', 10}, {'<', 10}, {'>', 10}} {
		f[p.c] = p.n
	}
	return f
}()

// anchorCost weighs an anchor byte: a pass of bytes.IndexByte over a chunk
// costs about as much as its hits would at a frequency of 1/400 (each
// hit costs a few nanoseconds, a pass a hundredth of one per byte).
func anchorCost(c byte) int { return 25 + int(byteFreq[c]) }

// anchor is a byte that the search looks for, and the literals it
// stands for there.
type anchor struct {
	c    byte
	uses []anchorUse
}

// anchorUse says that byte at of literal lit is the anchor's byte.
type anchorUse struct {
	lit int // index in program.lits
	at  int
}

// program is what a watcher searches a chunk with: the literals of all
// its watches and their anchors. It is rebuilt when its watches change.
type program struct {
	watches []*watch // the live ones, in the order they were added
	lits    []lit
	litW    []int // the index in watches of each literal's watch
	anchors []anchor
	// slow: a watch has no literal, so every line must be tested.
	slow bool
}

// compile makes the program of the watches that are not done.
func compile(ws []*watch) *program {
	p := &program{}
	for _, w := range ws {
		if w.done() {
			continue
		}
		wi := len(p.watches)
		p.watches = append(p.watches, w)
		if w.lits == nil {
			p.slow = true
		}
		for _, l := range w.lits {
			p.lits = append(p.lits, l)
			p.litW = append(p.litW, wi)
		}
	}
	if p.slow {
		return p
	}
	// Choose each literal's anchor greedily: the byte that adds least
	// cost, given the bytes already chosen (a folded letter needs both
	// of its cases).
	chosen := map[byte]int{} // byte -> index in p.anchors
	for li, l := range p.lits {
		bestAt, bestCost := 0, 1<<30
		for i := 0; i < len(l.s); i++ {
			cost := 0
			for _, c := range cases(l.s[i], l.fold) {
				if _, ok := chosen[c]; !ok {
					cost += anchorCost(c)
				}
			}
			if cost < bestCost {
				bestAt, bestCost = i, cost
			}
		}
		for _, c := range cases(l.s[bestAt], l.fold) {
			k, ok := chosen[c]
			if !ok {
				k = len(p.anchors)
				chosen[c] = k
				p.anchors = append(p.anchors, anchor{c: c})
			}
			p.anchors[k].uses = append(p.anchors[k].uses, anchorUse{lit: li, at: bestAt})
		}
	}
	return p
}

// cases returns the bytes that match c: c, and for a folded letter its
// other case.
func cases(c byte, fold bool) []byte {
	if fold && isLetter(c) {
		return []byte{lower(c), lower(c) - 'a' + 'A'}
	}
	return []byte{c}
}

// candidate is a place in a chunk where a literal of a watch was found.
type candidate struct {
	at  int // the literal's first byte, in the chunk
	lit int
}

// matcher splits a stream into lines (and pieces of long ones) and tests
// them against a program's watches. Its hit function gets each match;
// the text it gets is the matcher's or the chunk's, valid only during the
// call. A matcher is not safe for concurrent use.
type matcher struct {
	prog *program
	hit  func(w *watch, off int64, text []byte)

	// The line in progress: its bytes since carryAt, which is the start
	// of the line or of its current piece. cut reports that earlier
	// pieces of it were matched already; skip, that the line began
	// before the matcher could see it, so it is not matched at all.
	carry   []byte
	carryAt int64
	cut     bool
	skip    bool

	hits  int // matches handed to hit since the last feed began
	cands []candidate
	marks []bool // per watch of prog, while a piece is tested
}

// feed passes the stream's bytes p, which start at offset base, through
// the matcher. It stops early, at a line's start, once it has made
// about room matches or more, and returns how many bytes of p it took:
// feed the rest later. A room below 0 means no bound; room must not be 0.
func (m *matcher) feed(p []byte, base int64, room int) int {
	m.hits = 0
	i := 0
	if m.skip {
		k := bytes.IndexByte(p, '\n')
		if k < 0 {
			return len(p)
		}
		i, m.skip = k+1, false
		m.carry, m.carryAt, m.cut = m.carry[:0], base+int64(i), false
	}
	if len(m.carry) > 0 || m.cut {
		// Finish the line in progress.
		k := bytes.IndexByte(p[i:], '\n')
		if k < 0 {
			m.extend(p[i:])
			return len(p)
		}
		m.extend(p[i : i+k])
		m.endLine()
		i += k + 1
		m.carryAt = base + int64(i)
	}
	if i == len(p) {
		return i
	}
	// The complete lines.
	if k := bytes.LastIndexByte(p[i:], '\n'); k >= 0 {
		b := i + k + 1
		if e := m.lines(p, i, b, base, room); e < b {
			m.carryAt = base + int64(e)
			return e
		}
		i = b
		m.carryAt = base + int64(i)
	}
	// The start of a line that goes on in the next chunk.
	m.extend(p[i:])
	return len(p)
}

// extend adds bytes of the line in progress, matching each piece that is
// complete: a piece is cut once more of the line follows it.
func (m *matcher) extend(p []byte) {
	for len(p) > 0 {
		n := min(len(p), maxLine+1-len(m.carry))
		m.carry = append(m.carry, p[:n]...)
		p = p[n:]
		if len(m.carry) > maxLine {
			m.testAll(m.carry[:maxLine], m.carryAt)
			m.carry = append(m.carry[:0], m.carry[maxLine:]...)
			m.carryAt += maxLine
			m.cut = true
		}
	}
}

// endLine matches the line in progress as complete: its '\n' came, or
// the stream ended.
func (m *matcher) endLine() {
	text := m.carry
	if n := len(text); n > 0 && text[n-1] == '\r' {
		text = text[:n-1]
	}
	if !m.cut || len(text) > 0 {
		m.testAll(text, m.carryAt)
	}
	m.carry, m.cut = m.carry[:0], false
}

// flush ends the stream: its last line, if it had no '\n', is matched.
func (m *matcher) flush() {
	if !m.skip && (len(m.carry) > 0 || m.cut) {
		m.endLine()
	}
}

// lines matches the complete lines p[i:b] (i is a line's start, p[b-1]
// is '\n'), which start at offset base+i in the stream. It returns b, or
// the start of the line after the one at which the room ran out.
func (m *matcher) lines(p []byte, i, b int, base int64, room int) int {
	pr := m.prog
	if len(pr.watches) == 0 {
		return b
	}
	if pr.slow {
		for i < b {
			e := i + bytes.IndexByte(p[i:b], '\n')
			m.pieces(p[i:e], base+int64(i))
			i = e + 1
			if room >= 0 && m.hits >= room {
				return i
			}
		}
		return b
	}
	// Where each anchor's literal is really there.
	m.cands = m.cands[:0]
	for _, a := range pr.anchors {
		for pos := i; pos < b; {
			k := bytes.IndexByte(p[pos:b], a.c)
			if k < 0 {
				break
			}
			at := pos + k
			for _, u := range a.uses {
				s := at - u.at
				if s >= i && pr.lits[u.lit].at(p[s:b]) {
					m.cands = append(m.cands, candidate{at: s, lit: u.lit})
				}
			}
			pos = at + 1
		}
	}
	if len(m.cands) == 0 {
		return b
	}
	slices.SortFunc(m.cands, func(x, y candidate) int { return x.at - y.at })
	if cap(m.marks) < len(pr.watches) {
		m.marks = make([]bool, len(pr.watches))
	}
	marks := m.marks[:len(pr.watches)]
	for c := 0; c < len(m.cands); {
		at := m.cands[c].at
		ls := i + bytes.LastIndexByte(p[i:at], '\n') + 1
		le := at + bytes.IndexByte(p[at:b], '\n')
		for c < len(m.cands) && m.cands[c].at < le {
			// One piece of the line: the candidates in it test their
			// watches once each.
			ps := ls + (m.cands[c].at-ls)/maxLine*maxLine
			pe := min(ps+maxLine, le)
			for c < len(m.cands) && m.cands[c].at < pe {
				marks[pr.litW[m.cands[c].lit]] = true
				c++
			}
			text, last := p[ps:pe], pe == le
			if last && len(text) > 0 && text[len(text)-1] == '\r' {
				text = text[:len(text)-1]
			}
			if !last || ps == ls || len(text) > 0 {
				for wi, w := range pr.watches {
					if marks[wi] {
						marks[wi] = false
						m.test(w, text, base+int64(ps))
					}
				}
			}
			clear(marks)
		}
		if room >= 0 && m.hits >= room {
			return le + 1
		}
	}
	return b
}

// pieces matches one complete line (without its '\n'), which starts at
// off, in pieces of maxLine bytes.
func (m *matcher) pieces(line []byte, off int64) {
	if n := len(line); n > 0 && line[n-1] == '\r' {
		line = line[:n-1]
	}
	if len(line) <= maxLine {
		m.testAll(line, off)
		return
	}
	for ps := 0; ps < len(line); ps += maxLine {
		m.testAll(line[ps:min(ps+maxLine, len(line))], off+int64(ps))
	}
}

// testAll tests a line or piece against every watch whose literals it
// holds.
func (m *matcher) testAll(text []byte, off int64) {
	for _, w := range m.prog.watches {
		if w.lits != nil && !anyIn(w.lits, text) {
			continue
		}
		m.test(w, text, off)
	}
}

func anyIn(ls []lit, text []byte) bool {
	for _, l := range ls {
		if l.in(text) {
			return true
		}
	}
	return false
}

// test runs one watch's regexp on a line or piece.
func (m *matcher) test(w *watch, text []byte, off int64) {
	if w.done() || off < w.from || off <= w.last || !w.re.Match(text) {
		return
	}
	w.last = off
	if !w.every {
		w.fired = true
	}
	m.hits++
	m.hit(w, off, text)
}
