package bgjob

import (
	"context"
	"errors"
	"fmt"
	"slices"
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
	// Set by New and never written again.
	cfg Config
	// defaultShell reports that Config.Shell was nil: a job's command
	// line is {"/bin/sh", "-c", command} (Unix), which limitArgv knows.
	defaultShell bool
	// defaultSandbox is Config.Sandbox with its paths resolved; sandbox
	// the platform's enforcer, found and tried at the first sandboxed
	// launch (at New with Config.Sandbox).
	defaultSandbox *Sandbox
	sandbox        *sandboxer
	key            [32]byte // keys the ID hash
	jn             journal  // durable mode's records, or memJournal
	cg             *cgroups // where jobs get their cgroups (Linux)
	// ctx is the context the Admitter gets. Close cancels it as soon as
	// its own ctx ends with jobs still running (so that an Admitter that
	// honours it lets go), and at the latest once every goroutine of the
	// registry has ended; Detach cancels it once its jobs are released.
	ctx   context.Context
	abort context.CancelFunc

	// now is the registry's clock. Retention, the start and end times of
	// jobs and the supervisor's timers (wall, idle, kill grace) read it.
	// New sets time.Now; a test may replace it before the first launch
	// (SetClock) and must then poke the jobs when it moves it.
	now func() time.Time

	// treeAge is how long a listing of a job's tree is served again
	// (treeMaxAge; a test may change it before the first launch).
	treeAge time.Duration

	// start carries out a launch plan (see plan). New sets startJob; a
	// test may replace it before the first launch (FailSpawns).
	start func(*plan) (*process, outputReader, error)
	// Test hooks, nil unless a test sets them before the first launch.
	hookSpawn   func(ID) // called just before a process is spawned
	hookCollect func(ID) // called just before a foreground caller takes its result
	hookHeld    func(ID) // called when a supervisor waits for its job's matches to be delivered

	// wg counts what Close and Detach wait for: each launch from its
	// admission until its supervisor has ended (whoever runs the
	// supervisor inherits the count: the job's goroutine, or the
	// RunForeground caller that supervises it inline), and each waiter
	// goroutine (see spawn).
	wg sync.WaitGroup

	hashers sync.Pool // keyed *blake3.Hasher, reused by jobID
	hooks   hookRuns  // the goroutines running a hook now (hooks.go)

	// mu guards the fields below, and the fields of job marked as
	// guarded by Registry.mu. It is never held while a hook runs, while
	// doing I/O or while signalling a process.
	mu sync.Mutex
	// jobs maps each ID to its current run: running, retained, or
	// finished with a RunForeground caller yet to read it. Written by
	// launch, by forgetLocked and by the journal's restore.
	jobs map[ID]*job
	// running counts the jobs admitted to run and not finished: launch
	// (or nextLocked, for a job leaving the queue) adds one, finish
	// takes it away. Queued jobs are not counted.
	running int
	// waiting is the queue of launches beyond MaxRunning (Config.Queue;
	// queue.go).
	waiting jobQueue
	closed  bool   // set once, by Close or Detach
	seq     uint64 // the last generation handed out: launch, restore
	// queues holds each session's undelivered completions: finish
	// appends, Completions takes the whole queue, NextCompletion its
	// oldest.
	queues map[string][]queued
	// queueWake holds, for each session a NextCompletion waits on, a
	// channel that finish closes (and deletes) when it queues one of
	// that session's completions.
	queueWake map[string]chan struct{}
	// over is set once Close or Detach has seen every goroutine of the
	// registry end: no completion can be queued any more. It closes
	// every channel of queueWake.
	over bool
	ret  retained // finished pollable jobs that nobody holds
	// matchQueues holds each session's undelivered matches: the
	// delivery goroutine appends, Matches takes the whole queue.
	matchQueues map[string]*matchQueue

	// feed holds the matches on their way to the delivery goroutine
	// (deliver.go), under its own lock.
	feed feed
}

