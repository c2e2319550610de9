package bgjob

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// The matcher against a naive reference: every line cut as Watch's doc
// says, every pattern run on every line, for streams fed in random
// chunks (and stopped early at random rooms).

type refMatch struct {
	watch int
	off   int64
	text  string
}

// refLines returns the lines and pieces of a whole stream as Watch's doc
// defines them, with their offsets.
func refLines(stream []byte) (texts []string, offs []int64) {
	for start := 0; start < len(stream); {
		end := bytes.IndexByte(stream[start:], '\n')
		next := 0
		if end < 0 {
			end, next = len(stream), len(stream)
		} else {
			end, next = start+end, start+end+1
		}
		raw := stream[start:end]
		if len(raw) <= maxLine {
			texts = append(texts, string(bytes.TrimSuffix(raw, []byte("\r"))))
			offs = append(offs, int64(start))
		} else {
			for ps := 0; ps < len(raw); ps += maxLine {
				piece := raw[ps:min(ps+maxLine, len(raw))]
				if ps+maxLine >= len(raw) {
					piece = bytes.TrimSuffix(piece, []byte("\r"))
					if len(piece) == 0 {
						continue
					}
				}
				texts = append(texts, string(piece))
				offs = append(offs, int64(start+ps))
			}
		}
		start = next
	}
	return texts, offs
}

func refMatches(stream []byte, res []*regexp.Regexp, every []bool) []refMatch {
	texts, offs := refLines(stream)
	var out []refMatch
	for i, t := range texts {
		for w, re := range res {
			if !re.MatchString(t) {
				continue
			}
			if !every[w] && slices.ContainsFunc(out, func(m refMatch) bool { return m.watch == w }) {
				continue
			}
			out = append(out, refMatch{w, offs[i], t})
		}
	}
	return out
}

// runMatcher feeds stream in chunks of the sizes rng picks.
func runMatcher(stream []byte, res []*regexp.Regexp, every []bool, rng *rand.Rand) []refMatch {
	var ws []*watch
	idx := map[*watch]int{}
	for i, re := range res {
		w := &watch{re: re, every: every[i], last: -1, lits: literals(re)}
		ws = append(ws, w)
		idx[w] = i
	}
	var out []refMatch
	m := matcher{prog: compile(ws)}
	m.hit = func(w *watch, off int64, text []byte) { out = append(out, refMatch{idx[w], off, string(text)}) }
	for off := 0; off < len(stream); {
		n := min(len(stream)-off, 1+rng.IntN(3*maxLine))
		if rng.IntN(4) == 0 {
			n = min(len(stream)-off, 1+rng.IntN(8))
		}
		room := -1
		if rng.IntN(3) == 0 {
			room = 1 + rng.IntN(3)
		}
		k := m.feed(stream[off:off+n], int64(off), room)
		if k == 0 && n > 0 {
			panic("feed took nothing")
		}
		off += k
	}
	m.flush()
	slices.SortStableFunc(out, func(a, b refMatch) int {
		if a.off != b.off {
			return int(a.off - b.off)
		}
		return a.watch - b.watch
	})
	return out
}

var testPatterns = []string{
	`(?i)error|listening on|ready in`,
	`(?i)\bwarn(ing)?\b`,
	`panic:|FAIL|Traceback \(most recent call last\)`,
	`(?i)compiled successfully|webpack \d+\.\d+`,
	`^$`,
	`^\d+ms$`,
	`(?i)start`,
	`[xyz]{3}`,
	`done\.$`,
	`a.b`,
	`(?i)kelvin`,
	`\x00`,
	`[^\x00-\x7f]`,
	`^ready$`,
	`x{100}y`,
}

var testWords = []string{"error", "ERROR:", "ready in 12ms", "listening on :8080", "ſtart", "START", "Kelvin", "\u212Aelvin",
	"warn", "warning!", "WARN", "panic: boom", "FAIL", "Traceback (most recent call last):", "compiled successfully",
	"webpack 5.1.2", "done.", "42ms", "", "ready", "xyz", "zzz", "a\x00b", "\xff\xfe", "é", " ", "\t", "\r", "aqb"}

func randomStream(rng *rand.Rand, n int) []byte {
	var b []byte
	for len(b) < n {
		switch rng.IntN(12) {
		case 0:
			b = append(b, strings.Repeat("x", rng.IntN(3*maxLine))...)
		case 1:
			for range rng.IntN(64) {
				b = append(b, byte(rng.IntN(256)))
			}
		case 2:
			b = append(b, '\r', '\n')
		default:
			b = append(b, testWords[rng.IntN(len(testWords))]...)
		}
		if rng.IntN(3) == 0 {
			b = append(b, '\n')
		} else if rng.IntN(3) == 0 {
			b = append(b, ' ')
		}
	}
	return b
}

