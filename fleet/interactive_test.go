package fleet

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// readUntil reads the job's output through j with ReadWait until it
// holds want, and returns the offset after it.
func readUntil(t *testing.T, ctx context.Context, j bgjob.Jobs, id bgjob.ID, want string) int64 {
	t.Helper()
	var got strings.Builder
	var next int64
	for !strings.Contains(got.String(), want) {
		ch, err := j.ReadWait(ctx, id, next, 4096)
		if err != nil {
			t.Fatalf("readwait for %q: %v (so far %q)", want, err, got.String())
		}
		got.WriteString(ch.Data)
		next = ch.Next
		if ch.Done && !strings.Contains(got.String(), want) {
			t.Fatalf("the job ended without %q: %q", want, got.String())
		}
	}
	return next
}

// TestInteractiveAcrossNodes: a client on one node writes to an
// interactive job running on a worker attached to another, reads the
// answer, and closes the input; the errors of the Registry come back for
// a job that is not interactive, and for one that ended.
func TestInteractiveAcrossNodes(t *testing.T) {
	l := testLayout(t, "inter")
	newWorker(t, testCluster.urls[2], l, 4, bgjob.Config{KillGrace: 200 * time.Millisecond})
	c := newClient(t, testCluster.urls[0], ClientConfig{Layout: l})
	ctx := deadline(t, time.Minute)

	spec := bgjob.Spec{Command: "cat", Interactive: true, Session: "i"}
	s, err := c.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	s2, err := c.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if s2.ID == s.ID || s2.Joined {
		t.Errorf("a second interactive launch: %s (joined %v); want a job of its own, not %s", s2.ID, s2.Joined, s.ID)
	}
	if _, err := c.Cancel(s2.ID); err != nil {
		t.Fatal(err)
	}
	big := strings.Repeat("x", writeMax+100) + "\n" // two write requests
	if n, err := c.Write(ctx, s.ID, []byte("hello\n")); n != 6 || err != nil {
		t.Fatalf("write: %d, %v; want 6, nil", n, err)
	}
	next := readUntil(t, ctx, c, s.ID, "hello\n")
	if n, err := c.Write(ctx, s.ID, []byte(big)); n != len(big) || err != nil {
		t.Fatalf("write of %d bytes: %d, %v", len(big), n, err)
	}
	readUntil(t, ctx, c, s.ID, "x\n")
	if err := c.CloseInput(s.ID); err != nil {
		t.Fatalf("close input: %v", err)
	}
	f, err := c.Wait(ctx, s.ID)
	if err != nil || f.State != bgjob.Exited || f.ExitCode != 0 || f.Output.Total != int64(6+len(big)) {
		t.Fatalf("wait: %v %d total %d, %v; want exited 0 after %d bytes", f.State, f.ExitCode, f.Output.Total, err, 6+len(big))
	}
	if ch, err := c.Read(s.ID, next, 10); err != nil || ch.Data != "xxxxxxxxxx" {
		t.Fatalf("read of the ended job at %d: %+v, %v", next, ch, err)
	}
	// Errors, from the worker while a job runs and from the record after.
	if _, err := c.Write(ctx, s.ID, []byte("late")); !errors.Is(err, bgjob.ErrInputClosed) {
		t.Errorf("write after the end: %v; want ErrInputClosed", err)
	}
	if err := c.CloseInput(s.ID); !errors.Is(err, bgjob.ErrInputClosed) {
		t.Errorf("close input after the end: %v; want ErrInputClosed", err)
	}
	gate := t.TempDir() + "/gate"
	plain, err := c.Start(ctx, bgjob.Spec{Command: "while [ ! -e " + gate + " ]; do sleep 0.05; done", Session: "i"})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(ctx, plain.ID, []byte("x")); !errors.Is(err, bgjob.ErrNotInteractive) {
		t.Errorf("write to a running plain job: %v; want ErrNotInteractive", err)
	}
	if _, err := c.Screen(plain.ID); !errors.Is(err, bgjob.ErrNotInteractive) {
		t.Errorf("screen of a running plain job: %v; want ErrNotInteractive", err)
	}
	if _, err := c.Cancel(plain.ID); err != nil {
		t.Fatal(err)
	}
	if err := c.CloseInput(plain.ID); !errors.Is(err, bgjob.ErrNotInteractive) {
		t.Errorf("close input of an ended plain job: %v; want ErrNotInteractive", err)
	}
	if err := c.Resize(plain.ID, 0, 80); !errors.Is(err, bgjob.ErrInvalidArgument) {
		t.Errorf("resize to 0 rows: %v; want ErrInvalidArgument", err)
	}
	if _, err := c.Write(ctx, "job_0000000000000000", []byte("x")); !errors.Is(err, bgjob.ErrNotFound) {
		t.Errorf("write to an unknown ID: %v; want ErrNotFound", err)
	}
}

