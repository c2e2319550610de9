package bgjob_test

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// BenchmarkStatusTree measures Status of a running job that shows its
// tree: a dev server's shell exited (LeftoversWait), leaving a listener
// and a chain of two processes, so the snapshot lists three processes and
// one port. "reused" is what a poll costs while the job is quiet (the
// listing is served again for up to a second); "listed" lists the tree
// anew on every call, as after output or once that second is over: the
// cost of a fresh listing. Both containments; p50-ns is the median call.
func BenchmarkStatusTree(b *testing.B) {
	for _, mode := range containModes {
		for _, fresh := range []bool{false, true} {
			name := mode.name + "/reused"
			if fresh {
				name = mode.name + "/listed"
			}
			b.Run(name, func(b *testing.B) {
				r, err := bgjob.New(bgjob.Config{Cgroup: mode.cgroup})
				if err != nil {
					b.Fatal(err)
				}
				defer r.Close(context.Background())
				if fresh {
					bgjob.SetTreeAge(r, 0)
				}
				ctx := context.Background()
				s, err := r.Start(ctx, bgjob.Spec{
					Command:   helperCmd("serve") + " $$ & " + helperCmd("tree", "2") + " & exit 0",
					Env:       helperEnv,
					Leftovers: bgjob.LeftoversWait,
				})
				if err != nil {
					b.Fatal(err)
				}
				if mode.want == bgjob.ContainCgroup && s.Containment != mode.want {
					b.Skip("no writable cgroup v2 hierarchy here")
				}
				for end := time.Now().Add(deadline); ; {
					if s, _ = r.Status(s.ID); len(s.Ports) == 1 && len(s.Processes) == 3 {
						break
					}
					if time.Now().After(end) {
						b.Fatalf("the job's tree: %+v, ports %v; want 3 processes, 1 port", s.Processes, s.Ports)
					}
					time.Sleep(time.Millisecond) // waiting for the processes to start
				}
				calls := make([]time.Duration, b.N)
				b.ResetTimer()
				for i := range calls {
					begin := time.Now()
					s, err = r.Status(s.ID)
					calls[i] = time.Since(begin)
					if err != nil || len(s.Ports) != 1 {
						b.Fatalf("Status: %v, ports %v", err, s.Ports)
					}
				}
				b.StopTimer()
				sort.Slice(calls, func(i, j int) bool { return calls[i] < calls[j] })
				b.ReportMetric(float64(calls[len(calls)/2].Nanoseconds()), "p50-ns")
				r.Cancel(s.ID)
			})
		}
	}
}
