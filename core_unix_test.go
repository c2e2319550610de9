//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
	"go.uber.org/goleak"
)

func TestExitCodes(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	for _, tc := range []struct {
		name    string
		command string
		want    int
	}{
		{"exit-0", helperCmd("exit", "0"), 0},
		{"exit-3", helperCmd("exit", "3"), 3},
		{"shell-exit-42", "exit 42", 42},
		{"killed-by-sigkill", "kill -KILL $$", 128 + 9},
		{"killed-by-sigterm", "kill -TERM $$", 128 + 15},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := r.Start(ctxT(t), bgjob.Spec{Command: tc.command, Env: helperEnv})
			if err != nil {
				t.Fatal(err)
			}
			// A quick job may have ended before Start took its snapshot;
			// while running, the exit code is -1.
			if s.State == bgjob.Running && s.ExitCode != -1 {
				t.Errorf("at start: running with exit %d; want -1", s.ExitCode)
			}
			s = wait(t, r, s.ID)
			if s.State != bgjob.Exited || s.ExitCode != tc.want {
				t.Errorf("got %v exit %d; want exited exit %d", s.State, s.ExitCode, tc.want)
			}
			if s.Ended.IsZero() || s.Ended.Before(s.Started) {
				t.Errorf("Ended %v, Started %v", s.Ended, s.Started)
			}
		})
	}
}

func TestOutputInterleavedAndBinary(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: `echo a; echo b >&2; echo c; printf 'x\000y\377z'`})
	if err != nil {
		t.Fatal(err)
	}
	s = wait(t, r, s.ID)
	want := "a\nb\nc\nx\x00y\xffz"
	if s.Output.Text != want || s.Output.Total != int64(len(want)) || s.Output.Omitted != 0 {
		t.Errorf("got %q (total %d, omitted %d); want %q", s.Output.Text, s.Output.Total, s.Output.Omitted, want)
	}
	c, err := r.Read(s.ID, 6, 100)
	if err != nil || c.Data != want[6:] || c.Offset != 6 || c.Next != int64(len(want)) || !c.Done {
		t.Errorf("Read(6) = %+v, %v; want %q up to %d, done", c, err, want[6:], len(want))
	}
}

func TestEnvironmentAndStdin(t *testing.T) {
	r := newRegistry(t, bgjob.Config{Env: []string{"PATH=" + os.Getenv("PATH"), "BASE=1", "OVER=base"}})
	s, err := r.Start(ctxT(t), bgjob.Spec{
		Command: `echo "$BASE $OVER $GIT_TERMINAL_PROMPT $PAGER $GIT_PAGER $EXTRA"; cat`,
		Env:     map[string]string{"OVER": "spec", "EXTRA": "x y"},
		Stdin:   "from stdin\n",
	})
	if err != nil {
		t.Fatal(err)
	}
	s = wait(t, r, s.ID)
	if want := "1 spec 0 cat cat x y\nfrom stdin\n"; s.Output.Text != want {
		t.Errorf("got %q; want %q", s.Output.Text, want)
	}
	// Empty Stdin: the job reads EOF at once, never the host's stdin.
	s, err = r.Start(ctxT(t), bgjob.Spec{Command: "cat; echo done"})
	if err != nil {
		t.Fatal(err)
	}
	if s = wait(t, r, s.ID); s.Output.Text != "done\n" {
		t.Errorf("empty stdin: got %q; want %q", s.Output.Text, "done\n")
	}
}

