package bgjob

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"
)

// A launch goes through these steps, in order:
//
//  1. prepare: validate the Spec, resolve its directory, derive its ID
//     (coalesce.go), then Config.Guard;
//  2. join: a running job of the same ID takes the launch instead
//     (joinLocked), or a new job is admitted to the table (MaxRunning);
//  3. spawn: the journal records the job as starting, then the plan is
//     made (the command line and its wrappers, the job's input and
//     output, its containment) and carried out by startJob;
//  4. the job's supervisor takes over (supervise.go), in a goroutine of
//     its own or, for RunForeground, in the caller's.
//
// A new way to launch (a PTY, a cgroup, a sandbox wrapper) is a field of
// plan, set by a step here or by the journal, and a case in the platform
// file that carries it out; the registry itself does not change.

// plan is how a job's process is to be started: the steps of spawn fill
// it in, and startJob carries it out.
type plan struct {
	// The command line: Config.Shell (its program resolved in the host's
	// PATH) and the command, or Spec.Args (Args[0] resolved likewise),
	// then the wrappers around them, innermost first (durable mode's
	// exit-marker wrapper). args reports that the innermost command line
	// is Spec.Args: on Windows every argument is then quoted alike, with
	// no special case for cmd.exe.
	argv []string
	args bool
	dir  string
	env  []string

	// The job's input and output.
	input  inputPlan  // what it reads: Spec.Stdin, then EOF or the host's writes
	output outputPlan // where its stdout and stderr go

	// Its containment: on Linux a cgroup of its own (cg, made in cgs's
	// folder) where there is one, else a session of its own and the
	// marker (an environment entry) that the leftover check looks for;
	// on other Unix systems its session; on Windows a Job Object.
	cg     *jobCgroup
	cgs    *cgroups
	marker string
	// Without a cgroup on Linux, set by the spawn just before the fork:
	// a start time (clock ticks after boot) no process of the job can
	// be older than, and a count of the tasks the system had created by
	// then (0: unknown), for the leftover search (see newPIDsAbove).
	since, forks uint64

	// scratch is a directory made for the job (the sandbox's private
	// temp dir on macOS), removed with the process, or by whoever gives
	// up the plan.
	scratch string

	// The job's limits that are still to be enforced: all of them at
	// first; the containment step takes out those its cgroup enforces,
	// and limitArgv those the shell sets (Unix). On Windows the Job
	// Object takes them.
	limits Limits
}

// outputPlan says where a job's stdout and stderr go: always a pipe the
// host reads; in durable mode (file set) the host also copies it into a
// file as it reads it, and a keeper process holding the lifeline takes
// the pipe over if the host goes away (see durable_io_linux.go).
type outputPlan struct {
	file     string       // the output file; "" for none
	lim      readLimits   // bounds the file on disk
	lifeline *os.File     // the read end of the registry's lifeline, for the keeper
	log      *slog.Logger // for a file that cannot be written
}

