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
// Like killWait, it is real time: it is about the system, not a policy.
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
// that the hand-over loses nothing; whoever runs it owns all its fields.
//
// Times are of two kinds. The policy's (the wall and idle timeouts, the
// kill grace, the last output) are read from the registry's clock, so a
// test can move them; the system's (drainGrace, killWait, and the read
// deadline that the runtime's poller keeps) are real time. The next
// policy deadline is turned into a real one when the read deadline is set.
type supervisor struct {
	r  *Registry
	j  *job
	p  *process
	rd outputReader
	// waited is closed when the waiter goroutine has ended; watching
	// tells that there is none because rd reports the exit.
	waited   <-chan struct{}
	watching bool

	// The policy, fixed at the start.
	grace time.Duration // Config.KillGrace
	wall  time.Time     // when the wall-clock timeout fires (registry clock)
	idle  time.Duration // Spec.IdleTimeout, 0 for none

	buf      []byte    // the read buffer; it grows for a loud job
	eof      bool      // the output is at its end
	lastOut  time.Time // when output last came (registry clock)
	stopping bool      // a stop was begun: SIGTERM sent
	killed   bool      // SIGKILL sent
	killAt   time.Time // when SIGKILL is due, while stopping (registry clock)
	exitAt   time.Time // when the shell's exit was seen (real time)
	cause    outcome   // why the job was stopped, while stopping
	timer    *time.Timer
	// The deadlines behind the read deadline last set, so that it is
	// only set when they change (each set re-arms a runtime timer). A
	// poke moves the real deadline into the past; the read then fails
	// with a timeout, which forgets these cached values.
	nextSet, realNextSet time.Time
	haveSet              bool
	released             bool // Detach released the job: end lets go of it unfinished
	settled              bool // p.settle was called
	over                 bool // runHere supervised the job to its end

	// The leftover phase (Spec.Leftovers LeftoversWait): the shell has
	// exited, unreaped, while processes of its tree live on; the job
	// runs on until the watcher (ew, in a goroutine of its own that
	// closes ewDone as it ends) sees the tree empty, sets
	// job.treeEmpty and pokes.
	waiting bool
	ew      *emptyWatch
	ewDone  chan struct{}
	// resume is the stop that an adopted job's last host began and did
	// not finish; watch begins it again first.
	resume *outcome
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
// lets go of the launch's count in the registry's wait group.
func (s *supervisor) run() {
	defer s.r.launchDone(s.j)
	s.watch(time.Time{}, nil)
	s.end()
}

// runHere supervises the job to its end in the calling goroutine, which
// owns the supervisor and has not run it yet: a JobStarted hook that waits
// for its own job, or closes the registry (hooks.go). The launch then finds
// it over.
func (s *supervisor) runHere() {
	s.over = true
	defer s.r.launchDone(s.j)
	s.watch(time.Time{}, nil)
	s.end()
}

// begin starts to stop the job: SIGTERM now, SIGKILL after the grace.
// The journal records why first, so that a host that dies meanwhile
// leaves the job's end known.
func (s *supervisor) begin(o outcome, now time.Time) {
	s.stopping, s.cause, s.killAt = true, o, now.Add(s.grace)
	s.r.jn.stopping(s.j, o)
	s.signal(false)
}

// signal signals the job's tree, and logs a failure: the tree was not
// reached, so the job may outlive its stop.
func (s *supervisor) signal(kill bool) {
	if err := s.p.signal(kill); err != nil {
		s.r.cfg.Logger.Warn("bgjob: signal", "id", s.j.id, "pid", s.p.pid, "kill", kill, "err", err)
	}
}

// watch waits for the job's events and acts on them until the job can
// end: the shell has exited and its output is drained (or the drain's
// grace is over), or Detach released it. It then returns true, and end
// must follow. With until set (a time of the real clock), or quit, it
// returns false as soon as until passes or quit is closed (a poke must
// interrupt it for that), and watch may be called again later, from any
// goroutine.
func (s *supervisor) watch(until time.Time, quit <-chan struct{}) bool {
	j, rd := s.j, s.rd
	if !s.settled {
		s.settled = true
		s.p.settle()
	}
	for {
		// The policy's time first, then the real one: with the real
		// clock, a read deadline made from the two then never falls
		// before the policy's deadline.
		now := s.r.now()
		real := time.Now()
		if !until.IsZero() && !real.Before(until) {
			return false
		}
		select {
		case <-quit:
			return false
		default:
		}
		if !s.stopping && j.stopReq.Load() == stopRelease {
			s.released = true
			return true
		}
		if s.resume != nil {
			if !s.stopping {
				s.begin(*s.resume, now)
			}
			s.resume = nil
		}
		// A stop: by request, or by a timeout, unless the shell has
		// exited already (its leftovers are end's business), but for
		// the leftover phase, where the job runs on.
		if !s.stopping && (s.exitAt.IsZero() || s.waiting) {
			switch {
			case j.stopReq.Load() != stopNone:
				s.begin(outcome{state: Cancelled, exitCode: exitCancelled, reason: stopReason(j.stopReq.Load())}, now)
			case !now.Before(s.wall):
				s.begin(outcome{state: TimedOut, exitCode: exitTimedOut, reason: "timed out after " + j.timeout.String()}, now)
			case s.idle > 0 && !now.Before(s.lastOut.Add(s.idle)):
				s.begin(outcome{state: TimedOut, exitCode: exitTimedOut, reason: "idle for " + s.idle.String()}, now)
			}
			if s.stopping && s.waiting {
				// The shell is gone: what is left is leftovers, which
				// end stops (SIGTERM sent, SIGKILL at killAt).
				s.waiting = false
				return true
			}
		}
		// The grace is over, or Close ran out of time: SIGKILL.
		if s.stopping && !s.killed && (j.force.Load() || !now.Before(s.killAt)) {
			s.signal(true)
			s.killed = true
		}
		// The shell has exited: the job ends once its output is
		// drained, or drainGrace after the exit.
		if j.exited.Load() {
			if s.exitAt.IsZero() {
				s.exitAt = real
				if !s.stopping && j.spec.Leftovers == LeftoversWait && s.p.leftovers() > 0 {
					s.waitLeftovers()
					continue // its timers, now that it runs on
				}
			}
			if s.waiting && j.treeEmpty.Load() {
				// The last leftover has ended: drain, then end, as if
				// the shell had exited now.
				s.waiting = false
				s.exitAt = real
			}
			if !s.waiting && (s.eof || !real.Before(s.exitAt.Add(drainGrace))) {
				return true
			}
		}

		// Sleep until the first of: output, the next deadline, a poke.
		// The policy's next deadline (registry clock) and the system's
		// (real time):
		var next, realNext time.Time
		if !s.stopping && (s.exitAt.IsZero() || s.waiting) {
			next = s.wall
			if s.idle > 0 {
				next = earliest(next, s.lastOut.Add(s.idle))
			}
		}
		if s.stopping && !s.killed {
			next = earliest(next, s.killAt)
		}
		if !s.exitAt.IsZero() && !s.waiting {
			realNext = s.exitAt.Add(drainGrace)
		}
		if !until.IsZero() {
			realNext = earliest(realNext, until)
		}
		deadline := realNext
		if !next.IsZero() {
			deadline = earliest(deadline, real.Add(next.Sub(now)))
		}
		if s.eof && (!s.watching || s.waiting) {
			// The pipe is at its end and the reader does not see the
			// exit (or has reported it): only a poke (the waiter's, the
			// leftover watcher's, a request) or a deadline can come.
			s.timer = waitPoke(j.wake, s.timer, deadline)
			continue
		}
		if !s.stopping && (s.exitAt.IsZero() || s.waiting) {
			if room := j.matchRoom(); room != nil {
				// The job's watches have as many matches waiting
				// for delivery as they may (a slow OnMatch): read
				// no more until there is room, so that the job's
				// writes block, but act on everything else. The
				// job is not idle meanwhile: its writes wait for
				// us.
				s.lastOut = now
				if s.r.hookHeld != nil {
					s.r.hookHeld(j.id)
				}
				s.timer = waitRoom(j.wake, room, quit, s.timer, deadline)
				continue
			}
		} else {
			// A stop has begun, or the shell has exited (and the
			// leftover phase, if any, is over): the job's end must
			// not wait for OnMatch, so its output is read whatever
			// waits for delivery.
			j.unbound()
		}
		if !s.haveSet || !next.Equal(s.nextSet) || !realNext.Equal(s.realNextSet) {
			rd.SetReadDeadline(deadline)
			s.nextSet, s.realNextSet, s.haveSet = next, realNext, true
		}
		if j.pending(s.stopping, s.killed, !s.exitAt.IsZero(), s.waiting) {
			continue // a poke came before the deadline was set
		}
		select {
		case <-quit: // its poke may have come before the deadline was set
			return false
		default:
		}
		n, err := rd.Read(s.buf)
		if n > 0 {
			s.lastOut = s.r.now()
			j.emit(s.buf[:n])
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
	s.stopWatch()
	if s.released {
		// The process runs on unwatched: end the waiter, let go of the
		// output and the process, and leave the job unfinished.
		j.unlist()
		j.rd.Store(nil)
		rd.Close()
		if j.in != nil {
			// The host's end of its input goes; in durable mode the
			// holder keeps it open for the next host.
			j.in.end()
		}
		p.unwatch()
		<-s.waited
		j.watchUsage(nil)
		p.close()
		close(j.released) // a Cancel waiting for the job's end returns
		return
	}

	// The rest of the output is read whatever waits for OnMatch.
	j.unbound()

	// Leftovers: processes of the group still alive after the shell,
	// looked for before it is reaped: until then its PID, the ID of its
	// session and group, cannot be another's.
	var notice string
	// They get the stop a Cancel gives (from now, unless a stop was
	// already under way), and SIGKILL at once if Close ran out of time.
	killed, killAt := s.killed, time.Now().Add(s.killAt.Sub(s.r.now()))
	if n := p.leftovers(); n > 0 {
		if !s.stopping {
			killAt = time.Now().Add(s.grace)
			s.signal(false)
		}
		if j.force.Load() {
			killAt = time.Now()
		}
		if !killed && p.awaitEmpty(killAt) > 0 {
			killed = true
			s.signal(true)
		}
		if killed {
			s.signal(true) // again, for any process forked since
			p.awaitEmpty(time.Now().Add(killWait))
		}
		notice = fmt.Sprintf("stopped %d leftover process(es) of the job", n)
	}
	o := outcome{state: Exited}
	// No snapshot lists the tree once the shell is reaped: the IDs it
	// held (its PID, its session's) may be another's from then on.
	j.unlist()
	code, err := p.reap()
	switch {
	case err == errNoMarker:
		// An adopted shell that died without writing its exit marker
		// (SIGKILL from outside): how it ended is unknown.
		o.state, o.reason = Failed, "lost"
	case errors.Is(err, errMarkerUnread):
		// The marker is there, but could not be read now: the record
		// says so, and the marker stays for a look.
		o.state, o.reason = Failed, err.Error()
	case err != nil:
		s.r.cfg.Logger.Warn("bgjob: reap", "id", j.id, "pid", p.pid, "err", err)
	}
	o.exitCode = code
	o.usage = p.usage()
	o.sandboxed = j.spec.Sandbox != nil
	if s.stopping {
		o.state, o.exitCode, o.reason = s.cause.state, s.cause.exitCode, s.cause.reason
	} else if o.state == Exited && code != 0 && !j.limits.IsZero() {
		// Did a limit stop it? The kernel may say so; else finish looks
		// at the end of its output (see inferLimit).
		o.limit = p.limitHit(j.limits, code)
		o.infer = p.inferable(j.limits)
	}

	o.notice = notice
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
				j.emit(s.buf[:n])
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
	j.watchUsage(nil)
	p.close()
	s.r.finish(j, o)
}

// pending reports whether the job has a request or flag the supervisor
// has not acted on yet.
func (j *job) pending(stopping, killed, exitSeen, waiting bool) bool {
	if !exitSeen && j.exited.Load() || waiting && j.treeEmpty.Load() {
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

// waitRoom is waitPoke that also ends when room or quit is closed.
func waitRoom(wake, room, quit <-chan struct{}, t *time.Timer, next time.Time) *time.Timer {
	var fire <-chan time.Time
	if !next.IsZero() {
		d := time.Until(next)
		if t == nil {
			t = time.NewTimer(d)
		} else {
			t.Reset(d)
		}
		fire = t.C
	}
	select {
	case <-wake:
	case <-room:
	case <-quit:
	case <-fire:
		return t
	}
	if t != nil {
		t.Stop()
	}
	return t
}

func earliest(a, b time.Time) time.Time {
	if a.IsZero() || b.Before(a) {
		return b
	}
	return a
}

// waitLeftovers begins the leftover phase (Spec.Leftovers LeftoversWait):
// the shell has exited, and is not reaped, so its PID and the IDs of its
// group and session stay the job's; processes of its tree live on. A
// watcher goroutine waits for the tree to be empty without touching the
// process, which is the supervisor's: it has its own means (an inotify
// watch of the cgroup, its own pidfds of the members, or an interval
// poll; see emptyWatch) and pokes the job when it is empty. It is
// counted in the registry's wait group, and end stops it.
func (s *supervisor) waitLeftovers() {
	s.waiting = true
	w := s.p.emptyWatch()
	done := make(chan struct{})
	s.ew, s.ewDone = w, done
	j := s.j
	s.r.wg.Add(1)
	go func() {
		defer s.r.wg.Done()
		defer close(done)
		if w.wait() {
			j.treeEmpty.Store(true)
			j.poke()
		}
	}()
}

// stopWatch stops the leftover watcher, if there is one, and waits for its
// goroutine to end.
func (s *supervisor) stopWatch() {
	if s.ew == nil {
		return
	}
	s.ew.stop()
	<-s.ewDone
	s.ew = nil
}
