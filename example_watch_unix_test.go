//go:build unix

package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"regexp"

	"github.com/bgjob/bgjob"
)

func ExampleRegistry_WaitFor() {
	r, err := bgjob.New(bgjob.Config{})
	if err != nil {
		panic(err)
	}
	defer r.Close(context.Background())
	ctx := context.Background()

	// A dev server: start it, and go on as soon as it says it is ready.
	s, _ := r.Start(ctx, bgjob.Spec{Command: "echo compiling; sleep 0.2; echo 'listening on :8080'; sleep 60"})
	m, err := r.WaitFor(ctx, s.ID, regexp.MustCompile(`listening on :(\d+)`), 0)
	if err != nil {
		panic(err)
	}
	fmt.Printf("%q at offset %d\n", m.Line, m.Offset)
	r.Cancel(s.ID)

	// A build that fails before it prints what WaitFor waits for.
	b, _ := r.Start(ctx, bgjob.Spec{Command: "echo 'error: no such file'; exit 2"})
	_, err = r.WaitFor(ctx, b.ID, regexp.MustCompile(`^build ok`), 0)
	var ended *bgjob.EndedError
	if errors.As(err, &ended) {
		fmt.Println(errors.Is(err, bgjob.ErrJobEnded), ended.Snapshot.State, ended.Snapshot.ExitCode)
	}
	// Output:
	// "listening on :8080" at offset 10
	// true exited 2
}

func ExampleWatch() {
	matched := make(chan bgjob.Match, 10)
	r, err := bgjob.New(bgjob.Config{OnMatch: func(m bgjob.Match) { matched <- m }})
	if err != nil {
		panic(err)
	}
	defer r.Close(context.Background())

	s, _ := r.Start(context.Background(), bgjob.Spec{
		Command: "echo 'test a ok'; echo 'test b FAILED'; echo 'test c FAILED'; echo done",
		Session: "ci",
		Watches: []bgjob.Watch{
			{Name: "failure", Pattern: regexp.MustCompile(`FAILED$`), Every: true},
			{Name: "first", Pattern: regexp.MustCompile(`^test`)},
		},
	})
	r.Wait(context.Background(), s.ID)
	for range 3 {
		m := <-matched // OnMatch: as each line is matched
		fmt.Println(m.Watch, m.Offset, m.Line)
	}
	fmt.Println(len(r.Matches("ci")), "queued for the session") // the same matches, polled
	// Output:
	// first 0 test a ok
	// failure 10 test b FAILED
	// failure 24 test c FAILED
	// 3 queued for the session
}
