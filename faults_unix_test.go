//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// Fault injection: each fault ends the job in a defined state with a
// clear reason, and the registry goes on.

func TestFaultSpawnFailures(t *testing.T) {
	notExec := filepath.Join(t.TempDir(), "sh")
	os.WriteFile(notExec, []byte("#!/bin/sh\n"), 0o644)
	for _, tc := range []struct {
		name   string
		shell  []string
		doom   func(dir string) // run by the Guard, after validation
		reason string           // in Snapshot.Reason
	}{
		{name: "missing-shell", shell: []string{"/no/such/shell", "-c"}, reason: "no such file"},
		{name: "shell-not-in-path", shell: []string{"no-such-shell-bgjob", "-c"}, reason: "executable file not found"},
		{name: "shell-not-executable", shell: []string{notExec, "-c"}, reason: "permission denied"},
		{name: "shell-is-a-directory", shell: []string{t.TempDir(), "-c"}, reason: "permission denied"},
		{name: "dir-removed-before-spawn", doom: func(d string) { os.RemoveAll(d) }, reason: "working directory"},
		{name: "dir-replaced-by-file", doom: func(d string) { os.RemoveAll(d); os.WriteFile(d, nil, 0o600) }, reason: "not a directory"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tel := &telemetryRecorder{}
			var completed []bgjob.Completion
			var mu sync.Mutex
			cfg := bgjob.Config{Shell: tc.shell, Telemetry: tel, OnComplete: func(c bgjob.Completion) {
				mu.Lock()
				completed = append(completed, c)
				mu.Unlock()
			}}
			base := t.TempDir()
			if tc.doom != nil {
				cfg.Guard = func(_ context.Context, s bgjob.Spec) error {
					if strings.HasPrefix(filepath.Base(s.Dir), "doomed") {
						tc.doom(s.Dir)
					}
					return nil
				}
			}
			r := newRegistry(t, cfg)
			spec := func(i int) bgjob.Spec {
				s := bgjob.Spec{Command: "echo never"}
				if tc.doom != nil {
					s.Dir = filepath.Join(base, fmt.Sprintf("doomed%d", i))
					os.Mkdir(s.Dir, 0o700)
				}
				return s
			}
			check := func(how string, s bgjob.Snapshot) {
				t.Helper()
				if s.State != bgjob.Failed || s.ExitCode != -1 || s.PID != 0 || s.Output.Total != 0 ||
					!strings.HasPrefix(s.Reason, "spawn: ") || !strings.Contains(s.Reason, tc.reason) || s.Ended.IsZero() {
					t.Errorf("%s: got %v exit %d pid %d total %d reason %q; want failed, -1, no process, a reason with %q",
						how, s.State, s.ExitCode, s.PID, s.Output.Total, s.Reason, tc.reason)
				}
			}
			s, err := r.Start(ctxT(t), spec(0))
			if err != nil {
				t.Fatalf("Start: %v; want a Failed job, not an error", err)
			}
			check("Start", s)
			if st, err := r.Status(s.ID); err != nil {
				t.Errorf("Status of a failed pollable job: %v", err)
			} else {
				check("Status", st)
			}
			res, err := r.RunForeground(ctxT(t), spec(1), bgjob.Foreground{})
			if err != nil || res.Detached {
				t.Fatalf("RunForeground: %v, detached %v; want an inline Failed result", err, res.Detached)
			}
			check("RunForeground", res.Snapshot)
			if _, err := r.Status(res.ID); !errors.Is(err, bgjob.ErrNotFound) && res.ID != s.ID {
				t.Errorf("Status of a failed foreground-only job: %v; want ErrNotFound", err)
			}
			if c := r.Completions(""); len(c) != 1 || c[0].ID != s.ID || c[0].State != bgjob.Failed {
				t.Errorf("completions %+v; want the pollable one, failed", c)
			}
			mu.Lock()
			if len(completed) != 1 {
				t.Errorf("OnComplete called %d times; want 1", len(completed))
			}
			mu.Unlock()
			tel.mu.Lock()
			defer tel.mu.Unlock()
			if len(tel.started) != 0 || len(tel.finished) != 2 {
				t.Fatalf("telemetry: %d started, %d finished; want 0 and 2", len(tel.started), len(tel.finished))
			}
			for _, e := range tel.finished {
				if e.Category != bgjob.CategorySpawn || e.State != bgjob.Failed {
					t.Errorf("event %+v; want category spawn", e)
				}
			}
		})
	}
}

