//go:build !linux

package bgjob

import (
	"fmt"
	"os"
	"runtime"
	"sync/atomic"
	"time"
)

// Durable mode needs pidfds and inotify, so for now it is Linux only.

const wrapperShell = ""

func durableCheck() error {
	return fmt.Errorf("durable mode on %s: %w", runtime.GOOS, ErrUnsupported)
}

type readLimits struct {
	keep, tail, max int64
	hold            *atomic.Int64
}

func bootID() (string, error) { return "", ErrUnsupported }

func wrapArgv(string, []string) []string { return nil }

func prepareMarker(string) error { return ErrUnsupported }

func procStart(int) (uint64, bool, error) { return 0, false, errGone }

type fileWatch struct{}

func newFileWatch() (*fileWatch, error) { return nil, ErrUnsupported }
func (*fileWatch) close()               {}

func adoptProcess(*record, string, func() bool, readLimits, *cgroups, *fileWatch) (*process, outputReader, error) {
	return nil, nil, errGone
}

func adoptLeftovers(*record, string, func() bool, readLimits, *cgroups, *fileWatch) (*process, outputReader, error) {
	return nil, nil, errGone
}

func reserveSpare(string, int64) {}

func lockStateDir(string) (*os.File, error) { return nil, ErrUnsupported }

func unlockStateDir(f *os.File) { f.Close() }

func adoptInput(*record, string) (inputConn, *keeper, error) { return nil, nil, ErrUnsupported }

func makeFIFO(string) error { return ErrUnsupported }

func stopLeftovers(*record, *cgroups) int { return 0 }

func awaitKeeper(int, uint64, *time.Time) (bool, error) { return true, nil }

func reapReleased() {}
