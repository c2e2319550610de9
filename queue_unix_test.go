//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// blocker is a job that holds a slot until it is cancelled.
func blocker(t *testing.T, r *bgjob.Registry) bgjob.Snapshot {
	t.Helper()
	s, err := r.Start(ctxT(t), helperSpec("sleep", "300000", t.Name()))
	if err != nil {
		t.Fatal(err)
	}
	if s.State != bgjob.Running {
		t.Fatalf("blocker: %v; want running", s.State)
	}
	return s
}

// queued launches a job of the given priority that prints its name, and
// checks that it is queued.
func queued(t *testing.T, r *bgjob.Registry, name string, prio int) bgjob.Snapshot {
	t.Helper()
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo " + name, Priority: prio})
	if err != nil {
		t.Fatalf("Start %s: %v", name, err)
	}
	if s.State != bgjob.Queued || s.PID != 0 || s.ExitCode != -1 || s.QueuePosition == 0 {
		t.Fatalf("%s: %v pid %d exit %d place %d; want queued, no process, -1, a place", name, s.State, s.PID, s.ExitCode, s.QueuePosition)
	}
	return s
}

// startOrder returns the commands of the jobs Telemetry saw start, in
// order.
func (tr *telemetryRecorder) startOrder(byID map[bgjob.ID]string) []string {
	tr.mu.Lock()
	defer tr.mu.Unlock()
	var out []string
	for _, e := range tr.started {
		if name, ok := byID[e.ID]; ok {
			out = append(out, name)
		}
	}
	return out
}

// Launches beyond MaxRunning wait in the queue and start by priority,
// then by arrival; Status tells each its place, and the place moves up.
func TestQueueOrder(t *testing.T) {
	tr := &telemetryRecorder{}
	r := newRegistry(t, bgjob.Config{MaxRunning: 1, Queue: true, Telemetry: tr})
	b := blocker(t, r)
	launches := []struct {
		name string
		prio int
	}{{"a", 0}, {"b", 0}, {"c", 5}, {"d", -1}, {"e", 5}, {"f", 0}}
	byID := map[bgjob.ID]string{}
	for _, l := range launches {
		byID[queued(t, r, l.name, l.prio).ID] = l.name
	}
	want := []string{"c", "e", "a", "b", "f", "d"}
	for id, name := range byID {
		s, err := r.Status(id)
		if err != nil {
			t.Fatal(err)
		}
		if place := slices.Index(want, name) + 1; s.State != bgjob.Queued || s.QueuePosition != place {
			t.Errorf("%s: %v at place %d; want queued at %d", name, s.State, s.QueuePosition, place)
		}
	}
	if n := r.Running(); n != 1 {
		t.Errorf("Running() = %d; want 1 (queued jobs do not count)", n)
	}
	// List shows them, queued, with their places.
	var places []string
	for _, s := range r.List("") {
		if s.State == bgjob.Queued {
			places = append(places, fmt.Sprintf("%s@%d", byID[s.ID], s.QueuePosition))
		}
	}
	if len(places) != len(want) {
		t.Errorf("List: queued %v; want %d", places, len(want))
	}
	r.Cancel(b.ID)
	for id, name := range byID {
		if s := wait(t, r, id); s.State != bgjob.Exited || s.ExitCode != 0 || s.Output.Text != name+"\n" {
			t.Errorf("%s: %v %d %q; want exited 0 %q", name, s.State, s.ExitCode, s.Output.Text, name+"\n")
		}
	}
	if got := tr.startOrder(byID); !slices.Equal(got, want) {
		t.Errorf("start order %v; want %v", got, want)
	}
}

// A slot that frees starts the next queued job as part of the end of the
// job that held it: once Wait on that job returns, the queued job has
// left the queue. No timer or poll stands between the two. A queued job
// that fails to spawn frees its slot the same way.
func TestQueueStartsWhenASlotFrees(t *testing.T) {
	for _, how := range []string{"cancel", "exit", "spawn-failure"} {
		t.Run(how, func(t *testing.T) {
			r := newRegistry(t, bgjob.Config{MaxRunning: 1, Queue: true})
			var first bgjob.Snapshot
			if how == "exit" {
				var err error
				if first, err = r.Start(ctxT(t), helperSpec("sleep", "200")); err != nil {
					t.Fatal(err)
				}
			} else {
				first = blocker(t, r)
			}
			freed := first.ID
			if how == "spawn-failure" {
				// Its Dir goes while it waits: its spawn fails, and the
				// slot it got goes on to the next.
				dir := t.TempDir()
				bad, err := r.Start(ctxT(t), bgjob.Spec{Command: "true", Dir: dir})
				if err != nil || bad.State != bgjob.Queued {
					t.Fatalf("Start: %v %v; want queued", bad.State, err)
				}
				if err := os.Remove(dir); err != nil {
					t.Fatal(err)
				}
				freed = bad.ID
			}
			q := queued(t, r, "next", 0)
			if how != "exit" {
				r.Cancel(first.ID)
			}
			s := wait(t, r, freed)
			if how == "spawn-failure" && (s.State != bgjob.Failed || s.Err() == nil) {
				t.Errorf("queued job whose Dir went: %v %q; want failed to spawn", s.State, s.Reason)
			}
			if s, err := r.Status(q.ID); err != nil || s.State == bgjob.Queued {
				t.Fatalf("once the slot's job ended: %v %v; want the queued job started", s.State, err)
			}
			if s := wait(t, r, q.ID); s.State != bgjob.Exited || s.Output.Text != "next\n" {
				t.Errorf("got %v %q; want exited %q", s.State, s.Output.Text, "next\n")
			}
		})
	}
}

