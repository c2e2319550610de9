package bgjob

import (
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// drainGrace bounds how long a job waits for its output pipe to close
// after its shell has exited. A grandchild that keeps the pipe open
// delays the end by this much at most; then it is stopped as a leftover.
const drainGrace = 200 * time.Millisecond

// killWait bounds the wait for a process group to vanish after SIGKILL.
// Only a process stuck in the kernel outlives it.
const killWait = 2 * time.Second

// maxTimeout caps timeouts so that deadlines stay far from overflow.
const maxTimeout = 100 * 365 * 24 * time.Hour

// Read buffer sizes: a quiet job holds little, a loud one reads in big
// pieces.
const (
	minReadBuf = 512
	maxReadBuf = 256 << 10
)

// outputReader is the parent's end of a job's output pipe. Its reads
// honour deadlines, which is how the supervisor waits for output, for a
// timer and for a poke at once.
type outputReader interface {
	io.Reader
	SetReadDeadline(t time.Time) error
	Close() error
}

// supervise is the goroutine that owns a job's process from its start to
// its end. It reads the output, fires the wall and idle timeouts, turns a
// stop request into SIGTERM and, after the grace, SIGKILL of the whole
// group, reaps the shell, stops leftover processes of the group, and
// finishes the job. It is the only goroutine that signals or reaps the
// process, and it signals the group only while the group's ID cannot have
// been reused: before the shell is reaped (the waiter does not reap), or
// while other members of the group remain.
//
// It waits on events only: a read that returns data, EOF or its deadline
// (the next timer), or a poke from Cancel, Close or the waiter, which
// interrupts the read by moving its deadline into the past.
func (r *Registry) supervise(j *job, p *process, rd outputReader, waited <-chan struct{}) {
	defer r.wg.Done()
	grace := r.cfg.KillGrace
	wall := j.started.Add(min(j.timeout, maxTimeout))
	idle := min(j.spec.IdleTimeout, maxTimeout)

	var (
		buf      = make([]byte, minReadBuf)
		eof      bool
		lastOut  = j.started
		stopping bool      // a stop was begun: SIGTERM sent
		killed   bool      // SIGKILL sent
		killAt   time.Time // when SIGKILL is due, while stopping
		exitAt   time.Time // when the shell's exit was seen
		cause    outcome   // why the job was stopped, while stopping
		timer    *time.Timer
		// The read deadline last set, so that it is only set when it
		// changes (each set re-arms a runtime timer). A poke moves the
		// real deadline into the past; the read then fails with a
		// timeout, which forgets this cached value.
		deadlineSet time.Time
		haveSet     bool
		detached    bool // Detach released the job
	)
	begin := func(o outcome, now time.Time) {
		stopping, cause, killAt = true, o, now.Add(grace)
		p.signal(false)
	}
	for {
		now := time.Now()
		if !stopping && j.stopReq.Load() == stopDetach {
			detached = true
			break
		}
		if !stopping && exitAt.IsZero() {
			switch {
			case j.stopReq.Load() != stopNone:
				begin(outcome{state: Cancelled, exitCode: exitCancelled, reason: stopReason(j.stopReq.Load())}, now)
			case !now.Before(wall):
				begin(outcome{state: TimedOut, exitCode: exitTimedOut, reason: "timed out after " + j.timeout.String()}, now)
			case idle > 0 && !now.Before(lastOut.Add(idle)):
				begin(outcome{state: TimedOut, exitCode: exitTimedOut, reason: "idle for " + idle.String()}, now)
			}
		}
		if stopping && !killed && (j.force.Load() || !now.Before(killAt)) {
			p.signal(true)
			killed = true
		}
		if j.exited.Load() {
			if exitAt.IsZero() {
				exitAt = now
			}
			if eof || !now.Before(exitAt.Add(drainGrace)) {
				break
			}
		}

		// Sleep until the first of: output, the next deadline, a poke.
		var next time.Time
		if !stopping && exitAt.IsZero() {
			next = wall
			if idle > 0 {
				next = earliest(next, lastOut.Add(idle))
			}
		}
		if stopping && !killed {
			next = earliest(next, killAt)
		}
		if !exitAt.IsZero() {
			next = earliest(next, exitAt.Add(drainGrace))
		}
		if eof {
			timer = waitPoke(j.wake, timer, next)
			continue
		}
		if !haveSet || !next.Equal(deadlineSet) {
			rd.SetReadDeadline(next)
			deadlineSet, haveSet = next, true
		}
		if j.pending(stopping, killed, !exitAt.IsZero()) {
			continue // a poke came before the deadline was set
		}
		n, err := rd.Read(buf)
		if n > 0 {
			lastOut = time.Now()
			j.mu.Lock()
			j.out.write(buf[:n])
			j.mu.Unlock()
			if n == len(buf) && len(buf) < maxReadBuf {
				buf = make([]byte, 2*len(buf))
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			haveSet = false
		case err == io.EOF:
			eof = true
		default:
			r.cfg.Logger.Warn("bgjob: read output", "id", j.id, "err", err)
			eof = true
		}
	}
	if timer != nil {
		timer.Stop()
	}
	if detached {
		// The process runs on unwatched: end the waiter, let go of the
		// output and the process, and leave the job unfinished.
		j.rd.Store(nil)
		rd.Close()
		p.unwatch()
		<-waited
		p.release()
		return
	}

	o := outcome{state: Exited}
	code, err := p.reap()
	switch {
	case err == errNoMarker:
		// An adopted shell that died without writing its exit marker
		// (SIGKILL from outside): how it ended is unknown.
		o.state, o.reason = Failed, "lost"
	case err != nil:
		r.cfg.Logger.Warn("bgjob: reap", "id", j.id, "pid", p.pid, "err", err)
	}
	o.exitCode = code
	if stopping {
		o.state, o.exitCode, o.reason = cause.state, cause.exitCode, cause.reason
	}

	// Leftovers: processes of the group still alive after the shell.
	if n := p.leftovers(); n > 0 {
		now := time.Now()
		if !stopping {
			killAt = now.Add(grace)
			p.signal(false)
		}
		if j.force.Load() {
			killAt = now
		}
		if !killed && p.awaitEmpty(killAt) > 0 {
			killed = true
			p.signal(true)
		}
		if killed {
			p.signal(true) // again, for any process forked since
			p.awaitEmpty(time.Now().Add(killWait))
		}
		o.notice = fmt.Sprintf("stopped %d leftover process(es) of the job", n)
	}
	p.reapOrphans()

	// The writers are gone: read what is left, briefly, in case a process
	// that left the group still holds the pipe. A pipe at EOF and an
	// output file (durable mode), whose leftovers may have written after
	// the shell's exit, return at once.
	{
		rd.SetReadDeadline(time.Now().Add(drainGrace))
		for {
			n, err := rd.Read(buf)
			if n > 0 {
				j.mu.Lock()
				j.out.write(buf[:n])
				j.mu.Unlock()
			}
			if err != nil {
				break
			}
		}
	}
	j.rd.Store(nil)
	rd.Close()
	// The waiter has seen the exit (that is how the loop above ended) and
	// is ending; only then may its handle go. The handles are closed
	// before the job is finished, so that a Wait that returns sees none.
	<-waited
	p.release()
	r.finish(j, o)
}

// pending reports whether the job has a request or flag the supervisor
// has not acted on yet.
func (j *job) pending(stopping, killed, exitSeen bool) bool {
	if !exitSeen && j.exited.Load() {
		return true
	}
	if !stopping && j.stopReq.Load() != stopNone {
		return true
	}
	return !killed && j.force.Load()
}

// waitPoke blocks until a poke or the deadline next (none if zero),
// reusing t as its timer. It returns the timer for the next call.
func waitPoke(wake <-chan struct{}, t *time.Timer, next time.Time) *time.Timer {
	if next.IsZero() {
		<-wake
		return t
	}
	d := time.Until(next)
	if t == nil {
		t = time.NewTimer(d)
	} else {
		t.Reset(d)
	}
	select {
	case <-wake:
		t.Stop()
	case <-t.C:
	}
	return t
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}
