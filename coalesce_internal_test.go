package bgjob

import (
	"fmt"
	"testing"
	"time"

	"github.com/zeebo/blake3"
)

// freshID is the ID a fresh keyed hasher gives a launch.
func freshID(key *[32]byte, spec *Spec, dir string, timeout time.Duration) ID {
	h, _ := blake3.NewKeyed(key[:])
	return hashID(h, spec, dir, timeout)
}

// The registry's pooled, reset hashers give the IDs a fresh keyed hasher
// gives.
func TestPooledIDMatchesFresh(t *testing.T) {
	r, err := New(Config{IDKey: []byte("0123456789abcdef0123")})
	if err != nil {
		t.Fatal(err)
	}
	specs := []Spec{{Command: "a"}, {Command: "b", Env: map[string]string{"K": "v"}}, {Command: "a", Session: "s"}}
	for round := range 3 {
		for _, s := range specs {
			got, want := r.jobID(&s, "/d", time.Minute), freshID(&r.key, &s, "/d", time.Minute)
			if got != want {
				t.Fatalf("round %d, %+v: pooled %s, fresh %s", round, s, got, want)
			}
		}
	}
}

// Spec.Args came after IDs had been handed out (and kept in durable
// records): the IDs of Command launches must not change, and no Args
// launch may share one with a Command launch or with another argv.
func TestArgsIDs(t *testing.T) {
	var key [32]byte
	copy(key[:], "bgjob golden key: 32 bytes long.")
	for _, tc := range []struct {
		spec Spec
		want ID
	}{
		// Computed before Spec.Args existed.
		{Spec{Command: "a b"}, "job_a52eb0551656a429"},
		{Spec{Command: "make test", Session: "s", Env: map[string]string{"K": "v"}, Stdin: "in", IdleTimeout: time.Second}, "job_70dd63dad90b88ea"},
	} {
		if got := freshID(&key, &tc.spec, "/d", time.Minute); got != tc.want {
			t.Errorf("%q: ID %s; want %s, as before Spec.Args", tc.spec.Command, got, tc.want)
		}
	}
	seen := map[ID]string{}
	for _, s := range []Spec{
		{Command: "a b"},
		{Args: []string{"a", "b"}},
		{Args: []string{"a b"}},
		{Args: []string{"ab"}},
		{Args: []string{"a", "b", ""}},
		{Args: []string{"a", ""}},
		{Args: []string{"a"}},
		{Args: []string{"b", "a"}},
	} {
		id := freshID(&key, &s, "/d", time.Minute)
		what := fmt.Sprintf("Command %q Args %q", s.Command, s.Args)
		if prev, ok := seen[id]; ok {
			t.Errorf("%s and %s share ID %s", what, prev, id)
		}
		seen[id] = what
	}
}
