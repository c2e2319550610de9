// Command mcpserver is an MCP server, over stdio, whose tools run shell
// commands as bgjob jobs: inline up to a soft cap, then detached with a
// job ID that can be polled, waited on and cancelled.
//
// Usage:
//
//	mcpserver [-dir DIR] [-max-running N] [-queue] [-max-queued N] [-progress-interval D] [-kill-grace D]
//	          [-head-bytes N] [-tail-bytes N] [-state-dir DIR]
//	          [-memory SIZE] [-pids N] [-cpu CORES] [-cpu-time D] [-sandbox] [-v]
//
// See README.md for the tools and how to register the server with a client.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"math"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bgjob/bgjob"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

func main() {
	os.Exit(run(os.Args[1:]))
}

// closeTimeout bounds the polite stop of running jobs at exit; past it
// they are killed.
const closeTimeout = 10 * time.Second

func run(args []string) int {
	fs := flag.NewFlagSet("mcpserver", flag.ContinueOnError)
	var opts Options
	fs.StringVar(&opts.Jail, "dir", "", "run commands only in this directory or below it (symlinks resolved); also the default cwd")
	fs.StringVar(&opts.StateDir, "state-dir", "", "keep jobs on disk so they survive a restart of the server (durable mode, Linux); connections then share the session of -session")
	fs.StringVar(&opts.Session, "session", "", `the bgjob session of every connection (default: one per connection; "default" with -state-dir)`)
	fs.IntVar(&opts.MaxRunning, "max-running", 0, "most jobs running at once (0: bgjob's default, 64)")
	fs.BoolVar(&opts.Queue, "queue", false, "a command beyond -max-running waits for a free slot (state queued) instead of failing")
	fs.IntVar(&opts.MaxQueued, "max-queued", 0, "with -queue, most commands waiting at once (0: bgjob's default, 1024)")
	fs.DurationVar(&opts.ProgressInterval, "progress-interval", defaultProgressInterval, "how often a waiting shell call sends a progress notification")
	fs.DurationVar(&opts.KillGrace, "kill-grace", 0, "time between SIGTERM and SIGKILL when a job is stopped (0: bgjob's default, 2s)")
	fs.IntVar(&opts.HeadBytes, "head-bytes", 0, "first bytes of each job's output to keep (0: bgjob's default, 64 KiB)")
	fs.IntVar(&opts.TailBytes, "tail-bytes", 0, "last bytes of each job's output to keep (0: bgjob's default, 1 MiB)")
	fs.Func("memory", "most memory each job may use, such as 512M or 2G (the job's whole tree with a cgroup v2 memory controller, else each process's address space)", func(v string) error {
		n, err := parseSize(v)
		opts.Limits.Memory = n
		return err
	})
	fs.IntVar(&opts.Limits.Processes, "pids", 0, "most live processes each job may have at once (needs a cgroup v2 pids controller; 0: no limit)")
	fs.Float64Var(&opts.Limits.CPU, "cpu", 0, "most CPU cores each job may use, such as 1.5 (needs a cgroup v2 cpu controller; 0: no limit)")
	fs.DurationVar(&opts.Limits.CPUTime, "cpu-time", 0, "most CPU time each process of a job may use (0: no limit)")
	fs.BoolVar(&opts.Sandbox, "sandbox", false, "run every job in a sandbox (bubblewrap on Linux): it may write the -dir jail (or its cwd) and a private /tmp, read the rest, and reach no network")
	verbose := fs.Bool("v", false, "log the server's diagnostics to stderr")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(os.Stderr, "mcpserver: unexpected arguments: %q\n", fs.Args())
		return 2
	}
	if *verbose {
		// stdout carries the protocol: diagnostics go to stderr only.
		opts.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
	}

	srv, err := New(opts)
	switch {
	case errors.Is(err, bgjob.ErrUnsupported) && opts.Sandbox && strings.Contains(err.Error(), "sandbox"):
		fmt.Fprintf(os.Stderr, "mcpserver: -sandbox: %v\n", err)
		return 2
	case errors.Is(err, bgjob.ErrUnsupported) && !opts.Limits.IsZero():
		fmt.Fprintf(os.Stderr, "mcpserver: these limits cannot be enforced here: %v\n", err)
		return 2
	case errors.Is(err, bgjob.ErrUnsupported) && opts.StateDir != "":
		fmt.Fprintf(os.Stderr, "mcpserver: -state-dir: durable mode is not available on this platform (%v)\n", err)
		return 2
	case err != nil:
		fmt.Fprintf(os.Stderr, "mcpserver: %v\n", err)
		return 2
	}

	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	ss, err := srv.Connect(ctx, &mcp.StdioTransport{})
	if err != nil {
		fmt.Fprintf(os.Stderr, "mcpserver: %v\n", err)
		return 1
	}
	ended := make(chan struct{})
	go func() { // ends when the client closes stdin, or Close below closes the session
		_ = ss.Wait()
		close(ended)
	}()
	select {
	case <-ended:
	case <-ctx.Done():
	}
	cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if err := srv.Close(cctx); err != nil {
		fmt.Fprintf(os.Stderr, "mcpserver: close: %v\n", err)
	}
	<-ended
	return 0
}

// parseSize reads a size in bytes, with an optional suffix K, M, G or T
// (powers of 1024; KiB, MiB, ... and KB, MB, ... mean the same).
func parseSize(v string) (int64, error) {
	s := strings.TrimSuffix(strings.TrimSuffix(strings.ToUpper(strings.TrimSpace(v)), "B"), "I")
	shift := 0
	if n := len(s); n > 0 {
		switch s[n-1] {
		case 'K':
			shift = 10
		case 'M':
			shift = 20
		case 'G':
			shift = 30
		case 'T':
			shift = 40
		}
		if shift > 0 {
			s = s[:n-1]
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64>>shift {
		return 0, fmt.Errorf("%q is not a size (such as 512M or 2G)", v)
	}
	return n << shift, nil
}
