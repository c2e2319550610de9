package fleet

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// TestDurableWorkerAdopts: a worker in durable mode detaches (a restart
// of its host) while one job runs and another is about to end; a worker
// of the same name on the same StateDir adopts both: the running one is
// served again (same process, its output published on from where it
// was), the other gets its real end, and each completion comes once.
func TestDurableWorkerAdopts(t *testing.T) {
	l := testLayout(t, "durable")
	dir := t.TempDir()
	name := "dur-" + nonce()[:6]
	wcfg := WorkerConfig{Layout: l, Name: name, Heartbeat: 250 * time.Millisecond, HeartbeatTTL: 10 * time.Second, Logger: testLogger()}
	reg1, err := bgjob.New(bgjob.Config{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	w1, err := NewWorker(connect(t, testCluster.urls[0]), reg1, wcfg)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, testCluster.urls[1], ClientConfig{Layout: l})
	ctx := deadline(t, time.Minute)
	gate, gate2 := t.TempDir()+"/gate", t.TempDir()+"/gate2"
	a, err := c.Start(ctx, bgjob.Spec{Command: "echo a; while [ ! -e " + gate + " ]; do sleep 0.05; done; echo b", Session: "d"})
	if err != nil {
		t.Fatal(err)
	}
	b, err := c.Start(ctx, bgjob.Spec{Command: "echo x; while [ ! -e " + gate2 + " ]; do sleep 0.05; done; exit 3", Session: "d"})
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, ctx, c, a.ID, "a\n")
	readUntil(t, ctx, c, b.ID, "x\n")
	if err := w1.Detach(); err != nil {
		t.Fatal(err)
	}
	if err := reg1.Detach(); err != nil {
		t.Fatal(err)
	}
	// b may end before or after the restart: its end is its own either way.
	if err := os.WriteFile(gate2, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	reg2, err := bgjob.New(bgjob.Config{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	w2, err := NewWorker(connect(t, testCluster.urls[2]), reg2, wcfg)
	if err != nil {
		reg2.Close(context.Background())
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w2.Close(context.Background())
		reg2.Close(context.Background())
	})
	st, err := c.Status(a.ID)
	if err != nil || st.State != bgjob.Running || st.PID != a.PID || st.Output.Text != "a\n" {
		t.Fatalf("status after the restart: %v pid %d %q, %v; want running, pid %d, \"a\\n\"", st.State, st.PID, st.Output.Text, err, a.PID)
	}
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	fa, err := c.Wait(ctx, a.ID)
	if err != nil || fa.State != bgjob.Exited || fa.ExitCode != 0 || fa.Output.Text != "a\nb\n" {
		t.Fatalf("a's end: %v %d %q, %v; want exited 0, \"a\\nb\\n\"", fa.State, fa.ExitCode, fa.Output.Text, err)
	}
	if ch, err := c.Read(a.ID, 0, 100); err != nil || ch.Data != "a\nb\n" || !ch.Done || ch.Skipped != 0 {
		t.Fatalf("a's published output: %+v, %v; want all of it, from both workers", ch, err)
	}
	fb, err := c.Wait(ctx, b.ID)
	if err != nil || fb.State != bgjob.Exited || fb.ExitCode != 3 {
		t.Fatalf("b's end: %v %d (%s), %v; want exited 3", fb.State, fb.ExitCode, fb.Reason, err)
	}
	seen := map[bgjob.ID]int{}
	for range 2 {
		comp, err := c.NextCompletion(ctx, "d")
		if err != nil {
			t.Fatal(err)
		}
		seen[comp.ID]++
	}
	if seen[a.ID] != 1 || seen[b.ID] != 1 {
		t.Fatalf("completions: %v; want a and b once", seen)
	}
	if more := c.Completions("d"); len(more) != 0 {
		t.Fatalf("more completions: %+v", more)
	}
}

// TestRestartedWorkerReportsLost: a worker restarted under its name with
// a Registry that does not hold its jobs (not durable) records them lost
// at once, without waiting for its old heartbeat to expire, which its
// new one would have kept alive forever.
func TestRestartedWorkerReportsLost(t *testing.T) {
	l := testLayout(t, "restart")
	name := "re-" + nonce()[:6]
	wcfg := WorkerConfig{Layout: l, Name: name, Heartbeat: 250 * time.Millisecond, HeartbeatTTL: time.Hour, Logger: testLogger()}
	reg1, err := bgjob.New(bgjob.Config{KillGrace: 100 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	w1, err := NewWorker(connect(t, testCluster.urls[0]), reg1, wcfg)
	if err != nil {
		t.Fatal(err)
	}
	c := newClient(t, testCluster.urls[1], ClientConfig{Layout: l})
	ctx := deadline(t, time.Minute)
	s, err := c.Start(ctx, bgjob.Spec{Command: "echo up; sleep 60", Session: "r"})
	if err != nil {
		t.Fatal(err)
	}
	readUntil(t, ctx, c, s.ID, "up\n")
	w1.Detach()
	reg1.Close(ctx) // the job goes with its host
	reg2, err := bgjob.New(bgjob.Config{})
	if err != nil {
		t.Fatal(err)
	}
	w2, err := NewWorker(connect(t, testCluster.urls[2]), reg2, wcfg)
	if err != nil {
		reg2.Close(ctx)
		t.Fatal(err)
	}
	t.Cleanup(func() {
		w2.Close(context.Background())
		reg2.Close(context.Background())
	})
	f, err := c.Wait(ctx, s.ID)
	if err != nil || f.State != bgjob.Failed || f.Reason != reasonLost {
		t.Fatalf("the job of the restarted worker: %v %q, %v; want failed, %q", f.State, f.Reason, err, reasonLost)
	}
	comp, err := c.NextCompletion(ctx, "r")
	if err != nil || comp.ID != s.ID || comp.State != bgjob.Failed {
		t.Fatalf("completion: %+v, %v", comp, err)
	}
}
