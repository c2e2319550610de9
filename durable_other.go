//go:build !linux

package bgjob

import (
	"fmt"
	"os"
	"runtime"
)

// Durable mode needs pidfds and inotify, so for now it is Linux only.

const wrapperShell = ""

func durableCheck() error {
	return fmt.Errorf("durable mode on %s: %w", runtime.GOOS, ErrUnsupported)
}

type readLimits struct{ keep, tail, max int64 }

func wrapArgv(string, []string) []string { return nil }

func prepareMarker(string) error { return ErrUnsupported }

func openOutputFile(*outputPlan) (int, outputReader, error) { return -1, nil, ErrUnsupported }

func procStart(int) (uint64, bool, error) { return 0, false, errGone }

func bootID() string { return "" }

func adoptProcess(*record, string, func() bool, readLimits, *cgroups) (*process, outputReader, error) {
	return nil, nil, errGone
}

func reserveSpare(string, int64) {}

func lockStateDir(string) (*os.File, error) { return nil, ErrUnsupported }

func unlockStateDir(f *os.File) { f.Close() }

func stopMarked(*record) int { return 0 }
