package bgjob

import (
	"context"
	"testing"
	"time"
)

// TestWithoutPidfdWait runs jobs as on a kernel whose waitid does not
// take P_PIDFD (before Linux 5.4): no job may mistake that for its shell's
// exit. They go the other way, with a waiter goroutine blocked in
// waitid(P_PID), and end as on any other kernel.
func TestWithoutPidfdWait(t *testing.T) {
	old := pidfdWaits.Load()
	pidfdWaits.Store(2)
	defer pidfdWaits.Store(old)

	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err := New(Config{KillGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	defer func() {
		if err := r.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	}()

	res, err := r.RunForeground(ctx, Spec{Command: "echo hi; sleep 0.2; exit 3"}, Foreground{})
	if err != nil || res.State != Exited || res.ExitCode != 3 || res.Output.Text != "hi\n" {
		t.Errorf("got %v %d %q %v; want exited 3 with hi", res.State, res.ExitCode, res.Output.Text, err)
	}
	res, err = r.RunForeground(ctx, Spec{Command: "echo start; sleep 300", Timeout: 300 * time.Millisecond}, Foreground{})
	if err != nil || res.State != TimedOut || res.Output.Text != "start\n" {
		t.Errorf("got %v %q %v; want timed out after start", res.State, res.Output.Text, err)
	}
	s, err := r.Start(ctx, Spec{Command: "sleep 300 & sleep 300; wait"})
	if err != nil {
		t.Fatal(err)
	}
	if s, err = r.Cancel(s.ID); err != nil || s.State != Cancelled {
		t.Errorf("Cancel: %v %v; want cancelled", s.State, err)
	}
}
