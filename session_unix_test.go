//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// A Session view reaches its own session's jobs only: every method that
// takes an ID answers ErrNotFound for another session's job, with the
// Registry's wording, exactly as for an ID that names no job.
//
// A view of another Jobs (SessionOf, as a fleet client's Session makes)
// answers the same.
func TestSessionViewIsolatesSessions(t *testing.T) {
	for _, kind := range []string{"registry", "other-jobs"} {
		t.Run(kind, func(t *testing.T) { testSessionViewIsolates(t, kind) })
	}
}

// otherJobs is a Jobs that is not a *Registry, for SessionOf's own path.
type otherJobs struct{ bgjob.Jobs }

func testSessionViewIsolates(t *testing.T, kind string) {
	r := newRegistry(t, bgjob.Config{})
	a, b := r.Session("a"), r.Session("b")
	if kind == "other-jobs" {
		a, b = bgjob.SessionOf(otherJobs{r}, "a"), bgjob.SessionOf(otherJobs{r}, "b")
		if a.Registry() != nil || a.Jobs() != (otherJobs{r}) {
			t.Fatalf("a view of another Jobs: Registry %p, Jobs %v", a.Registry(), a.Jobs())
		}
	} else if bgjob.SessionOf(r, "a").Registry() != r {
		t.Fatalf("SessionOf a Registry: not its Session")
	}
	ctx := ctxT(t)
	sa, err := a.Start(ctx, bgjob.Spec{Command: "echo a; sleep 300"})
	if err != nil {
		t.Fatal(err)
	}
	if sa.Session != "a" {
		t.Errorf("Start through view a: session %q; want a", sa.Session)
	}
	waitOutput(t, r, sa.ID, "a", 1)
	unknown := bgjob.ID("job_0000000000000000")
	for _, tc := range []struct {
		name string
		op   string // as the error names it
		call func(s *bgjob.Session, id bgjob.ID) error
	}{
		{"status", "status", func(s *bgjob.Session, id bgjob.ID) error { _, err := s.Status(id); return err }},
		{"read", "read", func(s *bgjob.Session, id bgjob.ID) error { _, err := s.Read(id, 0, 10); return err }},
		{"read-wait", "readwait", func(s *bgjob.Session, id bgjob.ID) error {
			_, err := s.ReadWait(ctx, id, 0, 10)
			return err
		}},
		{"follow", "follow", func(s *bgjob.Session, id bgjob.ID) error {
			_, err := s.Follow(ctx, id, 0).Read(make([]byte, 10))
			return err
		}},
		{"wait", "wait", func(s *bgjob.Session, id bgjob.ID) error { _, err := s.Wait(ctx, id); return err }},
		{"cancel", "cancel", func(s *bgjob.Session, id bgjob.ID) error { _, err := s.Cancel(id); return err }},
		{"watch", "watch", func(s *bgjob.Session, id bgjob.ID) error {
			return s.Watch(id, bgjob.Watch{Pattern: regexp.MustCompile("a")})
		}},
		{"wait-for", "wait for", func(s *bgjob.Session, id bgjob.ID) error {
			_, err := s.WaitFor(ctx, id, regexp.MustCompile("a"), 0)
			return err
		}},
	} {
		t.Run(tc.name+"-of-another-session-is-not-found", func(t *testing.T) {
			err := tc.call(b, sa.ID)
			if want := fmt.Sprintf("bgjob: %s %s: bgjob: job not found", tc.op, sa.ID); err == nil || err.Error() != want {
				t.Errorf("got %v; want %q", err, want)
			}
			mustErr(t, err, bgjob.ErrNotFound)
			// The same answer as for an ID that names nothing.
			err2 := tc.call(b, unknown)
			if got, want := strings.ReplaceAll(err2.Error(), string(unknown), "ID"), strings.ReplaceAll(err.Error(), string(sa.ID), "ID"); got != want {
				t.Errorf("unknown ID: %q; another session's: %q; want the same", got, want)
			}
		})
	}
	t.Run("list-and-completions-are-the-sessions", func(t *testing.T) {
		if l := b.List(); len(l) != 0 {
			t.Errorf("b.List() = %d jobs; want none", len(l))
		}
		if l := a.List(); len(l) != 1 || l[0].ID != sa.ID {
			t.Errorf("a.List() = %v; want the job", l)
		}
	})
	t.Run("own-session-works", func(t *testing.T) {
		if s, err := a.Status(sa.ID); err != nil || s.ID != sa.ID {
			t.Fatalf("a.Status: %v", err)
		}
		c, err := a.Read(sa.ID, 0, 10)
		if err != nil || c.Data != "a\n" {
			t.Errorf("a.Read = %+v, %v", c, err)
		}
		s, err := a.Cancel(sa.ID)
		if err != nil || s.State != bgjob.Cancelled {
			t.Fatalf("a.Cancel = %v, %v", s.State, err)
		}
		cs := a.Completions()
		if len(cs) != 1 || cs[0].ID != sa.ID {
			t.Errorf("a.Completions() = %v; want the job's", cs)
		}
		if s.Err() != nil {
			t.Errorf("Err() of a cancelled job: %v; want nil", s.Err())
		}
	})
	// The Registry itself still reaches every session.
	if _, err := r.Status(sa.ID); err != nil {
		t.Errorf("Registry.Status: %v", err)
	}
}

