package bgjob_test

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/bgjob/bgjob"
)

// The job specs of TestStressDurable and the check of their output.

const (
	dHead = 256 << 10 // HeadBytes: every small job's output fits in it
	dTail = 128 << 10 // TailBytes
	// dMaxOut is MaxOutputBytes, as low as allowed, so that floods punch
	// holes in their files.
	dMaxOut = dHead + dTail + 1<<20
)

var dSessions = []string{"", "alpha", "beta"}

// dConfig is the Config of every registry on the state directory, the
// test's and the crash hosts': replay rebuilds a job's text from its file
// with these bounds, which must be those the file's holes were punched
// for.
func dConfig(dir, state, mark string) bgjob.Config {
	return bgjob.Config{
		Dir:            dir,
		Env:            append(os.Environ(), mark),
		StateDir:       state,
		MaxRunning:     64,
		KillGrace:      300 * time.Millisecond,
		DefaultTimeout: time.Minute,
		HeadBytes:      dHead,
		TailBytes:      dTail,
		MaxOutputBytes: dMaxOut,
		Retention:      bgjob.Retention{MaxJobs: 150, MaxBytes: 48 << 20, TTL: 10 * time.Minute},
	}
}

type dKind int

const (
	dkSmall  dKind = iota // prints up to 70 kB, exits with code
	dkByName              // writes to /dev/stdout and /dev/stderr by name, exits with code
	dkTee                 // ... | tee /dev/stderr >/dev/null, exits with code
	dkSlow                // prints, sleeps, prints by name: spans restarts
	dkFlood               // sleeps a little, then writes megabytes
	dkLong                // prints, sleeps past its wall timeout (or is cancelled)
	dNumKinds
)

var dKindNames = [dNumKinds]string{"small", "by-name", "tee", "slow", "flood", "long"}

var dKindWeights = [dNumKinds]int{25, 12, 12, 20, 13, 18}

// dSeg is a piece of a job's output: the bytes of `yes word | head -c n`,
// or a literal line.
type dSeg struct {
	word string
	lit  string
	n    int64
}

func dYes(word string, n int64) dSeg { return dSeg{word: word, n: n} }
func dLine(s string) dSeg            { return dSeg{lit: s + "\n", n: int64(len(s) + 1)} }

// dSpec is a job spec whose output, byte for byte, and exit code are
// known. Commands are distinct: a command names its spec.
type dSpec struct {
	idx  int
	kind dKind
	spec bgjob.Spec
	segs []dSeg
	n    int64 // the output's length
	code int   // the exit code when it exits on its own
}

// expect returns the bytes [from, to) of the job's output.
func (ss *dSpec) expect(from, to int64) string {
	var b strings.Builder
	var base int64
	for _, sg := range ss.segs {
		lo, hi := max(from, base)-base, min(to, base+sg.n)-base
		if lo < hi {
			if sg.word == "" {
				b.WriteString(sg.lit[lo:hi])
			} else {
				line := sg.word + "\n"
				l := int64(len(line))
				b.WriteString(strings.Repeat(line, int((hi-lo)/l)+2)[lo%l : lo%l+hi-lo])
			}
		}
		base += sg.n
	}
	return b.String()
}

