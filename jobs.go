package bgjob

import (
	"context"
	"io"
)

// Jobs is the method set of a job registry, so that a host can run its
// jobs on this machine (*Registry) or on a fleet of machines
// (fleet.Client, in the nested module github.com/bgjob/bgjob/fleet)
// and switch by construction only.
//
// Each method means what the Registry method of the same name documents.
// An implementation that reaches its jobs over a network keeps those
// semantics as far as it can and documents where it cannot; the methods
// whose local form cannot fail (List, Completions) gain no error, and such
// an implementation reports transport trouble in Snapshot.Reason and
// through a method of its own.
//
// Methods that later issues add to Registry (Write, CloseInput, Resize,
// Screen, Watch, WaitFor, Matches) join Jobs when they land.
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
	Close(ctx context.Context) error
}

var _ Jobs = (*Registry)(nil)
