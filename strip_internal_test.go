package bgjob

import (
	"bytes"
	"math/rand/v2"
	"strings"
	"testing"
	"time"
)

func TestStripText(t *testing.T) {
	for _, c := range []struct{ name, in, want string }{
		{"plain", "a\tb\nc", "a\tb\nc"},
		{"crlf", "one\r\ntwo\r\n", "one\ntwo\n"},
		{"sgr", "\x1b[1;31mred\x1b[0m", "red"},
		{"progress", "  0%\r 50%\r100%\ndone", "100%\ndone"},
		{"progress-shorter-with-el", "long text\rok\x1b[K\n", "ok\n"},
		{"el-whole-line", "abc\x1b[2Kd", "   d"},
		{"el-to-cursor", "abc\rx\x1b[1K", "  c"},
		{"overstrike", "_\bx b\bb", "x b"},
		{"backspace-at-start", "\b\bab", "ab"},
		{"osc-bel", "\x1b]0;title\x07text", "text"},
		{"osc-st", "\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\", "link"},
		{"dcs", "a\x1bP1$r0m\x1b\\b", "ab"},
		{"apc-cancelled", "a\x1b_junk\x18b", "ab"},
		{"charset", "\x1b(Bx\x1b)0y", "xy"},
		{"two-byte", "\x1b7a\x1b8\x1bMb\x1b=c", "abc"},
		{"private-csi", "\x1b[?1049h\x1b[?25lscreen\x1b[?1049l", "screen"},
		{"csi-with-newline-inside", "a\x1b[1\n2mb", "a\nb"},
		{"esc-in-osc-starts-anew", "\x1b]0;t\x1b[31mred", "red"},
		{"bel-and-nul-dropped", "a\x07\x00b\x7fc", "abc"},
		{"utf8", "héllo 世界 \U0001F600\n", "héllo 世界 \U0001F600\n"},
		{"utf8-overwrite", "世界\rx", "x界"},
		{"invalid-utf8-kept", "a\xffb\xe2\x82", "a\xffb\xe2\x82"},
		{"c1-byte-is-data", "\xc2\x9b31m", "\xc2\x9b31m"},
		{"lone-esc-at-end", "a\x1b", "a"},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := stripText([]byte(c.in)); got != c.want {
				t.Errorf("stripText(%q) = %q; want %q", c.in, got, c.want)
			}
		})
	}
}

// splitStrip strips b fed in random pieces of 1 to maxPiece bytes.
func splitStrip(b []byte, rng *rand.Rand, maxPiece int) string {
	var s stripper
	for len(b) > 0 {
		n := min(len(b), 1+rng.IntN(maxPiece))
		s.write(b[:n])
		b = b[n:]
	}
	return s.text()
}

// The text does not depend on how the stream is cut into reads.
func TestStripSplitAnywhere(t *testing.T) {
	stream := []byte("\x1b[?1049h\x1b[H\x1b[2Jtop - 10:00\x1b[K\r\n\x1b[7m  PID USER \x1b[m\r\n" +
		"héllo 世界\r\n\x1b]0;title\x07progress 10%\rprogress 100%\n\x1bP+q544e\x1b\\_\bx\xff\xe2\x82\xac\r\n" +
		"\x1b(B\x1b[38;5;196mred\x1b[0m\x1b[2K\rcleared\n")
	var s stripper
	s.write(stream)
	want := s.text()
	if strings.ContainsRune(want, 0x1b) {
		t.Fatalf("text %q holds an ESC", want)
	}
	rng := rand.New(rand.NewPCG(1, 2))
	for i := range 2000 {
		if got := splitStrip(stream, rng, 1+i%7); got != want {
			t.Fatalf("split %d: %q; want %q", i, got, want)
		}
	}
}

