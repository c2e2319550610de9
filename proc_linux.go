package bgjob

import (
	"bytes"
	"os"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const canSpawn = true

// procOS is what a Linux process adds to the Unix one: the shell's pidfd,
// and how an adopted shell is watched.
type procOS struct {
	pidfd    *os.File // the shell's pidfd, if the kernel gave one
	pidfdNum int      // its number, or -1
	polled   bool     // pidfd is in the runtime's poller

	// adopted marks a process that a durable Registry found running at
	// New: not its child, so it is watched through its pidfd and its
	// exit code comes from the exit marker in the folder markerDir.
	adopted   bool
	markerDir string
}

// sysProcAttr is the containment of a job's shell: a new session (and so
// a new process group). pidfd receives the shell's pidfd.
func sysProcAttr(pidfd *int) *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setsid: true, PidFD: pidfd}
}

// watchPidfd keeps the pidfd that the spawn gave (pidfd < 0: none). With
// poll set it must go into the runtime's poller, so it is made
// non-blocking; a pidfd that cannot be is dropped.
func (p *process) watchPidfd(pidfd int, poll bool) {
	p.pidfdNum = -1
	if pidfd < 0 {
		return
	}
	if !poll || unix.SetNonblock(pidfd, true) == nil {
		p.pidfd, p.pidfdNum, p.polled = os.NewFile(uintptr(pidfd), "pidfd"), pidfd, poll
	} else {
		unix.Close(pidfd)
	}
}

// releasable reports whether a wait on p can be ended by unwatch: it
// waits on a pidfd.
func (p *process) releasable() bool { return p.pidfd != nil }

// unwatch ends a wait on the process (see wait), for Detach.
func (p *process) unwatch() {
	if p.polled {
		p.pidfd.SetReadDeadline(time.Unix(1, 0))
	}
}

// reap collects the shell's exit status; see platformProcess.
func (p *process) reap() (int, error) {
	if p.adopted {
		return reapAdopted(p)
	}
	return p.reapChild()
}

// close frees the pidfd once the process has been reaped.
func (p *process) close() {
	if p.pidfd != nil {
		p.pidfd.Close()
	}
}

// wait blocks until the shell has exited, without reaping it. With a
// pidfd the wait parks in the runtime's poller and holds no thread.
//
// Detach ends the wait early by moving the pidfd's read deadline into the
// past; wait then returns errReleased.
func (p *process) wait() error {
	if p.adopted {
		return p.waitAdopted()
	}
	if p.polled && canWaitPidfd(p.pidfdNum) {
		rc, err := p.pidfd.SyscallConn()
		if err == nil {
			var werr error
			err = rc.Read(func(fd uintptr) bool {
				var exited bool
				exited, werr = peekExit(int(fd))
				return exited || werr != nil
			})
			if err == nil {
				return werr
			}
			// The pidfd was closed or its deadline moved by Detach.
			return errReleased
		}
	}
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return err
		}
	}
}

// liveMembers returns the PIDs of the processes of group pgid that are not
// zombies, read from /proc.
func liveMembers(pgid int) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	var pids []int
	var buf [512]byte
	for _, name := range names {
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		state, pg, ok := readStat(name, buf[:])
		if ok && pg == pgid && state != 'Z' && state != 'X' {
			pid, _ := strconv.Atoi(name)
			pids = append(pids, pid)
		}
	}
	return pids
}

// readStat reads the state and process group of a process from
// /proc/PID/stat.
func readStat(pid string, buf []byte) (state byte, pgrp int, ok bool) {
	fd, err := unix.Open("/proc/"+pid+"/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return 0, 0, false
	}
	n, err := unix.Read(fd, buf)
	unix.Close(fd)
	if err != nil || n <= 0 {
		return 0, 0, false
	}
	b := buf[:n]
	// The command name may hold anything, ')' too: the fields start
	// after its last ')'. Then: state, ppid, pgrp.
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return 0, 0, false
	}
	f := bytes.Fields(b[i+2:])
	if len(f) < 3 {
		return 0, 0, false
	}
	pg, err := strconv.Atoi(string(f[2]))
	return f[0][0], pg, err == nil
}

// awaitEmpty waits until the group has no live process or the deadline
// passes, and returns the number still alive. It waits on a pidfd of each
// live member, so it wakes when they die rather than polling.
func (p *process) awaitEmpty(deadline time.Time) int {
	for {
		pids := liveMembers(p.pid)
		if len(pids) == 0 || !time.Now().Before(deadline) {
			return len(pids)
		}
		for _, pid := range pids {
			if !waitDeath(pid, deadline) {
				// No pidfd here: fall back to checking at intervals.
				return awaitEmptyPolling(p.pid, deadline)
			}
		}
	}
}

// waitDeath waits until process pid has exited (a zombie counts) or the
// deadline passes. It returns false if it cannot wait on a pidfd.
func waitDeath(pid int, deadline time.Time) bool {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err == unix.ESRCH {
		return true
	}
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	f.SetReadDeadline(deadline)
	// A pidfd turns readable when its process exits.
	rc.Read(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(pfd, 0)
		return n > 0
	})
	return true
}

// subreaper is set once the host has become a child subreaper.
var subreaper atomic.Bool

func enableSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return err
	}
	subreaper.Store(true)
	return nil
}

// reapOrphans reaps the zombies of the job's group that were re-parented
// to the host because it is a subreaper. It only waits for members of
// this group, and only once none of them is alive, so it never takes a
// child that belongs to anyone else.
func (p *process) reapOrphans() {
	if !subreaper.Load() {
		return
	}
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-p.pid, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}

// dupCloexec duplicates fd; the copy closes on exec.
func dupCloexec(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }

// rawPipe makes a pipe whose ends close on exec.
func rawPipe(p *[2]int) error { return unix.Pipe2(p[:], unix.O_CLOEXEC) }