func TestMatcherAgainstReference(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	for round := range 80 {
		var res []*regexp.Regexp
		var every []bool
		for range 1 + rng.IntN(5) {
			res = append(res, regexp.MustCompile(testPatterns[rng.IntN(len(testPatterns))]))
			every = append(every, rng.IntN(3) > 0)
		}
		stream := randomStream(rng, rng.IntN(40_000))
		want := refMatches(stream, res, every)
		got := runMatcher(stream, res, every, rng)
		if !slices.Equal(got, want) {
			t.Fatalf("round %d, patterns %v every %v:\ngot  %d matches %.600v\nwant %d matches %.600v", round, res, every, len(got), got, len(want), want)
		}
	}
}

// Pieces: a line exactly at the bound, one byte over, with "\r" at the
// cut, and a literal straddling two pieces (missed, as documented).
func TestMatcherPieces(t *testing.T) {
	re := []*regexp.Regexp{regexp.MustCompile(`^`), regexp.MustCompile(`ab`)}
	every := []bool{true, true}
	for _, tc := range []struct {
		name   string
		stream string
	}{
		{"exact", strings.Repeat("x", maxLine) + "\n"},
		{"exact-crlf", strings.Repeat("x", maxLine) + "\r\n"},
		{"over-by-cr", strings.Repeat("x", maxLine-1) + "y\r\n"},
		{"two-pieces", strings.Repeat("x", maxLine) + "yy\n"},
		{"straddle", strings.Repeat("x", maxLine-1) + "ab\n"},
		{"no-newline", strings.Repeat("x", 2*maxLine+3)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			for seed := range 20 {
				rng := rand.New(rand.NewPCG(uint64(seed), 9))
				want := refMatches([]byte(tc.stream), re, every)
				got := runMatcher([]byte(tc.stream), re, every, rng)
				if !slices.Equal(got, want) {
					t.Fatalf("seed %d: got %v; want %v", seed, summarize(got), summarize(want))
				}
			}
		})
	}
}

func summarize(ms []refMatch) string {
	var b strings.Builder
	for _, m := range ms {
		fmt.Fprintf(&b, "[w%d @%d %d bytes] ", m.watch, m.off, len(m.text))
	}
	return b.String()
}

// The literals never miss: a line that holds none of a pattern's
// literals does not match it.
func FuzzLiterals(f *testing.F) {
	for _, p := range testPatterns {
		for _, w := range testWords {
			f.Add(p, w)
		}
	}
	f.Fuzz(func(t *testing.T, pattern, line string) {
		re, err := regexp.Compile(pattern)
		if err != nil {
			return
		}
		ls := literals(re)
		if ls == nil || !re.MatchString(line) {
			return
		}
		if !anyIn(ls, []byte(line)) {
			t.Fatalf("%q matches %q, which holds none of its literals %v", pattern, line, ls)
		}
	})
}

func TestLiterals(t *testing.T) {
	for _, tc := range []struct {
		pattern string
		want    []lit // nil: none
	}{
		{`(?i)error|listening on|ready in`, []lit{{"error", true}, {"tening on", true}, {"ready in", true}}},
		{`panic:|FAIL`, []lit{{"panic:", false}, {"FAIL", false}}},
		{`^\d+ms$`, []lit{{"ms", false}}},
		{`.*`, nil},
		{`a?`, nil},
		{`(?i)k`, nil},
		{`[ab]c`, []lit{{"c", false}}},
		{`[ab]`, []lit{{"a", false}, {"b", false}}},
		{`[^a]`, nil},
		{`webpack \d+\.\d+`, []lit{{"webpack ", false}}},
	} {
		got := literals(regexp.MustCompile(tc.pattern))
		if !slices.Equal(got, tc.want) {
			t.Errorf("literals(%q) = %v; want %v", tc.pattern, got, tc.want)
		}
	}
}

// The capture bench's four watches over its 64-byte lines, in the
// supervisor's 256 KiB chunks: the cost of matching per byte.
func BenchmarkMatcherCapture(b *testing.B) {
	var ws []*watch
	for _, p := range []string{`(?i)error|listening on|ready in`, `(?i)\bwarn(ing)?\b`,
		`panic:|FAIL|Traceback \(most recent call last\)`, `(?i)compiled successfully|webpack \d+\.\d+\.\d+`} {
		re := regexp.MustCompile(p)
		ws = append(ws, &watch{re: re, every: true, last: -1, lits: literals(re)})
	}
	m := matcher{prog: compile(ws), hit: func(*watch, int64, []byte) { b.Fatal("match") }}
	b.Logf("%d anchors", len(m.prog.anchors))
	chunk := bytes.Repeat([]byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\n"), 4096)
	chunk = append(chunk, "0123456789"...) // chunks do not end at a line's end
	b.SetBytes(int64(len(chunk)))
	var off int64
	for range b.N {
		m.feed(chunk, off, maxBacklog)
		off += int64(len(chunk))
	}
}
