//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// matchLog records the matches passed to OnMatch, and lets a test wait
// for them.
type matchLog struct {
	mu    sync.Mutex
	ms    []bgjob.Match
	after atomic.Bool // set once Close has returned: no call may come then
	late  atomic.Int64
	wake  chan struct{}
}

func newMatchLog() *matchLog { return &matchLog{wake: make(chan struct{}, 1)} }

func (l *matchLog) on(m bgjob.Match) {
	if l.after.Load() {
		l.late.Add(1)
	}
	l.mu.Lock()
	l.ms = append(l.ms, m)
	l.mu.Unlock()
	select {
	case l.wake <- struct{}{}:
	default:
	}
}

func (l *matchLog) all() []bgjob.Match {
	l.mu.Lock()
	defer l.mu.Unlock()
	return slices.Clone(l.ms)
}

// await waits until n matches came, and returns them.
func (l *matchLog) await(t *testing.T, n int) []bgjob.Match {
	t.Helper()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	for {
		if ms := l.all(); len(ms) >= n {
			return ms
		}
		select {
		case <-l.wake:
		case <-timer.C:
			t.Fatalf("%d matches came to OnMatch within %v; want %d: %v", len(l.all()), deadline, n, l.all())
		}
	}
}

func rx(s string) *regexp.Regexp { return regexp.MustCompile(s) }

func TestWatchFirstLine(t *testing.T) {
	log := newMatchLog()
	r := newRegistry(t, bgjob.Config{OnMatch: log.on})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo 'listening on :8080'; echo other; echo 'listening on :9090'", Session: "s",
		Watches: []bgjob.Watch{{Name: "up", Pattern: rx(`listening on :(\d+)`)}}})
	if err != nil {
		t.Fatal(err)
	}
	ms := log.await(t, 1)
	wait(t, r, s.ID)
	want := bgjob.Match{ID: s.ID, Session: "s", Watch: "up", Offset: 0, Line: "listening on :8080"}
	got := ms[0]
	got.At = time.Time{}
	if got != want {
		t.Errorf("OnMatch got %+v; want %+v", got, want)
	}
	if ms[0].At.Before(s.Started) {
		t.Errorf("Match.At %v before the job's start %v", ms[0].At, s.Started)
	}
	q := r.Matches("s")
	if len(q) != 1 || q[0] != ms[0] {
		t.Errorf("Matches(s) = %v; want the one match %v", q, ms[0])
	}
	if q := r.Matches("s"); q != nil {
		t.Errorf("Matches(s) again = %v; want none: each match is delivered once", q)
	}
	if n := len(log.all()); n != 1 {
		t.Errorf("%d OnMatch calls; want 1 for a watch without Every", n)
	}
}