// A view fills Spec.Session in, and refuses a Spec of another session
// before anything runs.
func TestSessionViewSpecs(t *testing.T) {
	tel := &telemetryRecorder{}
	r := newRegistry(t, bgjob.Config{Telemetry: tel})
	v := r.Session("mine")
	ctx := ctxT(t)
	for _, tc := range []struct {
		name    string
		session string
		wantErr bool
	}{
		{"empty-is-filled-in", "", false},
		{"same-is-kept", "mine", false},
		{"other-is-refused", "theirs", true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := bgjob.Spec{Command: "echo " + tc.name, Session: tc.session}
			before, _ := tel.counts()
			s, err := v.Start(ctx, spec)
			res, ferr := v.RunForeground(ctx, spec, bgjob.Foreground{})
			if tc.wantErr {
				if after, _ := tel.counts(); after != before {
					t.Errorf("%d processes started; want none", after-before)
				}
				for _, err := range []error{err, ferr} {
					mustErr(t, err, bgjob.ErrInvalidSpec)
					if !strings.Contains(err.Error(), "Spec.Session") {
						t.Errorf("%v; want it to name Spec.Session", err)
					}
				}
				return
			}
			if err != nil || ferr != nil {
				t.Fatalf("Start: %v; RunForeground: %v", err, ferr)
			}
			if s.Session != "mine" || res.Session != "mine" {
				t.Errorf("sessions %q and %q; want mine", s.Session, res.Session)
			}
			if s.ID != res.ID {
				t.Errorf("Start gave %s, RunForeground %s; want one job (the session was filled in alike)", s.ID, res.ID)
			}
			// The view's ID is the Registry's for the same Spec in the
			// session: the same job.
			direct, err := r.Start(ctx, bgjob.Spec{Command: spec.Command, Session: "mine"})
			if err != nil || direct.ID != s.ID {
				t.Errorf("Registry.Start: %s, %v; want %s", direct.ID, err, s.ID)
			}
		})
	}
}

// A view's NextCompletion and Follow are the session's.
func TestSessionViewWaits(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	a, b := r.Session("a"), r.Session("b")
	ctx := ctxT(t)
	sb, err := b.Start(ctx, bgjob.Spec{Command: "echo b"})
	if err != nil {
		t.Fatal(err)
	}
	sa, err := a.Start(ctx, bgjob.Spec{Command: "echo one; echo two"})
	if err != nil {
		t.Fatal(err)
	}
	out, err := io.ReadAll(a.Follow(ctx, sa.ID, 0))
	if err != nil || string(out) != "one\ntwo\n" {
		t.Errorf("a.Follow: %q, %v; want the whole output", out, err)
	}
	c, err := a.NextCompletion(ctx)
	if err != nil || c.ID != sa.ID || c.Session != "a" {
		t.Errorf("a.NextCompletion = %+v, %v; want %s's", c, err, sa.ID)
	}
	c, err = b.NextCompletion(ctx)
	if err != nil || c.ID != sb.ID {
		t.Errorf("b.NextCompletion = %+v, %v; want %s's", c, err, sb.ID)
	}
	short, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
	defer cancel()
	if _, err := a.NextCompletion(short); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("a.NextCompletion on an empty queue: %v; want DeadlineExceeded", err)
	}
	if a.Name() != "a" || a.Registry() != r {
		t.Errorf("Name %q, Registry %p; want a, %p", a.Name(), a.Registry(), r)
	}
}
