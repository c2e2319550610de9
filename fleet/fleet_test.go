package fleet

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// jobCount is how many jobs TestManyJobs runs: BGJOB_FLEET_JOBS, or 1,000.
func jobCount(t *testing.T) int {
	if s := os.Getenv("BGJOB_FLEET_JOBS"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n <= 0 {
			t.Fatalf("BGJOB_FLEET_JOBS=%q: want a positive number", s)
		}
		return n
	}
	return 1000
}

// TestManyJobs runs many jobs through three workers, one on each node,
// from three clients, one on each node: every job's output and exit code
// are right, each completion comes once, and every worker ran some.
func TestManyJobs(t *testing.T) {
	n := jobCount(t)
	l := testLayout(t, "many")
	workers := map[string]bool{}
	for i := range 3 {
		w, _ := newWorker(t, testCluster.urls[i], l, 16, bgjob.Config{MaxRunning: 32, Retention: bgjob.Retention{MaxJobs: 256}})
		workers[w.Name()] = true
	}
	var clients []*Client
	for i := range 3 {
		clients = append(clients, newClient(t, testCluster.urls[i], ClientConfig{Layout: l}))
	}
	// 14s under -race on 2 busy cores; the deadline only turns a lost
	// job into a failure that says which, instead of a hang.
	ctx := deadline(t, 3*time.Minute)
	const session = "many"
	begin := time.Now()

	// Completions are taken by a reader on each client while the jobs
	// run; together they must see each job once.
	var mu sync.Mutex
	seen := map[bgjob.ID]int{}
	got := make(chan struct{}, n)
	rctx, stopReaders := context.WithCancel(ctx)
	var readers sync.WaitGroup
	for _, c := range clients {
		readers.Add(1)
		go func() {
			defer readers.Done()
			for {
				comp, err := c.NextCompletion(rctx, session)
				if err != nil {
					return
				}
				mu.Lock()
				seen[comp.ID]++
				mu.Unlock()
				if comp.State != bgjob.Exited || comp.ExitCode != 7 {
					t.Errorf("completion %s: %s %d; want exited 7", comp.ID, comp.State, comp.ExitCode)
				}
				got <- struct{}{}
			}
		}()
	}

	ids := make([]bgjob.ID, n)
	sem := make(chan struct{}, 48)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		sem <- struct{}{}
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			c := clients[i%3]
			s, err := c.Start(ctx, bgjob.Spec{Command: fmt.Sprintf("echo job %d; exit 7", i), Session: session})
			if err != nil {
				t.Errorf("start %d: %v", i, err)
				return
			}
			ids[i] = s.ID
		}()
	}
	wg.Wait()
	started := time.Since(begin)
	launched := 0
	for _, id := range ids {
		if id != "" {
			launched++
		}
	}
	for range launched {
		select {
		case <-got:
		case <-ctx.Done():
			mu.Lock()
			for i, id := range ids {
				if id != "" && seen[id] == 0 {
					_, rec, _, err := clients[0].find(context.Background(), "status", id)
					t.Errorf("job %d (%s): no completion; record %s %s worker %s reason %q, %v", i, id, rec.Phase, rec.Snap.State, rec.Worker, rec.Snap.Reason, err)
				}
			}
			t.Fatalf("%d of %d completions before the deadline", len(seen), launched)
			mu.Unlock()
		}
	}
	if launched != n {
		t.Fatalf("%d of %d launches started", launched, n)
	}
	elapsed := time.Since(begin)
	stopReaders()
	readers.Wait()
	for _, c := range clients {
		if extra := c.Completions(session); len(extra) != 0 {
			t.Errorf("completions after all were taken: %d more", len(extra))
		}
	}
	for i, id := range ids {
		if seen[id] != 1 {
			t.Errorf("job %d (%s): %d completions; want 1", i, id, seen[id])
		}
	}
	// Each result, read through a client other than the one that
	// started it (output served from the stream of its chunks).
	for i, id := range ids {
		c := clients[(i+1)%3]
		ch, err := c.Read(id, 0, 1024)
		if want := fmt.Sprintf("job %d\n", i); err != nil || ch.Data != want || !ch.Done {
			t.Fatalf("read job %d: %+v, %v; want %q, done", i, ch, err, want)
		}
		if i%50 == 0 {
			s, err := c.Status(id)
			if err != nil || s.State != bgjob.Exited || s.ExitCode != 7 || s.Output.Text != fmt.Sprintf("job %d\n", i) {
				t.Fatalf("status job %d: %+v, %v", i, s, err)
			}
		}
	}
	recs, err := clients[0].s.list(ctx, SessionToken(session)+".*")
	if err != nil {
		t.Fatal(err)
	}
	per := map[string]int{}
	for _, rec := range recs {
		per[rec.Worker]++
	}
	for w := range workers {
		if per[w] == 0 {
			t.Errorf("worker %s ran no job (%v)", w, per)
		}
	}
	t.Logf("%d jobs: all started in %v, all completed in %v (%.0f jobs/s); per worker %v", n, started.Round(time.Millisecond), elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds(), per)
}

