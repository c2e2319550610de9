//go:build unix

package bgjob_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// BenchmarkQueue measures the registry's bookkeeping of a queued launch:
// its admission to the queue (Start returns it Queued), and its start
// once a slot frees, as a job's end starts the next (here a job whose
// spawn fails at once, so no process is timed, and whose end starts the
// next in turn). One op admits n launches, of eight priorities, into a
// full registry (MaxRunning 1, its slot held), then frees the slot and
// waits until all n have ended; ns/job is per launch. The time per job
// must stay flat from n = 100 to 10,000: each step is O(log n).
//
// "direct" is the baseline in the same run: 1,000 such launches per op
// into a free slot, no queue, each ending before the next.
func BenchmarkQueue(b *testing.B) {
	b.Run("direct", func(b *testing.B) {
		r, err := bgjob.New(bgjob.Config{MaxRunning: 1})
		if err != nil {
			b.Fatal(err)
		}
		defer r.Close(context.Background())
		bgjob.FailSpawns(r)
		ctx := context.Background()
		const n = 1000
		b.ResetTimer()
		for i := 0; i < b.N; i++ {
			for k := range n {
				s, err := r.Start(ctx, bgjob.Spec{Command: "true", Priority: k % 8, Env: map[string]string{"N": strconv.Itoa(i*n + k)}})
				if err != nil {
					b.Fatal(err)
				}
				r.Wait(ctx, s.ID)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*n), "ns/job")
	})
	for _, n := range []int{100, 1000, 10000} {
		b.Run(fmt.Sprintf("queued=%d", n), func(b *testing.B) {
			r, err := bgjob.New(bgjob.Config{MaxRunning: 1, Queue: true, MaxQueued: n})
			if err != nil {
				b.Fatal(err)
			}
			defer r.Close(context.Background())
			bgjob.FailSpawns(r)
			ctx := context.Background()
			var admit time.Duration
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				release := bgjob.HoldSlots(r, 1)
				begin := time.Now()
				var last bgjob.ID // the last to start: lowest priority, last to come
				for k := range n {
					s, err := r.Start(ctx, bgjob.Spec{Command: "true", Priority: k % 8, Env: map[string]string{"N": strconv.Itoa(i*n + k)}})
					if err != nil {
						b.Fatal(err)
					}
					if s.State != bgjob.Queued {
						b.Fatalf("launch %d: %v; want queued", k, s.State)
					}
					if k%8 == 0 {
						last = s.ID
					}
				}
				admit += time.Since(begin)
				release()
				// One slot: the last job's end comes after every other's.
				if s, err := r.Wait(ctx, last); err != nil || s.State != bgjob.Failed {
					b.Fatalf("last job: %v %v; want failed (no spawns here)", s.State, err)
				}
				if n := r.Running(); n != 0 {
					b.Fatalf("Running() = %d after the drain; want 0", n)
				}
			}
			jobs := float64(b.N * n)
			b.ReportMetric(float64(b.Elapsed().Nanoseconds())/jobs, "ns/job")
			b.ReportMetric(float64(admit.Nanoseconds())/jobs, "admit-ns/job")
		})
	}
}
