package bgjob_test

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// Interactive jobs on Windows: the stdin pipe, and a pseudo console
// (ConPTY) for TTY jobs. Under Wine (CI runs these tests there), a
// pseudo console's output reaches the host only when Wine itself runs
// under a terminal, and ResizePseudoConsole is not implemented: those
// tests skip, saying so, where Wine cannot run them.

func TestWindowsInteractivePrompt(t *testing.T) {
	r := newWinRegistry(t, bgjob.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	s, err := r.Start(ctx, bgjob.Spec{Command: "prompt", Interactive: true})
	if err != nil {
		t.Fatal(err)
	}
	awaitWinOutput(t, r, s.ID, "name? ")
	if n, err := r.Write(ctx, s.ID, []byte("bob\r\n")); err != nil || n != 5 {
		t.Fatalf("Write = %d, %v", n, err)
	}
	end, err := r.Wait(ctx, s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if end.State != bgjob.Exited || end.Output.Text != "name? hello, bob\n" {
		t.Errorf("got %v, %q; want exited, %q", end.State, end.Output.Text, "name? hello, bob\n")
	}
	_, err = r.Write(ctx, s.ID, []byte("x"))
	if !errors.Is(err, bgjob.ErrInputClosed) {
		t.Errorf("Write after the end: %v; want ErrInputClosed", err)
	}
}

func TestWindowsInteractiveCatAndCloseInput(t *testing.T) {
	r := newWinRegistry(t, bgjob.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	s, err := r.Start(ctx, bgjob.Spec{Command: "cat", Stdin: "first\n", Interactive: true})
	if err != nil {
		t.Fatal(err)
	}
	awaitWinOutput(t, r, s.ID, "first\n")
	if _, err := r.Write(ctx, s.ID, []byte("second\n")); err != nil {
		t.Fatal(err)
	}
	awaitWinOutput(t, r, s.ID, "second\n")
	if err := r.CloseInput(s.ID); err != nil {
		t.Fatal(err)
	}
	end, err := r.Wait(ctx, s.ID)
	if err != nil || end.State != bgjob.Exited || end.ExitCode != 0 || end.Output.Text != "first\nsecond\n" {
		t.Errorf("got %v, exit %d, %q, %v; want exited 0, %q", end.State, end.ExitCode, end.Output.Text, err, "first\nsecond\n")
	}
}

// A job that never reads: Write returns at its ctx's end.
func TestWindowsInteractiveWriteBoundedByCtx(t *testing.T) {
	r := newWinRegistry(t, bgjob.Config{})
	s, err := r.Start(context.Background(), bgjob.Spec{Command: "sleep 60000", Interactive: true})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	begin := time.Now()
	n, err := r.Write(ctx, s.ID, make([]byte, 4<<20))
	if !errors.Is(err, context.DeadlineExceeded) || n >= 4<<20 {
		t.Errorf("Write to a job that never reads = %d, %v; want part of it and DeadlineExceeded", n, err)
	}
	if took := time.Since(begin); took > 10*time.Second {
		t.Errorf("Write returned after %v; want about 300ms", took)
	}
	r.Cancel(s.ID)
}

func TestWindowsTTYConPTY(t *testing.T) {
	if underWine() && !hasConsoleWindow() {
		t.Skip("Wine delivers a pseudo console's output only when Wine runs under a terminal (.ci/wine.sh's run with a console runs this test)")
	}
	r := newWinRegistry(t, bgjob.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	s, err := r.Start(ctx, bgjob.Spec{Command: "console", TTY: &bgjob.TTY{Rows: 20, Cols: 70}})
	if err != nil {
		t.Fatal(err)
	}
	awaitWinOutput(t, r, s.ID, "console true 70x20")
	sc, err := r.Screen(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(sc.Rows) != 20 || !strings.Contains(strings.Join(sc.Rows, "\n"), "console true 70x20") {
		t.Errorf("screen %q; want 20 rows showing the console's size", sc.Rows)
	}
	if _, err := r.Write(ctx, s.ID, []byte("typed\r")); err != nil {
		t.Fatal(err)
	}
	awaitWinOutput(t, r, s.ID, "typed")
	t.Run("resize", func(t *testing.T) {
		err := r.Resize(s.ID, 30, 90)
		if err != nil && underWine() && strings.Contains(err.Error(), "implemented") {
			t.Skipf("Wine's ResizePseudoConsole is a stub: %v", err)
		}
		if err != nil {
			t.Fatal(err)
		}
	})
	end, err := r.Cancel(s.ID)
	if err != nil || end.State != bgjob.Cancelled {
		t.Errorf("Cancel = %v, %v; want cancelled", end.State, err)
	}
}
