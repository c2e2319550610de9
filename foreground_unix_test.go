//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

func TestRunForegroundInline(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	res, err := r.RunForeground(ctxT(t), bgjob.Spec{Command: "echo hi; exit 2"}, bgjob.Foreground{})
	if err != nil {
		t.Fatal(err)
	}
	if res.Detached || res.State != bgjob.Exited || res.ExitCode != 2 || res.Output.Text != "hi\n" {
		t.Errorf("got %+v; want exited 2 with hi, inline", res)
	}
	// A job only foreground callers held, finished inline: forgotten.
	if _, err := r.Status(res.ID); !errors.Is(err, bgjob.ErrNotFound) {
		t.Errorf("Status of a foreground-only job: %v; want ErrNotFound", err)
	}
	if c := r.Completions(""); len(c) != 0 {
		t.Errorf("completions %v; want none", c)
	}
	if l := r.List(""); len(l) != 0 {
		t.Errorf("List %v; want none", l)
	}
	if n := bgjob.Retained(r); n != 0 {
		t.Errorf("%d retained; want 0", n)
	}
}

func TestRunForegroundDetachesAtSoftCap(t *testing.T) {
	var completed atomic.Int32
	r := newRegistry(t, bgjob.Config{OnComplete: func(bgjob.Completion) { completed.Add(1) }})
	res, err := r.RunForeground(ctxT(t), bgjob.Spec{Command: "sleep 0.3; echo late", Session: "s"}, bgjob.Foreground{SoftCap: 50 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Detached || res.State != bgjob.Running {
		t.Fatalf("got %v detached %v; want running, detached", res.State, res.Detached)
	}
	s := wait(t, r, res.ID)
	if s.State != bgjob.Exited || s.Output.Text != "late\n" {
		t.Errorf("after detach: %v %q", s.State, s.Output.Text)
	}
	c := r.Completions("s")
	if len(c) != 1 || c[0].ID != res.ID || c[0].State != bgjob.Exited {
		t.Errorf("completions %v; want one for %s", c, res.ID)
	}
	if c := r.Completions("s"); len(c) != 0 {
		t.Errorf("second drain %v; want empty", c)
	}
	if n := completed.Load(); n != 1 {
		t.Errorf("OnComplete called %d times; want 1", n)
	}
}

func TestRunForegroundContextDetachesEarly(t *testing.T) {
	r := newRegistry(t, bgjob.Config{ProgressInterval: 10 * time.Millisecond})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	begin := time.Now()
	res, err := r.RunForeground(ctx, bgjob.Spec{Command: "sleep 300"}, bgjob.Foreground{
		SoftCap:    time.Hour,
		OnProgress: func(bgjob.Snapshot) { cancel() },
	})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Detached {
		t.Fatalf("not detached: %+v", res)
	}
	if took := time.Since(begin); took > time.Minute {
		t.Errorf("detached after %v; the soft cap is an hour, ctx ended at the first progress tick", took)
	}
	// The job goes on, pollable.
	if s, err := r.Status(res.ID); err != nil || s.State != bgjob.Running {
		t.Errorf("Status after detach: %v %v", s.State, err)
	}
}

// The caller that launched a job watches it inline; a ctx that ends in
// another goroutine must still interrupt that wait at once.
func TestRunForegroundContextFromElsewhere(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// JobStarted runs in the caller's goroutine: cancel from another one,
	// once the process exists.
	started := make(chan struct{})
	r := newRegistry(t, bgjob.Config{Telemetry: &telemetryRecorder{onStart: func(bgjob.Event) { close(started) }}})
	go func() {
		select {
		case <-started:
		case <-ctx.Done():
		}
		cancel()
	}()
	begin := time.Now()
	res, err := r.RunForeground(ctx, bgjob.Spec{Command: "echo started; sleep 300"}, bgjob.Foreground{SoftCap: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Detached || res.State != bgjob.Running {
		t.Fatalf("got %v detached %v; want running, detached", res.State, res.Detached)
	}
	if took := time.Since(begin); took > deadline {
		t.Errorf("detached after %v", took)
	}
	// The job's own goroutine took over: it reads on and can be cancelled.
	waitOutput(t, r, res.ID, "started", 1)
	if _, err := r.Cancel(res.ID); err != nil {
		t.Fatal(err)
	}
	s := wait(t, r, res.ID)
	if s.State != bgjob.Cancelled || s.Output.Text != "started\n" {
		t.Errorf("got %v %q; want cancelled with %q", s.State, s.Output.Text, "started\n")
	}
	assertGone(t, s)
}

// A host that recovers from a panicking OnProgress keeps a job that runs
// on, supervised and pollable, and Close leaves nothing behind.
func TestRunForegroundProgressPanic(t *testing.T) {
	started := make(chan bgjob.Event, 1)
	r := newRegistry(t, bgjob.Config{
		ProgressInterval: 10 * time.Millisecond,
		Telemetry:        &telemetryRecorder{onStart: func(e bgjob.Event) { started <- e }},
	})
	func() {
		defer func() {
			if recover() == nil {
				t.Error("OnProgress's panic did not reach the caller")
			}
		}()
		r.RunForeground(ctxT(t), bgjob.Spec{Command: "sleep 0.2; echo after"}, bgjob.Foreground{
			OnProgress: func(bgjob.Snapshot) { panic("progress") },
		})
	}()
	e := <-started
	s := wait(t, r, e.ID)
	if s.State != bgjob.Exited || s.Output.Text != "after\n" {
		t.Errorf("got %v %q; want exited with %q", s.State, s.Output.Text, "after\n")
	}
	if c := r.Completions(""); len(c) != 1 || c[0].ID != e.ID {
		t.Errorf("completions %v; want the job's", c)
	}
}

// OnProgress is user code: while it runs, the job is still supervised
// (its output read, its timeouts kept), and it may call Cancel.
func TestRunForegroundBusyProgress(t *testing.T) {
	started := make(chan bgjob.Event, 1)
	r := newRegistry(t, bgjob.Config{
		ProgressInterval: 20 * time.Millisecond,
		Telemetry:        &telemetryRecorder{onStart: func(e bgjob.Event) { started <- e }},
	})
	// The first progress report waits until the job's output shows that
	// it was read meanwhile; an idle limit of 300ms would end a job
	// whose pipe nobody reads.
	first := true
	res, err := r.RunForeground(ctxT(t), bgjob.Spec{
		Command:     "for i in 1 2 3 4 5 6 7 8; do echo line$i; sleep 0.05; done",
		IdleTimeout: 300 * time.Millisecond,
	}, bgjob.Foreground{OnProgress: func(bgjob.Snapshot) {
		if !first {
			return
		}
		first = false
		e := <-started
		waitOutput(t, r, e.ID, "line8", 1)
	}})
	if err != nil {
		t.Fatal(err)
	}
	if res.State != bgjob.Exited || !strings.Contains(res.Output.Text, "line8") {
		t.Errorf("got %v %q (%s); want exited with all 8 lines", res.State, res.Output.Text, res.Reason)
	}

	// Cancel from inside OnProgress returns, and so does the call.
	cancelled := false
	res, err = r.RunForeground(ctxT(t), bgjob.Spec{Command: "sleep 300"}, bgjob.Foreground{OnProgress: func(bgjob.Snapshot) {
		if cancelled {
			return
		}
		cancelled = true
		e := <-started
		if _, err := r.Cancel(e.ID); err != nil {
			t.Errorf("Cancel from OnProgress: %v", err)
		}
	}})
	if err != nil || res.State != bgjob.Cancelled {
		t.Errorf("got %v, %v; want cancelled", res.State, err)
	}
	assertGone(t, res.Snapshot)
}

// A hook that panics in the goroutine of a caller who recovers (the
// Admitter of a job's end or JobStarted, both run by the caller that
// launched the job) leaves a working registry: the job is finished or
// watched, nothing stays held, and Close returns.
func TestHookPanicsLeaveTheRegistryWorking(t *testing.T) {
	recovered := func(t *testing.T, f func()) {
		t.Helper()
		defer func() {
			if recover() == nil {
				t.Error("the hook's panic did not reach the caller")
			}
		}()
		f()
	}
	closes := func(t *testing.T, r *bgjob.Registry) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("Close after the panic: %v", err)
		}
	}

	t.Run("admitter of an inline job", func(t *testing.T) {
		var panicked atomic.Bool
		r, err := bgjob.New(bgjob.Config{Admitter: bgjob.AdmitterFunc(func(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
			if !req.Partial && panicked.CompareAndSwap(false, true) {
				panic("admitter")
			}
			return bgjob.Admitted{Text: req.Text}, nil
		})})
		if err != nil {
			t.Fatal(err)
		}
		spec := bgjob.Spec{Command: "echo boom"}
		recovered(t, func() { r.RunForeground(ctxT(t), spec, bgjob.Foreground{}) })
		if n := r.Running(); n != 0 {
			t.Errorf("%d running after the panic; want 0", n)
		}
		// The same launch again is a new run, not a join of the
		// result nobody collected.
		res, err := r.RunForeground(ctxT(t), spec, bgjob.Foreground{})
		if err != nil || res.Joined || res.State != bgjob.Exited || res.Output.Text != "boom\n" {
			t.Errorf("again: %v %q joined %v %v; want a new run", res.State, res.Output.Text, res.Joined, err)
		}
		closes(t, r)
	})

	t.Run("admitter of a job that never started", func(t *testing.T) {
		r, err := bgjob.New(bgjob.Config{
			Shell: []string{"/nonexistent/sh", "-c"},
			Admitter: bgjob.AdmitterFunc(func(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
				if !req.Partial {
					panic("admitter")
				}
				return bgjob.Admitted{Text: req.Text}, nil
			}),
		})
		if err != nil {
			t.Fatal(err)
		}
		recovered(t, func() { r.Start(ctxT(t), bgjob.Spec{Command: "true"}) })
		recovered(t, func() { r.RunForeground(ctxT(t), bgjob.Spec{Command: "true"}, bgjob.Foreground{}) })
		if n := r.Running(); n != 0 {
			t.Errorf("%d running after the panics; want 0", n)
		}
		closes(t, r)
	})

	t.Run("JobStarted", func(t *testing.T) {
		ids := make(chan bgjob.ID, 2)
		r, err := bgjob.New(bgjob.Config{Telemetry: &telemetryRecorder{onStart: func(e bgjob.Event) {
			ids <- e.ID
			panic("telemetry")
		}}})
		if err != nil {
			t.Fatal(err)
		}
		recovered(t, func() { r.Start(ctxT(t), bgjob.Spec{Command: "sleep 0.1; echo bg"}) })
		recovered(t, func() {
			r.RunForeground(ctxT(t), bgjob.Spec{Command: "sleep 0.1; echo fg"}, bgjob.Foreground{})
		})
		// Both jobs run on, watched and pollable, to their end.
		for _, want := range []string{"bg\n", "fg\n"} {
			s := wait(t, r, <-ids)
			if s.State != bgjob.Exited || s.Output.Text != want {
				t.Errorf("got %v %q; want exited with %q", s.State, s.Output.Text, want)
			}
		}
		if c := r.Completions(""); len(c) != 2 {
			t.Errorf("completions %v; want both jobs'", c)
		}
		closes(t, r)
	})
}

func TestRunForegroundProgress(t *testing.T) {
	const interval = 50 * time.Millisecond
	r := newRegistry(t, bgjob.Config{ProgressInterval: interval})
	var mu sync.Mutex
	var ticks []time.Duration
	var snaps []bgjob.Snapshot
	returned := false
	res, err := r.RunForeground(ctxT(t), bgjob.Spec{Command: "echo started; sleep 0.4"}, bgjob.Foreground{
		OnProgress: func(s bgjob.Snapshot) {
			mu.Lock()
			defer mu.Unlock()
			if returned {
				t.Error("OnProgress called after RunForeground returned")
			}
			ticks = append(ticks, time.Since(s.Started))
			snaps = append(snaps, s)
		},
	})
	mu.Lock()
	returned = true
	mu.Unlock()
	if err != nil || res.Detached {
		t.Fatalf("%+v %v", res, err)
	}
	if len(ticks) == 0 {
		t.Fatal("no progress during a 400ms wait with a 50ms interval")
	}
	for i, d := range ticks {
		// The job starts a moment after the call, whose start the
		// intervals count from.
		if want := interval*time.Duration(i+1) - 5*time.Millisecond; d < want {
			t.Errorf("tick %d at %v of the job's age; want at least %v", i, d, want)
		}
	}
	// Each report is the running job's snapshot, output included.
	for i, s := range snaps {
		if s.ID != res.ID || s.State != bgjob.Running || s.ExitCode != -1 || !s.Ended.IsZero() {
			t.Errorf("report %d: %s %v exit %d ended %v; want job %s running", i, s.ID, s.State, s.ExitCode, s.Ended, res.ID)
		}
		if !strings.HasPrefix("started\n", s.Output.Text) || (i > 0 && len(s.Output.Text) < len(snaps[i-1].Output.Text)) {
			t.Errorf("report %d: output %q; want the job's output so far", i, s.Output.Text)
		}
	}
}

// Foreground.Interval sets the interval of one call, whatever
// Config.ProgressInterval says; zero keeps the Config's.
func TestRunForegroundInterval(t *testing.T) {
	for _, tc := range []struct {
		name     string
		config   time.Duration
		interval time.Duration
		want     bool // some report comes within the 300ms run
	}{
		{"interval-overrides-a-long-config", time.Hour, 20 * time.Millisecond, true},
		{"long-interval-overrides-a-short-config", 20 * time.Millisecond, time.Hour, false},
		{"zero-keeps-the-config", 20 * time.Millisecond, 0, true},
		{"negative-keeps-the-config", time.Hour, -time.Second, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRegistry(t, bgjob.Config{ProgressInterval: tc.config})
			var n atomic.Int64
			res, err := r.RunForeground(ctxT(t), bgjob.Spec{Command: "sleep 0.3"}, bgjob.Foreground{
				Interval: tc.interval, OnProgress: func(bgjob.Snapshot) { n.Add(1) },
			})
			if err != nil || res.Detached {
				t.Fatalf("%+v %v", res, err)
			}
			if got := n.Load() > 0; got != tc.want {
				t.Errorf("%d reports; want some: %v", n.Load(), tc.want)
			}
		})
	}
}

func TestRunForegroundJoining(t *testing.T) {
	t.Run("8-callers-5-rounds-all-get-the-output", func(t *testing.T) {
		tel := &telemetryRecorder{}
		r := newRegistry(t, bgjob.Config{Telemetry: tel})
		for round := range 5 {
			var wg sync.WaitGroup
			for range 8 {
				wg.Add(1)
				go func() {
					defer wg.Done()
					spec := bgjob.Spec{Command: fmt.Sprintf("echo round %d", round)}
					res, err := r.RunForeground(context.Background(), spec, bgjob.Foreground{})
					if err != nil || res.Detached || res.Output.Text != fmt.Sprintf("round %d\n", round) {
						t.Errorf("round %d: %+v %v", round, res, err)
					}
				}()
			}
			wg.Wait()
		}
		if started, finished := tel.counts(); started != finished || started < 5 || started > 40 {
			t.Errorf("%d started, %d finished", started, finished)
		}
		if r.Running() != 0 || bgjob.Retained(r) != 0 || len(r.List("")) != 0 {
			t.Errorf("foreground-only jobs left behind")
		}
	})
	t.Run("a-call-in-the-window-before-the-first-read-joins", func(t *testing.T) {
		tel := &telemetryRecorder{}
		r := newRegistry(t, bgjob.Config{Telemetry: tel})
		spec := bgjob.Spec{Command: "echo $$"}
		var second bgjob.Result
		var first atomic.Bool
		bgjob.SetHooks(r, nil, func(bgjob.ID) {
			// The first caller's job has ended, and it has not yet
			// taken its result: an identical call now joins it. (The
			// hook runs for that call too; only the first acts.)
			if first.Swap(true) {
				return
			}
			var err error
			second, err = r.RunForeground(context.Background(), spec, bgjob.Foreground{})
			if err != nil {
				t.Error(err)
			}
		})
		res, err := r.RunForeground(ctxT(t), spec, bgjob.Foreground{})
		if err != nil {
			t.Fatal(err)
		}
		if !second.Joined || second.PID != res.PID || second.Output.Text != res.Output.Text {
			t.Errorf("second caller: %+v; want it joined to %+v", second, res)
		}
		if started, _ := tel.counts(); started != 1 {
			t.Errorf("%d processes; want 1", started)
		}
		if _, err := r.Status(res.ID); !errors.Is(err, bgjob.ErrNotFound) {
			t.Errorf("after both read: %v; want ErrNotFound", err)
		}
	})
	t.Run("joining-a-started-job-leaves-it-pollable", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{})
		spec := bgjob.Spec{Command: "sleep 0.2; echo ok", Session: "s"}
		s, err := r.Start(ctxT(t), spec)
		if err != nil {
			t.Fatal(err)
		}
		res, err := r.RunForeground(ctxT(t), spec, bgjob.Foreground{})
		if err != nil || !res.Joined || res.Detached || res.Output.Text != "ok\n" {
			t.Fatalf("%+v %v", res, err)
		}
		if st, err := r.Status(s.ID); err != nil || st.Output.Text != "ok\n" {
			t.Errorf("Status: %+v %v", st, err)
		}
		if c := r.Completions("s"); len(c) != 1 {
			t.Errorf("completions %v; want 1", c)
		}
	})
}

