package bgjob_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
	"go.uber.org/goleak"
)

// TestStressDurable runs workers that, for BGJOB_STRESS_DURATION (15s by
// default, 3s with -short), mix the registry's methods over durable-mode
// jobs whose output and exit code are known byte for byte (small jobs,
// writers that open /dev/stdout and /dev/stderr by name or tee into
// /dev/stderr, slow jobs that span restarts, floods of megabytes started
// several at once, jobs that time out), while the registry is restarted
// over and over on the same StateDir:
//
//   - in process: Detach (sometimes while the workers' calls are under
//     way), then New, which adopts the running jobs whose keepers took
//     their output over and replays the rest; some of these News run with
//     RLIMIT_NOFILE tightened, and every one that fails must fail with an
//     error, leave the records as they were, and succeed later with more
//     descriptors;
//   - host crash: a child process (TestStressDurableHost) opens the state
//     directory, adopts the jobs, delivers what it owes, launches more and
//     is SIGKILLed while it launches; a few jobs are SIGKILLed while no
//     host runs; then the test's New adopts and replays.
//
// It checks every snapshot it sees (state, exit code, output byte for
// byte where the head and tail keep it, Output.Total), every Read, that
// each run's completion is delivered exactly once across every Registry
// and host (Completions and OnComplete, keyed by ID and end time), that
// no job is recorded "lost" (or "spawn aborted") unless the test killed
// it (or the crash interrupted its launch), and at the end that no
// goroutine, file descriptor, process of a job, keeper or zombie child is
// left.
//
//	BGJOB_STRESS_DURATION=10m go test -race -run '^TestStressDurable$' -timeout 40m -v .
func TestStressDurable(t *testing.T) {
	dur := 15 * time.Second
	if testing.Short() {
		dur = 3 * time.Second
	}
	if v := os.Getenv("BGJOB_STRESS_DURATION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil {
			t.Fatalf("BGJOB_STRESS_DURATION: %v", err)
		}
		dur = d
	}
	seed := uint64(time.Now().UnixNano())
	if v := os.Getenv("BGJOB_STRESS_SEED"); v != "" {
		seed, _ = strconv.ParseUint(v, 10, 64)
	}
	t.Logf("seed %d (set BGJOB_STRESS_SEED to repeat the pool and the restarts' kinds), duration %v", seed, dur)

	stressWarmUp(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fdsBefore := stressFDs()
	zombiesBefore := zombieChildren()

	ds := newDStress(t, seed)
	t.Cleanup(ds.killLeftovers)
	ds.run(dur)
	ds.verify()
	ds.leaks(fdsBefore, zombiesBefore)
}

type dStress struct {
	t                *testing.T
	seed             uint64
	rng              *rand.Rand // the restarter's
	pool             []*dSpec
	byCmd            map[string]*dSpec
	dir, state, mark string
	logs             dLog

	// regMu: the workers hold it for reading while they use reg, a
	// restart for writing while it swaps reg (a racing Detach comes
	// before it: Cancel may then meet a released job).
	regMu      sync.RWMutex
	reg        *bgjob.Registry
	gen        int // the test's registries so far
	restarting atomic.Bool
	closing    atomic.Bool
	broken     atomic.Bool // a restart failed: the workers stop

	mu        sync.Mutex
	want      map[int]*[2]int   // spec index: runs that owe a completion, at least and at most
	inflight  map[int]bool      // spec indexes whose launch a crash interrupted
	killed    map[bgjob.ID]bool // SIGKILLed while no host ran
	cancelReq map[bgjob.ID]bool
	pids      map[bgjob.ID]int
	list      []bgjob.ID
	listIdx   map[bgjob.ID]int
	onc       map[compKey]int
	drained   map[compKey]int
	compIdx   map[compKey]int
	compWhere map[compKey][]string
	early     map[compKey]bool // runs whose launch a Detach prevented
	pressure  [][2]time.Time   // windows in which RLIMIT_NOFILE was tight
	hosts     [][2]time.Time   // the crash hosts' lives

	failures atomic.Int64
	n        struct {
		launches, joins, floods, fgInline, fgDetached, tooMany, closedErrs, ctxErrs            atomic.Int64
		status, wait, reads, readPast, cancels, lists, drains, notFound, snaps, bytesChecked   atomic.Int64
		inProc, racing, pressured, failedNews, settled, crashes, hostLaunches, interrupted     atomic.Int64
		killed, adopted, hostDelivered, onComplete, lost, aborted, exited, cancelled, timedOut atomic.Int64
		stopLost, inUse, quarantined, cancelReleased                                           atomic.Int64
	}
	spare []int // descriptors a pressured New needed
}

