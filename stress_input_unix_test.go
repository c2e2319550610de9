//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	"github.com/bgjob/bgjob"
)

// TestStress's conversations (issue #16): interactive jobs written to,
// their input closed, and on Linux TTY jobs resized and rendered, each
// run by one worker from its launch to its end and checked exactly: the
// output is what was written (and, on a terminal, what the job answered
// to the sizes it was asked), the byte count its Telemetry reports, the
// size the terminal reports after each Resize, and the rows Screen
// renders. Close may stop a conversation anywhere: then its output is a
// prefix of the expected one, and its writes fail with ErrInputClosed.

type conversationCounts struct {
	pipes, ttys, writes, writeBytes, closes, resizes, screens, neverRead, stopped atomic.Int64
}

// ttyConversation is the TTY job of a conversation: it echoes each line
// without the terminal's echo, and answers "size" with its size.
const ttyConversation = `stty -echo; echo ready; while IFS= read -r line; do if [ "$line" = size ]; then stty size; else printf '%s\n' "$line"; fi; done; exit 3`

// conversation runs one conversation, of a kind picked by rng.
func (st *stress) conversation(rng *rand.Rand) {
	switch k := rng.IntN(10); {
	case k < 2:
		st.neverReads(rng)
	case k < 6 || runtime.GOOS != "linux":
		st.pipeConversation(rng)
	default:
		st.ttyConversation(rng)
	}
}

// startConversation launches spec for a conversation, and records its job
// for verify (not in the list other workers pick from: they would not
// know its output).
func (st *stress) startConversation(spec bgjob.Spec, code int) (bgjob.Snapshot, *stressSpec, bool) {
	spec.Session = stressSessions[int(st.tokens.Add(1))%len(stressSessions)]
	s, err := st.main.r.Start(context.Background(), spec)
	if err != nil {
		st.launchErr("Start", err)
		return s, nil, false
	}
	ss := &stressSpec{kind: kindConversation, spec: spec, code: code}
	st.mu.Lock()
	st.ids[s.ID], st.regs[s.ID] = ss, st.main
	if s.PID > 0 {
		st.pids[s.PID] = true
	}
	st.mu.Unlock()
	st.main.launches.Add(1)
	if s.Joined {
		st.fail("interactive launch %s joined a running job", s.ID)
	}
	return s, ss, true
}

// inputErr checks an error of Write or CloseInput: only Close may stop a
// conversation. It reports whether the conversation goes on.
func (st *stress) inputErr(op string, id bgjob.ID, err error) bool {
	if err == nil {
		return true
	}
	if errors.Is(err, bgjob.ErrInputClosed) && st.closing.Load() {
		st.cv.stopped.Add(1)
		return false
	}
	st.fail("%s(%s): %v", op, id, err)
	return false
}

// finishConversation waits for the job's end and checks its text against
// want, whole if it exited, a prefix if Close stopped it.
func (st *stress) finishConversation(ss *stressSpec, id bgjob.ID, want string) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	s, err := st.main.r.Wait(ctx, id)
	if err != nil {
		st.fail("Wait(%s): %v", id, err)
		return
	}
	text := s.Output.Text
	switch {
	case s.State == bgjob.Exited && (text != want || s.ExitCode != ss.code):
		st.fail("conversation %s: exit %d, %d bytes of text, first difference at %d; want exit %d and the %d bytes of the conversation",
			id, s.ExitCode, len(text), firstDiff(text, want), ss.code, len(want))
	case s.State == bgjob.Exited:
	case s.State == bgjob.Cancelled && st.closing.Load() && strings.HasPrefix(want, text):
		st.cv.stopped.Add(1)
	default:
		st.fail("conversation %s: %v (%s), %d bytes; want exited with the conversation", id, s.State, s.Reason, len(text))
	}
}

// line returns the i-th line a conversation writes: its own word, and a
// length from 1 to about 3 KiB (a terminal takes lines under 4 KiB).
func convLine(rng *rand.Rand, word string, i int) string {
	return fmt.Sprintf("%s-%d-%s", word, i, strings.Repeat("z", rng.IntN(3000)))
}

