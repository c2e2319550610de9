package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// Tests of TTY jobs (Spec.TTY), which are Linux only among the Unix
// systems.

func TestTTYIsATerminalOnlyWithTTY(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	const cmd = `if test -t 0 && test -t 1 && test -t 2; then echo tty; else echo notty; fi`
	for _, c := range []struct {
		name string
		spec bgjob.Spec
		want string
	}{
		{"plain", bgjob.Spec{Command: cmd}, "notty\n"},
		{"interactive", bgjob.Spec{Command: cmd, Interactive: true}, "notty\n"},
		{"tty", bgjob.Spec{Command: cmd, TTY: &bgjob.TTY{}}, "tty\n"},
	} {
		t.Run(c.name, func(t *testing.T) {
			res, err := r.RunForeground(ctxT(t), c.spec, bgjob.Foreground{SoftCap: deadline})
			if err != nil {
				t.Fatal(err)
			}
			if res.State != bgjob.Exited || res.Output.Text != c.want {
				t.Errorf("got %v, text %q; want exited, %q", res.State, res.Output.Text, c.want)
			}
		})
	}
}

func TestTTYSizeFollowsResize(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: `stty size; read _; stty size; read _; tty; echo "TERM=$TERM"`, TTY: &bgjob.TTY{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	awaitOutput(t, r, s.ID, "24 80\r\n")
	if err := r.Resize(s.ID, 30, 100); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, r, s.ID, "\n")
	awaitOutput(t, r, s.ID, "30 100\r\n")
	mustErr(t, r.Resize(s.ID, 0, 100), bgjob.ErrInvalidArgument)
	mustWrite(t, r, s.ID, "\n")
	end := wait(t, r, s.ID)
	if !strings.Contains(end.Output.Text, "/dev/pts/") || !strings.Contains(end.Output.Text, "TERM=xterm-256color") {
		t.Errorf("output %q; want the job's tty (/dev/pts/N) and TERM=xterm-256color", end.Output.Text)
	}
	mustErr(t, r.Resize(s.ID, 10, 10), bgjob.ErrInputClosed)
}

// SIGWINCH reaches the job's foreground process group at Resize.
func TestTTYResizeSendsSIGWINCH(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: `trap 'echo "winch $(stty size)"' WINCH; echo ready; while :; do sleep 0.05; done`, TTY: &bgjob.TTY{}})
	if err != nil {
		t.Fatal(err)
	}
	awaitOutput(t, r, s.ID, "ready")
	if err := r.Resize(s.ID, 40, 120); err != nil {
		t.Fatal(err)
	}
	awaitOutput(t, r, s.ID, "winch 40 120")
	r.Cancel(s.ID)
}

// awaitComm waits until a process of session sid runs the program named
// comm.
func awaitComm(t *testing.T, sid int, comm string) {
	t.Helper()
	for end := time.Now().Add(deadline); time.Now().Before(end); time.Sleep(2 * time.Millisecond) {
		for _, p := range procTable() {
			if b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p.pid)); p.session == sid && strings.TrimSpace(string(b)) == comm {
				return
			}
		}
	}
	t.Fatalf("no process of session %d ran %s", sid, comm)
}

// awaitNext waits, on the job's output, until it has more than n bytes.
func awaitNext(t *testing.T, r *bgjob.Registry, id bgjob.ID, n int64) {
	t.Helper()
	for off := n; ; {
		c, err := r.ReadWait(ctxT(t), id, off, 1<<20)
		if err != nil {
			t.Fatalf("waiting for output past byte %d of %s: %v", n, id, err)
		}
		if c.Next > n {
			return
		}
		off = c.Next
	}
}

func TestTTYCtrlCEndsSleepWithStatus130(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 100", TTY: &bgjob.TTY{}})
	if err != nil {
		t.Fatal(err)
	}
	// A person types Ctrl-C at a sleep that runs: until it does, the
	// shell (which catches SIGINT itself as sh -c) may swallow the key.
	awaitComm(t, s.PID, "sleep")
	mustWrite(t, r, s.ID, "\x03")
	end := wait(t, r, s.ID)
	if end.State != bgjob.Exited || end.ExitCode != 130 {
		t.Errorf("after Ctrl-C: %v, exit %d (%s); want exited 130, as a shell reports SIGINT", end.State, end.ExitCode, end.Reason)
	}
	if end.Ended.Sub(end.Started) > 10*time.Second {
		t.Errorf("the job took %v; want it interrupted at once", end.Ended.Sub(end.Started))
	}
}

