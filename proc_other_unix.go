//go:build unix && !linux && !darwin && !freebsd && !netbsd && !openbsd && !dragonfly

package bgjob

import (
	"errors"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// These systems have no way here to wait for a process's exit without
// reaping it, which the supervisor needs to signal the group safely:
// jobs fail to spawn with ErrUnsupported.

func sysProcAttr(*int) *syscall.SysProcAttr { return &syscall.SysProcAttr{Setsid: true} }

func (p *process) wait() error { return errors.ErrUnsupported }

const canSpawn = false

func liveMembers(pgid int) []int {
	if err := unix.Kill(-pgid, 0); err == unix.ESRCH {
		return nil
	}
	return []int{-1}
}

func (p *process) awaitEmpty(deadline time.Time) int { return awaitEmptyPolling(p.pid, deadline) }

func enableSubreaper() error { return ErrUnsupported }

func (p *process) reapOrphans() {}
