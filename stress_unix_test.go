//go:build unix

package bgjob_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
	"go.uber.org/goleak"
)

// TestStress runs 16 goroutines that, for BGJOB_STRESS_DURATION (15s by
// default, 3s with -short), mix every method of the registry over a few
// hundred job specs whose exit codes and output sizes follow from the
// spec: jobs that exit with various codes, kill themselves, fail to spawn
// (a second registry with a missing shell; a Dir removed by the Guard
// between validation and spawn), time out (wall and idle), print
// megabytes, leave grandchildren (some ignoring SIGTERM) or ignore SIGTERM
// themselves; the calls of issue #20 are mixed in too (ReadWait, Follow,
// NextCompletion, launches and lookups through Session views, which must
// never reach another session's job; stress_views_unix_test.go), and so
// are conversations with interactive and TTY jobs (Write, CloseInput,
// Resize, Screen, each checked exactly; stress_input_unix_test.go), and
// watches, WaitFor and Matches (stress_watch_unix_test.go); and of
// issue #19: a third registry has 4 slots and a queue, so that most of its
// launches wait, with random priorities, and are polled, joined, waited
// on, read and cancelled while queued, and a Status of a running job
// lists its tree. Then it closes the registries while the goroutines
// still run and checks, over every execution: the state, exit code and
// byte count its Telemetry event reports; one Completion per pollable
// run, delivered exactly once by Completions and once to OnComplete;
// every match a run's bytes make, exactly once to OnMatch; and no leak
// of goroutines, file descriptors, live processes or zombies.
//
//	BGJOB_STRESS_DURATION=11m nice -n 10 go test -race -run '^TestStress$' -timeout 30m .
func TestStress(t *testing.T) {
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
	t.Logf("seed %d (set BGJOB_STRESS_SEED to repeat the pool), duration %v", seed, dur)

	// Warm up what the runtime and the library open once (the poller, the
	// shared /dev/null), so that the file descriptors counted before are
	// those counted after.
	stressWarmUp(t)
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	fdsBefore := stressFDs()
	zombiesBefore := zombieChildren()

	st := newStress(t, seed)
	st.run(dur)
	st.verify()

	if runtime.GOOS == "linux" {
		fdsAfter := stressFDs()
		if len(fdsAfter) != len(fdsBefore) {
			t.Errorf("open file descriptors: %d before, %d after; want equal\nbefore %v\nafter  %v", len(fdsBefore), len(fdsAfter), fdsBefore, fdsAfter)
		}
		for pid := range zombieChildren() {
			if !zombiesBefore[pid] {
				t.Errorf("zombie child %d of the test process; want none", pid)
			}
		}
	}
}

const (
	stressWorkers = 16
	stressHead    = 16 << 10
	stressTail    = 64 << 10
)

var stressSessions = []string{"", "alpha", "beta", "gamma"}

// stressReg is one registry under stress and what was launched on it.
type stressReg struct {
	name     string
	r        *bgjob.Registry
	rec      *stressRec
	launches atomic.Int64 // launches that started a new run (not joins)
}

type stress struct {
	t       *testing.T
	pool    []*stressSpec
	main    *stressReg
	bad     *stressReg // its shell does not exist
	queue   *stressReg // stressSlots slots and a queue
	dir     string     // Config.Dir of main; doomed dirs live under it
	mark    string     // in every job's environment, to find its processes
	seed    uint64
	closing atomic.Bool

	mu     sync.Mutex
	ids    map[bgjob.ID]*stressSpec
	regs   map[bgjob.ID]*stressReg
	list   []bgjob.ID
	pids   map[int]bool
	listed map[bgjob.ID]bool // listed before their launch returned

	failures atomic.Int64
	n        struct {
		joins, tooMany, closedErrs, inline, detached, progress          atomic.Int64
		status, notFound, reads, readBytes, readInvalid, waits, waitOut atomic.Int64
		cancels, lists, drains, readmits, walks, admits, doomed         atomic.Int64
		ctxErrs, detachedDone, escapes, escapeChecks                    atomic.Int64
		queued, queuedSeen, queuedDetached, listedProcs, queuedLong     atomic.Int64
	}
	tokens atomic.Int64 // the last escape token handed out
	fh     firstHourCounts
	wl     stressWatchLog // watches (stress_watch_unix_test.go)
	cv     conversationCounts
}

