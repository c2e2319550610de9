package bgjob

import (
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