// An interactive shell survives Ctrl-C, which ends only its foreground
// job, and runs the next line written to it.
func TestTTYCtrlCInteractiveShellSurvives(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "exec sh -i", Env: helperEnv, TTY: &bgjob.TTY{}})
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, r, s.ID, helperCmd("hold")+"\n")
	awaitOutput(t, r, s.ID, "holding\r\n")
	mustWrite(t, r, s.ID, "\x03")
	mustWrite(t, r, s.ID, "echo alive-$((6*7))\n")
	awaitOutput(t, r, s.ID, "alive-42")
	if st, _ := r.Status(s.ID); st.State != bgjob.Running {
		t.Fatalf("sh -i is %v after Ctrl-C; want running", st.State)
	}
	mustWrite(t, r, s.ID, "exit 3\n")
	end := wait(t, r, s.ID)
	if end.State != bgjob.Exited || end.ExitCode != 3 {
		t.Errorf("got %v, exit %d; want exited 3, by the shell's own exit", end.State, end.ExitCode)
	}
}

func TestTTYScreenCursorAddressedWrite(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: `printf '\033[2J\033[5;10Hhello\033[12;3Hworld\033[H\033[20;7Hend'; read _`, TTY: &bgjob.TTY{Rows: 24, Cols: 80}})
	if err != nil {
		t.Fatal(err)
	}
	awaitOutput(t, r, s.ID, "end")
	sc, err := r.Screen(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := make([]string, 24)
	want[4], want[11], want[19] = strings.Repeat(" ", 9)+"hello", "  world", "      end"
	if fmt.Sprint(sc.Rows) != fmt.Sprint(want) || sc.CursorRow != 19 || sc.CursorCol != 9 {
		t.Errorf("screen %q, cursor (%d, %d); want %q, cursor (19, 9)", sc.Rows, sc.CursorRow, sc.CursorCol, want)
	}
	// The next output redraws part of it; the screen follows, also
	// after the job's end.
	mustWrite(t, r, s.ID, "\n")
	wait(t, r, s.ID)
	sc, err = r.Screen(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Rows[4] != want[4] || sc.Rows[11] != want[11] {
		t.Errorf("screen after the end %q; want rows 4 and 11 as before", sc.Rows)
	}
}

func TestTTYScreenFollowsResize(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: `read _; printf '\033[2J\033[H%s' "$(stty size)"; read _`, TTY: &bgjob.TTY{Rows: 10, Cols: 40}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r.Resize(s.ID, 5, 20); err != nil {
		t.Fatal(err)
	}
	mustWrite(t, r, s.ID, "\n")
	awaitOutput(t, r, s.ID, "5 20")
	sc, err := r.Screen(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Rows) != 5 || sc.Rows[0] != "5 20" {
		t.Errorf("screen %q; want 5 rows, the first %q", sc.Rows, "5 20")
	}
	mustWrite(t, r, s.ID, "\n")
	wait(t, r, s.ID)
}

func TestTTYOutputTextIsStrippedReadIsRaw(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: `printf '\033[1;31mred\033[0m plain\n\033]0;title\007progress  10%%\rprogress 100%%\nab\bc\n'; read _`, TTY: &bgjob.TTY{}})
	if err != nil {
		t.Fatal(err)
	}
	const wantText = "red plain\nprogress 100%\nac\n"
	raw := awaitOutput(t, r, s.ID, "\bc\r\n")
	if !strings.Contains(raw, "\x1b[1;31mred\x1b[0m plain\r\n") {
		t.Errorf("raw stream %q; want the escape sequences and \\r\\n", raw)
	}
	st, _ := r.Status(s.ID)
	if st.Output.Text != wantText {
		t.Errorf("running Output.Text %q; want %q", st.Output.Text, wantText)
	}
	mustWrite(t, r, s.ID, "\n")
	end := wait(t, r, s.ID)
	if end.Output.Text != wantText+"\n" {
		t.Errorf("final Output.Text %q; want %q (the typed newline echoed)", end.Output.Text, wantText+"\n")
	}
	c, err := r.Read(s.ID, 0, 1<<20)
	if err != nil || !strings.HasPrefix(c.Data, raw) || !c.Done {
		t.Errorf("Read after the end = %q, done %v, %v; want the raw stream %q", c.Data, c.Done, err, raw)
	}
}