func newDStress(t *testing.T, seed uint64) *dStress {
	ds := &dStress{
		t: t, seed: seed, rng: rand.New(rand.NewPCG(seed, 2)),
		pool: dPool(rand.New(rand.NewPCG(seed, 7))), byCmd: map[string]*dSpec{},
		dir: t.TempDir(), state: filepath.Join(t.TempDir(), "state"),
		mark: fmt.Sprintf("BGJOB_DSTRESS_MARK=%d-%d", os.Getpid(), seed),
		want: map[int]*[2]int{}, inflight: map[int]bool{}, killed: map[bgjob.ID]bool{}, cancelReq: map[bgjob.ID]bool{},
		pids: map[bgjob.ID]int{}, listIdx: map[bgjob.ID]int{},
		onc: map[compKey]int{}, drained: map[compKey]int{}, compIdx: map[compKey]int{}, compWhere: map[compKey][]string{},
		early: map[compKey]bool{},
	}
	for _, ss := range ds.pool {
		ds.byCmd[ss.spec.Command] = ss
	}
	r, err := bgjob.New(ds.config())
	if err != nil {
		t.Fatal(err)
	}
	ds.reg = r
	return ds
}

// config is the Config of the test's next registry.
func (ds *dStress) config() bgjob.Config {
	cfg := dConfig(ds.dir, ds.state, ds.mark)
	where := fmt.Sprintf("OnComplete of r%d", ds.gen+1)
	cfg.OnComplete = func(c bgjob.Completion) { ds.deliver(where, c, true) }
	cfg.Logger = slog.New(&ds.logs)
	return cfg
}

func (ds *dStress) fail(format string, args ...any) {
	ds.t.Helper()
	if ds.failures.Add(1) <= 40 {
		ds.t.Errorf(format, args...)
	}
}

// run runs the workers for dur while the restarter restarts the registry,
// each kind at least once; then it stops the workers.
func (ds *dStress) run(dur time.Duration) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	for i := range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(ds.seed, uint64(i)+100))
			for !stop.Load() {
				ds.regMu.RLock()
				if ds.broken.Load() {
					// A restart failed: ds.reg is detached, and a
					// Cancel on it would never return.
					ds.regMu.RUnlock()
					return
				}
				ds.op(rng, ds.reg)
				ds.regMu.RUnlock()
			}
		}()
	}
	end := time.Now().Add(dur)
	ok := true
	for round := 1; ok && (time.Now().Before(end) || ds.n.crashes.Load() == 0 || ds.n.pressured.Load() == 0); round++ {
		// The restarts' pace: the time the jobs get between them.
		select {
		case <-time.After(time.Duration(200+ds.rng.IntN(1000)) * time.Millisecond):
		case <-time.After(time.Until(end)):
		}
		ok = ds.restart(round, round%4 == 2, round%3 == 0)
	}
	stop.Store(true)
	wg.Wait()
	if !ok {
		ds.t.FailNow()
	}
}

