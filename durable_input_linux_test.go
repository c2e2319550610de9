//go:build linux

package bgjob_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"

	"github.com/bgjob/bgjob"
)

// Durable mode's interactive input: the job reads a FIFO in its run
// folder, which a holder process keeps open across the host's restarts.

// holderOf returns the PID of the input holder that a job's record names.
func holderOf(t *testing.T, dir string, id bgjob.ID) int {
	t.Helper()
	for _, run := range runFolders(t, dir) {
		if strings.HasPrefix(filepath.Base(run), string(id)+".") {
			if pid, ok := readRec(t, run)["holder_pid"].(float64); ok {
				return int(pid)
			}
		}
	}
	t.Fatalf("no holder recorded for %s", id)
	return 0
}

func TestDurableInteractiveDetachAdopt(t *testing.T) {
	cfg := durable(t)
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "cat", Interactive: true})
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, r1, s.ID, "before\n")
	awaitOutput(t, r1, s.ID, "before\n")
	holder := holderOf(t, cfg.StateDir, s.ID)
	if err := r1.Detach(); err != nil {
		t.Fatal(err)
	}
	_, err = r1.Write(ctxT(t), s.ID, []byte("x"))
	mustErr(t, err, bgjob.ErrInputClosed) // the detached registry's end is gone

	r2 := newRegistry(t, cfg)
	if st, err := r2.Status(s.ID); err != nil || st.State != bgjob.Running {
		t.Fatalf("adopted cat: %v, %v; want running: the host's end closing must not end its input", st.State, err)
	}
	mustWrite(t, r2, s.ID, "after\n")
	awaitOutput(t, r2, s.ID, "after\n")
	if err := r2.CloseInput(s.ID); err != nil {
		t.Fatal(err)
	}
	end := wait(t, r2, s.ID)
	if end.State != bgjob.Exited || end.ExitCode != 0 || end.Output.Text != "before\nafter\n" {
		t.Errorf("got %v, exit %d, %q; want exited 0, %q", end.State, end.ExitCode, end.Output.Text, "before\nafter\n")
	}
	waitExit(t, holder)
	r1.Close(ctxT(t))
	r2.Close(ctxT(t))
	// The shell and the holder were this process's children, released
	// by r1: the Close of a durable Registry reaps them.
	z := zombieChildren()
	for _, pid := range []int{s.PID, holder} {
		if z[pid] {
			t.Errorf("process %d of the released job is a zombie child of the host after Close; want it reaped", pid)
		}
	}
}

// A job whose input CloseInput closed is adopted with its input closed.
func TestDurableInteractiveClosedStaysClosed(t *testing.T) {
	cfg := durable(t)
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "cat; echo eof; sleep 60", Interactive: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.CloseInput(s.ID); err != nil {
		t.Fatal(err)
	}
	awaitOutput(t, r1, s.ID, "eof")
	r1.Detach()
	r2, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	_, err = r2.Write(ctxT(t), s.ID, []byte("x"))
	mustErr(t, err, bgjob.ErrInputClosed)
	r2.Cancel(s.ID)
	r2.Close(ctxT(t))
	r1.Close(ctxT(t))
	// Replayed after its end, it is still an interactive job, ended.
	r3 := newRegistry(t, cfg)
	_, err = r3.Write(ctxT(t), s.ID, []byte("x"))
	mustErr(t, err, bgjob.ErrInputClosed)
}

func TestDurableTTYIsRefused(t *testing.T) {
	r := newRegistry(t, durable(t))
	_, err := r.Start(ctxT(t), bgjob.Spec{Command: "true", TTY: &bgjob.TTY{}})
	mustErr(t, err, bgjob.ErrUnsupported)
	if len(r.List("")) != 0 {
		t.Errorf("a refused TTY launch left a job")
	}
}

const inputHostEnv = "BGJOB_TEST_INPUT_HOST_DIR"

// TestDurableInputHost is the host that TestDurableInteractiveCrash
// SIGKILLs: it starts interactive jobs, writes to one, and waits.
func TestDurableInputHost(t *testing.T) {
	dir := os.Getenv(inputHostEnv)
	if dir == "" {
		t.Skip("run as the host of TestDurableInteractiveCrash")
	}
	r, err := bgjob.New(bgjob.Config{StateDir: dir})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	ctx := ctxT(t)
	cat, err := r.Start(ctx, bgjob.Spec{Command: "cat", Interactive: true})
	if err == nil {
		_, err = r.Write(ctx, cat.ID, []byte("before\n"))
	}
	ends, err2 := r.Start(ctx, bgjob.Spec{Command: "read line; echo \"read $line\"", Interactive: true})
	if err := errors.Join(err, err2); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	waitOutput(t, r, cat.ID, "before", 1)
	fmt.Printf("job cat %s %d\njob ends %s %d\nready\n", cat.ID, cat.PID, ends.ID, ends.PID)
	select {} // until SIGKILL
}

// The host dies (SIGKILL) while its interactive jobs run: their input
// stays open, a new host writes on and closes it; a job that ends while
// no host runs takes its holder with it.
func TestDurableInteractiveCrash(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	host := exec.Command(os.Args[0], "-test.run=^TestDurableInputHost$", "-test.count=1")
	host.Env = append(os.Environ(), inputHostEnv+"="+dir)
	out, _ := host.StdoutPipe()
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	ids, pids := map[string]bgjob.ID{}, map[string]int{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "job" {
			ids[f[1]] = bgjob.ID(f[2])
			pids[f[1]], _ = strconv.Atoi(f[3])
		}
		if sc.Text() == "ready" {
			break
		}
		if len(f) > 0 && f[0] == "error" {
			t.Fatal(sc.Text())
		}
	}
	if len(ids) != 2 {
		t.Fatalf("host started %d jobs; want 2", len(ids))
	}
	host.Process.Kill()
	host.Wait()
	t.Cleanup(func() {
		for _, pid := range pids {
			syscall.Kill(-pid, syscall.SIGKILL)
		}
	})

	// While no host runs, the job that reads a line still waits for it:
	// the host's death did not end its input. Its holder, the host's
	// child once, lives on.
	holder := holderOf(t, dir, ids["ends"])
	if err := syscall.Kill(holder, 0); err != nil {
		t.Fatalf("the holder of a running job's input is gone after the host's death: %v", err)
	}
	r := newRegistry(t, bgjob.Config{StateDir: dir})
	for name, id := range ids {
		if st, err := r.Status(id); err != nil || st.State != bgjob.Running {
			t.Fatalf("%s after the crash: %v, %v; want running", name, st.State, err)
		}
	}
	mustWrite(t, r, ids["cat"], "after\n")
	if err := r.CloseInput(ids["cat"]); err != nil {
		t.Fatal(err)
	}
	if end := wait(t, r, ids["cat"]); end.State != bgjob.Exited || end.Output.Text != "before\nafter\n" {
		t.Errorf("cat: %v, %q; want exited, %q", end.State, end.Output.Text, "before\nafter\n")
	}
	mustWrite(t, r, ids["ends"], "hello\n")
	if end := wait(t, r, ids["ends"]); end.State != bgjob.Exited || end.Output.Text != "read hello\n" {
		t.Errorf("reader: %v, %q; want exited, %q", end.State, end.Output.Text, "read hello\n")
	}
	// The holder ends with its job, though it is nobody's child now.
	waitExit(t, holder)
}
