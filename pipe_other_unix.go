//go:build unix && !linux

package bgjob

import (
	"syscall"

	"golang.org/x/sys/unix"
)

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
