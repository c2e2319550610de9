//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"regexp"
	"slices"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bgjob/bgjob"
)

// TestStress's watches (issue #17). A third of the specs, those that
// print at most 80 KB, have two watches: "all" fires on every line (the
// job's word, whole, the last line too when the job's end cut off only
// its newline), "first" once, on the first two bytes. Their output
// is known byte for byte, so the matches of each run follow from the
// bytes it printed (its JobFinished event): every one must reach OnMatch
// exactly once, and Matches must return none that OnMatch did not get,
// none twice. Watch adds an "all"-like watch to running jobs of those
// specs, whose matches must be every line from some line to the end;
// WaitFor looks for a line of a job's word from a random offset. Specs
// with watches are always launched Unique, so that an ID names one run.

// stressWatchMaxN bounds the output of a spec with watches.
const stressWatchMaxN = 80 << 10

// stressWatches gives some specs of the pool their watches.
func stressWatches(pool []*stressSpec) {
	for i, ss := range pool {
		if i%3 != 0 || ss.n > stressWatchMaxN || ss.kind >= kindBadShell {
			continue
		}
		ss.spec.Watches = []bgjob.Watch{
			{Name: "all", Pattern: ss.lineRe(), Every: true},
			{Name: "first", Pattern: regexp.MustCompile(regexp.QuoteMeta(ss.word[:2]))},
		}
	}
}

// lineRe matches a whole line of the spec's output.
func (ss *stressSpec) lineRe() *regexp.Regexp {
	return regexp.MustCompile("^" + regexp.QuoteMeta(ss.word) + "$")
}

// stressWatchLog records the matches and what the operations did.
type stressWatchLog struct {
	mu      sync.Mutex
	matched map[string]int // by OnMatch, per matchKey
	byID    map[bgjob.ID][]bgjob.Match
	drained map[string]int // by Matches
	dropped int64          // Match.Dropped, summed
	added   map[bgjob.ID][]string

	waitFors, waitForHits, waitForEnded, waitForOut atomic.Int64
	watches, watchEnded, drains, addedSeq           atomic.Int64
}

func (l *stressWatchLog) init() {
	l.matched, l.byID, l.drained, l.added = map[string]int{}, map[bgjob.ID][]bgjob.Match{}, map[string]int{}, map[bgjob.ID][]string{}
}

func (st *stress) onMatch(m bgjob.Match) {
	l := &st.wl
	l.mu.Lock()
	defer l.mu.Unlock()
	l.matched[matchKeyOf(m)]++
	l.byID[m.ID] = append(l.byID[m.ID], m)
}

func matchKeyOf(m bgjob.Match) string { return fmt.Sprintf("%s/%s/%d", m.ID, m.Watch, m.Offset) }

func (st *stress) drainMatches(r *bgjob.Registry, session string) {
	ms := r.Matches(session)
	l := &st.wl
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, m := range ms {
		if m.Session != session {
			st.fail("Matches(%q) gave one of session %q", session, m.Session)
		}
		l.drained[matchKeyOf(m)]++
		l.dropped += m.Dropped
	}
}

// watchOp runs one of the watch operations, chosen by p (0 to 5).
func (st *stress) watchOp(rng *rand.Rand, p int) {
	switch {
	case p < 3:
		st.waitFor(rng)
	case p < 4:
		st.addWatch(rng)
	default:
		st.wl.drains.Add(1)
		st.drainMatches(st.main.r, stressSessions[rng.IntN(len(stressSessions))])
	}
}

// waitFor waits a while for a line of a known job from a random offset;
// a match must be a whole line of the job's word at or after it.
func (st *stress) waitFor(rng *rand.Rand) {
	id, ss, reg, ok := st.randomID(rng)
	if !ok {
		return
	}
	st.wl.waitFors.Add(1)
	from := rng.Int64N(ss.n + 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(300))*time.Millisecond)
	m, err := reg.r.WaitFor(ctx, id, ss.lineRe(), from)
	cancel()
	var ended *bgjob.EndedError
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		st.wl.waitForOut.Add(1)
	case errors.As(err, &ended):
		st.wl.waitForEnded.Add(1)
		if !ended.Snapshot.State.Done() || ended.Snapshot.ID != id {
			st.fail("WaitFor(%s): EndedError with snapshot %s %v", id, ended.Snapshot.ID, ended.Snapshot.State)
		}
	case err != nil:
		st.notFound("WaitFor", err)
	default:
		st.wl.waitForHits.Add(1)
		// The stream's last line matches without its '\n' too.
		l := int64(len(ss.word) + 1)
		if m.ID != id || m.Watch != "" || m.Offset < from || m.Offset%l != 0 || m.Offset+l-1 > ss.n || m.Line != ss.word || m.Withheld {
			st.fail("WaitFor(%s, %d) = %+v; want a whole line of %q at or after %d", id, from, m, ss.word, from)
		}
	}
}

