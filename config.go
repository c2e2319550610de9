package bgjob

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"time"
)

// Config configures a [Registry]. The zero Config is ready to use; every
// field documents what its zero value means.
type Config struct {
	// Shell is the program and leading arguments a job's Command is
	// appended to. If Shell is nil, it is {"/bin/sh", "-c"} on Unix and
	// {"cmd.exe", "/d", "/s", "/c"} on Windows. Shell[0] is looked up in
	// PATH when it holds no path separator.
	Shell []string

	// Dir is the working directory of jobs whose Spec.Dir is empty, and
	// the base of a relative Spec.Dir. If Dir is empty, the host's
	// working directory at New is used.
	Dir string

	// Env is the base environment of every job, as "KEY=value" strings.
	// If Env is nil, the host's environment at New is used. Either way,
	// settings that keep tools from waiting on a terminal are added
	// (GIT_TERMINAL_PROMPT=0, PAGER=cat, GIT_PAGER=cat), then each job's
	// Spec.Env.
	Env []string

	// DefaultTimeout is the wall-clock limit of a job whose
	// Spec.Timeout is 0. If DefaultTimeout is 0, it is 30 minutes.
	DefaultTimeout time.Duration

	// KillGrace is how long a job's process group has to exit after
	// SIGTERM (CTRL_BREAK on Windows) before it is killed. If KillGrace
	// is 0, it is 2s.
	KillGrace time.Duration

	// MaxRunning limits the number of jobs running at once; a launch
	// beyond it fails with ErrTooManyRunning, or waits in the queue
	// with Queue set. If MaxRunning is 0, it is 64.
	MaxRunning int

	// Queue, if set, makes a launch beyond MaxRunning wait for a free
	// slot instead of failing: the job is Queued (Snapshot.State, with
	// its place in Snapshot.QueuePosition) until a running job ends,
	// then starts. Waiting launches start by Spec.Priority, highest
	// first, and in the order they came among equals. An identical
	// launch joins a queued job as it joins a running one; Cancel takes
	// a job out of the queue (Cancelled, it never ran); Close cancels
	// the whole queue. A queued job's Timeout counts from its start, not
	// from its launch; a RunForeground call counts the time in the
	// queue against its soft cap, and detaches with the job Queued. In
	// durable mode the queue is kept across a restart (see StateDir).
	// If Queue is false, a launch beyond MaxRunning fails.
	Queue bool

	// MaxQueued bounds the queue: a launch that would make it longer
	// fails with ErrTooManyRunning, as without a queue. If MaxQueued is
	// 0, it is 1024. Without Queue it is unused.
	MaxQueued int

	// HeadBytes and TailBytes bound the output a job keeps: the first
	// HeadBytes and the last TailBytes of its stream. What lies between
	// is counted, not kept. If HeadBytes is 0 it is 64 KiB; if TailBytes
	// is 0 it is 1 MiB.
	HeadBytes int
	TailBytes int

	// Retention bounds the finished jobs kept for polling.
	Retention Retention

	// ProgressInterval is how often RunForeground calls
	// Foreground.OnProgress when Foreground.Interval is not set. If
	// ProgressInterval is 0, it is 5s.
	ProgressInterval time.Duration

	// Admitter, if not nil, sees every text before it leaves the
	// registry or is retained, and may rewrite or withhold it. If
	// Admitter is nil, all output is admitted as it is.
	//
	// Hooks should not panic. If one does while a job ends (Admitter,
	// Telemetry, OnComplete), the job is finished first (a panicking
	// Admitter's text withheld) and the panic goes on in the goroutine
	// that ended the job: the job's own, which ends the program, or the
	// RunForeground caller that launched it, who may recover.
	Admitter Admitter

	// Telemetry, if not nil, is told when each job starts and ends.
	Telemetry Telemetry

	// OnComplete, if not nil, is called once for each pollable job that
	// ends, with the same Completion that Completions returns. It is
	// called from the goroutine that supervises the job (for a job that
	// failed to spawn, from the launching call), never under the
	// registry's lock, after the completion is queued and before Wait on
	// that job returns. The job's end waits for it, so it must not block
	// for long; it never delays another job.
	OnComplete func(Completion)

	// OnMatch, if not nil, is called once for each match of a watch
	// (see [Watch]), with the same Match that Matches returns, after it
	// is queued. It is called from the registry's delivery goroutine,
	// one match at a time, in the order of each job's lines, never
	// under the registry's lock and never from a job's supervisor: a
	// job's output goes on while OnMatch runs. But OnMatch must not
	// block for long: while a job has 1024 matches waiting for it, the
	// job's output is no longer read (its writes block) until they are
	// delivered; a job being stopped, timed out or whose shell has
	// exited never waits so. So OnMatch must not wait for the end of a
	// job that matches (Wait, WaitFor on it) either. A Close or Detach
	// from OnMatch is served as from any hook.
	OnMatch func(Match)

	// Guard, if not nil, is called with every valid Spec before it is
	// launched (joins included); an error refuses the launch with an
	// error that wraps both ErrRejected and Guard's error. Use it for
	// allow-lists and directory jails. The Spec's Dir is absolute.
	Guard func(ctx context.Context, spec Spec) error

	// StateDir, if set, turns on durable mode: job records and output
	// are kept in this directory so jobs survive a host restart. It
	// must be an absolute path; it is created (0700) if missing. If
	// StateDir is empty, jobs live only in memory. Durable mode is
	// available on Linux only: elsewhere New fails with ErrUnsupported
	// when StateDir is set.
	//
	// In durable mode each run of a job has a folder (0700) under
	// StateDir/sessions/, in a folder per session named by a keyed hash
	// of the session, never the name itself. It holds record.json (0600:
	// ID, session, command, directory, timeouts, state, exit code, PID
	// and the process's start time, times, reason, whether the
	// completion was delivered; never the environment or stdin), written
	// to a temporary file, fsynced, renamed and the folder fsynced, first
	// before the process starts; output, which the job writes itself (it
	// is its stdout and stderr); and exit, where a wrapper /bin/sh writes
	// the shell's status (temporary file, then rename) when the shell
	// ends, even if the host is gone. A queued job (Queue) has its folder
	// and record from its launch, and an input file (0600) holding its
	// Spec.Env and Spec.Stdin, which it needs to start after a restart;
	// the file goes when the job starts or ends. The ID key is kept in
	// StateDir/idkey (0600) when IDKey is nil, so IDs stay stable across
	// restarts. While the host reads a job's output, the file is kept
	// within MaxOutputBytes on disk.
	//
	// The record also holds the job's watches, how far its output was
	// matched, and its matches queued and not yet delivered, with
	// their lines as the Admitter admitted them (admitted again when a
	// later Registry queues them). While watches still need what the
	// output file holds, holes are not punched there: with watches, the
	// file may exceed MaxOutputBytes by up to a quarter of it.
	//
	// New on a StateDir that holds records replays them. A finished job
	// comes back with its state, exit code and text (rebuilt from its
	// output file through HeadBytes/TailBytes and the Admitter), and its
	// completion, if it was never delivered, is queued for Completions
	// (OnComplete is not called for it); a completion returned by
	// Completions or passed to OnComplete is recorded as delivered and
	// never returned again by a later Registry. A job whose shell is
	// still running (same PID, same start time, same boot) is adopted:
	// watched until it ends, its output followed, cancellable, its
	// timeouts measured from its original start. A job whose shell is
	// gone becomes Exited with the code of its exit marker, or Failed
	// with Reason "lost" if there is none (it was killed by SIGKILL, or
	// the machine restarted); but a job of Spec.Leftovers LeftoversWait
	// whose tree still lives (its cgroup populated, or processes carrying
	// its marker) is adopted as waiting for it, and ends with its
	// marker's code when the tree is empty. A queued job is queued again,
	// in its place (Spec.Priority, then the order of the launches), and
	// starts when a slot is free, even if this Registry has no Queue (a
	// job whose input file is gone becomes Failed, "lost"). A job's text
	// is rebuilt once the process that copies its output to the file
	// while no host runs has copied the last of it (New waits up to 2s
	// in all for those; a text that may end early then says so in
	// Output.Notice). A job that a host had
	// begun to stop (Cancel, a timeout, Close) when it died ends as that
	// stop ends it (Cancelled or TimedOut), not with the exit status the
	// stop's signal gave it; if it still runs, the Registry that adopts
	// it goes on stopping it. A job recorded as starting becomes Failed
	// with Reason "spawn aborted". A record that cannot be read is moved
	// to StateDir/quarantine/ and logged to Logger; it never makes New
	// fail. Finished jobs are kept within Retention as in memory mode; a
	// job's folder is removed when it is evicted and its completion and
	// matches were delivered. A job with watches that ended while no
	// host ran has its output matched by New, from where the last host
	// stopped; its matches are queued for Matches (OnMatch is not called
	// for them, as OnComplete is not for replayed completions). An
	// adopted job's output is matched from there on as it is read.
	StateDir string

	// MaxOutputBytes bounds the disk space of a running job's output
	// file in durable mode: once the file takes more, the part between
	// the head and the tail that has been read already is freed (holes
	// punched, FALLOC_FL_PUNCH_HOLE; the file keeps its size and
	// offsets). While no Registry watches a job, its file grows without
	// bound. If MaxOutputBytes is 0, it is 64 MiB; it must be at least
	// HeadBytes+TailBytes+1 MiB. Without StateDir it is unused.
	MaxOutputBytes int64

	// IDKey keys the hash that makes job IDs. If IDKey is nil, 32
	// random bytes are used, so IDs are stable for one Registry and
	// unguessable to anyone else. A non-nil IDKey must be at least 16
	// bytes long.
	IDKey []byte

	// Subreaper, on Linux, makes the host process a child subreaper
	// (prctl PR_SET_CHILD_SUBREAPER) so that orphaned processes of jobs
	// are re-parented to it and reaped by the registry instead of
	// lingering as zombies. It changes a process-wide attribute and is
	// never undone. On other systems New fails with ErrUnsupported when
	// it is set.
	Subreaper bool

	// Sandbox, if set, is the sandbox of every job that sets none of its
	// own (see [Sandbox]). New fails with ErrUnsupported if this host
	// cannot enforce it, and with ErrInvalidConfig naming a bad path.
	Sandbox *Sandbox

	// Bwrap is the path of bubblewrap, which enforces sandboxes on
	// Linux. If Bwrap is empty, "bwrap" is looked up in PATH.
	Bwrap string

	// Launcher, if set, rewrites the command line of every job before it
	// is spawned: to run it in a container or VM runner of the host's,
	// under firejail or nsjail, on another machine. It gets the whole
	// command line, which it may wrap or replace, and returns the one to
	// run; its program is looked up in PATH. It runs after the job's
	// sandbox has wrapped the command line (so a Launcher that isolates
	// the job its own way should be used without Sandbox, or must provide
	// what bubblewrap needs) and after the limits set on each process
	// were put into it (so they hold wherever the command line runs); the
	// job's containment and, in durable mode, its exit-marker wrapper
	// are around it. A Launcher that fails fails the job (ErrSpawn) with
	// its error in the Reason. It is called outside any lock, once per
	// spawn, never for a launch that joins a running job.
	Launcher func(argv []string) ([]string, error)

	// Limits holds the limits of every job; a non-zero field of
	// Spec.Limits replaces its own (see [Limits]). New fails with
	// ErrUnsupported if this host cannot enforce them.
	Limits Limits

	// Cgroup says where jobs get a cgroup of their own, on Linux. If
	// Cgroup is empty, the registry looks for a writable cgroup v2
	// hierarchy (in /proc/self/mountinfo) and makes its folder inside
	// the host's own cgroup; if it finds none, jobs are contained by
	// their session (see ContainSession). "off" never makes a cgroup.
	// An absolute path names the cgroup v2 folder to make the
	// registry's folder in; New fails if it cannot. The registry's
	// folder is bgjob-PID-START-X (the host's PID and start time, and a
	// random name of its own), or
	// bgjob-state-HASH in durable mode, so that a later Registry on the
	// same StateDir finds its jobs; each job's cgroup is a folder in it.
	// New removes the folders that a host which died left behind,
	// killing what they still hold. Elsewhere than Linux, Cgroup must be
	// empty or "off".
	Cgroup string

	// Logger receives the registry's own diagnostics (never job
	// output). If Logger is nil, nothing is logged.
	Logger *slog.Logger
}

