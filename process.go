package bgjob

import (
	"io"
	"time"
)

// The platform layer. Each platform defines the type process and the
// functions below exactly once: spawn_unix.go and process_unix.go with
// proc_linux.go or other_unix.go (and mux_linux.go, proc_bsd.go or
// proc_none.go) on Unix; spawn_windows.go, io_windows.go and
// contain_windows.go on Windows. The assertions at the end make the
// compiler check every platform against this list.
//
//	startJob(pl *plan) (*process, outputReader, error)
//		carries out a launch plan: opens the job's input and output,
//		contains its process tree and spawns its shell; it returns the
//		shell and the parent's end of the output
//	watchExit(rd outputReader, p *process) bool
//		makes rd report p's exit (errExited) where it can, and says so;
//		then the job needs no waiter goroutine (Linux)
//	lookShell(path string) (string, error)
//		resolves a shell program through the host's PATH
//	defaultShell() []string
//		the Shell of a zero Config
//	envKey(k string) string
//		the form of an environment key that identifies it (Windows
//		ignores case)
//	enableSubreaper() error
//		makes the host a child subreaper (Linux), or ErrUnsupported
//
// A process is a job's shell and what contains its tree (a session on
// Unix, a Job Object on Windows). Its methods are in platformProcess.
type platformProcess interface {
	// wait blocks until the shell has exited, without reaping it, so
	// that its PID (and process group ID) cannot be reused meanwhile.
	// After unwatch it returns errReleased.
	wait() error
	// unwatch ends a wait early, for Detach.
	unwatch()
	// signal asks the whole tree to stop (SIGTERM to its process group;
	// CTRL_BREAK on Windows) or, with kill, kills it (SIGKILL;
	// TerminateJobObject). A tree that is already gone is not an error.
	signal(kill bool) error
	// reap collects the shell's exit status: its exit code, or 128+n
	// after signal n on Unix. An adopted shell's comes from its exit
	// marker, or errNoMarker.
	reap() (int, error)
	// leftovers counts the live processes of the tree once the shell
	// has exited, before reap (while the unreaped shell holds its PID,
	// no other process can take it, nor the IDs of its group and
	// session). Zombies do not count: they hold nothing but a PID.
	leftovers() int
	// awaitEmpty waits until the tree has no live process or deadline
	// passes, and returns how many are left.
	awaitEmpty(deadline time.Time) int
	// reapOrphans reaps the zombies of the tree that were re-parented
	// to the host (Config.Subreaper); elsewhere it does nothing.
	reapOrphans()
	// settle does what the end of the tree's containment needs, once
	// the job runs: the supervisor calls it first thing, so that it
	// overlaps the job instead of delaying the launch.
	settle()
	// close frees what the process holds (pidfd, handles), once no
	// waiter uses it; after a reap, the tree's container goes too (a
	// Linux cgroup is handed back to be removed).
	close()
	// containment says what holds the tree, and how to find it again:
	// for a cgroup its folder; for a Linux session the marker in the
	// job's environment; else "".
	containment() (Containment, string)
	// emptyWatch returns a watcher that waits, in a goroutine of its
	// own, for the tree to have no live process, for the leftover phase
	// (procs.go): the supervisor calls it once the shell has exited, and
	// the watcher reads nothing of the process that the supervisor may
	// change.
	emptyWatch() *emptyWatch
	// list returns the live processes of the tree and the TCP ports
	// they listen on (Linux; nothing elsewhere). Unlike the other
	// methods it may be called from any goroutine while job.tree holds
	// the process: it reads only fields set before the process was
	// shared, and memo, which job.usageMu guards.
	list(memo *treeMemo) ([]Process, []int)
}

// outputReader is the parent's end of a job's output. Its reads honour
// deadlines, which is how the supervisor waits for output, for a timer
// and for a poke at once. A reader that also watches the shell (see
// watchExit) returns errExited from a Read when the shell has exited, and
// after EOF its Read waits for that exit. Only the supervisor reads;
// SetReadDeadline may be called from any goroutine (a poke does).
type outputReader interface {
	io.Reader
	SetReadDeadline(t time.Time) error
	Close() error
}

var (
	_ platformProcess                             = (*process)(nil)
	_ func(*plan) (*process, outputReader, error) = startJob
	_ func(outputReader, *process) bool           = watchExit
	_ func(string) (string, error)                = lookShell
	_ func() []string                             = defaultShell
	_ func(string) string                         = envKey
	_ func() error                                = enableSubreaper
)
