//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// gated is a command that prints before, waits for the file gate, then
// prints after.
func gated(gate, before, after string) string {
	return fmt.Sprintf("printf %%s '%s'; while [ ! -e %s ]; do sleep 0.01; done; printf %%s '%s'", before, gate, after)
}

// identity is an Admitter that keeps every text as it is, so that Read
// serves whole lines.
var identity = bgjob.AdmitterFunc(func(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
	return bgjob.Admitted{Text: req.Text}, nil
})

func TestReadWait(t *testing.T) {
	for _, tc := range []struct {
		name     string
		admitter bgjob.Admitter
		before   string // printed at once
		after    string // printed once the gate opens, then the job ends
		offset   int64  // ReadWait's
		want     string // its Data once the gate is open
		wantDone bool
	}{
		{"returns-when-output-comes", nil, "", "late\n", 0, "late\n", false},
		{"waits-at-the-end-of-the-stream", nil, "early\n", "late\n", 6, "late\n", false},
		{"returns-at-once-when-output-is-there", nil, "early\n", "late\n", 0, "early\n", false},
		{"waits-for-a-whole-line-with-an-admitter", identity, "part", "ial\n", 0, "partial\n", false},
		{"returns-done-at-the-end", nil, "early\n", "", 6, "", true},
		{"waits-for-the-stream-to-reach-an-offset-ahead", nil, "early\n", "late\n", 8, "te\n", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRegistry(t, bgjob.Config{Admitter: tc.admitter})
			gate := filepath.Join(t.TempDir(), "gate")
			s, err := r.Start(ctxT(t), bgjob.Spec{Command: gated(gate, tc.before, tc.after)})
			if err != nil {
				t.Fatal(err)
			}
			if tc.before != "" {
				waitTotal(t, r, s.ID, int64(len(tc.before)))
			}
			got := make(chan bgjob.Chunk, 1)
			go func() {
				c, err := r.ReadWait(ctxT(t), s.ID, tc.offset, 1<<10)
				if err != nil {
					t.Errorf("ReadWait: %v", err)
				}
				got <- c
			}()
			if tc.want == "early\n" {
				// Served without the gate: the bytes are there.
				if c := <-got; c.Data != tc.want {
					t.Errorf("ReadWait = %+v; want %q", c, tc.want)
				}
				touch(t, gate)
				return
			}
			// Whatever came out before the gate opened would have been
			// returned: an early return shows as the wrong Data below.
			touch(t, gate)
			c := <-got
			// The job ends right after its last output: Done may come
			// with it.
			if c.Data != tc.want || c.Offset != tc.offset || (tc.wantDone && !c.Done) {
				t.Errorf("ReadWait(%d) = %+v; want %q from %d, done %v", tc.offset, c, tc.want, tc.offset, tc.wantDone)
			}
		})
	}

	t.Run("ctx-end-returns-the-empty-chunk", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{})
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 300"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		c, err := r.ReadWait(ctx, s.ID, 0, 10)
		mustErr(t, err, context.DeadlineExceeded)
		if c.Offset != 0 || c.Next != 0 || c.Data != "" || c.Done {
			t.Errorf("chunk %+v; want empty at 0", c)
		}
		r.Cancel(s.ID)
	})
	t.Run("bad-arguments-fail-at-once", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{})
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo x; sleep 300"})
		if err != nil {
			t.Fatal(err)
		}
		waitTotal(t, r, s.ID, 2)
		for _, a := range []struct {
			offset int64
			max    int
			want   error
		}{{-1, 10, bgjob.ErrInvalidArgument}, {0, 0, bgjob.ErrInvalidArgument}} {
			_, err := r.ReadWait(ctxT(t), s.ID, a.offset, a.max)
			mustErr(t, err, a.want)
		}
		_, err = r.ReadWait(ctxT(t), "job_0000000000000000", 0, 10)
		mustErr(t, err, bgjob.ErrNotFound)
		// Past the end of a job that ends before it gets there.
		ahead := make(chan error, 1)
		go func() {
			_, err := r.ReadWait(ctxT(t), s.ID, 3, 10)
			ahead <- err
		}()
		r.Cancel(s.ID)
		mustErr(t, <-ahead, bgjob.ErrInvalidArgument)
		_, err = r.ReadWait(ctxT(t), s.ID, 3, 10)
		mustErr(t, err, bgjob.ErrInvalidArgument)
	})
	t.Run("wakes-every-reader", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{})
		gate := filepath.Join(t.TempDir(), "gate")
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: gated(gate, "", "news\n") + "; sleep 300"})
		if err != nil {
			t.Fatal(err)
		}
		var wg sync.WaitGroup
		for range 8 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				c, err := r.ReadWait(ctxT(t), s.ID, 0, 100)
				if err != nil || c.Data != "news\n" {
					t.Errorf("ReadWait = %+v, %v; want news", c, err)
				}
			}()
		}
		touch(t, gate)
		wg.Wait()
		r.Cancel(s.ID)
	})
}

