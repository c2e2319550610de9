package bgjob

import (
	"strconv"

	"golang.org/x/sys/unix"
)

// ttySupported: Linux has pseudo-terminals.
func ttySupported() error { return nil }

// openPTY opens a pseudo-terminal of the given size, as posix_openpt,
// grantpt, unlockpt and ptsname do, with x/sys/unix's ioctls: the master
// non-blocking (for the runtime's poller, which its reader uses), both
// close-on-exec and neither the host's controlling terminal. grantpt has
// nothing to do on devpts, which gives the slave to its opener's user.
func openPTY(rows, cols uint16) (master, slave int, err error) {
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return -1, -1, err
	}
	fail := func(err error) (int, int, error) {
		unix.Close(m)
		return -1, -1, err
	}
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil { // unlockpt
		return fail(err)
	}
	n, err := unix.IoctlGetUint32(m, unix.TIOCGPTN) // ptsname
	if err != nil {
		return fail(err)
	}
	if err := setWinsize(m, rows, cols); err != nil {
		return fail(err)
	}
	s, err := unix.Open("/dev/pts/"+strconv.FormatUint(uint64(n), 10), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	return m, s, nil
}

// setWinsize sets the size of the terminal of fd (either side).
func setWinsize(fd int, rows, cols uint16) error {
	return unix.IoctlSetWinsize(fd, unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
}

// ttyEOFChar returns the end-of-file character of the terminal of fd, a
// master: on Linux the master's terminal ioctls reach the slave's
// settings, which the job's programs set.
func ttyEOFChar(fd int) byte {
	t, err := unix.IoctlGetTermios(fd, unix.TCGETS)
	if err != nil || t.Cc[unix.VEOF] == 0 {
		return 4
	}
	return t.Cc[unix.VEOF]
}