// TestReadOnAnotherNode reads a running job's output through a client
// attached to one node while the job runs on a worker attached to
// another: ReadWait wakes on the output, Follow streams it to its end.
func TestReadOnAnotherNode(t *testing.T) {
	l := testLayout(t, "far")
	newWorker(t, testCluster.urls[2], l, 4, bgjob.Config{})
	c := newClient(t, testCluster.urls[0], ClientConfig{Layout: l})
	ctx := deadline(t, time.Minute)
	// The job prints a line, then waits for a file the test writes once
	// it has read that line, so the read is of a running job.
	gate := t.TempDir() + "/gate"
	s, err := c.Start(ctx, bgjob.Spec{Command: "echo first; while [ ! -e " + gate + " ]; do sleep 0.05; done; echo second", Session: "far"})
	if err != nil {
		t.Fatal(err)
	}
	ch, err := c.ReadWait(ctx, s.ID, 0, 1024)
	if err != nil || ch.Data != "first\n" || ch.Done {
		t.Fatalf("readwait: %+v, %v; want \"first\\n\", running", ch, err)
	}
	live, err := c.Status(s.ID)
	if err != nil || live.State != bgjob.Running || live.Output.Text != "first\n" || live.PID == 0 {
		t.Fatalf("status of the running job: %+v, %v", live, err)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	all, err := io.ReadAll(c.Follow(ctx, s.ID, ch.Next))
	if err != nil || string(all) != "second\n" {
		t.Fatalf("follow: %q, %v; want \"second\\n\"", all, err)
	}
	f, err := c.Wait(ctx, s.ID)
	if err != nil || f.State != bgjob.Exited || f.Output.Text != "first\nsecond\n" {
		t.Fatalf("wait: %+v, %v", f, err)
	}
}

// TestCoalesceAcrossClients launches one Spec from many goroutines of two
// clients on different nodes at once: one process, one ID, every other
// launch joined.
func TestCoalesceAcrossClients(t *testing.T) {
	l := testLayout(t, "co")
	_, reg1 := newWorker(t, testCluster.urls[0], l, 8, bgjob.Config{})
	_, reg2 := newWorker(t, testCluster.urls[1], l, 8, bgjob.Config{})
	a := newClient(t, testCluster.urls[1], ClientConfig{Layout: l})
	b := newClient(t, testCluster.urls[2], ClientConfig{Layout: l})
	ctx := deadline(t, time.Minute)
	gate := t.TempDir() + "/gate"
	spec := bgjob.Spec{Command: "while [ ! -e " + gate + " ]; do sleep 0.05; done; echo once", Session: "co"}
	const per = 20
	snaps := make(chan bgjob.Snapshot, 2*per)
	start := make(chan struct{})
	var wg sync.WaitGroup
	for i := range 2 * per {
		c := a
		if i%2 == 1 {
			c = b
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			s, err := c.Start(ctx, spec)
			if err != nil {
				t.Error(err)
				return
			}
			snaps <- s
		}()
	}
	close(start)
	wg.Wait()
	close(snaps)
	ids := map[bgjob.ID]bool{}
	launched := 0
	for s := range snaps {
		ids[s.ID] = true
		if !s.Joined {
			launched++
		}
	}
	if len(ids) != 1 || launched != 1 {
		t.Fatalf("%d IDs, %d launches not joined; want 1 and 1", len(ids), launched)
	}
	os.WriteFile(gate, nil, 0o600)
	var id bgjob.ID
	for id = range ids {
	}
	f, err := b.Wait(ctx, id)
	if err != nil || f.Output.Text != "once\n" {
		t.Fatalf("wait: %+v, %v", f, err)
	}
	if n := len(reg1.List("co")) + len(reg2.List("co")); n != 1 {
		t.Fatalf("the workers' Registries ran %d jobs; want 1", n)
	}
	comp, err := a.NextCompletion(ctx, "co")
	if err != nil || comp.ID != id {
		t.Fatalf("completion: %+v, %v", comp, err)
	}
	if more := b.Completions("co"); len(more) != 0 {
		t.Fatalf("%d more completions; want none", len(more))
	}
}

// TestSessionIsolation: a client scoped to one session neither reaches
// nor learns of another session's jobs, and a worker answers a request
// on one session's subject only for that session's jobs.
func TestSessionIsolation(t *testing.T) {
	l := testLayout(t, "iso")
	newWorker(t, testCluster.urls[0], l, 4, bgjob.Config{})
	alice := newClient(t, testCluster.urls[1], ClientConfig{Layout: l, Scoped: true, Session: "alice"})
	bob := newClient(t, testCluster.urls[2], ClientConfig{Layout: l, Scoped: true, Session: "bob"})
	ctx := deadline(t, time.Minute)
	gate := t.TempDir() + "/gate"
	spec := bgjob.Spec{Command: "echo secret; while [ ! -e " + gate + " ]; do sleep 0.05; done"}
	as, err := alice.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	bs, err := bob.Start(ctx, spec)
	if err != nil {
		t.Fatal(err)
	}
	if as.ID == bs.ID || as.Session != "alice" || bs.Session != "bob" {
		t.Fatalf("alice %s (%q), bob %s (%q): want distinct IDs in their sessions", as.ID, as.Session, bs.ID, bs.Session)
	}
	checks := map[string]error{}
	_, checks["status"] = bob.Status(as.ID)
	_, checks["read"] = bob.Read(as.ID, 0, 100)
	_, checks["readwait"] = bob.ReadWait(ctx, as.ID, 0, 100)
	_, checks["wait"] = bob.Wait(ctx, as.ID)
	_, checks["cancel"] = bob.Cancel(as.ID)
	for op, err := range checks {
		if !errors.Is(err, bgjob.ErrNotFound) {
			t.Errorf("bob's %s of alice's job: %v; want ErrNotFound", op, err)
		}
	}
	if l := bob.List("alice"); len(l) != 0 {
		t.Errorf("bob lists %d of alice's jobs", len(l))
	}
	if _, err := bob.Start(ctx, bgjob.Spec{Command: "true", Session: "alice"}); !errors.Is(err, bgjob.ErrInvalidSpec) {
		t.Errorf("bob starts in alice's session: %v; want ErrInvalidSpec", err)
	}
	// A request to alice's worker on bob's subject, naming alice's job.
	_, rec, _, err := alice.find(ctx, "status", as.ID)
	if err != nil {
		t.Fatal(err)
	}
	r, err := bob.ask(ctx, recordKey(SessionToken("bob"), string(as.ID)), rec, rpcRequest{Op: "read", Max: 100})
	if err != nil || !errors.Is(r.err(), bgjob.ErrNotFound) {
		t.Errorf("request on bob's subject for alice's job: %+v, %v; want not found", r, err)
	}
	os.WriteFile(gate, nil, 0o600)
	for _, c := range []*Client{alice, bob} {
		comp, err := c.NextCompletion(ctx, c.cfg.Session)
		if err != nil || comp.Session != c.cfg.Session {
			t.Errorf("%s's completion: %+v, %v", c.cfg.Session, comp, err)
		}
	}
	if got := bob.Completions("alice"); len(got) != 0 {
		t.Errorf("bob took %d of alice's completions", len(got))
	}
}

// TestCancel cancels a running job from a client on another node, and a
// queued job that no worker has taken.
func TestCancel(t *testing.T) {
	l := testLayout(t, "cancel")
	newWorker(t, testCluster.urls[0], l, 4, bgjob.Config{KillGrace: 200 * time.Millisecond})
	c := newClient(t, testCluster.urls[2], ClientConfig{Layout: l})
	ctx := deadline(t, time.Minute)
	s, err := c.Start(ctx, bgjob.Spec{Command: "echo up; sleep 60", Session: "c"})
	if err != nil {
		t.Fatal(err)
	}
	if ch, err := c.ReadWait(ctx, s.ID, 0, 10); err != nil || ch.Data != "up\n" {
		t.Fatalf("readwait: %+v, %v", ch, err)
	}
	f, err := c.Cancel(s.ID)
	if err != nil || f.State != bgjob.Cancelled || f.ExitCode != 130 {
		t.Fatalf("cancel: %+v, %v; want cancelled, 130", f, err)
	}
	if st, err := c.Status(s.ID); err != nil || st.State != bgjob.Cancelled {
		t.Fatalf("status after cancel: %+v, %v", st, err)
	}
	// A pool with no worker: the launch waits in the queue until ctx.
	idle := l
	idle.Pool = "nobody"
	q := newClient(t, testCluster.urls[1], ClientConfig{Layout: idle})
	sctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
	_, err = q.Start(sctx, bgjob.Spec{Command: "echo never", Session: "c"})
	cancel()
	if !errors.Is(err, ErrNoWorker) {
		t.Fatalf("start with no worker: %v; want ErrNoWorker", err)
	}
	comps := c.Completions("c")
	if len(comps) != 1 || comps[0].ID != s.ID || comps[0].State != bgjob.Cancelled {
		t.Fatalf("completions: %+v; want the cancelled job once", comps)
	}
}

// TestRunForeground: a short job returns inline and yields no completion;
// a long one detaches at the soft cap, stays pollable, and yields one.
func TestRunForeground(t *testing.T) {
	l := testLayout(t, "fg")
	newWorker(t, testCluster.urls[1], l, 4, bgjob.Config{})
	c := newClient(t, testCluster.urls[0], ClientConfig{Layout: l})
	ctx := deadline(t, time.Minute)
	res, err := c.RunForeground(ctx, bgjob.Spec{Command: "echo inline", Session: "f"}, bgjob.Foreground{SoftCap: 20 * time.Second})
	if err != nil || res.Detached || res.State != bgjob.Exited || res.Output.Text != "inline\n" {
		t.Fatalf("inline: %+v, %v", res, err)
	}
	if _, err := c.Status(res.ID); !errors.Is(err, bgjob.ErrNotFound) {
		t.Errorf("status of a job that ended inline: %v; want ErrNotFound", err)
	}
	gate := t.TempDir() + "/gate"
	var progress int
	res, err = c.RunForeground(ctx, bgjob.Spec{Command: "echo slow; while [ ! -e " + gate + " ]; do sleep 0.05; done", Session: "f"},
		bgjob.Foreground{SoftCap: 600 * time.Millisecond, Interval: 200 * time.Millisecond, OnProgress: func(s bgjob.Snapshot) {
			if s.State != bgjob.Running {
				t.Errorf("progress: %s", s.State)
			}
			progress++
		}})
	if err != nil || !res.Detached || res.State != bgjob.Running {
		t.Fatalf("detach: %+v, %v", res, err)
	}
	if progress == 0 {
		t.Errorf("no progress report in 600ms at a 200ms interval")
	}
	os.WriteFile(gate, nil, 0o600)
	comp, err := c.NextCompletion(ctx, "f")
	if err != nil || comp.ID != res.ID {
		t.Fatalf("completion: %+v, %v; want the detached job", comp, err)
	}
	if more := c.Completions("f"); len(more) != 0 {
		t.Fatalf("completions: %+v; want none more (the inline job yields none)", more)
	}
}

// TestRefusedLaunch: a worker's Registry refusal comes back to Start as
// the same error, and the ID is free again.
func TestRefusedLaunch(t *testing.T) {
	l := testLayout(t, "refuse")
	newWorker(t, testCluster.urls[0], l, 4, bgjob.Config{Guard: func(ctx context.Context, s bgjob.Spec) error {
		if strings.Contains(s.Command, "rm") {
			return errors.New("no rm")
		}
		return nil
	}})
	c := newClient(t, testCluster.urls[1], ClientConfig{Layout: l})
	ctx := deadline(t, time.Minute)
	if _, err := c.Start(ctx, bgjob.Spec{Command: "rm -rf /nothing"}); !errors.Is(err, bgjob.ErrRejected) {
		t.Fatalf("guarded launch: %v; want ErrRejected", err)
	}
	if _, err := c.Start(ctx, bgjob.Spec{Command: "true", Dir: "/no/such/dir"}); !errors.Is(err, bgjob.ErrInvalidSpec) {
		t.Fatalf("bad Dir: %v; want ErrInvalidSpec", err)
	}
	if _, err := c.Start(ctx, bgjob.Spec{}); !errors.Is(err, bgjob.ErrInvalidSpec) {
		t.Fatalf("empty spec: %v; want ErrInvalidSpec", err)
	}
}