// launch validates spec and either joins the running job of the same ID or
// starts a new one; op names the caller in errors. fg marks a
// RunForeground caller, who holds the job until it has its result. A new
// job's supervisor runs in a goroutine of its own, or, for fg, is returned
// for the caller to run (nil if the job ended at once).
func (r *Registry) launch(ctx context.Context, op string, spec Spec, fg bool) (*job, bool, *supervisor, error) {
	if err := ctx.Err(); err != nil {
		return nil, false, nil, fmt.Errorf("bgjob: %s: %w", op, err)
	}
	if r.isClosed() {
		return nil, false, nil, fmt.Errorf("bgjob: %s: %w", op, ErrClosed)
	}
	spec, id, timeout, err := r.prepare(spec)
	if err != nil {
		return nil, false, nil, fmt.Errorf("bgjob: %s: %w", op, err)
	}
	if g := r.cfg.Guard; g != nil {
		if err := g(ctx, spec); err != nil {
			return nil, false, nil, fmt.Errorf("bgjob: %s: %w: %w", op, ErrRejected, err)
		}
	}
	if err := ctx.Err(); err != nil {
		return nil, false, nil, fmt.Errorf("bgjob: %s: %w", op, err)
	}

	// Most launches in a burst of identical ones join: look first, and
	// build a job only for a new run.
	r.mu.Lock()
	if old := r.jobs[id]; old != nil && !r.closed && r.joinLocked(old, fg) {
		r.mu.Unlock()
		return old, true, nil, nil
	}
	r.mu.Unlock()
	j := r.newJob(spec, id, timeout)

	// With a queue, the journal's record of a queued job must be written
	// before anyone can take the job out of the queue: it holds the
	// record from before the decision until it is written.
	queuedRec := endQueueing
	if r.cfg.Queue {
		queuedRec = r.jn.queueing(j)
	}
	queued := false

	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		queuedRec(false)
		return nil, false, nil, fmt.Errorf("bgjob: %s: %w", op, ErrClosed)
	}
	// An identical launch may have come while the job was built.
	if old := r.jobs[id]; old != nil && r.joinLocked(old, fg) {
		r.mu.Unlock()
		queuedRec(false)
		return old, true, nil, nil
	}
	r.seq++
	j.gen = r.seq // also its place among equals in the queue
	if r.running >= r.cfg.MaxRunning {
		if queued = r.admitQueuedLocked(j); !queued {
			r.mu.Unlock()
			queuedRec(false)
			if r.cfg.Queue {
				return nil, false, nil, r.queueFull(op)
			}
			return nil, false, nil, fmt.Errorf("bgjob: %s: Config.MaxRunning %d: %w", op, r.cfg.MaxRunning, ErrTooManyRunning)
		}
	} else {
		r.running++
		j.admitted = true
	}
	if old := r.jobs[j.id]; old != nil {
		r.forgetLocked(old) // a finished run: the new one replaces it
	}
	j.pollable = !fg
	if fg {
		j.holders = 1
	}
	r.jobs[j.id] = j
	r.wg.Add(1) // the launch; the supervisor inherits it (a queued job's, runQueued)
	j.counted.Store(true)
	r.evictLocked(r.now())
	r.mu.Unlock()
	queuedRec(queued)

	r.jn.purge()
	if queued {
		// A slot's end starts it (runQueued); the caller gets it Queued.
		return j, false, nil, nil
	}
	settled := false
	if fg {
		// A hook that panics during the launch (JobStarted, or the
		// Admitter of a job that ended at once) must not leave the
		// caller's hold on the job behind; the panic goes on.
		defer func() {
			if !settled {
				r.background(j, false) // collects a finished job
			}
		}()
	}
	sv := r.spawn(j)
	if sv != nil {
		r.announce(j, sv)
		switch {
		case sv.over:
			sv = nil // JobStarted supervised it to its end (hooks.go)
		case !fg:
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
		if !done && !sv.over {
			go sv.run()
		}
	}()
	r.mu.Lock()
	bg := j.pollable
	r.mu.Unlock()
	r.hooks.during(j, sv, func() {
		t.JobStarted(Event{ID: j.id, Session: j.spec.Session, State: Running, ExitCode: exitUnknown, Background: bg})
	})
	done = true
}