// Retention bounds the finished jobs a Registry keeps for polling.
// Finished jobs are evicted oldest first (by end time) while there are
// more than MaxJobs, while their texts add up to more than MaxBytes, and
// when they ended more than TTL ago. The newest finished job and any
// result that a RunForeground caller has not yet received are never
// evicted.
type Retention struct {
	// MaxJobs: if 0, 64. If negative, the limit is zero: only what
	// the rules above force is kept (the newest finished job and unread
	// results).
	MaxJobs int
	// MaxBytes: if 0, 16 MiB. If negative, the limit is zero, as for
	// MaxJobs.
	MaxBytes int64
	// TTL: if 0, 5 minutes; if negative, jobs expire as soon as they
	// are evicted by the next registry operation.
	TTL time.Duration
}

// Defaults, as documented on Config.
const (
	defaultTimeout          = 30 * time.Minute
	defaultKillGrace        = 2 * time.Second
	defaultMaxRunning       = 64
	defaultMaxQueued        = 1024
	defaultHeadBytes        = 64 << 10
	defaultTailBytes        = 1 << 20
	defaultRetainJobs       = 64
	defaultRetainBytes      = 16 << 20
	defaultRetainTTL        = 5 * time.Minute
	defaultProgressInterval = 5 * time.Second
	defaultSoftCap          = 30 * time.Second
	defaultMaxOutputBytes   = 64 << 20
	maxOutputBound          = 1 << 40 // HeadBytes and TailBytes
)