// Cancel takes a job out of the queue: it ends Cancelled, having never
// run, and the jobs behind it move up.
func TestQueueCancel(t *testing.T) {
	tr := &telemetryRecorder{}
	var mu sync.Mutex
	var completions []bgjob.Completion
	r := newRegistry(t, bgjob.Config{MaxRunning: 1, Queue: true, Telemetry: tr, OnComplete: func(c bgjob.Completion) {
		mu.Lock()
		completions = append(completions, c)
		mu.Unlock()
	}})
	b := blocker(t, r)
	x := queued(t, r, "x", 0)
	y := queued(t, r, "y", 0)
	s, err := r.Cancel(x.ID)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != bgjob.Cancelled || s.ExitCode != 130 || s.PID != 0 || s.Reason != "cancelled while queued" || s.Err() != nil {
		t.Errorf("cancelled queued job: %v %d pid %d %q err %v; want cancelled, 130, no process, %q, no error",
			s.State, s.ExitCode, s.PID, s.Reason, s.Err(), "cancelled while queued")
	}
	if s, _ := r.Status(y.ID); s.QueuePosition != 1 {
		t.Errorf("the job behind it is at place %d; want 1", s.QueuePosition)
	}
	r.Cancel(b.ID)
	wait(t, r, y.ID)
	tr.mu.Lock()
	for _, e := range tr.started {
		if e.ID == x.ID {
			t.Errorf("JobStarted for the job cancelled while queued")
		}
	}
	var fin []bgjob.Event
	for _, e := range tr.finished {
		if e.ID == x.ID {
			fin = append(fin, e)
		}
	}
	tr.mu.Unlock()
	if len(fin) != 1 || fin[0].Category != bgjob.CategoryCancelled {
		t.Errorf("JobFinished for it: %+v; want one, cancelled", fin)
	}
	if cs := r.Completions(""); !slices.ContainsFunc(cs, func(c bgjob.Completion) bool { return c.ID == x.ID && c.State == bgjob.Cancelled }) {
		t.Errorf("completions %+v; want the cancelled queued job's", cs)
	}
}

// An identical launch joins a queued job, as it joins a running one;
// one of another priority too.
func TestQueueJoin(t *testing.T) {
	r := newRegistry(t, bgjob.Config{MaxRunning: 1, Queue: true})
	b := blocker(t, r)
	q := queued(t, r, "same", 0)
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo same", Priority: 9})
	if err != nil || !s.Joined || s.ID != q.ID || s.State != bgjob.Queued {
		t.Fatalf("second launch: %v joined %v id %s (first %s); want it joined to the queued job", err, s.Joined, s.ID, q.ID)
	}
	r.Cancel(b.ID)
	if s := wait(t, r, q.ID); s.State != bgjob.Exited {
		t.Errorf("got %v; want exited", s.State)
	}
}

// MaxQueued bounds the queue: past it, ErrTooManyRunning as without a
// queue; without Queue, a launch past MaxRunning fails as before.
func TestQueueMaxQueued(t *testing.T) {
	r := newRegistry(t, bgjob.Config{MaxRunning: 1, Queue: true, MaxQueued: 2})
	blocker(t, r)
	queued(t, r, "one", 0)
	queued(t, r, "two", 0)
	_, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo three"})
	mustErr(t, err, bgjob.ErrTooManyRunning)
	if !strings.Contains(err.Error(), "MaxQueued 2") {
		t.Errorf("error %q; want it to name MaxQueued", err)
	}
	_, err = r.RunForeground(ctxT(t), bgjob.Spec{Command: "echo three"}, bgjob.Foreground{})
	mustErr(t, err, bgjob.ErrTooManyRunning)

	off := newRegistry(t, bgjob.Config{MaxRunning: 1})
	blocker(t, off)
	_, err = off.Start(ctxT(t), bgjob.Spec{Command: "echo no queue"})
	mustErr(t, err, bgjob.ErrTooManyRunning)

	_, err = bgjob.New(bgjob.Config{MaxQueued: -1})
	mustErr(t, err, bgjob.ErrInvalidConfig)
}