// A line whose bytes come one write at a time, with other output's
// reads between them.
func TestWatchLineSplitAcrossWrites(t *testing.T) {
	log := newMatchLog()
	r := newRegistry(t, bgjob.Config{OnMatch: log.on})
	spec := helperSpec("dribble", "2", "noise\nthe server is ready in 12ms\ntail")
	spec.Watches = []bgjob.Watch{{Name: "ready", Pattern: rx(`(?i)ready in \d+ms$`)}, {Name: "tail", Pattern: rx(`^tail$`)}}
	s, err := r.Start(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	ms := log.await(t, 2)
	f := wait(t, r, s.ID)
	if f.Output.Text != "noise\nthe server is ready in 12ms\ntail" {
		t.Fatalf("output %q", f.Output.Text)
	}
	if ms[0].Watch != "ready" || ms[0].Offset != 6 || ms[0].Line != "the server is ready in 12ms" {
		t.Errorf("first match %+v; want ready at 6", ms[0])
	}
	// The last line has no '\n': it is matched at the job's end.
	if ms[1].Watch != "tail" || ms[1].Offset != 34 || ms[1].Line != "tail" {
		t.Errorf("second match %+v; want tail at 34", ms[1])
	}
}

// A line in the middle of 50 MiB, which the head/tail buffer drops: the
// watch sees it, WaitFor (which looks at what is held) does not after the
// fact, and Read skips it.
func TestWatchDroppedMiddle(t *testing.T) {
	const half = 25 << 20
	log := newMatchLog()
	r := newRegistry(t, bgjob.Config{OnMatch: log.on})
	cmd := fmt.Sprintf("yes filler | head -c %d; printf '\\nMAGIC 42\\n'; yes filler | head -c %d", half, half)
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: cmd, Watches: []bgjob.Watch{{Name: "magic", Pattern: rx(`^MAGIC \d+$`), Every: true}}})
	if err != nil {
		t.Fatal(err)
	}
	f := wait(t, r, s.ID)
	if f.Output.Total != 2*half+10 || f.Output.Omitted == 0 {
		t.Fatalf("total %d omitted %d; want %d with bytes dropped", f.Output.Total, f.Output.Omitted, 2*half+10)
	}
	ms := log.await(t, 1)
	if len(ms) != 1 || ms[0].Offset != half+1 || ms[0].Line != "MAGIC 42" {
		t.Fatalf("matches %v; want one at %d", ms, half+1)
	}
	c, err := r.Read(s.ID, half+1, 100)
	if err != nil || c.Skipped == 0 {
		t.Errorf("Read at the match's offset: skipped %d, err %v; want the bytes dropped", c.Skipped, err)
	}
	_, err = r.WaitFor(ctxT(t), s.ID, rx(`^MAGIC`), 0)
	var ended *bgjob.EndedError
	if !errors.As(err, &ended) {
		t.Errorf("WaitFor for a dropped line after the end: %v; want an EndedError", err)
	}
}

func TestWatchCRLF(t *testing.T) {
	log := newMatchLog()
	r := newRegistry(t, bgjob.Config{OnMatch: log.on})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: `printf 'booting\r\nready\r\nready, mostly\r\n'`,
		Watches: []bgjob.Watch{{Name: "exact", Pattern: rx(`^ready$`), Every: true}, {Name: "cr", Pattern: rx(`\r`), Every: true}}})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, r, s.ID)
	ms := log.await(t, 1)
	if len(ms) != 1 || ms[0].Watch != "exact" || ms[0].Offset != 9 || ms[0].Line != "ready" {
		t.Errorf("matches %v; want exact at 9 with Line %q, and none of the \\r", ms, "ready")
	}
}

func TestWatchBinaryNoise(t *testing.T) {
	var noise []byte
	for i := range 20000 {
		noise = append(noise, byte(i*131+i/7)) // all 256 values, '\n' and NUL among them
	}
	stdin := string(noise) + "\nSTART ok\x00\xff\n" + string(noise)
	log := newMatchLog()
	r := newRegistry(t, bgjob.Config{OnMatch: log.on})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "cat", Stdin: stdin,
		Watches: []bgjob.Watch{{Name: "start", Pattern: rx(`^START ok\x00.$`), Every: true}}})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, r, s.ID)
	ms := log.await(t, 1)
	if len(ms) != 1 || ms[0].Offset != int64(len(noise)+1) || ms[0].Line != "START ok\x00\xff" {
		t.Errorf("matches %+v; want one at %d", ms, len(noise)+1)
	}
}

