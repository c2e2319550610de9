package bgjob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"regexp"
)

// Session is a view of a [Registry] scoped to one session: the
// registry's methods with the session filled in and checked. Its Start
// and RunForeground launch jobs of that session; its Status, Read,
// ReadWait, Follow, Wait, Cancel, Write, CloseInput, Resize, Screen,
// Watch and WaitFor answer ErrNotFound for the ID of another session's
// job, exactly as for an ID that names no job, so one client of a
// multi-client host can neither reach nor learn of another's jobs; its
// List, Completions, NextCompletion and Matches are the session's.
//
// Get one with [Registry.Session], or with [SessionOf] for another
// implementation of [Jobs] (a fleet client). A Session holds nothing but
// the registry (or the Jobs) and the name: it is cheap to make per
// request, and as safe for concurrent use as what it views.
type Session struct {
	r    *Registry
	j    Jobs // when r is nil: the Jobs viewed, through its exported methods
	name string
}

// SessionOf returns the view of j scoped to the session name. For a
// *Registry it is [Registry.Session]. For another Jobs, each method that
// takes an ID first asks j.Status(id) and answers ErrNotFound (as for an
// unknown ID) when the job belongs to another session; since a job's ID
// is a keyed hash that includes its session, that one check holds for
// the job's life. That costs one more call per method, which a Jobs
// whose calls cross a network may avoid with a scope of its own (the
// fleet client's ClientConfig.Scoped).
func SessionOf(j Jobs, name string) *Session {
	if r, ok := j.(*Registry); ok {
		return r.Session(name)
	}
	return &Session{j: j, name: name}
}

// owns checks, for a view of a Jobs, that id names a job of the session.
func (s *Session) owns(op string, id ID) error {
	st, err := s.j.Status(id)
	if err != nil && !errors.Is(err, ErrNotFound) {
		return err
	}
	if err != nil || st.Session != s.name {
		return fmt.Errorf("bgjob: %s %s: %w", op, id, ErrNotFound)
	}
	return nil
}

// Session returns the view of r scoped to the session name ("" is a
// session like any other).
func (r *Registry) Session(name string) *Session {
	return &Session{r: r, name: name}
}

// scope limits a lookup to the jobs of one session, or to none.
type scope struct {
	on      bool
	session string
}

// anySession is the scope of the Registry's own methods.
var anySession = scope{}

// holds reports whether j is in the scope.
func (sc scope) holds(j *job) bool { return !sc.on || j.spec.Session == sc.session }

func (s *Session) scope() scope { return scope{on: true, session: s.name} }

// Name returns the session's name.
func (s *Session) Name() string { return s.name }

// Registry returns the registry the session is a view of, or nil for a
// view of another [Jobs] (see [SessionOf]).
func (s *Session) Registry() *Registry { return s.r }

// Jobs returns what the session is a view of: its Registry, or the Jobs
// given to [SessionOf].
func (s *Session) Jobs() Jobs {
	if s.r != nil {
		return s.r
	}
	return s.j
}

// spec fills spec.Session in with the session's name, or refuses a Spec
// that names another session.
func (s *Session) spec(op string, spec Spec) (Spec, error) {
	if spec.Session != "" && spec.Session != s.name {
		return Spec{}, fmt.Errorf("bgjob: %s: %w", op, specError("Session", "%q, in a view of session %q", spec.Session, s.name))
	}
	spec.Session = s.name
	return spec, nil
}

// Start is [Registry.Start] in the session: spec.Session is set to the
// session's name if it is empty, and a spec of another session fails
// with an error wrapping ErrInvalidSpec that names Spec.Session.
func (s *Session) Start(ctx context.Context, spec Spec) (Snapshot, error) {
	spec, err := s.spec("start", spec)
	if err != nil {
		return Snapshot{}, err
	}
	return s.Jobs().Start(ctx, spec)
}

// RunForeground is [Registry.RunForeground] in the session; spec.Session
// is filled in or checked as by Start.
func (s *Session) RunForeground(ctx context.Context, spec Spec, fg Foreground) (Result, error) {
	spec, err := s.spec("run", spec)
	if err != nil {
		return Result{}, err
	}
	return s.Jobs().RunForeground(ctx, spec, fg)
}

// Status is [Registry.Status] of a job of the session.
func (s *Session) Status(id ID) (Snapshot, error) {
	if s.r == nil {
		st, err := s.j.Status(id)
		if err == nil && st.Session != s.name {
			return Snapshot{}, fmt.Errorf("bgjob: status %s: %w", id, ErrNotFound)
		}
		return st, err
	}
	return s.r.status(s.scope(), id)
}