// op is one call of a worker on r.
func (ds *dStress) op(rng *rand.Rand, r *bgjob.Registry) {
	ctx := context.Background()
	switch p := rng.IntN(100); {
	case p < 22:
		ss := ds.pool[rng.IntN(len(ds.pool))]
		ds.start(r, ss, rng.IntN(5) == 0)
	case p < 25: // a flood of several jobs at once
		for range 2 + rng.IntN(2) {
			ss := ds.pool[rng.IntN(len(ds.pool))]
			for ss.kind != dkFlood {
				ss = ds.pool[rng.IntN(len(ds.pool))]
			}
			ds.n.floods.Add(1)
			ds.start(r, ss, true)
		}
	case p < 31:
		ss := ds.pool[rng.IntN(len(ds.pool))]
		spec := ss.spec
		spec.Unique = true // a join would make the run pollable behind the caller's back
		fctx, cancel := context.WithTimeout(ctx, time.Second)
		res, err := r.RunForeground(fctx, spec, bgjob.Foreground{SoftCap: time.Duration(1+rng.IntN(400)) * time.Millisecond})
		cancel()
		if err != nil {
			ds.launchErr("RunForeground", err)
			return
		}
		ds.launched(ss, res.Snapshot, res.Detached)
		if res.Detached {
			ds.n.fgDetached.Add(1)
		} else {
			ds.n.fgInline.Add(1)
		}
		ds.checkSnap("RunForeground", r, res.Snapshot)
	case p < 45:
		if id, ok := ds.randomID(rng); ok {
			ds.n.status.Add(1)
			if s, err := r.Status(id); ds.found("Status", err) {
				ds.checkSnap("Status", r, s)
			}
		}
	case p < 55:
		if id, ok := ds.randomID(rng); ok {
			ds.n.wait.Add(1)
			wctx, cancel := context.WithTimeout(ctx, time.Duration(rng.IntN(300))*time.Millisecond)
			s, err := r.Wait(wctx, id)
			cancel()
			if errors.Is(err, context.DeadlineExceeded) || ds.found("Wait", err) {
				ds.checkSnap("Wait", r, s)
			}
		}
	case p < 63:
		if id, ok := ds.randomID(rng); ok {
			ds.read(rng, r, id)
		}
	case p < 67:
		if id, ok := ds.randomID(rng); ok {
			ds.mu.Lock()
			ds.cancelReq[id] = true
			ds.mu.Unlock()
			ds.n.cancels.Add(1)
			s, err := r.Cancel(id)
			if errors.Is(err, bgjob.ErrClosed) && ds.restarting.Load() {
				// Detach released the job: Cancel returns at once
				// with its running snapshot.
				ds.n.cancelReleased.Add(1)
				if s.State != bgjob.Running || s.ID != id {
					ds.fail("Cancel(%s) of a released job returned %v %s; want running", id, s.State, s.ID)
				}
				return
			}
			if ds.found("Cancel", err) {
				if !s.State.Done() && !ds.restarting.Load() {
					ds.fail("Cancel(%s) returned state %v", id, s.State)
				}
				ds.checkSnap("Cancel", r, s)
			}
		}
	case p < 77:
		ds.n.lists.Add(1)
		for _, s := range r.List(dSessions[rng.IntN(len(dSessions))]) {
			ds.checkSnap("List", r, s)
		}
	case p < 93:
		ds.n.drains.Add(1)
		ds.drain(r, dSessions[rng.IntN(len(dSessions))], fmt.Sprintf("Completions of r%d", ds.gen))
	default:
		if n := r.Running(); n < 0 || n > 64 {
			ds.fail("Running() = %d; want 0..64", n)
		}
	}
}

func (ds *dStress) start(r *bgjob.Registry, ss *dSpec, unique bool) {
	spec := ss.spec
	spec.Unique = unique
	s, err := r.Start(context.Background(), spec)
	if err != nil {
		ds.launchErr("Start", err)
		return
	}
	ds.launched(ss, s, true)
	ds.checkSnap("Start", r, s)
}

// launched notes a launch: a new pollable run owes one completion.
func (ds *dStress) launched(ss *dSpec, s bgjob.Snapshot, pollable bool) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if _, ok := ds.listIdx[s.ID]; !ok {
		ds.listIdx[s.ID] = ss.idx
		ds.list = append(ds.list, s.ID)
	}
	if s.PID > 0 {
		ds.pids[s.ID] = s.PID
	}
	if s.Joined {
		ds.n.joins.Add(1)
		return
	}
	ds.n.launches.Add(1)
	if pollable {
		w := ds.want[ss.idx]
		if w == nil {
			w = &[2]int{}
			ds.want[ss.idx] = w
		}
		w[0]++
		w[1]++
	}
}

func (ds *dStress) launchErr(op string, err error) {
	switch {
	case errors.Is(err, bgjob.ErrTooManyRunning):
		ds.n.tooMany.Add(1)
	case errors.Is(err, bgjob.ErrClosed) && (ds.restarting.Load() || ds.closing.Load()):
		ds.n.closedErrs.Add(1)
	case op == "RunForeground" && errors.Is(err, context.DeadlineExceeded):
		ds.n.ctxErrs.Add(1)
	default:
		ds.fail("%s: %v", op, err)
	}
}

