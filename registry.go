package bgjob

import (
	"bytes"
	"context"
	"fmt"
	"maps"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Registry runs shell commands as jobs and keeps them for polling.
//
// A Registry is safe for use by many goroutines at once. Create it with
// [New] and stop it with [Registry.Close], which stops every running job
// and waits for every goroutine the Registry started.
type Registry struct {
	cfg   Config
	key   [32]byte
	ctx   context.Context // passed to the Admitter; cancelled once Close is done
	abort context.CancelFunc
	now   func() time.Time // the clock of retention; tests replace it

	// Seams for tests; nil in production.
	start       func(argv []string, dir string, env []string, stdin string) (*process, outputReader, error)
	hookSpawn   func(ID) // before a process is spawned
	hookCollect func(ID) // before a foreground caller takes its final result

	// wg counts the goroutines of running jobs (two each: the supervisor
	// and the waiter) and the launches between admission and spawn.
	wg sync.WaitGroup

	mu sync.Mutex // guards the fields below and job.{pollable,holders,heapIdx,retEnd,retBytes}
	// jobs maps each ID to its current run: running, retained, or
	// finished with a RunForeground caller yet to read it.
	jobs    map[ID]*job
	running int                 // jobs launched and not finished
	closed  bool                // Close has begun
	seq     uint64              // the last generation handed out
	queues  map[string][]queued // undelivered completions by session
	ret     retained
	// Durable mode only: the state directory, and the jobs forgotten
	// since the last sweep, whose folders sweep handles outside the lock.
	st    *store
	trash []*job

	hashers sync.Pool // keyed *blake3.Hasher, reused by jobID
}

// job is one run of a command. Its ID may name several runs over time; gen
// tells them apart.
type job struct {
	id      ID
	gen     uint64
	spec    Spec // validated, with Dir absolute
	timeout time.Duration
	argv    []string
	env     []string
	started time.Time
	done    chan struct{} // closed when the job has ended and its hooks have run
	wake    chan struct{} // pokes the supervisor once its pipe is at EOF

	// Requests to the supervisor, set by Cancel and Close.
	stopReq atomic.Int32 // stopNone, stopCancel or stopClose
	force   atomic.Bool  // Close ran out of time: SIGKILL now
	exited  atomic.Bool  // the shell has exited (set by the waiter)
	rd      atomic.Pointer[outputReader]

	// Guarded by Registry.mu.
	finished bool      // the job has ended; done closes once the hooks have run
	pollable bool      // Start launched or joined it, or a foreground caller detached
	holders  int       // RunForeground callers that have not yet received their result
	heapIdx  int       // index in Registry.ret, or -1
	retEnd   time.Time // end time, as the retention order sees it
	retBytes int64     // size of the retained text

	mu       sync.Mutex // guards the fields below; taken after Registry.mu, never before
	state    State
	exitCode int
	pid      int
	ended    time.Time
	reason   string
	out      *outbuf // the raw output while running; nil once fin is set
	fin      *final  // the admitted output once the job has ended
	finGen   uint64  // counts changes of fin, so Readmit never overwrites a newer one

	// Durable mode only. run is the job's folder, set at launch. recMu
	// guards rec, the record as last written (or about to be), and
	// recGone, set once the folder is removed; it is taken before
	// Registry.mu, never after, since record writes do I/O.
	run     string
	recMu   sync.Mutex
	rec     record
	recGone bool
}

// queued is a completion waiting in its session's queue, with its job, so
// that durable mode can record its delivery.
type queued struct {
	c Completion
	j *job
}

// Stop requests, in job.stopReq.
const (
	stopNone int32 = iota
	stopCancel
	stopClose
	stopDetach // Detach: let go of the job without stopping it
)

// New returns a Registry configured by cfg. It fails with an error that
// wraps ErrInvalidConfig and names the field when cfg is malformed, and
// with ErrUnsupported when cfg asks for what this platform cannot do.
//
// With Config.StateDir set, New replays the state directory as that
// field's doc describes, and starts the goroutines of the running jobs
// it adopts; otherwise New starts no goroutine.
func New(cfg Config) (*Registry, error) {
	c, err := cfg.normalize()
	if err != nil {
		return nil, err
	}
	var st *store
	idKey := c.IDKey
	if c.StateDir != "" {
		if st, idKey, err = openStore(&c); err != nil {
			return nil, err
		}
	}
	key, err := newIDKey(idKey)
	if err != nil {
		return nil, fmt.Errorf("bgjob: new ID key: %w", err)
	}
	if c.Subreaper {
		if err := enableSubreaper(); err != nil {
			return nil, fmt.Errorf("bgjob: Config.Subreaper: %w", err)
		}
	}
	ctx, abort := context.WithCancel(context.Background())
	r := &Registry{
		cfg:    c,
		key:    key,
		ctx:    ctx,
		abort:  abort,
		now:    time.Now,
		start:  startProcess,
		jobs:   make(map[ID]*job),
		queues: make(map[string][]queued),
		st:     st,
	}
	if st != nil {
		adopted := r.replay()
		r.sweep()
		for _, a := range adopted {
			r.wg.Add(2) // the waiter and the supervisor
			waited := make(chan struct{})
			go r.await(a.j, a.p, waited)
			go r.newSupervisor(a.j, a.p, a.rd, waited, false).run()
		}
	}
	return r, nil
}

// Start launches spec as a pollable job and returns at once with its
// snapshot. If a job with the same ID is running (an identical launch in
// the same session, without Unique), Start joins it: no process starts
// and the snapshot has Joined set. A launch whose ID names a finished job
// replaces that job with a new run.
//
// ctx bounds only validation, Config.Guard and the launch; the job
// outlives it. A process that cannot be started is not an error: the
// job ends at once as Failed, with the reason in Snapshot.Reason. Start
// fails with an error wrapping ErrInvalidSpec, ErrRejected,
// ErrTooManyRunning, ErrClosed or ctx.Err() when no job was launched.
func (r *Registry) Start(ctx context.Context, spec Spec) (Snapshot, error) {
	j, joined, _, err := r.launch(ctx, spec, false)
	if err != nil {
		return Snapshot{}, err
	}
	s := r.snapshot(j)
	s.Joined = joined
	return s, nil
}

// RunForeground launches spec (or joins the identical running job) and
// waits for it inline, woken by the job's end. If the job ends within
// fg.SoftCap, RunForeground returns its final snapshot. At the soft cap,
// or as soon as ctx is done, it returns the running job's snapshot with
// Detached set: the job goes on, can be polled, waited on or cancelled by
// its ID, and its end queues a Completion.
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
	j, joined, sv, err := r.launch(ctx, spec, true)
	if err != nil {
		return Result{}, err
	}
	softCap := fg.SoftCap
	if softCap <= 0 {
		softCap = defaultSoftCap
	}
	capAt := begin.Add(softCap)
	progressAt := begin.Add(r.cfg.ProgressInterval)
	if sv != nil {
		if res, done := r.superviseInline(ctx, j, sv, capAt, progressAt, fg.OnProgress != nil); done {
			return res, nil
		}
	}
	return r.awaitForeground(ctx, j, joined, begin, capAt, progressAt, fg.OnProgress), nil
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
			r.wg.Done()
			if !ended {
				r.detach(j, false) // collects a finished job
			}
		}()
		sv.end()
		ended = true
	}()
	select {
	case <-j.done:
		return r.collect(j, false), true
	default: // Detach let go of the job: it runs on, unfinished
		return r.detach(j, false), true
	}
}

