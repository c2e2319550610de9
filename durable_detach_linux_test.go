//go:build linux

package bgjob_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// What a Registry leaves when Detach releases its jobs, and what the
// next one finds: TestStressDurable found each of these (see
// /work/notes/stress-durable.md and durable-fix.md).

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
// same process replays it as finished, and reaps its shell and keeper,
// children of this process that nothing else would reap.
func TestDurableReleasedChildrenReapedByReplay(t *testing.T) {
	cfg := durable(t)
	s, keeper := detachedJob(t, cfg, "echo one; sleep 0.3; echo two", "one")
	dWaitExit(t, s.PID)
	dWaitExit(t, keeper) // it copied "two" and saw the pipe's end
	if z := zombieChildren(); !z[s.PID] || !z[keeper] {
		t.Fatalf("shell %d and keeper %d: zombie children %v; want both (the test needs them)", s.PID, keeper, z)
	}
	r2 := newRegistry(t, cfg)
	if f := wait(t, r2, s.ID); f.State != bgjob.Exited || f.Output.Text != "one\ntwo\n" {
		t.Fatalf("replayed job: %v %q; want exited %q", f.State, f.Output.Text, "one\ntwo\n")
	}
	r2.Close(ctxT(t))
	z := zombieChildren()
	for _, pid := range []int{s.PID, keeper} {
		if z[pid] {
			t.Errorf("process %d is a zombie child of the host after the restart; want it reaped", pid)
		}
	}
}

// A job released by this process and adopted by another, which sees it
// end: its shell and keeper are still this process's children, and the
// next Registry here reaps them.
func TestDurableReleasedChildrenReapedAfterAdoptionElsewhere(t *testing.T) {
	cfg := durable(t)
	s, keeper := detachedJob(t, cfg, "echo one; sleep 0.5; echo two", "one")
	host := exec.Command(os.Args[0], "-test.run=^TestDurableAdopterHost$", "-test.count=1")
	host.Env = append(os.Environ(), adopterEnv+"="+cfg.StateDir)
	out, err := host.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "ended "+string(s.ID)+" exited") {
		t.Fatalf("adopter host: %v\n%s", err, out)
	}
	dWaitExit(t, s.PID)
	dWaitExit(t, keeper)
	if z := zombieChildren(); !z[s.PID] || !z[keeper] {
		t.Fatalf("shell %d and keeper %d: zombie children %v; want both (the test needs them)", s.PID, keeper, z)
	}
	r2 := newRegistry(t, cfg)
	z := zombieChildren()
	for _, pid := range []int{s.PID, keeper} {
		if z[pid] {
			t.Errorf("process %d is a zombie child of the host after New; want it reaped", pid)
		}
	}
	if f := wait(t, r2, s.ID); f.State != bgjob.Exited || f.Output.Text != "one\ntwo\n" {
		t.Errorf("job ended elsewhere: %v %q; want exited %q", f.State, f.Output.Text, "one\ntwo\n")
	}
}

const adopterEnv = "BGJOB_TEST_ADOPTER_DIR"