// prepare validates spec and returns it with Dir resolved and a private
// Env, with its ID and its effective timeout. Its errors wrap
// ErrInvalidSpec and name the field.
func (r *Registry) prepare(spec Spec) (Spec, ID, time.Duration, error) {
	switch {
	case len(spec.Args) > 0 && spec.Command != "":
		return Spec{}, "", 0, specError("Args", "set with Command: set exactly one of them")
	case len(spec.Args) > 0:
		if spec.Args[0] == "" {
			return Spec{}, "", 0, specError("Args", "Args[0], the program, is empty")
		}
		for i, a := range spec.Args {
			if hasNUL(a) {
				return Spec{}, "", 0, specError("Args", "Args[%d] holds a NUL byte", i)
			}
		}
		spec.Args = slices.Clone(spec.Args)
	case strings.TrimSpace(spec.Command) == "":
		return Spec{}, "", 0, specError("Command", "empty (set Command or Args)")
	case hasNUL(spec.Command):
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
	if spec.Leftovers != LeftoversStop && spec.Leftovers != LeftoversWait {
		return Spec{}, "", 0, specError("Leftovers", "%d is neither LeftoversStop nor LeftoversWait", int(spec.Leftovers))
	}
	if field, why := spec.Limits.check(); field != "" {
		return Spec{}, "", 0, specError(field, "%s", why)
	}
	if p := r.cg.enforceable(spec.Limits.over(r.cfg.Limits)); p != nil {
		return Spec{}, "", 0, p.err("Spec", ErrInvalidSpec)
	}
	sb, err := r.sandboxOf(&spec)
	if err != nil {
		return Spec{}, "", 0, err
	}
	if sb != nil {
		if err := r.sandbox.ready(r.cfg.Bwrap); err != nil {
			return Spec{}, "", 0, fmt.Errorf("Spec.Sandbox: %w", err)
		}
	}
	spec.Sandbox = sb
	if spec.TTY != nil {
		if err := r.ttyCheck(); err != nil {
			return Spec{}, "", 0, fmt.Errorf("Spec.TTY: %w", err)
		}
		t := *spec.TTY
		spec.TTY, spec.Interactive = &t, true
	}
	if spec.Interactive {
		spec.Unique = true // each launch is a conversation of its own
	}
	if err := checkWatches(spec.Watches); err != nil {
		return Spec{}, "", 0, err
	}
	spec.Watches = slices.Clone(spec.Watches)
	spec.Dir = dir
	spec.Env = maps.Clone(spec.Env)
	timeout := spec.Timeout
	if timeout == 0 {
		timeout = r.cfg.DefaultTimeout
	}
	return spec, r.jobID(&spec, dir, timeout), timeout, nil
}

// newJob makes the job for a prepared spec. A job launched with Args
// shows them quoted as its Command (see Spec.Args).
func (r *Registry) newJob(spec Spec, id ID, timeout time.Duration) *job {
	if len(spec.Args) > 0 {
		spec.Command = quoteArgs(spec.Args)
	}
	env := r.cfg.Env // never written to: jobs without Spec.Env share it
	_, term := spec.Env["TERM"]
	if len(spec.Env) > 0 || spec.TTY != nil && !term {
		extra := make([]string, 0, len(spec.Env)+1)
		if spec.TTY != nil && !term {
			extra = append(extra, "TERM="+ttyTerm)
		}
		for k, v := range spec.Env {
			extra = append(extra, k+"="+v)
		}
		slices.Sort(extra)
		env = mergeEnv(r.cfg.Env, extra)
	}
	var in *input
	var scr *screen
	if spec.Interactive {
		in = newInput(spec.TTY != nil)
	}
	if spec.TTY != nil {
		scr = newScreen(spec.TTY)
	}
	j := &job{
		in:       in,
		scr:      scr,
		id:       id,
		spec:     spec,
		timeout:  timeout,
		limits:   spec.Limits.over(r.cfg.Limits),
		env:      env,
		started:  r.now(),
		over:     make(chan struct{}),
		done:     make(chan struct{}),
		released: make(chan struct{}),
		wake:     make(chan struct{}, 1),
		heapIdx:  -1,
		state:    Running,
		exitCode: exitUnknown,
		out:      newOutbuf(r.cfg.HeadBytes, r.cfg.TailBytes),
	}
	r.startWatches(j)
	return j
}

// ttyTerm is the TERM of a TTY job: what the screen's emulator
// understands.
const ttyTerm = "xterm-256color"

// ttyCheck refuses Spec.TTY where there is no terminal for it: on a
// system without PTY support here, and in durable mode, where a job
// must outlive its host and its terminal could not.
func (r *Registry) ttyCheck() error {
	if r.cfg.StateDir != "" {
		return fmt.Errorf("a terminal lives in the host and would not survive its restart, so durable mode (Config.StateDir) has none: %w", ErrUnsupported)
	}
	return ttySupported()
}

// specError is the error for a bad Spec field.
func specError(field, format string, args ...any) error {
	return fmt.Errorf("Spec.%s: %s: %w", field, fmt.Sprintf(format, args...), ErrInvalidSpec)
}

func hasNUL(s string) bool { return strings.IndexByte(s, 0) >= 0 }

// quoteArgs quotes args for a POSIX shell: a word made only of letters,
// digits and @%+=:,./_- stays as it is, any other (the empty one too) goes
// in single quotes (a quote inside closes them, is escaped with a
// backslash, and opens them again). The first word is quoted
// too if it holds '=' or is a reserved word, which the shell would take
// for an assignment or for syntax.
func quoteArgs(args []string) string {
	var b strings.Builder
	for i, a := range args {
		if i > 0 {
			b.WriteByte(' ')
		}
		bare := a != "" && strings.Trim(a, shellSafe) == ""
		if i == 0 && (strings.Contains(a, "=") || slices.Contains(shellReserved, a)) {
			bare = false
		}
		if bare {
			b.WriteString(a)
			continue
		}
		b.WriteByte('\'')
		b.WriteString(strings.ReplaceAll(a, "'", `'\''`))
		b.WriteByte('\'')
	}
	return b.String()
}

// shellSafe holds the bytes that need no quoting in a POSIX shell word.
const shellSafe = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789@%+=:,./_-"

// shellReserved holds the POSIX shell's reserved words that are made of
// safe bytes.
var shellReserved = []string{"case", "do", "done", "elif", "else", "esac", "fi", "for", "if", "in", "then", "until", "while"}

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
		defer r.launchDone(j) // even if a hook panics in finish
		r.finish(j, o)
		return nil
	}
	// The record exists before the process does.
	if err := r.jn.launching(j); err != nil {
		return end(outcome{state: Failed, exitCode: exitUnknown, reason: "state: " + err.Error()})
	}
	if r.hookSpawn != nil {
		r.hookSpawn(j.id)
	}
	if req := j.stopReq.Load(); req != stopNone {
		// A Cancel (or Close) that arrives before the process exists
		// prevents the spawn.
		return end(outcome{state: Cancelled, exitCode: exitCancelled, reason: stopReason(req) + " before start"})
	}
	pl, err := r.plan(j)
	if err != nil {
		return end(outcome{state: Failed, exitCode: exitUnknown, reason: "spawn: " + err.Error()})
	}
	p, rd, err := r.start(&pl)
	if err != nil {
		r.giveBack(&pl)
		return end(outcome{state: Failed, exitCode: exitUnknown, reason: "spawn: " + err.Error()})
	}
	if j.in != nil {
		// Write, CloseInput and Resize reach the job from now on; a
		// long Spec.Stdin goes first.
		j.in.attach(pl.input.conn, pl.input.onEOF)
		j.in.prime(r, j.spec.Stdin)
	}
	r.jn.started(j, p)
	j.watchUsage(p)
	kind, _ := p.containment()
	j.mu.Lock()
	j.pid, j.containment = p.pid, kind
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