// job is one run of a command. Its ID may name several runs over time;
// gen tells them apart.
type job struct {
	// Set when the job is built (by launch, or by the journal's restore)
	// and never written again, except gen: launch sets it under
	// Registry.mu as the run enters the table, before anyone else sees
	// the job; and started, which nextLocked sets again under job.mu as
	// the job leaves the queue, before its spawn (read it under job.mu,
	// or from the goroutine that spawns or supervises the job).
	id      ID
	gen     uint64
	spec    Spec          // validated, with Dir absolute
	timeout time.Duration // the effective wall-clock limit
	limits  Limits        // the effective limits: Spec.Limits over Config.Limits
	env     []string      // the whole environment
	started time.Time
	// in is an interactive job's input (Spec.Interactive or TTY), and
	// scr a TTY job's screen; nil for other jobs. Each is safe for
	// concurrent use.
	in   *input
	scr  *screen
	over chan struct{} // closed by finish once the job has finished, before its hooks run
	done chan struct{} // closed by finish once the job has finished and its hooks have run
	// released is closed by the supervisor when Detach has released the
	// job, which then never finishes in this registry (done stays open).
	released chan struct{}
	wake     chan struct{} // a poke for a supervisor that waits after its pipe's EOF

	// Requests to the supervisor. stopReq is set by Cancel, Close or
	// Detach, whichever comes first (never reset); force by Close when
	// its ctx ends; both are followed by a poke.
	stopReq atomic.Int32 // stopNone, stopCancel, stopClose or stopRelease
	force   atomic.Bool  // Close ran out of time: SIGKILL now
	// exited reports that the shell has exited: set by the waiter
	// goroutine or by the supervisor when its reader reports it.
	exited atomic.Bool
	// treeEmpty reports, in the leftover phase (LeftoversWait), that no
	// process of the tree is left: set by the supervisor's watcher.
	treeEmpty atomic.Bool
	// rd is the job's output reader while its supervisor has one: set
	// by spawn (or restore), cleared by the supervisor before it closes
	// the reader. poke moves its deadline.
	rd atomic.Pointer[outputReader]
	// counted reports that the job's launch holds a count in
	// Registry.wg: set by launch (or New, for an adopted job), cleared
	// once by launchDone.
	counted atomic.Bool

	// Guarded by Registry.mu.
	finished bool      // set once, by finish: the job has ended (done closes after its hooks)
	pollable bool      // set by a Start that launched or joined it, by background, or by restore
	holders  int       // RunForeground callers without their result yet: launch and join add, unhold and background take
	queued   bool      // in Registry.waiting: set by push, cleared as it leaves the queue
	leaving  bool      // taken out of the queue by Cancel or Close, to be finished by unqueue
	admitted bool      // counted in Registry.running: set by launch or nextLocked, cleared by finish
	heapIdx  int       // index in Registry.ret, or -1: kept by retention
	retEnd   time.Time // the end time by the registry's clock, as retention orders it: set by finish
	retBytes int64     // the size of the retained text: set by finish, changed by Readmit

	// mu guards the fields below. It is taken after Registry.mu, never
	// before. spawn writes pid; the supervisor writes out; finish writes
	// the rest once (Readmit may replace fin later).
	mu          sync.Mutex
	state       State
	exitCode    int
	pid         int
	containment Containment
	ended       time.Time
	reason      string
	usage       Usage   // set by finish
	out         *outbuf // the raw output while running; nil once fin is set
	fin         *final  // the admitted output once the job has ended
	finGen      uint64  // counts changes of fin, so Readmit never overwrites a newer one
	// usageMu guards live, the job's process while its snapshot may
	// read the usage so far from it: set by spawn (or New, for an
	// adopted job), cleared by the supervisor before it closes the
	// process; and tree, the same process while a snapshot may list its
	// tree (procs.go): set with live, cleared by the supervisor before
	// it reaps the shell, whose IDs may be another's after; listed,
	// the last listing of the tree; and usageRead, the last read of
	// live's usage.
	usageMu   sync.Mutex
	live      *process
	tree      *process
	listed    treeList
	usageRead usageRead

	// changed is closed when the job's output changes: by emit when
	// output comes, by finish when fin is set. A reader that waits for
	// output (ReadWait) makes it, and the one who closes it clears it,
	// so that output nobody waits for costs nothing.
	changed chan struct{}

	// ws is the job's part in watches (watch.go), with its own locking.
	ws watchState
}

// queued is a completion waiting in its session's queue, with its job, so
// that the journal can record its delivery.
type queued struct {
	c Completion
	j *job
}

