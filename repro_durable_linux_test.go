package bgjob_test

import (
	"os"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// Reproductions of the library bugs that TestStressDurable found. Each
// fails today; they are skipped unless BGJOB_REPRO=1, so that the package
// stays green until the fixes land (TestStressDurable itself reports them
// as failures). See /work/notes/stress-durable.md.

func reproOnly(t *testing.T, bug string) {
	if os.Getenv("BGJOB_REPRO") != "1" {
		t.Skip("library bug: " + bug + " (set BGJOB_REPRO=1 to run)")
	}
}

// detachedJob starts cmd, waits for its first line, detaches the
// registry, and returns the job and its keeper's PID.
func detachedJob(t *testing.T, cfg bgjob.Config, cmd, first string) (bgjob.Snapshot, int) {
	t.Helper()
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: cmd})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r1, s.ID, first, 1)
	if err := r1.Detach(); err != nil {
		t.Fatal(err)
	}
	runs := runFolders(t, cfg.StateDir)
	if len(runs) != 1 {
		t.Fatalf("run folders %v; want 1", runs)
	}
	keeper, _ := readRec(t, runs[0])["keeper_pid"].(float64)
	if keeper == 0 {
		t.Fatal("the record names no keeper")
	}
	return s, int(keeper)
}

// A job that ends while its registry is detached: the next Registry in the
// same process replays it as finished, and nothing ever reaps its keeper,
// a child of this process (adoptProcess looks at the keeper only for a job
// it adopts). One zombie per such job, for the life of the process.
func TestReproKeeperZombieAfterInProcessRestart(t *testing.T) {
	reproOnly(t, "the keeper of a job that ended while detached is never reaped")
	cfg := durable(t)
	s, keeper := detachedJob(t, cfg, "echo one; sleep 0.3; echo two", "one")
	dWaitExit(t, s.PID)
	dWaitExit(t, keeper) // it copied "two" and saw the pipe's end
	r2 := newRegistry(t, cfg)
	if f := wait(t, r2, s.ID); f.State != bgjob.Exited {
		t.Fatalf("replayed job: %v", f.State)
	}
	r2.Close(ctxT(t))
	if zombieChildren()[keeper] {
		t.Errorf("keeper %d is a zombie child of the host after the restart; want it reaped", keeper)
	}
}

// A job that ends while its registry is detached, before its keeper has
// copied the last of the pipe to the file: New replays it from the file at
// once (rebuild), without waiting for the keeper, and its text misses the
// end, for good. The keeper is stopped here to make the window certain; in
// TestStressDurable the scheduler opens it (a flood's last 64-104 KiB).
func TestReproReplayDoesNotWaitForKeeper(t *testing.T) {
	reproOnly(t, "replay rebuilds a finished job's output before its keeper has copied it all")
	cfg := durable(t)
	s, keeper := detachedJob(t, cfg, "echo one; sleep 0.5; echo two", "one")
	syscall.Kill(keeper, syscall.SIGSTOP)
	defer syscall.Kill(keeper, syscall.SIGCONT)
	dWaitExit(t, s.PID) // "two" waits in the pipe
	r2 := newRegistry(t, cfg)
	f := wait(t, r2, s.ID)
	if f.State != bgjob.Exited || f.Output.Text != "one\ntwo\n" {
		t.Errorf("replayed job: %v %q (total %d); want exited %q", f.State, f.Output.Text, f.Output.Total, "one\ntwo\n")
	}
}

// Cancel of a job that Detach released blocks for ever: the job never
// finishes in that registry, and Cancel waits for its end with no ctx.
func TestReproCancelAfterDetachNeverReturns(t *testing.T) {
	reproOnly(t, "Cancel of a released job never returns")
	cfg := durable(t)
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "sleep 1"})
	if err != nil {
		t.Fatal(err)
	}
	r1.Detach()
	done := make(chan error, 1)
	go func() { _, err := r1.Cancel(s.ID); done <- err }()
	select {
	case err := <-done:
		t.Logf("Cancel returned %v", err)
	case <-time.After(5 * time.Second):
		t.Errorf("Cancel of a released job has not returned after 5s; want ErrClosed or the snapshot at once")
	}
	r2 := newRegistry(t, cfg)
	wait(t, r2, s.ID)
}

// Each job that Detach releases leaves its cgroup folder's descriptor
// (jobCgroup.fd, a raw descriptor) open for the life of the process:
// process.close skips the cgroup of an unreaped process, so the jobCgroup
// is neither recycled nor closed. Its cgroup.events (an *os.File) stays
// open too, until the garbage collector finalizes it.
func TestReproDetachLeaksCgroupDescriptor(t *testing.T) {
	reproOnly(t, "Detach leaks each released job's cgroup folder descriptor")
	cfg := durable(t)
	before := stressFDs()
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "sleep 0.5"})
	if err != nil {
		t.Fatal(err)
	}
	if s.Containment != bgjob.ContainCgroup {
		t.Skip("no cgroup here")
	}
	r1.Detach()
	r2, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, r2, s.ID)
	r2.Close(ctxT(t))
	runtime.GC()
	for _, fd := range stressFDs() {
		if !slices.Contains(before, fd) && strings.Contains(fd, "/sys/fs/cgroup") {
			t.Errorf("descriptor %s still open after the job ended and both registries ended", fd)
		}
	}
}
