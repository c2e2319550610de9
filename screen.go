package bgjob

import (
	"bytes"
	"io"
	"strings"
	"sync"

	"github.com/charmbracelet/x/vt"
)

// screenKeep is the most output a render feeds the emulator: beyond it,
// the screen is rebuilt from the latest screenKeep bytes alone. The
// emulator's scrolling is slow (about 0.3 MB/s for output that scrolls a
// line every few bytes), so this bounds the time of one Screen call to
// a fraction of a second, however much the job printed.
const screenKeep = 256 << 10

// feedPiece is the size of the pieces a render feeds the emulator, each
// with its own recover: a panic of the emulator (it has known ones, on
// scroll regions beyond the screen) loses one piece at most.
const feedPiece = 4 << 10

const noticeRebuilt = "screen rebuilt from the latest output only"

// screen is a TTY job's terminal emulator, fed lazily: Screen feeds it
// the output that came since the last render, read from the job's
// head/tail buffer by offset (or, after the job's end, from the bytes
// kept for it then), so the supervisor's reads never wait for it.
//
// mu guards every field and the emulator, which is not safe for
// concurrent use. It is taken before the job's mu, never after.
type screen struct {
	mu         sync.Mutex
	em         *vt.Emulator // nil until the first render, or after a panic
	rows, cols int          // the size for the output from fed on
	fed        int64        // the stream offset fed up to
	rebuilt    bool         // the last render started over (noticeRebuilt)
	// resizes holds the sizes set by Resize for output not yet fed, by
	// the stream offset from which each applies.
	resizes []sizeAt
	// end holds, once the job has ended, the output not yet fed (at
	// most screenKeep bytes), taken from the buffer before it went.
	end *rawTail
}

type sizeAt struct {
	off        int64
	rows, cols int
}

// rawTail is a piece of the raw stream: b from offset start on; gap
// reports that output before start was lost to the emulator.
type rawTail struct {
	start int64
	b     []byte
	gap   bool
}

func newScreen(t *TTY) *screen {
	rows, cols := ttySize(t)
	return &screen{rows: int(rows), cols: int(cols)}
}

// ttySize is t's size, with the defaults for zero fields.
func ttySize(t *TTY) (rows, cols uint16) {
	rows, cols = 24, 80
	if t != nil && t.Rows > 0 {
		rows = t.Rows
	}
	if t != nil && t.Cols > 0 {
		cols = t.Cols
	}
	return rows, cols
}

// resize notes a new size, which applies to the output from now on.
func (s *screen) resize(j *job, rows, cols uint16) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j.mu.Lock()
	off := s.fed
	if j.out != nil {
		off = j.out.total
	} else if s.end != nil {
		off = s.end.start + int64(len(s.end.b))
	}
	j.mu.Unlock()
	s.resizes = append(s.resizes, sizeAt{off: off, rows: int(rows), cols: int(cols)})
}

// take returns the output from s.fed on that the job's buffer b holds,
// at most screenKeep bytes of it. b must not change meanwhile (the job's
// mu is held).
func (s *screen) take(b *outbuf) rawTail {
	total := b.total
	headEnd, tailBegin := b.held()
	start, gap := s.fed, false
	if total-start > screenKeep {
		start, gap = total-screenKeep, true
	}
	if headEnd < tailBegin && start < tailBegin {
		start, gap = tailBegin, true // dropped between head and tail
	}
	var out []byte
	if start < headEnd {
		out = b.appendRange(out, start, headEnd) // nothing was dropped: the tail follows
	}
	if from := max(start, tailBegin); from < total {
		out = b.appendRange(out, from, total)
	}
	return rawTail{start: start, b: out, gap: gap}
}

// atEnd keeps, as the job ends, the output the screen has not been fed,
// for a render after the end. The caller holds no lock; the job's
// output no longer changes.
func (s *screen) atEnd(j *job) {
	s.mu.Lock()
	defer s.mu.Unlock()
	j.mu.Lock()
	if j.out != nil {
		t := s.take(j.out)
		s.end = &t
	}
	j.mu.Unlock()
}

// render feeds the emulator what came since the last render, and draws
// the screen.
func (s *screen) render(j *job) Screen {
	s.mu.Lock()
	defer s.mu.Unlock()
	j.mu.Lock()
	var t rawTail
	switch {
	case j.out != nil:
		t = s.take(j.out)
	case s.end != nil:
		t = *s.end
		if skip := s.fed - t.start; skip > 0 {
			t.b, t.start, t.gap = t.b[min(skip, int64(len(t.b))):], s.fed, false
		}
	}
	j.mu.Unlock()
	s.feed(t)
	return s.draw()
}