// awaitForeground waits, woken by the job's end, until the job ends, the
// soft cap passes or ctx is done, reporting progress meanwhile.
func (r *Registry) awaitForeground(ctx context.Context, j *job, joined bool, begin, capAt, progressAt time.Time, onProgress func(time.Duration)) Result {
	returned := false
	defer func() {
		// A panicking OnProgress, recovered by the host, leaves the job
		// detached (pollable), not held forever.
		if !returned {
			r.detach(j, joined)
		}
	}()
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
		case <-j.done:
			returned = true
			return r.collect(j, joined)
		case <-capTimer.C:
			returned = true
			return r.detach(j, joined)
		case <-ctx.Done():
			returned = true
			return r.detach(j, joined)
		case <-progress:
			onProgress(time.Since(begin))
			progTimer.Reset(r.cfg.ProgressInterval)
		}
	}
}

// collect gives a foreground caller the final result and lets go of it.
func (r *Registry) collect(j *job, joined bool) Result {
	if r.hookCollect != nil {
		r.hookCollect(j.id)
	}
	s := r.snapshot(j)
	s.Joined = joined
	r.release(j)
	return Result{Snapshot: s}
}

// detach makes a foreground caller's job pollable and lets go of it, unless
// the job has ended meanwhile: then the caller gets the final result.
func (r *Registry) detach(j *job, joined bool) Result {
	r.mu.Lock()
	if j.finished {
		r.mu.Unlock()
		<-j.done // its hooks are running: the result is moments away
		return r.collect(j, joined)
	}
	j.pollable = true
	j.holders--
	// The snapshot is taken with the decision, so a Detached result is
	// always a running one.
	j.mu.Lock()
	s, v := j.snapshotLocked()
	j.mu.Unlock()
	r.mu.Unlock()
	s = r.withOutput(j, s, v)
	s.Joined = joined
	return Result{Snapshot: s, Detached: true}
}

// release records that a foreground caller has its result. The last one
// hands a pollable job to retention and forgets any other.
func (r *Registry) release(j *job) {
	defer r.sweep()
	r.mu.Lock()
	defer r.mu.Unlock()
	j.holders--
	if j.holders > 0 || r.jobs[j.id] != j {
		return
	}
	if j.pollable {
		r.retainLocked(j)
		r.pruneLocked(r.now())
	} else {
		r.forgetLocked(j)
	}
}

