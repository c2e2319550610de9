// Command mcpserver is an MCP server, over stdio, whose tools run shell
// commands as bgjob jobs: inline up to a soft cap, then detached with a
// job ID that can be polled, waited on and cancelled.
//
// Usage:
//
//	mcpserver [-dir DIR] [-max-running N] [-progress-interval D] [-kill-grace D]
//	          [-head-bytes N] [-tail-bytes N] [-state-dir DIR] [-v]
//
// See README.md for the tools and how to register the server with a client.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"os/signal"
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
	fs.DurationVar(&opts.ProgressInterval, "progress-interval", defaultProgressInterval, "how often a waiting shell call sends a progress notification")
	fs.DurationVar(&opts.KillGrace, "kill-grace", 0, "time between SIGTERM and SIGKILL when a job is stopped (0: bgjob's default, 2s)")
	fs.IntVar(&opts.HeadBytes, "head-bytes", 0, "first bytes of each job's output to keep (0: bgjob's default, 64 KiB)")
	fs.IntVar(&opts.TailBytes, "tail-bytes", 0, "last bytes of each job's output to keep (0: bgjob's default, 1 MiB)")
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