// Stop requests, in job.stopReq.
const (
	stopNone    int32 = iota
	stopCancel        // Cancel: stop the job
	stopClose         // Close: stop the job
	stopRelease       // Detach: let go of the job, leaving its process running
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
	jn, idKey, err := openJournal(&c)
	if err != nil {
		return nil, err
	}
	key, err := newIDKey(idKey)
	if err != nil {
		return nil, fmt.Errorf("bgjob: new: ID key: %w", err)
	}
	if c.Subreaper {
		if err := enableSubreaper(); err != nil {
			return nil, fmt.Errorf("bgjob: new: Config.Subreaper: %w", err)
		}
	}
	cg, err := openCgroups(&c)
	if err != nil {
		return nil, err
	}
	if p := cg.enforceable(c.Limits); p != nil {
		cg.close()
		jn.close()
		return nil, fmt.Errorf("bgjob: new: %w", p.err("Config", ErrInvalidConfig))
	}
	var sb *Sandbox
	sbx := &sandboxer{}
	if c.Sandbox != nil {
		sb, err = sandboxPaths(c.Sandbox, "Config.Sandbox")
		if err == nil {
			err = sbx.ready(c.Bwrap)
		}
		if err != nil {
			cg.close()
			jn.close()
			if !errors.Is(err, ErrUnsupported) {
				err = fmt.Errorf("%w: %w", err, ErrInvalidConfig)
			}
			return nil, fmt.Errorf("bgjob: new: %w", err)
		}
	}
	ctx, abort := context.WithCancel(context.Background())
	r := &Registry{
		cfg:            c,
		defaultShell:   cfg.Shell == nil,
		defaultSandbox: sb,
		sandbox:        sbx,
		key:            key,
		jn:             jn,
		cg:             cg,
		ctx:            ctx,
		abort:          abort,
		now:            time.Now,
		treeAge:        treeMaxAge,
		start:          startJob,
		jobs:           make(map[ID]*job),
		queues:         make(map[string][]queued),
		queueWake:      make(map[string]chan struct{}),
		matchQueues:    make(map[string]*matchQueue),
	}
	adopted, err := jn.restore(r)
	if err != nil {
		cg.close()
		jn.close()
		abort()
		return nil, fmt.Errorf("bgjob: new: Config.StateDir: %w", err)
	}
	jn.purge()
	for _, a := range adopted {
		r.wg.Add(2) // the waiter and the supervisor
		a.j.counted.Store(true)
		a.j.watchUsage(a.p)
		waited := make(chan struct{})
		go r.await(a.j, a.p, waited)
		sv := r.newSupervisor(a.j, a.p, a.rd, waited, false)
		if a.lastOut.After(sv.lastOut) {
			// The idle timeout counts from the job's last output, which
			// may have come while no host watched it.
			sv.lastOut = a.lastOut
		}
		sv.resume = a.stop
		go sv.run()
	}
	// Queued jobs found in the state directory start as far as the
	// slots that the adopted jobs leave allow.
	r.mu.Lock()
	next := r.nextLocked()
	r.mu.Unlock()
	r.startQueued(next)
	return r, nil
}

// Start launches spec as a pollable job and returns at once with its
// snapshot. If a job with the same ID is running or queued (an identical
// launch in the same session, without Unique), Start joins it: no process
// starts and the snapshot has Joined set. A launch whose ID names a
// finished job replaces that job with a new run. With Config.Queue, a
// launch that finds every slot taken returns the job Queued, with its
// place (see Config.Queue). The snapshot lists no processes: the job has
// just started.
//
// ctx bounds only validation, Config.Guard and the launch; the job
// outlives it. Start fails with an error wrapping ErrInvalidSpec,
// ErrRejected, ErrTooManyRunning, ErrClosed or ctx.Err() when no job was
// launched. A process that cannot be started is not such an error: a
// job was launched, and it ends at once as Failed, with the reason in
// Snapshot.Reason and an error wrapping ErrSpawn from Snapshot.Err. Check
// both:
//
//	s, err := r.Start(ctx, spec)
//	if err == nil {
//		err = s.Err() // the job never ran
//	}
func (r *Registry) Start(ctx context.Context, spec Spec) (Snapshot, error) {
	j, joined, _, err := r.launch(ctx, "start", spec, false)
	if err != nil {
		return Snapshot{}, err
	}
	s := r.snapshot(j)
	s.Joined = joined
	return s, nil
}