// launch validates spec and either joins the running job of the same ID or
// starts a new one. fg marks a RunForeground caller, who holds the job
// until it has its result. A new job's supervisor runs in a goroutine of
// its own, or, for fg, is returned for the caller to run (nil if the job
// ended at once).
func (r *Registry) launch(ctx context.Context, spec Spec, fg bool) (*job, bool, *supervisor, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, nil, fmt.Errorf("bgjob: launch: %w", err)
	}
	if r.isClosed() {
		return nil, false, nil, ErrClosed
	}
	spec, id, timeout, err := r.prepare(spec)
	if err != nil {
		return nil, false, nil, err
	}
	if g := r.cfg.Guard; g != nil {
		if err := g(ctx, spec); err != nil {
			return nil, false, nil, fmt.Errorf("%w: %w", ErrRejected, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, false, nil, fmt.Errorf("bgjob: launch: %w", err)
	}

	// Most launches in a burst of identical ones join: look first, and
	// build a job only for a new run.
	r.mu.Lock()
	if old := r.jobs[id]; old != nil && !r.closed && r.joinLocked(old, fg) {
		r.mu.Unlock()
		return old, true, nil, nil
	}
	r.mu.Unlock()
	j := r.build(spec, id, timeout)

	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return nil, false, nil, ErrClosed
	}
	// An identical launch may have come while the job was built.
	if old := r.jobs[id]; old != nil && r.joinLocked(old, fg) {
		r.mu.Unlock()
		return old, true, nil, nil
	}
	if r.running >= r.cfg.MaxRunning {
		r.mu.Unlock()
		return nil, false, nil, fmt.Errorf("%w (%d)", ErrTooManyRunning, r.cfg.MaxRunning)
	}
	if old := r.jobs[j.id]; old != nil {
		r.forgetLocked(old) // a finished run: the new one replaces it
	}
	r.seq++
	j.gen = r.seq
	j.pollable = !fg
	if fg {
		j.holders = 1
	}
	r.jobs[j.id] = j
	if r.st != nil {
		j.run = filepath.Join(r.st.sessionDir(j.spec.Session), string(j.id)+"."+strconv.FormatUint(j.gen, 10))
	}
	r.running++
	r.wg.Add(1) // the launch; the supervisor inherits it
	r.pruneLocked(r.now())
	r.mu.Unlock()

	r.sweep()
	settled := false
	if fg {
		// A hook that panics during the launch (JobStarted, or the
		// Admitter of a job that ended at once) must not leave the
		// caller's hold on the job behind; the panic goes on.
		defer func() {
			if !settled {
				r.detach(j, false) // collects a finished job
			}
		}()
	}
	sv := r.spawn(j)
	if sv != nil {
		r.announce(j, sv)
		if !fg {
			go sv.run()
			sv = nil
		}
	}
	settled = true
	return j, false, sv, nil
}

// announce tells Telemetry that j's process has started. If JobStarted
// panics, the job is not left unwatched: sv goes to a goroutine of its
// own before the panic goes on.
func (r *Registry) announce(j *job, sv *supervisor) {
	t := r.cfg.Telemetry
	if t == nil {
		return
	}
	done := false
	defer func() {
		if !done {
			go sv.run()
		}
	}()
	r.mu.Lock()
	bg := j.pollable
	r.mu.Unlock()
	t.JobStarted(Event{ID: j.id, Session: j.spec.Session, State: Running, ExitCode: exitUnknown, Background: bg})
	done = true
}

// prepare validates spec and returns it with Dir resolved and a private
// Env, with its ID and its effective timeout.
func (r *Registry) prepare(spec Spec) (Spec, ID, time.Duration, error) {
	if strings.TrimSpace(spec.Command) == "" {
		return Spec{}, "", 0, specError("Command", "empty")
	}
	if hasNUL(spec.Command) {
		return Spec{}, "", 0, specError("Command", "holds a NUL byte")
	}
	if hasNUL(spec.Dir) {
		return Spec{}, "", 0, specError("Dir", "holds a NUL byte")
	}
	dir := spec.Dir
	if dir == "" {
		dir = r.cfg.Dir
	} else if !filepath.IsAbs(dir) {
		dir = filepath.Join(r.cfg.Dir, dir)
	}
	dir = filepath.Clean(dir)
	if err := isDir(dir); err != nil {
		return Spec{}, "", 0, specError("Dir", "%v", err)
	}
	for k, v := range spec.Env {
		switch {
		case k == "":
			return Spec{}, "", 0, specError("Env", "empty key")
		case strings.ContainsAny(k, "=\x00"):
			return Spec{}, "", 0, specError("Env", "key %q holds '=' or NUL", k)
		case hasNUL(v):
			return Spec{}, "", 0, specError("Env", "value of %s holds a NUL byte", k)
		}
	}
	if spec.Timeout < 0 {
		return Spec{}, "", 0, specError("Timeout", "negative (%v)", spec.Timeout)
	}
	if spec.IdleTimeout < 0 {
		return Spec{}, "", 0, specError("IdleTimeout", "negative (%v)", spec.IdleTimeout)
	}
	spec.Dir = dir
	spec.Env = maps.Clone(spec.Env)
	timeout := spec.Timeout
	if timeout == 0 {
		timeout = r.cfg.DefaultTimeout
	}
	return spec, r.jobID(&spec, dir, timeout), timeout, nil
}

