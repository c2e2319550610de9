//go:build linux

package bgjob_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
	"golang.org/x/sys/unix"
)

// smallStateDir mounts a tmpfs of the given size (for example "3m") and
// returns a state directory on it. It skips the test when not root or when
// the mount fails. The tmpfs is unmounted after every other cleanup that
// is registered later (the Registry's Close among them).
func smallStateDir(t *testing.T, size string) (mnt, state string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("full-disk tests mount a small tmpfs: they need root")
	}
	mnt = filepath.Join(t.TempDir(), "mnt")
	if err := os.Mkdir(mnt, 0o700); err != nil {
		t.Fatal(err)
	}
	if err := unix.Mount("tmpfs", mnt, "tmpfs", unix.MS_NOSUID|unix.MS_NODEV, "size="+size+",mode=0700"); err != nil {
		t.Skipf("full-disk tests need a small tmpfs: mount: %v", err)
	}
	t.Cleanup(func() {
		if err := unix.Unmount(mnt, 0); err != nil {
			// Busy (a straggler holding a file): detach it, so the
			// temporary folder can still go.
			t.Errorf("unmount %s: %v", mnt, err)
			unix.Unmount(mnt, unix.MNT_DETACH)
		}
	})
	return mnt, filepath.Join(mnt, "state")
}

// fillDisk writes a filler file in dir until the file system is full, and
// returns its name.
func fillDisk(t *testing.T, dir string) string {
	t.Helper()
	name := filepath.Join(dir, "filler")
	f, err := os.OpenFile(name, os.O_WRONLY|os.O_CREATE|os.O_TRUNC, 0o600)
	if err != nil {
		t.Fatalf("filler: %v", err)
	}
	defer f.Close()
	buf := bytes.Repeat([]byte{'f'}, 64<<10)
	for _, chunk := range []int{64 << 10, 4096, 1} {
		for {
			if _, err := f.Write(buf[:chunk]); err != nil {
				if !errors.Is(err, syscall.ENOSPC) {
					t.Fatalf("filler: %v; want ENOSPC at the end", err)
				}
				break
			}
		}
	}
	// Full: not even one more file's first page fits.
	if err := os.WriteFile(filepath.Join(dir, "probe"), []byte("x"), 0o600); !errors.Is(err, syscall.ENOSPC) {
		t.Fatalf("probe write on the full file system: %v; want ENOSPC", err)
	}
	os.Remove(filepath.Join(dir, "probe"))
	return name
}