// RunForeground counts the time in the queue against its soft cap: at the
// cap it detaches with the job still queued; a job that gets its slot
// within the cap runs, and the call returns its result.
func TestQueueRunForeground(t *testing.T) {
	r := newRegistry(t, bgjob.Config{MaxRunning: 1, Queue: true})
	b := blocker(t, r)
	begin := time.Now()
	res, err := r.RunForeground(ctxT(t), bgjob.Spec{Command: "echo late"}, bgjob.Foreground{SoftCap: 300 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if !res.Detached || res.State != bgjob.Queued || res.QueuePosition != 1 {
		t.Fatalf("got detached %v %v at place %d; want detached, queued, 1", res.Detached, res.State, res.QueuePosition)
	}
	if d := time.Since(begin); d < 300*time.Millisecond {
		t.Errorf("returned after %v; want the soft cap, 300ms", d)
	}
	r.Cancel(b.ID)
	if s := wait(t, r, res.ID); s.State != bgjob.Exited || s.Output.Text != "late\n" {
		t.Errorf("detached queued job: %v %q; want exited %q", s.State, s.Output.Text, "late\n")
	}

	// A slot that frees within the soft cap: the result is inline.
	first, err := r.Start(ctxT(t), helperSpec("sleep", "200"))
	if err != nil {
		t.Fatal(err)
	}
	res, err = r.RunForeground(ctxT(t), bgjob.Spec{Command: "echo inline"}, bgjob.Foreground{SoftCap: deadline})
	if err != nil {
		t.Fatal(err)
	}
	if res.Detached || res.State != bgjob.Exited || res.Output.Text != "inline\n" {
		t.Errorf("got detached %v %v %q; want the inline result", res.Detached, res.State, res.Output.Text)
	}
	wait(t, r, first.ID)

	// A ctx that ends while queued detaches too; the job stays queued.
	b = blocker(t, r)
	ctx, cancel := context.WithCancel(ctxT(t))
	go cancel()
	res, err = r.RunForeground(ctx, bgjob.Spec{Command: "echo ctx"}, bgjob.Foreground{SoftCap: deadline})
	if err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if err == nil && (!res.Detached || res.State != bgjob.Queued) {
		t.Errorf("ctx ended: detached %v %v; want detached and queued", res.Detached, res.State)
	}
	r.Cancel(b.ID)
}

// A queued job's Timeout counts from its start, not from its launch:
// an hour in the queue (by the registry's clock) does not time it out.
func TestQueueTimeoutCountsFromStart(t *testing.T) {
	r := newRegistry(t, bgjob.Config{MaxRunning: 1, Queue: true})
	clock := &fakeClock{now: time.Now()}
	bgjob.SetClock(r, clock.Now)
	b := blocker(t, r)
	q, err := r.Start(ctxT(t), bgjob.Spec{Command: "echo on time", Timeout: time.Minute})
	if err != nil || q.State != bgjob.Queued {
		t.Fatalf("Start: %v %v; want queued", q.State, err)
	}
	clock.advance(r, time.Hour)
	r.Cancel(b.ID)
	s := wait(t, r, q.ID)
	if s.State != bgjob.Exited || s.Output.Text != "on time\n" {
		t.Errorf("got %v %q; want exited %q", s.State, s.Output.Text, "on time\n")
	}
	if !s.Started.Equal(clock.Now()) || !s.Started.After(q.Started) {
		t.Errorf("started %v (queued %v); want the time it left the queue, %v", s.Started, q.Started, clock.Now())
	}
}

// Close cancels the whole queue: every queued job ends Cancelled, with a
// completion, and nothing of the registry is left (goleak, TestMain).
func TestQueueClose(t *testing.T) {
	r, err := bgjob.New(bgjob.Config{MaxRunning: 2, Queue: true, MaxQueued: 100, Retention: bgjob.Retention{MaxJobs: 1000}})
	if err != nil {
		t.Fatal(err)
	}
	var ids []bgjob.ID
	for i := range 2 {
		s, err := r.Start(ctxT(t), helperSpec("sleep", "300000", fmt.Sprint(i)))
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	for i := range 100 {
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("echo %d", i), Priority: i % 3})
		if err != nil || s.State != bgjob.Queued {
			t.Fatalf("launch %d: %v %v; want queued", i, s.State, err)
		}
		ids = append(ids, s.ID)
	}
	_, err = r.Start(ctxT(t), bgjob.Spec{Command: "echo one too many"})
	mustErr(t, err, bgjob.ErrTooManyRunning)
	if err := r.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for i, id := range ids {
		s, err := r.Status(id)
		if err != nil {
			t.Fatal(err)
		}
		want := "registry closed while queued"
		if i < 2 {
			want = "registry closed"
		}
		if s.State != bgjob.Cancelled || s.Reason != want {
			t.Errorf("job %d: %v %q; want cancelled, %q", i, s.State, s.Reason, want)
		}
	}
	if n := len(r.Completions("")); n != len(ids) {
		t.Errorf("%d completions; want %d", n, len(ids))
	}
	if _, err := r.Start(ctxT(t), bgjob.Spec{Command: "true"}); !errors.Is(err, bgjob.ErrClosed) {
		t.Errorf("Start after Close: %v; want ErrClosed", err)
	}
}
