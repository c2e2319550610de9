//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"

	"github.com/bgjob/bgjob"
)

func ExampleRegistry_Session() {
	r, err := bgjob.New(bgjob.Config{})
	if err != nil {
		panic(err)
	}
	defer r.Close(context.Background())
	ctx := context.Background()

	// One view per client: it fills in Spec.Session and reaches only its
	// own jobs.
	alice, bob := r.Session("alice"), r.Session("bob")
	s, _ := alice.Start(ctx, bgjob.Spec{Command: "echo hi"})
	fmt.Println(s.Session)

	_, err = bob.Cancel(s.ID) // another session's job: as if there were none
	fmt.Println(errors.Is(err, bgjob.ErrNotFound))

	c, _ := alice.NextCompletion(ctx) // blocks until one of alice's jobs ends
	fmt.Println(c.ID == s.ID, c.State)
	// Output:
	// alice
	// true
	// true exited
}

func ExampleRegistry_Follow() {
	r, err := bgjob.New(bgjob.Config{})
	if err != nil {
		panic(err)
	}
	defer r.Close(context.Background())
	ctx := context.Background()

	s, _ := r.Start(ctx, bgjob.Spec{Command: "for i in 1 2 3; do echo step $i; sleep 0.1; done"})
	// Stream the output as it comes, to the job's end; no polling.
	io.Copy(os.Stdout, r.Follow(ctx, s.ID, 0))
	// Output:
	// step 1
	// step 2
	// step 3
}

func ExampleSnapshot_Err() {
	r, err := bgjob.New(bgjob.Config{})
	if err != nil {
		panic(err)
	}
	defer r.Close(context.Background())

	// Args runs an argv with no shell; this program does not exist, so
	// the job exists but never ran.
	s, err := r.Start(context.Background(), bgjob.Spec{Args: []string{"/no/such/program", "a b"}})
	if err == nil {
		err = s.Err()
	}
	fmt.Println(s.Command, s.State, errors.Is(err, bgjob.ErrSpawn))
	// Output:
	// /no/such/program 'a b' failed true
}
