//go:build unix

package bgjob_test

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"sync"
	"time"

	"github.com/bgjob/bgjob"
)

// The job specs of TestStress, and what each run of them must end as.

// stressKind is what a job does; its expected end follows from it.
type stressKind int

const (
	kindExit          stressKind = iota // prints, exits with code
	kindSlow                            // sleeps a little, prints, exits with code
	kindSelfKill                        // prints, SIGKILLs its shell: 137
	kindSelfTerm                        // prints, SIGTERMs its shell: 143
	kindGrandchildren                   // leaves two sleeping children holding the pipe, exits with code
	kindStubbornChild                   // leaves a child that ignores SIGTERM, exits with code
	kindStdin                           // copies its stdin, exits with code
	kindEscape                          // starts a process that leaves its group or session, exits with code
	kindTimeout                         // prints, sleeps past a short wall timeout
	kindIdle                            // prints, falls silent past a short idle timeout
	kindIgnoreTerm                      // ignores SIGTERM, sleeps past a short timeout
	kindLong                            // prints, sleeps up to a few seconds: a target for Cancel
	kindBadShell                        // run by the registry whose shell is missing
	kindDirGone                         // its Dir is removed by the Guard before the spawn
	kindConversation                    // an interactive or TTY job written to (stress_input_unix_test.go); not in the pool
	numKinds
)

var kindNames = [numKinds]string{"exit", "slow", "self-kill", "self-term", "grandchildren",
	"stubborn-child", "stdin", "escape", "timeout", "idle", "ignore-term", "long", "bad-shell", "dir-gone", "conversation"}

// kindWeights sets how often each kind is picked (per mille of the pool).
var kindWeights = [numKinds]int{200, 80, 50, 40, 60, 30, 60, 80, 60, 50, 40, 120, 60, 0, 0}

// stressEscapes are the ways a kindEscape job's process leaves the job's
// process group or session; H is a sleeper marked with the run's token.
var stressEscapes = []string{
	"timeout 300 H &",
	"bash -c 'set -m; H & exit 0'",
	"setsid H &",
	"setsid -f H",
	"nohup setsid H >/dev/null 2>&1 &",
	"( setsid H & )",
}

// escapeToken is the placeholder of a kindEscape spec's command that each
// launch replaces with a token of its own (see stress.launchSpec).
const escapeToken = "ESCAPE_TOKEN"

// stressSpec is a job spec with its expected outcome. Its output is
// word+"\n" repeated and cut at n bytes, so every byte at every offset is
// known.
type stressSpec struct {
	kind stressKind
	spec bgjob.Spec
	word string
	n    int64
	code int // the exit code if it exits on its own
}

func (ss *stressSpec) byteAt(off int64) byte {
	if i := off % int64(len(ss.word)+1); i < int64(len(ss.word)) {
		return ss.word[i]
	}
	return '\n'
}

func (ss *stressSpec) pattern(n int64) string {
	line := ss.word + "\n"
	return strings.Repeat(line, int(n)/len(line)+1)[:n]
}

func (ss *stressSpec) exitsOnItsOwn() bool { return ss.kind <= kindEscape }
func (ss *stressSpec) canTimeOut() bool    { return ss.kind >= kindTimeout && ss.kind <= kindLong }
func (ss *stressSpec) failsToSpawn() bool  { return ss.kind >= kindBadShell }

// check returns what is wrong with how a run of ss ended, or "".
func (ss *stressSpec) check(state bgjob.State, code int, total int64) string {
	var want string
	switch {
	case ss.kind == kindConversation:
		// Exactly what was written (and echoed), or a part of it if
		// stopped.
		switch {
		case state == bgjob.Exited && (code != ss.code || total != ss.n):
			want = fmt.Sprintf("exit %d, %d bytes", ss.code, ss.n)
		case state == bgjob.Cancelled && (code != 130 || total > ss.n),
			state == bgjob.TimedOut && (code != 124 || total > ss.n):
			want = fmt.Sprintf("at most %d bytes", ss.n)
		case state != bgjob.Exited && state != bgjob.Cancelled && state != bgjob.TimedOut:
			want = "exited, cancelled or timed out"
		}
	case state == bgjob.Cancelled: // any job may be cancelled, even before its spawn
		if code != 130 || total > ss.n {
			want = fmt.Sprintf("exit 130, at most %d bytes", ss.n)
		}
	case state == bgjob.Exited && ss.exitsOnItsOwn():
		if code != ss.code || total != ss.n {
			want = fmt.Sprintf("exit %d, %d bytes", ss.code, ss.n)
		}
	case state == bgjob.TimedOut && ss.canTimeOut():
		if code != 124 || total > ss.n {
			want = fmt.Sprintf("exit 124, at most %d bytes", ss.n)
		}
	case state == bgjob.Failed && ss.failsToSpawn():
		if code != -1 || total != 0 {
			want = "exit -1, 0 bytes"
		}
	default:
		want = "a state this kind of job can end in"
	}
	if want == "" {
		return ""
	}
	return fmt.Sprintf("%s job %q: got %v exit %d, %d bytes; want %s", kindNames[ss.kind], ss.spec.Command, state, code, total, want)
}