// build makes the job for a prepared spec.
func (r *Registry) build(spec Spec, id ID, timeout time.Duration) *job {
	env := r.cfg.Env // never written to: jobs without Spec.Env share it
	if len(spec.Env) > 0 {
		extra := make([]string, 0, len(spec.Env))
		for k, v := range spec.Env {
			extra = append(extra, k+"="+v)
		}
		slices.Sort(extra)
		env = mergeEnv(r.cfg.Env, extra)
	}
	return &job{
		id:       id,
		spec:     spec,
		timeout:  timeout,
		argv:     append(slices.Clip(r.cfg.Shell), spec.Command),
		env:      env,
		started:  time.Now(),
		done:     make(chan struct{}),
		wake:     make(chan struct{}, 1),
		heapIdx:  -1,
		state:    Running,
		exitCode: exitUnknown,
		out:      newOutbuf(r.cfg.HeadBytes, r.cfg.TailBytes),
	}
}

func specError(field, format string, args ...any) error {
	return fmt.Errorf("%w: Spec.%s: %s", ErrInvalidSpec, field, fmt.Sprintf(format, args...))
}

func hasNUL(s string) bool { return strings.IndexByte(s, 0) >= 0 }

// mergeEnv returns base with each "KEY=value" of the lists after it set,
// later entries replacing earlier ones of the same key.
func mergeEnv(base []string, lists ...[]string) []string {
	out := make([]string, 0, len(base)+8)
	index := make(map[string]int, len(base)+8)
	add := func(kv string) {
		k, _, _ := strings.Cut(kv, "=")
		if kv != "" && kv[0] == '=' {
			// Windows keeps per-drive directories as "=C:=C:\\dir".
			k = kv[:1+strings.IndexByte(kv[1:], '=')+1]
		}
		k = envKey(k)
		if i, ok := index[k]; ok {
			out[i] = kv
			return
		}
		index[k] = len(out)
		out = append(out, kv)
	}
	for _, kv := range base {
		add(kv)
	}
	for _, l := range lists {
		for _, kv := range l {
			add(kv)
		}
	}
	return out
}

// spawn starts j's process and returns its supervisor, which the caller
// must run, or ends j at once and returns nil if it was cancelled first or
// its process cannot start. It runs outside any lock and owns the
// launch's count in r.wg, which the supervisor inherits.
func (r *Registry) spawn(j *job) *supervisor {
	// end finishes a job that never got a process.
	end := func(o outcome) *supervisor {
		defer r.wg.Done() // even if a hook panics in finish
		r.finish(j, o)
		return nil
	}
	if j.run != "" {
		// The record exists before the process does.
		if err := r.prepareRun(j); err != nil {
			// Leave no half-made folder for the next replay to quarantine.
			j.recMu.Lock()
			r.removeRunLocked(j)
			j.recMu.Unlock()
			return end(outcome{state: Failed, exitCode: exitUnknown, reason: "state: " + err.Error()})
		}
	}
	if r.hookSpawn != nil {
		r.hookSpawn(j.id)
	}
	if req := j.stopReq.Load(); req != stopNone {
		// A Cancel (or Close) that arrives before the process exists
		// prevents the spawn.
		return end(outcome{state: Cancelled, exitCode: exitCancelled, reason: stopReason(req) + " before start"})
	}
	var (
		p   *process
		rd  outputReader
		err error
	)
	if j.run != "" {
		p, rd, err = startDurable(j.argv, j.spec.Dir, j.env, j.spec.Stdin, j.run, j.exited.Load, r.st.lim)
	} else {
		p, rd, err = r.start(j.argv, j.spec.Dir, j.env, j.spec.Stdin)
	}
	if err != nil {
		return end(outcome{state: Failed, exitCode: exitUnknown, reason: "spawn: " + err.Error()})
	}
	if j.run != "" {
		r.recordRunning(j, p.pid)
	}
	j.mu.Lock()
	j.pid = p.pid
	j.mu.Unlock()
	j.rd.Store(&rd)
	if watchExit(rd, p) {
		// The output reader sees the exit: no waiter goroutine.
		return r.newSupervisor(j, p, rd, closedChan, true)
	}
	r.wg.Add(1) // the waiter
	waited := make(chan struct{})
	go r.await(j, p, waited)
	return r.newSupervisor(j, p, rd, waited, false)
}

