// Command demo shows bgjob at work in a few seconds of plain terminal
// output: a command that detaches at its soft cap and is read by offset
// while it runs, a coalesced launch, the cancel of a process tree, wall
// and idle timeouts, exit codes, completions and output redaction.
//
//	go run ./examples/demo
//
// It needs a Unix shell (/bin/sh).
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/bgjob/bgjob"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "demo:", err)
		os.Exit(1)
	}
}

func run() error {
	r, err := bgjob.New(bgjob.Config{
		ProgressInterval: 250 * time.Millisecond,
		KillGrace:        500 * time.Millisecond,
		Admitter:         bgjob.Redactor{}, // masks common secrets in all output
	})
	if err != nil {
		return err
	}
	defer r.Close(context.Background())
	ctx := context.Background()
	const session = "demo"

	section("1. A command that outlives its soft cap detaches")
	begin := time.Now()
	res, err := r.RunForeground(ctx, bgjob.Spec{
		Command: "for i in 1 2 3 4 5 6; do echo step $i; sleep 0.2; done",
		Session: session,
	}, bgjob.Foreground{
		SoftCap: 600 * time.Millisecond,
		OnProgress: func(s bgjob.Snapshot) {
			say("  ...still running after %v", time.Since(s.Started).Round(10*time.Millisecond))
		},
	})
	if err != nil {
		return err
	}
	say("RunForeground returned after %v: detached=%v, job %s, state %s",
		time.Since(begin).Round(10*time.Millisecond), res.Detached, res.ID, res.State)

	section("2. Polling it with incremental reads until it ends")
	var off int64
	for {
		c, err := r.Read(res.ID, off, 1<<16)
		if err != nil {
			return err
		}
		if c.Data != "" {
			say("Read(offset %d) -> %d bytes up to %d: %q", off, len(c.Data), c.Next, c.Data)
		}
		off = c.Next
		if c.Done {
			break
		}
		s, _ := r.Status(res.ID)
		if s.State.Done() {
			continue // read what is left
		}
		wctx, cancel := context.WithTimeout(ctx, 300*time.Millisecond)
		r.Wait(wctx, res.ID) // a poll interval that ends early when the job does
		cancel()
	}
	s, _ := r.Status(res.ID)
	say("final: %s, exit code %d, %d bytes", s.State, s.ExitCode, s.Output.Total)
	for _, c := range r.Completions(session) {
		say("completion queued for session %q: %s %s exit %d", c.Session, c.ID, c.State, c.ExitCode)
	}

	section("3. An identical launch joins the running job")
	a, err := r.Start(ctx, bgjob.Spec{Command: "sleep 30", Session: session})
	if err != nil {
		return err
	}
	b, err := r.Start(ctx, bgjob.Spec{Command: "sleep 30", Session: session})
	if err != nil {
		return err
	}
	say("first  Start: %s pid %d joined=%v", a.ID, a.PID, a.Joined)
	say("second Start: %s pid %d joined=%v  (same ID, same process)", b.ID, b.PID, b.Joined)
	u, _ := r.Start(ctx, bgjob.Spec{Command: "sleep 30", Session: session, Unique: true})
	say("with Unique:  %s pid %d (a new job)", u.ID, u.PID)
	say("running jobs: %d", r.Running())
	r.Cancel(a.ID)
	r.Cancel(u.ID)

	section("4. Cancel stops the whole process tree")
	tree, err := r.Start(ctx, bgjob.Spec{
		Command: "trap '' TERM; sleep 300 & sleep 300 & echo 'three processes, all ignoring SIGTERM'; wait",
		Session: session,
	})
	if err != nil {
		return err
	}
	waitFor(r, tree.ID, "three processes")
	say("live processes in the job's group: %s", groupCount(tree.PID))
	begin = time.Now()
	s, _ = r.Cancel(tree.ID)
	say("Cancel took %v (SIGTERM, %v grace, SIGKILL): %s, exit code %d, reason %q",
		time.Since(begin).Round(10*time.Millisecond), 500*time.Millisecond, s.State, s.ExitCode, s.Reason)
	say("live processes in the job's group: %s", groupCount(tree.PID))

	section("5. Timeouts: wall clock and idle")
	s, _ = r.Start(ctx, bgjob.Spec{Command: "sleep 60", Timeout: 300 * time.Millisecond, Session: session})
	s, _ = r.Wait(ctx, s.ID)
	say("wall:  %s, exit code %d, reason %q", s.State, s.ExitCode, s.Reason)
	s, _ = r.Start(ctx, bgjob.Spec{Command: "echo working; sleep 60", IdleTimeout: 300 * time.Millisecond, Session: session})
	s, _ = r.Wait(ctx, s.ID)
	say("idle:  %s, exit code %d, reason %q, output %q", s.State, s.ExitCode, s.Reason, s.Output.Text)

	section("6. Exit codes")
	for _, cmd := range []string{"true", "exit 3", "kill -KILL $$"} {
		res, _ := r.RunForeground(ctx, bgjob.Spec{Command: cmd}, bgjob.Foreground{})
		say("%-14q -> %s, exit code %d", cmd, res.State, res.ExitCode)
	}

	section("7. Output passes the output policy before anyone sees it")
	res, _ = r.RunForeground(ctx, bgjob.Spec{Command: `echo "deploying with AWS key AKIAIOSFODNN7EXAMPLE"; echo "curl -H 'Authorization: Bearer abc123def456'"; echo done`}, bgjob.Foreground{})
	say("%q (notice: %q)", res.Output.Text, res.Output.Notice)

	section("8. Completions of the session's pollable jobs")
	for _, c := range r.Completions(session) {
		say("%s %-9s exit %3d  %s", c.ID, c.State, c.ExitCode, c.Command)
	}
	return nil
}

// waitFor waits until the job's output holds sub.
func waitFor(r *bgjob.Registry, id bgjob.ID, sub string) {
	for end := time.Now().Add(10 * time.Second); time.Now().Before(end); time.Sleep(10 * time.Millisecond) {
		if s, err := r.Status(id); err != nil || strings.Contains(s.Output.Text, sub) {
			return
		}
	}
}

// groupCount counts the live (non-zombie) processes of a process group,
// from /proc on Linux.
func groupCount(pgid int) string {
	names, err := os.ReadDir("/proc")
	if err != nil {
		return "(no /proc here)"
	}
	n := 0
	for _, e := range names {
		b, err := os.ReadFile("/proc/" + e.Name() + "/stat")
		if err != nil {
			continue
		}
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
		if len(f) > 2 && f[0] != "Z" && f[2] == fmt.Sprint(pgid) {
			n++
		}
	}
	return fmt.Sprint(n)
}

func section(title string) { fmt.Printf("\n== %s\n", title) }

func say(format string, args ...any) { fmt.Printf(format+"\n", args...) }