func TestCancelKillsGrandchildren(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	for _, tc := range []struct {
		name, command string
		children      int // "child" lines to wait for before the cancel
	}{
		{"shell-background-sleeps", "sleep 300 & sleep 300 & wait", 0},
		{"helper-children", helperCmd("spawn", "sleep", "300000") + "; " + helperCmd("spawn", "ignoreterm") + "; sleep 300", 2},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := r.Start(ctxT(t), bgjob.Spec{Command: tc.command, Env: helperEnv})
			if err != nil {
				t.Fatal(err)
			}
			if tc.children > 0 {
				waitOutput(t, r, s.ID, "child", tc.children)
			}
			s, err = r.Cancel(s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if s.State != bgjob.Cancelled || s.ExitCode != 130 || s.Reason != "cancelled" {
				t.Errorf("got %v exit %d reason %q; want cancelled 130 \"cancelled\"", s.State, s.ExitCode, s.Reason)
			}
			assertGone(t, s)
			// Cancel is idempotent.
			if s2, err := r.Cancel(s.ID); err != nil || s2.State != bgjob.Cancelled {
				t.Errorf("second Cancel: %v, %v", s2.State, err)
			}
		})
	}
}

// waitOutput waits until the job's output holds n copies of sub.
func waitOutput(t *testing.T, r *bgjob.Registry, id bgjob.ID, sub string, n int) {
	t.Helper()
	for end := time.Now().Add(deadline); time.Now().Before(end); {
		s, err := r.Status(id)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Count(s.Output.Text, sub) >= n {
			return
		}
		if s.State.Done() {
			t.Fatalf("job ended (%v) before printing %d× %q: %q", s.State, n, sub, s.Output.Text)
		}
		time.Sleep(5 * time.Millisecond) // polling the event itself, with a deadline
	}
	t.Fatalf("no %d× %q in the output within %v", n, sub, deadline)
}

func TestSIGTERMIgnoringChildIsKilledAfterGrace(t *testing.T) {
	grace := 300 * time.Millisecond
	r := newRegistry(t, bgjob.Config{KillGrace: grace})
	s, err := r.Start(ctxT(t), helperSpec("ignoreterm"))
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r, s.ID, "ready", 1)
	begin := time.Now()
	s, err = r.Cancel(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(begin); took < grace {
		t.Errorf("Cancel returned after %v; the grace is %v, so SIGKILL came too early", took, grace)
	}
	if s.State != bgjob.Cancelled {
		t.Errorf("got %v; want cancelled", s.State)
	}
	assertGone(t, s)
}

func TestCancelBeforeSpawnPreventsIt(t *testing.T) {
	tel := &telemetryRecorder{}
	r := newRegistry(t, bgjob.Config{Telemetry: tel})
	bgjob.SetHooks(r, func(id bgjob.ID) { bgjob.RequestCancel(r, id) }, nil)
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo should-not-run"})
	if err != nil {
		t.Fatal(err)
	}
	if s.State != bgjob.Cancelled || s.PID != 0 || s.ExitCode != 130 {
		t.Errorf("got %v pid %d exit %d; want cancelled, pid 0, exit 130", s.State, s.PID, s.ExitCode)
	}
	if !strings.Contains(s.Reason, "before start") {
		t.Errorf("reason %q; want it to say before start", s.Reason)
	}
	if started, finished := tel.counts(); started != 0 || finished != 1 {
		t.Errorf("telemetry: %d started, %d finished; want 0, 1", started, finished)
	}
}

func TestGrandchildHoldingStdoutDoesNotHang(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	// The shell exits at once; its child keeps the pipe open for 300s.
	s, err := r.Start(ctxT(t), helperSpec("spawn", "sleep", "300000"))
	if err != nil {
		t.Fatal(err)
	}
	s = wait(t, r, s.ID)
	if s.State != bgjob.Exited || s.ExitCode != 0 {
		t.Errorf("got %v exit %d; want exited 0", s.State, s.ExitCode)
	}
	if !strings.Contains(s.Output.Text, "child ") || !strings.Contains(s.Output.Notice, "leftover") {
		t.Errorf("text %q notice %q; want the child line and a leftover notice", s.Output.Text, s.Output.Notice)
	}
	assertGone(t, s)
}

