//go:build unix && !linux

package bgjob

import (
	"os"
	"syscall"

	"golang.org/x/sys/unix"
)

// openOutput makes the reader of a job's output pipe, whose read end fd
// must be non-blocking: the pipe itself, in the runtime's poller. It
// takes fd over.
func openOutput(fd int) (outputReader, error) { return os.NewFile(uintptr(fd), "|0"), nil }

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