// dPool makes the specs: distinct, drawn from rng.
func dPool(rng *rand.Rand) []*dSpec {
	small := []int64{0, 1, 17, 4095, 4096, 20_000, 70_000}
	big := []int64{1<<20 + 3, 2<<20 + 5, 4 << 20}
	codes := []int{0, 0, 0, 1, 2, 42, 255}
	total := 0
	for _, w := range dKindWeights {
		total += w
	}
	var pool []*dSpec
	for len(pool) < 120 {
		var kind dKind
		for p, k := rng.IntN(total), 0; ; k++ {
			if p -= dKindWeights[k]; p < 0 {
				kind = dKind(k)
				break
			}
		}
		i := len(pool)
		w := fmt.Sprintf("d%d%s", i, strings.Repeat("y", rng.IntN(24)))
		ss := &dSpec{idx: i, kind: kind, code: codes[rng.IntN(len(codes))]}
		n := small[rng.IntN(len(small))]
		ds := func() int { return 5 + rng.IntN(90) } // hundredths of a second
		var cmd string
		switch kind {
		case dkSmall:
			cmd = fmt.Sprintf("yes %s | head -c %d", w, n)
			ss.segs = []dSeg{dYes(w, n)}
		case dkByName:
			if rng.IntN(2) == 0 {
				cmd = fmt.Sprintf("echo %s; echo %s.b >/dev/stderr; echo %s.c", w, w, w)
				ss.segs = []dSeg{dLine(w), dLine(w + ".b"), dLine(w + ".c")}
			} else {
				cmd = fmt.Sprintf("echo %s; yes %s | head -c %d >/dev/stdout; echo %s.c >/dev/stderr", w, w, n, w)
				ss.segs = []dSeg{dLine(w), dYes(w, n), dLine(w + ".c")}
			}
		case dkTee:
			cmd = fmt.Sprintf("echo %s; echo %s.b | tee /dev/stderr >/dev/null; yes %s | head -c %d | tee /dev/stderr >/dev/null; echo %s.c", w, w, w, n, w)
			ss.segs = []dSeg{dLine(w), dLine(w + ".b"), dYes(w, n), dLine(w + ".c")}
		case dkSlow:
			m := small[rng.IntN(len(small))]
			cmd = fmt.Sprintf("yes %s | head -c %d; sleep 0.%02d; echo %s.b >/dev/stderr; sleep 0.%02d; yes %s | head -c %d >/dev/stdout; echo %s.c | tee /dev/stderr >/dev/null",
				w, n, ds(), w, ds(), w, m, w)
			ss.segs = []dSeg{dYes(w, n), dLine(w + ".b"), dYes(w, m), dLine(w + ".c")}
		case dkFlood:
			b := big[rng.IntN(len(big))]
			if rng.IntN(3) == 0 {
				cmd = fmt.Sprintf("sleep 0.%02d; yes %s | head -c %d | tee /dev/stderr >/dev/null; echo %s.end", ds(), w, b, w)
			} else {
				cmd = fmt.Sprintf("sleep 0.%02d; yes %s | head -c %d; echo %s.end >/dev/stderr", ds(), w, b, w)
			}
			ss.segs = []dSeg{dYes(w, b), dLine(w + ".end")}
		case dkLong:
			cmd = fmt.Sprintf("echo %s; sleep 300", w)
			ss.segs = []dSeg{dLine(w)}
			ss.spec.Timeout = time.Duration(1000+rng.IntN(3000)) * time.Millisecond
			ss.code = 124
		}
		if kind != dkLong {
			cmd += fmt.Sprintf("; exit %d", ss.code)
		}
		ss.spec.Command = cmd
		ss.spec.Session = dSessions[rng.IntN(len(dSessions))]
		for _, sg := range ss.segs {
			ss.n += sg.n
		}
		pool = append(pool, ss)
	}
	return pool
}

// dCheckOutput returns what is wrong with o, the output of a run of ss
// (the whole of it if complete), or "". It counts the bytes it compared.
func dCheckOutput(ss *dSpec, o bgjob.Output, complete bool, checked *int64) string {
	switch {
	case o.Withheld:
		return "output withheld"
	case o.Total > ss.n || (complete && o.Total != ss.n):
		return fmt.Sprintf("total %d; want %d (complete %v)", o.Total, ss.n, complete)
	case o.Omitted == 0:
		if want := ss.expect(0, o.Total); o.Text != want {
			return fmt.Sprintf("text of %d bytes (total %d) differs from the job's output at byte %d", len(o.Text), o.Total, firstDiff(o.Text, want))
		}
		*checked += int64(len(o.Text))
		return ""
	}
	i := strings.Index(o.Text, "[... ")
	j := strings.Index(o.Text, " bytes omitted ...]\n")
	if i < 0 || j < i {
		return fmt.Sprintf("omitted %d bytes, but no omission line in the text", o.Omitted)
	}
	head, tail := o.Text[:i], o.Text[j+len(" bytes omitted ...]\n"):]
	n, err := strconv.ParseInt(o.Text[i+len("[... "):j], 10, 64)
	h, tl := int64(len(head)), int64(len(tail))
	switch {
	case err != nil || n != o.Omitted || h+tl+n != o.Total:
		return fmt.Sprintf("omission line %q, omitted %d, head %d + tail %d; total %d", o.Text[i:j], o.Omitted, h, tl, o.Total)
	case h > dHead || h < dHead-lineSlackT || tl > dTail || tl < dTail-lineSlackT:
		return fmt.Sprintf("head %d bytes, tail %d; want about %d and %d", h, tl, dHead, dTail)
	}
	if want := ss.expect(0, h); head != want {
		return fmt.Sprintf("head of %d bytes differs from the job's output at byte %d", h, firstDiff(head, want))
	}
	if want := ss.expect(o.Total-tl, o.Total); tail != want {
		return fmt.Sprintf("tail [%d, %d) differs from the job's output at byte %d", o.Total-tl, o.Total, o.Total-tl+int64(firstDiff(tail, want)))
	}
	*checked += h + tl
	return ""
}

// lineSlackT is how far the library may move the cut between head and
// tail to fall on a line boundary.
const lineSlackT = 4097

// firstDiff is in interactive_unix_test.go.