// A leftover that keeps the pipe full must not hide the shell's exit: the
// job still ends, after the drain's grace, with the leftover stopped.
func TestFloodingLeftoverDoesNotHideTheExit(t *testing.T) {
	r := newRegistry(t, bgjob.Config{KillGrace: 200 * time.Millisecond})
	for _, fg := range []bool{false, true} {
		// "bye" first, so that it is in the head whatever the flood does.
		spec := bgjob.Spec{Command: "echo bye; yes flood &", Unique: true}
		var s bgjob.Snapshot
		if fg {
			res, err := r.RunForeground(ctxT(t), spec, bgjob.Foreground{SoftCap: deadline})
			if err != nil || res.Detached {
				t.Fatalf("foreground: %v detached %v", err, res.Detached)
			}
			s = res.Snapshot
		} else {
			s = wait(t, r, mustStart(t, r, spec).ID)
		}
		if s.State != bgjob.Exited || s.ExitCode != 0 {
			t.Errorf("fg %v: got %v exit %d; want exited 0", fg, s.State, s.ExitCode)
		}
		if !strings.Contains(s.Output.Text, "bye\n") || !strings.Contains(s.Output.Text, "flood\n") || !strings.Contains(s.Output.Notice, "leftover") {
			t.Errorf("fg %v: text %.80q… notice %q; want bye, flood and a leftover notice", fg, s.Output.Text, s.Output.Notice)
		}
		assertGone(t, s)
	}
}

func TestTimeouts(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	for _, tc := range []struct {
		name   string
		spec   bgjob.Spec
		state  bgjob.State
		reason string
		lines  int // lines of output to expect, if not 0
	}{
		{"wall", bgjob.Spec{Command: "sleep 300", Timeout: 300 * time.Millisecond}, bgjob.TimedOut, "timed out after 300ms", 0},
		{"idle-silent", bgjob.Spec{Command: "echo started; sleep 300", IdleTimeout: 300 * time.Millisecond}, bgjob.TimedOut, "idle for 300ms", 0},
		{"idle-chatty-survives", bgjob.Spec{Command: "for i in 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15; do echo line $i; sleep 0.1; done", IdleTimeout: 300 * time.Millisecond}, bgjob.Exited, "", 15},
		{"wall-tree", bgjob.Spec{Command: "sleep 300 & sleep 300 & wait", Timeout: 200 * time.Millisecond}, bgjob.TimedOut, "timed out after 200ms", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := r.Start(ctxT(t), tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			s = wait(t, r, s.ID)
			if s.State != tc.state || s.Reason != tc.reason {
				t.Errorf("got %v %q; want %v %q", s.State, s.Reason, tc.state, tc.reason)
			}
			if tc.state == bgjob.TimedOut && s.ExitCode != 124 {
				t.Errorf("exit %d; want 124", s.ExitCode)
			}
			if tc.lines > 0 && strings.Count(s.Output.Text, "line ") != tc.lines {
				t.Errorf("output %q; want %d lines", s.Output.Text, tc.lines)
			}
			assertGone(t, s)
		})
	}
}

func TestLargeOutputIsBoundedAndReadable(t *testing.T) {
	const (
		total = 50 << 20
		head  = 64 << 10
		tail  = 1 << 20
	)
	r := newRegistry(t, bgjob.Config{HeadBytes: head, TailBytes: tail})
	s, err := r.Start(ctxT(t), helperSpec("pattern", fmt.Sprint(total)))
	if err != nil {
		t.Fatal(err)
	}
	s = wait(t, r, s.ID)
	o := s.Output
	if s.State != bgjob.Exited || o.Total != total {
		t.Fatalf("got %v total %d; want exited, %d", s.State, o.Total, total)
	}
	if len(o.Text) > head+tail+100 || o.Omitted < total-head-tail || o.Notice == "" {
		t.Errorf("text %d bytes, omitted %d, notice %q; want at most about %d bytes kept", len(o.Text), o.Omitted, o.Notice, head+tail)
	}
	if !strings.Contains(o.Text, fmt.Sprintf("[... %d bytes omitted ...]", o.Omitted)) {
		t.Errorf("no omission line for %d bytes in the text", o.Omitted)
	}
	// Walk the stream by offset: every byte served is the right one, and
	// served + skipped covers the whole stream.
	var served, skipped int64
	for off := int64(0); ; {
		c, err := r.Read(s.ID, off, 100_000)
		if err != nil {
			t.Fatal(err)
		}
		if c.Offset != off+c.Skipped {
			t.Fatalf("Read(%d): offset %d, skipped %d", off, c.Offset, c.Skipped)
		}
		for i := 0; i < len(c.Data); i++ {
			if c.Data[i] != patternByte(c.Offset+int64(i)) {
				t.Fatalf("byte at %d = %q; want %q", c.Offset+int64(i), c.Data[i], patternByte(c.Offset+int64(i)))
			}
		}
		served += int64(len(c.Data))
		skipped += c.Skipped
		off = c.Next
		if c.Done {
			break
		}
	}
	if served+skipped != total || skipped != o.Omitted {
		t.Errorf("served %d + skipped %d; want %d with %d skipped", served, skipped, total, o.Omitted)
	}
	// Reads never consume: the same offset again gives the same bytes.
	a, _ := r.Read(s.ID, 10, 50)
	b, _ := r.Read(s.ID, 10, 50)
	if a != b || len(a.Data) != 50 {
		t.Errorf("two reads at 10: %+v and %+v", a, b)
	}
}

