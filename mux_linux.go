package bgjob

import (
	"io"
	"os"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// muxReader is a Linux job's output reader that also sees its shell exit.
// An epoll set holds the read end of the output pipe and, once watchExit
// has added it, the shell's pidfd; only the set sits in the runtime's poller.
// So one parked read wakes on output, on the exit, on its deadline or on
// a poke, and a job needs no waiter goroutine: one goroutine per job, one
// wake-up at the end instead of two hand-offs.
//
// Read returns output, then io.EOF once when the pipe closes, and
// errExited once when the shell has exited (without reaping it). After
// EOF, a Read waits for the exit; after both, it returns io.EOF at once.
// When both come together, io.EOF comes first.
// Only the supervisor reads; SetReadDeadline may be called from any
// goroutine (that is how a poke interrupts a read).
type muxReader struct {
	set   *os.File // the epoll set, non-blocking, in the runtime's poller
	setfd int      // its number (Fd would make it blocking)
	rc    syscall.RawConn
	pipe  int // the pipe's read end, non-blocking; owned
	pidfd int // the shell's pidfd while in the set, else -1; borrowed

	tee *tee // durable mode: copies the output into the run's file as it is read

	pipeDone bool // EOF or a read error
	exited   bool // the shell has exited
	reported bool // errExited was returned
	grown    bool // the pipe was enlarged
	reads    uint // reads since the exit was last checked
}

// loud is the read size from which a job counts as loud: its pipe is
// then enlarged to 1 MiB (the default limit for unprivileged users), so
// that it is read in fewer, larger pieces with fewer wake-ups. A quiet
// job never pays for the resize.
const loud = 16 << 10

// newPipeReader makes the reader of a job's output pipe, whose read end fd
// must be non-blocking. It takes fd over, also on error.
func newPipeReader(fd int) (outputReader, error) {
	ep, err := unix.EpollCreate1(unix.EPOLL_CLOEXEC)
	if err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("epoll_create1", err)
	}
	// Level-triggered: a Read that stops short of EAGAIN leaves the set
	// ready, and the next Read finds the rest.
	if err := unix.EpollCtl(ep, unix.EPOLL_CTL_ADD, fd, &unix.EpollEvent{Events: unix.EPOLLIN}); err != nil {
		unix.Close(ep)
		unix.Close(fd)
		return nil, os.NewSyscallError("epoll_ctl", err)
	}
	if _, err := unix.FcntlInt(uintptr(ep), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		unix.Close(ep)
		unix.Close(fd)
		return nil, os.NewSyscallError("fcntl", err)
	}
	set := os.NewFile(uintptr(ep), "|0")
	// A set the runtime's poller could not take (its own epoll full, say)
	// would make every read fail at once: refuse it.
	if err := set.SetReadDeadline(time.Time{}); err != nil {
		set.Close()
		unix.Close(fd)
		return nil, err
	}
	rc, err := set.SyscallConn()
	if err != nil {
		set.Close()
		unix.Close(fd)
		return nil, err
	}
	return &muxReader{set: set, setfd: ep, rc: rc, pipe: fd, pidfd: -1}, nil
}

// pollPidfd reports whether the process's pidfd should sit in the
// runtime's poller for a waiter goroutine. A Linux job's muxReader waits
// on it instead.
func pollPidfd(rd outputReader) bool {
	_, ok := rd.(*muxReader)
	return !ok
}

// watchExit makes rd report the exit of p, if it can: it reports whether
// it will, and so whether p needs no waiter goroutine.
func watchExit(rd outputReader, p *process) bool {
	m, ok := rd.(*muxReader)
	if !ok || p.pidfd == nil || p.pidfdNum < 0 || !canWaitPidfd(p.pidfdNum) {
		return false
	}
	if unix.EpollCtl(m.setfd, unix.EPOLL_CTL_ADD, p.pidfdNum, &unix.EpollEvent{Events: unix.EPOLLIN}) != nil {
		return false
	}
	m.pidfd = p.pidfdNum
	return true
}

