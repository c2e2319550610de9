//go:build linux

package bgjob_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
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

// durable returns a Config in durable mode on a fresh state directory.
func durable(t testing.TB) bgjob.Config {
	return bgjob.Config{StateDir: filepath.Join(t.TempDir(), "state"), KillGrace: 500 * time.Millisecond}
}

// runFolders returns the run folders under a state directory.
func runFolders(t *testing.T, dir string) []string {
	t.Helper()
	runs, _ := filepath.Glob(filepath.Join(dir, "sessions", "*", "job_*"))
	return runs
}

func readRec(t *testing.T, run string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(run, "record.json"))
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	return m
}

func TestDurableLive(t *testing.T) {
	for _, tc := range []struct {
		name     string
		spec     bgjob.Spec
		cancel   bool
		state    bgjob.State
		code     int
		text     string
		reasonIn string
	}{
		{name: "exit-code", spec: bgjob.Spec{Command: "echo out; echo err >&2; exit 3"}, state: bgjob.Exited, code: 3, text: "out\nerr\n"},
		{name: "signal-128-plus-n", spec: bgjob.Spec{Command: "echo x; kill -9 $$"}, state: bgjob.Exited, code: 137, text: "x\n"},
		{name: "quoting", spec: bgjob.Spec{Command: `printf '%s|' "a b" 'c"d' "e'f" '$HOME' ; echo`}, state: bgjob.Exited, code: 0, text: `a b|c"d|e'f|$HOME|` + "\n"},
		{name: "stdin", spec: bgjob.Spec{Command: "cat", Stdin: "fed\n"}, state: bgjob.Exited, code: 0, text: "fed\n"},
		{name: "timeout", spec: bgjob.Spec{Command: "echo t; sleep 30", Timeout: 300 * time.Millisecond}, state: bgjob.TimedOut, code: 124, text: "t\n", reasonIn: "timed out"},
		{name: "idle-timeout", spec: bgjob.Spec{Command: "echo i; sleep 30", IdleTimeout: 300 * time.Millisecond}, state: bgjob.TimedOut, code: 124, text: "i\n", reasonIn: "idle"},
		{name: "cancel-kills-group", spec: bgjob.Spec{Command: "echo c; sleep 30 & sleep 30"}, cancel: true, state: bgjob.Cancelled, code: 130, text: "c\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			cfg := durable(t)
			r := newRegistry(t, cfg)
			s, err := r.Start(ctxT(t), tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			if tc.cancel {
				waitOutput(t, r, s.ID, tc.text, 1)
				s, err = r.Cancel(s.ID)
				if err != nil {
					t.Fatal(err)
				}
			} else {
				s = wait(t, r, s.ID)
			}
			if s.State != tc.state || s.ExitCode != tc.code || s.Output.Text != tc.text || !strings.Contains(s.Reason, tc.reasonIn) {
				t.Errorf("got %v %d %q (%q); want %v %d %q (%q)", s.State, s.ExitCode, s.Output.Text, s.Reason, tc.state, tc.code, tc.text, tc.reasonIn)
			}
			assertGone(t, s)
			// The same through a second Registry's replay.
			if err := r.Close(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			r2 := newRegistry(t, cfg)
			s2, err := r2.Status(s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if s2.State != s.State || s2.ExitCode != s.ExitCode || s2.Output.Text != s.Output.Text || s2.Reason != s.Reason {
				t.Errorf("replayed: got %v %d %q (%q); want %v %d %q (%q)", s2.State, s2.ExitCode, s2.Output.Text, s2.Reason, s.State, s.ExitCode, s.Output.Text, s.Reason)
			}
		})
	}
}

func TestDurableLayout(t *testing.T) {
	cfg := durable(t)
	r := newRegistry(t, cfg)
	spec := bgjob.Spec{Command: "echo hi", Session: "alice@example", Env: map[string]string{"SECRET_ENV": "s3cr3t-env"}, Stdin: "s3cr3t-stdin"}
	s, err := r.Start(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	wait(t, r, s.ID)
	check := func(path string, want os.FileMode) {
		t.Helper()
		fi, err := os.Stat(path)
		if err != nil {
			t.Fatal(err)
		}
		if got := fi.Mode().Perm(); got != want {
			t.Errorf("%s: mode %v; want %v", path, got, want)
		}
	}
	check(cfg.StateDir, 0o700)
	check(filepath.Join(cfg.StateDir, "idkey"), 0o600)
	runs := runFolders(t, cfg.StateDir)
	if len(runs) != 1 {
		t.Fatalf("run folders %v; want 1", runs)
	}
	run := runs[0]
	check(filepath.Dir(run), 0o700)
	check(run, 0o700)
	for _, f := range []string{"record.json", "output", "exit"} {
		check(filepath.Join(run, f), 0o600)
	}
	if strings.Contains(run, "alice") {
		t.Errorf("run folder %s names the session", run)
	}
	b, _ := os.ReadFile(filepath.Join(run, "record.json"))
	if bytes.Contains(b, []byte("s3cr3t")) {
		t.Errorf("record holds the environment or stdin: %s", b)
	}
	m := readRec(t, run)
	for k, want := range map[string]any{"id": string(s.ID), "state": "exited", "exit_code": 0.0, "session": "alice@example", "completion_delivered": false, "version": 1.0} {
		if m[k] != want {
			t.Errorf("record %s = %v; want %v", k, m[k], want)
		}
	}
	if m["start_time"] == nil || m["pid"] == nil {
		t.Errorf("record lacks pid or start_time: %s", b)
	}
	if got := r.Completions("alice@example"); len(got) != 1 {
		t.Fatalf("Completions: %d; want 1", len(got))
	}
	if m := readRec(t, run); m["completion_delivered"] != true {
		t.Errorf("completion_delivered = %v after Completions; want true", m["completion_delivered"])
	}
	// IDs are stable across restarts: the persisted key is used again.
	r.Close(ctxT(t))
	r2 := newRegistry(t, cfg)
	s2, err := r2.Start(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	if s2.ID != s.ID {
		t.Errorf("ID after restart %s; want %s", s2.ID, s.ID)
	}
	wait(t, r2, s2.ID)
}

func TestDurableDetachAdopt(t *testing.T) {
	cfg := durable(t)
	var got []bgjob.Completion
	var mu sync.Mutex
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "echo first; sleep 1; echo second; exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	long, err := r1.Start(ctxT(t), bgjob.Spec{Command: "echo long; sleep 60", Timeout: 2 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r1, s.ID, "first", 1)
	if err := r1.Detach(); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	if pids := liveInSession(s.PID); len(pids) == 0 {
		t.Fatalf("job's processes gone after Detach; want them running")
	}
	cfg.OnComplete = func(c bgjob.Completion) { mu.Lock(); got = append(got, c); mu.Unlock() }
	r2 := newRegistry(t, cfg)
	if n := r2.Running(); n != 2 {
		t.Errorf("Running after adoption = %d; want 2", n)
	}
	f := wait(t, r2, s.ID)
	if f.State != bgjob.Exited || f.ExitCode != 3 || f.Output.Text != "first\nsecond\n" {
		t.Errorf("adopted job: got %v %d %q; want exited 3 %q", f.State, f.ExitCode, f.Output.Text, "first\nsecond\n")
	}
	// The wall timeout counts from the original start.
	l := wait(t, r2, long.ID)
	if l.State != bgjob.TimedOut || l.Output.Text != "long\n" || l.Ended.Sub(l.Started) > 4*time.Second {
		t.Errorf("adopted long job: got %v %q after %v; want timed_out %q after about 2s", l.State, l.Output.Text, l.Ended.Sub(l.Started), "long\n")
	}
	assertGone(t, l)
	mu.Lock()
	if len(got) != 2 {
		t.Errorf("OnComplete calls %d; want 2", len(got))
	}
	mu.Unlock()
	r2.Close(ctxT(t))
	r1.Close(ctxT(t)) // after Detach: returns at once

	// Delivered through OnComplete: a third Registry does not queue them.
	cfg.OnComplete = nil
	r3 := newRegistry(t, cfg)
	if c := r3.Completions(""); len(c) != 0 {
		t.Errorf("Completions after delivery through OnComplete: %v; want none", c)
	}
}

// Detach while a RunForeground caller watches its job inline: the call
// returns Detached, the process runs on, and the next Registry adopts it.
func TestDurableDetachDuringRunForeground(t *testing.T) {
	cfg := durable(t)
	started := make(chan bgjob.Event, 1)
	cfg.Telemetry = &telemetryRecorder{onStart: func(e bgjob.Event) { started <- e }}
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cfg.Telemetry = nil
	done := make(chan bgjob.Result, 1)
	go func() {
		res, err := r1.RunForeground(context.Background(), bgjob.Spec{Command: "echo fg; sleep 1; echo done; exit 4"}, bgjob.Foreground{SoftCap: time.Hour})
		if err != nil {
			t.Error(err)
		}
		done <- res
	}()
	select {
	case <-started: // the process exists
	case <-time.After(deadline):
		t.Fatal("the foreground job never started")
	}
	if err := r1.Detach(); err != nil {
		t.Fatalf("Detach: %v", err)
	}
	var res bgjob.Result
	select {
	case res = <-done:
	case <-time.After(deadline):
		t.Fatal("RunForeground did not return after Detach")
	}
	if !res.Detached || res.State != bgjob.Running {
		t.Fatalf("got %v %q detached %v; want running, detached", res.State, res.Reason, res.Detached)
	}
	if pids := liveInSession(res.PID); len(pids) == 0 {
		t.Fatal("job's processes gone after Detach; want them running")
	}
	r2 := newRegistry(t, cfg)
	f := wait(t, r2, res.ID)
	if f.State != bgjob.Exited || f.ExitCode != 4 || f.Output.Text != "fg\ndone\n" {
		t.Errorf("adopted job: got %v %d %q; want exited 4 %q", f.State, f.ExitCode, f.Output.Text, "fg\ndone\n")
	}
	r1.Close(ctxT(t))
}

func TestDurableCancelAdopted(t *testing.T) {
	cfg := durable(t)
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "echo go; sleep 60 & sleep 60"})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r1, s.ID, "go", 1)
	r1.Detach()
	r2 := newRegistry(t, cfg)
	c, err := r2.Cancel(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if c.State != bgjob.Cancelled || c.Output.Text != "go\n" {
		t.Errorf("got %v %q; want cancelled %q", c.State, c.Output.Text, "go\n")
	}
	assertGone(t, c)
}

func TestDurableQuarantine(t *testing.T) {
	cfg := durable(t)
	bad := filepath.Join(cfg.StateDir, "sessions", "0123", "job_0000000000000000.1")
	if err := os.MkdirAll(bad, 0o700); err != nil {
		t.Fatal(err)
	}
	os.WriteFile(filepath.Join(bad, "record.json"), []byte("{not json"), 0o600)
	var logs bytes.Buffer
	var mu sync.Mutex
	cfg.Logger = slog.New(slog.NewTextHandler(writerFunc(func(p []byte) (int, error) {
		mu.Lock()
		defer mu.Unlock()
		return logs.Write(p)
	}), nil))
	r := newRegistry(t, cfg)
	if _, err := os.Stat(bad); !os.IsNotExist(err) {
		t.Errorf("corrupt run folder still in place: %v", err)
	}
	if _, err := os.Stat(filepath.Join(cfg.StateDir, "quarantine", "0123-job_0000000000000000.1", "record.json")); err != nil {
		t.Errorf("corrupt record not quarantined: %v", err)
	}
	mu.Lock()
	if !strings.Contains(logs.String(), "quarantined") {
		t.Errorf("log %q; want it to report the quarantine", logs.String())
	}
	mu.Unlock()
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo ok"})
	if err != nil {
		t.Fatal(err)
	}
	if f := wait(t, r, s.ID); f.Output.Text != "ok\n" {
		t.Errorf("got %q; want %q", f.Output.Text, "ok\n")
	}
}

type writerFunc func([]byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

func TestDurableStartTimeMismatch(t *testing.T) {
	cfg := durable(t)
	// A job's cgroup holds only its processes, whatever their PIDs: a
	// reused PID is a process outside it. So the PID test applies to a
	// job contained by its session.
	cfg.Cgroup = "off"
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "sleep 60"})
	if err != nil {
		t.Fatal(err)
	}
	r1.Detach()
	defer syscall.Kill(-s.PID, syscall.SIGKILL)
	// The PID now seems to belong to another process: its start time
	// differs from the record's.
	run := runFolders(t, cfg.StateDir)[0]
	b, _ := os.ReadFile(filepath.Join(run, "record.json"))
	var m map[string]any
	json.Unmarshal(b, &m)
	m["start_time"] = m["start_time"].(float64) + 1
	delete(m, "marker") // another process: it would not carry the job's marker
	b, _ = json.Marshal(m)
	os.WriteFile(filepath.Join(run, "record.json"), b, 0o600)

	r2 := newRegistry(t, cfg)
	if n := r2.Running(); n != 0 {
		t.Errorf("Running = %d; want 0 (not adopted)", n)
	}
	f, err := r2.Status(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if f.State != bgjob.Failed || f.Reason != "lost" {
		t.Errorf("got %v %q; want failed %q", f.State, f.Reason, "lost")
	}
	if pids := liveInSession(s.PID); len(pids) == 0 {
		t.Errorf("the process that was not adopted was stopped; want it left alone")
	}
}

func TestDurableOutputOnDiskBounded(t *testing.T) {
	cfg := durable(t)
	cfg.HeadBytes, cfg.TailBytes = 4096, 4096
	cfg.MaxOutputBytes = 1<<20 + 8192
	r := newRegistry(t, cfg)
	const n = 16 << 20
	s, err := r.Start(ctxT(t), helperSpec("pattern", strconv.Itoa(n)))
	if err != nil {
		t.Fatal(err)
	}
	f := wait(t, r, s.ID)
	if f.State != bgjob.Exited || f.Output.Total != n {
		t.Fatalf("got %v total %d; want exited total %d", f.State, f.Output.Total, n)
	}
	c, err := r.Read(s.ID, n-100, 100)
	if err != nil {
		t.Fatal(err)
	}
	for i := range len(c.Data) {
		if c.Data[i] != patternByte(c.Offset+int64(i)) {
			t.Fatalf("tail byte at %d = %q; want %q", c.Offset+int64(i), c.Data[i], patternByte(c.Offset+int64(i)))
		}
	}
	var st unix.Stat_t
	out := filepath.Join(runFolders(t, cfg.StateDir)[0], "output")
	if err := unix.Stat(out, &st); err != nil {
		t.Fatal(err)
	}
	if st.Size != n {
		t.Errorf("output file size %d; want %d (holes keep offsets)", st.Size, n)
	}
	// Bounded while the host reads: a few MiB at most, whatever the
	// writer's lead over the reader.
	if used := st.Blocks * 512; used > 8<<20 {
		t.Errorf("output file uses %d bytes on disk; want it bounded near %d", used, cfg.MaxOutputBytes)
	}
	// Replay rebuilds the same text from the file with its holes.
	r.Close(ctxT(t))
	r2 := newRegistry(t, cfg)
	f2, err := r2.Status(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if f2.Output != f.Output {
		t.Errorf("replayed output differs: total %d omitted %d; want %d %d", f2.Output.Total, f2.Output.Omitted, f.Output.Total, f.Output.Omitted)
	}
}

// Crash tests: the test binary plays the host in a child process, which
// is killed with SIGKILL while its jobs run.

const hostEnv = "BGJOB_TEST_HOST_DIR"

// TestDurableHost is the host process of TestDurableCrash; it does
// nothing unless BGJOB_TEST_HOST_DIR is set.
func TestDurableHost(t *testing.T) {
	dir := os.Getenv(hostEnv)
	if dir == "" {
		t.Skip("run as the host of TestDurableCrash")
	}
	r, err := bgjob.New(bgjob.Config{StateDir: dir})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	ids := map[string]bgjob.Snapshot{}
	for name, cmd := range map[string]string{
		"done":     "echo done; exit 7",           // ends before the crash
		"later":    "echo later; sleep 1; exit 5", // ends while the host is down
		"running":  "echo running; sleep 60",      // adopted
		"killed":   "echo killed; sleep 60",       // SIGKILLed while down: lost
		"signaled": "echo sig; sleep 60",          // SIGTERMed while down: 143
		// Writers that open /dev/stderr by name, before and after the
		// crash, and a flood written while no host reads.
		"stderr": "echo one; echo two >/dev/stderr; echo three; sleep 1; echo four >/dev/stderr; echo five; exit 2",
		"tee":    "echo alpha; echo beta | tee /dev/stderr >/dev/null; echo gamma; sleep 1; echo delta | tee /dev/stderr >/dev/null",
		"flood":  "echo start; sleep 1; yes 0123456789abcdef | head -c 3000000; echo; echo end",
	} {
		s, err := r.Start(context.Background(), bgjob.Spec{Command: cmd, Session: "s"})
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		ids[name] = s
	}
	r.Wait(context.Background(), ids["done"].ID)
	for name, s := range ids {
		fmt.Printf("job %s %s %d\n", name, s.ID, s.PID)
	}
	fmt.Println("ready")
	select {} // until SIGKILL
}

// waitExit waits for process pid to exit (a zombie counts) on a pidfd.
func waitExit(t *testing.T, pid int) {
	t.Helper()
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone already
	}
	defer unix.Close(fd)
	pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
	if n, err := unix.Poll(pfd, int(deadline/time.Millisecond)); n != 1 {
		t.Fatalf("process %d did not exit: %v", pid, err)
	}
}

func TestDurableCrash(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "state")
	host := exec.Command(os.Args[0], "-test.run=^TestDurableHost$", "-test.count=1")
	host.Env = append(os.Environ(), hostEnv+"="+dir)
	out, _ := host.StdoutPipe()
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	type started struct {
		id  bgjob.ID
		pid int
	}
	jobs := map[string]started{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "job" {
			pid, _ := strconv.Atoi(f[3])
			jobs[f[1]] = started{bgjob.ID(f[2]), pid}
		}
		if sc.Text() == "ready" {
			break
		}
		if f[0] == "error" {
			t.Fatal(sc.Text())
		}
	}
	if len(jobs) != 8 {
		t.Fatalf("host started %d jobs; want 8", len(jobs))
	}
	host.Process.Kill()
	host.Wait()
	t.Cleanup(func() {
		for _, j := range jobs {
			syscall.Kill(-j.pid, syscall.SIGKILL)
		}
	})

	// While the host is down: one job ends by itself, one is killed
	// outright, one is stopped politely.
	waitExit(t, jobs["later"].pid)
	for _, name := range []string{"stderr", "tee", "flood"} {
		waitExit(t, jobs[name].pid)
	}
	syscall.Kill(-jobs["killed"].pid, syscall.SIGKILL)
	waitExit(t, jobs["killed"].pid)
	syscall.Kill(-jobs["signaled"].pid, syscall.SIGTERM)
	waitExit(t, jobs["signaled"].pid)

	cfg := bgjob.Config{StateDir: dir, KillGrace: 500 * time.Millisecond, HeadBytes: 4 << 20}
	r := newRegistry(t, cfg)
	flood := "start\n" + strings.Repeat("0123456789abcdef\n", 3000000/17) + "0123456789abcdef\n"[:3000000%17] + "\nend\n"
	for _, tc := range []struct {
		name   string
		state  bgjob.State
		code   int
		text   string
		reason string
	}{
		{"done", bgjob.Exited, 7, "done\n", ""},
		{"later", bgjob.Exited, 5, "later\n", ""},
		{"killed", bgjob.Failed, -1, "killed\n", "lost"},
		{"signaled", bgjob.Exited, 143, "sig\n", ""},
		{"stderr", bgjob.Exited, 2, "one\ntwo\nthree\nfour\nfive\n", ""},
		{"tee", bgjob.Exited, 0, "alpha\nbeta\ngamma\ndelta\n", ""},
		{"flood", bgjob.Exited, 0, flood, ""},
		{"running", bgjob.Running, -1, "running\n", ""},
	} {
		var s bgjob.Snapshot
		var err error
		if tc.state == bgjob.Running {
			waitOutput(t, r, jobs[tc.name].id, tc.text, 1)
		}
		s, err = r.Status(jobs[tc.name].id)
		if err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		if s.State != tc.state || s.ExitCode != tc.code || s.Output.Text != tc.text || s.Reason != tc.reason {
			t.Errorf("%s: got %v %d %.200q %q; want %v %d %.200q %q", tc.name, s.State, s.ExitCode, s.Output.Text, s.Reason, tc.state, tc.code, tc.text, tc.reason)
		}
	}
	if n := r.Running(); n != 1 {
		t.Errorf("Running = %d; want 1 (adopted)", n)
	}
	completions := func(r *bgjob.Registry) map[bgjob.ID]int {
		m := map[bgjob.ID]int{}
		for _, c := range r.Completions("s") {
			m[c.ID]++
		}
		return m
	}
	got := completions(r)
	for _, name := range []string{"done", "later", "killed", "signaled", "stderr", "tee", "flood"} {
		if got[jobs[name].id] != 1 {
			t.Errorf("%s: %d completions; want 1", name, got[jobs[name].id])
		}
	}
	if len(got) != 7 {
		t.Errorf("completions %v; want 7", got)
	}
	c, err := r.Cancel(jobs["running"].id)
	if err != nil {
		t.Fatal(err)
	}
	if c.State != bgjob.Cancelled {
		t.Errorf("adopted job after Cancel: %v; want cancelled", c.State)
	}
	assertGone(t, c)
	if got := completions(r); len(got) != 1 || got[jobs["running"].id] != 1 {
		t.Errorf("completions after Cancel %v; want the adopted job's only", got)
	}
	r.Close(ctxT(t))

	// A second restart delivers nothing again and keeps every end.
	r2 := newRegistry(t, cfg)
	if got := completions(r2); len(got) != 0 {
		t.Errorf("completions after a second restart %v; want none", got)
	}
	for name, want := range map[string]bgjob.State{"done": bgjob.Exited, "later": bgjob.Exited, "killed": bgjob.Failed, "running": bgjob.Cancelled} {
		if s, err := r2.Status(jobs[name].id); err != nil || s.State != want {
			t.Errorf("%s after a second restart: %v %v; want %v", name, s.State, err, want)
		}
	}
}

func TestDurableStartingIsSpawnAborted(t *testing.T) {
	cfg := durable(t)
	run := filepath.Join(cfg.StateDir, "sessions", "ab", "job_00000000000000aa.4")
	os.MkdirAll(run, 0o700)
	rec := fmt.Sprintf(`{"version":1,"id":"job_00000000000000aa","gen":4,"session":"","command":"true","dir":"/","state":"starting","exit_code":-1,"started":%q,"pollable":true,"completion_delivered":false}`, time.Now().Format(time.RFC3339Nano))
	os.WriteFile(filepath.Join(run, "record.json"), []byte(rec), 0o600)
	r := newRegistry(t, cfg)
	s, err := r.Status("job_00000000000000aa")
	if err != nil {
		t.Fatal(err)
	}
	if s.State != bgjob.Failed || s.Reason != "spawn aborted" {
		t.Errorf("got %v %q; want failed %q", s.State, s.Reason, "spawn aborted")
	}
	if c := r.Completions(""); len(c) != 1 {
		t.Errorf("completions %d; want 1", len(c))
	}
}

// BenchmarkDurableReplay measures New on a state directory of 10,000
// finished jobs.
func BenchmarkDurableReplay(b *testing.B) {
	const n = 10000
	dir := filepath.Join(b.TempDir(), "state")
	started := time.Now().Add(-time.Minute)
	for i := range n {
		run := filepath.Join(dir, "sessions", fmt.Sprintf("%02x", i%16), fmt.Sprintf("job_%016x.%d", i, i+1))
		if err := os.MkdirAll(run, 0o700); err != nil {
			b.Fatal(err)
		}
		rec := fmt.Sprintf(`{"version":1,"id":"job_%016x","gen":%d,"session":"s%d","command":"echo %d","dir":"/","timeout_ns":60000000000,"state":"exited","exit_code":%d,"pid":%d,"started":%q,"ended":%q,"pollable":true,"completion_delivered":true}`,
			i, i+1, i%16, i, i%3, 1000+i, started.Format(time.RFC3339Nano), started.Add(time.Second).Format(time.RFC3339Nano))
		os.WriteFile(filepath.Join(run, "record.json"), []byte(rec), 0o600)
		os.WriteFile(filepath.Join(run, "output"), []byte(fmt.Sprintf("output of job %d\n", i)), 0o600)
		os.WriteFile(filepath.Join(run, "exit"), []byte(fmt.Sprintf("%d\n", i%3)), 0o600)
	}
	cfg := bgjob.Config{StateDir: dir, Retention: bgjob.Retention{MaxJobs: 1 << 30, MaxBytes: 1 << 40, TTL: time.Hour}}
	b.ResetTimer()
	for range b.N {
		r, err := bgjob.New(cfg)
		if err != nil {
			b.Fatal(err)
		}
		if got := len(r.List("s3")); got != n/16 {
			b.Fatalf("List: %d jobs; want %d", got, n/16)
		}
		r.Close(context.Background())
	}
}
