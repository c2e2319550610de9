package fleet

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// child is a worker running as a child process of the test binary.
type child struct {
	cmd    *exec.Cmd
	exited chan struct{} // closed when the child has exited and been reaped
	err    error         // its exit, once exited is closed
}

// startChild starts the test binary as a worker (childWorker) of pool l.Pool
// attached to url, and waits until it says it is ready.
func startChild(t *testing.T, url string, l Layout, name string, env ...string) *child {
	t.Helper()
	cmd := exec.Command(os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "BGJOB_FLEET_CHILD=worker", "BGJOB_FLEET_URL="+url,
		"BGJOB_FLEET_PREFIX="+l.Prefix, "BGJOB_FLEET_POOL="+l.Pool, "BGJOB_FLEET_NAME="+name)
	cmd.Env = append(cmd.Env, env...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	c := &child{cmd: cmd, exited: make(chan struct{})}
	ready := make(chan string, 1)
	go func() { // ends when the child's stdout closes, at its exit
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			select {
			case ready <- sc.Text():
			default:
			}
		}
		c.err = cmd.Wait()
		close(c.exited)
	}()
	t.Cleanup(func() {
		cmd.Process.Kill()
		<-c.exited
	})
	select {
	case line := <-ready:
		if !strings.HasPrefix(line, "ready") {
			t.Fatalf("child worker said %q", line)
		}
	case <-c.exited:
		t.Fatalf("child worker exited: %v", c.err)
	case <-time.After(time.Minute):
		t.Fatal("child worker not ready after a minute")
	}
	return c
}

// TestWorkerKilled: SIGKILL of the worker running a job makes the job
// Failed, "worker lost", with one completion, however many clients and
// workers watch; its output up to then stays readable.
func TestWorkerKilled(t *testing.T) {
	l := testLayout(t, "victim")
	ch := startChild(t, testCluster.urls[1], l, "victim")
	// Other workers (of another pool) and clients: each runs a reaper,
	// and all of them see the loss.
	others := l
	others.Pool = "others"
	newWorker(t, testCluster.urls[0], others, 4, bgjob.Config{})
	newWorker(t, testCluster.urls[2], others, 4, bgjob.Config{})
	c := newClient(t, testCluster.urls[2], ClientConfig{Layout: l})
	c2 := newClient(t, testCluster.urls[0], ClientConfig{Layout: l})
	ctx := deadline(t, time.Minute)
	s, err := c.Start(ctx, bgjob.Spec{Command: "echo started; sleep 60", Session: "k"})
	if err != nil {
		t.Fatal(err)
	}
	if out, err := c.ReadWait(ctx, s.ID, 0, 100); err != nil || out.Data != "started\n" {
		t.Fatalf("readwait: %+v, %v", out, err)
	}
	killed := time.Now()
	ch.cmd.Process.Kill()
	<-ch.exited
	comp, err := c.NextCompletion(ctx, "k")
	if err != nil || comp.ID != s.ID || comp.State != bgjob.Failed || comp.ExitCode != -1 {
		t.Fatalf("completion: %+v, %v; want %s failed", comp, err, s.ID)
	}
	t.Logf("lost after %v", time.Since(killed).Round(time.Millisecond))
	st, err := c2.Status(s.ID)
	if err != nil || st.State != bgjob.Failed || st.Reason != reasonLost || st.PID != s.PID || st.Ended.IsZero() {
		t.Fatalf("status: %+v, %v; want failed, %q, pid %d", st, err, reasonLost, s.PID)
	}
	if out, err := c2.Read(s.ID, 0, 100); err != nil || out.Data != "started\n" || !out.Done {
		t.Fatalf("read of the lost job: %+v, %v", out, err)
	}
	if more := c2.Completions("k"); len(more) != 0 {
		t.Fatalf("more completions: %+v", more)
	}
	// Nothing else comes: the reapers of the four others record the
	// loss once between them.
	wctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	if more, err := c.NextCompletion(wctx, "k"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("a second completion: %+v, %v", more, err)
	}
}

