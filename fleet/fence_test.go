package fleet

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// TestFencedAfterPartition: a worker whose heartbeats stop (a partition
// from JetStream, by a test hook) while it runs a job is taken for dead:
// the reapers settle the job Failed, "worker lost", one completion. When
// its heartbeats come back, the worker learns it and stops the job (its
// process group, in its Registry), so nothing runs that the fleet
// reports ended; the end is not recorded twice. A job started after the
// gap is not touched.
func TestFencedAfterPartition(t *testing.T) {
	l := testLayout(t, "fence")
	reg, err := bgjob.New(bgjob.Config{KillGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	var muted atomic.Bool
	w, err := NewWorker(connect(t, testCluster.urls[1]), reg, WorkerConfig{Layout: l, Slots: 4,
		Heartbeat: 200 * time.Millisecond, HeartbeatTTL: 1500 * time.Millisecond, Logger: testLogger(), muteBeats: &muted})
	if err != nil {
		reg.Close(context.Background())
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if err := w.Close(ctx); err != nil {
			t.Errorf("worker close: %v", err)
		}
		reg.Close(ctx)
	})
	c := newClient(t, testCluster.urls[0], ClientConfig{Layout: l}) // its reaper, too, watches
	ctx := deadline(t, 2*time.Minute)
	s, err := c.Start(ctx, bgjob.Spec{Command: "echo started; sleep 120", Session: "f"})
	if err != nil {
		t.Fatal(err)
	}
	local := reg.List("f")
	if len(local) != 1 || local[0].State != bgjob.Running {
		t.Fatalf("the worker's Registry: %+v; want one running job", local)
	}
	muted.Store(true)
	final, err := c.Wait(ctx, s.ID) // woken when a reaper records the loss
	if err != nil || final.State != bgjob.Failed || final.Reason != reasonLost {
		t.Fatalf("wait during the partition: %+v, %v; want Failed, %q", final, err, reasonLost)
	}
	if snap, err := reg.Status(local[0].ID); err != nil || snap.State != bgjob.Running {
		t.Fatalf("the job while the worker is cut off: %+v, %v; want it still running (the case fencing is for)", snap, err)
	}
	muted.Store(false)
	ended, err := reg.Wait(ctx, local[0].ID)
	if err != nil || ended.State != bgjob.Cancelled {
		t.Fatalf("the job after the partition: %+v, %v; want it cancelled by the worker", ended, err)
	}
	comp, err := c.NextCompletion(ctx, "f")
	if err != nil || comp.ID != s.ID || comp.State != bgjob.Failed {
		t.Fatalf("completion: %+v, %v; want one, Failed", comp, err)
	}
	// The worker serves on: a new job runs to its end, recorded as such.
	s2, err := c.Start(ctx, bgjob.Spec{Command: "echo after; exit 3", Session: "f"})
	if err != nil {
		t.Fatal(err)
	}
	if f2, err := c.Wait(ctx, s2.ID); err != nil || f2.State != bgjob.Exited || f2.ExitCode != 3 {
		t.Fatalf("a job after the partition: %+v, %v; want exited 3", f2, err)
	}
	if rec, err := c.Status(s.ID); err != nil || rec.State != bgjob.Failed || rec.Reason != reasonLost {
		t.Errorf("the fenced job's record: %+v, %v; want still Failed, %q (its end not recorded again)", rec, err, reasonLost)
	}
	if comp, err := c.NextCompletion(ctx, "f"); err != nil || comp.ID != s2.ID {
		t.Errorf("next completion: %+v, %v; want the second job's (none again of the fenced one)", comp, err)
	}
	if more := c.Completions("f"); len(more) != 0 {
		t.Errorf("completions left: %+v; want none", more)
	}
}
