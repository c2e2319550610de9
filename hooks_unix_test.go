//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// reentry is a registry whose hooks each call back into it once, as a
// test case says.
type reentry struct {
	r    *bgjob.Registry
	hook string // the hook that calls back: started, finished, complete, admit
	call func(r *bgjob.Registry, id bgjob.ID) error
	once atomic.Bool
	done chan error // the call's result
}

func (re *reentry) maybe(hook string, id bgjob.ID) {
	if hook != re.hook || !re.once.CompareAndSwap(false, true) {
		return
	}
	re.done <- re.call(re.r, id)
}

func (re *reentry) JobStarted(e bgjob.Event)  { re.maybe("started", e.ID) }
func (re *reentry) JobFinished(e bgjob.Event) { re.maybe("finished", e.ID) }

// Every hook may call every blocking method of the registry, on its own
// job too, and nothing deadlocks: the call returns, the job ends, and the
// registry closes.
func TestHooksCallBack(t *testing.T) {
	spec := bgjob.Spec{Command: "echo hi; sleep 0.2"}
	calls := []struct {
		name string
		call func(r *bgjob.Registry, id bgjob.ID) error
		// ownAdmit: what the call gives from the job's own final
		// Admitter, the one place where it cannot wait for the job.
		ownAdmit error
	}{
		{"wait-own", func(r *bgjob.Registry, id bgjob.ID) error {
			s, err := r.Wait(context.Background(), id)
			if err == nil && !s.State.Done() {
				return errors.New("Wait returned a running job")
			}
			return err
		}, bgjob.ErrInvalidArgument},
		{"cancel-own", func(r *bgjob.Registry, id bgjob.ID) error {
			_, err := r.Cancel(id)
			return err
		}, nil},
		{"run-foreground-same", func(r *bgjob.Registry, id bgjob.ID) error {
			_, err := r.RunForeground(context.Background(), spec, bgjob.Foreground{SoftCap: time.Minute})
			return err
		}, nil},
		{"wait-other", func(r *bgjob.Registry, id bgjob.ID) error {
			s, err := r.Start(context.Background(), bgjob.Spec{Command: "true", Unique: true})
			if err != nil {
				return err
			}
			_, err = r.Wait(context.Background(), s.ID)
			return err
		}, nil},
		{"close", func(r *bgjob.Registry, id bgjob.ID) error {
			return r.Close(context.Background())
		}, nil},
		{"follow-own", func(r *bgjob.Registry, id bgjob.ID) error {
			// To the end: from JobStarted it supervises the job there.
			out, err := io.ReadAll(r.Follow(context.Background(), id, 0))
			if err == nil && string(out) != "hi\n" {
				return fmt.Errorf("followed %q; want hi", out)
			}
			return err
		}, bgjob.ErrInvalidArgument},
		{"next-completion", func(r *bgjob.Registry, id bgjob.ID) error {
			// Another job's completion, or this one's: either comes.
			if _, err := r.Start(context.Background(), bgjob.Spec{Command: "true", Unique: true}); err != nil {
				return err
			}
			_, err := r.NextCompletion(context.Background(), "")
			return err
		}, nil},
	}
	for _, hook := range []string{"started", "finished", "complete", "admit"} {
		for _, c := range calls {
			for _, launch := range []string{"start", "run-foreground"} {
				t.Run(hook+"/"+c.name+"/"+launch, func(t *testing.T) {
					re := &reentry{hook: hook, call: c.call, done: make(chan error, 1)}
					cfg := bgjob.Config{Telemetry: re, OnComplete: func(cp bgjob.Completion) { re.maybe("complete", cp.ID) }}
					cfg.Admitter = bgjob.AdmitterFunc(func(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
						if !req.Partial {
							re.maybe("admit", req.ID)
						}
						return bgjob.Admitted{Text: req.Text}, nil
					})
					r := newRegistry(t, cfg)
					re.r = r
					ctx := ctxT(t)
					var id bgjob.ID
					if launch == "start" {
						s, err := r.Start(ctx, spec)
						if err != nil {
							t.Fatal(err)
						}
						id = s.ID
					} else {
						res, err := r.RunForeground(ctx, spec, bgjob.Foreground{SoftCap: time.Minute})
						if err != nil && !errors.Is(err, bgjob.ErrClosed) {
							t.Fatal(err)
						}
						id = res.ID
					}
					if hook == "complete" && launch == "run-foreground" {
						return // a job that ended inline yields no completion
					}
					select {
					case err := <-re.done:
						own := c.name == "wait-own" || c.name == "cancel-own" || c.name == "follow-own"
						switch {
						case err == nil, errors.Is(err, bgjob.ErrClosed):
						case hook == "admit" && c.ownAdmit != nil && errors.Is(err, c.ownAdmit):
						case own && launch == "run-foreground" && errors.Is(err, bgjob.ErrNotFound):
							// A job only foreground callers hold cannot
							// be polled, even from its own hooks.
						default:
							t.Errorf("call from the hook: %v", err)
						}
					case <-ctx.Done():
						t.Fatal("the call from the hook never returned")
					}
					if launch == "start" {
						if s, err := r.Wait(ctx, id); err == nil && !s.State.Done() {
							t.Errorf("the job: %v; want ended", s.State)
						}
					}
				})
			}
		}
	}
}

// Two jobs whose OnComplete hooks wait for each other's job both end.
func TestHooksWaitForEachOther(t *testing.T) {
	var mu sync.Mutex
	ids := map[string]bgjob.ID{}
	waited := make(chan error, 2)
	var r *bgjob.Registry
	r = newRegistry(t, bgjob.Config{OnComplete: func(c bgjob.Completion) {
		mu.Lock()
		other := ids["a"]
		if c.ID == ids["a"] {
			other = ids["b"]
		}
		mu.Unlock()
		_, err := r.Wait(context.Background(), other)
		waited <- err
	}})
	gate := t.TempDir() + "/go"
	mu.Lock()
	for _, name := range []string{"a", "b"} {
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: "while [ ! -e " + gate + " ]; do sleep 0.01; done; echo " + name})
		if err != nil {
			t.Fatal(err)
		}
		ids[name] = s.ID
	}
	mu.Unlock()
	touch(t, gate)
	for range 2 {
		select {
		case err := <-waited:
			if err != nil {
				t.Errorf("Wait from OnComplete: %v", err)
			}
		case <-ctxT(t).Done():
			t.Fatal("the hooks deadlocked")
		}
	}
}
