//go:build windows

package bgjob

import (
	"strings"
	"time"
)

func defaultShell() []string { return []string{"cmd.exe", "/d", "/s", "/c"} }

// envKey returns the form of an environment key that identifies it:
// Windows compares keys without regard to case.
func envKey(k string) string { return strings.ToUpper(k) }

// process is a job's process tree on Windows.
type process struct {
	pid int
}

// startProcess is not implemented on Windows yet: jobs end as Failed with
// a reason that wraps ErrUnsupported.
func startProcess(argv []string, dir string, env []string, stdin string) (*process, outputReader, error) {
	return nil, nil, ErrUnsupported
}

func (p *process) wait() error                       { return ErrUnsupported }
func (p *process) signal(kill bool) error            { return ErrUnsupported }
func (p *process) reap() (int, error)                { return exitUnknown, ErrUnsupported }
func (p *process) leftovers() int                    { return 0 }
func (p *process) awaitEmpty(deadline time.Time) int { return 0 }
func (p *process) reapOrphans()                      {}
func (p *process) release()                          {}

func enableSubreaper() error { return ErrUnsupported }
