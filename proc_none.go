//go:build unix && !linux && !darwin && !freebsd && !netbsd && !openbsd && !dragonfly

package bgjob

import "errors"

// These systems (aix, solaris, ...) have no way here to wait for a
// process's exit without reaping it, which the supervisor needs to signal
// the group safely: jobs fail to spawn with ErrUnsupported.

const canSpawn = false

func (p *process) wait() error { return errors.ErrUnsupported }
