// Command demo shows bgjob at work in a few seconds of plain terminal
// output: a command that detaches at its soft cap and is followed as it
// prints, a session view that cannot reach another session's job, a
// coalesced launch, the cancel of a process tree, wall and idle timeouts,
// exit codes, an argv run with no shell, a spawn failure, completions and
// output redaction.
//
//	go run ./examples/demo
//
// It needs a Unix shell (/bin/sh).
package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
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
	// A view of the registry scoped to one session (one client of a
	// multi-client host): it fills Spec.Session in, and answers
	// ErrNotFound for any other session's job.
	jobs := r.Session("demo")

	section("1. A command that outlives its soft cap detaches")
	begin := time.Now()
	res, err := jobs.RunForeground(ctx, bgjob.Spec{
		Command: "for i in 1 2 3 4 5 6; do echo step $i; sleep 0.2; done",
	}, bgjob.Foreground{
		SoftCap: 600 * time.Millisecond,
		OnProgress: func(s bgjob.Snapshot) {
			say("  ...still running after %v, %d bytes of output so far",
				time.Since(s.Started).Round(10*time.Millisecond), s.Output.Total)
		},
	})
	if err == nil {
		err = res.Err() // the job's shell could not even start
	}
	if err != nil {
		return err
	}
	say("RunForeground returned after %v: detached=%v, job %s, state %s",
		time.Since(begin).Round(10*time.Millisecond), res.Detached, res.ID, res.State)

	section("2. Following its output as it comes, to its end")
	// Follow is an io.Reader over the job's output that blocks for new
	// bytes (woken by the output, not a timer) and ends with io.EOF when
	// the job does.
	lines := bufio.NewScanner(jobs.Follow(ctx, res.ID, 0))
	for lines.Scan() {
		say("  [+%v] %s", time.Since(begin).Round(10*time.Millisecond), lines.Text())
	}
	if err := lines.Err(); err != nil {
		return err
	}
	s, _ := jobs.Status(res.ID)
	say("final: %s, exit code %d, %d bytes", s.State, s.ExitCode, s.Output.Total)
	_, err = r.Session("someone-else").Status(res.ID)
	say("another session's view of it: %v (ErrNotFound: %v)", err, errors.Is(err, bgjob.ErrNotFound))
	c, err := jobs.NextCompletion(ctx) // queued when it ended: delivered once
	if err != nil {
		return err
	}
	b, _ := json.Marshal(c)
	say("its completion, as JSON: %s", b)

	section("3. An identical launch joins the running job")
	a, err := jobs.Start(ctx, bgjob.Spec{Command: "sleep 30"})
	if err != nil {
		return err
	}
	a2, err := jobs.Start(ctx, bgjob.Spec{Command: "sleep 30"})
	if err != nil {
		return err
	}
	say("first  Start: %s pid %d joined=%v", a.ID, a.PID, a.Joined)
	say("second Start: %s pid %d joined=%v  (same ID, same process)", a2.ID, a2.PID, a2.Joined)
	u, _ := jobs.Start(ctx, bgjob.Spec{Command: "sleep 30", Unique: true})
	say("with Unique:  %s pid %d (a new job)", u.ID, u.PID)
	say("running jobs: %d", r.Running())
	jobs.Cancel(a.ID)
	jobs.Cancel(u.ID)

	section("4. Cancel stops the whole process tree")
	tree, err := jobs.Start(ctx, bgjob.Spec{
		Command: "trap '' TERM; sleep 300 & sleep 300 & echo 'three processes, all ignoring SIGTERM'; wait",
	})
	if err != nil {
		return err
	}
	// ReadWait returns as soon as the first line is there.
	if _, err := jobs.ReadWait(ctx, tree.ID, 0, 1<<10); err != nil {
		return err
	}
	say("live processes in the job's group: %s", groupCount(tree.PID))
	begin = time.Now()
	s, _ = jobs.Cancel(tree.ID)
	say("Cancel took %v (SIGTERM, %v grace, SIGKILL): %s, exit code %d, reason %q",
		time.Since(begin).Round(10*time.Millisecond), 500*time.Millisecond, s.State, s.ExitCode, s.Reason)
	say("live processes in the job's group: %s", groupCount(tree.PID))

	section("5. Timeouts: wall clock and idle")
	s, _ = jobs.Start(ctx, bgjob.Spec{Command: "sleep 60", Timeout: 300 * time.Millisecond})
	s, _ = jobs.Wait(ctx, s.ID)
	say("wall:  %s, exit code %d, reason %q", s.State, s.ExitCode, s.Reason)
	s, _ = jobs.Start(ctx, bgjob.Spec{Command: "echo working; sleep 60", IdleTimeout: 300 * time.Millisecond})
	s, _ = jobs.Wait(ctx, s.ID)
	say("idle:  %s, exit code %d, reason %q, output %q", s.State, s.ExitCode, s.Reason, s.Output.Text)

	section("6. Exit codes")
	for _, cmd := range []string{"true", "exit 3", "kill -KILL $$"} {
		res, _ := r.RunForeground(ctx, bgjob.Spec{Command: cmd}, bgjob.Foreground{})
		say("%-14q -> %s, exit code %d", cmd, res.State, res.ExitCode)
	}

	section("7. An argument vector runs with no shell: nothing to quote")
	res, _ = r.RunForeground(ctx, bgjob.Spec{Args: []string{"printf", `%s|\n`, "a  b", "c;d", "$HOME"}}, bgjob.Foreground{})
	say("%s -> %q", res.Command, res.Output.Text)
	res, _ = r.RunForeground(ctx, bgjob.Spec{Args: []string{"no-such-program"}}, bgjob.Foreground{})
	say("a program that is not there: state %s, Err() = %v", res.State, res.Err())

	section("8. Output passes the output policy before anyone sees it")
	res, _ = r.RunForeground(ctx, bgjob.Spec{Command: `echo "deploying with AWS key AKIAIOSFODNN7EXAMPLE"; echo "curl -H 'Authorization: Bearer abc123def456'"; echo done`}, bgjob.Foreground{})
	say("%q (notice: %q)", res.Output.Text, res.Output.Notice)

	section("9. Completions of the session's pollable jobs")
	for _, c := range jobs.Completions() {
		say("%s %-9s exit %3d  %s", c.ID, c.State, c.ExitCode, c.Command)
	}
	return nil
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