func TestWaitContext(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, _ := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 300"})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	got, err := r.Wait(ctx, s.ID)
	if !errors.Is(err, context.DeadlineExceeded) || got.State != bgjob.Running || got.ID != s.ID {
		t.Errorf("Wait: %v %v; want the running snapshot and DeadlineExceeded", got.State, err)
	}
	if _, err := r.Wait(ctxT(t), "job_ffffffffffffffff"); !errors.Is(err, bgjob.ErrNotFound) {
		t.Errorf("Wait(unknown): %v", err)
	}
}

// finishedJob starts a job and waits for its end. With a missing shell it
// fails at once: the quickest way to make a finished job.
func finishedJob(t *testing.T, r *bgjob.Registry, name string) bgjob.ID {
	t.Helper()
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: name})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, r, s.ID)
	return s.ID
}

func TestRetention(t *testing.T) {
	missing := []string{"/no/such/shell"}
	t.Run("max-jobs-oldest-first", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{Shell: missing, Retention: bgjob.Retention{MaxJobs: 2}})
		a, b, c := finishedJob(t, r, "a"), finishedJob(t, r, "b"), finishedJob(t, r, "c")
		if _, err := r.Status(a); !errors.Is(err, bgjob.ErrNotFound) {
			t.Errorf("oldest: %v; want evicted", err)
		}
		for _, id := range []bgjob.ID{b, c} {
			if _, err := r.Status(id); err != nil {
				t.Errorf("%s: %v; want kept", id, err)
			}
		}
	})
	t.Run("max-bytes", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{Retention: bgjob.Retention{MaxBytes: 150}})
		var ids []bgjob.ID
		for i := range 3 {
			s, _ := r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("printf '%%0100d' %d", i)})
			wait(t, r, s.ID)
			ids = append(ids, s.ID)
		}
		if _, err := r.Status(ids[0]); !errors.Is(err, bgjob.ErrNotFound) {
			t.Errorf("oldest: %v; want evicted", err)
		}
		if _, err := r.Status(ids[1]); !errors.Is(err, bgjob.ErrNotFound) {
			t.Errorf("second: %v; want evicted (200 bytes > 150)", err)
		}
		if _, err := r.Status(ids[2]); err != nil {
			t.Errorf("newest: %v; want kept", err)
		}
	})
	t.Run("ttl-from-the-end-synthetic-clock", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{Shell: missing, Retention: bgjob.Retention{TTL: time.Minute}})
		var mu sync.Mutex
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
		bgjob.SetClock(r, func() time.Time { mu.Lock(); defer mu.Unlock(); return now })
		advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
		a := finishedJob(t, r, "a")
		advance(40 * time.Second)
		b := finishedJob(t, r, "b")
		advance(30 * time.Second) // a ended 70s ago, b 30s ago
		c := finishedJob(t, r, "c")
		if _, err := r.Status(a); !errors.Is(err, bgjob.ErrNotFound) {
			t.Errorf("a: %v; want expired", err)
		}
		if _, err := r.Status(b); err != nil {
			t.Errorf("b: %v; want kept", err)
		}
		advance(time.Hour)
		if _, err := r.Status(b); !errors.Is(err, bgjob.ErrNotFound) {
			t.Errorf("b an hour later: %v; want expired", err)
		}
		if _, err := r.Status(c); err != nil {
			t.Errorf("c, the newest: %v; want always kept", err)
		}
	})
}

