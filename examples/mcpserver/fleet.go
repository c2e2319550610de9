package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/bgjob/bgjob"
	"github.com/bgjob/bgjob/fleet"
	"github.com/nats-io/nats.go"
)

// fleetFlags are the flags of a fleet's client or worker.
type fleetFlags struct {
	url      string // -nats: server URLs, comma-separated
	creds    string // -nats-creds: a NATS credentials file
	ca       string // -nats-ca: CA certificates for tls:// servers
	worker   bool   // -worker: serve a local registry to the fleet
	name     string // -worker-name
	slots    int    // -slots
	pool     string // -pool
	replicas int    // -replicas
}

// connectNATS connects to the fleet's servers with the flags' options;
// it reconnects for as long as the process runs.
func connectNATS(f fleetFlags) (*nats.Conn, error) {
	opts := []nats.Option{nats.Name("bgjob-mcpserver"), nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond)}
	if f.creds != "" {
		opts = append(opts, nats.UserCredentials(f.creds))
	}
	if f.ca != "" {
		opts = append(opts, nats.RootCAs(f.ca))
	}
	nc, err := nats.Connect(f.url, opts...)
	if err != nil {
		return nil, fmt.Errorf("-nats %s: %w", f.url, err)
	}
	return nc, nil
}

func (f fleetFlags) layout() fleet.Layout {
	return fleet.Layout{Pool: f.pool, Replicas: f.replicas}
}

// fleetClient returns the fleet client that Options.Jobs takes, and a
// function that closes its connection after the client is closed.
func fleetClient(f fleetFlags) (bgjob.Jobs, func(), error) {
	nc, err := connectNATS(f)
	if err != nil {
		return nil, nil, err
	}
	c, err := fleet.NewClient(nc, fleet.ClientConfig{Layout: f.layout()})
	if err != nil {
		nc.Close()
		return nil, nil, err
	}
	return c, nc.Close, nil
}

// runWorker serves a Registry made from opts (RegistryConfig) to the
// fleet until SIGINT or SIGTERM; then it stops the worker (in durable
// mode it detaches, so that a worker started again with the same
// -worker-name and -state-dir adopts the running jobs) and the
// Registry. It returns the process's exit code.
func runWorker(opts Options, f fleetFlags) int {
	cfg, err := RegistryConfig(opts)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mcpserver: %v\n", err)
		return 2
	}
	cfg.Logger = opts.Logger
	// The matches of the jobs' watches (shell's until, shell_watch) go
	// to the fleet, for the server whose connection set them.
	feed := new(fleet.MatchFeed)
	cfg.OnMatch = feed.OnMatch
	reg, err := bgjob.New(cfg)
	if err != nil {
		fmt.Fprintf(os.Stderr, "mcpserver: %v\n", err)
		return 2
	}
	nc, err := connectNATS(f)
	if err != nil {
		reg.Close(context.Background())
		fmt.Fprintf(os.Stderr, "mcpserver: %v\n", err)
		return 1
	}
	defer nc.Close()
	w, err := fleet.NewWorker(nc, reg, fleet.WorkerConfig{Layout: f.layout(), Name: f.name, Slots: f.slots, Logger: opts.Logger, Matches: feed})
	if err != nil {
		reg.Close(context.Background())
		fmt.Fprintf(os.Stderr, "mcpserver: worker: %v\n", err)
		return 1
	}
	fmt.Fprintf(os.Stderr, "mcpserver: worker %s serving pool %q\n", w.Name(), f.layout().Pool)
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	<-ctx.Done()
	cctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	if cfg.StateDir != "" {
		err = w.Detach()
		if err == nil {
			err = reg.Detach()
		}
	} else {
		err = w.Close(cctx)
		if cerr := reg.Close(cctx); err == nil {
			err = cerr
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "mcpserver: worker close: %v\n", err)
		return 1
	}
	return 0
}
