//go:build unix

package bgjob

import (
	"errors"
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// fileConn is an interactive job's input on Unix: the write end of its
// stdin pipe (or FIFO), or a copy of its terminal's master, non-blocking
// and in the runtime's poller, so that a write waits without a thread
// and honours its deadline.
type fileConn struct {
	*os.File
	tty bool
}

// eof closes a pipe; on a terminal it types the end-of-file character
// (VEOF of the terminal's settings, normally Ctrl-D), without waiting:
// the caller has moved the deadline into the past.
func (c *fileConn) eof() error {
	if !c.tty {
		return c.File.Close()
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var werr error
	err = rc.Control(func(fd uintptr) {
		ch := ttyEOFChar(int(fd))
		_, werr = unix.Write(int(fd), []byte{ch})
	})
	switch {
	case err != nil:
		return err
	case werr == unix.EAGAIN:
		return errors.New("the terminal's input is full: end of file not typed")
	}
	return werr
}

// writeNow writes what of p fits now, through the raw descriptor: a
// write with a deadline in the past would not even try.
func (c *fileConn) writeNow(p []byte) (int, error) {
	rc, err := c.SyscallConn()
	if err != nil {
		return 0, err
	}
	n := 0
	var werr error
	err = rc.Control(func(fd uintptr) {
		for n < len(p) {
			m, err := unix.Write(int(fd), p[n:])
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				if err != unix.EAGAIN {
					werr = err
				}
				return
			}
			n += m
		}
	})
	if err != nil {
		return n, err
	}
	return n, werr
}

// resize sets a terminal's size (TIOCSWINSZ: the kernel sends SIGWINCH
// to its foreground process group). It never calls Fd, which would make
// the descriptor blocking.
func (c *fileConn) resize(rows, cols uint16) error {
	if !c.tty {
		return ErrNotInteractive
	}
	rc, err := c.SyscallConn()
	if err != nil {
		return err
	}
	var ioErr error
	if err := rc.Control(func(fd uintptr) { ioErr = setWinsize(int(fd), rows, cols) }); err != nil {
		return err
	}
	if ioErr != nil {
		return fmt.Errorf("TIOCSWINSZ: %w", ioErr)
	}
	return nil
}

// errBrokenPipe: EPIPE and EIO say it on Unix (see brokenInput).
func errBrokenPipe(error) bool { return false }
