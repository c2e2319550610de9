//go:build unix

package bgjob_test

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// masker replaces every byte but '\n' with '#', records the requests it
// sees, and keeps the number of lines, as a redactor should.
type masker struct {
	mu   sync.Mutex
	reqs []bgjob.AdmitRequest
}

func (m *masker) Admit(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
	m.mu.Lock()
	m.reqs = append(m.reqs, req)
	m.mu.Unlock()
	b := []byte(req.Text)
	for i, c := range b {
		if c != '\n' {
			b[i] = '#'
		}
	}
	return bgjob.Admitted{Text: string(b)}, nil
}

func (m *masker) partial() (partial, final int) {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, r := range m.reqs {
		if r.Partial {
			partial++
		} else {
			final++
		}
	}
	return
}

// leaks reports whether s holds any letter of the jobs' output.
func leaks(s string) bool { return strings.ContainsAny(s, "SECRTsecrt") }

func TestAdmitterSeesEveryPath(t *testing.T) {
	m := &masker{}
	r := newRegistry(t, bgjob.Config{Admitter: m, ProgressInterval: time.Hour})
	// A running job: Status, Read, List, a detached RunForeground.
	spec := bgjob.Spec{Command: "echo SECRET; echo secret; sleep 300", Session: "s"}
	res, err := r.RunForeground(ctxT(t), spec, bgjob.Foreground{SoftCap: time.Millisecond})
	if err != nil || !res.Detached {
		t.Fatalf("%+v %v", res, err)
	}
	if leaks(res.Output.Text) {
		t.Errorf("detached RunForeground leaked %q", res.Output.Text)
	}
	waitOutput(t, r, res.ID, "######\n", 2)
	s, _ := r.Status(res.ID)
	if leaks(s.Output.Text) {
		t.Errorf("Status leaked %q", s.Output.Text)
	}
	c, err := r.Read(res.ID, 0, 1000)
	if err != nil || leaks(c.Data) || c.Data != "######\n######\n" {
		t.Errorf("Read leaked: %+v %v", c, err)
	}
	for _, l := range r.List("s") {
		if leaks(l.Output.Text) {
			t.Errorf("List leaked %q", l.Output.Text)
		}
	}
	if p, f := m.partial(); p == 0 || f != 0 {
		t.Errorf("%d partial and %d final admissions while running; want some partial, no final", p, f)
	}
	r.Cancel(res.ID)
	if _, f := m.partial(); f != 1 {
		t.Errorf("%d final admissions; want exactly 1 at the end", f)
	}

	// A finished job: Wait, Status, Read, List, an inline RunForeground.
	w, _ := r.Wait(ctxT(t), res.ID)
	fg, _ := r.RunForeground(ctxT(t), bgjob.Spec{Command: "echo SECRETS"}, bgjob.Foreground{})
	s, _ = r.Status(res.ID)
	c, _ = r.Read(res.ID, 0, 1000)
	outs := []string{w.Output.Text, fg.Output.Text, s.Output.Text, c.Data}
	for _, l := range r.List("s") {
		outs = append(outs, l.Output.Text)
	}
	for i, o := range outs {
		if leaks(o) || o == "" {
			t.Errorf("path %d after the end: %q", i, o)
		}
	}
}

func TestReadWithLengthChangingAdmitter(t *testing.T) {
	// Every "KEY" becomes "[redacted]": longer than the raw bytes.
	redact := bgjob.AdmitterFunc(func(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
		return bgjob.Admitted{Text: strings.ReplaceAll(req.Text, "KEY", "[redacted]")}, nil
	})
	r := newRegistry(t, bgjob.Config{Admitter: redact})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo a KEY b; echo plain; echo KEY KEY; sleep 300"})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r, s.ID, "[redacted] [redacted]", 1)
	raw := "a KEY b\nplain\nKEY KEY\n"
	// Running: chunks end on lines, offsets are the raw stream's.
	c, err := r.Read(s.ID, 0, 10) // "a KEY b\n" (8 bytes) fits, "plain\n" does not
	if err != nil || c.Data != "a [redacted] b\n" || c.Offset != 0 || c.Next != 8 {
		t.Fatalf("Read(0,10) = %+v, %v", c, err)
	}
	c, _ = r.Read(s.ID, c.Next, 100)
	if c.Data != "plain\n[redacted] [redacted]\n" || c.Next != int64(len(raw)) {
		t.Fatalf("Read(8) = %+v", c)
	}
	r.Cancel(s.ID)
	// Finished: the final text maps back line by line.
	for _, tc := range []struct {
		off      int64
		max      int
		data     string
		from, to int64
	}{
		{0, 100, "a [redacted] b\nplain\n[redacted] [redacted]\n", 0, int64(len(raw))},
		{0, 10, "a [redacted] b\n", 0, 8},
		{8, 6, "plain\n", 8, 14},
	} {
		c, err := r.Read(s.ID, tc.off, tc.max)
		if err != nil || c.Data != tc.data || c.Offset != tc.from || c.Next != tc.to || c.Skipped != tc.from-tc.off {
			t.Errorf("Read(%d,%d) = %+v, %v; want %q [%d,%d)", tc.off, tc.max, c, err, tc.data, tc.from, tc.to)
		}
	}
	// Mid-line: refused, not skipped to the next line (see
	// TestReadMidLineOffsetIsRefused).
	if _, err := r.Read(s.ID, 3, 100); !errors.Is(err, bgjob.ErrInvalidArgument) {
		t.Errorf("Read(3, 100): %v; want ErrInvalidArgument", err)
	}
}

