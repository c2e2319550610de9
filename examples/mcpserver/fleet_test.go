//go:build unix

package main

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
	"github.com/bgjob/bgjob/fleet"
	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
)

// startNATS starts an embedded NATS server with JetStream on a loopback
// port, shut down when the test ends.
func startNATS(t *testing.T) string {
	t.Helper()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoSigs: true, NoLog: true})
	if err != nil {
		t.Fatal(err)
	}
	go ns.Start() // the server's own goroutines; Shutdown ends them
	t.Cleanup(func() {
		ns.Shutdown()
		ns.WaitForShutdown()
	})
	if !ns.ReadyForConnections(testDeadline) {
		t.Fatal("NATS server not ready")
	}
	return ns.ClientURL()
}

// newFleetServer is a server whose jobs run on a fleet worker of its own
// NATS server, as `mcpserver -nats URL` with `mcpserver -worker -nats URL`.
func newFleetServer(t *testing.T) *Server {
	t.Helper()
	url := startNATS(t)
	conn := func() *nats.Conn {
		nc, err := nats.Connect(url)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(nc.Close)
		return nc
	}
	cfg, err := RegistryConfig(Options{KillGrace: 200 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	feed := new(fleet.MatchFeed) // as runWorker wires it
	cfg.OnMatch = feed.OnMatch
	reg, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	w, err := fleet.NewWorker(conn(), reg, fleet.WorkerConfig{Matches: feed})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		w.Close(ctx)
		reg.Close(ctx)
	})
	c, err := fleet.NewClient(conn(), fleet.ClientConfig{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := New(Options{Jobs: c, Jail: t.TempDir()}); err == nil || !strings.Contains(err.Error(), "Options.Jail") {
		t.Fatalf("New with Jobs and Jail: %v; want an error naming Options.Jail", err)
	}
	srv, err := New(Options{Jobs: c, ProgressInterval: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
		defer cancel()
		if err := srv.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return srv
}

// TestFleetShell: the shell tools over a fleet: a command inline, one
// that detaches and is read by offset, its completion notification (the
// fleet's, forwarded), another connection that cannot see the job, and
// what needs watches' matches: shell_wait's until, shell's until,
// shell_watch.
func TestFleetShell(t *testing.T) {
	srv := newFleetServer(t)
	c := connect(t, srv)
	c.setLogLevel("info")
	var out ShellOutput
	c.mustCall("shell", map[string]any{"command": "echo inline; exit 4"}, &out)
	if out.Detached || out.Output != "inline\n" || out.State != "exited" || out.ExitCode == nil || *out.ExitCode != 4 {
		t.Fatalf("inline: %+v; want exited 4 with its output", out)
	}
	const cmd = `i=0; while [ $i -lt 3 ]; do echo line$i; i=$((i+1)); sleep 0.1; done`
	c.mustCall("shell", map[string]any{"command": cmd, "wait_ms": 20}, &out)
	if !out.Detached || out.JobID == "" || out.State != "running" {
		t.Fatalf("detach: %+v; want a running detached job", out)
	}
	other := connect(t, srv)
	if msg := other.mustFail("shell_status", map[string]any{"job_id": out.JobID}); !strings.Contains(msg, "no job") {
		t.Errorf("another connection's shell_status: %q; want no job in this session", msg)
	}
	rest, _ := c.readAll(out.JobID, out.NextOffset, 6)
	if got := out.Output + rest; got != "line0\nline1\nline2\n" {
		t.Errorf("output: %q", got)
	}
	if jc := c.completion(out.JobID); jc.State != bgjob.Exited || jc.ExitCode != 0 || jc.Command != cmd {
		t.Errorf("completion: %+v; want exited 0", jc)
	}
	// shell_wait's until is WaitFor, which asks the job's worker.
	var bg ShellOutput
	c.mustCall("shell", map[string]any{"command": "echo warming; echo ready on 8080; sleep 0.3", "background": true}, &bg)
	if res := c.mustCall("shell_wait", map[string]any{"job_id": bg.JobID, "until": "ready on [0-9]+"}, nil); !strings.Contains(text(res), "ready on 8080") {
		t.Errorf("shell_wait with until: %q; want the line", text(res))
	}
	// shell's until: the job's watch matches on the worker, the match
	// comes back through the fleet (NextMatch) and the call detaches.
	begin := time.Now()
	var u ShellOutput
	c.mustCall("shell", map[string]any{"command": "echo start; echo listening on :4321; sleep 30", "until": `listening on :\d+`, "wait_ms": 60000}, &u)
	if took := time.Since(begin); took > 30*time.Second {
		t.Errorf("shell with until took %v; want it back when the line came", took)
	}
	if !u.Detached || u.State != "running" || u.Matched == nil || u.Matched.Line != "listening on :4321" || u.Matched.Offset != 6 {
		t.Fatalf("shell with until: %+v (matched %+v); want detached, running, the line at 6", u, u.Matched)
	}
	c.mustCall("shell_cancel", map[string]any{"job_id": u.JobID}, nil)
	// shell_watch: each later matching line, as a notification.
	gate := filepath.Join(t.TempDir(), "gate")
	id := c.background("echo 'error 0'; while [ ! -e " + gate + " ]; do sleep 0.01; done; echo 'error 1'; echo fine; echo 'error 2'; sleep 30")
	c.mustCall("shell_wait", map[string]any{"job_id": id, "until": `^error 0$`}, nil)
	c.mustCall("shell_watch", map[string]any{"job_id": id, "pattern": `^error \d`, "every": true}, nil)
	if err := os.WriteFile(gate, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, want := range []struct {
		line string
		off  int64
	}{{"error 1", 8}, {"error 2", 21}} {
		if jm := c.matchNote(id); jm.Watch != `^error \d` || jm.Line != want.line || jm.Offset != want.off || jm.ID != bgjob.ID(id) {
			t.Errorf("shell_watch notification %+v; want %q at %d", jm, want.line, want.off)
		}
	}
	c.mustCall("shell_cancel", map[string]any{"job_id": id}, nil)
}