// TestDurableAdopterHost is the other process of
// TestDurableReleasedChildrenReapedAfterAdoptionElsewhere: it adopts the
// running jobs of a state directory, waits for their ends, prints them
// and closes. It does nothing unless BGJOB_TEST_ADOPTER_DIR is set.
func TestDurableAdopterHost(t *testing.T) {
	dir := os.Getenv(adopterEnv)
	if dir == "" {
		t.Skip("run by TestDurableReleasedChildrenReapedAfterAdoptionElsewhere")
	}
	r, err := bgjob.New(bgjob.Config{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	for _, s := range r.List("") {
		f, err := r.Wait(ctxT(t), s.ID)
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("ended %s %v\n", f.ID, f.State)
	}
	r.Close(ctxT(t))
}

// A job that ends while its registry is detached, before its keeper has
// copied the last of the pipe to the file: New waits for the keeper
// before it rebuilds the job's output from the file. The keeper is
// stopped (SIGSTOP) to make that window certain, and let go while New
// waits.
func TestDurableReplayWaitsForKeeper(t *testing.T) {
	cfg := durable(t)
	s, keeper := detachedJob(t, cfg, "echo one; sleep 0.5; echo two", "one")
	syscall.Kill(keeper, syscall.SIGSTOP)
	defer syscall.Kill(keeper, syscall.SIGCONT)
	dWaitExit(t, s.PID) // "two" waits in the pipe
	// A keeper slower than the job: it goes on 300 ms into New's wait.
	resume := time.AfterFunc(300*time.Millisecond, func() { syscall.Kill(keeper, syscall.SIGCONT) })
	defer resume.Stop()
	begin := time.Now()
	r2 := newRegistry(t, cfg)
	took := time.Since(begin)
	f := wait(t, r2, s.ID)
	if f.State != bgjob.Exited || f.Output.Text != "one\ntwo\n" || f.Output.Total != 8 || f.Output.Notice != "" {
		t.Errorf("replayed job: %v %q (total %d, notice %q); want exited %q, total 8, no notice",
			f.State, f.Output.Text, f.Output.Total, f.Output.Notice, "one\ntwo\n")
	}
	if took < 250*time.Millisecond {
		t.Errorf("New took %v; want it to have waited for the keeper (300 ms)", took)
	}
	if zombieChildren()[keeper] {
		t.Errorf("keeper %d is a zombie child after New; want it reaped", keeper)
	}
}

// A keeper that never finishes (stopped for good) holds New up for a
// bounded time only: the job comes back with the text its file holds
// and a notice that it may end early.
func TestDurableReplayWaitForKeeperIsBounded(t *testing.T) {
	cfg := durable(t)
	s, keeper := detachedJob(t, cfg, "echo one; sleep 0.5; echo two", "one")
	syscall.Kill(keeper, syscall.SIGSTOP)
	dWaitExit(t, s.PID)
	begin := time.Now()
	r2 := newRegistry(t, cfg)
	took := time.Since(begin)
	syscall.Kill(keeper, syscall.SIGCONT)
	f := wait(t, r2, s.ID)
	if f.State != bgjob.Exited || f.Output.Text != "one\n" || !strings.Contains(f.Output.Notice, "may end early") {
		t.Errorf("replayed job: %v %q (notice %q); want exited %q with a notice that it may end early",
			f.State, f.Output.Text, f.Output.Notice, "one\n")
	}
	if took < time.Second || took > 10*time.Second {
		t.Errorf("New took %v; want it to have waited about 2s for the keeper, and no longer", took)
	}
	// The keeper finishes its copy once it goes on; the next Registry
	// of the process reaps it.
	dWaitExit(t, keeper)
	r2.Close(ctxT(t))
	if zombieChildren()[keeper] {
		t.Errorf("keeper %d is a zombie child after Close; want it reaped", keeper)
	}
}

// Cancel of a job that Detach released returns at once with ErrClosed
// and the running snapshot: the job is not this registry's to stop any
// more, and the next Registry adopts it, running.
func TestDurableCancelAfterDetach(t *testing.T) {
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
	var got bgjob.Snapshot
	go func() {
		var err error
		got, err = r1.Cancel(s.ID)
		done <- err
	}()
	select {
	case err := <-done:
		if !errors.Is(err, bgjob.ErrClosed) || got.State != bgjob.Running || got.ID != s.ID {
			t.Errorf("Cancel of a released job: %v, %v; want running and ErrClosed", got.State, err)
		}
	case <-time.After(deadline):
		t.Fatalf("Cancel of a released job has not returned after %v", deadline)
	}
	r2 := newRegistry(t, cfg)
	if f := wait(t, r2, s.ID); f.State != bgjob.Exited || f.ExitCode != 0 {
		t.Errorf("adopted job: %v %d; want exited 0 (not cancelled)", f.State, f.ExitCode)
	}
}

// Cancel racing Detach: it returns either way, with the job cancelled (it
// came first) or released (ErrClosed, and the next Registry adopts it).
func TestDurableCancelRacingDetach(t *testing.T) {
	for i := range 20 {
		cfg := durable(t)
		r1, err := bgjob.New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "echo go; sleep 60"})
		if err != nil {
			t.Fatal(err)
		}
		waitOutput(t, r1, s.ID, "go", 1)
		done := make(chan error, 1)
		var got bgjob.Snapshot
		go func() {
			var err error
			got, err = r1.Cancel(s.ID)
			done <- err
		}()
		if i%2 == 0 {
			runtime.Gosched()
		}
		r1.Detach()
		var cerr error
		select {
		case cerr = <-done:
		case <-time.After(deadline):
			t.Fatalf("round %d: Cancel racing Detach has not returned after %v", i, deadline)
		}
		r2 := newRegistry(t, cfg)
		switch {
		case cerr == nil && got.State == bgjob.Cancelled:
			if r2.Running() != 0 {
				t.Errorf("round %d: the job was cancelled, and the next Registry adopted %d", i, r2.Running())
			}
		case errors.Is(cerr, bgjob.ErrClosed) && got.State == bgjob.Running:
			if c, err := r2.Cancel(s.ID); err != nil || c.State != bgjob.Cancelled {
				t.Errorf("round %d: Cancel of the adopted job: %v %v", i, c.State, err)
			}
		default:
			t.Errorf("round %d: Cancel racing Detach: %v, %v; want cancelled, or running and ErrClosed", i, got.State, cerr)
		}
		r2.Close(ctxT(t))
	}
}