func TestWatchEveryCountsExactly(t *testing.T) {
	log := newMatchLog()
	r := newRegistry(t, bgjob.Config{OnMatch: log.on, HeadBytes: 1 << 10, TailBytes: 1 << 10})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "seq 1 20000", Session: "n", Watches: []bgjob.Watch{
		{Name: "sevens", Pattern: rx(`7$`), Every: true},
		{Name: "first-seven", Pattern: rx(`7$`)},
		{Name: "never", Pattern: rx(`^x`), Every: true},
	}})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, r, s.ID)
	ms := log.await(t, 2001)
	var sevens []int64
	first := 0
	off := map[int]int64{}
	var o int64
	for i := 1; i <= 20000; i++ {
		off[i] = o
		o += int64(len(strconv.Itoa(i))) + 1
	}
	for _, m := range ms {
		switch m.Watch {
		case "sevens":
			sevens = append(sevens, m.Offset)
			n, _ := strconv.Atoi(m.Line)
			if n%10 != 7 || off[n] != m.Offset {
				t.Errorf("sevens matched %q at %d", m.Line, m.Offset)
			}
		case "first-seven":
			first++
			if m.Line != "7" || m.Offset != off[7] {
				t.Errorf("first-seven matched %q at %d; want 7 at %d", m.Line, m.Offset, off[7])
			}
		default:
			t.Errorf("match of %q: %+v", m.Watch, m)
		}
	}
	if len(sevens) != 2000 || first != 1 || !slices.IsSorted(sevens) {
		t.Errorf("sevens %d (sorted %v), first-seven %d; want 2000 in order and 1", len(sevens), slices.IsSorted(sevens), first)
	}
	// The session's queue holds the first 1024 and counts the rest.
	q := r.Matches("n")
	var dropped int64
	for _, m := range q {
		dropped += m.Dropped
	}
	if len(q) != 1024 || dropped != 0 {
		t.Errorf("Matches: %d queued, %d dropped counted; want 1024 and 0 (the count comes with the next one queued)", len(q), dropped)
	}
}

func TestWaitForLinePrintedBefore(t *testing.T) {
	dir := t.TempDir()
	go_ := filepath.Join(dir, "go")
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("echo boot; echo 'ready on 1'; while [ ! -e %s ]; do sleep 0.01; done; echo 'ready on 2'; sleep 60", go_)})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r, s.ID, "ready on 1", 1)
	m, err := r.WaitFor(ctxT(t), s.ID, rx(`^ready on (\d)`), 0)
	if err != nil || m.Offset != 5 || m.Line != "ready on 1" || m.Watch != "" || m.ID != s.ID {
		t.Fatalf("WaitFor from 0: %+v, %v; want ready on 1 at 5", m, err)
	}
	// From past that line: it waits for the next one.
	got := make(chan error, 1)
	go func() {
		m, err := r.WaitFor(ctxT(t), s.ID, rx(`^ready on (\d)`), 6)
		if err == nil && (m.Line != "ready on 2" || m.Offset != 16) {
			err = fmt.Errorf("got %+v; want ready on 2 at 16", m)
		}
		got <- err
	}()
	touch(t, go_)
	if err := <-got; err != nil {
		t.Errorf("WaitFor from 6: %v", err)
	}
	// A ctx that ends first.
	ctx, cancel := context.WithTimeout(ctxT(t), 50*time.Millisecond)
	defer cancel()
	if _, err := r.WaitFor(ctx, s.ID, rx(`never`), 0); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("WaitFor with an ended ctx: %v; want DeadlineExceeded", err)
	}
	r.Cancel(s.ID)
	// After the end: the final text is searched.
	if m, err := r.WaitFor(ctxT(t), s.ID, rx(`on 2$`), 0); err != nil || m.Offset != 16 {
		t.Errorf("WaitFor after the end: %+v, %v; want the line at 16", m, err)
	}
}

func TestWaitForJobEndsWithoutMatch(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo nope; sleep 0.2; echo still nope; exit 3"})
	if err != nil {
		t.Fatal(err)
	}
	_, err = r.WaitFor(ctxT(t), s.ID, rx(`ready`), 0)
	var ended *bgjob.EndedError
	if !errors.Is(err, bgjob.ErrJobEnded) || !errors.As(err, &ended) {
		t.Fatalf("WaitFor: %v; want an *EndedError wrapping ErrJobEnded", err)
	}
	if sn := ended.Snapshot; sn.ID != s.ID || sn.State != bgjob.Exited || sn.ExitCode != 3 || sn.Output.Text != "nope\nstill nope\n" {
		t.Errorf("EndedError.Snapshot = %v %d %q; want exited 3 with the output", sn.State, sn.ExitCode, sn.Output.Text)
	}
	// The same once it has ended.
	if _, err := r.WaitFor(ctxT(t), s.ID, rx(`ready`), 0); !errors.As(err, &ended) || ended.Snapshot.ExitCode != 3 {
		t.Errorf("WaitFor on the ended job: %v; want an EndedError", err)
	}
}

