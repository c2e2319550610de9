//go:build linux

package bgjob

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"

	"golang.org/x/sys/unix"
)

// Holes are punched behind the reader, but never past what a later host
// must read again to match it (watchState.hold).
func TestHolesKeepWhatWatchesNeed(t *testing.T) {
	name := filepath.Join(t.TempDir(), "output")
	f, err := os.Create(name)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	const size = 8 << 20
	if _, err := f.Write(make([]byte, size)); err != nil {
		t.Fatal(err)
	}
	var hold atomic.Int64
	hold.Store(3<<20 + 100)
	h := holes{lim: readLimits{keep: 8192, tail: 12 << 10, max: 1 << 20, hold: &hold}, hole: 8192}
	h.punch(int(f.Fd()), size)
	firstData := func(from int64) int64 {
		off, err := unix.Seek(int(f.Fd()), from, unix.SEEK_DATA)
		if err != nil {
			t.Fatal(err)
		}
		return off
	}
	if h.lim.max == 0 {
		t.Skip("this file system cannot punch holes")
	}
	// The head is kept, then a hole up to the hold (rounded down to a
	// block), then data.
	if got := firstData(0); got != 0 {
		t.Errorf("first data at %d; want the head at 0", got)
	}
	if got, want := firstData(8192), int64(3<<20); got != want {
		t.Errorf("data after the head from %d; want %d (the hold, rounded down)", got, want)
	}
	// The hold moves on: so do the holes.
	hold.Store(size)
	h.punch(int(f.Fd()), size)
	if got, want := firstData(8192), int64((size-12<<10)&^4095); got != want {
		t.Errorf("after the hold moved: data from %d; want %d (the tail)", got, want)
	}
}