// Each job that Detach releases leaves nothing open in its registry's
// process: not its cgroup's folder (jobCgroup.fd, a raw descriptor) nor
// the files the registry read in it.
func TestDurableDetachReleasesCgroupDescriptors(t *testing.T) {
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
		r1.Detach()
		r2 := newRegistry(t, cfg)
		wait(t, r2, s.ID)
		t.Skip("no cgroup here")
	}
	r1.Detach()
	runtime.GC() // an *os.File left open would be closed by its finalizer
	for _, fd := range stressFDs() {
		if !slices.Contains(before, fd) && strings.Contains(fd, "/sys/fs/cgroup") {
			t.Errorf("descriptor %s still open after Detach released the job", fd)
		}
	}
	r2, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, r2, s.ID)
	r2.Close(ctxT(t))
	for _, fd := range stressFDs() {
		if !slices.Contains(before, fd) && strings.Contains(fd, "/sys/fs/cgroup") {
			t.Errorf("descriptor %s still open after the job ended and both registries ended", fd)
		}
	}
}

// A host that dies while it stops a job leaves the job's end known: the
// stop's cause is recorded before its signal, so the replay reports how
// the stop ended the job, not the exit status SIGTERM gave its shell
// (143); and a Registry that adopts a job being stopped goes on stopping
// it.
func TestDurableStopCauseSurvivesHostDeath(t *testing.T) {
	const (
		exits   = "trap 'echo term; sleep 1; exit 143' TERM; echo ready; sleep 60" // ends a second after SIGTERM
		ignores = "trap 'echo term' TERM; echo ready; while :; do sleep 0.1; done" // survives SIGTERM
	)
	for _, tc := range []struct {
		name, stop, cmd string
		state           bgjob.State
		code            int
		reason          string
	}{
		// The job ends while no host runs: replayed.
		{"timeout-ends-while-no-host-runs", "timeout", exits, bgjob.TimedOut, 124, "timed out after 300ms"},
		{"cancel-ends-while-no-host-runs", "cancel", exits, bgjob.Cancelled, 130, "cancelled"},
		// It survives: adopted, stopped again, killed after the grace.
		{"cancel-adopted-and-stopped-again", "cancel", ignores, bgjob.Cancelled, 130, "cancelled"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := durable(t)
			host := exec.Command(os.Args[0], "-test.run=^TestDurableStopHost$", "-test.count=1")
			host.Env = append(os.Environ(), stopHostEnv+"="+cfg.StateDir, stopHostArgs+"="+tc.stop+" "+tc.cmd)
			out, _ := host.StdoutPipe()
			if err := host.Start(); err != nil {
				t.Fatal(err)
			}
			var id bgjob.ID
			pid := 0
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				if f := strings.Fields(sc.Text()); len(f) == 3 && f[0] == "job" {
					id = bgjob.ID(f[1])
					fmt.Sscan(f[2], &pid)
				} else if sc.Text() == "stopping" {
					break
				} else {
					t.Errorf("host: %s", sc.Text())
				}
			}
			host.Process.Kill()
			host.Wait()
			if id == "" {
				t.Fatal("the host never began to stop its job")
			}
			if tc.cmd == exits {
				waitExit(t, pid) // ended by the SIGTERM, while no host runs
			}
			r := newRegistry(t, cfg)
			f := wait(t, r, id)
			if f.State != tc.state || f.ExitCode != tc.code || f.Reason != tc.reason {
				t.Errorf("job whose host died while stopping it: %v %d %q; want %v %d %q",
					f.State, f.ExitCode, f.Reason, tc.state, tc.code, tc.reason)
			}
			if c := r.Completions(""); len(c) != 1 || c[0].State != tc.state {
				t.Errorf("completions %+v; want one, %v", c, tc.state)
			}
			assertGone(t, f)
		})
	}
}

const (
	stopHostEnv  = "BGJOB_TEST_STOP_HOST_DIR"
	stopHostArgs = "BGJOB_TEST_STOP_HOST_ARGS" // "timeout" or "cancel", then the command
)