// found reports err == nil; ErrNotFound (evicted) is counted, any other
// error fails.
func (ds *dStress) found(op string, err error) bool {
	switch {
	case err == nil:
		return true
	case errors.Is(err, bgjob.ErrNotFound):
		ds.n.notFound.Add(1)
	default:
		ds.fail("%s: %v", op, err)
	}
	return false
}

// randomID returns a launched ID, recent ones more often.
func (ds *dStress) randomID(rng *rand.Rand) (bgjob.ID, bool) {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	if len(ds.list) == 0 {
		return "", false
	}
	i := rng.IntN(len(ds.list))
	if rng.IntN(10) < 7 {
		i = len(ds.list) - 1 - rng.IntN(min(len(ds.list), 60))
	}
	return ds.list[i], true
}

// read reads a piece of a job's stream and checks every byte served.
func (ds *dStress) read(rng *rand.Rand, r *bgjob.Registry, id bgjob.ID) {
	ds.mu.Lock()
	ss := ds.pool[ds.listIdx[id]]
	ds.mu.Unlock()
	ds.n.reads.Add(1)
	off := rng.Int64N(ss.n + 2)
	if rng.IntN(3) == 0 {
		off = max(0, ss.n-int64(rng.IntN(dTail))) // in the tail
	}
	c, err := r.Read(id, off, 1+rng.IntN(100_000))
	switch {
	case errors.Is(err, bgjob.ErrInvalidArgument):
		ds.n.readPast.Add(1)
		return
	case !ds.found("Read", err):
		return
	}
	if c.Offset != off+c.Skipped || c.Next < c.Offset || int64(len(c.Data)) != c.Next-c.Offset || c.Next > ss.n {
		ds.fail("Read(%s, %d): offset %d skipped %d next %d, %d bytes (stream of %d)", id, off, c.Offset, c.Skipped, c.Next, len(c.Data), ss.n)
		return
	}
	if want := ss.expect(c.Offset, c.Next); c.Data != want {
		ds.fail("Read(%s, %d) of %s job %q: byte at %d differs from the job's output", id, off, dKindNames[ss.kind], ss.spec.Command, c.Offset+int64(firstDiff(c.Data, want)))
		return
	}
	ds.n.bytesChecked.Add(int64(len(c.Data)))
}

// checkSnap checks a snapshot taken from r.
func (ds *dStress) checkSnap(op string, r *bgjob.Registry, s bgjob.Snapshot) {
	ds.n.snaps.Add(1)
	ss := ds.byCmd[s.Command]
	if ss == nil {
		ds.fail("%s: snapshot of %s, whose command %q is no spec's", op, s.ID, s.Command)
		return
	}
	if !s.State.Done() {
		if s.State != bgjob.Running || s.ExitCode != -1 || !s.Ended.IsZero() {
			ds.fail("%s: running %s: state %v exit %d ended %v", op, s.ID, s.State, s.ExitCode, s.Ended)
		}
	} else if msg := ds.checkEnd(ss, s.ID, s.State, s.ExitCode, s.Reason, true, s.Ended); msg != "" {
		ds.fail("%s %s: %s", op, s.ID, msg)
	}
	var checked int64
	if msg := dCheckOutput(ss, s.Output, s.State == bgjob.Exited, &checked); msg != "" {
		ds.fail("%s %s (%s job %q, %v): %s", op, s.ID, dKindNames[ss.kind], ss.spec.Command, s.State, msg)
	}
	ds.n.bytesChecked.Add(checked)
}