// Read is [Registry.Read] of a job of the session.
func (s *Session) Read(id ID, offset int64, max int) (Chunk, error) {
	if s.r == nil {
		if err := s.owns("read", id); err != nil {
			return Chunk{}, err
		}
		return s.j.Read(id, offset, max)
	}
	return s.r.read(s.scope(), id, offset, max)
}

// ReadWait is [Registry.ReadWait] of a job of the session.
func (s *Session) ReadWait(ctx context.Context, id ID, offset int64, max int) (Chunk, error) {
	if s.r == nil {
		if err := s.owns("readwait", id); err != nil {
			return Chunk{}, err
		}
		return s.j.ReadWait(ctx, id, offset, max)
	}
	return s.r.readWait(ctx, s.scope(), id, offset, max)
}

// Follow is [Registry.Follow] of a job of the session: the reader's
// first Read fails with ErrNotFound if id names no job of the session.
func (s *Session) Follow(ctx context.Context, id ID, offset int64) io.Reader {
	if s.r == nil {
		if err := s.owns("follow", id); err != nil {
			return errReader{err}
		}
		return s.j.Follow(ctx, id, offset)
	}
	return &follower{r: s.r, sc: s.scope(), ctx: ctx, id: id, next: offset}
}

// errReader is a reader whose every Read fails with err.
type errReader struct{ err error }

func (e errReader) Read([]byte) (int, error) { return 0, e.err }

// Wait is [Registry.Wait] of a job of the session.
func (s *Session) Wait(ctx context.Context, id ID) (Snapshot, error) {
	if s.r == nil {
		if err := s.owns("wait", id); err != nil {
			return Snapshot{}, err
		}
		return s.j.Wait(ctx, id)
	}
	return s.r.wait(ctx, s.scope(), id)
}

// Cancel is [Registry.Cancel] of a job of the session.
func (s *Session) Cancel(id ID) (Snapshot, error) {
	if s.r == nil {
		if err := s.owns("cancel", id); err != nil {
			return Snapshot{}, err
		}
		return s.j.Cancel(id)
	}
	return s.r.cancel(s.scope(), id)
}

// List is [Registry.List] of the session.
func (s *Session) List() []Snapshot { return s.Jobs().List(s.name) }

// Completions is [Registry.Completions] of the session.
func (s *Session) Completions() []Completion { return s.Jobs().Completions(s.name) }

// NextCompletion is [Registry.NextCompletion] of the session.
func (s *Session) NextCompletion(ctx context.Context) (Completion, error) {
	return s.Jobs().NextCompletion(ctx, s.name)
}

// Write is [Registry.Write] to a job of the session.
func (s *Session) Write(ctx context.Context, id ID, p []byte) (int, error) {
	if s.r == nil {
		if err := s.owns("write", id); err != nil {
			return 0, err
		}
		return s.j.Write(ctx, id, p)
	}
	return s.r.write(ctx, s.scope(), id, p)
}

// CloseInput is [Registry.CloseInput] of a job of the session.
func (s *Session) CloseInput(id ID) error {
	if s.r == nil {
		if err := s.owns("close input", id); err != nil {
			return err
		}
		return s.j.CloseInput(id)
	}
	return s.r.closeInput(s.scope(), id)
}

// Resize is [Registry.Resize] of a job of the session.
func (s *Session) Resize(id ID, rows, cols uint16) error {
	if s.r == nil {
		if err := s.owns("resize", id); err != nil {
			return err
		}
		return s.j.Resize(id, rows, cols)
	}
	return s.r.resize(s.scope(), id, rows, cols)
}

// Screen is [Registry.Screen] of a job of the session.
func (s *Session) Screen(id ID) (Screen, error) {
	if s.r == nil {
		if err := s.owns("screen", id); err != nil {
			return Screen{}, err
		}
		return s.j.Screen(id)
	}
	return s.r.screen(s.scope(), id)
}

// Watch is [Registry.Watch] of a job of the session.
func (s *Session) Watch(id ID, w Watch) error {
	if s.r == nil {
		if err := s.owns("watch", id); err != nil {
			return err
		}
		return s.j.Watch(id, w)
	}
	return s.r.watch(s.scope(), id, w)
}

// WaitFor is [Registry.WaitFor] of a job of the session.
func (s *Session) WaitFor(ctx context.Context, id ID, re *regexp.Regexp, from int64) (Match, error) {
	if s.r == nil {
		if err := s.owns("wait for", id); err != nil {
			return Match{}, err
		}
		return s.j.WaitFor(ctx, id, re, from)
	}
	return s.r.waitFor(ctx, s.scope(), id, re, from)
}

// Matches is [Registry.Matches] of the session.
func (s *Session) Matches() []Match { return s.Jobs().Matches(s.name) }
