//go:build unix && !linux

package bgjob

import (
	"os"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// The Unix systems other than Linux: no pidfds, no /proc to tell zombies
// apart, no subreaper. What differs among them (how to wait for the
// shell's exit) is in proc_bsd.go and proc_none.go.

// procOS is what a process adds here: the shell's exit status once
// leftovers reaped it.
type procOS struct {
	reaped  bool
	code    int
	err     error
	scratch string // the sandbox's private temp dir (macOS), removed by close
}

// containAttr is the containment step of the spawn: the shell gets a
// session (and so a process group) of its own. There are no cgroups and
// no pidfds here.
func containAttr(pl *plan, _ *int) (*syscall.SysProcAttr, []string, func(), error) {
	return &syscall.SysProcAttr{Setsid: true}, pl.env, func() {}, nil
}

// noCgroupSpawn: there are no cgroups here.
func noCgroupSpawn(error) bool { return false }

// contain records nothing: the tree is the shell's process group.
func (p *process) contain(pl *plan) { p.scratch = pl.scratch }

// settle has nothing to prepare here.
func (p *process) settle() {}

// keeper is durable mode's keeper of a job's output: none here.
type keeper struct{}

func (*keeper) stop() {}

// letGo: there is no holder here.
func (*keeper) letGo() error { return nil }

// keep: durable mode is unsupported here.
func (p *process) keep(*keeper) {}

// holderOf returns 0: durable mode is unsupported here.
func (p *process) holderOf() int { return 0 }

// holdInput: durable mode is unsupported here.
func (p *process) holdInput(*inputPlan) {}

// openFIFO: durable mode is unsupported here.
func openFIFO(*inputPlan) (int, error) { return -1, ErrUnsupported }

// keeperOf returns 0: durable mode is unsupported here.
func (p *process) keeperOf() int { return 0 }

// teeInto: durable mode is unsupported here.
func teeInto(outputReader, *outputPlan) error { return ErrUnsupported }

// startKeeperOf: durable mode is unsupported here.
func startKeeperOf(outputReader, *outputPlan) (*keeper, error) { return nil, nil }

// containment says what holds p's tree: its session.
func (p *process) containment() (Containment, string) { return ContainSession, "" }

// signal sends SIGTERM, or SIGKILL if kill is set, to the whole process
// group. A group that is already gone is not an error.
func (p *process) signal(kill bool) error {
	sig := unix.SIGTERM
	if kill {
		sig = unix.SIGKILL
	}
	if err := unix.Kill(-p.pid, sig); err != nil && err != unix.ESRCH {
		return err
	}
	return nil
}

// leftovers returns how many processes of the group are still alive
// after the shell exited. Without /proc the shell's zombie cannot be told
// from a live member, so the shell is reaped first; reap then returns
// what this reap collected.
func (p *process) leftovers() int {
	p.reap()
	return len(liveMembers(p.pid))
}

// watchPidfd does nothing: the spawn gives no pidfd here.
func (p *process) watchPidfd(int, bool) {}

// releasable reports whether unwatch can end a wait on p: never here,
// where durable mode (and so Detach) is unsupported.
func (p *process) releasable() bool { return false }

// unwatch does nothing: see releasable.
func (p *process) unwatch() {}

// reap collects the shell's exit status, once; see platformProcess.
func (p *process) reap() (int, error) {
	if !p.reaped {
		p.reaped = true
		p.code, p.err = p.reapChild()
	}
	return p.code, p.err
}

// close removes the sandbox's private temp dir: a process holds no
// descriptor here.
func (p *process) close() {
	if p.scratch != "" {
		os.RemoveAll(p.scratch)
	}
}

// liveMembers reports whether group pgid has members. Without /proc it
// cannot tell zombies apart, so it counts one for any member; these
// systems' init reaps orphans promptly, so zombies do not linger.
func liveMembers(pgid int) []int {
	if err := unix.Kill(-pgid, 0); err == unix.ESRCH {
		return nil
	}
	return []int{-1}
}

// treeCount counts the live processes of the group, for the leftover
// watcher; it reads only the shell's PID, which never changes. (The shell
// was reaped by leftovers: the group's ID stays the job's while a member
// is in it.)
func (p *process) treeCount() int { return len(liveMembers(p.pid)) }

// awaitEmpty waits until the group has no process or the deadline passes.
// No event reports the death of a process that is not our child, so it
// checks at growing intervals.
func (p *process) awaitEmpty(deadline time.Time) int {
	return awaitPolling(func() []int { return liveMembers(p.pid) }, deadline)
}

// enableSubreaper fails: there is no subreaper here (New refuses
// Config.Subreaper before it gets this far).
func enableSubreaper() error { return ErrUnsupported }

// reapOrphans does nothing: there is no subreaper here.
func (p *process) reapOrphans() {}

// newPipeReader makes the reader of a job's output pipe, whose read end
// fd must be non-blocking: the pipe itself, in the runtime's poller. It
// takes fd over.
func newPipeReader(fd int) (outputReader, error) { return os.NewFile(uintptr(fd), "|0"), nil }

// pollPidfd reports whether a pidfd should sit in the runtime's poller:
// there is none here.
func pollPidfd(outputReader) bool { return true }

// watchExit reports whether rd will report the exit of p: here it never
// does, and a waiter goroutine waits for it.
func watchExit(outputReader, *process) bool { return false }

// dupCloexec duplicates fd; the copy closes on exec. Not every system
// here has F_DUPFD_CLOEXEC: hold the fork lock instead, as rawPipe does.
func dupCloexec(fd int) (int, error) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	nfd, err := unix.Dup(fd)
	if err != nil {
		return -1, err
	}
	unix.CloseOnExec(nfd)
	return nfd, nil
}

// rawPipe makes a pipe whose ends close on exec. There is no pipe2 here:
// hold the fork lock so no child inherits the ends in between.
func rawPipe(p *[2]int) error {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	if err := unix.Pipe(p[:]); err != nil {
		return err
	}
	unix.CloseOnExec(p[0])
	unix.CloseOnExec(p[1])
	return nil
}