func TestReadWhileRunning(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo one; echo two; sleep 300"})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r, s.ID, "two", 1)
	c, err := r.Read(s.ID, 0, 4)
	if err != nil || c.Data != "one\n" || c.Next != 4 || c.Done {
		t.Fatalf("Read(0,4) = %+v, %v", c, err)
	}
	c, err = r.Read(s.ID, c.Next, 100)
	if err != nil || c.Data != "two\n" || c.Next != 8 || c.Done {
		t.Fatalf("Read(4) = %+v, %v", c, err)
	}
	for _, tc := range []struct {
		off int64
		max int
	}{{-1, 10}, {0, 0}, {0, -5}, {9, 10}} {
		if _, err := r.Read(s.ID, tc.off, tc.max); !errors.Is(err, bgjob.ErrInvalidArgument) {
			t.Errorf("Read(%d, %d): %v; want ErrInvalidArgument", tc.off, tc.max, err)
		}
	}
	if _, err := r.Read("job_0000000000000000", 0, 10); !errors.Is(err, bgjob.ErrNotFound) {
		t.Errorf("Read(unknown): %v; want ErrNotFound", err)
	}
	r.Cancel(s.ID)
	c, err = r.Read(s.ID, 8, 100)
	if err != nil || c.Data != "" || !c.Done || c.Next != 8 {
		t.Errorf("Read at end after cancel = %+v, %v; want empty, done", c, err)
	}
}

