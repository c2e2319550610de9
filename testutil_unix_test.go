//go:build unix

package bgjob_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// helperCmd returns a shell command line that runs the test binary as a
// helper in the given mode.
func helperCmd(args ...string) string {
	q := make([]string, 0, len(args)+1)
	for _, a := range append([]string{os.Args[0]}, args...) {
		q = append(q, "'"+strings.ReplaceAll(a, "'", `'\''`)+"'")
	}
	return strings.Join(q, " ")
}

// helperSpec is a Spec running the test binary as a helper.
func helperSpec(args ...string) bgjob.Spec {
	return bgjob.Spec{Command: helperCmd(args...), Env: helperEnv}
}

// newRegistry returns a Registry closed at the end of the test; a Close
// that fails or leaves a process of one of its jobs fails the test.
func newRegistry(t *testing.T, cfg bgjob.Config) *bgjob.Registry {
	t.Helper()
	if cfg.KillGrace == 0 {
		cfg.KillGrace = 500 * time.Millisecond
	}
	r, err := bgjob.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	t.Cleanup(cancel)
	return ctx
}

// wait waits for the job's end, failing the test at the deadline.
func wait(t *testing.T, r *bgjob.Registry, id bgjob.ID) bgjob.Snapshot {
	t.Helper()
	s, err := r.Wait(ctxT(t), id)
	if err != nil {
		t.Fatalf("Wait(%s): %v", id, err)
	}
	return s
}

// liveInSession returns the processes of session sid that are alive (not
// zombies). Off Linux it returns nil.
func liveInSession(sid int) []int {
	if sid <= 0 {
		return nil
	}
	var pids []int
	for _, p := range procTable() {
		if p.session == sid && p.state != 'Z' {
			pids = append(pids, p.pid)
		}
	}
	return pids
}

// procEntry is a line of the process table.
type procEntry struct {
	pid, ppid, pgrp, session int
	state                    byte
}

// procTable reads every process's state, parent, group and session from
// /proc. Off Linux it returns nil.
func procTable() []procEntry {
	if runtime.GOOS != "linux" {
		return nil
	}
	ents, _ := os.ReadDir("/proc")
	var out []procEntry
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			continue
		}
		f := strings.Fields(string(b[i+2:])) // state ppid pgrp session ...
		if len(f) < 4 {
			continue
		}
		p := procEntry{pid: pid, state: f[0][0]}
		p.ppid, _ = strconv.Atoi(f[1])
		p.pgrp, _ = strconv.Atoi(f[2])
		p.session, _ = strconv.Atoi(f[3])
		out = append(out, p)
	}
	return out
}

// zombieChildren returns the test process's children that are zombies.
func zombieChildren() map[int]bool {
	z := map[int]bool{}
	self := os.Getpid()
	for _, p := range procTable() {
		if p.ppid == self && p.state == 'Z' {
			z[p.pid] = true
		}
	}
	return z
}

// assertGone fails the test if a process of the job's session is alive.
func assertGone(t *testing.T, s bgjob.Snapshot) {
	t.Helper()
	if pids := liveInSession(s.PID); len(pids) > 0 {
		t.Errorf("job %s: processes %v of its session are still alive; want none", s.ID, pids)
	}
}

// telemetryRecorder records Telemetry events.
type telemetryRecorder struct {
	mu       sync.Mutex
	started  []bgjob.Event
	finished []bgjob.Event
	onStart  func(bgjob.Event)
	onFinish func(bgjob.Event)
}

func (tr *telemetryRecorder) JobStarted(e bgjob.Event) {
	tr.mu.Lock()
	tr.started = append(tr.started, e)
	f := tr.onStart
	tr.mu.Unlock()
	if f != nil {
		f(e)
	}
}

func (tr *telemetryRecorder) JobFinished(e bgjob.Event) {
	tr.mu.Lock()
	tr.finished = append(tr.finished, e)
	f := tr.onFinish
	tr.mu.Unlock()
	if f != nil {
		f(e)
	}
}

func (tr *telemetryRecorder) counts() (started, finished int) {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	return len(tr.started), len(tr.finished)
}

func mustErr(t *testing.T, err, want error) {
	t.Helper()
	if !errors.Is(err, want) {
		t.Fatalf("err = %v; want one wrapping %v", err, want)
	}
}

// touch makes an empty file, which a job waiting for it sees.
func touch(t *testing.T, name string) {
	t.Helper()
	if err := os.WriteFile(name, nil, 0o600); err != nil {
		t.Fatal(err)
	}
}

// tokenSeq makes the tokens that mark the processes of each test job.
var tokenSeq atomic.Int64

// newToken returns a token no other process on the machine carries.
func newToken(t *testing.T) string {
	return fmt.Sprintf("tok%d-%d-%s", os.Getpid(), tokenSeq.Add(1), strings.ReplaceAll(t.Name(), "/", "_"))
}

// markedSleeper is a shell command that runs the test binary as a helper
// sleeping 300 s, with token on its command line so that it can be found
// wherever it goes.
func markedSleeper(token string) string { return helperCmd("sleep", "300000", token) }

// marked returns the live (non-zombie) processes that have token as an
// argument, anywhere on the machine.
func marked(token string) []int {
	ents, _ := os.ReadDir("/proc")
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile("/proc/" + e.Name() + "/cmdline")
		if err != nil || !slices.Contains(strings.Split(string(cmd), "\x00"), token) {
			continue
		}
		st, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		if i := bytes.LastIndexByte(st, ')'); i > 0 && i+2 < len(st) && (st[i+2] == 'Z' || st[i+2] == 'X') {
			continue
		}
		pids = append(pids, pid)
	}
	return pids
}

// awaitMarked waits until n processes carry token. If they never do, the
// failure shows what describe returns (the job's snapshot, say).
func awaitMarked(t *testing.T, token string, n int, describe ...func() string) {
	t.Helper()
	for end := time.Now().Add(deadline); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		if len(marked(token)) >= n {
			return
		}
	}
	var more string
	for _, d := range describe {
		more += "; " + d()
	}
	t.Fatalf("%d processes carry %s; want %d%s", len(marked(token)), token, n, more)
}

// assertNoneMarked fails the test if a live process carries token; it
// kills them, so that one failure does not leak into the next test.
func assertNoneMarked(t *testing.T, token string) {
	t.Helper()
	if pids := marked(token); len(pids) > 0 {
		t.Errorf("processes %v of the job still run after its end; want none", pids)
		for _, pid := range pids {
			syscall.Kill(pid, syscall.SIGKILL)
		}
	}
}

// selfUserCPU returns the user CPU time this process has used.
func selfUserCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano())
}