// syncBuffer is a log sink shared with the registry's goroutines.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// recordOf returns the parsed record.json of the run folder of id, which
// must exist and be valid JSON.
func recordOf(t *testing.T, state string, id bgjob.ID) map[string]any {
	t.Helper()
	runs, _ := filepath.Glob(filepath.Join(state, "sessions", "*", string(id)+".*"))
	if len(runs) != 1 {
		t.Fatalf("%s: run folders %v; want 1", id, runs)
	}
	b, err := os.ReadFile(filepath.Join(runs[0], "record.json"))
	if err != nil {
		t.Fatalf("%s: %v", id, err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatalf("%s: record.json is corrupt: %v: %q", id, err, b)
	}
	return m
}

// TestDurableDiskFull runs a state directory on a 3 MiB tmpfs into ENOSPC:
// a launch whose record cannot be written fails at once with a reason
// that names the state write, the records written before stay whole, and
// a new Registry replays the finished jobs with their true ends.
func TestDurableDiskFull(t *testing.T) {
	mnt, state := smallStateDir(t, "3m")
	logs := &syncBuffer{}
	cfg := bgjob.Config{
		StateDir:  state,
		KillGrace: 500 * time.Millisecond,
		HeadBytes: 4096, TailBytes: 4096,
		MaxOutputBytes: 1<<20 + 8192,
		Logger:         slog.New(slog.NewTextHandler(logs, nil)),
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("registry log:\n%s", logs.String())
		}
	})
	r1 := newRegistry(t, cfg)

	// Jobs that end before the disk fills; one prints far more than the
	// file system holds.
	type want struct {
		state bgjob.State
		code  int
		text  string
	}
	earlier := map[bgjob.ID]want{}
	for _, tc := range []struct {
		spec bgjob.Spec
		want want
	}{
		{bgjob.Spec{Command: "echo a; exit 3", Session: "s"}, want{bgjob.Exited, 3, "a\n"}},
		{bgjob.Spec{Command: "echo b", Session: "s"}, want{bgjob.Exited, 0, "b\n"}},
		{bgjob.Spec{Command: "echo c >&2; exit 42", Session: "other"}, want{bgjob.Exited, 42, "c\n"}},
	} {
		s, err := r1.Start(ctxT(t), tc.spec)
		if err != nil {
			t.Fatal(err)
		}
		if f := wait(t, r1, s.ID); f.State != tc.want.state || f.ExitCode != tc.want.code || f.Output.Text != tc.want.text {
			t.Fatalf("%q: got %v %d %q; want %v %d %q", tc.spec.Command, f.State, f.ExitCode, f.Output.Text, tc.want.state, tc.want.code, tc.want.text)
		}
		earlier[s.ID] = tc.want
	}
	const bigN = 8 << 20 // well over the 3 MiB tmpfs
	big, err := r1.Start(ctxT(t), bgjob.Spec{Command: helperCmd("pattern", strconv.Itoa(bigN)) + "; echo status $? >&2; exit 9", Env: helperEnv, Session: "big"})
	if err != nil {
		t.Fatal(err)
	}
	bf := wait(t, r1, big.ID)
	if bf.State != bgjob.Exited || bf.ExitCode != 9 {
		t.Fatalf("big job: got %v %d (%q); want exited 9", bf.State, bf.ExitCode, bf.Reason)
	}
	t.Logf("big job: total %d bytes of %d, notice %q", bf.Output.Total, bigN, bf.Output.Notice)
	if got := recordOf(t, state, big.ID); got["state"] != "exited" || got["exit_code"] != 9.0 {
		t.Errorf("big job's record: state %v exit_code %v; want exited 9", got["state"], got["exit_code"])
	}
	earlier[big.ID] = want{bgjob.Exited, 9, ""}

	filler := fillDisk(t, mnt)

	// A launch on the full disk: its record cannot be written, so it
	// must not run, and it must say why.
	marker := filepath.Join(t.TempDir(), "ran")
	for _, session := range []string{"s", "new-session"} {
		s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "echo ran > " + marker, Session: session})
		if err != nil {
			// Also acceptable, if it says what failed.
			if !strings.Contains(err.Error(), "no space left on device") {
				t.Errorf("Start on a full disk (session %q): %v; want an error naming ENOSPC", session, err)
			}
			continue
		}
		f := wait(t, r1, s.ID)
		if f.State != bgjob.Failed || f.ExitCode != -1 || !strings.HasPrefix(f.Reason, "state: ") || !strings.Contains(f.Reason, "no space left on device") {
			t.Errorf("Start on a full disk (session %q): got %v %d %q; want failed -1 with a reason naming the state write and ENOSPC", session, f.State, f.ExitCode, f.Reason)
		}
		if f.PID != 0 {
			t.Errorf("launch without a record got a process %d; want none", f.PID)
		}
	}
	if _, err := os.Stat(marker); err == nil {
		t.Errorf("a job whose record could not be written ran anyway")
	}

	// Delivering completions on the full disk cannot record the
	// delivery; it must not harm the records either.
	if c := r1.Completions("s"); len(c) != 3 { // a, b and the failed launch
		t.Errorf("Completions(s) on the full disk: %d; want 3", len(c))
	}

	checkEarlier := func(r *bgjob.Registry, when string) {
		t.Helper()
		for id, w := range earlier {
			m := recordOf(t, state, id)
			if m["state"] != w.state.String() || m["exit_code"] != float64(w.code) {
				t.Errorf("%s: record of %s: state %v exit_code %v; want %v %d", when, id, m["state"], m["exit_code"], w.state, w.code)
			}
			s, err := r.Status(id)
			if err != nil {
				t.Errorf("%s: Status(%s): %v", when, id, err)
				continue
			}
			if s.State != w.state || s.ExitCode != w.code || (w.text != "" && s.Output.Text != w.text) {
				t.Errorf("%s: %s: got %v %d %q; want %v %d %q", when, id, s.State, s.ExitCode, s.Output.Text, w.state, w.code, w.text)
			}
		}
	}
	checkEarlier(r1, "full disk, same registry")
	if err := r1.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}

	// A new Registry on the still full disk replays them all.
	r2 := newRegistry(t, cfg)
	checkEarlier(r2, "full disk, after restart")
	if err := r2.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}

	// Room again: the records are still the true ones and launches work.
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	r3 := newRegistry(t, cfg)
	checkEarlier(r3, "space freed, after restart")
	s, err := r3.Start(ctxT(t), bgjob.Spec{Command: "echo again; exit 4", Session: "s"})
	if err != nil {
		t.Fatal(err)
	}
	if f := wait(t, r3, s.ID); f.State != bgjob.Exited || f.ExitCode != 4 || f.Output.Text != "again\n" {
		t.Errorf("launch after space was freed: got %v %d %q (%q); want exited 4 %q", f.State, f.ExitCode, f.Output.Text, f.Reason, "again\n")
	}
	t.Logf("registry log:\n%s", logs.String())
}