// closedChan stands for a waiter that is not there.
var closedChan = func() chan struct{} {
	c := make(chan struct{})
	close(c)
	return c
}()

// await is the waiter goroutine: it blocks until the shell exits, without
// reaping it (so its process group ID cannot be reused while the
// supervisor may still signal it), then wakes the supervisor.
func (r *Registry) await(j *job, p *process, waited chan<- struct{}) {
	defer r.wg.Done()
	defer close(waited)
	if err := p.wait(); err != nil && err != errReleased {
		r.cfg.Logger.Warn("bgjob: wait", "id", j.id, "pid", p.pid, "err", err)
	}
	j.exited.Store(true)
	j.poke()
}

// poke wakes the supervisor to look at the job's requests and flags: it
// interrupts a blocked read of the pipe, or a wait once the pipe is at EOF.
func (j *job) poke() {
	select {
	case j.wake <- struct{}{}:
	default:
	}
	if rd := j.rd.Load(); rd != nil {
		(*rd).SetReadDeadline(time.Unix(1, 0)) // in the past: the read returns now
	}
}

func stopReason(req int32) string {
	switch req {
	case stopClose:
		return "registry closed"
	case stopDetach:
		return "registry detached"
	}
	return "cancelled"
}

// outcome is how a job ended.
type outcome struct {
	state    State
	exitCode int
	reason   string
	notice   string // about leftover processes
}

// finish admits j's final output, records how it ended, queues its
// completion, hands it to retention, calls the hooks outside any lock,
// and at last closes j.done.
func (r *Registry) finish(j *job, o outcome) {
	j.mu.Lock()
	v := j.out.view()
	j.mu.Unlock()
	fin, panicked := r.admitFinalSafely(j, v, o.notice)
	now := time.Now()

	if j.run != "" {
		// Held across the table update and the write, so a delivery or
		// discard of this job comes after its end is on disk.
		j.recMu.Lock()
	}
	r.mu.Lock()
	j.mu.Lock()
	j.state, j.exitCode, j.reason, j.ended = o.state, o.exitCode, o.reason, now
	j.fin, j.out = fin, nil
	j.finGen++
	j.mu.Unlock()
	r.running--
	j.retEnd, j.retBytes = r.now(), int64(len(fin.out.Text))
	pollable := j.pollable
	c := Completion{ID: j.id, Session: j.spec.Session, Command: j.spec.Command, State: o.state, ExitCode: o.exitCode, Ended: now}
	if pollable {
		r.queues[c.Session] = append(r.queues[c.Session], queued{c: c, j: j})
		if j.holders == 0 && r.jobs[j.id] == j {
			r.retainLocked(j)
		}
	}
	j.finished = true
	r.pruneLocked(j.retEnd)
	r.mu.Unlock()
	if j.run != "" {
		r.recordEndLocked(j, o, now, pollable)
		j.recMu.Unlock()
		r.sweep()
	}
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

	if t := r.cfg.Telemetry; t != nil {
		t.JobFinished(Event{
			ID: j.id, Session: j.spec.Session, State: o.state, ExitCode: o.exitCode,
			Duration: now.Sub(j.started), Bytes: v.total, Background: pollable,
			Category: categoryOf(o.state, o.exitCode),
		})
	}
	if pollable && r.cfg.OnComplete != nil {
		r.cfg.OnComplete(c)
		if j.run != "" {
			r.delivered(j)
		}
	}
}

// admitFinalSafely is admitFinal that survives a panicking Admitter: the
// text is withheld, as when it fails, and the panic's value is returned
// for finish to raise again once the job is finished, so that a host that
// recovers from it (a RunForeground caller runs finish) is not left with
// a job that never ends.
func (r *Registry) admitFinalSafely(j *job, v rawView, notice string) (f *final, panicked any) {
	defer func() {
		if panicked = recover(); panicked != nil {
			f = &final{out: Output{Total: v.total, Omitted: v.total, Withheld: true,
				Notice: joinNotices(truncationNotice(v.omitted()), notice, noticeAdmitError)}}
		}
	}()
	return r.admitFinal(j, v, notice), nil
}

// admitFinal passes a finished job's output through the Admitter once and
// maps the admitted text back onto raw offsets for Read.
func (r *Registry) admitFinal(j *job, v rawView, notice string) *final {
	text := v.text()
	a := r.admit(AdmitRequest{ID: j.id, Session: j.spec.Session, Command: j.spec.Command, Text: text, Omitted: v.omitted()})
	f := &final{out: Output{Total: v.total, Omitted: v.omitted()}}
	if a.Withhold {
		f.out.Withheld, f.out.Omitted = true, v.total
	} else {
		f.out.Text = a.Text
		pieces := []rawPiece{{start: 0, end: int64(len(v.head)), bytes: v.head}}
		if v.omitted() > 0 {
			pieces = append(pieces, rawPiece{start: v.tailBegin, end: v.total, bytes: v.tail})
		}
		f.segs = mapSegments(a.Text, v.separator(), pieces)
	}
	f.out.Notice = joinNotices(truncationNotice(v.omitted()), notice, a.Notice)
	return f
}