// The last line, with no '\n', printed just before the end: a WaitFor
// caller gets it, not the end.
func TestWaitForLastLineAtEnd(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	for i := range 20 {
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("sleep 0.0%d; printf done", i%5), Unique: true})
		if err != nil {
			t.Fatal(err)
		}
		m, err := r.WaitFor(ctxT(t), s.ID, rx(`^done$`), 0)
		if err != nil || m.Offset != 0 {
			t.Fatalf("run %d: WaitFor: %+v %v; want done at 0", i, m, err)
		}
	}
}

func TestWatchWithholdingAdmitter(t *testing.T) {
	log := newMatchLog()
	adm := bgjob.AdmitterFunc(func(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
		if strings.Contains(req.Text, "secret") {
			return bgjob.Admitted{Withhold: true}, nil
		}
		return bgjob.Admitted{Text: strings.ReplaceAll(req.Text, "hunter2", "[redacted]")}, nil
	})
	r := newRegistry(t, bgjob.Config{OnMatch: log.on, Admitter: adm})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo 'token=secret'; echo 'pass=hunter2'; sleep 60",
		Watches: []bgjob.Watch{{Name: "creds", Pattern: rx(`^(token|pass)=`), Every: true}}})
	if err != nil {
		t.Fatal(err)
	}
	ms := log.await(t, 2)
	if !ms[0].Withheld || ms[0].Line != "" || ms[0].Offset != 0 {
		t.Errorf("withheld match: %+v; want Withheld, no Line", ms[0])
	}
	if ms[1].Withheld || ms[1].Line != "pass=[redacted]" {
		t.Errorf("rewritten match: %+v; want Line pass=[redacted]", ms[1])
	}
	for _, m := range r.Matches("") {
		if strings.Contains(m.Line, "secret") || strings.Contains(m.Line, "hunter2") {
			t.Errorf("queued match leaks: %+v", m)
		}
	}
	m, err := r.WaitFor(ctxT(t), s.ID, rx(`token`), 0)
	if err != nil || !m.Withheld || m.Line != "" {
		t.Errorf("WaitFor: %+v %v; want a withheld match", m, err)
	}
}

func TestWatchAddedToRunningJob(t *testing.T) {
	for _, tc := range []struct {
		name    string
		watches []bgjob.Watch
	}{
		{"first-watch", nil},
		{"another-watch", []bgjob.Watch{{Name: "a", Pattern: rx(`x`)}}},
	} {
		t.Run(tc.name, func(t *testing.T) { testWatchAdded(t, tc.watches) })
	}
}

