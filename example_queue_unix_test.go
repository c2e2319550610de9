//go:build unix

package bgjob_test

import (
	"context"
	"fmt"

	"github.com/bgjob/bgjob"
)

// With Config.Queue a launch beyond MaxRunning waits for a slot instead of
// failing; Priority orders the waiting launches, and the end of a running
// job starts the next.
func ExampleRegistry_Start_queued() {
	r, err := bgjob.New(bgjob.Config{MaxRunning: 1, Queue: true})
	if err != nil {
		panic(err)
	}
	defer r.Close(context.Background())
	ctx := context.Background()

	build, _ := r.Start(ctx, bgjob.Spec{Command: "sleep 60"})
	lint, _ := r.Start(ctx, bgjob.Spec{Command: "echo lint"})
	test, _ := r.Start(ctx, bgjob.Spec{Command: "echo test", Priority: 1})
	fmt.Println(build.State, lint.State, test.State)
	lint, _ = r.Status(lint.ID)
	fmt.Println("lint waits at place", lint.QueuePosition) // test goes first

	r.Cancel(build.ID) // frees the slot
	for _, id := range []bgjob.ID{test.ID, lint.ID} {
		s, _ := r.Wait(ctx, id)
		fmt.Print(s.State, ": ", s.Output.Text)
	}
	// Output:
	// running queued queued
	// lint waits at place 2
	// exited: test
	// exited: lint
}

// A shell that starts a server in the background and exits: with
// LeftoversWait the job runs until the server is done too, and ends with
// the shell's exit code; with the default, LeftoversStop, the server
// would be stopped as the shell exits.
func ExampleSpec_leftovers() {
	r, err := bgjob.New(bgjob.Config{})
	if err != nil {
		panic(err)
	}
	defer r.Close(context.Background())
	ctx := context.Background()

	s, _ := r.Start(ctx, bgjob.Spec{
		Command:   "(sleep 0.2; echo server done) & echo shell done; exit 3",
		Leftovers: bgjob.LeftoversWait,
	})
	s, _ = r.Wait(ctx, s.ID)
	fmt.Print(s.State, " ", s.ExitCode, "\n", s.Output.Text)
	// Output:
	// exited 3
	// shell done
	// server done
}