func truncationNotice(omitted int64) string {
	if omitted == 0 {
		return ""
	}
	return fmt.Sprintf("output truncated: %d bytes omitted between head and tail", omitted)
}

func joinNotices(ns ...string) string {
	var b strings.Builder
	for _, n := range ns {
		if n == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		b.WriteString(n)
	}
	return b.String()
}

// Status returns a snapshot of the job with the given ID. A running job's
// text passes the Admitter (Partial set) on every call. It fails with
// ErrNotFound if no such job is running or retained.
func (r *Registry) Status(id ID) (Snapshot, error) {
	j, err := r.lookup(id)
	if err != nil {
		return Snapshot{}, err
	}
	return r.snapshot(j), nil
}

// lookup finds a job that may be polled: running, or finished and
// pollable.
func (r *Registry) lookup(id ID) (*job, error) {
	defer r.sweep()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.pruneLocked(r.now())
	j := r.jobs[id]
	if j == nil || (!j.pollable && j.finished) {
		return nil, fmt.Errorf("%w: %s", ErrNotFound, id)
	}
	return j, nil
}

// snapshot copies j's state. A running job's text is admitted on the way
// out; a finished job's text was admitted when it ended.
func (r *Registry) snapshot(j *job) Snapshot {
	j.mu.Lock()
	s, v := j.snapshotLocked()
	j.mu.Unlock()
	return r.withOutput(j, s, v)
}

// snapshotLocked copies j's state, and for a running job the raw view of
// its output, which withOutput admits outside the lock.
func (j *job) snapshotLocked() (Snapshot, *rawView) {
	s := Snapshot{
		ID: j.id, Session: j.spec.Session, Command: j.spec.Command, Dir: j.spec.Dir,
		State: j.state, ExitCode: j.exitCode, PID: j.pid, Started: j.started, Ended: j.ended,
		Reason: j.reason,
	}
	if j.fin != nil {
		s.Output = j.fin.out
		return s, nil
	}
	v := j.out.view()
	return s, &v
}

// withOutput fills in a running job's admitted output from its raw view.
func (r *Registry) withOutput(j *job, s Snapshot, v *rawView) Snapshot {
	if v == nil {
		return s
	}
	a := r.admit(AdmitRequest{ID: j.id, Session: j.spec.Session, Command: j.spec.Command, Text: v.text(), Partial: true, Omitted: v.omitted()})
	s.Output = Output{Text: a.Text, Total: v.total, Omitted: v.omitted(), Withheld: a.Withhold,
		Notice: joinNotices(truncationNotice(v.omitted()), a.Notice)}
	if a.Withhold {
		s.Output.Omitted = v.total
	}
	return s
}

// Read returns the job's output from the absolute stream offset, at most
// about max bytes of it. Read never consumes output: any offset may be
// read again, by any number of readers. Asking for bytes the registry no
// longer holds returns the next held byte with Chunk.Skipped set.
//
// Without an Admitter, Data is exactly the stream's bytes [Offset, Next).
// With one, Data is the admitted form of those bytes, so its length may
// differ from Next-Offset while the offsets stay those of the raw stream,
// and Read serves whole lines, so that no secret is split between two
// chunks: a chunk ends after a newline, running up to 4 KiB past max to
// finish a line, and a running job's incomplete last line waits until it
// is complete (only a line longer than max plus 4 KiB is cut). After the job ends, Data comes from the
// final admitted text: byte for byte where the Admitter kept the length,
// line for line where it kept the number of lines, and otherwise as the
// whole of the head or the tail, served only from its start.
//
// Read fails with ErrNotFound for an unknown ID and with
// ErrInvalidArgument for a negative offset, an offset past the end of
// the stream, or a max that is not positive.
func (r *Registry) Read(id ID, offset int64, max int) (Chunk, error) {
	if offset < 0 {
		return Chunk{}, fmt.Errorf("%w: Read offset %d: negative", ErrInvalidArgument, offset)
	}
	if max <= 0 {
		return Chunk{}, fmt.Errorf("%w: Read max %d: not positive", ErrInvalidArgument, max)
	}
	j, err := r.lookup(id)
	if err != nil {
		return Chunk{}, err
	}
	j.mu.Lock()
	if f := j.fin; f != nil {
		j.mu.Unlock()
		if offset > f.out.Total {
			return Chunk{}, pastEnd(offset, f.out.Total)
		}
		return f.read(offset, max), nil
	}
	b := j.out
	if total := b.total; offset > total {
		j.mu.Unlock()
		return Chunk{}, pastEnd(offset, total)
	}
	headEnd, tailBegin := b.held()
	c := Chunk{Offset: offset}
	if offset >= headEnd && offset < tailBegin {
		c.Skipped, c.Offset = tailBegin-offset, tailBegin
	}
	end := b.total
	if c.Offset < headEnd {
		end = headEnd
	}
	to := min(c.Offset+int64(max), end)
	if r.cfg.Admitter == nil {
		c.Data, c.Next = string(b.appendRange(nil, c.Offset, to)), to
		j.mu.Unlock()
		return c, nil
	}
	// Whole lines only, so that the Admitter never sees half a secret: a
	// chunk ends after its last newline, or runs on to finish its only
	// line (up to lineSlack bytes past max).
	data := b.appendRange(nil, c.Offset, min(to+lineSlack, end))
	total := b.total
	j.mu.Unlock()
	n := int(to - c.Offset)
	if i := bytes.LastIndexByte(data[:n], '\n'); i >= 0 {
		data = data[:i+1]
	} else if i := bytes.IndexByte(data[n:], '\n'); i >= 0 {
		data = data[:n+i+1]
	} else if c.Offset+int64(len(data)) == total && len(data) < max+lineSlack {
		data = nil // a running job's incomplete last line: wait for the rest
	} else {
		data = data[:n] // a line too long to serve whole
	}
	c.Next = c.Offset + int64(len(data))
	if len(data) > 0 {
		a := r.admit(AdmitRequest{ID: j.id, Session: j.spec.Session, Command: j.spec.Command,
			Text: string(data), Partial: true, Omitted: total - int64(len(data))})
		c.Data = a.Text
	}
	return c, nil
}