func testWatchAdded(t *testing.T, watches []bgjob.Watch) {
	dir := t.TempDir()
	next := filepath.Join(dir, "next")
	log := newMatchLog()
	r := newRegistry(t, bgjob.Config{OnMatch: log.on})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("echo 'error one'; printf 'error t'; while [ ! -e %s ]; do sleep 0.01; done; echo 'wo'; echo 'error three'", next),
		Watches: watches})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r, s.ID, "error t", 1)
	if err := r.Watch(s.ID, bgjob.Watch{Name: "err", Pattern: rx(`^error`), Every: true}); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []bgjob.Watch{{Name: "err", Pattern: rx(`y`)}, {Name: "nil"}} {
		if err := r.Watch(s.ID, bad); !errors.Is(err, bgjob.ErrInvalidArgument) {
			t.Errorf("Watch(%q): %v; want ErrInvalidArgument", bad.Name, err)
		}
	}
	if err := r.Watch("job_0000000000000000", bgjob.Watch{Pattern: rx(`y`)}); !errors.Is(err, bgjob.ErrNotFound) {
		t.Errorf("Watch of an unknown job: %v; want ErrNotFound", err)
	}
	if err := r.Session("other").Watch(s.ID, bgjob.Watch{Name: "z", Pattern: rx(`y`)}); !errors.Is(err, bgjob.ErrNotFound) {
		t.Errorf("Watch through another session's view: %v; want ErrNotFound", err)
	}
	touch(t, next)
	wait(t, r, s.ID)
	// The line in progress counts; the complete one before it does not.
	ms := log.await(t, 2)
	if len(ms) != 2 || ms[0].Line != "error two" || ms[0].Offset != 10 || ms[1].Line != "error three" {
		t.Errorf("matches %v; want error two at 10 and error three", ms)
	}
	if err := r.Watch(s.ID, bgjob.Watch{Name: "late", Pattern: rx(`y`)}); !errors.Is(err, bgjob.ErrJobEnded) {
		t.Errorf("Watch of an ended job: %v; want ErrJobEnded", err)
	}
}

func TestWatchInvalidSpec(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	for _, ws := range [][]bgjob.Watch{
		{{Name: "x"}},
		{{Name: "x", Pattern: rx(`a`)}, {Name: "x", Pattern: rx(`b`)}},
	} {
		_, err := r.Start(ctxT(t), bgjob.Spec{Command: "true", Watches: ws})
		if !errors.Is(err, bgjob.ErrInvalidSpec) || !strings.Contains(err.Error(), "Spec.Watches") {
			t.Errorf("Start with watches %v: %v; want ErrInvalidSpec naming Spec.Watches", ws, err)
		}
	}
	for _, tc := range []struct {
		re   *regexp.Regexp
		from int64
	}{{nil, 0}, {rx(`a`), -1}} {
		if _, err := r.WaitFor(ctxT(t), "job_0000000000000000", tc.re, tc.from); !errors.Is(err, bgjob.ErrInvalidArgument) {
			t.Errorf("WaitFor(%v, %d): %v; want ErrInvalidArgument", tc.re, tc.from, err)
		}
	}
}