func TestCoalescing(t *testing.T) {
	t.Run("50-identical-starts-spawn-one", func(t *testing.T) {
		tel := &telemetryRecorder{}
		r := newRegistry(t, bgjob.Config{Telemetry: tel})
		var wg sync.WaitGroup
		snaps := make([]bgjob.Snapshot, 50)
		for i := range snaps {
			wg.Add(1)
			go func() {
				defer wg.Done()
				s, err := r.Start(context.Background(), bgjob.Spec{Command: "sleep 300"})
				if err != nil {
					t.Error(err)
				}
				snaps[i] = s
			}()
		}
		wg.Wait()
		joined := 0
		st, _ := r.Status(snaps[0].ID)
		for _, s := range snaps {
			// A joiner that came during the spawn may not have the PID.
			if s.ID != st.ID || (s.PID != 0 && s.PID != st.PID) {
				t.Fatalf("snapshots name different jobs: %s/%d and %s/%d", s.ID, s.PID, st.ID, st.PID)
			}
			if s.Joined {
				joined++
			}
		}
		if started, _ := tel.counts(); started != 1 || joined != 49 {
			t.Errorf("%d processes started, %d joined; want 1 and 49", started, joined)
		}
		if !strings.HasPrefix(string(snaps[0].ID), "job_") || len(snaps[0].ID) != 20 {
			t.Errorf("ID %q; want job_ and 16 hex digits", snaps[0].ID)
		}
		// Cancel stops it for everyone who joined.
		s, _ := r.Cancel(snaps[7].ID)
		if s.State != bgjob.Cancelled || r.Running() != 0 {
			t.Errorf("after Cancel: %v, %d running", s.State, r.Running())
		}
	})
	t.Run("unique-spawns-two", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{})
		a, _ := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 300", Unique: true})
		b, _ := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 300", Unique: true})
		if a.ID == b.ID || a.PID == b.PID || b.Joined || r.Running() != 2 {
			t.Errorf("unique launches: %s/%d and %s/%d, joined %v, %d running", a.ID, a.PID, b.ID, b.PID, b.Joined, r.Running())
		}
	})
	t.Run("sessions-never-share-an-ID", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{})
		a, _ := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 300", Session: "alice"})
		b, _ := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 300", Session: "bob"})
		if a.ID == b.ID || b.Joined {
			t.Errorf("two sessions share %s", a.ID)
		}
		if l := r.List("alice"); len(l) != 1 || l[0].ID != a.ID {
			t.Errorf("List(alice) = %v; want only %s", l, a.ID)
		}
		if l := r.List("carol"); len(l) != 0 {
			t.Errorf("List(carol) = %v; want none", l)
		}
	})
	t.Run("ID-covers-every-field", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{IDKey: []byte("0123456789abcdef")})
		base := bgjob.Spec{Command: "exit 0", Env: map[string]string{"A": "1", "B": "2"}}
		ids := map[bgjob.ID]string{}
		for name, s := range map[string]bgjob.Spec{
			"base":    base,
			"command": {Command: "exit  0", Env: base.Env},
			"dir":     {Command: base.Command, Env: base.Env, Dir: os.TempDir()},
			"env":     {Command: base.Command, Env: map[string]string{"A": "1", "B": "3"}},
			"stdin":   {Command: base.Command, Env: base.Env, Stdin: "x"},
			"timeout": {Command: base.Command, Env: base.Env, Timeout: time.Hour},
			"idle":    {Command: base.Command, Env: base.Env, IdleTimeout: time.Hour},
			"session": {Command: base.Command, Env: base.Env, Session: "s"},
		} {
			st, err := r.Start(ctxT(t), s)
			if err != nil {
				t.Fatal(err)
			}
			if other, dup := ids[st.ID]; dup {
				t.Errorf("%s and %s share ID %s", name, other, st.ID)
			}
			ids[st.ID] = name
			wait(t, r, st.ID)
		}
	})
	t.Run("finished-job-is-replaced", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{})
		a, _ := r.Start(ctxT(t), bgjob.Spec{Command: "echo $$"})
		a = wait(t, r, a.ID)
		b, _ := r.Start(ctxT(t), bgjob.Spec{Command: "echo $$"})
		b = wait(t, r, b.ID)
		if a.ID != b.ID || b.Joined || a.PID == b.PID || a.Output.Text == b.Output.Text {
			t.Errorf("re-run: %+v then %+v; want the same ID run anew", a, b)
		}
	})
}