// waitTotal waits until the job has written n bytes.
func waitTotal(t *testing.T, r *bgjob.Registry, id bgjob.ID, n int64) {
	t.Helper()
	for end := time.Now().Add(deadline); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		s, err := r.Status(id)
		if err != nil {
			t.Fatal(err)
		}
		if s.Output.Total >= n {
			return
		}
		if s.State.Done() {
			t.Fatalf("job ended at %d bytes; want %d", s.Output.Total, n)
		}
	}
	t.Fatalf("job wrote fewer than %d bytes within %v", n, deadline)
}

func TestFollow(t *testing.T) {
	lines := func(n int) string {
		var b strings.Builder
		for i := range n {
			fmt.Fprintf(&b, "line %d\n", i)
		}
		return b.String()
	}
	for _, tc := range []struct {
		name     string
		admitter bgjob.Admitter
		command  string
		offset   int64
		bufSize  int
		want     string
	}{
		{"streams-to-eof", nil, helperCmd("lines", "200", "1"), 0, 32 << 10, lines(200)},
		{"from-an-offset", nil, helperCmd("lines", "20", "1"), 7, 32 << 10, lines(20)[7:]},
		{"tiny-buffer", nil, helperCmd("lines", "20", "1"), 0, 3, lines(20)},
		{"admitted-text-with-a-tiny-buffer", bgjob.Redactor{}, "echo start; echo password=hunter2hunter2; sleep 0.05; echo key AKIAIOSFODNN7EXAMPLE; echo end", 0, 5,
			"start\npassword=[REDACTED:password]\nkey [REDACTED:aws-key]\nend\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newRegistry(t, bgjob.Config{Admitter: tc.admitter})
			s, err := r.Start(ctxT(t), bgjob.Spec{Command: tc.command, Env: helperEnv})
			if err != nil {
				t.Fatal(err)
			}
			var got strings.Builder
			f := r.Follow(ctxT(t), s.ID, tc.offset)
			buf := make([]byte, tc.bufSize)
			for {
				n, err := f.Read(buf)
				got.Write(buf[:n])
				if err == io.EOF {
					break
				}
				if err != nil {
					t.Fatalf("Read: %v", err)
				}
				if n == 0 {
					t.Fatal("Read returned 0 bytes and no error")
				}
			}
			if got.String() != tc.want {
				t.Errorf("followed %q; want %q", got.String(), tc.want)
			}
			// At the end, every Read says EOF again.
			if n, err := f.Read(buf); n != 0 || err != io.EOF {
				t.Errorf("Read after EOF = %d, %v; want 0, EOF", n, err)
			}
			if s := wait(t, r, s.ID); s.State != bgjob.Exited {
				t.Errorf("job %v; want exited", s.State)
			}
		})
	}

	t.Run("ctx-end-is-the-readers-error", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{})
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo hi; sleep 300"})
		if err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		f := r.Follow(ctx, s.ID, 0)
		buf := make([]byte, 10)
		if n, err := f.Read(buf); err != nil || string(buf[:n]) != "hi\n" {
			t.Fatalf("Read = %q, %v", buf[:n], err)
		}
		cancel()
		for range 2 {
			if _, err := f.Read(buf); !errors.Is(err, context.Canceled) {
				t.Errorf("Read after ctx's end: %v; want Canceled", err)
			}
		}
		r.Cancel(s.ID)
	})
	t.Run("unknown-id-fails-the-first-read", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{})
		_, err := r.Follow(ctxT(t), "job_0000000000000000", 0).Read(make([]byte, 1))
		mustErr(t, err, bgjob.ErrNotFound)
	})
	t.Run("keeps-to-its-run-when-the-id-runs-again", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{})
		dir := t.TempDir()
		g1, g2 := filepath.Join(dir, "g1"), filepath.Join(dir, "g2")
		spec := bgjob.Spec{Command: fmt.Sprintf("echo first; while [ ! -e %s ]; do sleep 0.01; done; if [ -e %s ]; then echo second-run; fi", g1, g2)}
		s, err := r.Start(ctxT(t), spec)
		if err != nil {
			t.Fatal(err)
		}
		f := r.Follow(ctxT(t), s.ID, 0)
		buf := make([]byte, 100)
		if n, err := f.Read(buf); err != nil || string(buf[:n]) != "first\n" {
			t.Fatalf("Read = %q, %v", buf[:n], err)
		}
		touch(t, g1)
		wait(t, r, s.ID)
		touch(t, g2)
		s2, err := r.Start(ctxT(t), spec)
		if err != nil || s2.ID != s.ID || s2.Joined {
			t.Fatalf("second run: %+v, %v; want a new run of %s", s2, err, s.ID)
		}
		if s2 := wait(t, r, s2.ID); !strings.Contains(s2.Output.Text, "second-run") {
			t.Fatalf("second run printed %q", s2.Output.Text)
		}
		if n, err := f.Read(buf); n != 0 || err != io.EOF {
			t.Errorf("Read = %q, %v; want EOF: the first run had ended", buf[:n], err)
		}
	})
}