// FuzzStrip: any stream, cut into pieces of any size, gives the same
// text, which holds no ESC and no control byte but "\n" and TAB (bar
// an incomplete rune's bytes at the very end).
func FuzzStrip(f *testing.F) {
	f.Add([]byte("\x1b[31mred\x1b[0m\r\nab\bc\x1b]0;t\x07\xff"), uint8(1))
	f.Add([]byte("\x1bP\x1b[1;2r\x1b\\世\r界\x1b[K"), uint8(2))
	f.Fuzz(func(t *testing.T, b []byte, piece uint8) {
		var whole stripper
		whole.write(b)
		want := whole.text()
		var cut stripper
		for p := b; len(p) > 0; {
			n := min(len(p), 1+int(piece%16))
			cut.write(p[:n])
			p = p[n:]
		}
		if got := cut.text(); got != want {
			t.Fatalf("cut in pieces of %d: %q; whole: %q", 1+piece%16, got, want)
		}
		body := strings.TrimRight(want, "\x80\x81\x82\x83\x84\x85\x86\x87\x88\x89\x8a\x8b\x8c\x8d\x8e\x8f\x90\x91\x92\x93\x94\x95\x96\x97\x98\x99\x9a\x9b\x9c\x9d\x9e\x9f\xa0\xa1\xa2\xa3\xa4\xa5\xa6\xa7\xa8\xa9\xaa\xab\xac\xad\xae\xaf\xb0\xb1\xb2\xb3\xb4\xb5\xb6\xb7\xb8\xb9\xba\xbb\xbc\xbd\xbe\xbf\xc2\xdf\xe0\xef\xf0\xf4")
		for _, c := range []byte(body) {
			if c < 0x20 && c != '\n' && c != '\t' || c == 0x7f {
				t.Fatalf("text %q holds control byte %#x", want, c)
			}
		}
	})
}

// The emulator's replies to queries are dropped, not waited for: a
// render of output full of queries returns.
func TestScreenQueriesDoNotBlock(t *testing.T) {
	s := newScreen(&TTY{Rows: 5, Cols: 20})
	done := make(chan Screen, 1)
	go func() {
		s.feed(rawTail{b: []byte("\x1b[6n\x1b[c\x1b[>c\x1b[?2004$p\x1b]11;?\x07\x1b[5nhi")})
		done <- s.draw()
	}()
	select {
	case sc := <-done:
		if sc.Rows[0] != "hi" {
			t.Errorf("row 0 %q; want %q", sc.Rows[0], "hi")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("feeding queries blocked")
	}
}

// A stream that panics the emulator (a scroll region past the screen
// after a resize: charmbracelet/x#974) costs a piece of it, not the
// registry.
func TestScreenSurvivesEmulatorPanic(t *testing.T) {
	s := newScreen(&TTY{Rows: 27, Cols: 80})
	s.feed(rawTail{b: []byte("0\x1b[0;10")})
	s.resizes = append(s.resizes, sizeAt{off: s.fed, rows: 8, cols: 31})
	s.feed(rawTail{start: s.fed, b: []byte("r\x1b[10B\n00\x1b[1;29r\x1bM")})
	s.feed(rawTail{start: s.fed, b: []byte("\x1b[2J\x1b[Hafter")})
	if sc := s.draw(); len(sc.Rows) != 8 || sc.Rows[0] != "after" {
		t.Errorf("after a panic: %q; want 8 rows, the first %q", sc.Rows, "after")
	}
}

// After a gap, plain text is rebuilt from its last lines, and the
// screen says so.
func TestScreenRebuildsAfterGap(t *testing.T) {
	s := newScreen(&TTY{Rows: 3, Cols: 10})
	var b bytes.Buffer
	for i := range 1000 {
		b.WriteString(strings.Repeat("x", i%5) + "\r\n")
	}
	b.WriteString("last")
	s.feed(rawTail{start: 1 << 20, b: b.Bytes(), gap: true})
	sc := s.draw()
	if sc.Notice != noticeRebuilt || sc.Rows[2] != "last" || sc.Rows[1] != "xxxx" {
		t.Errorf("screen %q, notice %q; want the last lines and %q", sc.Rows, sc.Notice, noticeRebuilt)
	}
	s.feed(rawTail{start: s.fed, b: []byte("!")})
	if sc := s.draw(); sc.Notice != "" || sc.Rows[2] != "last!" {
		t.Errorf("next render %q, notice %q; want it fed on, no notice", sc.Rows, sc.Notice)
	}
}
