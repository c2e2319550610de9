//go:build unix && !linux

package bgjob

import (
	"fmt"
	"runtime"
)

// ttySupported: TTY jobs are Linux only among the Unix systems. The BSDs
// and macOS open pseudo-terminals differently, and on macOS the
// runtime's poller (kqueue) is known to misbehave on a master
// (golang/go#22099), which the output reader waits on; none of it is
// tested here.
func ttySupported() error {
	return fmt.Errorf("pseudo-terminals on %s: %w", runtime.GOOS, ErrUnsupported)
}

func openPTY(rows, cols uint16) (int, int, error) { return -1, -1, ttySupported() }

func setWinsize(int, uint16, uint16) error { return ttySupported() }

func ttyEOFChar(int) byte { return 4 }
