//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

func TestNextCompletion(t *testing.T) {
	t.Run("blocks-until-a-job-of-the-session-ends", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{})
		gate := filepath.Join(t.TempDir(), "gate")
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: gated(gate, "", "done\n"), Session: "s"})
		if err != nil {
			t.Fatal(err)
		}
		// Another session's end does not wake it with the wrong one.
		other, err := r.Start(ctxT(t), bgjob.Spec{Command: "exit 3", Session: "other"})
		if err != nil {
			t.Fatal(err)
		}
		wait(t, r, other.ID)
		got := make(chan bgjob.Completion, 1)
		go func() {
			c, err := r.NextCompletion(ctxT(t), "s")
			if err != nil {
				t.Errorf("NextCompletion: %v", err)
			}
			got <- c
		}()
		touch(t, gate)
		c := <-got
		if c.ID != s.ID || c.Session != "s" || c.State != bgjob.Exited || c.ExitCode != 0 || c.Ended.IsZero() {
			t.Errorf("got %+v; want the end of %s", c, s.ID)
		}
		if cs := r.Completions("s"); len(cs) != 0 {
			t.Errorf("Completions after NextCompletion: %v; want it delivered once", cs)
		}
		if c, err := r.NextCompletion(ctxT(t), "other"); err != nil || c.ID != other.ID || c.ExitCode != 3 {
			t.Errorf("other session: %+v, %v", c, err)
		}
	})
	t.Run("oldest-first", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{})
		var ids []bgjob.ID
		for i := range 3 {
			s, err := r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("exit %d", i)})
			if err != nil {
				t.Fatal(err)
			}
			wait(t, r, s.ID)
			ids = append(ids, s.ID)
		}
		for i, id := range ids {
			c, err := r.NextCompletion(ctxT(t), "")
			if err != nil || c.ID != id {
				t.Errorf("completion %d: %+v, %v; want %s", i, c, err, id)
			}
		}
	})
	t.Run("ctx-end", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{})
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Millisecond)
		defer cancel()
		_, err := r.NextCompletion(ctx, "")
		mustErr(t, err, context.DeadlineExceeded)
	})
	t.Run("close-ends-the-wait", func(t *testing.T) {
		r, err := bgjob.New(bgjob.Config{KillGrace: 100 * time.Millisecond})
		if err != nil {
			t.Fatal(err)
		}
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 300"})
		if err != nil {
			t.Fatal(err)
		}
		errs := make(chan error, 2)
		var got sync.Map
		for range 2 {
			go func() {
				c, err := r.NextCompletion(ctxT(t), "")
				if err == nil {
					got.Store(c.ID, c.State)
				}
				errs <- err
			}()
		}
		if err := r.Close(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		// One waiter gets the job stopped by Close; the other is told
		// that nothing more will come.
		e1, e2 := <-errs, <-errs
		if (e1 == nil) == (e2 == nil) || !(errors.Is(e1, bgjob.ErrClosed) || errors.Is(e2, bgjob.ErrClosed)) {
			t.Errorf("waiters got %v and %v; want one completion and one ErrClosed", e1, e2)
		}
		if st, ok := got.Load(s.ID); !ok || st != bgjob.Cancelled {
			t.Errorf("completion of %s: %v, %v; want cancelled", s.ID, st, ok)
		}
		_, err = r.NextCompletion(ctxT(t), "")
		mustErr(t, err, bgjob.ErrClosed)
	})
}