// TestTerminalAcrossNodes: a TTY job on a worker attached to one node,
// typed into, resized and rendered through a client attached to another.
func TestTerminalAcrossNodes(t *testing.T) {
	l := testLayout(t, "tty")
	newWorker(t, testCluster.urls[1], l, 4, bgjob.Config{KillGrace: 200 * time.Millisecond})
	c := newClient(t, testCluster.urls[2], ClientConfig{Layout: l})
	ctx := deadline(t, time.Minute)
	s, err := c.Start(ctx, bgjob.Spec{Command: "cat", TTY: &bgjob.TTY{Rows: 5, Cols: 30}, Session: "t"})
	if errors.Is(err, bgjob.ErrUnsupported) {
		t.Skipf("no terminals on this system: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write(ctx, s.ID, []byte("typed\r")); err != nil {
		t.Fatal(err)
	}
	readUntil(t, ctx, c, s.ID, "typed\r\ntyped\r\n") // the echo, then cat's copy
	sc, err := c.Screen(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Rows) != 5 || strings.TrimRight(sc.Rows[0], " ") != "typed" || strings.TrimRight(sc.Rows[1], " ") != "typed" || sc.CursorRow != 2 {
		t.Fatalf("screen: %q, cursor row %d; want typed twice on 5 rows, the cursor below", sc.Rows, sc.CursorRow)
	}
	if err := c.Resize(s.ID, 8, 40); err != nil {
		t.Fatalf("resize: %v", err)
	}
	if _, err := c.Cancel(s.ID); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Screen(s.ID); !errors.Is(err, bgjob.ErrUnsupported) {
		t.Errorf("screen of an ended TTY job: %v; want ErrUnsupported", err)
	}
	if err := c.Resize(s.ID, 8, 40); !errors.Is(err, bgjob.ErrInputClosed) {
		t.Errorf("resize of an ended TTY job: %v; want ErrInputClosed", err)
	}
}

// TestClientJobsMethods: the methods of Jobs that have no job-level
// request: Session views, Running, Readmit, Detach; and a launch that
// differs only in Priority joins.
func TestClientJobsMethods(t *testing.T) {
	l := testLayout(t, "misc")
	_, reg := newWorker(t, testCluster.urls[0], l, 4, bgjob.Config{})
	c := newClient(t, testCluster.urls[1], ClientConfig{Layout: l})
	ctx := deadline(t, time.Minute)
	gate := t.TempDir() + "/gate"
	spec := bgjob.Spec{Command: "echo mine; while [ ! -e " + gate + " ]; do sleep 0.05; done", Session: "s"}
	s, err := c.Session("s").Start(ctx, bgjob.Spec{Command: spec.Command})
	if err != nil || s.Session != "s" {
		t.Fatalf("start through a session view: %+v, %v", s, err)
	}
	spec.Priority = 9
	if j, err := c.Start(ctx, spec); err != nil || j.ID != s.ID || !j.Joined {
		t.Errorf("a launch of another Priority: %s joined %v, %v; want it to join %s", j.ID, j.Joined, err, s.ID)
	}
	if n := c.Running(); n != 1 || c.Err() != nil {
		t.Errorf("Running: %d (err %v); want 1", n, c.Err())
	}
	if _, err := c.Session("other").Status(s.ID); !errors.Is(err, bgjob.ErrNotFound) {
		t.Errorf("another session's view: %v; want ErrNotFound", err)
	}
	if _, err := c.Session("other").Read(s.ID, 0, 10); !errors.Is(err, bgjob.ErrNotFound) {
		t.Errorf("another session's read: %v; want ErrNotFound", err)
	}
	if ch, err := c.Session("s").ReadWait(ctx, s.ID, 0, 10); err != nil || ch.Data != "mine\n" {
		t.Errorf("the session's own read: %+v, %v", ch, err)
	}
	if err := c.Readmit(ctx); !errors.Is(err, bgjob.ErrUnsupported) {
		t.Errorf("readmit: %v; want ErrUnsupported", err)
	}
	other := newClient(t, testCluster.urls[2], ClientConfig{Layout: l})
	if err := other.Detach(); err != nil {
		t.Fatalf("detach: %v", err)
	}
	if _, err := other.Start(ctx, spec); !errors.Is(err, bgjob.ErrClosed) {
		t.Errorf("start after detach: %v; want ErrClosed", err)
	}
	if st, err := c.Status(s.ID); err != nil || st.State != bgjob.Running {
		t.Errorf("the job after another client's detach: %+v, %v; want it running", st, err)
	}
	if n := reg.Running(); n != 1 {
		t.Errorf("the worker's Registry runs %d jobs; want 1", n)
	}
	if _, err := c.Cancel(s.ID); err != nil {
		t.Fatal(err)
	}
	if n := c.Running(); n != 0 {
		t.Errorf("Running after the cancel: %d; want 0", n)
	}
}

// TestWatchAcrossNodes: WaitFor of a running job at its worker on
// another node (a line printed before the call included), of an ended
// job in its published output, a job that ends without a match; Watch
// at the worker; the watches' matches, through the fleet.
func TestWatchAcrossNodes(t *testing.T) {
	l := testLayout(t, "watch")
	newWorker(t, testCluster.urls[1], l, 4, bgjob.Config{})
	c := newClient(t, testCluster.urls[0], ClientConfig{Layout: l})
	ctx := deadline(t, time.Minute)
	gate := t.TempDir() + "/gate"
	s, err := c.Start(ctx, bgjob.Spec{Command: "echo one; echo ready at 42; while [ ! -e " + gate + " ]; do sleep 0.05; done; echo after", Session: "w",
		Watches: []bgjob.Watch{{Name: "launched", Pattern: regexp.MustCompile("one")}}})
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, ctx, c, s.ID, "ready at 42\n") // printed before WaitFor asks
	m, err := c.WaitFor(ctx, s.ID, regexp.MustCompile(`ready at (\d+)`), 0)
	if err != nil || m.ID != s.ID || m.Session != "w" || m.Line != "ready at 42" || m.Offset != 4 {
		t.Fatalf("wait for, running: %+v, %v; want \"ready at 42\" at 4", m, err)
	}
	if err := c.Watch(s.ID, bgjob.Watch{Name: "after", Pattern: regexp.MustCompile("after")}); err != nil {
		t.Fatalf("watch: %v", err)
	}
	if err := c.Watch(s.ID, bgjob.Watch{Name: "nil"}); !errors.Is(err, bgjob.ErrInvalidArgument) {
		t.Errorf("watch without a pattern: %v; want ErrInvalidArgument", err)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	m, err = c.WaitFor(ctx, s.ID, regexp.MustCompile("^aft"), 5)
	if err != nil || m.Line != "after" || m.Offset != 16 {
		t.Fatalf("wait for, ended: %+v, %v; want \"after\" at 16", m, err)
	}
	_, err = c.WaitFor(ctx, s.ID, regexp.MustCompile("never"), 0)
	var ended *bgjob.EndedError
	if !errors.As(err, &ended) || ended.Snapshot.State != bgjob.Exited || ended.Snapshot.ID != s.ID {
		t.Fatalf("wait for a line that never came: %v; want an EndedError of the exited job", err)
	}
	q, err := c.Start(ctx, bgjob.Spec{Command: "echo x; exit 3", Session: "w"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = c.WaitFor(ctx, q.ID, regexp.MustCompile("never"), 0)
	if !errors.As(err, &ended) || ended.Snapshot.ExitCode != 3 || !errors.Is(err, bgjob.ErrJobEnded) {
		t.Fatalf("wait for on a job that ends without a match: %v; want an EndedError, exit 3", err)
	}
	if err := c.Watch(q.ID, bgjob.Watch{Pattern: regexp.MustCompile("x")}); !errors.Is(err, bgjob.ErrJobEnded) {
		t.Errorf("watch of an ended job: %v; want ErrJobEnded", err)
	}
	// The watches' matches came through the fleet (TestMatches has more).
	ms := c.Matches("w")
	for len(ms) < 2 && ctx.Err() == nil {
		m, err := c.NextMatch(ctx, "w")
		if err != nil {
			t.Fatal(err)
		}
		ms = append(ms, m)
	}
	if len(ms) != 2 || ms[0].Watch != "launched" || ms[0].Line != "one" || ms[0].ID != s.ID || ms[1].Watch != "after" || ms[1].Offset != 16 {
		t.Errorf("matches: %+v; want launched \"one\" and after at 16, of %s", ms, s.ID)
	}
	if _, err := c.WaitFor(ctx, q.ID, nil, 0); !errors.Is(err, bgjob.ErrInvalidArgument) {
		t.Errorf("wait for with no pattern: %v; want ErrInvalidArgument", err)
	}
}
