//go:build unix

package bgjob

import (
	"fmt"
	"time"

	"golang.org/x/sys/unix"
)

// process is a job's shell on Unix: the leader of a new session and
// process group, whose IDs are its PID. The group holds the job's tree.
//
// The supervisor owns a process: it alone signals, reaps and closes it.
// A waiter goroutine, where there is one, only calls wait.
type process struct {
	pid    int
	used   Usage // what the shell and the processes it waited for used: set by reapChild
	procOS       // what this system adds: proc_linux.go or other_unix.go
}

// reapChild waits for the shell, the host's child, and returns its exit
// code, or 128+n if signal n killed it.
func (p *process) reapChild() (int, error) {
	var ws unix.WaitStatus
	var ru unix.Rusage
	for {
		_, err := unix.Wait4(p.pid, &ws, 0, &ru)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return exitUnknown, err
		}
		break
	}
	p.used = rusageUsage(&ru)
	switch {
	case ws.Exited():
		return ws.ExitStatus(), nil
	case ws.Signaled():
		return 128 + int(ws.Signal()), nil
	}
	return exitUnknown, fmt.Errorf("unexpected wait status %#x", uint32(ws))
}

// awaitPolling waits until live returns no process or the deadline
// passes, looking at growing intervals, for systems where no event tells
// that a process which is not our child has died. It returns how many
// live last returned.
func awaitPolling(live func() []int, deadline time.Time) int {
	d := time.Millisecond
	for {
		n := len(live())
		if n == 0 || !time.Now().Before(deadline) {
			return n
		}
		time.Sleep(min(d, time.Until(deadline)))
		d = min(2*d, 50*time.Millisecond)
	}
}