// With an Admitter that changes the length of lines, a reader that
// advances by len(Data) instead of Next is told so (ErrInvalidArgument)
// rather than losing a line with nothing but Skipped to show for it
// (issue #20, item 4). A reader that follows Next reads everything, with
// nothing skipped.
func TestReadMidLineOffsetIsRefused(t *testing.T) {
	r := newRegistry(t, bgjob.Config{Admitter: bgjob.Redactor{}})
	raw := "step 1\npassword=hunter2hunter2\nstep 3\nkey AKIAIOSFODNN7EXAMPLE\nstep 5\nstep 6\n"
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "printf %s '" + raw + "'"})
	if err != nil {
		t.Fatal(err)
	}
	s = wait(t, r, s.ID)
	want := "step 1\npassword=[REDACTED:password]\nstep 3\nkey [REDACTED:aws-key]\nstep 5\nstep 6\n"
	if s.Output.Text != want {
		t.Fatalf("text %q; want %q", s.Output.Text, want)
	}
	for _, tc := range []struct {
		name    string
		advance func(c bgjob.Chunk) int64
		wantErr bool
	}{
		{"by-next-reads-every-line", func(c bgjob.Chunk) int64 { return c.Next }, false},
		{"by-len-data-is-refused", func(c bgjob.Chunk) int64 { return c.Offset + int64(len(c.Data)) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var got strings.Builder
			var err error
			for off := int64(0); ; {
				var c bgjob.Chunk
				c, err = r.Read(s.ID, off, 1) // one line per chunk
				if err != nil {
					break
				}
				if c.Skipped != 0 {
					t.Errorf("Read(%d) skipped %d bytes; nothing was dropped", off, c.Skipped)
				}
				got.WriteString(c.Data)
				if c.Done {
					break
				}
				off = tc.advance(c)
			}
			switch {
			case tc.wantErr && err == nil:
				t.Errorf("read %q to the end without an error; want ErrInvalidArgument", got.String())
			case tc.wantErr:
				mustErr(t, err, bgjob.ErrInvalidArgument)
				if !strings.Contains(err.Error(), "continue from Chunk.Next") {
					t.Errorf("%v; want it to say how to continue", err)
				}
			case err != nil || got.String() != want:
				t.Errorf("read %q, %v; want %q", got.String(), err, want)
			}
		})
	}
	// Text the Admitter left as it was is served from any offset.
	clean, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo line one; echo line two"})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, r, clean.ID)
	if c, err := r.Read(clean.ID, 5, 100); err != nil || c.Data != "one\nline two\n" || c.Offset != 5 {
		t.Errorf("Read(5) of unchanged text = %+v, %v; want from offset 5", c, err)
	}
}
