package bgjob_test

import (
	"strings"
	"testing"

	"github.com/bgjob/bgjob"
)

// A TTY job's watches match its raw stream: the terminal's "\r\n" ends a
// line as "\n" does, escape sequences are part of the line; WaitFor on
// the ended job searches the raw stream too (its Output.Text is
// stripped), at the same offsets.
func TestWatchTTY(t *testing.T) {
	log := newMatchLog()
	r := newRegistry(t, bgjob.Config{OnMatch: log.on})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: `printf 'one\n\033[32mready\033[0m on 80\n'`, TTY: &bgjob.TTY{},
		Watches: []bgjob.Watch{{Name: "ready", Pattern: rx(`ready\S* on 80$`)}}})
	if err != nil {
		t.Fatal(err)
	}
	ms := log.await(t, 1)
	if m := ms[0]; m.Offset != 5 || !strings.Contains(m.Line, "ready") || strings.HasSuffix(m.Line, "\r") {
		t.Errorf("match %+v; want the coloured line at 5, without its \\r", m)
	}
	if end := wait(t, r, s.ID); end.State != bgjob.Exited {
		t.Fatalf("TTY job: %v; want exited", end.State)
	}
	for _, tc := range []struct {
		pattern string
		from    int64
		off     int64
	}{{`^one$`, 0, 0}, {`ready`, 1, 5}} {
		m, err := r.WaitFor(ctxT(t), s.ID, rx(tc.pattern), tc.from)
		if err != nil || m.Offset != tc.off {
			t.Errorf("WaitFor(%q, %d) on the ended TTY job: %+v, %v; want the line at %d", tc.pattern, tc.from, m, err, tc.off)
		}
	}
}