// TestDurableDiskFullJobEnd: a job that was launched while there was room
// and ends once the disk is full. Its end happens while its registry
// watches it, so it is known (Exited 7); a new Registry must replay that
// end, not a made-up one.
func TestDurableDiskFullJobEnd(t *testing.T) {
	mnt, state := smallStateDir(t, "3m")
	logs := &syncBuffer{}
	cfg := bgjob.Config{StateDir: state, KillGrace: 500 * time.Millisecond, Logger: slog.New(slog.NewTextHandler(logs, nil))}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("registry log:\n%s", logs.String())
		}
	})
	r1 := newRegistry(t, cfg)
	gate := filepath.Join(t.TempDir(), "go") // off the tmpfs
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "echo started; while [ ! -e " + gate + " ]; do sleep 0.02; done; exit 7", Session: "s"})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r1, s.ID, "started", 1)
	if m := recordOf(t, state, s.ID); m["state"] != "running" {
		t.Fatalf("record state %v; want running", m["state"])
	}
	filler := fillDisk(t, mnt)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	f := wait(t, r1, s.ID)
	if f.State != bgjob.Exited || f.ExitCode != 7 || f.Output.Text != "started\n" {
		t.Fatalf("live: got %v %d %q (%q); want exited 7 %q", f.State, f.ExitCode, f.Output.Text, f.Reason, "started\n")
	}
	if err := r1.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	// Whatever is on disk now must not contradict the true end: the
	// record may be stale ("running"), but then the exit marker must
	// say 7, so that replay gets it right.
	for _, when := range []string{"full disk", "space freed"} {
		if when == "space freed" {
			if err := os.Remove(filler); err != nil {
				t.Fatal(err)
			}
		}
		r := newRegistry(t, cfg)
		got, err := r.Status(s.ID)
		if err != nil {
			t.Fatalf("%s: Status after restart: %v", when, err)
		}
		if got.State != bgjob.Exited || got.ExitCode != 7 {
			t.Errorf("%s: after restart: got %v %d (%q); want exited 7 as the job really ended", when, got.State, got.ExitCode, got.Reason)
		}
		if err := r.Close(ctxT(t)); err != nil {
			t.Fatal(err)
		}
	}
}
