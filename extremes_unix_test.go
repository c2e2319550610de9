//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"strings"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// Every integer the API takes, at its extremes: a clear error naming it,
// or the documented meaning; never a panic, a hang or a wrapped-around
// offset.
func TestIntegerExtremes(t *testing.T) {
	t.Run("read", func(t *testing.T) {
		for _, admit := range []bool{false, true} {
			cfg := bgjob.Config{}
			if admit {
				cfg.Admitter = bgjob.Redactor{}
			}
			r := newRegistry(t, cfg)
			running, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo line one; echo line two; sleep 300"})
			if err != nil {
				t.Fatal(err)
			}
			waitOutput(t, r, running.ID, "two", 1)
			finished, _ := r.Start(ctxT(t), bgjob.Spec{Command: "echo line one; echo line two"})
			wait(t, r, finished.ID)
			for _, id := range []bgjob.ID{running.ID, finished.ID} {
				for _, off := range []int64{math.MinInt64, -1, 0, 1, 9, 18, 19, math.MaxInt64} {
					for _, max := range []int{math.MinInt, -1, 0, 1, 5, math.MaxInt} {
						c, err := r.Read(id, off, max)
						switch {
						case off < 0 || max <= 0 || off > 18:
							if !errors.Is(err, bgjob.ErrInvalidArgument) {
								t.Errorf("Read(%d, %d): %v; want ErrInvalidArgument", off, max, err)
							}
						case err != nil:
							t.Errorf("Read(%d, %d): %v", off, max, err)
						case c.Next < c.Offset || c.Offset < off || c.Next > 18 || c.Offset-off != c.Skipped:
							t.Errorf("Read(%d, %d) = offset %d next %d skipped %d; want %d <= offset <= next <= 18", off, max, c.Offset, c.Next, c.Skipped, off)
						case max == math.MaxInt && off == 0 && c.Data != "line one\nline two\n":
							t.Errorf("Read(0, MaxInt) = %q; want the whole stream", c.Data)
						}
					}
				}
			}
			r.Cancel(running.ID)
		}
	})

	t.Run("spec", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{})
		for _, spec := range []bgjob.Spec{
			{Command: "echo max", Timeout: math.MaxInt64, IdleTimeout: math.MaxInt64},
			{Command: "echo min", Timeout: math.MinInt64},
			{Command: "echo idle-min", IdleTimeout: math.MinInt64},
		} {
			s, err := r.Start(ctxT(t), spec)
			if spec.Timeout < 0 || spec.IdleTimeout < 0 {
				if !errors.Is(err, bgjob.ErrInvalidSpec) {
					t.Errorf("%q: %v; want ErrInvalidSpec", spec.Command, err)
				}
				continue
			}
			if err != nil {
				t.Fatal(err)
			}
			if s = wait(t, r, s.ID); s.State != bgjob.Exited {
				t.Errorf("%q: %v %q; want exited", spec.Command, s.State, s.Reason)
			}
		}
	})

	// Priorities at their extremes order the queue as any others do;
	// Leftovers and MaxQueued outside their range are refused.
	t.Run("queue", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{MaxRunning: 1, Queue: true, MaxQueued: math.MaxInt})
		b := blocker(t, r)
		var ids []bgjob.ID
		for _, p := range []int{0, math.MinInt, math.MaxInt, -1, 1} {
			ids = append(ids, queued(t, r, fmt.Sprint(p), p).ID)
		}
		for i, want := range []int{3, 5, 1, 4, 2} {
			if s, _ := r.Status(ids[i]); s.QueuePosition != want {
				t.Errorf("launch %d: place %d; want %d", i, s.QueuePosition, want)
			}
		}
		r.Cancel(b.ID)
		for _, l := range []bgjob.Leftovers{-1, 2, math.MaxInt} {
			if _, err := r.Start(ctxT(t), bgjob.Spec{Command: "true", Leftovers: l}); !errors.Is(err, bgjob.ErrInvalidSpec) {
				t.Errorf("Leftovers %d: %v; want ErrInvalidSpec", l, err)
			}
		}
		if _, err := bgjob.New(bgjob.Config{MaxQueued: math.MinInt}); !errors.Is(err, bgjob.ErrInvalidConfig) {
			t.Errorf("MaxQueued MinInt: %v; want ErrInvalidConfig", err)
		}
	})

	t.Run("foreground", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{ProgressInterval: math.MaxInt64})
		for _, softCap := range []time.Duration{math.MinInt64, -1, 1, math.MaxInt64} {
			res, err := r.RunForeground(ctxT(t), bgjob.Spec{Command: "echo fg", Unique: true},
				bgjob.Foreground{SoftCap: softCap, Interval: -softCap, OnProgress: func(bgjob.Snapshot) {}})
			if err != nil {
				t.Fatalf("SoftCap %v: %v", softCap, err)
			}
			if softCap != 1 && res.Detached {
				t.Errorf("SoftCap %v: detached; want the result inline", softCap)
			}
			if res.Detached {
				wait(t, r, res.ID)
			}
		}
	})

	t.Run("config", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			cfg   bgjob.Config
			field string // the field named by the error; "" if New succeeds
		}{
			{"max-durations", bgjob.Config{DefaultTimeout: math.MaxInt64, KillGrace: math.MaxInt64, ProgressInterval: math.MaxInt64}, ""},
			{"min-default-timeout", bgjob.Config{DefaultTimeout: math.MinInt64}, "DefaultTimeout"},
			{"min-kill-grace", bgjob.Config{KillGrace: math.MinInt64}, "KillGrace"},
			{"max-running", bgjob.Config{MaxRunning: math.MaxInt}, ""},
			{"min-running", bgjob.Config{MaxRunning: math.MinInt}, "MaxRunning"},
			{"max-head", bgjob.Config{HeadBytes: math.MaxInt}, "HeadBytes"},
			{"max-tail", bgjob.Config{TailBytes: math.MaxInt}, "TailBytes"},
			{"min-head", bgjob.Config{HeadBytes: math.MinInt}, "HeadBytes"},
			{"retention-extremes", bgjob.Config{Retention: bgjob.Retention{MaxJobs: math.MinInt, MaxBytes: math.MaxInt64, TTL: math.MinInt64}}, ""},
			{"retention-max", bgjob.Config{Retention: bgjob.Retention{MaxJobs: math.MaxInt, MaxBytes: math.MinInt64, TTL: math.MaxInt64}}, ""},
			{"max-output-bytes", bgjob.Config{MaxOutputBytes: math.MaxInt64}, ""},
			{"min-output-bytes", bgjob.Config{MaxOutputBytes: math.MinInt64}, "MaxOutputBytes"},
		} {
			t.Run(tc.name, func(t *testing.T) {
				r, err := bgjob.New(tc.cfg)
				if tc.field != "" {
					if !errors.Is(err, bgjob.ErrInvalidConfig) || !strings.Contains(err.Error(), tc.field) {
						t.Errorf("New: %v; want ErrInvalidConfig naming %s", err, tc.field)
					}
					return
				}
				if err != nil {
					t.Fatalf("New: %v", err)
				}
				defer r.Close(context.Background())
				s, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo ok"})
				if err != nil {
					t.Fatal(err)
				}
				if s = wait(t, r, s.ID); s.State != bgjob.Exited || s.Output.Text != "ok\n" {
					t.Errorf("job: %v %q; want exited ok", s.State, s.Output.Text)
				}
			})
		}
	})
}