// checkEnd returns what is wrong with how a run of ss ended, or "". A
// completion has no reason (haveReason false).
func (ds *dStress) checkEnd(ss *dSpec, id bgjob.ID, state bgjob.State, code int, reason string, haveReason bool, ended time.Time) string {
	ds.mu.Lock()
	killed, inflight, cancelled := ds.killed[id], ds.inflight[ss.idx], ds.cancelReq[id]
	pressured := false
	for _, w := range ds.pressure {
		pressured = pressured || (!ended.Before(w[0]) && ended.Before(w[1].Add(time.Second)))
	}
	ds.mu.Unlock()
	restarting, closing := ds.restarting.Load(), ds.closing.Load()
	ok := false
	switch state {
	case bgjob.Exited:
		ok = code == ss.code && ss.kind != dkLong
		if !ok && ss.kind == dkLong && code == 143 && ds.duringHost(ended) {
			// A crash host began to stop it (its wall timeout) and died
			// before the end: the replay must report the stop's cause,
			// which the host recorded before its SIGTERM, not the exit
			// marker of a shell that SIGTERM ended.
			ds.n.stopLost.Add(1)
		}
	case bgjob.TimedOut:
		ok = code == 124 && ss.kind == dkLong
	case bgjob.Cancelled:
		switch {
		case code != 130:
		case !haveReason:
			ok = cancelled || restarting || closing
		case reason == "cancelled" || reason == "cancelled before start":
			ok = cancelled
		case reason == "registry closed" || reason == "registry closed before start":
			ok = closing
		case reason == "registry detached before start":
			ok = restarting || ds.detachedEarly(id, ended)
		}
	case bgjob.Failed:
		switch {
		case code != -1:
		case haveReason && reason == "lost", !haveReason && killed:
			ok = killed
		case haveReason && reason == "spawn aborted", !haveReason && inflight:
			ok = inflight
		case pressured && (!haveReason || strings.Contains(reason, "too many open files")):
			ok = true // the host ran out of descriptors as it ended
		}
	}
	if ok {
		return ""
	}
	alive := ""
	if state == bgjob.Failed {
		ds.mu.Lock()
		pid := ds.pids[id]
		ds.mu.Unlock()
		alive = fmt.Sprintf(" (killed by the test: %v; launch interrupted: %v; its process %d alive now: %v)", killed, inflight, pid, pid > 0 && dMarkedAlive(pid, ds.mark))
	}
	return fmt.Sprintf("%s job %q ended %v exit %d reason %q%s; want exit %d", dKindNames[ss.kind], ss.spec.Command, state, code, reason, alive, ss.code)
}

// dMarkedAlive reports whether process pid is alive and carries mark.
func dMarkedAlive(pid int, mark string) bool {
	env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", pid))
	return err == nil && slices.Contains(strings.Split(string(env), "\x00"), mark)
}

// drain takes a session's completions from r.
func (ds *dStress) drain(r *bgjob.Registry, session, where string) {
	for _, c := range r.Completions(session) {
		if c.Session != session {
			ds.fail("%s(%q) gave one of session %q", where, session, c.Session)
		}
		reason, have := "", false
		if c.State == bgjob.Cancelled || c.State == bgjob.Failed {
			if s, err := r.Status(c.ID); err == nil && s.Ended.Equal(c.Ended) {
				reason, have = s.Reason, true
			}
		}
		ds.deliverWhy(where, c, false, reason, have)
	}
}

func (ds *dStress) deliver(where string, c bgjob.Completion, onComplete bool) {
	ds.deliverWhy(where, c, onComplete, "", false)
}

// deliverWhy records a completion delivered and checks it.
func (ds *dStress) deliverWhy(where string, c bgjob.Completion, onComplete bool, reason string, haveReason bool) {
	ss := ds.byCmd[c.Command]
	if ss == nil {
		ds.fail("%s: completion of %s, whose command %q is no spec's", where, c.ID, c.Command)
		return
	}
	k := compKey{c.ID, c.Ended.UnixNano()}
	ds.mu.Lock()
	if onComplete {
		ds.onc[k]++
	} else {
		ds.drained[k]++
	}
	ds.compIdx[k] = ss.idx
	ds.compWhere[k] = append(ds.compWhere[k], where)
	ds.mu.Unlock()
	if onComplete {
		ds.n.onComplete.Add(1)
		return // checked when drained
	}
	switch {
	case c.State == bgjob.Exited:
		ds.n.exited.Add(1)
	case c.State == bgjob.Cancelled:
		ds.n.cancelled.Add(1)
	case c.State == bgjob.TimedOut:
		ds.n.timedOut.Add(1)
	case reason == "lost" || (!haveReason && ds.killedID(c.ID)):
		ds.n.lost.Add(1)
	default:
		ds.n.aborted.Add(1)
	}
	if msg := ds.checkEnd(ss, c.ID, c.State, c.ExitCode, reason, haveReason, c.Ended); msg != "" {
		ds.fail("%s: completion of %s: %s", where, c.ID, msg)
	} else if reason == "registry detached before start" {
		ds.mu.Lock()
		ds.early[k] = true // a launch that a Detach prevented: its later snapshots may say so
		ds.mu.Unlock()
	}
}

