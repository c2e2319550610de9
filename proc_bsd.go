//go:build darwin || freebsd || netbsd || openbsd || dragonfly

package bgjob

import (
	"syscall"

	"golang.org/x/sys/unix"
)

const canSpawn = true

// wait blocks until the shell has exited, without reaping it: a kqueue
// EVFILT_PROC/NOTE_EXIT event reports the exit and leaves the zombie.
func (p *process) wait() error {
	kq, err := unix.Kqueue()
	if err != nil {
		return err
	}
	defer unix.Close(kq)
	var ev unix.Kevent_t
	unix.SetKevent(&ev, p.pid, unix.EVFILT_PROC, unix.EV_ADD|unix.EV_ONESHOT)
	ev.Fflags = unix.NOTE_EXIT
	out := make([]unix.Kevent_t, 1)
	for {
		n, err := unix.Kevent(kq, []unix.Kevent_t{ev}, out, nil)
		if err == unix.EINTR {
			continue
		}
		if err == unix.ESRCH {
			return nil // already exited
		}
		if err != nil {
			return err
		}
		if n > 0 && out[0].Flags&unix.EV_ERROR != 0 && int64(out[0].Data) != int64(unix.ESRCH) {
			return syscall.Errno(out[0].Data)
		}
		return nil
	}
}