// Launches that differ in their watches are different jobs.
func TestWatchesAreInTheID(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	spec := bgjob.Spec{Command: "sleep 60"}
	a, err := r.Start(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	spec.Watches = []bgjob.Watch{{Name: "w", Pattern: rx(`x`)}}
	b, err := r.Start(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	spec.Watches[0].Every = true
	c, err := r.Start(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	if a.ID == b.ID || b.ID == c.ID || b.Joined || c.Joined {
		t.Errorf("IDs %s %s %s (joined %v %v); want three jobs", a.ID, b.ID, c.ID, b.Joined, c.Joined)
	}
	d, err := r.Start(ctxT(t), spec)
	if err != nil || d.ID != c.ID || !d.Joined {
		t.Errorf("the same launch again: %s joined %v, %v; want a join of %s", d.ID, d.Joined, err, c.ID)
	}
}

// heldBack is a registry whose OnMatch blocks until release is closed,
// and whose supervisors report when they stop reading a job's output
// because its matches wait for delivery.
type heldBack struct {
	r       *bgjob.Registry
	release chan struct{}
	held    chan bgjob.ID
	calls   atomic.Int64
	offsets sync.Map // offset of each match passed to OnMatch -> count
}

func newHeldBack(t *testing.T, cfg bgjob.Config) *heldBack {
	h := &heldBack{release: make(chan struct{}), held: make(chan bgjob.ID, 1)}
	cfg.OnMatch = func(m bgjob.Match) {
		h.calls.Add(1)
		n, _ := h.offsets.LoadOrStore(m.Offset, new(atomic.Int64))
		n.(*atomic.Int64).Add(1)
		<-h.release
	}
	h.r = newRegistry(t, cfg)
	bgjob.SetHeldHook(h.r, func(id bgjob.ID) {
		select {
		case h.held <- id:
		default:
		}
	})
	return h
}

// awaitHeld waits until the supervisor of id stops reading its output.
func (h *heldBack) awaitHeld(t *testing.T, id bgjob.ID) {
	t.Helper()
	timer := time.NewTimer(deadline)
	defer timer.Stop()
	for {
		select {
		case got := <-h.held:
			if got == id {
				return
			}
		case <-timer.C:
			t.Fatalf("job %s's output was never held back", id)
		}
	}
}

// seqBytes is the length of the output of seq 1 n.
func seqBytes(n int) int64 {
	var total int64
	for i := 1; i <= n; i++ {
		total += int64(len(strconv.Itoa(i)) + 1)
	}
	return total
}

// heldBound is the most output a job whose OnMatch is stuck can have had
// read: the lines of 1024 waiting matches and a few more (a line's
// watches all fire), and the rest of the read that found no room (the
// largest read buffer, 256 KiB).
const heldBound = 1100*8 + 256<<10

var everyLine = []bgjob.Watch{{Name: "all", Pattern: regexp.MustCompile(`^\d`), Every: true}}

// A slow OnMatch holds a job's output back: the supervisor stops reading
// once 1024 matches wait (the job's writes block, its output does not
// pile up in memory), and once OnMatch goes on, the job runs to its end
// and every line reaches OnMatch exactly once.
func TestWatchSlowOnMatch(t *testing.T) {
	const lines = 200000
	h := newHeldBack(t, bgjob.Config{})
	s, err := h.r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("seq 1 %d", lines), Watches: everyLine})
	if err != nil {
		t.Fatal(err)
	}
	h.awaitHeld(t, s.ID)
	st, err := h.r.Status(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if st.State != bgjob.Running || st.Output.Total > heldBound {
		t.Errorf("held back: %v, %d bytes read; want running, at most %d", st.State, st.Output.Total, heldBound)
	}
	close(h.release)
	end, err := h.r.Wait(ctxT(t), s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if want := seqBytes(lines); end.State != bgjob.Exited || end.Output.Total != want {
		t.Errorf("after OnMatch went on: %v, %d bytes; want exited, %d", end.State, end.Output.Total, want)
	}
	if err := h.r.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if got := h.calls.Load(); got != lines {
		t.Errorf("%d OnMatch calls; want %d, one per line", got, lines)
	}
	h.offsets.Range(func(k, v any) bool {
		if n := v.(*atomic.Int64).Load(); n != 1 {
			t.Errorf("the line at %d passed to OnMatch %d times", k, n)
		}
		return true
	})
}

// A job held back by a stuck OnMatch is stopped as any other: Cancel, the
// wall timeout and RunForeground's soft cap are not held up, and the
// matches of the lines the stop lets through still come, once each.
func TestWatchHeldBackStops(t *testing.T) {
	for _, tc := range []string{"cancel", "timeout", "soft-cap"} {
		t.Run(tc, func(t *testing.T) {
			h := newHeldBack(t, bgjob.Config{TailBytes: 64 << 20})
			spec := bgjob.Spec{Command: "seq 1 1000000", Watches: everyLine, Unique: true}
			if tc == "timeout" {
				spec.Timeout = time.Second
			}
			var id bgjob.ID
			var end bgjob.Snapshot
			switch tc {
			case "soft-cap":
				res, err := h.r.RunForeground(ctxT(t), spec, bgjob.Foreground{SoftCap: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				if !res.Detached || res.State != bgjob.Running {
					t.Fatalf("RunForeground of a held-back job: detached %v, %v; want detached at the soft cap", res.Detached, res.State)
				}
				id = res.ID
				h.awaitHeld(t, id)
				if end, err = h.r.Cancel(id); err != nil {
					t.Fatal(err)
				}
			default:
				s, err := h.r.Start(ctxT(t), spec)
				if err != nil {
					t.Fatal(err)
				}
				id = s.ID
				h.awaitHeld(t, id)
				if tc == "cancel" {
					end, err = h.r.Cancel(id)
				} else {
					end, err = h.r.Wait(ctxT(t), id)
				}
				if err != nil {
					t.Fatal(err)
				}
			}
			want := map[string]bgjob.State{"cancel": bgjob.Cancelled, "timeout": bgjob.TimedOut, "soft-cap": bgjob.Cancelled}[tc]
			if end.State != want || end.Output.Total >= seqBytes(1000000) {
				t.Errorf("held-back job: %v, %d bytes; want %v before its end", end.State, end.Output.Total, want)
			}
			close(h.release)
			if err := h.r.Close(ctxT(t)); err != nil {
				t.Fatal(err)
			}
			// Exactly one match per line printed (the last, cut by the
			// kill, is a line too).
			lines := int64(strings.Count(end.Output.Text, "\n"))
			if !strings.HasSuffix(end.Output.Text, "\n") {
				lines++
			}
			if end.Output.Omitted != 0 || h.calls.Load() != lines {
				t.Errorf("%d OnMatch calls for %d lines", h.calls.Load(), lines)
			}
		})
	}
}

// Many watches on many jobs, Close while they print: every goroutine
// ends (goleak, in TestMain), and no OnMatch call comes after Close.
func TestWatchManyJobsCloseMidFlight(t *testing.T) {
	log := newMatchLog()
	r, err := bgjob.New(bgjob.Config{OnMatch: log.on, KillGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var ids []bgjob.ID
	for i := range 20 {
		var ws []bgjob.Watch
		for k := range 5 {
			ws = append(ws, bgjob.Watch{Name: strconv.Itoa(k), Pattern: rx(fmt.Sprintf(`(?i)line %d\d*$|error`, k)), Every: k%2 == 0})
		}
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("i=0; while true; do echo \"job %d line $i\"; i=$((i+1)); done", i),
			Session: strconv.Itoa(i % 3), Watches: ws})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	log.await(t, 100)
	waiters := make(chan error, len(ids))
	for _, id := range ids {
		go func() {
			_, err := r.WaitFor(ctxT(t), id, rx(`never printed`), 0)
			waiters <- err
		}()
	}
	if err := r.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	log.after.Store(true)
	for range ids {
		if err := <-waiters; !errors.Is(err, bgjob.ErrJobEnded) {
			t.Errorf("WaitFor across Close: %v; want ErrJobEnded", err)
		}
	}
	if n := log.late.Load(); n > 0 {
		t.Errorf("%d OnMatch calls after Close returned", n)
	}
	// Every queued match is one that OnMatch got, once.
	seen := map[string]int{}
	for _, m := range log.all() {
		seen[fmt.Sprintf("%s/%s/%d", m.ID, m.Watch, m.Offset)]++
	}
	for k, n := range seen {
		if n != 1 {
			t.Errorf("match %s passed to OnMatch %d times", k, n)
		}
	}
	for s := range 3 {
		for _, m := range r.Matches(strconv.Itoa(s)) {
			if seen[fmt.Sprintf("%s/%s/%d", m.ID, m.Watch, m.Offset)] != 1 {
				t.Errorf("queued match %+v never went to OnMatch", m)
			}
		}
	}
}

// OnMatch may call back into the registry, Close included.
func TestWatchOnMatchCallsBack(t *testing.T) {
	var r *bgjob.Registry
	closed := make(chan error, 1)
	var once sync.Once
	r, err := bgjob.New(bgjob.Config{OnMatch: func(m bgjob.Match) {
		if _, err := r.Status(m.ID); err != nil {
			closed <- err
			return
		}
		once.Do(func() { closed <- r.Close(context.Background()) })
	}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo go; sleep 60", Watches: []bgjob.Watch{{Pattern: rx(`go`)}}}); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-closed:
		if err != nil {
			t.Errorf("Close from OnMatch: %v", err)
		}
	case <-time.After(deadline):
		t.Fatal("Close from OnMatch did not return")
	}
}
