package fleet

import (
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

func TestSmoke(t *testing.T) {
	l := testLayout(t, "p")
	newWorker(t, testCluster.urls[0], l, 4, bgjob.Config{})
	c := newClient(t, testCluster.urls[1], ClientConfig{Layout: l})
	ctx := deadline(t, 30*time.Second)
	t0 := time.Now()
	s, err := c.Start(ctx, bgjob.Spec{Command: "echo hello; sleep 0.2; echo bye", Session: "s1"})
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("started %s pid %d in %v", s.ID, s.PID, time.Since(t0))
	ch, err := c.ReadWait(ctx, s.ID, 0, 100)
	t.Logf("readwait: %+v %v", ch, err)
	f, err := c.Wait(ctx, s.ID)
	if err != nil || f.State != bgjob.Exited || f.ExitCode != 0 || f.Output.Text != "hello\nbye\n" {
		t.Fatalf("wait: %+v, %v", f, err)
	}
	comp, err := c.NextCompletion(ctx, "s1")
	t.Logf("completion %+v %v", comp, err)
	ch, err = c.Read(s.ID, 0, 100)
	t.Logf("read after end: %+v %v", ch, err)
	res, err := c.RunForeground(ctx, bgjob.Spec{Command: "echo fg", Session: "s1"}, bgjob.Foreground{})
	t.Logf("fg: %+v %v", res, err)
	t.Logf("list: %d, completions %v", len(c.List("s1")), c.Completions("s1"))
}
