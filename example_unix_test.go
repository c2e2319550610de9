//go:build unix

package bgjob_test

import (
	"context"
	"expvar"
	"fmt"
	"strings"
	"time"

	"github.com/bgjob/bgjob"
)

func ExampleRegistry_RunForeground() {
	r, err := bgjob.New(bgjob.Config{})
	if err != nil {
		panic(err)
	}
	defer r.Close(context.Background())
	ctx := context.Background()

	// Ends within the soft cap: the final result comes back inline.
	res, _ := r.RunForeground(ctx, bgjob.Spec{Command: "echo built; exit 2"}, bgjob.Foreground{SoftCap: 10 * time.Second})
	fmt.Printf("%s %d detached=%v %q\n", res.State, res.ExitCode, res.Detached, res.Output.Text)

	// Outlives the soft cap: the call detaches and the job goes on.
	res, _ = r.RunForeground(ctx, bgjob.Spec{Command: "sleep 0.5; echo tested"}, bgjob.Foreground{SoftCap: 100 * time.Millisecond})
	fmt.Printf("%s detached=%v\n", res.State, res.Detached)
	final, _ := r.Wait(ctx, res.ID)
	fmt.Printf("%s %d %q\n", final.State, final.ExitCode, final.Output.Text)
	// Output:
	// exited 2 detached=false "built\n"
	// running detached=true
	// exited 0 "tested\n"
}

func ExampleRegistry_Start_coalesced() {
	r, err := bgjob.New(bgjob.Config{})
	if err != nil {
		panic(err)
	}
	defer r.Close(context.Background())
	ctx := context.Background()

	a, _ := r.Start(ctx, bgjob.Spec{Command: "sleep 300", Session: "alice"})
	b, _ := r.Start(ctx, bgjob.Spec{Command: "sleep 300", Session: "alice"}) // joins a
	c, _ := r.Start(ctx, bgjob.Spec{Command: "sleep 300", Session: "bob"})   // another session: its own job
	fmt.Println(a.ID == b.ID, b.Joined, a.PID == b.PID, a.ID == c.ID, r.Running())

	s, _ := r.Cancel(b.ID) // stops it for alice's both launches
	fmt.Println(s.State, s.ExitCode, r.Running())
	// Output:
	// true true true false 2
	// cancelled 130 1
}

func ExampleRegistry_Read() {
	r, err := bgjob.New(bgjob.Config{})
	if err != nil {
		panic(err)
	}
	defer r.Close(context.Background())
	s, _ := r.Start(context.Background(), bgjob.Spec{Command: "echo one; echo two; echo three"})
	r.Wait(context.Background(), s.ID)

	// Read by offset, as a client following the output would; Next is
	// the offset of the next call.
	for off := int64(0); ; {
		c, _ := r.Read(s.ID, off, 8)
		fmt.Printf("[%d,%d) %q done=%v\n", c.Offset, c.Next, c.Data, c.Done)
		if c.Done {
			break
		}
		off = c.Next
	}
	// Output:
	// [0,8) "one\ntwo\n" done=false
	// [8,14) "three\n" done=true
}

func ExampleAdmitterFunc() {
	// An output policy in a few lines: mask a token before any text is
	// shown or kept.
	policy := bgjob.AdmitterFunc(func(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
		return bgjob.Admitted{Text: strings.ReplaceAll(req.Text, "hunter2", "*******")}, nil
	})
	r, err := bgjob.New(bgjob.Config{Admitter: policy})
	if err != nil {
		panic(err)
	}
	defer r.Close(context.Background())
	res, _ := r.RunForeground(context.Background(), bgjob.Spec{Command: "echo password is hunter2"}, bgjob.Foreground{})
	fmt.Print(res.Output.Text)
	// Output:
	// password is *******
}

// counters is a Telemetry that counts jobs by outcome in expvar, so they
// show on /debug/vars with no more code.
type counters struct {
	started, finished *expvar.Int
	byCategory        *expvar.Map
}

func (c counters) JobStarted(bgjob.Event) { c.started.Add(1) }
func (c counters) JobFinished(e bgjob.Event) {
	c.finished.Add(1)
	c.byCategory.Add(e.Category.String(), 1)
}

func ExampleTelemetry_expvar() {
	tel := counters{new(expvar.Int), new(expvar.Int), new(expvar.Map).Init()}
	// A real host publishes them: expvar.Publish("bgjob_started", tel.started), ...
	r, err := bgjob.New(bgjob.Config{Telemetry: tel})
	if err != nil {
		panic(err)
	}
	ctx := context.Background()
	for _, cmd := range []string{"true", "exit 1", "sleep 5"} {
		r.RunForeground(ctx, bgjob.Spec{Command: cmd, Timeout: 100 * time.Millisecond}, bgjob.Foreground{})
	}
	r.Close(ctx)
	fmt.Println("started", tel.started, "finished", tel.finished)
	fmt.Println(tel.byCategory)
	// Output:
	// started 3 finished 3
	// {"command": 1, "none": 1, "timeout": 1}
}

func ExampleLimits() {
	// Every job of this registry may hold 64 descriptors; this one may
	// also write files of at most 4 KiB.
	r, err := bgjob.New(bgjob.Config{Limits: bgjob.Limits{OpenFiles: 64}})
	if err != nil {
		panic(err)
	}
	defer r.Close(context.Background())
	ctx := context.Background()

	s, _ := r.Start(ctx, bgjob.Spec{
		Command: `f=$(mktemp); trap 'rm -f "$f"' EXIT; ulimit -n; head -c 100000 /dev/zero > "$f"`,
		Limits:  bgjob.Limits{FileSize: 4096},
	})
	s, _ = r.Wait(ctx, s.ID)
	fmt.Printf("%s %d %q %q\n", s.State, s.ExitCode, s.Output.Text, s.Reason)
	// Output:
	// exited 153 "64\nFile size limit exceeded\n" "file size limit 4 KiB reached"
}