func pastEnd(offset, total int64) error {
	return fmt.Errorf("%w: Read offset %d: past the end of the stream (%d)", ErrInvalidArgument, offset, total)
}

// Wait blocks until the job has ended or ctx is done. It returns the final
// snapshot, or the current one and an error wrapping ctx.Err(). It fails
// with ErrNotFound if no such job is running or retained.
func (r *Registry) Wait(ctx context.Context, id ID) (Snapshot, error) {
	j, err := r.lookup(id)
	if err != nil {
		return Snapshot{}, err
	}
	select {
	case <-j.done:
		return r.snapshot(j), nil
	case <-ctx.Done():
		return r.snapshot(j), fmt.Errorf("bgjob: wait %s: %w", id, ctx.Err())
	}
}

// Cancel stops the job for everyone who started or joined it: SIGTERM to
// its whole process group (CTRL_BREAK on Windows), then after
// Config.KillGrace, SIGKILL. It blocks until the job has ended, which the
// escalation bounds to about KillGrace plus a short drain of its output,
// and returns the final snapshot. Cancelling a job that has already ended
// returns its snapshot unchanged. It fails with ErrNotFound if no such job
// is running or retained.
func (r *Registry) Cancel(id ID) (Snapshot, error) {
	j, err := r.lookup(id)
	if err != nil {
		return Snapshot{}, err
	}
	j.stopReq.CompareAndSwap(stopNone, stopCancel)
	j.poke()
	<-j.done
	return r.snapshot(j), nil
}

// List returns snapshots of the session's jobs that can be polled,
// running or retained, oldest first. Running jobs' texts pass the
// Admitter.
func (r *Registry) List(session string) []Snapshot {
	defer r.sweep()
	r.mu.Lock()
	r.pruneLocked(r.now())
	var js []*job
	for _, j := range r.jobs {
		if j.spec.Session == session && (j.pollable || !j.finished) {
			js = append(js, j)
		}
	}
	r.mu.Unlock()
	slices.SortFunc(js, func(a, b *job) int { return a.started.Compare(b.started) })
	out := make([]Snapshot, len(js))
	for i, j := range js {
		out[i] = r.snapshot(j)
	}
	return out
}

// Completions returns the session's queued completions, oldest first, and
// empties the queue: each completion is delivered once, even to
// concurrent callers. A queue grows until it is drained; a host that
// learns of ends through Config.OnComplete instead should drain it there.
//
// In durable mode each completion returned is recorded as delivered, so
// no later Registry on the same StateDir returns it again.
func (r *Registry) Completions(session string) []Completion {
	r.mu.Lock()
	q := r.queues[session]
	delete(r.queues, session)
	r.mu.Unlock()
	if q == nil {
		return nil
	}
	out := make([]Completion, len(q))
	for i, e := range q {
		out[i] = e.c
		if e.j.run != "" {
			r.delivered(e.j)
		}
	}
	return out
}

// Running returns the number of jobs that are running.
func (r *Registry) Running() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running
}