// plan makes j's launch plan: the command line, then what the journal
// adds to it. A program named without a path separator (the shell's, or
// Args[0]) is looked up in the host's PATH, as os/exec does.
func (r *Registry) plan(j *job) (plan, error) {
	var argv []string
	if args := j.spec.Args; len(args) > 0 {
		prog, err := lookShell(args[0])
		if err != nil {
			return plan{}, err
		}
		argv = append(append(make([]string, 0, len(args)), prog), args[1:]...)
	} else {
		shell, err := lookShell(r.cfg.Shell[0])
		if err != nil {
			return plan{}, err
		}
		argv = make([]string, 0, len(r.cfg.Shell)+1)
		argv = append(append(append(argv, shell), r.cfg.Shell[1:]...), j.spec.Command)
	}
	pl := plan{argv: argv, args: len(j.spec.Args) > 0, dir: j.spec.Dir, env: j.env, cgs: r.cg, limits: j.limits,
		input: inputPlan{data: j.spec.Stdin, interactive: j.spec.Interactive, tty: j.spec.TTY}}
	if err := r.cg.place(j, &pl); err != nil {
		return plan{}, err
	}
	limitArgv(&pl, r.defaultShell)
	if err := r.wrap(j, &pl); err != nil {
		r.giveBack(&pl)
		return plan{}, err
	}
	if err := r.jn.wrap(j, &pl); err != nil {
		r.giveBack(&pl)
		return plan{}, err
	}
	return pl, nil
}

// wrap puts the job's command line into its sandbox, then hands it to
// Config.Launcher: the Launcher gets the whole command line, the
// sandbox's wrapper included.
func (r *Registry) wrap(j *job, pl *plan) error {
	if sb := j.spec.Sandbox; sb != nil {
		if err := r.sandbox.wrap(pl, sb); err != nil {
			return err
		}
	}
	if l := r.cfg.Launcher; l != nil {
		argv, err := l(slices.Clone(pl.argv))
		switch {
		case err != nil:
			return fmt.Errorf("launcher: %w", err)
		case len(argv) == 0 || argv[0] == "":
			return errors.New("launcher: returned no program")
		}
		for i, a := range argv {
			if hasNUL(a) {
				return fmt.Errorf("launcher: argument %d holds a NUL byte", i)
			}
		}
		pl.argv = argv
	}
	return nil
}

// giveBack undoes what a plan that is not carried out holds: its cgroup,
// its scratch directory.
func (r *Registry) giveBack(pl *plan) {
	r.cg.giveBack(pl)
	if pl.scratch != "" {
		os.RemoveAll(pl.scratch)
		pl.scratch = ""
	}
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
	case stopRelease:
		return "registry detached"
	}
	return "cancelled"
}
