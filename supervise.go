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

// errExited is what a Read returns, once, when the reader watches the
// shell and has seen it exit.
var errExited = errors.New("bgjob: the shell exited")

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
// timer and for a poke at once. A reader that also watches the shell (see
// watchExit) returns errExited from a Read when the shell has exited, and
// after EOF its Read waits for that exit.
type outputReader interface {
	io.Reader
	SetReadDeadline(t time.Time) error
	Close() error
}

// supervisor owns a job's process from its start to its end. It reads the
// output, fires the wall and idle timeouts, turns a stop request into
// SIGTERM and, after the grace, SIGKILL of the whole group, reaps the
// shell, stops leftover processes of the group, and finishes the job. It
// is the only one that signals or reaps the process, and it signals the
// group only while the group's ID cannot have been reused: before the
// shell is reaped (the waiter does not reap), or while other members of
// the group remain.
//
// It waits on events only: a read that returns data, EOF or its deadline
// (the next timer), or a poke from Cancel, Close or the waiter, which
// interrupts the read by moving its deadline into the past.
//
// One goroutine at a time runs it: a background job's own goroutine
// (run), or the RunForeground caller that launched the job, which watches
// inline until the end, the soft cap, its ctx's end or the first progress
// report and then hands the rest to a goroutine. Its state lives here so
// that the hand-over loses nothing.
type supervisor struct {
	r  *Registry
	j  *job
	p  *process
	rd outputReader
	// waited is closed when the waiter goroutine has ended; watching
	// tells that there is none because rd reports the exit.
	waited   <-chan struct{}
	watching bool

	grace time.Duration
	wall  time.Time
	idle  time.Duration

	buf      []byte
	eof      bool
	lastOut  time.Time
	stopping bool      // a stop was begun: SIGTERM sent
	killed   bool      // SIGKILL sent
	killAt   time.Time // when SIGKILL is due, while stopping
	exitAt   time.Time // when the shell's exit was seen
	cause    outcome   // why the job was stopped, while stopping
	timer    *time.Timer
	// The read deadline last set, so that it is only set when it changes
	// (each set re-arms a runtime timer). A poke moves the real deadline
	// into the past; the read then fails with a timeout, which forgets
	// this cached value.
	deadlineSet time.Time
	haveSet     bool
	detached    bool // Detach released the job
}

func (r *Registry) newSupervisor(j *job, p *process, rd outputReader, waited <-chan struct{}, watching bool) *supervisor {
	return &supervisor{
		r: r, j: j, p: p, rd: rd, waited: waited, watching: watching,
		grace:   r.cfg.KillGrace,
		wall:    j.started.Add(min(j.timeout, maxTimeout)),
		idle:    min(j.spec.IdleTimeout, maxTimeout),
		buf:     make([]byte, minReadBuf),
		lastOut: j.started,
	}
}

// run supervises the job to its end, as the job's goroutine, and then
// lets go of the launch's hold on the registry's wait group.
func (s *supervisor) run() {
	defer s.r.wg.Done()
	s.watch(time.Time{}, nil)
	s.end()
}

// begin starts to stop the job: SIGTERM now, SIGKILL after the grace.
func (s *supervisor) begin(o outcome, now time.Time) {
	s.stopping, s.cause, s.killAt = true, o, now.Add(s.grace)
	s.p.signal(false)
}