func mustStart(t *testing.T, r *bgjob.Registry, spec bgjob.Spec) bgjob.Snapshot {
	t.Helper()
	s, err := r.Start(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	return s
}

func TestFaultKilledFromOutside(t *testing.T) {
	tel := &telemetryRecorder{}
	r := newRegistry(t, bgjob.Config{Telemetry: tel})
	for _, tc := range []struct {
		name      string
		spec      bgjob.Spec
		ready     bool // wait for "ready" before the kill
		group     bool // kill the whole group, not only the shell
		leftovers bool // the notice counts leftover children
	}{
		{"shell", bgjob.Spec{Command: "sleep 300"}, false, false, false},
		{"shell-with-children", bgjob.Spec{Command: "sleep 300 & sleep 300 & echo ready; wait"}, true, false, true},
		{"whole-group", bgjob.Spec{Command: "sleep 300 & sleep 300 & echo ready; wait"}, true, true, false},
		{"helper", helperSpec("ignoreterm"), true, false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := mustStart(t, r, tc.spec)
			if tc.ready {
				waitOutput(t, r, s.ID, "ready", 1)
			}
			// The job cannot end by itself, so its PID is still its own.
			pid := s.PID
			if tc.group {
				pid = -pid
			}
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatal(err)
			}
			s = wait(t, r, s.ID)
			if s.State != bgjob.Exited || s.ExitCode != 137 || s.Reason != "" {
				t.Errorf("got %v exit %d reason %q; want exited 137", s.State, s.ExitCode, s.Reason)
			}
			if tc.leftovers && !strings.Contains(s.Output.Notice, "leftover") {
				t.Errorf("notice %q; want the leftover children counted", s.Output.Notice)
			}
			assertGone(t, s)
		})
	}
	tel.mu.Lock()
	defer tel.mu.Unlock()
	for _, e := range tel.finished {
		if e.Category != bgjob.CategoryCommand || e.ExitCode != 137 {
			t.Errorf("event %+v; want category command, exit 137", e)
		}
	}
}