// duringHost reports whether t falls within the life of a crash host.
func (ds *dStress) duringHost(t time.Time) bool {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	for _, h := range ds.hosts {
		if !t.Before(h[0]) && t.Before(h[1].Add(time.Second)) {
			return true
		}
	}
	return false
}

func (ds *dStress) detachedEarly(id bgjob.ID, ended time.Time) bool {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return ds.early[compKey{id, ended.UnixNano()}]
}

func (ds *dStress) killedID(id bgjob.ID) bool {
	ds.mu.Lock()
	defer ds.mu.Unlock()
	return ds.killed[id]
}

// verify closes the last registry, then checks that a final one owes and
// runs nothing, and that every run's completion was delivered once.
func (ds *dStress) verify() {
	t := ds.t
	ds.closing.Store(true)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	running := ds.reg.Running()
	begin := time.Now()
	if err := ds.reg.Close(ctx); err != nil {
		t.Errorf("Close: %v", err)
	}
	t.Logf("Close with %d jobs running took %v", running, time.Since(begin).Round(time.Millisecond))
	for _, s := range dSessions {
		ds.drain(ds.reg, s, fmt.Sprintf("Completions of r%d after Close", ds.gen))
	}
	last, err := bgjob.New(ds.config())
	if err != nil {
		t.Fatalf("last New: %v", err)
	}
	if n := last.Running(); n != 0 {
		t.Errorf("a New after Close adopted %d jobs; want none", n)
	}
	for _, s := range dSessions {
		for _, c := range last.Completions(s) {
			ds.fail("a New after Close delivered again the completion of %s (%v, ended %v)", c.ID, c.State, c.Ended)
		}
		for _, snap := range last.List(s) {
			ds.checkSnap("List after Close", last, snap)
		}
	}
	if err := last.Close(ctx); err != nil {
		t.Errorf("last Close: %v", err)
	}

	ds.mu.Lock()
	defer ds.mu.Unlock()
	per := map[int]int{}
	for k, n := range ds.drained {
		per[ds.compIdx[k]]++
		if n != 1 {
			ds.fail("completion of %s ended %v delivered %d times; want once: %v", k.id, time.Unix(0, k.ended), n, ds.compWhere[k])
		}
	}
	for k, n := range ds.onc {
		if n != 1 || ds.drained[k] != 1 {
			ds.fail("completion of %s ended %v: %d OnComplete, %d Completions; want one each: %v", k.id, time.Unix(0, k.ended), n, ds.drained[k], ds.compWhere[k])
		}
	}
	for idx, w := range ds.want {
		if got := per[idx]; got < w[0] || got > w[1] {
			ds.fail("%s job %q: %d runs' completions delivered; want %d..%d (launches that made a pollable run)", dKindNames[ds.pool[idx].kind], ds.pool[idx].spec.Command, got, w[0], w[1])
		}
	}
	for idx, got := range per {
		if ds.want[idx] == nil {
			ds.fail("%q: %d completions of runs nobody launched", ds.pool[idx].spec.Command, got)
		}
	}
	slices.Sort(ds.spare)
	n := &ds.n
	t.Logf("jobs: %d runs launched (%d by crash hosts, %d of them interrupted by the crash), %d joins, %d flood jobs started in bursts, %d RunForeground inline and %d detached; %d too-many, %d ErrClosed, %d ctx ended",
		n.launches.Load(), n.hostLaunches.Load(), n.interrupted.Load(), n.joins.Load(), n.floods.Load(), n.fgInline.Load(), n.fgDetached.Load(), n.tooMany.Load(), n.closedErrs.Load(), n.ctxErrs.Load())
	t.Logf("restarts: %d in process (%d of all Detaches raced the workers' calls), %d host crashes (%d jobs SIGKILLed while no host ran); %d jobs adopted by New in all; the lock found held %d times while no host ran",
		n.inProc.Load(), n.racing.Load(), n.crashes.Load(), n.killed.Load(), n.adopted.Load(), n.inUse.Load())
	t.Logf("descriptor pressure: %d restarts, %d News failed (records kept; %d records of ended jobs settled and %d folders without a record quarantined by a failed New), spare descriptors the successful News had: %v",
		n.pressured.Load(), n.failedNews.Load(), n.settled.Load(), n.quarantined.Load(), ds.spare)
	t.Logf("completions: %d runs, each delivered exactly once unless reported above (%d also through OnComplete, %d by crash hosts): exited %d, cancelled %d, timed out %d, lost %d, other failures %d; %d sightings of a timeout that a crash turned into exit 143",
		len(ds.drained), len(ds.onc), n.hostDelivered.Load(), n.exited.Load(), n.cancelled.Load(), n.timedOut.Load(), n.lost.Load(), n.aborted.Load(), n.stopLost.Load())
	t.Logf("checks: %d snapshots, %d bytes of output compared; polls: %d Status, %d Wait, %d Read (%d past the end), %d Cancel (%d of a job a racing Detach had released), %d List, %d drains, %d not found",
		n.snaps.Load(), n.bytesChecked.Load(), n.status.Load(), n.wait.Load(), n.reads.Load(), n.readPast.Load(), n.cancels.Load(), n.cancelReleased.Load(), n.lists.Load(), n.drains.Load(), n.notFound.Load())
	ds.logs.mu.Lock()
	t.Logf("the registries logged %d records (by message: %v); the first: %q", ds.logs.n, ds.logs.byMsg, ds.logs.first)
	ds.logs.mu.Unlock()
	if ds.failures.Load() > 40 {
		t.Errorf("%d failures in all (the first 40 shown)", ds.failures.Load())
	}
}