// watch waits for the job's events and acts on them until the job can
// end: the shell has exited and its output is drained (or the drain's
// grace is over), or Detach let go of it. It then returns true, and end
// must follow. With until set, or quit, it returns false as soon as until
// passes or quit is closed (a poke must interrupt it for that), and watch
// may be called again later, from any goroutine.
func (s *supervisor) watch(until time.Time, quit <-chan struct{}) bool {
	j, p, rd := s.j, s.p, s.rd
	for {
		now := time.Now()
		if !until.IsZero() && !now.Before(until) {
			return false
		}
		select {
		case <-quit:
			return false
		default:
		}
		if !s.stopping && j.stopReq.Load() == stopDetach {
			s.detached = true
			return true
		}
		if !s.stopping && s.exitAt.IsZero() {
			switch {
			case j.stopReq.Load() != stopNone:
				s.begin(outcome{state: Cancelled, exitCode: exitCancelled, reason: stopReason(j.stopReq.Load())}, now)
			case !now.Before(s.wall):
				s.begin(outcome{state: TimedOut, exitCode: exitTimedOut, reason: "timed out after " + j.timeout.String()}, now)
			case s.idle > 0 && !now.Before(s.lastOut.Add(s.idle)):
				s.begin(outcome{state: TimedOut, exitCode: exitTimedOut, reason: "idle for " + s.idle.String()}, now)
			}
		}
		if s.stopping && !s.killed && (j.force.Load() || !now.Before(s.killAt)) {
			p.signal(true)
			s.killed = true
		}
		if j.exited.Load() {
			if s.exitAt.IsZero() {
				s.exitAt = now
			}
			if s.eof || !now.Before(s.exitAt.Add(drainGrace)) {
				return true
			}
		}

		// Sleep until the first of: output, the next deadline, a poke.
		var next time.Time
		if !s.stopping && s.exitAt.IsZero() {
			next = s.wall
			if s.idle > 0 {
				next = earliest(next, s.lastOut.Add(s.idle))
			}
		}
		if s.stopping && !s.killed {
			next = earliest(next, s.killAt)
		}
		if !s.exitAt.IsZero() {
			next = earliest(next, s.exitAt.Add(drainGrace))
		}
		if !until.IsZero() {
			next = earliest(next, until)
		}
		if s.eof && !s.watching {
			s.timer = waitPoke(j.wake, s.timer, next)
			continue
		}
		if !s.haveSet || !next.Equal(s.deadlineSet) {
			rd.SetReadDeadline(next)
			s.deadlineSet, s.haveSet = next, true
		}
		if j.pending(s.stopping, s.killed, !s.exitAt.IsZero()) {
			continue // a poke came before the deadline was set
		}
		select {
		case <-quit: // its poke may have come before the deadline was set
			return false
		default:
		}
		n, err := rd.Read(s.buf)
		if n > 0 {
			s.lastOut = time.Now()
			j.mu.Lock()
			j.out.write(s.buf[:n])
			j.mu.Unlock()
			if n == len(s.buf) && len(s.buf) < maxReadBuf {
				s.buf = make([]byte, 2*len(s.buf))
			}
		}
		switch {
		case err == nil:
		case errors.Is(err, os.ErrDeadlineExceeded):
			s.haveSet = false
		case err == io.EOF:
			s.eof = true
		case err == errExited:
			j.exited.Store(true)
		default:
			s.r.cfg.Logger.Warn("bgjob: read output", "id", j.id, "err", err)
			s.eof = true
		}
	}
}

// end follows a watch that returned true: it reaps the shell, stops the
// group's leftovers, drains the pipe and finishes the job, or, after
// Detach, lets go of the job unfinished.
func (s *supervisor) end() {
	j, p, rd := s.j, s.p, s.rd
	if s.timer != nil {
		s.timer.Stop()
	}
	if s.detached {
		// The process runs on unwatched: end the waiter, let go of the
		// output and the process, and leave the job unfinished.
		j.rd.Store(nil)
		rd.Close()
		p.unwatch()
		<-s.waited
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
		s.r.cfg.Logger.Warn("bgjob: reap", "id", j.id, "pid", p.pid, "err", err)
	}
	o.exitCode = code
	if s.stopping {
		o.state, o.exitCode, o.reason = s.cause.state, s.cause.exitCode, s.cause.reason
	}

	// Leftovers: processes of the group still alive after the shell.
	killed, killAt := s.killed, s.killAt
	if n := p.leftovers(); n > 0 {
		now := time.Now()
		if !s.stopping {
			killAt = now.Add(s.grace)
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
	// that left the group still holds the pipe. An output file (durable
	// mode), whose leftovers may have written after the shell's exit,
	// returns at once; a pipe already at EOF is not read again.
	if !s.eof || !s.watching {
		rd.SetReadDeadline(time.Now().Add(drainGrace))
		for {
			n, err := rd.Read(s.buf)
			if n > 0 {
				j.mu.Lock()
				j.out.write(s.buf[:n])
				j.mu.Unlock()
			}
			if err != nil {
				break
			}
		}
	}
	j.rd.Store(nil)
	rd.Close()
	// The waiter has seen the exit (that is how the watch ended) and is
	// ending; only then may its handle go. The handles are closed before
	// the job is finished, so that a Wait that returns sees none.
	<-s.waited
	p.release()
	s.r.finish(j, o)
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
