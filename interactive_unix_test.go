//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"os"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// awaitOutput waits, on the job's output (ReadWait, no polling), until
// its raw stream holds want, and returns the stream so far.
func awaitOutput(t *testing.T, r *bgjob.Registry, id bgjob.ID, want string) string {
	t.Helper()
	ctx := ctxT(t)
	var got strings.Builder
	var off int64
	for !strings.Contains(got.String(), want) {
		c, err := r.ReadWait(ctx, id, off, 1<<20)
		if err != nil {
			t.Fatalf("waiting for %q in the output of %s: %v; got %q", want, id, err, got.String())
		}
		got.WriteString(c.Data)
		off = c.Next
		if c.Done && !strings.Contains(got.String(), want) {
			s, _ := r.Status(id)
			t.Fatalf("job %s ended (%v, exit %d, %s) without %q in its output: %q", id, s.State, s.ExitCode, s.Reason, want, got.String())
		}
	}
	return got.String()
}

func mustWrite(t *testing.T, r *bgjob.Registry, id bgjob.ID, s string) {
	t.Helper()
	n, err := r.Write(ctxT(t), id, []byte(s))
	if err != nil || n != len(s) {
		t.Fatalf("Write(%q) = %d, %v; want %d, nil", s, n, err, len(s))
	}
}

func TestInteractivePromptAnsweredByWrite(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: `printf 'name? '; read name; echo "hello, $name"`, Interactive: true})
	if err != nil {
		t.Fatal(err)
	}
	awaitOutput(t, r, s.ID, "name? ")
	mustWrite(t, r, s.ID, "bob\n")
	end := wait(t, r, s.ID)
	if end.State != bgjob.Exited || end.ExitCode != 0 || end.Output.Text != "name? hello, bob\n" {
		t.Errorf("got %v, exit %d, text %q; want exited 0, %q", end.State, end.ExitCode, end.Output.Text, "name? hello, bob\n")
	}
}

func TestInteractiveCatEchoesAndEndsAtCloseInput(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "cat", Interactive: true})
	if err != nil {
		t.Fatal(err)
	}
	for i, line := range []string{"one\n", "two\n", "three"} {
		mustWrite(t, r, s.ID, line)
		if i < 2 {
			awaitOutput(t, r, s.ID, line)
		}
	}
	if st, _ := r.Status(s.ID); st.State != bgjob.Running {
		t.Fatalf("cat is %v before CloseInput; want running", st.State)
	}
	if err := r.CloseInput(s.ID); err != nil {
		t.Fatalf("CloseInput: %v", err)
	}
	end := wait(t, r, s.ID)
	if end.State != bgjob.Exited || end.ExitCode != 0 || end.Output.Text != "one\ntwo\nthree" {
		t.Errorf("got %v, exit %d, text %q; want exited 0, %q", end.State, end.ExitCode, end.Output.Text, "one\ntwo\nthree")
	}
	_, err = r.Write(ctxT(t), s.ID, []byte("late"))
	mustErr(t, err, bgjob.ErrInputClosed)
	mustErr(t, r.CloseInput(s.ID), bgjob.ErrInputClosed)
}

func TestInteractiveErrors(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	ctx := ctxT(t)
	plain, err := r.Start(ctx, bgjob.Spec{Command: "sleep 30"})
	if err != nil {
		t.Fatal(err)
	}
	pipe, err := r.Start(ctx, bgjob.Spec{Command: "cat", Interactive: true})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.Write(ctx, plain.ID, []byte("x"))
	mustErr(t, err, bgjob.ErrNotInteractive)
	mustErr(t, r.CloseInput(plain.ID), bgjob.ErrNotInteractive)
	mustErr(t, r.Resize(pipe.ID, 10, 10), bgjob.ErrNotInteractive)
	_, err = r.Screen(pipe.ID)
	mustErr(t, err, bgjob.ErrNotInteractive)
	_, err = r.Write(ctx, "job_0000000000000000", []byte("x"))
	mustErr(t, err, bgjob.ErrNotFound)
	mustErr(t, r.CloseInput("job_0000000000000000"), bgjob.ErrNotFound)
	mustErr(t, r.Resize("job_0000000000000000", 1, 1), bgjob.ErrNotFound)
	_, err = r.Screen("job_0000000000000000")
	mustErr(t, err, bgjob.ErrNotFound)

	// After the job's end, its input is closed, and the error says why.
	if _, err := r.Cancel(pipe.ID); err != nil {
		t.Fatal(err)
	}
	_, err = r.Write(ctx, pipe.ID, []byte("x"))
	mustErr(t, err, bgjob.ErrInputClosed)
	if !strings.Contains(err.Error(), "ended") {
		t.Errorf("Write after the end: %v; want it to say the job ended", err)
	}
	r.Cancel(plain.ID)
}