func newStress(t *testing.T, seed uint64) *stress {
	st := &stress{
		t: t, seed: seed, dir: t.TempDir(),
		pool: stressPool(rand.New(rand.NewPCG(seed, 1))),
		ids:  map[bgjob.ID]*stressSpec{}, regs: map[bgjob.ID]*stressReg{}, pids: map[int]bool{},
		listed: map[bgjob.ID]bool{},
	}
	st.mark = fmt.Sprintf("BGJOB_STRESS_MARK=%d-%d", os.Getpid(), seed)
	st.wl.init()
	stressWatches(st.pool)
	st.main = &stressReg{name: "main", rec: newStressRec()}
	st.bad = &stressReg{name: "bad-shell", rec: newStressRec()}
	st.queue = &stressReg{name: "queue", rec: newStressRec()}
	var err error
	st.main.r, err = bgjob.New(st.config(st.main, 128))
	if err != nil {
		t.Fatal(err)
	}
	qc := st.config(st.queue, stressSlots)
	qc.Queue, qc.MaxQueued = true, stressMaxQueued
	st.queue.r, err = bgjob.New(qc)
	if err != nil {
		t.Fatal(err)
	}
	st.bad.r, err = bgjob.New(bgjob.Config{
		Shell:      []string{"/no/such/shell", "-c"},
		MaxRunning: 128,
		Telemetry:  st.bad.rec,
		OnComplete: st.bad.rec.onComplete,
	})
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// The queue registry's slots and bound.
const (
	stressSlots     = 4
	stressMaxQueued = 64
)

// config is the Config of the registries that run the pool's jobs, with
// reg's hooks and maxRunning slots.
func (st *stress) config(reg *stressReg, maxRunning int) bgjob.Config {
	return bgjob.Config{
		Dir:              st.dir,
		Env:              append(os.Environ(), st.mark),
		MaxRunning:       maxRunning,
		KillGrace:        300 * time.Millisecond,
		DefaultTimeout:   time.Minute,
		HeadBytes:        stressHead,
		TailBytes:        stressTail,
		Retention:        bgjob.Retention{MaxJobs: 48, MaxBytes: 2 << 20, TTL: 20 * time.Second},
		ProgressInterval: 30 * time.Millisecond,
		Telemetry:        reg.rec,
		OnComplete: func(c bgjob.Completion) {
			reg.rec.onComplete(c)
			st.checkEscapers(c.Command)
		},
		OnMatch: st.onMatch,
		// An Admitter that keeps the text as it is, so the bytes stay
		// checkable while every path passes through admission.
		Admitter: bgjob.AdmitterFunc(func(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
			st.n.admits.Add(1)
			return bgjob.Admitted{Text: req.Text}, nil
		}),
		// The Guard removes a doomed Dir after validation, so the spawn
		// finds it gone.
		Guard: func(_ context.Context, s bgjob.Spec) error {
			if strings.HasPrefix(filepath.Base(s.Dir), "doomed-") {
				return os.RemoveAll(s.Dir)
			}
			return nil
		},
	}
}

func (st *stress) fail(format string, args ...any) {
	st.t.Helper()
	if st.failures.Add(1) <= 30 {
		st.t.Errorf(format, args...)
	}
}

// pick returns a spec to launch and the registry to launch it on.
func (st *stress) pick(rng *rand.Rand) (*stressSpec, *stressReg) {
	if rng.IntN(25) == 0 {
		// A fresh directory that the Guard will remove.
		d, err := os.MkdirTemp(st.dir, "doomed-")
		if err != nil {
			st.fail("MkdirTemp: %v", err)
			return st.pool[0], st.main
		}
		st.n.doomed.Add(1)
		ss := &stressSpec{kind: kindDirGone, word: "gone", code: 0}
		ss.spec = bgjob.Spec{Command: "exit 0", Dir: d, Session: stressSessions[rng.IntN(len(stressSessions))]}
		return ss, st.runner(rng)
	}
	ss := st.pool[rng.IntN(len(st.pool))]
	if ss.kind == kindBadShell {
		return ss, st.bad
	}
	return ss, st.runner(rng)
}

// runner returns a registry that runs the pool's jobs: the main one, or
// one time in four the one with a queue.
func (st *stress) runner(rng *rand.Rand) *stressReg {
	if rng.IntN(4) == 0 {
		return st.queue
	}
	return st.main
}

// anyReg returns one of the three registries, for calls that take no ID.
func (st *stress) anyReg(rng *rand.Rand) *stressReg {
	switch rng.IntN(4) {
	case 0:
		return st.bad
	case 1:
		return st.queue
	}
	return st.main
}

// record notes a launch's result: the ID's spec (an ID never names two
// different specs), its registry and its PID.
func (st *stress) record(reg *stressReg, ss *stressSpec, s bgjob.Snapshot) {
	st.mu.Lock()
	prev, ok := st.ids[s.ID]
	if !ok {
		st.ids[s.ID] = ss
		st.regs[s.ID] = reg
		st.list = append(st.list, s.ID)
	}
	if s.PID > 0 {
		st.pids[s.PID] = true
	}
	st.mu.Unlock()
	if ok && prev != ss {
		st.fail("ID %s names two specs: %q and %q", s.ID, prev.spec.Command, ss.spec.Command)
	}
	if !s.Joined {
		reg.launches.Add(1)
	} else {
		st.n.joins.Add(1)
	}
	if s.State == bgjob.Queued {
		st.n.queued.Add(1)
	}
}

// launchSpec returns the spec to launch for ss: sometimes Unique, and for
// an escaping job always, with a token of its own in place of
// escapeToken, so that the check at its end finds its processes wherever
// they went, and no other run's.
func (st *stress) launchSpec(ss *stressSpec, rng *rand.Rand) bgjob.Spec {
	spec := ss.spec
	spec.Unique = rng.IntN(5) == 0 || len(spec.Watches) > 0 // an ID with watches names one run
	spec.Priority = rng.IntN(4) - 1                         // orders the queue; no other effect
	if ss.kind == kindEscape {
		spec.Unique = true
		spec.Command = strings.ReplaceAll(spec.Command, escapeToken, fmt.Sprintf("esc-%d-%d", st.seed, st.tokens.Add(1)))
		st.n.escapes.Add(1)
	}
	return spec
}

// stillQueued reports whether a job of the queue's registry whose Wait ran
// out had not had the deadline's time to run: it is still queued, or
// left the queue (Started) less than the deadline ago.
func (st *stress) stillQueued(reg *stressReg, id bgjob.ID) bool {
	if reg != st.queue {
		return false
	}
	s, err := reg.r.Status(id)
	return err == nil && (s.State == bgjob.Queued || s.State == bgjob.Running && time.Since(s.Started) < deadline)
}

// checkEscapers checks, as a job of command cmd ends, that no process it
// started lives on, anywhere on the machine: an escaping job's processes
// carry its token (see launchSpec).
func (st *stress) checkEscapers(cmd string) {
	i := strings.Index(cmd, "esc-")
	if i < 0 {
		return
	}
	token := cmd[i:]
	if j := strings.IndexAny(token, "' "); j >= 0 {
		token = token[:j]
	}
	st.n.escapeChecks.Add(1)
	if pids := marked(token); len(pids) > 0 {
		// What each one is doing says why (a SIGKILLed process still
		// exiting under load, or one that the stop never reached).
		var what []string
		for _, pid := range pids {
			what = append(what, procBrief(pid))
		}
		// And whether they die soon (a kill still under way).
		gone, start := "not within 5s", time.Now()
		for time.Since(start) < 5*time.Second {
			if len(marked(token)) == 0 {
				gone = fmt.Sprintf("gone %v later", time.Since(start).Round(time.Millisecond))
				break
			}
			time.Sleep(5 * time.Millisecond)
		}
		st.fail("processes %v of the ended job %q still run: %s; %s",
			pids, cmd, strings.Join(what, "; "), gone)
	}
}

// procBrief describes process pid for a failure message: its state,
// parent, pending signals and cgroup.
func procBrief(pid int) string {
	b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	var f []string
	for _, l := range strings.Split(string(b), "\n") {
		for _, k := range []string{"State:", "PPid:", "SigPnd:", "ShdPnd:", "SigIgn:"} {
			if strings.HasPrefix(l, k) {
				f = append(f, strings.Join(strings.Fields(l), " "))
			}
		}
	}
	cg, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	return fmt.Sprintf("%d: %s, cgroup %q", pid, strings.Join(f, ", "), strings.TrimSpace(string(cg)))
}

// randomID returns a known ID, recent ones more often, so that running
// jobs are polled too.
func (st *stress) randomID(rng *rand.Rand) (bgjob.ID, *stressSpec, *stressReg, bool) {
	st.mu.Lock()
	defer st.mu.Unlock()
	if len(st.list) == 0 {
		return "", nil, nil, false
	}
	i := rng.IntN(len(st.list))
	if rng.IntN(10) < 7 {
		i = len(st.list) - 1 - rng.IntN(min(len(st.list), 100))
	}
	id := st.list[i]
	return id, st.ids[id], st.regs[id], true
}

func (st *stress) spec(id bgjob.ID) *stressSpec {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.ids[id]
}

// launchErr checks an error of Start or RunForeground.
func (st *stress) launchErr(op string, err error) {
	switch {
	case errors.Is(err, bgjob.ErrTooManyRunning):
		st.n.tooMany.Add(1)
	case errors.Is(err, bgjob.ErrClosed) && st.closing.Load():
		st.n.closedErrs.Add(1)
	case op == "RunForeground" && errors.Is(err, context.DeadlineExceeded):
		// Its short ctx ended before the launch.
		st.n.ctxErrs.Add(1)
	default:
		st.fail("%s: %v", op, err)
	}
}

// checkSnap checks a snapshot of a job of spec ss.
func (st *stress) checkSnap(op string, ss *stressSpec, s bgjob.Snapshot) {
	if ss == nil {
		st.fail("%s: snapshot of unknown job %s", op, s.ID)
		return
	}
	if ss.kind == kindConversation {
		return // its worker checks it exactly (stress_input_unix_test.go)
	}
	if s.State == bgjob.Queued {
		st.n.queuedSeen.Add(1)
		if s.ExitCode != -1 || s.PID != 0 || !s.Ended.IsZero() || s.Output.Total != 0 || s.QueuePosition < 1 || s.QueuePosition > stressMaxQueued || s.Processes != nil {
			st.fail("%s: queued %s job %s: exit %d pid %d ended %v total %d place %d processes %v", op, kindNames[ss.kind], s.ID, s.ExitCode, s.PID, s.Ended, s.Output.Total, s.QueuePosition, s.Processes)
		}
		return
	}
	if s.QueuePosition != 0 {
		st.fail("%s: %v job %s at place %d in the queue", op, s.State, s.ID, s.QueuePosition)
	}
	if !s.State.Done() {
		if s.State != bgjob.Running || s.ExitCode != -1 || !s.Ended.IsZero() || s.Output.Total > ss.n {
			st.fail("%s: running %s job %s: state %v exit %d ended %v total %d (of %d)", op, kindNames[ss.kind], s.ID, s.State, s.ExitCode, s.Ended, s.Output.Total, ss.n)
		}
		for _, p := range s.Processes {
			if p.PID <= 0 || p.PPID < 0 {
				st.fail("%s: running job %s lists process %+v", op, s.ID, p)
			}
		}
		st.n.listedProcs.Add(int64(len(s.Processes)))
		return
	}
	if s.Processes != nil || s.Ports != nil {
		st.fail("%s: %v job %s lists processes %v, ports %v", op, s.State, s.ID, s.Processes, s.Ports)
	}
	if msg := ss.check(s.State, s.ExitCode, s.Output.Total); msg != "" {
		st.fail("%s %s: %s", op, s.ID, msg)
	}
	if s.Ended.IsZero() || s.Ended.Before(s.Started) {
		st.fail("%s %s: ended %v, started %v", op, s.ID, s.Ended, s.Started)
	}
	o := s.Output
	switch {
	case o.Withheld:
		st.fail("%s %s: output withheld (%s)", op, s.ID, o.Notice)
	case o.Omitted == 0:
		if o.Text != ss.pattern(o.Total) {
			st.fail("%s %s: text of %d bytes is not the job's output", op, s.ID, len(o.Text))
		}
	default:
		if o.Total-o.Omitted > stressHead+stressTail || len(o.Text) > stressHead+stressTail+200 || !strings.Contains(o.Notice, "truncated") {
			st.fail("%s %s: total %d omitted %d text %d notice %q", op, s.ID, o.Total, o.Omitted, len(o.Text), o.Notice)
		}
	}
	if (ss.kind == kindGrandchildren || ss.kind == kindStubbornChild) && s.State == bgjob.Exited && !strings.Contains(o.Notice, "leftover") {
		st.fail("%s %s: no notice of the leftover processes: %q", op, s.ID, o.Notice)
	}
}

// checkChunk checks that a chunk holds the job's bytes at its offsets.
func (st *stress) checkChunk(ss *stressSpec, id bgjob.ID, off int64, c bgjob.Chunk) {
	if c.Offset != off+c.Skipped || c.Next < c.Offset || int64(len(c.Data)) != c.Next-c.Offset {
		st.fail("Read(%s, %d): offset %d skipped %d next %d, %d bytes", id, off, c.Offset, c.Skipped, c.Next, len(c.Data))
		return
	}
	for i := 0; i < len(c.Data); i++ {
		if c.Data[i] != ss.byteAt(c.Offset+int64(i)) {
			st.fail("Read(%s, %d): byte at %d is %q; want %q", id, off, c.Offset+int64(i), c.Data[i], ss.byteAt(c.Offset+int64(i)))
			return
		}
	}
	st.n.readBytes.Add(int64(len(c.Data)))
}

// walk reads a job's whole stream by offset, checking every byte served.
// Another goroutine may re-run the ID meanwhile: the bytes are the same.
func (st *stress) walk(reg *stressReg, ss *stressSpec, id bgjob.ID) {
	st.n.walks.Add(1)
	for off, i := int64(0), 0; i < 1000; i++ {
		c, err := reg.r.Read(id, off, 1+rand.IntN(200_000))
		if err != nil {
			if !errors.Is(err, bgjob.ErrNotFound) && !errors.Is(err, bgjob.ErrInvalidArgument) {
				st.fail("walk Read(%s, %d): %v", id, off, err)
			}
			return
		}
		st.checkChunk(ss, id, off, c)
		if c.Done || c.Next == off {
			return
		}
		off = c.Next
	}
}

func (st *stress) worker(rng *rand.Rand, stop *atomic.Bool) {
	ctx := context.Background()
	for !stop.Load() {
		switch p := rng.IntN(124); {
		case p >= 118: // WaitFor, Watch, Matches
			st.watchOp(rng, p-118)
		case p >= 112: // conversations: Write, CloseInput, Resize, Screen
			st.conversation(rng)
		case p >= 100: // ReadWait, Follow, NextCompletion, Session views
			st.firstHour(rng, p-100)
		case p < 22: // Start, sometimes waiting for the end
			ss, reg := st.pick(rng)
			spec := st.launchSpec(ss, rng)
			var s bgjob.Snapshot
			var err error
			if rng.IntN(4) == 0 {
				s, err = st.viewStart(reg, spec, rng)
			} else {
				s, err = reg.r.Start(ctx, spec)
			}
			if err != nil {
				st.launchErr("Start", err)
				continue
			}
			st.record(reg, ss, s)
			st.checkSnap("Start", ss, s)
			if rng.IntN(3) == 0 {
				wctx, cancel := context.WithTimeout(ctx, deadline)
				s, err := reg.r.Wait(wctx, s.ID)
				cancel()
				switch {
				case err == nil:
					st.checkSnap("Wait", ss, s)
				case errors.Is(err, bgjob.ErrNotFound):
				case errors.Is(err, context.DeadlineExceeded) && st.stillQueued(reg, s.ID):
					// The queue's 4 slots serve up to 64 waiting
					// jobs by priority: one of low priority may
					// wait there longer than the deadline.
					st.n.queuedLong.Add(1)
				default:
					st.fail("Wait after Start: %v", err)
				}
			}
		case p < 36: // RunForeground: inline, detached at the soft cap, or by ctx
			ss, reg := st.pick(rng)
			spec := st.launchSpec(ss, rng)
			fg := bgjob.Foreground{SoftCap: time.Duration(1+rng.IntN(500)) * time.Millisecond}
			if rng.IntN(3) == 0 {
				fg.OnProgress = func(s bgjob.Snapshot) {
					st.n.progress.Add(1)
					if s.State != bgjob.Running && s.State != bgjob.Queued {
						st.fail("OnProgress got a %v snapshot; want running or queued", s.State)
					}
					st.checkSnap("OnProgress", ss, s)
				}
			}
			fctx, cancel := context.WithTimeout(ctx, time.Duration(1+rng.IntN(1000))*time.Millisecond)
			res, err := reg.r.RunForeground(fctx, spec, fg)
			cancel()
			if err != nil {
				st.launchErr("RunForeground", err)
				continue
			}
			st.record(reg, ss, res.Snapshot)
			if res.Detached {
				st.n.detached.Add(1)
				if res.State == bgjob.Queued {
					st.n.queuedDetached.Add(1)
				} else if res.State != bgjob.Running {
					// detach once snapshotted after letting go of the
					// lock, so a job ending at that moment came back
					// Detached yet done.
					st.n.detachedDone.Add(1)
					st.fail("RunForeground: Detached with state %v; want running", res.State)
				}
			} else {
				st.n.inline.Add(1)
				if !res.State.Done() {
					st.fail("RunForeground returned a running job without Detached")
				}
				st.checkEscapers(res.Command)
			}
			st.checkSnap("RunForeground", ss, res.Snapshot)
		case p < 50:
			id, ss, reg, ok := st.randomID(rng)
			if !ok {
				continue
			}
			st.n.status.Add(1)
			s, err := reg.r.Status(id)
			if err != nil {
				st.notFound("Status", err)
				continue
			}
			st.checkSnap("Status", ss, s)
		case p < 60:
			id, ss, reg, ok := st.randomID(rng)
			if !ok {
				continue
			}
			st.n.reads.Add(1)
			off := rng.Int64N(ss.n + 2)
			c, err := reg.r.Read(id, off, 1+rng.IntN(100_000))
			switch {
			case errors.Is(err, bgjob.ErrInvalidArgument): // past the end of the stream so far
				st.n.readInvalid.Add(1)
			case err != nil:
				st.notFound("Read", err)
			default:
				st.checkChunk(ss, id, off, c)
			}
		case p < 70:
			id, ss, reg, ok := st.randomID(rng)
			if !ok {
				continue
			}
			st.n.waits.Add(1)
			wctx, cancel := context.WithTimeout(ctx, time.Duration(rng.IntN(300))*time.Millisecond)
			s, err := reg.r.Wait(wctx, id)
			cancel()
			switch {
			case errors.Is(err, context.DeadlineExceeded):
				st.n.waitOut.Add(1)
			case err != nil:
				st.notFound("Wait", err)
			default:
				st.checkSnap("Wait", ss, s)
				if rng.IntN(4) == 0 {
					st.walk(reg, ss, id)
				}
			}
		case p < 77:
			id, ss, reg, ok := st.randomID(rng)
			if !ok {
				continue
			}
			st.n.cancels.Add(1)
			s, err := reg.r.Cancel(id)
			if err != nil {
				st.notFound("Cancel", err)
				continue
			}
			if !s.State.Done() {
				st.fail("Cancel returned state %v", s.State)
			}
			st.checkSnap("Cancel", ss, s)
		case p < 83:
			st.n.lists.Add(1)
			session := stressSessions[rng.IntN(len(stressSessions))]
			reg := st.anyReg(rng)
			for _, s := range reg.r.List(session) {
				if s.Session != session {
					st.fail("List(%q) gave a job of session %q", session, s.Session)
				}
				ss := st.spec(s.ID)
				if ss == nil {
					// Its Start has not returned yet: check at the end
					// that it does.
					st.mu.Lock()
					st.listed[s.ID] = true
					st.mu.Unlock()
					continue
				}
				st.checkSnap("List", ss, s)
			}
		case p < 93:
			st.n.drains.Add(1)
			session := stressSessions[rng.IntN(len(stressSessions))]
			reg := st.anyReg(rng)
			cs := reg.r.Completions(session)
			for _, c := range cs {
				if c.Session != session {
					st.fail("Completions(%q) gave one of session %q", session, c.Session)
				}
			}
			reg.rec.drain(cs)
		case p < 95:
			st.n.readmits.Add(1)
			rctx, cancel := context.WithTimeout(ctx, time.Second)
			err := st.main.r.Readmit(rctx)
			cancel()
			if err != nil && !errors.Is(err, context.DeadlineExceeded) && !(errors.Is(err, bgjob.ErrClosed) && st.closing.Load()) {
				st.fail("Readmit: %v", err)
			}
		default:
			if n := st.main.r.Running(); n < 0 || n > 128 {
				st.fail("Running() = %d; want 0..128", n)
			}
			if n := st.queue.r.Running(); n < 0 || n > stressSlots {
				st.fail("queue: Running() = %d; want 0..%d", n, stressSlots)
			}
		}
	}
}

func (st *stress) notFound(op string, err error) {
	if errors.Is(err, bgjob.ErrNotFound) {
		st.n.notFound.Add(1)
		return
	}
	st.fail("%s: %v", op, err)
}

// run runs the workers for dur, then closes both registries while they
// still run, and waits for them.
func (st *stress) run(dur time.Duration) {
	var stop atomic.Bool
	var wg sync.WaitGroup
	begin := time.Now()
	for i := range stressWorkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			st.worker(rand.New(rand.NewPCG(st.seed, uint64(i)+100)), &stop)
		}()
	}
	timer := time.NewTimer(dur)
	<-timer.C
	st.closing.Store(true)
	runningAtClose := st.main.r.Running()
	closeBegin := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	var cerr [3]error
	var cwg sync.WaitGroup
	for i, reg := range []*stressReg{st.main, st.bad, st.queue} {
		cwg.Add(1)
		go func() {
			defer cwg.Done()
			cerr[i] = reg.r.Close(ctx)
		}()
	}
	cwg.Wait()
	closeTook := time.Since(closeBegin)
	stop.Store(true)
	done := make(chan struct{})
	go func() { wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(2 * time.Minute):
		buf := make([]byte, 1<<20)
		st.t.Fatalf("workers still busy 2m after Close:\n%s", buf[:runtime.Stack(buf, true)])
	}
	for i, err := range cerr {
		if err != nil {
			st.t.Errorf("Close of registry %d: %v", i, err)
		}
	}
	// Close is bounded by KillGrace and the drain for each job, run in
	// parallel; a minute means a hang.
	if closeTook > time.Minute {
		st.t.Errorf("Close took %v; want about the kill grace", closeTook)
	}
	st.t.Logf("ran %v; Close with %d jobs running took %v", time.Since(begin).Round(time.Millisecond), runningAtClose, closeTook.Round(time.Millisecond))
}

