//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"io"
	"math/rand/v2"
	"sync/atomic"
	"time"

	"github.com/bgjob/bgjob"
)

// TestStress's operations on the calls of issue #20: blocking reads
// (ReadWait, Follow), NextCompletion, and Session views, whose launches
// must give the IDs the Registry gives and whose lookups must never reach
// another session's job.

// firstHourCounts counts what these operations did.
type firstHourCounts struct {
	readWaits, readWaitOut, follows, followEOF, followOut, followBytes atomic.Int64
	nexts, nextOut, views, viewMisses, viewLaunches                    atomic.Int64
}

// firstHour runs one of the operations, chosen by p (0 to 11).
func (st *stress) firstHour(rng *rand.Rand, p int) {
	switch {
	case p < 3:
		st.readWait(rng)
	case p < 6:
		st.follow(rng)
	case p < 8:
		st.nextCompletion(rng)
	default:
		st.viewLookup(rng)
	}
}

// readWait waits for output at a random offset of a known job, briefly.
func (st *stress) readWait(rng *rand.Rand) {
	id, ss, reg, ok := st.randomID(rng)
	if !ok {
		return
	}
	st.fh.readWaits.Add(1)
	off := rng.Int64N(ss.n + 1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(200))*time.Millisecond)
	c, err := reg.r.ReadWait(ctx, id, off, 1+rng.IntN(100_000))
	cancel()
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		st.fh.readWaitOut.Add(1)
		if c.Offset != off || c.Next != off || c.Data != "" {
			st.fail("ReadWait(%s, %d) timed out with chunk %+v; want empty at the offset", id, off, c)
		}
	case errors.Is(err, bgjob.ErrInvalidArgument): // past the end of a run that ended shorter
		st.n.readInvalid.Add(1)
	case err != nil:
		st.notFound("ReadWait", err)
	case c.Next == off && !c.Done:
		st.fail("ReadWait(%s, %d) returned %+v: no progress, not done, no error", id, off, c)
	default:
		st.checkChunk(ss, id, off, c)
	}
}

// follow reads a known job's output from a random offset to its end (or
// for a while), checking every byte: the output is whole lines of one
// word, and the registry drops whole lines only, so the bytes Follow
// passes over never shift the pattern.
func (st *stress) follow(rng *rand.Rand) {
	id, ss, reg, ok := st.randomID(rng)
	if !ok {
		return
	}
	st.fh.follows.Add(1)
	off := rng.Int64N(ss.n+1) / int64(len(ss.word)+1) * int64(len(ss.word)+1) // a line's start
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(100+rng.IntN(1500))*time.Millisecond)
	defer cancel()
	var f io.Reader
	if rng.IntN(2) == 0 {
		f = reg.r.Follow(ctx, id, off)
	} else {
		f = reg.r.Session(ss.spec.Session).Follow(ctx, id, off)
	}
	buf := make([]byte, 1+rng.IntN(64<<10))
	at := off
	for {
		n, err := f.Read(buf)
		for i := 0; i < n; i++ {
			if buf[i] != ss.byteAt(at+int64(i)) {
				st.fail("Follow(%s, %d): byte %d after the start is %q; want %q", id, off, at-off+int64(i), buf[i], ss.byteAt(at+int64(i)))
				return
			}
		}
		at += int64(n)
		st.fh.followBytes.Add(int64(n))
		switch {
		case err == nil && n == 0:
			st.fail("Follow(%s, %d): Read returned 0 bytes and no error", id, off)
			return
		case err == nil:
			continue
		case err == io.EOF:
			st.fh.followEOF.Add(1)
		case errors.Is(err, context.DeadlineExceeded):
			st.fh.followOut.Add(1)
		case errors.Is(err, bgjob.ErrInvalidArgument): // past the end of a run that ended shorter
			st.n.readInvalid.Add(1)
		default:
			st.notFound("Follow", err)
		}
		if at-off > ss.n {
			st.fail("Follow(%s, %d): %d bytes; the job writes %d in all", id, off, at-off, ss.n)
		}
		return
	}
}

// nextCompletion takes one completion of a random session, waiting a
// little for it, through the Registry or a Session view.
func (st *stress) nextCompletion(rng *rand.Rand) {
	session := stressSessions[rng.IntN(len(stressSessions))]
	reg := st.anyReg(rng)
	st.fh.nexts.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(100))*time.Millisecond)
	defer cancel()
	var c bgjob.Completion
	var err error
	if rng.IntN(2) == 0 {
		c, err = reg.r.NextCompletion(ctx, session)
	} else {
		c, err = reg.r.Session(session).NextCompletion(ctx)
	}
	switch {
	case errors.Is(err, context.DeadlineExceeded):
		st.fh.nextOut.Add(1)
	case errors.Is(err, bgjob.ErrClosed) && st.closing.Load():
		st.n.closedErrs.Add(1)
	case err != nil:
		st.fail("NextCompletion(%q): %v", session, err)
	case c.Session != session:
		st.fail("NextCompletion(%q) gave one of session %q", session, c.Session)
	default:
		reg.rec.drain([]bgjob.Completion{c})
	}
}

// viewLookup looks a known job up through a Session view: its own
// session's finds it (unless it was forgotten), any other's never does.
func (st *stress) viewLookup(rng *rand.Rand) {
	id, ss, reg, ok := st.randomID(rng)
	if !ok {
		return
	}
	st.fh.views.Add(1)
	session := ss.spec.Session
	own := rng.IntN(3) > 0
	if !own {
		for session == ss.spec.Session {
			session = stressSessions[rng.IntN(len(stressSessions))]
		}
	}
	v := reg.r.Session(session)
	var s bgjob.Snapshot
	var err error
	var c bgjob.Chunk
	op := "Status"
	switch rng.IntN(4) {
	case 0:
		s, err = v.Status(id)
	case 1:
		op = "Read"
		c, err = v.Read(id, 0, 1+rng.IntN(10_000))
	case 2:
		op = "Wait"
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(rng.IntN(100))*time.Millisecond)
		s, err = v.Wait(ctx, id)
		cancel()
	default:
		op = "Cancel"
		st.n.cancels.Add(1)
		s, err = v.Cancel(id)
	}
	switch {
	case !own:
		st.fh.viewMisses.Add(1)
		if !errors.Is(err, bgjob.ErrNotFound) {
			st.fail("session %q view's %s of %s (session %q): %v; want ErrNotFound", session, op, id, ss.spec.Session, err)
		}
	case errors.Is(err, context.DeadlineExceeded):
		st.n.waitOut.Add(1)
	case err != nil:
		st.notFound("view "+op, err)
	case op == "Read":
		st.checkChunk(ss, id, 0, c)
	default:
		st.checkSnap("view "+op, ss, s)
	}
}

// viewStart launches spec through a Session view, with Spec.Session left
// for the view to fill in, or set to the view's.
func (st *stress) viewStart(reg *stressReg, spec bgjob.Spec, rng *rand.Rand) (bgjob.Snapshot, error) {
	st.fh.viewLaunches.Add(1)
	v := reg.r.Session(spec.Session)
	if rng.IntN(2) == 0 {
		spec.Session = ""
	}
	s, err := v.Start(context.Background(), spec)
	if err == nil && s.Session != v.Name() {
		st.fail("view %q Start gave a job of session %q", v.Name(), s.Session)
	}
	return s, err
}
