//go:build !linux && !darwin

package bgjob

import (
	"fmt"
	"runtime"
)

// sandboxer: this system has no sandbox bgjob can use yet. On Windows a
// later version would run the job in an AppContainer (no access but what
// its capabilities and the ACLs of the writable paths grant).
type sandboxer struct{}

func (*sandboxer) ready(string) error {
	return fmt.Errorf("sandbox: none on %s yet: %w", runtime.GOOS, ErrUnsupported)
}

func (*sandboxer) wrap(*plan, *Sandbox) error { return ErrUnsupported }