func TestAdmitterFailsClosed(t *testing.T) {
	t.Run("error-withholds", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{Admitter: bgjob.AdmitterFunc(func(context.Context, bgjob.AdmitRequest) (bgjob.Admitted, error) {
			return bgjob.Admitted{Text: "leak"}, errors.New("policy service down")
		})})
		s, _ := r.Start(ctxT(t), bgjob.Spec{Command: "echo SECRET"})
		s = wait(t, r, s.ID)
		if !s.Output.Withheld || s.Output.Text != "" || s.Output.Notice == "" || strings.Contains(s.Output.Notice, "SECRET") {
			t.Errorf("got %+v; want withheld with a content-free notice", s.Output)
		}
		if c, _ := r.Read(s.ID, 0, 100); c.Data != "" || !c.Done {
			t.Errorf("Read of withheld output: %+v", c)
		}
	})
	t.Run("epoch-moved-withholds", func(t *testing.T) {
		a := &epochAdmitter{}
		r := newRegistry(t, bgjob.Config{Admitter: a})
		s, _ := r.Start(ctxT(t), bgjob.Spec{Command: "echo SECRET"})
		s = wait(t, r, s.ID)
		if !s.Output.Withheld || s.Output.Text != "" {
			t.Errorf("got %+v; want withheld: the policy changed during admission", s.Output)
		}
	})
	t.Run("withhold-verdict", func(t *testing.T) {
		r := newRegistry(t, bgjob.Config{Admitter: bgjob.AdmitterFunc(func(context.Context, bgjob.AdmitRequest) (bgjob.Admitted, error) {
			return bgjob.Admitted{Withhold: true, Notice: "binary output"}, nil
		})})
		s, _ := r.Start(ctxT(t), bgjob.Spec{Command: "echo x"})
		s = wait(t, r, s.ID)
		if !s.Output.Withheld || s.Output.Text != "" || !strings.Contains(s.Output.Notice, "binary output") || s.Output.Total != 2 {
			t.Errorf("got %+v", s.Output)
		}
	})
}

// epochAdmitter's epoch moves during every Admit call.
type epochAdmitter struct{ epoch atomic.Uint64 }

func (a *epochAdmitter) Epoch() uint64 { return a.epoch.Load() }
func (a *epochAdmitter) Admit(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
	a.epoch.Add(1)
	return bgjob.Admitted{Text: req.Text}, nil
}

// switchAdmitter applies a policy that can be changed.
type switchAdmitter struct {
	mu      sync.Mutex
	policy  func(string) bgjob.Admitted
	gate    chan struct{} // if not nil, Admit of a text holding "***" waits on it
	entered chan struct{} // told when such an Admit reaches the gate
}

func (a *switchAdmitter) Admit(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
	a.mu.Lock()
	p, gate := a.policy, a.gate
	a.mu.Unlock()
	if gate != nil && strings.Contains(req.Text, "***") {
		a.entered <- struct{}{}
		<-gate
		return bgjob.Admitted{Text: "STALE"}, nil
	}
	return p(req.Text), nil
}

func (a *switchAdmitter) set(p func(string) bgjob.Admitted, gate chan struct{}) {
	a.mu.Lock()
	a.policy, a.gate = p, gate
	a.mu.Unlock()
}