// TestDurableStopHost is the host of TestDurableStopCauseSurvivesHostDeath:
// it starts its job (with a 300 ms timeout, or cancels it once it is
// ready) under a kill grace of an hour, prints "stopping" once the job has
// seen the SIGTERM, and waits to be killed. It does nothing unless
// BGJOB_TEST_STOP_HOST_DIR is set.
func TestDurableStopHost(t *testing.T) {
	dir := os.Getenv(stopHostEnv)
	if dir == "" {
		t.Skip("run by TestDurableStopCauseSurvivesHostDeath")
	}
	fail := func(err error) {
		fmt.Println("error", err)
		os.Exit(1)
	}
	r, err := bgjob.New(bgjob.Config{StateDir: dir, KillGrace: time.Hour})
	if err != nil {
		fail(err)
	}
	stop, cmd, _ := strings.Cut(os.Getenv(stopHostArgs), " ")
	spec := bgjob.Spec{Command: cmd}
	if stop == "timeout" {
		spec.Timeout = 300 * time.Millisecond
	}
	s, err := r.Start(context.Background(), spec)
	if err != nil {
		fail(err)
	}
	fmt.Printf("job %s %d\n", s.ID, s.PID)
	if _, err := r.ReadWait(context.Background(), s.ID, 0, 64); err != nil {
		fail(err)
	}
	if stop == "cancel" {
		go r.Cancel(s.ID) // it returns when the job has ended: never, here
	}
	if _, err := r.ReadWait(context.Background(), s.ID, int64(len("ready\n")), 64); err != nil {
		fail(err)
	}
	fmt.Println("stopping")
	select {} // until SIGKILL
}

// The record of a stopped job says why it was stopped; a finished
// job's record keeps its end, and the stop is not replayed over it.
func TestDurableStopRecorded(t *testing.T) {
	cfg := durable(t)
	r := newRegistry(t, cfg)
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo go; sleep 60"})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r, s.ID, "go", 1)
	if c, err := r.Cancel(s.ID); err != nil || c.State != bgjob.Cancelled {
		t.Fatalf("Cancel: %v %v", c.State, err)
	}
	rec := readRec(t, runFolders(t, cfg.StateDir)[0])
	stop, _ := rec["stop"].(map[string]any)
	if rec["state"] != "cancelled" || stop["state"] != "cancelled" || stop["reason"] != "cancelled" {
		t.Errorf("record after Cancel: state %v, stop %v; want cancelled, and a stop saying so", rec["state"], rec["stop"])
	}
	r.Close(ctxT(t))
	r2 := newRegistry(t, cfg)
	if f, err := r2.Status(s.ID); err != nil || f.State != bgjob.Cancelled || f.ExitCode != 130 {
		t.Errorf("replayed: %v %d %v; want cancelled 130", f.State, f.ExitCode, err)
	}
}

// Completions drained from several goroutines after Close (or Detach)
// each record their delivery: the records are written under the state
// directory's lock taken again, one writer at a time, and no completion
// comes back from the next Registry.
func TestDurableDeliveriesAfterCloseAreRecorded(t *testing.T) {
	cfg := durable(t)
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const sessions = 16
	for i := range sessions {
		s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "true", Session: fmt.Sprint("s", i)})
		if err != nil {
			t.Fatal(err)
		}
		wait(t, r1, s.ID)
	}
	r1.Close(ctxT(t))
	start := make(chan struct{})
	got := make(chan int, sessions)
	for i := range sessions {
		go func() {
			<-start
			got <- len(r1.Completions(fmt.Sprint("s", i)))
		}()
	}
	close(start)
	n := 0
	for range sessions {
		n += <-got
	}
	if n != sessions {
		t.Fatalf("%d completions delivered after Close; want %d", n, sessions)
	}
	r2 := newRegistry(t, cfg)
	for i := range sessions {
		if c := r2.Completions(fmt.Sprint("s", i)); len(c) != 0 {
			t.Errorf("session s%d: %d completions again from the next Registry; want none", i, len(c))
		}
	}
}

// An interactive job released by Detach that ends while no host runs:
// the holder of its input, like its shell, is this process's child, and
// the next New reaps it.
func TestDurableReleasedInputHolderReaped(t *testing.T) {
	cfg := durable(t)
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "echo one; sleep 0.3", Interactive: true})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r1, s.ID, "one", 1)
	holder := holderOf(t, cfg.StateDir, s.ID)
	if err := r1.Detach(); err != nil {
		t.Fatal(err)
	}
	dWaitExit(t, s.PID)
	dWaitExit(t, holder) // its life pipe closed with the job's wrapper
	if z := zombieChildren(); !z[s.PID] || !z[holder] {
		t.Fatalf("shell %d and holder %d: zombie children %v; want both (the test needs them)", s.PID, holder, z)
	}
	r2 := newRegistry(t, cfg)
	if f := wait(t, r2, s.ID); f.State != bgjob.Exited || f.Output.Text != "one\n" {
		t.Fatalf("replayed job: %v %q; want exited %q", f.State, f.Output.Text, "one\n")
	}
	z := zombieChildren()
	for _, pid := range []int{s.PID, holder} {
		if z[pid] {
			t.Errorf("process %d is a zombie child of the host after New; want it reaped", pid)
		}
	}
}
