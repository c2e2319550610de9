package bgjob

import (
	"context"
	"fmt"
	"io"
)

// Blocking reads. A reader that wants output not yet written waits on the
// job's "output changed" channel (job.changed), which the output chain
// closes when a chunk comes (emit) and finish closes when the final text
// is set: it wakes on the output, never on a timer.

// ReadWait is [Registry.Read] that waits for output: it returns as soon
// as there is something to serve at offset (with an Admitter, a whole
// line, as Read serves them), the job has ended (Chunk.Done), or ctx is
// done. It wakes on the job's output; it does not poll. An offset at the
// end of the stream so far is the usual case: it waits for what comes
// next. An offset past that end waits until the stream gets there, and
// fails with ErrInvalidArgument, as Read does, if the job ends before.
//
// When ctx ends first, ReadWait returns the empty chunk at offset and an
// error wrapping ctx.Err(). A job that Detach released never ends, so a
// ReadWait on it returns only when output comes or ctx ends.
//
// ReadWait may be called from a hook. From the job's own JobStarted hook
// it supervises the job to its end first, as Wait does (see hooks.go);
// from the job's own Admitter while the job ends it cannot wait, and
// fails with ErrInvalidArgument when there is nothing to serve. Its other
// errors are Read's.
func (r *Registry) ReadWait(ctx context.Context, id ID, offset int64, max int) (Chunk, error) {
	return r.readWait(ctx, anySession, id, offset, max)
}

func (r *Registry) readWait(ctx context.Context, sc scope, id ID, offset int64, max int) (Chunk, error) {
	const op = "readwait"
	if err := readArgs(op, id, offset, max); err != nil {
		return Chunk{}, err
	}
	j, err := r.lookup(sc, op, id)
	if err != nil {
		return Chunk{}, err
	}
	return r.readWaitJob(ctx, j, op, offset, max)
}

// readWaitJob is ReadWait of the job j, once found.
func (r *Registry) readWaitJob(ctx context.Context, j *job, op string, offset int64, max int) (Chunk, error) {
	var ended <-chan struct{}
	for first := true; ; first = false {
		// The channel is taken before the read, so that output coming
		// between the two wakes the wait below.
		j.mu.Lock()
		changed := j.outputChangedLocked()
		ahead := j.fin == nil && offset > j.out.total // a running job has not got there yet
		j.mu.Unlock()
		c := Chunk{Offset: offset, Next: offset}
		if !ahead {
			var err error
			c, err = r.readJob(j, op, offset, max)
			if err != nil || c.Next != offset || c.Done {
				return c, err
			}
		}
		if first {
			// From a hook, the job's end is not what a caller elsewhere
			// waits for (hooks.go); from the job's own JobStarted hook,
			// this supervises it to its end.
			if ended = r.ended(j); ended == nil {
				return c, fmt.Errorf("bgjob: %s %s: called from the job's own Admitter while it ends: %w", op, j.id, ErrInvalidArgument)
			}
		}
		select {
		case <-changed:
		case <-ended:
			ended = nil // its final text is set: the next read says Done
		case <-ctx.Done():
			return c, fmt.Errorf("bgjob: %s %s: %w", op, j.id, ctx.Err())
		}
	}
}

// Follow returns a reader of the job's admitted output from offset on, to
// its end: each Read blocks until there is output to return (as
// [Registry.ReadWait] does), the job ends, or ctx is done, and returns
// io.EOF once the job has ended and every byte was read. Reading it to
// its end with io.Copy streams the job's output as it comes.
//
// The reader follows the run the ID named when it first read, even if a
// later launch of the same ID starts another run. It yields the admitted
// text, as Read's Data, and keeps the next offset itself (Chunk.Next),
// so its bytes may be more or fewer than the raw stream's when an
// Admitter rewrites lines. Bytes the registry no longer holds (Skipped
// by Read: dropped between the head and the tail) are passed over
// without a mark; a reader that must account for them reads with
// ReadWait and looks at Chunk.Skipped.
//
// Once ctx is done, Read returns an error wrapping ctx.Err(); an unknown
// ID makes the first Read fail with ErrNotFound. After an error or
// io.EOF, every later Read returns it again. The reader is not safe for
// use by several goroutines at once.
func (r *Registry) Follow(ctx context.Context, id ID, offset int64) io.Reader {
	return &follower{r: r, ctx: ctx, id: id, next: offset}
}

// followMin is the least a follower asks ReadWait for, whatever the size
// of the caller's buffer: what does not fit waits in buf.
const followMin = 4 << 10

// follower is the reader that Follow returns.
type follower struct {
	r   *Registry
	sc  scope
	ctx context.Context
	id  ID

	j    *job   // the run followed, once found
	next int64  // the offset to read on from: the last chunk's Next
	buf  string // admitted text read and not yet returned
	err  error  // io.EOF, or the error that ended the reader
}

func (f *follower) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for f.buf == "" {
		if f.err != nil {
			return 0, f.err
		}
		var c Chunk
		var err error
		if f.j == nil {
			if err = readArgs("follow", f.id, f.next, 1); err == nil {
				f.j, err = f.r.lookup(f.sc, "follow", f.id)
			}
		}
		if err == nil {
			c, err = f.r.readWaitJob(f.ctx, f.j, "follow", f.next, max(len(p), followMin))
		}
		if err != nil {
			f.err = err
			return 0, err
		}
		f.buf, f.next = c.Data, c.Next
		if c.Done {
			f.err = io.EOF
		}
	}
	n := copy(p, f.buf)
	f.buf = f.buf[n:]
	return n, nil
}