func TestInteractiveNeverCoalesces(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	spec := bgjob.Spec{Command: "cat", Interactive: true}
	a, err := r.Start(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	b, err := r.Start(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	if a.ID == b.ID || a.Joined || b.Joined || a.PID == b.PID {
		t.Errorf("two interactive launches: %s (pid %d, joined %v) and %s (pid %d, joined %v); want two jobs", a.ID, a.PID, a.Joined, b.ID, b.PID, b.Joined)
	}
	// Each conversation is its own: a line to one reaches only it.
	mustWrite(t, r, a.ID, "to-a\n")
	mustWrite(t, r, b.ID, "to-b\n")
	for _, id := range []bgjob.ID{a.ID, b.ID} {
		if err := r.CloseInput(id); err != nil {
			t.Fatal(err)
		}
	}
	if got := wait(t, r, a.ID).Output.Text; got != "to-a\n" {
		t.Errorf("first job's output %q; want %q", got, "to-a\n")
	}
	if got := wait(t, r, b.ID).Output.Text; got != "to-b\n" {
		t.Errorf("second job's output %q; want %q", got, "to-b\n")
	}
}

// A job that never reads its input: Write returns at its ctx's end with
// what fitted, and CloseInput releases a Write that waits.
func TestInteractiveWriteBoundedByCtx(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo up; exec sleep 100", Interactive: true})
	if err != nil {
		t.Fatal(err)
	}
	awaitOutput(t, r, s.ID, "up")
	big := make([]byte, 4<<20)
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	begin := time.Now()
	n, err := r.Write(ctx, s.ID, big)
	took := time.Since(begin)
	if !errors.Is(err, context.DeadlineExceeded) || n <= 0 || n >= len(big) {
		t.Fatalf("Write to a job that never reads = %d, %v; want part of it and an error wrapping DeadlineExceeded", n, err)
	}
	if took < 150*time.Millisecond || took > 5*time.Second {
		t.Errorf("Write returned after %v; want about its ctx's 200ms", took)
	}
	// A cancelled ctx, and a Write that waits until CloseInput.
	cctx, ccancel := context.WithCancel(context.Background())
	ccancel()
	if _, err := r.Write(cctx, s.ID, big); !errors.Is(err, context.Canceled) {
		t.Errorf("Write with a cancelled ctx: %v; want context.Canceled", err)
	}
	done := make(chan error, 1)
	go func() {
		_, err := r.Write(ctxT(t), s.ID, big)
		done <- err
	}()
	// Another writer waits behind the first, and gives up at its ctx.
	wctx, wcancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer wcancel()
	if _, err := r.Write(wctx, s.ID, []byte("x")); !errors.Is(err, context.DeadlineExceeded) && !errors.Is(err, bgjob.ErrInputClosed) {
		t.Errorf("second writer: %v; want DeadlineExceeded", err)
	}
	if err := r.CloseInput(s.ID); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-done:
		mustErr(t, err, bgjob.ErrInputClosed)
	case <-time.After(deadline):
		t.Fatal("a Write blocked on a full pipe did not return at CloseInput")
	}
	if st, _ := r.Status(s.ID); st.State != bgjob.Running {
		t.Errorf("job is %v after CloseInput; want it still running (it reads nothing)", st.State)
	}
	r.Cancel(s.ID)
}

// Spec.Stdin comes first, however long, then what is written.
func TestInteractiveStdinFirst(t *testing.T) {
	r := newRegistry(t, bgjob.Config{TailBytes: 4 << 20})
	long := strings.Repeat("0123456789abcdef\n", 40000) // 680 KB, more than a pipe holds
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "cat", Stdin: long, Interactive: true})
	if err != nil {
		t.Fatal(err)
	}
	mustWrite(t, r, s.ID, "after\n")
	if err := r.CloseInput(s.ID); err != nil {
		t.Fatal(err)
	}
	end := wait(t, r, s.ID)
	if end.Output.Text != long+"after\n" {
		t.Errorf("output of %d bytes, ends %q; want Stdin then the write (%d bytes)", len(end.Output.Text), end.Output.Text[max(0, len(end.Output.Text)-20):], len(long)+6)
	}
}

