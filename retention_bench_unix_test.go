//go:build unix

package bgjob_test

import (
	"context"
	"fmt"
	"strconv"
	"testing"

	"github.com/bgjob/bgjob"
)

// BenchmarkRetention measures Start and finish of one job while n finished
// jobs are retained and each new one evicts the oldest. The time per job
// must stay flat as n grows from 100 to 10,000: eviction is O(log n).
// "bookkeeping" jobs fail to spawn at once, so only the registry's own
// work is timed; "true" jobs run /bin/sh -c true.
func BenchmarkRetention(b *testing.B) {
	for _, kind := range []string{"bookkeeping", "true"} {
		for _, n := range []int{100, 1000, 10000} {
			b.Run(fmt.Sprintf("%s/retained=%d", kind, n), func(b *testing.B) {
				r, err := bgjob.New(bgjob.Config{Retention: bgjob.Retention{MaxJobs: n, MaxBytes: 1 << 40}})
				if err != nil {
					b.Fatal(err)
				}
				defer r.Close(context.Background())
				ctx := context.Background()
				bgjob.FailSpawns(r)
				for i := range n {
					s, _ := r.Start(ctx, bgjob.Spec{Command: "fill " + strconv.Itoa(i)})
					r.Wait(ctx, s.ID)
				}
				if got := bgjob.Retained(r); got != n {
					b.Fatalf("%d retained; want %d", got, n)
				}
				if kind == "true" {
					bgjob.RealSpawns(r)
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					s, err := r.Start(ctx, bgjob.Spec{Command: "true", Env: map[string]string{"N": strconv.Itoa(i)}})
					if err != nil {
						b.Fatal(err)
					}
					r.Wait(ctx, s.ID)
				}
				b.StopTimer()
				if got := bgjob.Retained(r); got != n {
					b.Fatalf("%d retained after the run; want %d", got, n)
				}
			})
		}
	}
}
