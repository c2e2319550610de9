//go:build unix

package bgjob

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// Snapshot.Command of an Args job is those args quoted so that /bin/sh
// gives them back as they were, and words that need no quotes have none.
func TestQuoteArgs(t *testing.T) {
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"plain-words-stay-bare", []string{"go", "test", "-run=X", "./...", "a@b:c,d%e+f"}, "go test -run=X ./... a@b:c,d%e+f"},
		{"blanks-and-metacharacters", []string{"p", "a b", "a\tb", "a;b", "a|b", "a&b", "a>b", "(a)", "#a", "a*"}, `p 'a b' 'a	b' 'a;b' 'a|b' 'a&b' 'a>b' '(a)' '#a' 'a*'`},
		{"expansions", []string{"p", "$x", "`x`", "~", "!x", "{a,b}"}, "p '$x' '`x`' '~' '!x' '{a,b}'"},
		{"quotes", []string{"p", "it's", `"x"`, `\`}, `p 'it'\''s' '"x"' '\'`},
		{"empty-and-newline", []string{"p", "", "a\nb"}, "p '' 'a\nb'"},
		{"non-ascii", []string{"p", "héllo", "\xff"}, "p 'héllo' '\xff'"},
		{"program-that-looks-like-an-assignment", []string{"a=b", "x=y"}, "'a=b' x=y"},
		{"program-that-is-a-reserved-word", []string{"if", "then"}, "'if' then"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := quoteArgs(tc.args)
			if got != tc.want {
				t.Errorf("quoteArgs(%q) = %s; want %s", tc.args, got, tc.want)
			}
			// The shell splits it back into the same words.
			script := "set -- " + got + `; for a in "$@"; do printf '%s\0' "$a"; done`
			out, err := exec.Command("/bin/sh", "-c", script).Output()
			if err != nil {
				t.Fatalf("sh -c %q: %v", script, err)
			}
			back := strings.Split(string(out), "\x00")
			back = back[:len(back)-1]
			if !slices.Equal(back, tc.args) {
				t.Errorf("sh split %s into %q; want %q", got, back, tc.args)
			}
		})
	}
}