// A job that closes its stdin: Write says so.
func TestInteractiveJobClosesItsInput(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "exec 0<&-; echo closed; exec sleep 100", Interactive: true})
	if err != nil {
		t.Fatal(err)
	}
	awaitOutput(t, r, s.ID, "closed")
	_, err = r.Write(ctxT(t), s.ID, []byte("anyone?\n"))
	mustErr(t, err, bgjob.ErrInputClosed)
	if !strings.Contains(err.Error(), "closed its input") {
		t.Errorf("error %v; want it to say the job closed its input", err)
	}
	r.Cancel(s.ID)
}

// Write, CloseInput, Resize and Screen through Session views: a job of
// another session is not found.
func TestInteractiveSessionView(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	mine, other := r.Session("mine"), r.Session("other")
	spec := bgjob.Spec{Command: "cat", Interactive: true}
	if runtime.GOOS == "linux" {
		spec.TTY = &bgjob.TTY{Rows: 10, Cols: 40}
	}
	s, err := mine.Start(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	_, err = other.Write(ctxT(t), s.ID, []byte("x"))
	mustErr(t, err, bgjob.ErrNotFound)
	mustErr(t, other.CloseInput(s.ID), bgjob.ErrNotFound)
	mustErr(t, other.Resize(s.ID, 5, 5), bgjob.ErrNotFound)
	_, err = other.Screen(s.ID)
	mustErr(t, err, bgjob.ErrNotFound)
	if _, err := mine.Write(ctxT(t), s.ID, []byte("mine\n")); err != nil {
		t.Fatal(err)
	}
	awaitOutput(t, r, s.ID, "mine")
	if spec.TTY != nil {
		if err := mine.Resize(s.ID, 12, 50); err != nil {
			t.Fatal(err)
		}
		sc, err := mine.Screen(s.ID)
		if err != nil || len(sc.Rows) != 12 {
			t.Fatalf("Screen = %d rows, %v; want 12 rows", len(sc.Rows), err)
		}
	}
	if err := mine.CloseInput(s.ID); err != nil {
		t.Fatal(err)
	}
	if end, err := mine.Wait(ctxT(t), s.ID); err != nil || end.State != bgjob.Exited {
		t.Errorf("Wait = %v, %v; want exited", end.State, err)
	}
}

// Many goroutines write to one job at once: every write arrives whole,
// none interleaved with another.
func TestInteractiveConcurrentWritesStayWhole(t *testing.T) {
	r := newRegistry(t, bgjob.Config{TailBytes: 8 << 20})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "cat", Interactive: true})
	if err != nil {
		t.Fatal(err)
	}
	const writers, each = 8, 50
	var wg sync.WaitGroup
	for w := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			line := strings.Repeat(string(rune('a'+w)), 9000) + "\n" // more than PIPE_BUF: not atomic in the kernel
			for range each {
				if _, err := r.Write(ctxT(t), s.ID, []byte(line)); err != nil {
					t.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	if err := r.CloseInput(s.ID); err != nil {
		t.Fatal(err)
	}
	text := wait(t, r, s.ID).Output.Text
	lines := strings.Split(strings.TrimSuffix(text, "\n"), "\n")
	if len(lines) != writers*each {
		t.Fatalf("%d lines; want %d", len(lines), writers*each)
	}
	for i, l := range lines {
		if len(l) != 9000 || strings.Count(l, l[:1]) != 9000 {
			t.Fatalf("line %d is not one writer's whole line: %q...", i, l[:min(40, len(l))])
		}
	}
}

// fdCount returns the number of open descriptors of the test process
// (Linux), or -1.
func fdCount() int {
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		return -1
	}
	return len(ents) - 1 // the directory's own
}

// firstDiff returns the offset of the first byte where a and b differ.
func firstDiff(a, b string) int {
	for i := 0; i < len(a) && i < len(b); i++ {
		if a[i] != b[i] {
			return i
		}
	}
	return min(len(a), len(b))
}