func TestInvalidSpec(t *testing.T) {
	tel := &telemetryRecorder{}
	r := newRegistry(t, bgjob.Config{Telemetry: tel})
	file := filepath.Join(t.TempDir(), "file")
	os.WriteFile(file, nil, 0o600)
	for _, tc := range []struct {
		name  string
		spec  bgjob.Spec
		field string
	}{
		{"empty-command", bgjob.Spec{}, "Spec.Command"},
		{"blank-command", bgjob.Spec{Command: " \t\n"}, "Spec.Command"},
		{"nul-command", bgjob.Spec{Command: "echo a\x00b"}, "Spec.Command"},
		{"missing-dir", bgjob.Spec{Command: "true", Dir: "/no/such/dir"}, "Spec.Dir"},
		{"file-dir", bgjob.Spec{Command: "true", Dir: file}, "Spec.Dir"},
		{"nul-dir", bgjob.Spec{Command: "true", Dir: "/tmp\x00"}, "Spec.Dir"},
		{"empty-env-key", bgjob.Spec{Command: "true", Env: map[string]string{"": "x"}}, "Spec.Env"},
		{"env-key-with-equals", bgjob.Spec{Command: "true", Env: map[string]string{"A=B": "x"}}, "Spec.Env"},
		{"env-key-with-nul", bgjob.Spec{Command: "true", Env: map[string]string{"A\x00": "x"}}, "Spec.Env"},
		{"env-value-with-nul", bgjob.Spec{Command: "true", Env: map[string]string{"A": "x\x00"}}, "Spec.Env"},
		{"negative-timeout", bgjob.Spec{Command: "true", Timeout: -time.Second}, "Spec.Timeout"},
		{"negative-idle", bgjob.Spec{Command: "true", IdleTimeout: -1}, "Spec.IdleTimeout"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.Start(ctxT(t), tc.spec)
			if !errors.Is(err, bgjob.ErrInvalidSpec) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("Start: %v; want ErrInvalidSpec naming %s", err, tc.field)
			}
			_, err = r.RunForeground(ctxT(t), tc.spec, bgjob.Foreground{})
			if !errors.Is(err, bgjob.ErrInvalidSpec) {
				t.Errorf("RunForeground: %v; want ErrInvalidSpec", err)
			}
		})
	}
	if started, finished := tel.counts(); started+finished != 0 {
		t.Errorf("a bad spec started %d jobs", started)
	}
}

func TestGuardRejects(t *testing.T) {
	jail := t.TempDir()
	errOutside := errors.New("outside the jail")
	r := newRegistry(t, bgjob.Config{Dir: jail, Guard: func(_ context.Context, s bgjob.Spec) error {
		if !strings.HasPrefix(s.Dir, jail) {
			return errOutside
		}
		return nil
	}})
	_, err := r.Start(ctxT(t), bgjob.Spec{Command: "true", Dir: "/"})
	if !errors.Is(err, bgjob.ErrRejected) || !errors.Is(err, errOutside) {
		t.Errorf("err = %v; want ErrRejected wrapping the Guard's error", err)
	}
	if r.Running() != 0 || len(r.List("")) != 0 {
		t.Errorf("a rejected launch left a job")
	}
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "pwd"})
	if err != nil {
		t.Fatal(err)
	}
	if s = wait(t, r, s.ID); s.Output.Text != jail+"\n" || s.Dir != jail {
		t.Errorf("pwd = %q, Dir %q; want %q", s.Output.Text, s.Dir, jail)
	}
}

func TestMaxRunning(t *testing.T) {
	r := newRegistry(t, bgjob.Config{MaxRunning: 2})
	a, _ := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 300"})
	r.Start(ctxT(t), bgjob.Spec{Command: "sleep 301"})
	_, err := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 302"})
	mustErr(t, err, bgjob.ErrTooManyRunning)
	// Joining a running job does not count.
	if s, err := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 300"}); err != nil || !s.Joined {
		t.Errorf("join at the limit: %v, joined %v", err, s.Joined)
	}
	r.Cancel(a.ID)
	if _, err := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 302"}); err != nil {
		t.Errorf("after a cancel: %v", err)
	}
}