// Readmit runs the current Admitter again over the text of every finished
// job the registry holds, for example after the output policy changed.
// A job whose text changed meanwhile (a newer run, or another Readmit)
// is left alone. A withholding verdict clears the text. ctx bounds the
// whole pass; Readmit returns ctx.Err() wrapped if it ends early, or
// ErrClosed after Close.
func (r *Registry) Readmit(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return ErrClosed
	}
	var js []*job
	for _, j := range r.jobs {
		if j.finished {
			js = append(js, j)
		}
	}
	r.mu.Unlock()
	for _, j := range js {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("bgjob: readmit: %w", err)
		}
		j.mu.Lock()
		f, gen := j.fin, j.finGen
		j.mu.Unlock()
		if f.out.Withheld {
			continue
		}
		a := r.admit(AdmitRequest{ID: j.id, Session: j.spec.Session, Command: j.spec.Command, Text: f.out.Text, Omitted: f.out.Omitted})
		nf := f.readmitted(a)
		r.mu.Lock()
		j.mu.Lock()
		if j.finGen == gen {
			j.fin = nf
			j.finGen++
			r.resizeLocked(j, int64(len(nf.out.Text)))
		}
		j.mu.Unlock()
		r.mu.Unlock()
	}
	return nil
}

// readmitted returns f with its text replaced by the verdict a.
func (f *final) readmitted(a Admitted) *final {
	nf := &final{out: f.out}
	nf.out.Notice = joinNotices(f.out.Notice, a.Notice)
	if a.Withhold {
		nf.out.Text, nf.out.Withheld, nf.out.Omitted = "", true, f.out.Total
		return nf
	}
	nf.out.Text = a.Text
	if f.segs == nil {
		return nf
	}
	pieces := make([]rawPiece, len(f.segs))
	for k, sg := range f.segs {
		pieces[k] = rawPiece{start: sg.start, end: sg.end, lines: sg.rawLines}
		if old := f.out.Text[sg.lo:sg.hi]; sg.rawLines == nil && int64(len(old)) == sg.end-sg.start {
			// The old text stood byte for byte for the raw range, so
			// its lines are the raw lines.
			pieces[k].bytes = []byte(old)
		}
	}
	sep := ""
	if len(f.segs) == 2 {
		sep = f.out.Text[f.segs[0].hi:f.segs[1].lo]
	}
	nf.segs = mapSegments(a.Text, sep, pieces)
	return nf
}

// Close stops every running job as Cancel does and waits for every
// goroutine the registry started. If ctx ends first, the jobs still
// running are killed at once (SIGKILL), the context the Admitter gets is
// cancelled (so a final text still being admitted may be withheld), and
// Close returns ctx.Err() wrapped once the jobs are gone. After Close,
// Start, RunForeground and Readmit fail with ErrClosed; Status, Read, List
// and Completions go on serving what was retained. Close is idempotent.
func (r *Registry) Close(ctx context.Context) error {
	js, _ := r.shut(stopClose)
	all := make(chan struct{})
	go func() { // ends when the jobs' goroutines have; Close waits for it
		r.wg.Wait()
		close(all)
	}()
	var err error
	select {
	case <-all:
	case <-ctx.Done():
		err = fmt.Errorf("bgjob: close: %w", ctx.Err())
		for _, j := range js {
			j.force.Store(true)
			j.poke()
		}
		r.abort() // an Admitter that honours its ctx lets go now (fail closed)
		<-all
	}
	r.abort()
	return err
}

// Detach lets the host exit without stopping its jobs, so that a new
// Registry on the same StateDir (in this process or the next) adopts
// them. It needs durable mode: without Config.StateDir it returns
// ErrUnsupported and does nothing; after Close or Detach it returns
// ErrClosed.
//
// Detach ends the registry like Close, except that running jobs are
// released, not stopped: their goroutines end, their processes run on
// and go on writing their output and exit markers under StateDir, and
// their records stay "running". A job still being launched is cancelled
// before its process starts. Detach returns once every goroutine of the
// registry has ended. Afterwards Start, RunForeground and Readmit fail
// with ErrClosed, a released job stays Running in Status and List, and
// Wait on it returns only when its ctx ends. A RunForeground call that
// launched a released job returns it Detached at once; one that joined
// it returns at its soft cap or when its ctx ends. Close after Detach
// returns at once.
func (r *Registry) Detach() error {
	if r.st == nil {
		return fmt.Errorf("bgjob: detach: durable mode (Config.StateDir): %w", ErrUnsupported)
	}
	if _, was := r.shut(stopDetach); was {
		return ErrClosed
	}
	r.wg.Wait()
	r.abort()
	return nil
}

// shut marks the registry closed and passes req (stopClose or stopDetach)
// to every unfinished job. It returns those jobs, and whether the
// registry was closed already; a Detach then does nothing.
func (r *Registry) shut(req int32) ([]*job, bool) {
	r.mu.Lock()
	was := r.closed
	if was && req == stopDetach {
		r.mu.Unlock()
		return nil, true
	}
	r.closed = true
	var js []*job
	for _, j := range r.jobs {
		if !j.finished {
			js = append(js, j)
		}
	}
	r.mu.Unlock()
	for _, j := range js {
		j.stopReq.CompareAndSwap(stopNone, req)
		j.poke()
	}
	return js, was
}

func (r *Registry) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}