// TestLostBeforeStart: a worker that dies after claiming a launch and
// before starting it: by default the launch ends Failed, "worker lost"
// (at most once); with ClientConfig.Rerun another worker runs it.
func TestLostBeforeStart(t *testing.T) {
	for _, rerun := range []bool{false, true} {
		t.Run(fmt.Sprintf("rerun=%v", rerun), func(t *testing.T) {
			l := testLayout(t, "claim")
			ch := startChild(t, testCluster.urls[0], l, "claimer", "BGJOB_FLEET_DIE_AFTER_CLAIM=1")
			c := newClient(t, testCluster.urls[1], ClientConfig{Layout: l, Rerun: rerun})
			ctx := deadline(t, time.Minute)
			type res struct {
				s   bgjob.Snapshot
				err error
			}
			got := make(chan res, 1)
			go func() {
				s, err := c.Start(ctx, bgjob.Spec{Command: "echo ran", Session: "r"})
				got <- res{s, err}
			}()
			<-ch.exited // it claimed, then killed itself
			_, reg := newWorker(t, testCluster.urls[2], l, 4, bgjob.Config{})
			r := <-got
			if r.err != nil {
				t.Fatal(r.err)
			}
			comp, err := c.NextCompletion(ctx, "r")
			if err != nil || comp.ID != r.s.ID {
				t.Fatalf("completion: %+v, %v", comp, err)
			}
			final, err := c.Wait(ctx, r.s.ID)
			if err != nil {
				t.Fatal(err)
			}
			if rerun {
				if final.State != bgjob.Exited || final.Output.Text != "ran\n" || comp.State != bgjob.Exited {
					t.Fatalf("rerun: %+v; want it run by the other worker", final)
				}
				if n := len(reg.List("r")); n != 1 {
					t.Fatalf("the other worker ran %d jobs; want 1", n)
				}
			} else {
				if final.State != bgjob.Failed || final.Reason != reasonLost || final.Err() == nil || comp.State != bgjob.Failed {
					t.Fatalf("at most once: %+v; want failed, %q, never ran", final, reasonLost)
				}
			}
			if more := c.Completions("r"); len(more) != 0 {
				t.Fatalf("more completions: %+v", more)
			}
		})
	}
}

// TestNodeStopped stops one node of a cluster of three while jobs run on
// workers attached to every node: nothing is lost, every job ends right
// with one completion, and launches after the stop work.
func TestNodeStopped(t *testing.T) {
	cl, err := startCluster(3, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer cl.shutdown()
	l := testLayout(t, "stop")
	// Each connection knows every node and starts on its own one.
	list := func(first int) string {
		var urls []string
		for i := range 3 {
			urls = append(urls, cl.urls[(first+i)%3])
		}
		return strings.Join(urls, ",")
	}
	var clients []*Client
	for i := range 3 {
		reg, err := bgjob.New(bgjob.Config{Retention: bgjob.Retention{MaxJobs: 256}})
		if err != nil {
			t.Fatal(err)
		}
		nc := connect(t, list(i), dontRandomize())
		w, err := NewWorker(nc, reg, WorkerConfig{Layout: l, Slots: 16, Heartbeat: 250 * time.Millisecond, HeartbeatTTL: 10 * time.Second})
		if err != nil {
			t.Fatal(err)
		}
		defer reg.Close(context.Background())
		defer w.Close(context.Background())
		clients = append(clients, newClient(t, list(i), ClientConfig{Layout: l}))
	}
	ctx := deadline(t, 3*time.Minute)
	const before, after = 60, 30
	var mu sync.Mutex
	ids := map[bgjob.ID]int{}
	launch := func(i int) {
		s, err := clients[i%3].Start(ctx, bgjob.Spec{Command: fmt.Sprintf("sleep 1; echo %d", i), Session: "n"})
		if err != nil {
			t.Errorf("start %d: %v", i, err)
			return
		}
		mu.Lock()
		ids[s.ID] = i
		mu.Unlock()
	}
	var wg sync.WaitGroup
	for i := range before {
		wg.Add(1)
		go func() { defer wg.Done(); launch(i) }()
	}
	wg.Wait()
	cl.servers[1].Shutdown() // mid-run: the jobs sleep for a second
	stopped := time.Now()
	for i := before; i < before+after; i++ {
		wg.Add(1)
		go func() { defer wg.Done(); launch(i) }()
	}
	wg.Wait()
	seen := map[bgjob.ID]int{}
	for len(seen) < before+after {
		comp, err := clients[0].NextCompletion(ctx, "n")
		if err != nil {
			t.Fatalf("%d of %d completions: %v", len(seen), before+after, err)
		}
		seen[comp.ID]++
		if seen[comp.ID] > 1 {
			t.Fatalf("completion of %s twice", comp.ID)
		}
		if comp.State != bgjob.Exited || comp.ExitCode != 0 {
			st, err := clients[0].Status(comp.ID)
			t.Errorf("completion %s: %s %d (reason %q, %v)", comp.ID, comp.State, comp.ExitCode, st.Reason, err)
		}
	}
	t.Logf("all %d completions %v after the stop", before+after, time.Since(stopped).Round(time.Millisecond))
	for id, i := range ids {
		out, err := clients[2].Read(id, 0, 100)
		if err != nil || out.Data != fmt.Sprintf("%d\n", i) || !out.Done {
			t.Errorf("read job %d: %+v, %v", i, out, err)
		}
	}
	if more := clients[1].Completions("n"); len(more) != 0 {
		t.Errorf("more completions: %d", len(more))
	}
}
