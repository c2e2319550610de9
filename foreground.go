package bgjob

import (
	"context"
	"time"
)

// RunForeground launches spec (or joins the identical running job) and
// waits for it inline, woken by the job's end. If the job ends within
// fg.SoftCap, RunForeground returns its final snapshot. At the soft cap,
// or as soon as ctx is done, it returns the running job's snapshot with
// Detached set, its processes and ports listed as by Status: the job
// goes on, can be polled, waited on or cancelled by its ID, and its end
// queues a Completion.
//
// With Config.Queue, a launch that finds every slot taken waits in the
// queue, and that time counts against the soft cap: a call whose job is
// still queued at the cap returns it Detached and Queued.
//
// A job that only RunForeground callers held and that ended inline is
// forgotten once the last of them has its result: it cannot be polled
// and yields no Completion. Identical concurrent calls share one process
// and all get the result, including a call that arrives after the end but
// before an earlier caller has read it.
//
// ctx bounds only the inline wait and the launch; ending it detaches, it
// never stops the job. Errors are as for Start.
func (r *Registry) RunForeground(ctx context.Context, spec Spec, fg Foreground) (Result, error) {
	begin := time.Now()
	j, joined, sv, err := r.launch(ctx, "run", spec, true)
	if err != nil {
		return Result{}, err
	}
	softCap := fg.SoftCap
	if softCap <= 0 {
		softCap = defaultSoftCap
	}
	capAt := begin.Add(softCap)
	every := fg.Interval
	if every <= 0 {
		every = r.cfg.ProgressInterval
	}
	progressAt := begin.Add(every)
	if sv != nil {
		if res, done := r.superviseInline(ctx, j, sv, capAt, progressAt, fg.OnProgress != nil); done {
			return res, nil
		}
	}
	return r.awaitForeground(ctx, j, joined, capAt, progressAt, every, fg.OnProgress), nil
}

// superviseInline is the start of RunForeground for the caller that
// launched the job: it runs the job's supervisor itself, in the caller's
// goroutine, until the job ends, the soft cap passes, ctx is done or, with
// progress, the first progress report is due. A short job so costs no
// goroutine and no hand-off between goroutines, which is most of what
// separates it from a plain os/exec run.
//
// done reports that res is the caller's result. Otherwise the supervisor
// went to a goroutine of its own and the caller goes on waiting as a
// joiner does, so OnProgress (which may block, or call Cancel or Close)
// never runs while the caller owns the supervisor. The job's end hooks
// (the final admission, JobFinished, OnComplete) do run here, as they
// would in the job's own goroutine.
func (r *Registry) superviseInline(ctx context.Context, j *job, sv *supervisor, capAt, progressAt time.Time, progress bool) (res Result, done bool) {
	// ctx's end interrupts the watch.
	poked := make(chan struct{})
	stop := context.AfterFunc(ctx, func() { j.poke(); close(poked) })
	until := capAt
	if progress && progressAt.Before(until) {
		until = progressAt
	}
	finished := sv.watch(until, ctx.Done())
	// No poke from ctx after this: it would cut end's drain short.
	if !stop() {
		<-poked
	}
	if !finished {
		go sv.run()
		return Result{}, false
	}
	func() {
		ended := false
		defer func() {
			// The launch's count, which run would have released, goes
			// even if a hook panics in end; so does the caller's hold.
			r.launchDone(j)
			if !ended {
				r.background(j, false) // collects a finished job
			}
		}()
		sv.end()
		ended = true
	}()
	select {
	case <-j.done:
		return r.collect(j, false), true
	default: // Detach released the job: it runs on, unfinished
		return r.background(j, false), true
	}
}

// awaitForeground waits, woken by the job's end, until the job ends, the
// soft cap passes or ctx is done, reporting progress every interval
// meanwhile.
func (r *Registry) awaitForeground(ctx context.Context, j *job, joined bool, capAt, progressAt time.Time, every time.Duration, onProgress func(Snapshot)) Result {
	returned := false
	defer func() {
		// A panicking OnProgress, recovered by the host, leaves the job
		// in the background (pollable), not held forever.
		if !returned {
			r.background(j, joined)
		}
	}()
	ended := r.ended(j)
	if ended == nil {
		// A join from the job's own Admitter as it ends: it cannot wait.
		returned = true
		return r.background(j, joined)
	}
	capTimer := time.NewTimer(time.Until(capAt))
	defer capTimer.Stop()
	var progress <-chan time.Time
	var progTimer *time.Timer
	if onProgress != nil {
		progTimer = time.NewTimer(time.Until(progressAt))
		defer progTimer.Stop()
		progress = progTimer.C
	}
	for {
		select {
		case <-ended:
			returned = true
			return r.collect(j, joined)
		case <-capTimer.C:
			returned = true
			return r.background(j, joined)
		case <-ctx.Done():
			returned = true
			return r.background(j, joined)
		case <-progress:
			// The snapshot is a running job's, as Status gives it; one
			// that ended meanwhile is collected on the next turn.
			if s := r.snapshot(j); !s.State.Done() {
				s.Joined = joined
				onProgress(s)
			}
			progTimer.Reset(every)
		}
	}
}

// collect gives a foreground caller the final result and drops its hold.
func (r *Registry) collect(j *job, joined bool) Result {
	if r.hookCollect != nil {
		r.hookCollect(j.id)
	}
	s := r.snapshot(j)
	s.Joined = joined
	r.unhold(j)
	return Result{Snapshot: s}
}

// background turns a foreground caller's job into a background one: it
// makes the job pollable and drops the caller's hold, and the caller gets
// a Detached result. If the job has ended meanwhile, the caller gets the
// final result instead.
func (r *Registry) background(j *job, joined bool) Result {
	r.mu.Lock()
	if j.finished || j.leaving {
		// Its hooks are running, or a Cancel or Close took it out of
		// the queue: the result is moments away.
		r.mu.Unlock()
		<-r.ended(j)
		return r.collect(j, joined)
	}
	j.pollable = true
	j.holders--
	// The snapshot is taken with the decision, so a Detached result is
	// always a running one.
	j.mu.Lock()
	s, v := j.snapshotLocked()
	j.mu.Unlock()
	s.QueuePosition = r.waiting.place(j)
	r.mu.Unlock()
	s = r.withOutput(j, s, v)
	if s.State == Running {
		// A job that goes on in the background is one whose processes
		// (a dev server) and ports the caller wants to know now.
		s.Usage, _ = j.liveUsage()
		s.Processes, s.Ports = r.treeOf(j, s.Output.Total)
	}
	s.Joined = joined
	return Result{Snapshot: s, Detached: true}
}

// unhold records that a foreground caller has its result. The last one
// hands a pollable job to retention and forgets any other.
func (r *Registry) unhold(j *job) {
	defer r.jn.purge()
	r.mu.Lock()
	defer r.mu.Unlock()
	j.holders--
	if j.holders > 0 || r.jobs[j.id] != j {
		return
	}
	if j.pollable {
		r.retainLocked(j)
		r.evictLocked(r.now())
	} else {
		r.forgetLocked(j)
	}
}