// Completions, NextCompletion and OnComplete callers racing over the same
// queue: each completion is delivered once, to one of the first two, and
// always to OnComplete.
func TestNextCompletionDeliversOnce(t *testing.T) {
	var mu sync.Mutex
	onComplete := map[bgjob.ID]int{}
	r := newRegistry(t, bgjob.Config{MaxRunning: 100, OnComplete: func(c bgjob.Completion) {
		mu.Lock()
		onComplete[c.ID]++
		mu.Unlock()
	}})
	const jobs = 60
	delivered := map[bgjob.ID]int{}
	var dmu sync.Mutex
	deliver := func(cs ...bgjob.Completion) {
		dmu.Lock()
		defer dmu.Unlock()
		for _, c := range cs {
			delivered[c.ID]++
		}
	}
	ctx, stop := context.WithCancel(ctxT(t))
	var wg sync.WaitGroup
	for i := range 6 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if i%2 == 0 {
					deliver(r.Completions("")...)
					time.Sleep(time.Millisecond) // a poller's pace
					continue
				}
				if c, err := r.NextCompletion(ctx, ""); err == nil {
					deliver(c)
				}
			}
		}()
	}
	var ids []bgjob.ID
	for i := range jobs {
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("exit %d; job %d", i%3, i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	for _, id := range ids {
		wait(t, r, id)
	}
	for end := time.Now().Add(deadline); ; time.Sleep(time.Millisecond) {
		dmu.Lock()
		n := len(delivered)
		dmu.Unlock()
		if n == jobs || time.Now().After(end) {
			break
		}
	}
	stop()
	wg.Wait()
	deliver(r.Completions("")...)
	for _, id := range ids {
		if delivered[id] != 1 || onComplete[id] != 1 {
			t.Errorf("%s: delivered %d times, OnComplete %d; want once each", id, delivered[id], onComplete[id])
		}
	}
}

// Snapshot.Err is an error wrapping ErrSpawn for a job that never ran, and
// nil for every job that ran, however it ended.
func TestSnapshotErr(t *testing.T) {
	r := newRegistry(t, bgjob.Config{KillGrace: 100 * time.Millisecond})
	bad := newRegistry(t, bgjob.Config{Shell: []string{"/no/such/shell", "-c"}})
	ctx := ctxT(t)
	for _, tc := range []struct {
		name    string
		reg     *bgjob.Registry
		spec    bgjob.Spec
		cancel  bool
		wantErr bool
	}{
		{"exited-zero", r, bgjob.Spec{Command: "true"}, false, false},
		{"non-zero-exit-is-no-error", r, bgjob.Spec{Command: "exit 7"}, false, false},
		{"timeout-is-no-error", r, bgjob.Spec{Command: "sleep 300", Timeout: 50 * time.Millisecond}, false, false},
		{"cancel-is-no-error", r, bgjob.Spec{Command: "sleep 300"}, true, false},
		{"missing-shell-never-ran", bad, bgjob.Spec{Command: "true"}, false, true},
		{"missing-program-never-ran", r, bgjob.Spec{Args: []string{"/no/such/program"}}, false, true},
		{"program-not-in-path-never-ran", r, bgjob.Spec{Args: []string{"no-such-program-bgjob"}}, false, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := tc.reg.Start(ctx, tc.spec)
			if err != nil {
				t.Fatalf("Start: %v; want a job, even one that never runs", err)
			}
			if tc.cancel {
				s, err = tc.reg.Cancel(s.ID)
			} else {
				s, err = tc.reg.Wait(ctx, s.ID)
			}
			if err != nil {
				t.Fatal(err)
			}
			snaps := []bgjob.Snapshot{s}
			if !tc.cancel {
				res, err := tc.reg.RunForeground(ctx, tc.spec, bgjob.Foreground{})
				if err != nil || res.Detached {
					t.Fatalf("RunForeground: %+v, %v", res, err)
				}
				snaps = append(snaps, res.Snapshot)
			}
			for _, got := range snaps {
				err := got.Err()
				if tc.wantErr {
					mustErr(t, err, bgjob.ErrSpawn)
					if got.State != bgjob.Failed || got.PID != 0 {
						t.Errorf("state %v, PID %d; want failed, 0", got.State, got.PID)
					}
					continue
				}
				if err != nil {
					t.Errorf("Err() = %v for a %v job; want nil", err, got.State)
				}
			}
		})
	}
}