func TestReadmit(t *testing.T) {
	pass := func(s string) bgjob.Admitted { return bgjob.Admitted{Text: s} }
	a := &switchAdmitter{policy: pass}
	r := newRegistry(t, bgjob.Config{Admitter: a})
	s, _ := r.Start(ctxT(t), bgjob.Spec{Command: "echo token=abc; echo ok"})
	wait(t, r, s.ID)
	w, _ := r.Start(ctxT(t), bgjob.Spec{Command: "echo withhold-me"})
	wait(t, r, w.ID)

	a.set(func(s string) bgjob.Admitted {
		if strings.Contains(s, "withhold-me") {
			return bgjob.Admitted{Withhold: true}
		}
		return bgjob.Admitted{Text: strings.ReplaceAll(s, "abc", "***")}
	}, nil)
	if err := r.Readmit(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Status(s.ID); got.Output.Text != "token=***\nok\n" {
		t.Errorf("after Readmit: %q", got.Output.Text)
	}
	if c, _ := r.Read(s.ID, 0, 100); c.Data != "token=***\nok\n" {
		t.Errorf("Read after Readmit: %+v", c)
	}
	if got, _ := r.Status(w.ID); !got.Output.Withheld || got.Output.Text != "" {
		t.Errorf("withholding Readmit: %+v; want the text cleared", got.Output)
	}

	// Readmit never overwrites a newer run of the same ID.
	gate := make(chan struct{})
	a.entered = make(chan struct{}, 1)
	a.set(pass, gate)
	done := make(chan error)
	go func() { done <- r.Readmit(context.Background()) }()
	// While Readmit holds the old run's text at the gate, a new run of
	// the same ID ends with its own text.
	<-a.entered
	again, _ := r.Start(ctxT(t), bgjob.Spec{Command: "echo token=abc; echo ok"})
	if again.ID != s.ID {
		t.Fatalf("re-run has ID %s; want %s", again.ID, s.ID)
	}
	wait(t, r, again.ID)
	close(gate)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if got, _ := r.Status(s.ID); got.Output.Text != "token=abc\nok\n" {
		t.Errorf("the newer run's text is %q; Readmit overwrote it", got.Output.Text)
	}
}

func TestTelemetry(t *testing.T) {
	tel := &telemetryRecorder{}
	r := newRegistry(t, bgjob.Config{Telemetry: tel, Shell: []string{"/bin/sh", "-c"}})
	run := func(spec bgjob.Spec, cancel bool) bgjob.Snapshot {
		s, err := r.Start(ctxT(t), spec)
		if err != nil {
			t.Fatal(err)
		}
		if cancel {
			s, _ = r.Cancel(s.ID)
			return s
		}
		return wait(t, r, s.ID)
	}
	run(bgjob.Spec{Command: "echo ok"}, false)
	run(bgjob.Spec{Command: "exit 3"}, false)
	run(bgjob.Spec{Command: "sleep 300", Timeout: 50 * time.Millisecond}, false)
	run(bgjob.Spec{Command: "sleep 300"}, true)
	run(bgjob.Spec{Command: "echo ok"}, false) // a re-run counts again
	fg, _ := r.RunForeground(ctxT(t), bgjob.Spec{Command: "exit 0"}, bgjob.Foreground{})
	r.Status(fg.ID) // polls never count
	r.List("")

	// A spawn failure: the directory vanishes after validation.
	dir := t.TempDir()
	bad := newRegistry(t, bgjob.Config{Telemetry: tel, Guard: func(_ context.Context, s bgjob.Spec) error {
		if s.Dir == dir {
			return os.Remove(dir)
		}
		return nil
	}})
	s, _ := bad.Start(ctxT(t), bgjob.Spec{Command: "true", Dir: dir})
	if s.State != bgjob.Failed || !strings.Contains(s.Reason, "working directory") {
		t.Errorf("vanished Dir: %v %q", s.State, s.Reason)
	}

	tel.mu.Lock()
	defer tel.mu.Unlock()
	if len(tel.started) != 6 {
		t.Errorf("%d JobStarted; want 6 (one per process)", len(tel.started))
	}
	want := []struct {
		state    bgjob.State
		code     int
		category bgjob.Category
		bg       bool
	}{
		{bgjob.Exited, 0, bgjob.CategoryNone, true},
		{bgjob.Exited, 3, bgjob.CategoryCommand, true},
		{bgjob.TimedOut, 124, bgjob.CategoryTimeout, true},
		{bgjob.Cancelled, 130, bgjob.CategoryCancelled, true},
		{bgjob.Exited, 0, bgjob.CategoryNone, true},
		{bgjob.Exited, 0, bgjob.CategoryNone, false},
		{bgjob.Failed, -1, bgjob.CategorySpawn, true},
	}
	if len(tel.finished) != len(want) {
		t.Fatalf("%d JobFinished; want %d", len(tel.finished), len(want))
	}
	for i, w := range want {
		e := tel.finished[i]
		if e.State != w.state || e.ExitCode != w.code || e.Category != w.category || e.Background != w.bg {
			t.Errorf("event %d: %v %d %v bg=%v; want %v %d %v bg=%v", i, e.State, e.ExitCode, e.Category, e.Background, w.state, w.code, w.category, w.bg)
		}
	}
	if e := tel.finished[0]; e.Bytes != 3 || e.Duration <= 0 || e.ID == "" {
		t.Errorf("first event: bytes %d duration %v id %q", e.Bytes, e.Duration, e.ID)
	}
}

func TestSlowHookDoesNotStallOtherJobs(t *testing.T) {
	release := make(chan struct{})
	tel := &telemetryRecorder{}
	tel.onFinish = func(e bgjob.Event) {
		if e.ExitCode == 7 { // the slow job's hook blocks until the others are done
			select {
			case <-release:
			case <-time.After(deadline):
			}
		}
	}
	r := newRegistry(t, bgjob.Config{Telemetry: tel})
	slow, _ := r.Start(ctxT(t), bgjob.Spec{Command: "exit 7"})
	var wg sync.WaitGroup
	for i := range 20 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			s, err := r.RunForeground(ctxT(t), bgjob.Spec{Command: "echo " + strings.Repeat("x", i)}, bgjob.Foreground{})
			if err != nil || s.Detached || s.State != bgjob.Exited {
				t.Errorf("job %d: %v %v", i, s.State, err)
			}
		}()
	}
	wg.Wait() // the 20 finished while the slow hook was blocked
	select {
	case <-slowDone(r, slow.ID):
		t.Error("the slow job ended before its hook returned")
	default:
	}
	close(release)
	if s := wait(t, r, slow.ID); s.ExitCode != 7 {
		t.Errorf("slow job: exit %d", s.ExitCode)
	}
}

