package bgjob

import (
	"context"
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
// Get one with [Registry.Session]. A Session holds nothing but the
// registry and the name: it is cheap to make per request, and as safe
// for concurrent use as the Registry.
type Session struct {
	r    *Registry
	name string
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

// Registry returns the registry the session is a view of.
func (s *Session) Registry() *Registry { return s.r }

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
	return s.r.Start(ctx, spec)
}

// RunForeground is [Registry.RunForeground] in the session; spec.Session
// is filled in or checked as by Start.
func (s *Session) RunForeground(ctx context.Context, spec Spec, fg Foreground) (Result, error) {
	spec, err := s.spec("run", spec)
	if err != nil {
		return Result{}, err
	}
	return s.r.RunForeground(ctx, spec, fg)
}

// Status is [Registry.Status] of a job of the session.
func (s *Session) Status(id ID) (Snapshot, error) { return s.r.status(s.scope(), id) }

// Read is [Registry.Read] of a job of the session.
func (s *Session) Read(id ID, offset int64, max int) (Chunk, error) {
	return s.r.read(s.scope(), id, offset, max)
}

// ReadWait is [Registry.ReadWait] of a job of the session.
func (s *Session) ReadWait(ctx context.Context, id ID, offset int64, max int) (Chunk, error) {
	return s.r.readWait(ctx, s.scope(), id, offset, max)
}

// Follow is [Registry.Follow] of a job of the session: the reader's
// first Read fails with ErrNotFound if id names no job of the session.
func (s *Session) Follow(ctx context.Context, id ID, offset int64) io.Reader {
	return &follower{r: s.r, sc: s.scope(), ctx: ctx, id: id, next: offset}
}

// Wait is [Registry.Wait] of a job of the session.
func (s *Session) Wait(ctx context.Context, id ID) (Snapshot, error) {
	return s.r.wait(ctx, s.scope(), id)
}

// Cancel is [Registry.Cancel] of a job of the session.
func (s *Session) Cancel(id ID) (Snapshot, error) { return s.r.cancel(s.scope(), id) }

// List is [Registry.List] of the session.
func (s *Session) List() []Snapshot { return s.r.List(s.name) }

// Completions is [Registry.Completions] of the session.
func (s *Session) Completions() []Completion { return s.r.Completions(s.name) }

// NextCompletion is [Registry.NextCompletion] of the session.
func (s *Session) NextCompletion(ctx context.Context) (Completion, error) {
	return s.r.NextCompletion(ctx, s.name)
}

// Write is [Registry.Write] to a job of the session.
func (s *Session) Write(ctx context.Context, id ID, p []byte) (int, error) {
	return s.r.write(ctx, s.scope(), id, p)
}

// CloseInput is [Registry.CloseInput] of a job of the session.
func (s *Session) CloseInput(id ID) error { return s.r.closeInput(s.scope(), id) }

// Resize is [Registry.Resize] of a job of the session.
func (s *Session) Resize(id ID, rows, cols uint16) error {
	return s.r.resize(s.scope(), id, rows, cols)
}

// Screen is [Registry.Screen] of a job of the session.
func (s *Session) Screen(id ID) (Screen, error) { return s.r.screen(s.scope(), id) }

// Watch is [Registry.Watch] of a job of the session.
func (s *Session) Watch(id ID, w Watch) error { return s.r.watch(s.scope(), id, w) }

// WaitFor is [Registry.WaitFor] of a job of the session.
func (s *Session) WaitFor(ctx context.Context, id ID, re *regexp.Regexp, from int64) (Match, error) {
	return s.r.waitFor(ctx, s.scope(), id, re, from)
}

// Matches is [Registry.Matches] of the session.
func (s *Session) Matches() []Match { return s.r.Matches(s.name) }