// addWatch adds a watch to a known job of a spec with watches.
func (st *stress) addWatch(rng *rand.Rand) {
	id, ss, reg, ok := st.randomID(rng)
	if !ok || len(ss.spec.Watches) == 0 {
		return
	}
	st.wl.watches.Add(1)
	name := fmt.Sprintf("added-%d", st.wl.addedSeq.Add(1))
	err := reg.r.Watch(id, bgjob.Watch{Name: name, Pattern: ss.lineRe(), Every: true})
	switch {
	case errors.Is(err, bgjob.ErrJobEnded):
		st.wl.watchEnded.Add(1)
	case err != nil:
		st.notFound("Watch", err)
	default:
		st.wl.mu.Lock()
		st.wl.added[id] = append(st.wl.added[id], name)
		st.wl.mu.Unlock()
	}
}

// verifyWatches checks, once the registries are closed, every run's
// matches against the bytes it printed.
func (st *stress) verifyWatches() {
	// Every registry's runs: a job with watches may run on any (the
	// queue's too), and each registry's IDs are its own.
	bytes := map[bgjob.ID][]int64{}
	for _, reg := range []*stressReg{st.main, st.bad, st.queue} {
		for _, s := range stressSessions {
			st.drainMatches(reg.r, s)
		}
		reg.rec.mu.Lock()
		for _, e := range reg.rec.finished {
			bytes[e.ID] = append(bytes[e.ID], e.Bytes)
		}
		reg.rec.mu.Unlock()
	}
	l := &st.wl
	l.mu.Lock()
	defer l.mu.Unlock()
	var runs, matches, addedMatches int
	for id, ms := range l.byID {
		ss := st.spec(id)
		if ss == nil || len(ss.spec.Watches) == 0 {
			st.fail("match of job %s, which has no watches: %+v", id, ms[0])
			continue
		}
		if len(bytes[id]) != 1 {
			st.fail("job %s with watches ran %d times; want once (launched Unique)", id, len(bytes[id]))
			continue
		}
	}
	for id, bs := range bytes {
		ss := st.spec(id)
		if ss == nil || len(ss.spec.Watches) == 0 || len(bs) != 1 {
			continue
		}
		runs++
		// Every whole line matches "all", the last one too if it is the
		// whole word without its newline (the job was cut there).
		total, lineLen := bs[0], int64(len(ss.word)+1)
		var want []string
		lastLine := int64(-1)
		for off := int64(0); off+lineLen-1 <= total; off += lineLen {
			want = append(want, fmt.Sprintf("%s/all/%d", id, off))
			lastLine = off
		}
		if total >= 2 {
			want = append(want, fmt.Sprintf("%s/first/0", id))
		}
		added := map[string][]int64{}
		var got []string
		for _, m := range l.byID[id] {
			if m.Line != ss.word && !(m.Watch == "first" && len(m.Line) >= 2 && m.Line[:2] == ss.word[:2]) {
				st.fail("%s: match %+v of a line that is not the job's", id, m)
			}
			if m.Session != ss.spec.Session {
				st.fail("%s: match of session %q; want %q", id, m.Session, ss.spec.Session)
			}
			if slices.Contains(l.added[id], m.Watch) {
				added[m.Watch] = append(added[m.Watch], m.Offset)
				addedMatches++
				continue
			}
			got = append(got, matchKeyOf(m))
		}
		sort.Strings(got)
		sort.Strings(want)
		if !slices.Equal(got, want) {
			st.fail("%s (%s, %d of %d bytes): %d matches to OnMatch; want %d (one per line, and the first): first differences %v",
				id, kindNames[ss.kind], total, ss.n, len(got), len(want), matchDiff(got, want))
		}
		matches += len(got)
		// An added watch: every line from the one in progress when it
		// was added to the end, in order, each once.
		for name, offs := range added {
			for i, off := range offs {
				if off%lineLen != 0 || (i > 0 && off != offs[i-1]+lineLen) {
					st.fail("%s: watch %s matched at %v; want consecutive lines", id, name, offs)
					break
				}
			}
			if last := offs[len(offs)-1]; last != lastLine {
				st.fail("%s: watch %s's last match at %d; want the last line, at %d", id, name, last, lastLine)
			}
		}
	}
	for k, n := range l.matched {
		if n != 1 {
			st.fail("match %s went to OnMatch %d times; want once", k, n)
		}
	}
	var drained int
	for k, n := range l.drained {
		drained += n
		if n != 1 || l.matched[k] != 1 {
			st.fail("match %s returned by Matches %d times, to OnMatch %d times; want once each", k, n, l.matched[k])
		}
	}
	if int64(drained)+l.dropped > int64(len(l.matched)) {
		st.fail("%d matches drained and %d counted as dropped; more than the %d that OnMatch got", drained, l.dropped, len(l.matched))
	}
	st.t.Logf("watches: %d runs with watches, %d matches checked (%d of added watches), %d drained, %d dropped from full queues; %d WaitFor (%d matched, %d ended, %d timed out), %d Watch (%d on ended jobs), %d drains",
		runs, matches, addedMatches, drained, l.dropped, l.waitFors.Load(), l.waitForHits.Load(), l.waitForEnded.Load(), l.waitForOut.Load(),
		l.watches.Load(), l.watchEnded.Load(), l.drains.Load())
}

func matchDiff(got, want []string) []string {
	var d []string
	for _, k := range got {
		if !slices.Contains(want, k) {
			d = append(d, "+"+k)
		}
	}
	for _, k := range want {
		if !slices.Contains(got, k) {
			d = append(d, "-"+k)
		}
	}
	return d[:min(len(d), 6)]
}