// slowDone returns a channel closed when Wait on id returns.
func slowDone(r *bgjob.Registry, id bgjob.ID) <-chan struct{} {
	ch := make(chan struct{})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := r.Wait(ctx, id); err == nil {
		close(ch)
	}
	return ch
}

func TestSlogTelemetry(t *testing.T) {
	var buf bytes.Buffer
	var mu sync.Mutex
	h := slog.NewTextHandler(&lockedWriter{w: &buf, mu: &mu}, &slog.HandlerOptions{Level: slog.LevelDebug})
	r := newRegistry(t, bgjob.Config{Telemetry: bgjob.NewSlogTelemetry(slog.New(h))})
	s, _ := r.Start(ctxT(t), bgjob.Spec{Command: "echo SECRET; exit 3"})
	wait(t, r, s.ID)
	mu.Lock()
	out := buf.String()
	mu.Unlock()
	for _, want := range []string{"job started", "job finished", "level=WARN", "category=command", "exit_code=3", string(s.ID)} {
		if !strings.Contains(out, want) {
			t.Errorf("log lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "SECRET") {
		t.Errorf("the log holds job output:\n%s", out)
	}
}

type lockedWriter struct {
	w  *bytes.Buffer
	mu *sync.Mutex
}

func (l *lockedWriter) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(p)
}

// A secret whose line straddles the head/tail boundary or a Read chunk's
// edge is never shown in pieces that the Redactor cannot recognise.
func TestRedactorSecretsAcrossBoundaries(t *testing.T) {
	const key = "AKIAQWERTYUIOPASDFGH"
	halves := []string{key[:10], key[10:]}
	noHalf := func(where, s string) {
		t.Helper()
		for _, h := range halves {
			if strings.Contains(s, h) {
				t.Errorf("%s holds %q, half of the key: %q", where, h, s)
			}
		}
	}
	r := newRegistry(t, bgjob.Config{Admitter: bgjob.Redactor{}, HeadBytes: 64, TailBytes: 256})
	// Line 2 crosses byte 64, the head's end; the last key line crosses
	// the tail's start (256 bytes before the end).
	tailLine := "key " + key + "\n"
	filler := strings.Repeat("y", 256-len(tailLine)/2-1)
	cmd := fmt.Sprintf("printf '%%s\\n' %s 'id %s here'; for i in $(seq 50); do echo filler-line-$i; done; printf 'key %s\\n%s\\n'",
		strings.Repeat("x", 50), key, key, filler)
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: cmd})
	if err != nil {
		t.Fatal(err)
	}
	s = wait(t, r, s.ID)
	if s.Output.Omitted == 0 {
		t.Fatalf("nothing omitted: %q", s.Output.Text)
	}
	noHalf("Text", s.Output.Text)
	for off := int64(0); ; {
		c, err := r.Read(s.ID, off, 7)
		if err != nil {
			t.Fatal(err)
		}
		noHalf(fmt.Sprintf("Read(%d)", off), c.Data)
		if c.Done {
			break
		}
		off = c.Next
	}

	// While running: a chunk edge inside the key's line.
	s, err = r.Start(ctxT(t), bgjob.Spec{Command: "echo 'deploy " + key + " now'; sleep 300"})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r, s.ID, "[REDACTED:aws-key]", 1)
	c, err := r.Read(s.ID, 0, 12) // 12 bytes end inside the key
	if err != nil {
		t.Fatal(err)
	}
	if c.Data != "deploy [REDACTED:aws-key] now\n" {
		t.Errorf("Read(0, 12) = %q; want the whole line, redacted", c.Data)
	}
	noHalf("running Read", c.Data)
}