func TestUnreadPollableResultIsNeverEvicted(t *testing.T) {
	r := newRegistry(t, bgjob.Config{Retention: bgjob.Retention{MaxJobs: -1, MaxBytes: -1, TTL: -1}})
	spec := bgjob.Spec{Command: "sleep 0.2; echo mine"}
	// A Start makes the job pollable; a RunForeground joins it and holds
	// its result until it reads it.
	s, err := r.Start(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	var first atomic.Bool
	var inWindow bgjob.Snapshot
	var inWindowErr error
	bgjob.SetHooks(r, nil, func(id bgjob.ID) {
		if first.Swap(true) {
			return
		}
		for i := range 3 { // newer finished jobs, with every limit at zero
			o, _ := r.Start(context.Background(), bgjob.Spec{Command: fmt.Sprintf("echo %d", i)})
			wait(t, r, o.ID)
		}
		inWindow, inWindowErr = r.Status(id)
	})
	res, err := r.RunForeground(ctxT(t), spec, bgjob.Foreground{})
	if err != nil || !res.Joined || res.Output.Text != "mine\n" {
		t.Fatalf("%+v %v", res, err)
	}
	if inWindowErr != nil || inWindow.Output.Text != "mine\n" {
		t.Errorf("unread result during pruning: %v %v; want kept", inWindow.Output.Text, inWindowErr)
	}
	if _, err := r.Status(s.ID); !errors.Is(err, bgjob.ErrNotFound) {
		t.Errorf("once read and older than the newest: %v; want evicted", err)
	}
	if n := bgjob.Retained(r); n != 1 {
		t.Errorf("%d retained with every limit at zero; want only the newest", n)
	}
}

func TestCompletionsDeliveredOnceUnderConcurrentDrains(t *testing.T) {
	r := newRegistry(t, bgjob.Config{Retention: bgjob.Retention{MaxJobs: 100}})
	const jobs = 30
	var ids []bgjob.ID
	for i := range jobs {
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("exit %d # job %d", i%4, i), Session: "s"})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	var mu sync.Mutex
	seen := map[bgjob.ID]int{}
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				for _, c := range r.Completions("s") {
					mu.Lock()
					seen[c.ID]++
					mu.Unlock()
				}
			}
		}()
	}
	for _, id := range ids {
		wait(t, r, id)
	}
	close(stop)
	wg.Wait()
	for _, c := range r.Completions("s") {
		seen[c.ID]++
	}
	if len(seen) != jobs {
		t.Errorf("%d jobs' completions delivered; want %d", len(seen), jobs)
	}
	for id, n := range seen {
		if n != 1 {
			t.Errorf("%s delivered %d times; want once", id, n)
		}
	}
}