// TestFaultReadPastEndWhileWriting reads past the end of a job's stream
// while the job writes: Read must fail with ErrInvalidArgument, and (under
// -race) must not read the stream's length outside the job's lock.
func TestFaultReadPastEndWhileWriting(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s := mustStart(t, r, bgjob.Spec{Command: "yes", Timeout: time.Minute})
	var wg sync.WaitGroup
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 2000 {
				if _, err := r.Read(s.ID, 1<<50, 10); !errors.Is(err, bgjob.ErrInvalidArgument) {
					t.Errorf("Read past the end: %v; want ErrInvalidArgument", err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if s, _ = r.Cancel(s.ID); s.State != bgjob.Cancelled {
		t.Errorf("got %v; want cancelled", s.State)
	}
}

func TestFaultAdmitterErrors(t *testing.T) {
	errPolicy := errors.New("policy service down")
	r := newRegistry(t, bgjob.Config{Admitter: bgjob.AdmitterFunc(func(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
		if strings.Contains(req.Command, "secret") {
			return bgjob.Admitted{}, errPolicy
		}
		return bgjob.Admitted{Text: req.Text}, nil
	})})
	bad := wait(t, r, mustStart(t, r, bgjob.Spec{Command: "echo secret; exit 3"}).ID)
	if bad.State != bgjob.Exited || bad.ExitCode != 3 || !bad.Output.Withheld || bad.Output.Text != "" ||
		bad.Output.Total != 7 || !strings.Contains(bad.Output.Notice, "admitter failed") {
		t.Errorf("got %v exit %d %+v; want exited 3, withheld with a notice", bad.State, bad.ExitCode, bad.Output)
	}
	if c, err := r.Read(bad.ID, 0, 100); err != nil || c.Data != "" {
		t.Errorf("Read of withheld text: %+v, %v; want no data", c, err)
	}
	// The registry goes on.
	good := wait(t, r, mustStart(t, r, bgjob.Spec{Command: "echo fine"}).ID)
	if good.Output.Text != "fine\n" {
		t.Errorf("next job: %q", good.Output.Text)
	}
}

// TestFaultAdmitterBlocksClose: an Admitter that blocks in a job's final
// admission holds Close until it returns; then Close returns, and what
// was admitted before is all still there.
func TestFaultAdmitterBlocksClose(t *testing.T) {
	blocked := make(chan struct{})
	release := make(chan struct{})
	r, err := bgjob.New(bgjob.Config{KillGrace: 200 * time.Millisecond, Admitter: bgjob.AdmitterFunc(func(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
		if strings.Contains(req.Command, "blocker") && !req.Partial {
			close(blocked)
			<-release
		}
		return bgjob.Admitted{Text: strings.ToUpper(req.Text)}, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	var before []bgjob.Snapshot
	for i := range 5 {
		before = append(before, wait(t, r, mustStart(t, r, bgjob.Spec{Command: fmt.Sprintf("echo done%d", i)}).ID))
	}
	x := mustStart(t, r, bgjob.Spec{Command: "echo blocker; sleep 300"})
	waitOutput(t, r, x.ID, "BLOCKER", 1)
	closed := make(chan error, 1)
	go func() { closed <- r.Close(ctxT(t)) }()
	<-blocked // Close stopped x; its final admission is blocked
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while an admission was blocked", err)
	default:
	}
	close(release)
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close: %v", err)
		}
	case <-time.After(deadline):
		t.Fatal("Close did not return after the Admitter unblocked")
	}
	for i, b := range before {
		s, err := r.Status(b.ID)
		if want := fmt.Sprintf("DONE%d\n", i); err != nil || s.Output.Text != want || s.State != bgjob.Exited {
			t.Errorf("job %d after Close: %v %q, %v; want exited %q", i, s.State, s.Output.Text, err, want)
		}
	}
	s, err := r.Status(x.ID)
	if err != nil || s.State != bgjob.Cancelled || s.Output.Text != "BLOCKER\n" || s.Reason != "registry closed" {
		t.Errorf("blocked job after Close: %v %q %q, %v; want cancelled with its admitted text", s.State, s.Output.Text, s.Reason, err)
	}
}

// TestFaultAdmitterHonouringContextDuringClose: an Admitter that blocks
// until its ctx ends must not hang a Close whose own ctx has ended: Close
// should cancel the Admitter's ctx then, so the text is withheld (fail
// closed) and Close returns.
func TestFaultAdmitterHonouringContextDuringClose(t *testing.T) {
	blocked := make(chan struct{})
	release := make(chan struct{}) // the test's own way out, if Close hangs
	r, err := bgjob.New(bgjob.Config{KillGrace: 100 * time.Millisecond, Admitter: bgjob.AdmitterFunc(func(ctx context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
		if strings.Contains(req.Command, "blocker") && !req.Partial {
			close(blocked)
			select {
			case <-ctx.Done():
				return bgjob.Admitted{}, ctx.Err()
			case <-release:
			}
		}
		return bgjob.Admitted{Text: req.Text}, nil
	})})
	if err != nil {
		t.Fatal(err)
	}
	x := mustStart(t, r, bgjob.Spec{Command: "echo blocker; sleep 300"})
	waitOutput(t, r, x.ID, "blocker", 1)
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	closed := make(chan error, 1)
	go func() { closed <- r.Close(ctx) }()
	<-blocked
	select {
	case err := <-closed:
		if !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("Close: %v; want context.DeadlineExceeded", err)
		}
		s, _ := r.Status(x.ID)
		if !s.Output.Withheld || s.State != bgjob.Cancelled {
			t.Errorf("job: %v withheld %v; want cancelled, text withheld", s.State, s.Output.Withheld)
		}
	case <-time.After(10 * time.Second):
		t.Errorf("Close(ctx) still blocked 10s after its ctx ended, behind an Admitter waiting on its ctx")
		close(release)
		<-closed
	}
}

// TestFaultBlockingOnComplete: a blocked OnComplete delays only its own
// job's end, and holds Close until it returns.
func TestFaultBlockingOnComplete(t *testing.T) {
	release := make(chan struct{})
	entered := make(chan bgjob.ID, 1)
	r, err := bgjob.New(bgjob.Config{OnComplete: func(c bgjob.Completion) {
		if c.ExitCode == 7 {
			entered <- c.ID
			<-release
		}
	}})
	if err != nil {
		t.Fatal(err)
	}
	slow := mustStart(t, r, bgjob.Spec{Command: "exit 7"})
	<-entered
	// Other jobs start, end and complete meanwhile.
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("echo %d", i)})
			if err != nil {
				t.Error(err)
				return
			}
			if s, err = r.Wait(ctxT(t), s.ID); err != nil || s.State != bgjob.Exited {
				t.Errorf("job %d: %v, %v", i, s.State, err)
			}
		}()
	}
	wg.Wait()
	// The slow job's completion was queued before its hook ran.
	var got []bgjob.ID
	for _, c := range r.Completions("") {
		got = append(got, c.ID)
	}
	if len(got) != 21 || !containsID(got, slow.ID) {
		t.Errorf("%d completions (slow one included: %v); want 21", len(got), containsID(got, slow.ID))
	}
	closed := make(chan error, 1)
	go func() { closed <- r.Close(ctxT(t)) }()
	select {
	case <-slowDone(r, slow.ID):
		t.Error("Wait on the slow job returned before its OnComplete did")
	default:
	}
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while OnComplete was blocked", err)
	default:
	}
	close(release)
	if err := <-closed; err != nil {
		t.Errorf("Close: %v", err)
	}
	if s, err := r.Status(slow.ID); err != nil || s.ExitCode != 7 {
		t.Errorf("slow job after Close: %v, %v", s.ExitCode, err)
	}
}