// Status returns a snapshot of the job with the given ID. A running job's
// text passes the Admitter (Partial set) on every call. It fails with
// ErrNotFound if no such job is queued, running or retained.
//
// A running job's snapshot lists its live processes and, on Linux, the TCP
// ports they listen on (Snapshot.Processes, Snapshot.Ports); their command
// lines pass the Admitter too, as one text of a line per process. A
// listing reads the system (/proc, the job's cgroup, a sock_diag query of
// listening sockets), so each job keeps its last one and serves it again
// while it is younger than a second and the job has written no output
// since: a job that announces its port by printing it is listed anew by
// the next Status. Measured on 2 cores (bench workload 7,
// BenchmarkStatusTree): a Status that reuses the listing takes about 7 µs
// with a cgroup (most of it reading the cgroup's CPU usage) and 0.4–0.7 µs
// without; one that lists anew about 0.3–0.4 ms with a cgroup and
// 1.2–1.7 ms without, where every process of the machine is looked at
// (160 there).
func (r *Registry) Status(id ID) (Snapshot, error) { return r.status(anySession, id) }

func (r *Registry) status(sc scope, id ID) (Snapshot, error) {
	j, err := r.lookup(sc, "status", id)
	if err != nil {
		return Snapshot{}, err
	}
	return r.snapshotTree(j), nil
}

// lookup finds a job that may be polled: running, or finished and
// pollable, and of sc's session if sc names one. op names the caller's
// operation in the error.
func (r *Registry) lookup(sc scope, op string, id ID) (*job, error) {
	defer r.jn.purge()
	r.mu.Lock()
	defer r.mu.Unlock()
	r.evictLocked(r.now())
	j := r.jobs[id]
	if j == nil || (!j.pollable && j.finished) || !sc.holds(j) {
		return nil, fmt.Errorf("bgjob: %s %s: %w", op, id, ErrNotFound)
	}
	return j, nil
}

// snapshot copies j's state. A running job's text is admitted on the way
// out; a finished job's text was admitted when it ended.
func (r *Registry) snapshot(j *job) Snapshot {
	for {
		j.mu.Lock()
		s, v := j.snapshotLocked()
		j.mu.Unlock()
		switch s.State {
		case Running:
			s.Usage, _ = j.liveUsage()
		case Queued:
			var now State
			var leaving bool
			if s.QueuePosition, now, leaving = r.queuePlace(j); now != Queued {
				continue // it left the queue meanwhile: look again
			}
			if leaving && r.awaitUnqueued(j) {
				continue // cancelled out of the queue: its end is moments away
			}
		}
		return r.withOutput(j, s, v)
	}
}

// snapshotTree is snapshot with, for a running job, the processes of its
// tree and the ports they listen on (see treeOf).
func (r *Registry) snapshotTree(j *job) Snapshot {
	s := r.snapshot(j)
	if s.State == Running {
		s.Processes, s.Ports = r.treeOf(j, s.Output.Total)
	}
	return s
}

// snapshotLocked copies j's state, and for a running job the raw view of
// its output, which withOutput admits outside the lock.
func (j *job) snapshotLocked() (Snapshot, *rawView) {
	s := Snapshot{
		ID: j.id, Session: j.spec.Session, Command: j.spec.Command, Dir: j.spec.Dir,
		State: j.state, ExitCode: j.exitCode, PID: j.pid, Started: j.started, Ended: j.ended,
		Reason: j.reason, Containment: j.containment, Usage: j.usage,
	}
	if j.fin != nil {
		s.Output = j.fin.out
		return s, nil
	}
	v := j.out.view()
	return s, &v
}

// Wait blocks until the job has ended or ctx is done. It returns the final
// snapshot, or the current one and an error wrapping ctx.Err(). It fails
// with ErrNotFound if no such job is running or retained.
func (r *Registry) Wait(ctx context.Context, id ID) (Snapshot, error) {
	return r.wait(ctx, anySession, id)
}

func (r *Registry) wait(ctx context.Context, sc scope, id ID) (Snapshot, error) {
	j, err := r.lookup(sc, "wait", id)
	if err != nil {
		return Snapshot{}, err
	}
	ended := r.ended(j)
	if ended == nil {
		return r.snapshot(j), fmt.Errorf("bgjob: wait %s: called from the job's own Admitter while it ends: %w", id, ErrInvalidArgument)
	}
	select {
	case <-ended:
		return r.snapshot(j), nil
	case <-ctx.Done():
		return r.snapshotTree(j), fmt.Errorf("bgjob: wait %s: %w", id, ctx.Err())
	}
}