// leaks checks that no process of a job, no keeper and no zombie child is
// left, and no file descriptor.
func (ds *dStress) leaks(fdsBefore []string, zombiesBefore map[int]bool) {
	t := ds.t
	var live, holders, zombies int
	for _, p := range procTable() {
		if p.state == 'Z' || p.state == 'X' {
			if p.ppid == os.Getpid() && !zombiesBefore[p.pid] {
				zombies++
				if zombies <= 5 {
					comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p.pid))
					t.Errorf("zombie child %d (%s) of the test process; want none", p.pid, bytes.TrimSpace(comm))
				}
			}
			continue
		}
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.pid))
		cmd = bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})
		if dMarkedAlive(p.pid, ds.mark) {
			live++
			t.Errorf("process %d of a job is alive at the end: %q", p.pid, cmd)
			continue
		}
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid))
		for _, e := range fds {
			if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", p.pid, e.Name())); strings.HasPrefix(l, ds.state+"/") && p.pid != os.Getpid() {
				holders++
				t.Errorf("process %d (%q) holds %s open at the end (a keeper?); want none", p.pid, cmd, l)
				break
			}
		}
	}
	if zombies > 5 {
		t.Errorf("%d zombie children in all", zombies)
	}
	runtime.GC() // an *os.File the library dropped is closed by its finalizer: count only what stays
	fdsAfter := stressFDs()
	if len(fdsAfter) != len(fdsBefore) {
		var extra []string
		for _, f := range fdsAfter {
			if !slices.Contains(fdsBefore, f) {
				extra = append(extra, f)
			}
		}
		t.Errorf("open file descriptors: %d before, %d after; want equal\nbefore %v\nnew (%d, the first 5) %v", len(fdsBefore), len(fdsAfter), fdsBefore, len(extra), extra[:min(5, len(extra))])
	}
	t.Logf("leaks: %d live processes of jobs, %d processes holding files of the state directory, %d zombie children, %d descriptors (%d before); goroutines checked by goleak",
		live, holders, zombies, len(fdsAfter)-len(fdsBefore), len(fdsBefore))
}

// killLeftovers kills what a failed run left: the jobs' processes (they
// carry the mark) and the processes that hold its state directory's files
// (keepers), so that one failure does not leak into the next test.
func (ds *dStress) killLeftovers() {
	for _, p := range procTable() {
		if p.pid == os.Getpid() {
			continue
		}
		hold := dMarkedAlive(p.pid, ds.mark)
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid))
		for _, e := range fds {
			l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", p.pid, e.Name()))
			hold = hold || strings.HasPrefix(l, ds.state+"/")
		}
		if hold {
			syscall.Kill(p.pid, syscall.SIGKILL)
		}
	}
}