// stressPool makes the specs the goroutines pick from: distinct, a few
// hundred, drawn from rng.
func stressPool(rng *rand.Rand) []*stressSpec {
	sizes := []int64{0, 1, 17, 4095, 4096, 20_000, 70_000, 80 << 10, 300_000}
	big := []int64{1 << 20, 2<<20 + 5, 3 << 20}
	codes := []int{0, 0, 0, 1, 2, 3, 42, 125, 255}
	var pool []*stressSpec
	seen := map[string]bool{}
	total := 0
	for _, w := range kindWeights {
		total += w
	}
	for len(pool) < 300 {
		var kind stressKind
		for p, k := rng.IntN(total), 0; ; k++ {
			if p -= kindWeights[k]; p < 0 {
				kind = stressKind(k)
				break
			}
		}
		ss := &stressSpec{kind: kind, code: codes[rng.IntN(len(codes))]}
		ss.word = fmt.Sprintf("w%d%s", len(pool), strings.Repeat("x", rng.IntN(40)))
		ss.n = sizes[rng.IntN(len(sizes))]
		if rng.IntN(20) == 0 {
			ss.n = big[rng.IntN(len(big))]
		}
		print := fmt.Sprintf("yes %s | head -c %d", ss.word, ss.n)
		ms := func(lo, hi int) time.Duration { return time.Duration(lo+rng.IntN(hi-lo)) * time.Millisecond }
		sp := &ss.spec
		switch kind {
		case kindExit, kindBadShell:
			sp.Command = fmt.Sprintf("%s; exit %d", print, ss.code)
		case kindSlow:
			sp.Command = fmt.Sprintf("sleep 0.%02d; %s; exit %d", 1+rng.IntN(20), print, ss.code)
		case kindSelfKill:
			sp.Command, ss.code = print+"; kill -KILL $$", 137
		case kindSelfTerm:
			sp.Command, ss.code = print+"; kill -TERM $$", 143
		case kindGrandchildren:
			sp.Command = fmt.Sprintf("sleep 300 & sleep 300 & %s; exit %d", print, ss.code)
		case kindStubbornChild:
			sp.Command = fmt.Sprintf("(trap '' TERM; sleep 300) & %s; exit %d", print, ss.code)
		case kindStdin:
			ss.n = min(ss.n, 300_000)
			sp.Command, sp.Stdin = fmt.Sprintf("cat; exit %d", ss.code), ss.pattern(ss.n)
		case kindEscape:
			esc := strings.ReplaceAll(stressEscapes[len(pool)%len(stressEscapes)], "H", helperCmd("sleep", "300000", escapeToken))
			sp.Command = fmt.Sprintf("%s; %s\nsleep 0.05; exit %d", print, esc, ss.code)
		case kindTimeout:
			sp.Command, sp.Timeout = print+"; sleep 300", ms(100, 400)
		case kindIdle:
			sp.Command, sp.IdleTimeout = print+"; sleep 300", ms(100, 300)
		case kindIgnoreTerm:
			sp.Command, sp.Timeout = "trap '' TERM; "+print+"; sleep 300", ms(100, 300)
		case kindLong:
			sp.Command, sp.Timeout = print+"; sleep 300", ms(1500, 4000)
		}
		sp.Session = stressSessions[rng.IntN(len(stressSessions))]
		if rng.IntN(4) == 0 {
			sp.Env = map[string]string{"STRESS_VAR": ss.word}
		}
		if kind == kindEscape {
			sp.Env = map[string]string{"BGJOB_TEST_HELPER": "1", "STRESS_VAR": ss.word}
		}
		key := fmt.Sprintf("%d|%q|%q|%v|%v|%q", kind, sp.Command, sp.Session, sp.Timeout, sp.IdleTimeout, sp.Env)
		if seen[key] {
			continue
		}
		seen[key] = true
		pool = append(pool, ss)
	}
	return pool
}

// stressRec records one registry's Telemetry events and OnComplete calls,
// and the completions drained from it.
type stressRec struct {
	mu        sync.Mutex
	started   map[bgjob.ID]int
	finished  []bgjob.Event
	completed map[compKey]int // by OnComplete
	drained   map[compKey]int // by Completions
}

// compKey names one run's completion: the ID and the end time.
type compKey struct {
	id    bgjob.ID
	ended int64
}

func newStressRec() *stressRec {
	return &stressRec{started: map[bgjob.ID]int{}, completed: map[compKey]int{}, drained: map[compKey]int{}}
}

func (r *stressRec) JobStarted(e bgjob.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.started[e.ID]++
}

func (r *stressRec) JobFinished(e bgjob.Event) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.finished = append(r.finished, e)
}

func (r *stressRec) onComplete(c bgjob.Completion) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.completed[compKey{c.ID, c.Ended.UnixNano()}]++
}

func (r *stressRec) drain(cs []bgjob.Completion) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, c := range cs {
		r.drained[compKey{c.ID, c.Ended.UnixNano()}]++
	}
}
