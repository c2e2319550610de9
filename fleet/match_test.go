package fleet

import (
	"context"
	"errors"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// TestMatches: the matches of a job's watches reach a client on another
// node through the fleet: a line printed at once (before the worker
// knows the job's Registry ID), every match of an Every watch in the
// order of the lines, their text as the worker's Admitter admitted it,
// each delivered once; a scoped client of another session gets none;
// a feed serves one worker at a time.
func TestMatches(t *testing.T) {
	l := testLayout(t, "match")
	redact := bgjob.AdmitterFunc(func(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
		return bgjob.Admitted{Text: strings.ReplaceAll(req.Text, "secret", "[redacted]")}, nil
	})
	newWorker(t, testCluster.urls[1], l, 4, bgjob.Config{Admitter: redact})
	c := newClient(t, testCluster.urls[0], ClientConfig{Layout: l})
	bob := newClient(t, testCluster.urls[2], ClientConfig{Layout: l, Scoped: true, Session: "bob"})
	ctx := deadline(t, time.Minute)

	s, err := c.Start(ctx, bgjob.Spec{Command: "echo ready secret; for i in 1 2 3; do echo tick $i; done", Session: "alice",
		Watches: []bgjob.Watch{
			{Name: "ready", Pattern: regexp.MustCompile(`^ready`)},
			{Name: "tick", Pattern: regexp.MustCompile(`^tick \d`), Every: true},
		}})
	if err != nil {
		t.Fatal(err)
	}
	var got []bgjob.Match
	for len(got) < 4 {
		m, err := c.NextMatch(ctx, "alice")
		if err != nil {
			t.Fatalf("next match after %d: %v", len(got), err)
		}
		got = append(got, m)
	}
	want := []struct {
		watch, line string
		offset      int64
	}{{"ready", "ready [redacted]", 0}, {"tick", "tick 1", 13}, {"tick", "tick 2", 20}, {"tick", "tick 3", 27}}
	for i, m := range got {
		if m.ID != s.ID || m.Session != "alice" || m.Watch != want[i].watch || m.Line != want[i].line || m.Offset != want[i].offset || m.At.IsZero() {
			t.Errorf("match %d: %+v; want %s %q at %d of %s", i, m, want[i].watch, want[i].line, want[i].offset, s.ID)
		}
	}
	if _, err := c.Wait(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	// Delivered once: nothing is left for anyone.
	other := newClient(t, testCluster.urls[2], ClientConfig{Layout: l})
	if ms := other.Matches("alice"); len(ms) != 0 || other.Err() != nil {
		t.Errorf("matches again: %+v, %v; want none", ms, other.Err())
	}
	// A scoped client of another session sees none of alice's, and its
	// own session's queue is empty.
	s2, err := c.Start(ctx, bgjob.Spec{Command: "echo found", Session: "alice", Watches: []bgjob.Watch{{Name: "f", Pattern: regexp.MustCompile("found")}}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Wait(ctx, s2.ID); err != nil {
		t.Fatal(err)
	}
	if ms := bob.Matches("alice"); ms != nil {
		t.Errorf("bob's matches of alice: %+v; want none", ms)
	}
	short, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	if m, err := bob.NextMatch(short, "bob"); !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("bob's next match: %+v, %v; want none until the deadline", m, err)
	}
	cancel()
	if m, err := c.NextMatch(ctx, "alice"); err != nil || m.ID != s2.ID || m.Line != "found" {
		t.Errorf("alice's match after bob looked: %+v, %v; want \"found\" of %s", m, err, s2.ID)
	}
	c.Close(ctx)
	if _, err := c.NextMatch(ctx, "alice"); !errors.Is(err, bgjob.ErrClosed) {
		t.Errorf("next match after Close: %v; want ErrClosed", err)
	}
}

// TestMatchFeedOneWorker: a MatchFeed serves one live worker; Close lets
// go of it for the next.
func TestMatchFeedOneWorker(t *testing.T) {
	l := testLayout(t, "feed")
	reg, err := bgjob.New(bgjob.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(context.Background())
	feed := new(MatchFeed)
	nc := connect(t, testCluster.urls[0])
	w1, err := NewWorker(nc, reg, WorkerConfig{Layout: l, Matches: feed})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := NewWorker(nc, reg, WorkerConfig{Layout: l, Matches: feed}); !errors.Is(err, errInvalidConfig) {
		t.Errorf("a second worker on the feed: %v; want it refused", err)
	}
	if err := w1.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	w2, err := NewWorker(nc, reg, WorkerConfig{Layout: l, Matches: feed})
	if err != nil {
		t.Fatalf("a worker on the feed after Close: %v", err)
	}
	w2.Close(context.Background())
}