// verify checks every execution's telemetry, completions and processes
// once both registries are closed.
func (st *stress) verify() {
	t := st.t
	var states [6]int
	var kinds [numKinds]int
	var faults, processes, leftovers int
	var bytesTotal int64
	for _, reg := range []*stressReg{st.main, st.bad, st.queue} {
		if n := reg.r.Running(); n != 0 {
			t.Errorf("%s: Running() = %d after Close; want 0", reg.name, n)
		}
		for _, s := range stressSessions {
			reg.rec.drain(reg.r.Completions(s))
		}
		rec := reg.rec
		rec.mu.Lock()
		if got, want := int64(len(rec.finished)), reg.launches.Load(); got != want {
			t.Errorf("%s: %d JobFinished events; want one per launch (%d)", reg.name, got, want)
		}
		bg := map[bgjob.ID]int{}
		fin := map[bgjob.ID]int{}
		for _, e := range rec.finished {
			fin[e.ID]++
			ss := st.spec(e.ID)
			if ss == nil {
				st.fail("%s: event of unknown job %s", reg.name, e.ID)
				continue
			}
			if msg := ss.check(e.State, e.ExitCode, e.Bytes); msg != "" {
				st.fail("%s: JobFinished %s: %s", reg.name, e.ID, msg)
			}
			if want := stressCategory(e.State, e.ExitCode); e.Category != want {
				st.fail("%s: JobFinished %s: category %v; want %v", reg.name, e.ID, e.Category, want)
			}
			if e.Background {
				bg[e.ID]++
			}
			if int(e.State) < len(states) {
				states[e.State]++
			}
			kinds[ss.kind]++
			bytesTotal += e.Bytes
			switch {
			case e.State != bgjob.Exited || ss.kind == kindSelfKill || ss.kind == kindSelfTerm:
				faults++
			case ss.kind == kindGrandchildren || ss.kind == kindStubbornChild:
				faults++
				leftovers++
			}
		}
		for id, n := range rec.started {
			processes += n
			if n > fin[id] {
				st.fail("%s: %s started %d times, finished %d", reg.name, id, n, fin[id])
			}
		}
		// Each pollable run: one completion drained, one OnComplete, one
		// background JobFinished, per ID.
		perID := func(m map[compKey]int, what string) map[bgjob.ID]int {
			c := map[bgjob.ID]int{}
			for k, n := range m {
				if n != 1 {
					st.fail("%s: completion of %s ended %d %s %d times; want once", reg.name, k.id, k.ended, what, n)
				}
				c[k.id] += n
			}
			return c
		}
		onc, drained := perID(rec.completed, "passed to OnComplete"), perID(rec.drained, "drained")
		for k := range rec.completed {
			if rec.drained[k] == 0 {
				st.fail("%s: completion of %s (ended %d) went to OnComplete but was never drained", reg.name, k.id, k.ended)
			}
		}
		for k := range rec.drained {
			if rec.completed[k] == 0 {
				st.fail("%s: completion of %s (ended %d) was drained but never went to OnComplete", reg.name, k.id, k.ended)
			}
		}
		for id := range fin {
			if bg[id] != onc[id] || bg[id] != drained[id] {
				st.fail("%s: %s: %d background runs, %d OnComplete, %d drained; want equal", reg.name, id, bg[id], onc[id], drained[id])
			}
		}
		rec.mu.Unlock()
	}

	// No process of any job is alive, whatever it did.
	st.mu.Lock()
	pids := st.pids
	for id := range st.listed {
		if st.ids[id] == nil {
			t.Errorf("List showed %s, which no launch returned", id)
		}
	}
	st.mu.Unlock()
	// PIDs wrap (pid_max is often 32768) and other programs start
	// sessions too, so a process counts as a job's only if it carries the
	// mark that every job's environment holds: a job's processes inherit
	// it, whichever session or group they moved to.
	var live int
	for _, p := range procTable() {
		if p.state == 'Z' || p.state == 'X' {
			continue
		}
		env, err := os.ReadFile(fmt.Sprintf("/proc/%d/environ", p.pid))
		if err != nil || !slices.Contains(strings.Split(string(env), "\x00"), st.mark) {
			continue
		}
		live++
		cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.pid))
		t.Errorf("process %d (%s, session %d, job session: %v) of a job is alive after Close: %q; want none",
			p.pid, string(p.state), p.session, pids[p.session], bytes.ReplaceAll(cmd, []byte{0}, []byte{' '}))
	}

	jobs := st.main.launches.Load() + st.bad.launches.Load() + st.queue.launches.Load()
	t.Logf("jobs: %d runs (%d processes, %d distinct IDs, pool %d), %d joins, %d too-many, %d ErrClosed, %d ctx ended; %d inline, %d detached (%d of them already done), %d progress calls",
		jobs, processes, len(st.ids), len(st.pool), st.n.joins.Load(), st.n.tooMany.Load(), st.n.closedErrs.Load(), st.n.ctxErrs.Load(),
		st.n.inline.Load(), st.n.detached.Load(), st.n.detachedDone.Load(), st.n.progress.Load())
	t.Logf("ends: exited %d, cancelled %d, timed out %d, failed %d (bad shell %d, dir removed %d); %d MiB printed",
		states[bgjob.Exited], states[bgjob.Cancelled], states[bgjob.TimedOut], states[bgjob.Failed], kinds[kindBadShell], kinds[kindDirGone], bytesTotal>>20)
	t.Logf("faults injected: %d (self-kills %d, self-terms %d, leftover trees %d, timeouts %d, cancels %d, spawn failures %d)",
		faults, kinds[kindSelfKill], kinds[kindSelfTerm], leftovers, states[bgjob.TimedOut], states[bgjob.Cancelled], states[bgjob.Failed])
	t.Logf("escapes: %d jobs whose processes left their group or session, %d checked at their end: none lived on unless reported above",
		st.n.escapes.Load(), st.n.escapeChecks.Load())
	t.Logf("queue: %d runs on the registry with %d slots, %d launches queued (%d snapshots of queued jobs, %d RunForeground calls detached while queued, %d Waits after Start that ran out while the job had not run its deadline's worth); %d processes listed in running jobs' snapshots",
		st.queue.launches.Load(), stressSlots, st.n.queued.Load(), st.n.queuedSeen.Load(), st.n.queuedDetached.Load(), st.n.queuedLong.Load(), st.n.listedProcs.Load())
	t.Logf("leaks: %d live processes of jobs (of %d job sessions) after Close", live, len(pids))
	t.Logf("polls: %d Status, %d Read (%d bytes checked, %d past the end), %d Wait (%d timed out), %d walks, %d Cancel, %d List, %d drains, %d Readmit, %d not found, %d admissions",
		st.n.status.Load(), st.n.reads.Load(), st.n.readBytes.Load(), st.n.readInvalid.Load(), st.n.waits.Load(), st.n.waitOut.Load(), st.n.walks.Load(),
		st.n.cancels.Load(), st.n.lists.Load(), st.n.drains.Load(), st.n.readmits.Load(), st.n.notFound.Load(), st.n.admits.Load())
	t.Logf("first hour: %d ReadWait (%d timed out), %d Follow (%d to EOF, %d timed out, %d bytes checked), %d NextCompletion (%d timed out), %d view lookups (%d of another session, all not found), %d view launches",
		st.fh.readWaits.Load(), st.fh.readWaitOut.Load(), st.fh.follows.Load(), st.fh.followEOF.Load(), st.fh.followOut.Load(), st.fh.followBytes.Load(),
		st.fh.nexts.Load(), st.fh.nextOut.Load(), st.fh.views.Load(), st.fh.viewMisses.Load(), st.fh.viewLaunches.Load())
	st.verifyWatches()
	st.logConversations()
	if st.failures.Load() > 30 {
		t.Errorf("%d failures in all (the first 30 shown)", st.failures.Load())
	}
}