// Cancel, timeouts and containment work for TTY jobs as for others.
func TestTTYCancelTimeoutsContainment(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	plain, err := r.RunForeground(ctxT(t), bgjob.Spec{Command: "true"}, bgjob.Foreground{})
	if err != nil {
		t.Fatal(err)
	}
	t.Run("cancel", func(t *testing.T) {
		token := newToken(t)
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: markedSleeper(token) + " & " + markedSleeper(token) + "; wait", Env: helperEnv, TTY: &bgjob.TTY{}})
		if err != nil {
			t.Fatal(err)
		}
		awaitMarked(t, token, 2)
		end, err := r.Cancel(s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if end.State != bgjob.Cancelled || end.ExitCode != 130 || end.Containment != plain.Containment {
			t.Errorf("got %v, exit %d, containment %v; want cancelled 130 in %v", end.State, end.ExitCode, end.Containment, plain.Containment)
		}
		assertNoneMarked(t, token)
		assertGone(t, end)
	})
	t.Run("escaper", func(t *testing.T) {
		token := newToken(t)
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: "setsid " + markedSleeper(token) + " & read _", Env: helperEnv, TTY: &bgjob.TTY{}})
		if err != nil {
			t.Fatal(err)
		}
		awaitMarked(t, token, 1)
		mustWrite(t, r, s.ID, "\n")
		end := wait(t, r, s.ID)
		if end.State != bgjob.Exited || !strings.Contains(end.Output.Notice, "leftover") {
			t.Errorf("got %v, notice %q; want exited with its leftover stopped", end.State, end.Output.Notice)
		}
		assertNoneMarked(t, token)
	})
	t.Run("timeout", func(t *testing.T) {
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 100", Timeout: 300 * time.Millisecond, TTY: &bgjob.TTY{}})
		if err != nil {
			t.Fatal(err)
		}
		if end := wait(t, r, s.ID); end.State != bgjob.TimedOut || end.ExitCode != 124 || !strings.Contains(end.Reason, "timed out") {
			t.Errorf("got %v, exit %d, %q; want timed out 124", end.State, end.ExitCode, end.Reason)
		}
	})
	t.Run("idle", func(t *testing.T) {
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 100", IdleTimeout: 300 * time.Millisecond, TTY: &bgjob.TTY{}})
		if err != nil {
			t.Fatal(err)
		}
		if end := wait(t, r, s.ID); end.State != bgjob.TimedOut || !strings.Contains(end.Reason, "idle") {
			t.Errorf("got %v, %q; want timed out, idle", end.State, end.Reason)
		}
	})
}

// 1 MiB written through a terminal comes back through cat, byte for
// byte: lines shorter than the line discipline's 4 KiB, echo off (else
// each line comes back twice), and "\n" out as "\r\n".
func TestTTYRoundTrip1MiB(t *testing.T) {
	r := newRegistry(t, bgjob.Config{TailBytes: 4 << 20})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "stty -echo; echo ready; exec cat", TTY: &bgjob.TTY{}})
	if err != nil {
		t.Fatal(err)
	}
	awaitOutput(t, r, s.ID, "ready\r\n")
	var in, want strings.Builder
	for i := 0; in.Len() < 1<<20; i++ {
		line := fmt.Sprintf("%07d %s", i, strings.Repeat(string(rune('a'+i%26)), 120))
		in.WriteString(line + "\n")
		want.WriteString(line + "\r\n")
	}
	mustWrite(t, r, s.ID, in.String())
	if err := r.CloseInput(s.ID); err != nil {
		t.Fatal(err)
	}
	end := wait(t, r, s.ID)
	if end.State != bgjob.Exited || end.ExitCode != 0 {
		t.Fatalf("got %v, exit %d; want cat to end at the EOF character", end.State, end.ExitCode)
	}
	c, err := r.Read(s.ID, 0, 8<<20)
	if err != nil {
		t.Fatal(err)
	}
	if got := strings.TrimPrefix(c.Data, "ready\r\n"); got != want.String() {
		t.Errorf("%d bytes back; want the %d written (first difference at %d)", len(got), want.Len(), firstDiff(got, want.String()))
	}
	if end.Output.Text != "ready\n"+in.String() {
		t.Errorf("Output.Text of %d bytes; want the %d written, with \\n for \\r\\n", len(end.Output.Text), in.Len()+6)
	}
}