// feed gives the emulator t, applying the sizes set for it on the way.
func (s *screen) feed(t rawTail) {
	switch {
	case t.gap:
		// Start over, from a line's start within the first 4 KiB, with
		// the size then in force.
		if i := bytes.IndexByte(t.b[:min(len(t.b), lineSlack)], '\n'); i >= 0 {
			t.b, t.start = t.b[i+1:], t.start+int64(i+1)
		}
		for len(s.resizes) > 0 && s.resizes[0].off <= t.start {
			s.rows, s.cols = s.resizes[0].rows, s.resizes[0].cols
			s.resizes = s.resizes[1:]
		}
		if bytes.IndexByte(t.b, 0x1b) < 0 && !hasResizeBefore(s.resizes, t.start+int64(len(t.b))) {
			// Plain text: its last lines are all that can show.
			t.b, t.start = lastLines(t.b, t.start, s.rows)
		}
		s.em, s.rebuilt = nil, true
	case len(t.b) > 0:
		s.rebuilt = false
	}
	if s.em == nil {
		s.em = newEmulator(s.rows, s.cols)
	}
	for {
		n := len(t.b)
		if len(s.resizes) > 0 {
			n = int(max(0, min(int64(n), s.resizes[0].off-t.start)))
		}
		s.write(t.b[:n])
		t.b, t.start = t.b[n:], t.start+int64(n)
		if len(s.resizes) == 0 || s.resizes[0].off > t.start {
			break
		}
		s.rows, s.cols = s.resizes[0].rows, s.resizes[0].cols
		s.resizes = s.resizes[1:]
		s.safely(func() { s.em.Resize(s.cols, s.rows) })
	}
	s.fed = t.start
}

func hasResizeBefore(rs []sizeAt, off int64) bool {
	return len(rs) > 0 && rs[0].off < off
}

// lastLines returns the last n lines of b (a line cut at the end counts),
// and their offset.
func lastLines(b []byte, start int64, n int) ([]byte, int64) {
	i := len(b)
	if i > 0 && b[i-1] == '\n' {
		i--
	}
	for k := 0; k < n; k++ {
		j := bytes.LastIndexByte(b[:i], '\n')
		if j < 0 {
			return b, start
		}
		i = j
	}
	return b[i+1:], start + int64(i+1)
}

// newEmulator returns an emulator of the given size that keeps no
// scrollback and answers no query: its replies would block its Write
// while nobody reads them, so their pipe is closed (a write to it then
// fails at once).
func newEmulator(rows, cols int) *vt.Emulator {
	em := vt.NewEmulator(cols, rows)
	em.SetScrollbackSize(1)
	if c, ok := em.InputPipe().(io.Closer); ok {
		c.Close()
	}
	return em
}

// write feeds b to the emulator in pieces.
func (s *screen) write(b []byte) {
	for len(b) > 0 {
		n := min(len(b), feedPiece)
		p := b[:n]
		s.safely(func() { s.em.Write(p) })
		b = b[n:]
	}
}

// safely runs f on the emulator; a panic in it is recovered, and the
// emulator, which stays usable after one, goes on.
func (s *screen) safely(f func()) {
	defer func() { recover() }()
	f()
}

// draw renders the emulator's screen.
func (s *screen) draw() (out Screen) {
	defer func() {
		if recover() != nil {
			out = Screen{Rows: make([]string, s.rows)}
		}
	}()
	em := s.em
	w, h := em.Width(), em.Height()
	rows := make([]string, h)
	var sb strings.Builder
	for y := range h {
		sb.Reset()
		for x := 0; x < w; x++ {
			c := em.CellAt(x, y)
			switch {
			case c == nil:
				sb.WriteByte(' ')
			case c.Width == 0:
				// The second half of a wide character.
			case c.Content == "":
				sb.WriteByte(' ')
			default:
				sb.WriteString(c.Content)
			}
		}
		rows[y] = strings.TrimRight(sb.String(), " ")
	}
	pos := em.CursorPosition()
	out = Screen{Rows: rows, CursorRow: pos.Y, CursorCol: pos.X}
	if s.rebuilt {
		out.Notice = noticeRebuilt
	}
	return out
}