func containsID(ids []bgjob.ID, id bgjob.ID) bool {
	for _, x := range ids {
		if x == id {
			return true
		}
	}
	return false
}

// TestFaultCloseUnderLoad closes a registry while 200 pollable jobs run
// (some ignoring SIGTERM, some with children that do) and 50
// RunForeground calls wait: every job ends Cancelled by the close, no
// process is left, and Close takes about the kill grace.
func TestFaultCloseUnderLoad(t *testing.T) {
	const (
		pollable   = 200
		foreground = 50
		grace      = 500 * time.Millisecond
	)
	tel := &telemetryRecorder{}
	r, err := bgjob.New(bgjob.Config{MaxRunning: 300, KillGrace: grace, Telemetry: tel, Retention: bgjob.Retention{MaxJobs: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	shapes := []string{
		"sleep 300",
		"trap '' TERM; echo ready; sleep 300",
		"sleep 300 & sleep 300 & echo ready; wait",
		"(trap '' TERM; sleep 300) & echo ready; wait",
	}
	var snaps []bgjob.Snapshot
	for i := range pollable {
		snaps = append(snaps, mustStart(t, r, bgjob.Spec{Command: fmt.Sprintf("%s # %d", shapes[i%len(shapes)], i)}))
	}
	results := make(chan bgjob.Result, foreground)
	for i := range foreground {
		go func() {
			res, err := r.RunForeground(context.Background(), bgjob.Spec{Command: fmt.Sprintf("sleep 300 # fg %d", i)}, bgjob.Foreground{SoftCap: time.Hour})
			if err != nil {
				t.Errorf("RunForeground %d: %v", i, err)
			}
			results <- res
		}()
	}
	for end := time.Now().Add(deadline); r.Running() < pollable+foreground; {
		if time.Now().After(end) {
			t.Fatalf("%d jobs running; want %d", r.Running(), pollable+foreground)
		}
		time.Sleep(5 * time.Millisecond) // polling the count, with a deadline
	}
	// Let the TERM-ignoring shells set their traps.
	for i, s := range snaps {
		if i%len(shapes) != 0 {
			waitOutput(t, r, s.ID, "ready", 1)
		}
	}
	begin := time.Now()
	if err := r.Close(ctxT(t)); err != nil {
		t.Fatalf("Close: %v", err)
	}
	took := time.Since(begin)
	t.Logf("Close of %d running jobs took %v (grace %v)", pollable+foreground, took, grace)
	if took > grace+20*time.Second {
		t.Errorf("Close took %v; want about the grace, %v", took, grace)
	}
	for range foreground {
		select {
		case res := <-results:
			if res.Detached || res.State != bgjob.Cancelled || res.ExitCode != 130 || res.Reason != "registry closed" {
				t.Errorf("foreground call: %v exit %d %q detached %v; want cancelled by the close", res.State, res.ExitCode, res.Reason, res.Detached)
			}
			assertGone(t, res.Snapshot)
		case <-time.After(deadline):
			t.Fatal("a RunForeground call did not return after Close")
		}
	}
	for _, s := range snaps {
		s, err := r.Status(s.ID)
		if err != nil || s.State != bgjob.Cancelled || s.ExitCode != 130 || s.Reason != "registry closed" {
			t.Errorf("job %s: %v exit %d %q, %v; want cancelled by the close", s.ID, s.State, s.ExitCode, s.Reason, err)
		}
		assertGone(t, s)
	}
	if c := r.Completions(""); len(c) != pollable {
		t.Errorf("%d completions; want %d (foreground-only jobs yield none)", len(c), pollable)
	}
	if started, finished := tel.counts(); started != pollable+foreground || finished != started {
		t.Errorf("telemetry: %d started, %d finished; want %d each", started, finished, pollable+foreground)
	}
}

// TestBadInputMore adds to TestInvalidSpec: huge command lines and
// environments, huge durations, unknown IDs; and no bad input starts a
// process.
func TestBadInputMore(t *testing.T) {
	tel := &telemetryRecorder{}
	bad := newRegistry(t, bgjob.Config{Telemetry: tel})
	good := newRegistry(t, bgjob.Config{})

	t.Run("invalid-specs", func(t *testing.T) {
		for _, tc := range []struct {
			name  string
			spec  bgjob.Spec
			field string
		}{
			{"unicode-space-command", bgjob.Spec{Command: "\u00a0\u2003\u0085"}, "Spec.Command"},
			{"relative-missing-dir", bgjob.Spec{Command: "true", Dir: "no/such/dir"}, "Spec.Dir"},
			{"min-timeout", bgjob.Spec{Command: "true", Timeout: math.MinInt64}, "Spec.Timeout"},
			{"min-idle", bgjob.Spec{Command: "true", IdleTimeout: math.MinInt64}, "Spec.IdleTimeout"},
			{"nul-in-huge-command", bgjob.Spec{Command: strings.Repeat("x", 1<<20) + "\x00"}, "Spec.Command"},
		} {
			_, err := bad.Start(ctxT(t), tc.spec)
			if !errors.Is(err, bgjob.ErrInvalidSpec) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("%s: %v; want ErrInvalidSpec naming %s", tc.name, err, tc.field)
			}
		}
	})

	// One argument of 1 MiB is past Linux's MAX_ARG_STRLEN (128 KiB):
	// the launch is valid, the exec fails, and the job ends Failed with
	// E2BIG in its reason. Elsewhere ARG_MAX may allow it; then it runs.
	t.Run("1MiB-command-line", func(t *testing.T) {
		for _, spec := range []bgjob.Spec{
			{Command: "echo ok #" + strings.Repeat("x", 1<<20)},
			{Command: "echo ok", Env: map[string]string{"HUGE": strings.Repeat("y", 1<<20)}},
		} {
			s := wait(t, bad, mustStart(t, bad, spec).ID)
			switch {
			case s.State == bgjob.Failed && strings.Contains(s.Reason, "argument list too long"):
			case runtime.GOOS != "linux" && s.State == bgjob.Exited && s.Output.Text == "ok\n":
			default:
				t.Errorf("got %v %q reason %q; want failed with E2BIG (or, off Linux, exited \"ok\")", s.State, s.Output.Text, s.Reason)
			}
		}
	})
	t.Run("100KiB-command-line-runs", func(t *testing.T) {
		s := wait(t, good, mustStart(t, good, bgjob.Spec{Command: "echo ok #" + strings.Repeat("x", 100<<10)}).ID)
		if s.State != bgjob.Exited || s.Output.Text != "ok\n" {
			t.Errorf("got %v %q %q; want exited ok", s.State, s.Output.Text, s.Reason)
		}
	})
	t.Run("1MiB-stdin-runs", func(t *testing.T) {
		s := wait(t, good, mustStart(t, good, bgjob.Spec{Command: "wc -c", Stdin: strings.Repeat("z", 1<<20)}).ID)
		if s.State != bgjob.Exited || strings.TrimSpace(s.Output.Text) != "1048576" {
			t.Errorf("got %v %q; want exited 1048576", s.State, s.Output.Text)
		}
	})

	t.Run("huge-durations", func(t *testing.T) {
		const years200 = 200 * 365 * 24 * time.Hour
		huge, err := bgjob.New(bgjob.Config{DefaultTimeout: years200, KillGrace: years200, ProgressInterval: years200})
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			name string
			r    *bgjob.Registry
			spec bgjob.Spec
		}{
			{"timeout-200y", good, bgjob.Spec{Command: "echo ok", Timeout: years200}},
			{"idle-200y", good, bgjob.Spec{Command: "echo ok", IdleTimeout: years200}},
			{"timeout-max", good, bgjob.Spec{Command: "echo ok", Timeout: math.MaxInt64, IdleTimeout: math.MaxInt64}},
			{"default-timeout-200y", huge, bgjob.Spec{Command: "echo ok"}},
		} {
			res, err := tc.r.RunForeground(ctxT(t), tc.spec, bgjob.Foreground{SoftCap: years200})
			if err != nil || res.Detached || res.State != bgjob.Exited || res.Output.Text != "ok\n" {
				t.Errorf("%s: %v %q %q, %v; want exited ok", tc.name, res.State, res.Output.Text, res.Reason, err)
			}
		}
		// A job with a 200-year timeout runs until cancelled, and the
		// cancel is not held up by a 200-year grace when nothing ignores
		// SIGTERM.
		s := mustStart(t, huge, bgjob.Spec{Command: "echo started; sleep 300", Timeout: years200})
		waitOutput(t, huge, s.ID, "started", 1)
		if st, _ := huge.Status(s.ID); st.State != bgjob.Running {
			t.Errorf("job with a 200-year timeout: %v %q; want running", st.State, st.Reason)
		}
		if s, _ = huge.Cancel(s.ID); s.State != bgjob.Cancelled {
			t.Errorf("cancel: %v; want cancelled", s.State)
		}
		if err := huge.Close(ctxT(t)); err != nil {
			t.Error(err)
		}
	})

	t.Run("unknown-ids", func(t *testing.T) {
		fgOnly, err := good.RunForeground(ctxT(t), bgjob.Spec{Command: "echo fg"}, bgjob.Foreground{})
		if err != nil || fgOnly.Detached {
			t.Fatal(err)
		}
		other := mustStart(t, good, bgjob.Spec{Command: "echo other registry"})
		for _, id := range []bgjob.ID{"", "job_0000000000000000", "nonsense", "job_ZZZZZZZZZZZZZZZZ",
			bgjob.ID(strings.Repeat("j", 1<<16)), "job_\x00", fgOnly.ID, other.ID} {
			name := string(id)
			if len(name) > 24 {
				name = name[:24] + "..."
			}
			if _, err := bad.Status(id); !errors.Is(err, bgjob.ErrNotFound) {
				t.Errorf("Status(%q): %v; want ErrNotFound", name, err)
			}
			if _, err := bad.Wait(ctxT(t), id); !errors.Is(err, bgjob.ErrNotFound) {
				t.Errorf("Wait(%q): %v; want ErrNotFound", name, err)
			}
			if _, err := bad.Cancel(id); !errors.Is(err, bgjob.ErrNotFound) {
				t.Errorf("Cancel(%q): %v; want ErrNotFound", name, err)
			}
			if _, err := bad.Read(id, 0, 10); !errors.Is(err, bgjob.ErrNotFound) {
				t.Errorf("Read(%q): %v; want ErrNotFound", name, err)
			}
		}
		// The foreground-only job is gone from its own registry too.
		if _, err := good.Status(fgOnly.ID); !errors.Is(err, bgjob.ErrNotFound) {
			t.Errorf("Status of a foreground-only job: %v; want ErrNotFound", err)
		}
	})

	if started, _ := tel.counts(); started != 0 {
		t.Errorf("bad input started %d processes; want none", started)
	}
}
