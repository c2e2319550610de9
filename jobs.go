package bgjob

import (
	"context"
	"io"
	"regexp"
)

// Jobs is the exported method set of [Registry], so that a host can run
// its jobs on this machine (*Registry) or on a fleet of machines
// (fleet.Client, in the nested module github.com/bgjob/bgjob/fleet)
// and switch by construction only.
//
// Each method means what the Registry method of the same name documents.
// An implementation that reaches its jobs over a network keeps those
// semantics as far as it can and documents where it cannot; a method it
// cannot offer at all returns an error wrapping ErrUnsupported. The
// methods whose local form cannot fail (List, Completions, Matches,
// Running, Session) gain no error: such an implementation reports transport
// trouble in Snapshot.Reason and through a method of its own.
//
// A method added to Registry is added here too; the assertion below
// makes the build fail until it is.
type Jobs interface {
	Start(ctx context.Context, spec Spec) (Snapshot, error)
	RunForeground(ctx context.Context, spec Spec, fg Foreground) (Result, error)
	Status(id ID) (Snapshot, error)
	Read(id ID, offset int64, max int) (Chunk, error)
	ReadWait(ctx context.Context, id ID, offset int64, max int) (Chunk, error)
	Follow(ctx context.Context, id ID, offset int64) io.Reader
	Wait(ctx context.Context, id ID) (Snapshot, error)
	Cancel(id ID) (Snapshot, error)
	List(session string) []Snapshot
	Completions(session string) []Completion
	NextCompletion(ctx context.Context, session string) (Completion, error)
	Write(ctx context.Context, id ID, p []byte) (int, error)
	CloseInput(id ID) error
	Resize(id ID, rows, cols uint16) error
	Screen(id ID) (Screen, error)
	Watch(id ID, w Watch) error
	WaitFor(ctx context.Context, id ID, re *regexp.Regexp, from int64) (Match, error)
	Matches(session string) []Match
	Session(name string) *Session
	Running() int
	Readmit(ctx context.Context) error
	Detach() error
	Close(ctx context.Context) error
}

var _ Jobs = (*Registry)(nil)