func TestInvalidConfig(t *testing.T) {
	file := filepath.Join(t.TempDir(), "f")
	os.WriteFile(file, nil, 0o600)
	for _, tc := range []struct {
		name  string
		cfg   bgjob.Config
		want  error
		field string
		skip  string // why the case does not apply on this system, if it does not
	}{
		{"empty-shell", bgjob.Config{Shell: []string{}}, bgjob.ErrInvalidConfig, "Shell", ""},
		{"nul-shell", bgjob.Config{Shell: []string{"/bin/sh\x00"}}, bgjob.ErrInvalidConfig, "Shell", ""},
		{"file-dir", bgjob.Config{Dir: file}, bgjob.ErrInvalidConfig, "Dir", ""},
		{"nul-env", bgjob.Config{Env: []string{"A=\x00"}}, bgjob.ErrInvalidConfig, "Env", ""},
		{"negative-timeout", bgjob.Config{DefaultTimeout: -1}, bgjob.ErrInvalidConfig, "DefaultTimeout", ""},
		{"negative-grace", bgjob.Config{KillGrace: -1}, bgjob.ErrInvalidConfig, "KillGrace", ""},
		{"negative-progress", bgjob.Config{ProgressInterval: -1}, bgjob.ErrInvalidConfig, "ProgressInterval", ""},
		{"negative-max-running", bgjob.Config{MaxRunning: -1}, bgjob.ErrInvalidConfig, "MaxRunning", ""},
		{"negative-head", bgjob.Config{HeadBytes: -1}, bgjob.ErrInvalidConfig, "HeadBytes", ""},
		{"negative-tail", bgjob.Config{TailBytes: -1}, bgjob.ErrInvalidConfig, "TailBytes", ""},
		{"relative-state-dir", bgjob.Config{StateDir: "state"}, bgjob.ErrInvalidConfig, "StateDir", ""},
		{"short-id-key", bgjob.Config{IDKey: []byte("short")}, bgjob.ErrInvalidConfig, "IDKey", ""},
		{"durable-mode", bgjob.Config{StateDir: t.TempDir()}, bgjob.ErrUnsupported, "StateDir", onLinux("durable mode works on Linux: see durable_linux_test.go")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.skip != "" {
				t.Skip(tc.skip)
			}
			_, err := bgjob.New(tc.cfg)
			if !errors.Is(err, tc.want) || !strings.Contains(err.Error(), tc.field) {
				t.Errorf("New: %v; want %v naming %s", err, tc.want, tc.field)
			}
		})
	}
}

func TestSpawnFailureIsAFailedJob(t *testing.T) {
	tel := &telemetryRecorder{}
	r := newRegistry(t, bgjob.Config{Shell: []string{"/no/such/shell", "-c"}, Telemetry: tel})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "true"})
	if err != nil {
		t.Fatal(err)
	}
	if s.State != bgjob.Failed || s.ExitCode != -1 || !strings.HasPrefix(s.Reason, "spawn: ") {
		t.Errorf("got %v exit %d reason %q; want failed -1 spawn: ...", s.State, s.ExitCode, s.Reason)
	}
	if c := r.Completions(""); len(c) != 1 || c[0].State != bgjob.Failed {
		t.Errorf("completions %v; want one failed", c)
	}
	tel.mu.Lock()
	defer tel.mu.Unlock()
	if len(tel.started) != 0 || len(tel.finished) != 1 || tel.finished[0].Category != bgjob.CategorySpawn {
		t.Errorf("telemetry started %v finished %v; want no start, one spawn failure", tel.started, tel.finished)
	}
}

func TestCloseStopsEverything(t *testing.T) {
	defer goleak.VerifyNone(t, goleak.IgnoreCurrent())
	r, err := bgjob.New(bgjob.Config{KillGrace: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var snaps []bgjob.Snapshot
	for i := range 5 {
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("sleep 300 & sleep 300 & echo %d; wait", i)})
		if err != nil {
			t.Fatal(err)
		}
		snaps = append(snaps, s)
	}
	ign, _ := r.Start(ctxT(t), helperSpec("ignoreterm"))
	waitOutput(t, r, ign.ID, "ready", 1)
	fg := make(chan bgjob.Result)
	go func() {
		res, _ := r.RunForeground(context.Background(), bgjob.Spec{Command: "sleep 300"}, bgjob.Foreground{SoftCap: time.Hour})
		fg <- res
	}()
	for end := time.Now().Add(deadline); r.Running() < 7; time.Sleep(time.Millisecond) {
		if time.Now().After(end) { // polling the launch's count, with a deadline
			t.Fatalf("%d jobs running; want 7", r.Running())
		}
	}
	if err := r.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if res := <-fg; res.State != bgjob.Cancelled || res.Reason != "registry closed" || res.Detached {
		t.Errorf("foreground call: %v %q detached %v; want cancelled by close", res.State, res.Reason, res.Detached)
	}
	for _, s := range append(snaps, ign) {
		s, err := r.Status(s.ID)
		if err != nil || s.State != bgjob.Cancelled {
			t.Errorf("%s after Close: %v %v", s.ID, s.State, err)
		}
		assertGone(t, s)
	}
	if _, err := r.Start(ctxT(t), bgjob.Spec{Command: "true"}); !errors.Is(err, bgjob.ErrClosed) {
		t.Errorf("Start after Close: %v; want ErrClosed", err)
	}
	if _, err := r.RunForeground(ctxT(t), bgjob.Spec{Command: "true"}, bgjob.Foreground{}); !errors.Is(err, bgjob.ErrClosed) {
		t.Errorf("RunForeground after Close: %v; want ErrClosed", err)
	}
	if err := r.Close(ctxT(t)); err != nil {
		t.Errorf("second Close: %v", err)
	}
}