// Cancel stops the job for everyone who started or joined it: SIGTERM to
// its whole process group (CTRL_BREAK on Windows), then after
// Config.KillGrace, SIGKILL. It blocks until the job has ended, which the
// escalation bounds to about KillGrace plus a short drain of its output,
// and returns the final snapshot. A queued job is taken out of the queue
// and ends Cancelled at once (Reason "cancelled while queued"), having
// never run. Cancelling a job that has already ended returns its snapshot
// unchanged. It fails with ErrNotFound if no such job is queued, running
// or retained.
//
// A job that Detach released is no longer this Registry's to stop: Cancel
// returns at once with its snapshot (Running) and an error wrapping
// ErrClosed, and the job runs on for the Registry that adopts it. A
// Cancel that Detach overtakes returns so as soon as Detach has released
// the job; one that came first stops the job, and Detach waits for that.
func (r *Registry) Cancel(id ID) (Snapshot, error) { return r.cancel(anySession, id) }

func (r *Registry) cancel(sc scope, id ID) (Snapshot, error) {
	j, err := r.lookup(sc, "cancel", id)
	if err != nil {
		return Snapshot{}, err
	}
	r.mu.Lock()
	dropped := r.dropLocked(j)
	r.mu.Unlock()
	if dropped {
		r.unqueue(j, stopCancel) // it never ran
	} else {
		j.request(stopCancel)
	}
	ended := r.ended(j)
	if ended == nil {
		return r.snapshot(j), nil
	}
	select {
	case <-ended:
	case <-j.released:
		return r.snapshot(j), fmt.Errorf("bgjob: cancel %s: released by Detach: %w", id, ErrClosed)
	}
	return r.snapshot(j), nil
}

// request asks j's supervisor to stop (or release) the job, unless an
// earlier request stands, and wakes it to act on it.
func (j *job) request(req int32) {
	j.stopReq.CompareAndSwap(stopNone, req)
	j.poke()
}

// List returns snapshots of the session's jobs that can be polled,
// queued, running or retained, oldest first (by Snapshot.Started).
// Running jobs' texts pass the Admitter, and their processes and ports
// are listed as by Status.
func (r *Registry) List(session string) []Snapshot {
	defer r.jn.purge()
	r.mu.Lock()
	r.evictLocked(r.now())
	var js []*job
	for _, j := range r.jobs {
		if j.spec.Session == session && (j.pollable || !j.finished) {
			js = append(js, j)
		}
	}
	r.mu.Unlock()
	out := make([]Snapshot, len(js))
	for i, j := range js {
		out[i] = r.snapshotTree(j)
	}
	slices.SortStableFunc(out, func(a, b Snapshot) int { return a.Started.Compare(b.Started) })
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
		r.jn.delivered(e.j)
	}
	return out
}

// NextCompletion blocks until the session's completion queue holds a
// completion, then takes the oldest from the queue and returns it. It
// takes from the same queue as Completions, so each completion is
// delivered once, to one caller, however many goroutines call either
// method. It wakes when a job's end queues the completion; it does not
// poll.
//
// ctx bounds the wait: if it ends first, NextCompletion returns an error
// wrapping ctx.Err(). Once Close or Detach has returned and the queue is
// empty, it returns an error wrapping ErrClosed, since no completion can
// come any more; a call waiting then returns it too.
//
// In durable mode the completion returned is recorded as delivered, as
// by Completions.
func (r *Registry) NextCompletion(ctx context.Context, session string) (Completion, error) {
	for {
		r.mu.Lock()
		if q := r.queues[session]; len(q) > 0 {
			e := q[0]
			if len(q) == 1 {
				delete(r.queues, session)
			} else {
				q[0] = queued{} // let the job go
				r.queues[session] = q[1:]
			}
			r.mu.Unlock()
			r.jn.delivered(e.j)
			return e.c, nil
		}
		if r.over {
			r.mu.Unlock()
			return Completion{}, fmt.Errorf("bgjob: next completion: %w", ErrClosed)
		}
		wake := r.queueWake[session]
		if wake == nil {
			wake = make(chan struct{})
			r.queueWake[session] = wake
		}
		r.mu.Unlock()
		// From a JobStarted hook, its job runs first: it may be the
		// one whose completion comes next (hooks.go).
		r.runOwn(r.hooks.current())
		select {
		case <-wake:
		case <-ctx.Done():
			return Completion{}, fmt.Errorf("bgjob: next completion: %w", ctx.Err())
		}
	}
}