// pipeConversation writes lines to cat, in pieces cut anywhere, then
// closes its input: cat's output is exactly what was written.
func (st *stress) pipeConversation(rng *rand.Rand) {
	code := rng.IntN(4)
	word := fmt.Sprintf("p%d", st.tokens.Add(1))
	s, ss, ok := st.startConversation(bgjob.Spec{Command: fmt.Sprintf("cat; exit %d", code), Interactive: true}, code)
	if !ok {
		return
	}
	st.cv.pipes.Add(1)
	var all strings.Builder
	for i := range 1 + rng.IntN(20) {
		all.WriteString(convLine(rng, word, i) + "\n")
	}
	want := all.String()
	ss.n = int64(len(want))
	// A cancelled ctx writes nothing.
	cctx, cancel := context.WithCancel(context.Background())
	cancel()
	if n, err := st.main.r.Write(cctx, s.ID, []byte(want)); n != 0 || !errors.Is(err, context.Canceled) && !errors.Is(err, bgjob.ErrInputClosed) {
		st.fail("Write(%s) with a cancelled ctx = %d, %v; want 0, context.Canceled", s.ID, n, err)
	}
	for rest := want; rest != ""; {
		n := min(len(rest), 1+rng.IntN(8000))
		st.cv.writes.Add(1)
		w, err := st.main.r.Write(context.Background(), s.ID, []byte(rest[:n]))
		st.cv.writeBytes.Add(int64(w))
		if w != n && err == nil {
			st.fail("Write(%s) = %d, nil; want %d", s.ID, w, n)
		}
		if !st.inputErr("Write", s.ID, err) {
			break
		}
		rest = rest[n:]
	}
	st.cv.closes.Add(1)
	if err := st.main.r.CloseInput(s.ID); st.inputErr("CloseInput", s.ID, err) {
		if err := st.main.r.CloseInput(s.ID); !errors.Is(err, bgjob.ErrInputClosed) {
			st.fail("second CloseInput(%s): %v; want ErrInputClosed", s.ID, err)
		}
	}
	st.finishConversation(ss, s.ID, want)
}

// neverReads writes to a job that never reads: Write returns at its
// ctx's end with part of it; the job times out.
func (st *stress) neverReads(rng *rand.Rand) {
	s, ss, ok := st.startConversation(bgjob.Spec{Command: "exec sleep 300", Interactive: true, Timeout: 300 * time.Millisecond}, 0)
	if !ok {
		return
	}
	st.cv.neverRead.Add(1)
	ctx, cancel := context.WithTimeout(context.Background(), time.Duration(10+rng.IntN(50))*time.Millisecond)
	n, err := st.main.r.Write(ctx, s.ID, make([]byte, 1<<20))
	cancel()
	switch {
	case errors.Is(err, context.DeadlineExceeded) && n < 1<<20:
	case errors.Is(err, bgjob.ErrInputClosed):
		// It timed out (or was closed) first.
	default:
		st.fail("Write(%s) to a job that never reads = %d, %v; want part of it and DeadlineExceeded", s.ID, n, err)
	}
	wctx, wcancel := context.WithTimeout(context.Background(), deadline)
	defer wcancel()
	end, err := st.main.r.Wait(wctx, s.ID)
	if err != nil || end.Output.Total != 0 || end.State != bgjob.TimedOut && end.State != bgjob.Cancelled {
		st.fail("never-reading job %s: %v, %d bytes, %v; want timed out, no output", s.ID, end.State, end.Output.Total, err)
	}
	if _, err := st.main.r.Write(context.Background(), s.ID, []byte("x")); !errors.Is(err, bgjob.ErrInputClosed) {
		st.fail("Write(%s) after its end: %v; want ErrInputClosed", s.ID, err)
	}
	_ = ss
}