// Screen and Output.Text pass the Admitter.
func TestTTYAdmitterSeesScreenAndText(t *testing.T) {
	var seen []string
	r := newRegistry(t, bgjob.Config{Admitter: bgjob.AdmitterFunc(func(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
		seen = append(seen, req.Text)
		if strings.Contains(req.Text, "withhold-me") {
			return bgjob.Admitted{Withhold: true}, nil
		}
		return bgjob.Admitted{Text: strings.ReplaceAll(req.Text, "hunter2", "[REDACTED]")}, nil
	})})
	// The secret is cut by a colour code: whole once stripped.
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: `printf 'pw: hun\033[1mter2\033[0m\n'; read _; printf 'withhold-me\n'; read _`, TTY: &bgjob.TTY{}})
	if err != nil {
		t.Fatal(err)
	}
	awaitOutput(t, r, s.ID, "[0m")
	sc, err := r.Screen(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Rows[0] != "pw: [REDACTED]" {
		t.Errorf("screen row 0 %q; want the secret redacted", sc.Rows[0])
	}
	if st, _ := r.Status(s.ID); st.Output.Text != "pw: [REDACTED]\n" {
		t.Errorf("Output.Text %q; want the secret redacted", st.Output.Text)
	}
	before, _ := r.Status(s.ID)
	mustWrite(t, r, s.ID, "\n")
	awaitNext(t, r, s.ID, before.Output.Total+int64(len("\r\nwithhold-me\r\n"))-1)
	if sc, err := r.Screen(s.ID); err != nil || !sc.Withheld || sc.Rows != nil {
		t.Errorf("Screen = %+v, %v; want it withheld", sc, err)
	}
	mustWrite(t, r, s.ID, "\n")
	if end := wait(t, r, s.ID); !end.Output.Withheld {
		t.Errorf("final output %q; want it withheld", end.Output.Text)
	}
	for _, text := range seen {
		if strings.Contains(text, "\x1b") && !strings.Contains(text, "\n") {
			t.Errorf("the Admitter saw %q", text)
		}
	}
}

// Many TTY and interactive jobs, their inputs closed every way, leave no
// descriptor open and no goroutine (goleak, in TestMain) behind.
func TestTTYLeavesNoDescriptors(t *testing.T) {
	// The runtime's poller and the shared /dev/null first.
	warm := newRegistry(t, bgjob.Config{})
	if _, err := warm.RunForeground(ctxT(t), bgjob.Spec{Command: "true", TTY: &bgjob.TTY{}}, bgjob.Foreground{}); err != nil {
		t.Fatal(err)
	}
	before := fdCount()
	r, err := bgjob.New(bgjob.Config{KillGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	ids := []bgjob.ID{}
	for i := range 12 {
		spec := bgjob.Spec{Command: "cat", Interactive: true}
		if i%2 == 0 {
			spec.TTY = &bgjob.TTY{}
		}
		s, err := r.Start(ctxT(t), spec)
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
		switch i % 4 {
		case 0, 1:
			r.Write(ctxT(t), s.ID, []byte("x\n"))
			r.CloseInput(s.ID)
		case 2:
			r.Cancel(s.ID)
		}
		if s.State == bgjob.Running && i%2 == 0 {
			r.Screen(s.ID)
		}
	}
	for i, id := range ids {
		if i%4 != 3 {
			r.Wait(ctxT(t), id)
		}
	}
	if err := r.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if after := fdCount(); after != before {
		t.Errorf("%d descriptors open before, %d after; want equal", before, after)
	}
	var err2 error
	_, err2 = r.Write(ctxT(t), ids[len(ids)-1], []byte("x"))
	if !errors.Is(err2, bgjob.ErrInputClosed) {
		t.Errorf("Write after Close: %v; want ErrInputClosed", err2)
	}
}
