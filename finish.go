package bgjob

// outcome is how a job ended.
type outcome struct {
	state    State
	exitCode int
	reason   string
	notice   string // about leftover processes
	usage    Usage
	// limit is the reason of the limit that stopped the job, as the
	// kernel told it; else, for a job that failed, finish looks in the
	// end of its output for a breach of the limits in infer.
	limit string
	infer Limits
	// sandboxed: the job ran in a sandbox, whose failure to set up
	// finish tells from the start of the output (see sandboxFailure).
	sandboxed bool
}

// finish ends j: it admits j's final output, records how the job ended
// (in the table and in the journal), queues its completion, hands it to
// retention, calls the hooks outside any lock, and at last closes j.done.
// It is called once per job, by its supervisor or, for a job that never
// got a process, by spawn.
func (r *Registry) finish(j *job, o outcome) {
	if wt := j.ws.wt.Load(); wt != nil {
		wt.end() // the last line, before a WaitFor caller sees the end
	}
	// The input closes (Write fails from now on), and the screen keeps
	// what it has not been fed, before the raw output goes.
	if j.in != nil {
		j.in.end()
	}
	if j.scr != nil {
		j.scr.atEnd(j)
	}
	j.mu.Lock()
	v := j.out.view()
	j.mu.Unlock()
	var fin *final
	var panicked any
	if r.cfg.Admitter != nil {
		r.hooks.during(j, nil, func() { fin, panicked = r.admitFinalSafely(j, v, o.notice) })
	} else {
		fin = r.admitFinal(j, v, o.notice)
	}
	now := r.now()
	if o.sandboxed && o.state == Exited {
		if line, ok := sandboxFailure(o.exitCode, v.head); ok {
			// The command never ran: the sandbox could not be made.
			o.state, o.exitCode, o.reason = Failed, exitUnknown, "sandbox: "+line
			o.infer = Limits{}
		}
	}
	if o.limit == "" && !o.infer.IsZero() {
		o.limit = inferLimit(o.infer, v.last(inferTail))
	}
	category := categoryOf(o.state, o.exitCode)
	if o.limit != "" {
		category = CategoryLimit
		if o.reason == "" {
			o.reason = o.limit
		}
	}

	// The journal's record of the end is held from before the table
	// changes until it is written, so that a delivery or a purge of this
	// job, which the table change makes possible, comes after it.
	record := r.jn.ending(j)
	r.mu.Lock()
	j.mu.Lock()
	j.state, j.exitCode, j.reason, j.ended = o.state, o.exitCode, o.reason, now
	j.usage = o.usage
	j.fin, j.out = fin, nil
	j.finGen++
	j.wakeReadersLocked() // the output is final: Done from now on
	j.mu.Unlock()
	if j.admitted {
		r.running-- // a job that never left the queue held no slot
		j.admitted = false
	}
	j.retEnd, j.retBytes = now, fin.size()
	pollable := j.pollable
	c := Completion{ID: j.id, Session: j.spec.Session, Command: j.spec.Command, State: o.state, ExitCode: o.exitCode, Ended: now}
	if pollable {
		r.queues[c.Session] = append(r.queues[c.Session], queued{c: c, j: j})
		r.wakeQueueLocked(c.Session)
		if j.holders == 0 && r.jobs[j.id] == j {
			r.retainLocked(j)
		}
	}
	j.finished = true
	r.evictLocked(j.retEnd)
	// The slot this job held goes to the next queued job: the end of a
	// job is the event that starts it.
	next := r.nextLocked()
	r.mu.Unlock()
	r.startQueued(next)
	close(j.over)
	record(o, now, pollable)
	r.jn.purge()

	// A panicking Admitter's panic goes on once the job is finished and
	// the other hooks have run.
	defer func() {
		if panicked != nil {
			panic(panicked)
		}
	}()
	// The hooks run before done closes, so a Wait that returns has seen
	// them. A slow hook delays this job's end, never another's.
	defer close(j.done)

	t, onComplete := r.cfg.Telemetry, r.cfg.OnComplete
	if t == nil && (!pollable || onComplete == nil) {
		return
	}
	r.hooks.during(j, nil, func() {
		if t != nil {
			t.JobFinished(Event{
				ID: j.id, Session: j.spec.Session, State: o.state, ExitCode: o.exitCode,
				Duration: now.Sub(j.started), Bytes: v.total, Background: pollable,
				Category: category,
			})
		}
		if pollable && onComplete != nil {
			onComplete(c)
			r.jn.delivered(j)
		}
	})
}