// Read reads output or reports EOF or the exit; see muxReader.
func (m *muxReader) Read(b []byte) (n int, err error) {
	if m.pipeDone && (m.exited || m.pidfd < 0) {
		if m.exited && !m.reported {
			m.reported = true
			return 0, errExited
		}
		return 0, io.EOF
	}
	rerr := m.rc.Read(func(set uintptr) bool {
		// A pipe that never runs dry (a leftover that keeps writing)
		// must not hide the exit: look every 16 reads, and whenever
		// the pipe is empty.
		if m.reads++; m.reads >= 16 && m.sawExit(set) {
			err = errExited
			return true
		}
		if !m.pipeDone {
			if m.tee != nil {
				n, err = m.tee.take(m.pipe, b)
			} else {
				n, err = ignoringEINTR(m.pipe, b)
			}
			switch {
			case n > 0:
				if n == len(b) && n >= loud && !m.grown {
					m.grown = true
					unix.FcntlInt(uintptr(m.pipe), unix.F_SETPIPE_SZ, 1<<20) // failure only costs speed
				}
				return true
			case err == unix.EAGAIN:
				n, err = 0, nil
			default: // EOF, or an error that ends the pipe all the same
				m.pipeDone, n = true, 0
				if err == nil || err == unix.EIO {
					// EIO: a terminal's master once no slave is open.
					err = io.EOF
				}
				// Mostly the shell has exited by now: then the set has
				// served (the next Read reports the exit, and the set
				// is closed soon after), and nothing need leave it.
				if !m.exited && m.pidfd >= 0 && exitedNow(m.pidfd) {
					m.exited = true
				}
				if !m.exited {
					unix.EpollCtl(int(set), unix.EPOLL_CTL_DEL, m.pipe, nil)
				}
				return true
			}
		}
		if m.sawExit(set) {
			err = errExited
			return true
		}
		return false
	})
	if rerr != nil {
		return 0, rerr // the deadline passed (or a poke), or the set was closed
	}
	return n, err
}

// sawExit reports, once, that the shell has exited; it then takes the
// pidfd out of the set.
func (m *muxReader) sawExit(set uintptr) bool {
	m.reads = 0
	if m.exited || m.pidfd < 0 || !exitedNow(m.pidfd) {
		return false
	}
	m.exited, m.reported = true, true
	unix.EpollCtl(int(set), unix.EPOLL_CTL_DEL, m.pidfd, nil)
	return true
}

// ignoringEINTR reads fd into b, again when a signal interrupts the read;
// n is never negative.
func ignoringEINTR(fd int, b []byte) (int, error) {
	for {
		n, err := unix.Read(fd, b)
		if err != unix.EINTR {
			return max(n, 0), err
		}
	}
}

// pidfdWaits caches whether waitid takes P_PIDFD here (Linux 5.4 and
// later; pidfds themselves came in 5.2): 0 not known yet, 1 yes, 2 no.
var pidfdWaits atomic.Int32

// canWaitPidfd reports whether waitid takes P_PIDFD, asking the kernel
// once, about pidfd, a child not yet reaped. Without it exitedNow would
// take the kernel's refusal for an exit.
func canWaitPidfd(pidfd int) bool {
	switch pidfdWaits.Load() {
	case 1:
		return true
	case 2:
		return false
	}
	if _, err := peekExit(pidfd); err == unix.EINVAL {
		pidfdWaits.Store(2)
		return false
	}
	pidfdWaits.Store(1)
	return true
}

// peekExit reports whether the process of pidfd has exited, without
// reaping it or waiting.
func peekExit(pidfd int) (bool, error) {
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PIDFD, pidfd, &info, unix.WEXITED|unix.WNOWAIT|unix.WNOHANG, nil)
		if err != unix.EINTR {
			// With WNOHANG, a zero Signo means "not yet".
			return err == nil && info.Signo != 0, err
		}
	}
}

// exitedNow reports whether the process of pidfd has exited. An error
// (the process was reaped elsewhere) counts as an exit: there is nothing
// left to wait for.
func exitedNow(pidfd int) bool {
	exited, err := peekExit(pidfd)
	return exited || err != nil
}

func (m *muxReader) SetReadDeadline(t time.Time) error { return m.set.SetReadDeadline(t) }

// Close closes the set, the pipe and the output file; the pidfd belongs
// to the process.
func (m *muxReader) Close() error {
	err := m.set.Close()
	unix.Close(m.pipe)
	if m.tee != nil {
		m.tee.close()
	}
	return err
}

// teeInto has rd, a pipe's reader, copy what it reads into the output
// file o.file (see tee).
func teeInto(rd outputReader, o *outputPlan) error {
	t, err := openTee(o.file, o.lim, o.log)
	if err != nil {
		return err
	}
	rd.(*muxReader).tee = t
	return nil
}

// startKeeperOf starts the keeper of a durable job whose output rd reads,
// or returns nil outside durable mode.
func startKeeperOf(rd outputReader, o *outputPlan) (*keeper, error) {
	if o.lifeline == nil {
		return nil, nil
	}
	return startKeeper(rd.(*muxReader).pipe, o.file, int(o.lifeline.Fd()))
}