// ttyConversation writes lines and size requests to a TTY job, resizing
// it between them, and renders its screen: the job's answers follow each
// Resize, and the screen has the rows last set.
func (st *stress) ttyConversation(rng *rand.Rand) {
	rows, cols := uint16(5+rng.IntN(40)), uint16(20+rng.IntN(180))
	s, ss, ok := st.startConversation(bgjob.Spec{Command: ttyConversation, TTY: &bgjob.TTY{Rows: rows, Cols: cols}}, 3)
	if !ok {
		return
	}
	st.cv.ttys.Add(1)
	r := st.main.r
	// Wait for "ready": before it, echo may still be on.
	rctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	var got strings.Builder
	for off := int64(0); !strings.Contains(got.String(), "ready\r\n"); {
		c, err := r.ReadWait(rctx, s.ID, off, 1<<20)
		if err == nil && c.Done && !strings.Contains(got.String()+c.Data, "ready\r\n") {
			err = errors.New("the job ended")
		}
		if err != nil {
			if !st.closing.Load() {
				st.fail("TTY conversation %s: no ready: %v", s.ID, err)
			}
			st.finishConversation(ss, s.ID, "ready\n")
			return
		}
		got.WriteString(c.Data)
		off = c.Next
	}
	want := "ready\n"
	word := fmt.Sprintf("t%d", st.tokens.Add(1))
	raw := int64(len("ready\r\n"))
	stopped := false
	say := func(text string) bool {
		st.cv.writes.Add(1)
		n, err := r.Write(context.Background(), s.ID, []byte(text))
		st.cv.writeBytes.Add(int64(n))
		return st.inputErr("Write", s.ID, err)
	}
	for i := 0; i < 1+rng.IntN(12) && !stopped; i++ {
		switch rng.IntN(4) {
		case 0:
			rows, cols = uint16(3+rng.IntN(60)), uint16(10+rng.IntN(200))
			st.cv.resizes.Add(1)
			if err := r.Resize(s.ID, rows, cols); err != nil {
				if !errors.Is(err, bgjob.ErrInputClosed) || !st.closing.Load() {
					st.fail("Resize(%s): %v", s.ID, err)
				}
				stopped = true
			}
		case 1:
			answer := fmt.Sprintf("%d %d\n", rows, cols)
			if stopped = !say("size\n"); !stopped {
				want += answer
				raw += int64(len(answer)) + 1
				st.awaitRaw(s.ID, raw)
			}
		case 2:
			st.cv.screens.Add(1)
			st.awaitRaw(s.ID, raw)
			sc, err := r.Screen(s.ID)
			switch {
			case err != nil:
				st.fail("Screen(%s): %v", s.ID, err)
			case len(sc.Rows) != int(rows) || sc.CursorRow >= int(rows) || sc.CursorCol > int(cols):
				st.fail("Screen(%s): %d rows, cursor (%d, %d); want %d rows of %d", s.ID, len(sc.Rows), sc.CursorRow, sc.CursorCol, rows, cols)
			}
		default:
			line := convLine(rng, word, i)
			if stopped = !say(line + "\n"); !stopped {
				want += line + "\n"
				raw += int64(len(line)) + 2
			}
		}
	}
	ss.n = raw
	st.cv.closes.Add(1)
	if !stopped {
		// At a line's start, the end-of-file character ends the loop.
		st.inputErr("CloseInput", s.ID, r.CloseInput(s.ID))
	}
	st.finishConversation(ss, s.ID, want)
}

// awaitRaw waits until the job's raw stream has n bytes (or it ended), so
// that an answer is in before the next size change.
func (st *stress) awaitRaw(id bgjob.ID, n int64) {
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	for off := n - 1; ; {
		c, err := st.main.r.ReadWait(ctx, id, off, 1)
		if err != nil || c.Next >= n || c.Done {
			if err != nil && !st.closing.Load() {
				st.fail("waiting for byte %d of %s: %v", n, id, err)
			}
			return
		}
		off = c.Next
	}
}

func (st *stress) logConversations() {
	c := &st.cv
	st.t.Logf("conversations: %d on pipes, %d on terminals, %d to jobs that never read; %d writes (%d bytes), %d CloseInput, %d Resize, %d Screen; %d stopped by Close",
		c.pipes.Load(), c.ttys.Load(), c.neverRead.Load(), c.writes.Load(), c.writeBytes.Load(), c.closes.Load(), c.resizes.Load(), c.screens.Load(), c.stopped.Load())
}