// wakeQueueLocked wakes the NextCompletion calls waiting on the session's
// queue. r.mu must be held.
func (r *Registry) wakeQueueLocked(session string) {
	if wake := r.queueWake[session]; wake != nil {
		close(wake)
		delete(r.queueWake, session)
	}
}

// endQueues records, once every goroutine of the registry has ended (Close
// or Detach), that no completion will be queued any more, and wakes every
// NextCompletion call, which then returns ErrClosed on an empty queue.
func (r *Registry) endQueues() {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.over = true
	for session := range r.queueWake {
		r.wakeQueueLocked(session)
	}
}

// Running returns the number of jobs that are running; queued jobs are
// not counted.
func (r *Registry) Running() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.running
}

// Close stops every running job as Cancel does, cancels every queued one
// (Reason "registry closed while queued"), and waits for every
// goroutine the registry started. If ctx ends first, the jobs still
// running are killed at once (SIGKILL), the context the Admitter gets is
// cancelled (so a final text still being admitted may be withheld), and
// Close returns ctx.Err() wrapped once the jobs are gone. After Close,
// Start, RunForeground and Readmit fail with ErrClosed; Status, Read, List
// and Completions go on serving what was retained. Close is idempotent.
func (r *Registry) Close(ctx context.Context) error {
	js, _ := r.shut(stopClose)
	r.leaveForClose()
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
	r.endQueues()
	r.abort()
	r.cg.close()
	r.jn.close()
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
// before its process starts. Queued jobs stay queued: their records keep
// them for the next Registry, which queues them again in their order, and
// here they stay Queued (with no place) in Status and List. Detach returns once every goroutine of the
// registry has ended. Afterwards Start, RunForeground and Readmit fail
// with ErrClosed, a released job stays Running in Status and List, Wait
// on it returns only when its ctx ends, and Cancel of it returns at once
// with an error wrapping ErrClosed (it is not stopped). A RunForeground call that
// launched a released job returns it Detached at once; one that joined
// it returns at its soft cap or when its ctx ends. Close after Detach
// returns at once.
//
// A released job's processes (its shell, and the keeper of its output)
// stay children of the host's process, which alone can reap them once
// they end: the next New, Close or Detach of a durable Registry in the
// process reaps those that have ended by then. A host that goes on
// running without one may see them as zombies.
func (r *Registry) Detach() error {
	if err := r.jn.releasable(); err != nil {
		return fmt.Errorf("bgjob: detach: %w", err)
	}
	if _, was := r.shut(stopRelease); was {
		return fmt.Errorf("bgjob: detach: %w", ErrClosed)
	}
	r.leaveForClose()
	r.wg.Wait()
	r.endQueues()
	r.abort()
	r.cg.close()
	r.jn.close()
	return nil
}

// shut marks the registry closed and passes req (stopClose or
// stopRelease) to every unfinished job. It returns those jobs, and
// whether the registry was closed already; a Detach then does nothing.
func (r *Registry) shut(req int32) ([]*job, bool) {
	r.mu.Lock()
	was := r.closed
	if was && req == stopRelease {
		r.mu.Unlock()
		return nil, true
	}
	r.closed = true
	var js []*job
	for _, j := range r.jobs {
		if !j.finished && !j.queued {
			js = append(js, j)
		}
	}
	// The queue: Close cancels it; Detach releases it (in durable mode
	// each job's record stays queued, for the next Registry).
	waiting := r.waiting.drain()
	for _, j := range waiting {
		j.leaving = req != stopRelease
	}
	r.mu.Unlock()
	for _, j := range js {
		j.request(req)
	}
	for _, j := range waiting {
		if req == stopRelease {
			r.launchDone(j)
		} else {
			r.unqueue(j, req)
		}
	}
	return js, was
}

func (r *Registry) isClosed() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.closed
}