// nonInteractive keeps common tools from waiting on a terminal that a job
// does not have.
var nonInteractive = []string{"GIT_TERMINAL_PROMPT=0", "PAGER=cat", "GIT_PAGER=cat"}

// configError names the Config field that is wrong.
func configError(field, format string, args ...any) error {
	return fmt.Errorf("bgjob: new: Config.%s: %s: %w", field, fmt.Sprintf(format, args...), ErrInvalidConfig)
}

// normalize checks c and fills in the defaults. It returns a copy.
func (c Config) normalize() (Config, error) {
	if c.Shell == nil {
		c.Shell = defaultShell()
	} else {
		if len(c.Shell) == 0 || c.Shell[0] == "" {
			return c, configError("Shell", "empty program")
		}
		c.Shell = append([]string(nil), c.Shell...)
	}
	for _, a := range c.Shell {
		if hasNUL(a) {
			return c, configError("Shell", "holds a NUL byte")
		}
	}
	if c.Dir == "" {
		wd, err := os.Getwd()
		if err != nil {
			return c, configError("Dir", "empty, and the working directory is unknown: %v", err)
		}
		c.Dir = wd
	} else {
		if hasNUL(c.Dir) {
			return c, configError("Dir", "holds a NUL byte")
		}
		abs, err := filepath.Abs(c.Dir)
		if err != nil {
			return c, configError("Dir", "%v", err)
		}
		if err := isDir(abs); err != nil {
			return c, configError("Dir", "%v", err)
		}
		c.Dir = abs
	}
	if c.Env == nil {
		c.Env = os.Environ()
	}
	for _, kv := range c.Env {
		if hasNUL(kv) {
			return c, configError("Env", "an entry holds a NUL byte")
		}
	}
	c.Env = mergeEnv(c.Env, nonInteractive, nil)

	durations := []struct {
		name string
		v    *time.Duration
		def  time.Duration
	}{
		{"DefaultTimeout", &c.DefaultTimeout, defaultTimeout},
		{"KillGrace", &c.KillGrace, defaultKillGrace},
		{"ProgressInterval", &c.ProgressInterval, defaultProgressInterval},
	}
	for _, d := range durations {
		switch {
		case *d.v < 0:
			return c, configError(d.name, "negative (%v)", *d.v)
		case *d.v == 0:
			*d.v = d.def
		}
	}
	ints := []struct {
		name string
		v    *int
		def  int
	}{
		{"HeadBytes", &c.HeadBytes, defaultHeadBytes},
		{"TailBytes", &c.TailBytes, defaultTailBytes},
		{"MaxRunning", &c.MaxRunning, defaultMaxRunning},
		{"MaxQueued", &c.MaxQueued, defaultMaxQueued},
	}
	for _, n := range ints {
		switch {
		case *n.v < 0:
			return c, configError(n.name, "negative (%d)", *n.v)
		case *n.v == 0:
			*n.v = n.def
		}
	}
	if field, why := c.Limits.check(); field != "" {
		return c, configError(field, "%s", why)
	}
	// The output bounds are sizes of memory: keep them far from overflow.
	for _, n := range ints[:2] {
		if int64(*n.v) > maxOutputBound {
			return c, configError(n.name, "%d; at most %d (1 TiB)", *n.v, int64(maxOutputBound))
		}
	}
	if c.Retention.MaxJobs == 0 {
		c.Retention.MaxJobs = defaultRetainJobs
	}
	if c.Retention.MaxBytes == 0 {
		c.Retention.MaxBytes = defaultRetainBytes
	}
	if c.Retention.TTL == 0 {
		c.Retention.TTL = defaultRetainTTL
	}
	if c.StateDir != "" {
		if hasNUL(c.StateDir) || !filepath.IsAbs(c.StateDir) {
			return c, configError("StateDir", "must be an absolute path")
		}
		c.StateDir = filepath.Clean(c.StateDir)
		if err := durableCheck(); err != nil {
			return c, fmt.Errorf("bgjob: new: Config.StateDir: %w", err)
		}
	}
	switch floor := int64(c.HeadBytes) + int64(c.TailBytes) + 1<<20; {
	case c.MaxOutputBytes == 0:
		c.MaxOutputBytes = max(defaultMaxOutputBytes, floor)
	case c.MaxOutputBytes < floor:
		return c, configError("MaxOutputBytes", "%d; at least HeadBytes+TailBytes+1 MiB (%d) is needed", c.MaxOutputBytes, floor)
	}
	if c.IDKey != nil && len(c.IDKey) < 16 {
		return c, configError("IDKey", "%d bytes; at least 16 are needed", len(c.IDKey))
	}
	if c.Subreaper && runtime.GOOS != "linux" {
		return c, fmt.Errorf("bgjob: new: Config.Subreaper on %s: %w", runtime.GOOS, ErrUnsupported)
	}
	switch {
	case c.Cgroup == "" || c.Cgroup == "off":
	case hasNUL(c.Cgroup) || !filepath.IsAbs(c.Cgroup):
		return c, configError("Cgroup", "%q: want \"\", \"off\" or an absolute path", c.Cgroup)
	case runtime.GOOS != "linux":
		return c, fmt.Errorf("bgjob: new: Config.Cgroup on %s: %w", runtime.GOOS, ErrUnsupported)
	default:
		c.Cgroup = filepath.Clean(c.Cgroup)
	}
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	return c, nil
}

func isDir(path string) error {
	fi, err := os.Stat(path)
	if err != nil {
		return err
	}
	if !fi.IsDir() {
		return fmt.Errorf("%s is not a directory", path)
	}
	return nil
}
