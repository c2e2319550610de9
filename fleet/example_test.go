package fleet_test

import (
	"context"
	"fmt"
	"log"

	"github.com/bgjob/bgjob"
	"github.com/bgjob/bgjob/fleet"
	"github.com/nats-io/nats.go"
)

// A worker serves a local Registry to the fleet; a client, which could
// be on any other machine, runs jobs on it through the bgjob.Jobs
// interface, as it would on a local Registry. natsURL returns the
// NATS servers' URLs (here the tests' three, on loopback).
func Example() {
	ctx := context.Background()
	layout := fleet.Layout{Prefix: "example", Replicas: 3}

	// On a worker machine.
	wc, err := nats.Connect(natsURL())
	if err != nil {
		log.Fatal(err)
	}
	defer wc.Close()
	reg, err := bgjob.New(bgjob.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer reg.Close(ctx)
	w, err := fleet.NewWorker(wc, reg, fleet.WorkerConfig{Layout: layout})
	if err != nil {
		log.Fatal(err)
	}
	defer w.Close(ctx)

	// In the host.
	hc, err := nats.Connect(natsURL())
	if err != nil {
		log.Fatal(err)
	}
	defer hc.Close()
	c, err := fleet.NewClient(hc, fleet.ClientConfig{Layout: layout})
	if err != nil {
		log.Fatal(err)
	}
	defer c.Close(ctx)

	var jobs bgjob.Jobs = c // or a *bgjob.Registry: the same calls
	s, err := jobs.Start(ctx, bgjob.Spec{Command: "echo built; exit 2", Session: "alice"})
	if err != nil {
		log.Fatal(err)
	}
	final, err := jobs.Wait(ctx, s.ID)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("%s %d %q\n", final.State, final.ExitCode, final.Output.Text)
	for _, comp := range jobs.Completions("alice") {
		fmt.Println("completed:", comp.ID == s.ID, comp.State)
	}
	// Output:
	// exited 2 "built\n"
	// completed: true exited
}

// natsURL returns the URLs of the NATS servers of the example, comma-separated.
func natsURL() string { return fleet.NATSURL() }