func TestCloseWithExpiredContextKillsAtOnce(t *testing.T) {
	r, err := bgjob.New(bgjob.Config{KillGrace: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	s, _ := r.Start(ctxT(t), helperSpec("ignoreterm"))
	waitOutput(t, r, s.ID, "ready", 1)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Close(ctx); !errors.Is(err, context.Canceled) {
		t.Errorf("Close: %v; want context.Canceled", err)
	}
	s, _ = r.Status(s.ID)
	if s.State != bgjob.Cancelled {
		t.Errorf("got %v; want cancelled", s.State)
	}
	assertGone(t, s)
}

// onLinux returns why on Linux, and "" elsewhere.
func onLinux(why string) string {
	if runtime.GOOS == "linux" {
		return why
	}
	return ""
}

// fakeClock is a registry clock that moves only when the test moves it.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

// advance moves the clock by d and wakes r's jobs to look at it.
func (c *fakeClock) advance(r *bgjob.Registry, d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
	bgjob.Poke(r)
}

// The timeouts and the kill grace follow the registry's clock: on a
// synthetic one a job ends exactly when the clock reaches its limit,
// whatever the real time.
func TestTimeoutsSyntheticClock(t *testing.T) {
	for _, tc := range []struct {
		name   string
		spec   bgjob.Spec
		steps  []time.Duration // moves of the clock; the job ends at the last
		reason string
	}{
		{"wall", bgjob.Spec{Command: "echo ready; sleep 300", Timeout: 10 * time.Second},
			[]time.Duration{10 * time.Second}, "timed out after 10s"},
		{"idle", bgjob.Spec{Command: "echo ready; sleep 300", IdleTimeout: 5 * time.Second},
			[]time.Duration{5 * time.Second}, "idle for 5s"},
		{"grace-then-kill", func() bgjob.Spec {
			s := helperSpec("noteterm")
			s.Command = "exec " + s.Command
			s.Timeout = time.Second
			return s
		}(),
			[]time.Duration{time.Second, 30 * time.Second}, "timed out after 1s"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			clock := &fakeClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}
			r := newRegistry(t, bgjob.Config{KillGrace: 30 * time.Second})
			bgjob.SetClock(r, clock.Now)
			s, err := r.Start(ctxT(t), tc.spec)
			if err != nil {
				t.Fatal(err)
			}
			waitOutput(t, r, s.ID, "ready", 1)
			var total time.Duration
			for i, d := range tc.steps {
				if i > 0 {
					// The polite signal is out, and the helper lives
					// on: nothing ends it before the clock moves again.
					waitOutput(t, r, s.ID, "term", 1)
				}
				clock.advance(r, d)
				total += d
			}
			s = wait(t, r, s.ID)
			if s.State != bgjob.TimedOut || s.ExitCode != 124 || s.Reason != tc.reason {
				t.Errorf("got %v %d %q; want timed_out 124 %q", s.State, s.ExitCode, s.Reason, tc.reason)
			}
			if got := s.Ended.Sub(s.Started); got != total {
				t.Errorf("ended %v after the start by the registry's clock; want exactly %v", got, total)
			}
			assertGone(t, s)
		})
	}
}
