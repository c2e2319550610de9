package fleet

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/bgjob/bgjob"
	"github.com/zeebo/blake3"
)

// What travels between clients and workers, as JSON.

// launch is a message of the launch work queue: one run of a job.
type launch struct {
	ID    bgjob.ID   `json:"id"`
	Run   string     `json:"run"`
	Spec  bgjob.Spec `json:"spec"`
	Reply string     `json:"reply,omitempty"` // the client's inbox for the start reply
}

// phase is where a run stands in the fleet. Its record is written by a
// compare-and-set on the key's last revision at every change, so that
// exactly one writer moves it each time.
type phase string

const (
	phaseQueued  phase = "queued"  // launched by a client, in the work queue; written by the client
	phaseClaimed phase = "claimed" // a worker took it and is starting it; written by the worker
	phaseRunning phase = "running" // the worker started it; written by the worker
	phaseEnded   phase = "ended"   // ended; written once, by the worker or by a reaper (worker lost)
)

// record is a job's value in the jobs bucket.
type record struct {
	Phase    phase    `json:"phase"`
	Run      string   `json:"run"`              // this run's nonce; a later launch of the ID makes another
	Worker   string   `json:"worker,omitempty"` // the worker that claimed the run
	Local    bgjob.ID `json:"local,omitempty"`  // the job's ID in the worker's Registry
	Pollable bool     `json:"pollable"`         // launched by Start, joined by Start, or detached: its end yields a completion
	Rerun    bool     `json:"rerun,omitempty"`  // a worker lost before it started the run puts it back in the queue
	// Interactive and TTY are the launch's Spec.Interactive (or TTY)
	// and Spec.TTY != nil, so that a request to an ended job fails
	// with the error the Registry would give.
	Interactive bool           `json:"interactive,omitempty"`
	TTY         bool           `json:"tty,omitempty"`
	Snap        bgjob.Snapshot `json:"snapshot"`
	// Write is a nonce of the write that made this value, so that a
	// writer whose answer was lost can tell its own write (store.cas).
	Write string `json:"write"`
}

// rpcRequest is a request to the job's worker.
type rpcRequest struct {
	Op     string        `json:"op"` // "status", "read", "readwait", "cancel", "write", "closeinput", "resize", "screen", "watch", "waitfor"
	ID     bgjob.ID      `json:"id"`
	Run    string        `json:"run"`
	Offset int64         `json:"offset,omitempty"`
	Max    int           `json:"max,omitempty"`
	Wait   time.Duration `json:"wait,omitempty"` // readwait, write: how long the worker may wait
	Data   []byte        `json:"data,omitempty"` // write: the bytes
	Rows   uint16        `json:"rows,omitempty"` // resize
	// Name, Pattern and Every: watch (Pattern also waitfor, from Offset).
	Name    string `json:"name,omitempty"`
	Pattern string `json:"pattern,omitempty"`
	Every   bool   `json:"every,omitempty"`
	Cols    uint16 `json:"cols,omitempty"` // resize
}

// reply is a worker's answer: a start, or a request.
type reply struct {
	Snap   *bgjob.Snapshot `json:"snapshot,omitempty"`
	Chunk  *bgjob.Chunk    `json:"chunk,omitempty"`
	Screen *bgjob.Screen   `json:"screen,omitempty"`
	Match  *bgjob.Match    `json:"match,omitempty"`
	N      int             `json:"n,omitempty"` // write: bytes written, also with an error
	Err    string          `json:"error,omitempty"`
	Kind   string          `json:"kind,omitempty"` // which sentinel Err wraps (errKinds)
}

// errKinds names the sentinels an error may wrap across the wire.
var errKinds = []struct {
	name string
	err  error
}{
	{"not_found", bgjob.ErrNotFound},
	{"closed", bgjob.ErrClosed},
	{"too_many", bgjob.ErrTooManyRunning},
	{"invalid_spec", bgjob.ErrInvalidSpec},
	{"rejected", bgjob.ErrRejected},
	{"unsupported", bgjob.ErrUnsupported},
	{"invalid_argument", bgjob.ErrInvalidArgument},
	{"input_closed", bgjob.ErrInputClosed},
	{"not_interactive", bgjob.ErrNotInteractive},
	{"job_ended", bgjob.ErrJobEnded},
	{"deadline", context.DeadlineExceeded},
	{"canceled", context.Canceled},
}

// errorReply puts err on the wire with the sentinel it wraps.
func errorReply(err error) reply {
	r := reply{Err: err.Error()}
	for _, k := range errKinds {
		if errors.Is(err, k.err) {
			r.Kind = k.name
			break
		}
	}
	return r
}

// remoteError is an error a worker sent: its text, wrapping the same
// sentinel as the worker's.
type remoteError struct {
	msg  string
	kind error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.kind }

// err returns the reply's error, or nil.
func (r reply) err() error {
	if r.Err == "" {
		return nil
	}
	e := &remoteError{msg: r.Err}
	for _, k := range errKinds {
		if k.name == r.Kind {
			e.kind = k.err
		}
	}
	return e
}

// idKeyContext separates the fleet's ID keys from other uses of the key.
const idKeyContext = "github.com/bgjob/bgjob/fleet 2026-11 job ID key"

// fleetID derives a launch's ID in the fleet from the shared key: a keyed
// BLAKE3 hash of the Spec as the client gave it (its JSON, in which the
// environment's keys are sorted), so identical launches of a session get
// the same ID at every client. Dir and the timeouts enter as given, not
// as a worker would resolve them: "" and "." are different jobs. A Unique
// launch mixes in a fresh nonce.
//
// As locally, Priority is not part of a job's identity (an identical
// launch of another Priority joins), and an interactive launch is a
// conversation of its own: it never joins, nor is joined.
func fleetID(key *[32]byte, spec bgjob.Spec) (bgjob.ID, error) {
	unique := spec.Unique || spec.Interactive || spec.TTY != nil
	spec.Unique = false
	spec.Priority = 0
	b, err := json.Marshal(spec)
	if err != nil {
		return "", fmt.Errorf("bgjob/fleet: encode spec: %w", err)
	}
	h, _ := blake3.NewKeyed(key[:]) // a 32-byte key: never fails
	h.Write(b)
	if unique {
		var nonce [16]byte
		rand.Read(nonce[:])
		h.Write(nonce[:])
	}
	var sum [8]byte
	h.Digest().Read(sum[:])
	return bgjob.ID("job_" + hex.EncodeToString(sum[:])), nil
}

// deriveKey turns the configured or shared key material into the hash key.
func deriveKey(material []byte) *[32]byte {
	var k [32]byte
	blake3.DeriveKey(idKeyContext, material, k[:])
	return &k
}

// nonce returns a random 16-hex-digit string, for runs and writes.
func nonce() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