func stressCategory(s bgjob.State, code int) bgjob.Category {
	switch {
	case s == bgjob.Exited && code != 0:
		return bgjob.CategoryCommand
	case s == bgjob.TimedOut:
		return bgjob.CategoryTimeout
	case s == bgjob.Cancelled:
		return bgjob.CategoryCancelled
	case s == bgjob.Failed:
		return bgjob.CategorySpawn
	}
	return bgjob.CategoryNone
}

// stressWarmUp runs one job of each shape through a throwaway registry.
func stressWarmUp(t *testing.T) {
	r, err := bgjob.New(bgjob.Config{KillGrace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 300 & cat", Stdin: "x"})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, r, s.ID)
	// A job without stdin opens the /dev/null that every such job shares.
	if _, err := r.RunForeground(ctxT(t), bgjob.Spec{Command: "true"}, bgjob.Foreground{}); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
}

// stressFDs lists the test process's open file descriptors with what they
// point at. Off Linux it returns nil.
func stressFDs() []string {
	if runtime.GOOS != "linux" {
		return nil
	}
	ents, _ := os.ReadDir("/proc/self/fd")
	var out []string
	for _, e := range ents {
		// The descriptor of the directory read itself is closed by now.
		if target, err := os.Readlink("/proc/self/fd/" + e.Name()); err == nil {
			out = append(out, e.Name()+"->"+target)
		}
	}
	return out
}
