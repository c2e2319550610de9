//go:build linux

package bgjob

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A boot ID that cannot be read (a transient EMFILE, say) fails New and
// changes no record: read as "", it would make every running job look
// like one of an earlier boot, and replay would record it lost and stop
// its processes.
func TestDurableUnreadableBootIDFailsNew(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cfg := Config{StateDir: filepath.Join(t.TempDir(), "state"), KillGrace: 500 * time.Millisecond}
	r1, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r1.Start(ctx, Spec{Command: "sleep 60"})
	if err != nil {
		t.Fatal(err)
	}
	defer syscall.Kill(-s.PID, syscall.SIGKILL)
	if err := r1.Detach(); err != nil {
		t.Fatal(err)
	}
	runs, _ := filepath.Glob(filepath.Join(cfg.StateDir, "sessions", "*", "job_*", recordFile))
	if len(runs) != 1 {
		t.Fatalf("records %v; want 1", runs)
	}
	before, _ := os.ReadFile(runs[0])

	saved := bootIDFile
	bootIDFile = filepath.Join(t.TempDir(), "missing")
	_, err = New(cfg)
	bootIDFile = saved
	if err == nil || !strings.Contains(err.Error(), "boot ID") {
		t.Fatalf("New with the boot ID unreadable: %v; want an error naming the boot ID", err)
	}
	if after, _ := os.ReadFile(runs[0]); string(after) != string(before) {
		t.Errorf("record changed by the failed New:\n%s\nwas\n%s", after, before)
	}

	r2, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer r2.Close(ctx)
	if got, err := r2.Status(s.ID); err != nil || got.State != Running {
		t.Errorf("after the failed New: %v %v; want the job adopted, running", got.State, err)
	}
}
