package fleet

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// benchConcurrency is how many launches are in flight at once.
const benchConcurrency = 48

// runJobs starts n jobs of `true` through j with benchConcurrency
// launches in flight, and waits for each one's completion.
// A failed Start fails the benchmark and ends the wait for completions.
func runJobs(b *testing.B, ctx context.Context, starters []bgjob.Jobs, completions bgjob.Jobs, session string, n int) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range n {
			if _, err := completions.NextCompletion(ctx, session); err != nil {
				b.Error(err)
				return
			}
		}
	}()
	sem := make(chan struct{}, benchConcurrency)
	var wg sync.WaitGroup
	for i := range n {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if _, err := starters[i%len(starters)].Start(ctx, bgjob.Spec{Command: "true", Session: session, Unique: true}); err != nil {
				b.Error(err)
				cancel()
			}
		}()
	}
	wg.Wait()
	<-done
}

// BenchmarkJobs measures jobs per second, each a `true` started and its
// completion taken, with 48 launches in flight and at most 48 jobs
// running: through one local Registry (MaxRunning 48, with its queue, as
// the fleet's launches wait in the work queue), and through a fleet of
// three workers (16 slots each, one on each node of the 3-node cluster)
// from three clients.
func BenchmarkJobs(b *testing.B) {
	b.Run("local", func(b *testing.B) {
		reg, err := bgjob.New(bgjob.Config{MaxRunning: 48, Queue: true, MaxQueued: 1 << 20, Retention: bgjob.Retention{MaxJobs: 256}})
		if err != nil {
			b.Fatal(err)
		}
		defer reg.Close(context.Background())
		ctx := context.Background()
		b.ResetTimer()
		begin := time.Now()
		runJobs(b, ctx, []bgjob.Jobs{reg}, reg, "bench", b.N)
		b.ReportMetric(float64(b.N)/time.Since(begin).Seconds(), "jobs/s")
	})
	b.Run("fleet", func(b *testing.B) {
		l := testLayout(b, "bench")
		for i := range 3 {
			newWorker(b, testCluster.urls[i], l, 16, bgjob.Config{MaxRunning: 64, Retention: bgjob.Retention{MaxJobs: 256}})
		}
		var cs []bgjob.Jobs
		for i := range 3 {
			cs = append(cs, newClient(b, testCluster.urls[i], ClientConfig{Layout: l}))
		}
		ctx := context.Background()
		b.ResetTimer()
		begin := time.Now()
		runJobs(b, ctx, cs, cs[0], "bench", b.N)
		b.ReportMetric(float64(b.N)/time.Since(begin).Seconds(), "jobs/s")
	})
}

// BenchmarkStartLatency measures Start → running (Start's return, the
// job's process started) one launch at a time, and reports the p50 and
// p99, locally and through the fleet.
func BenchmarkStartLatency(b *testing.B) {
	measure := func(b *testing.B, j bgjob.Jobs) {
		ctx := context.Background()
		lat := make([]time.Duration, 0, b.N)
		b.ResetTimer()
		for i := range b.N {
			t0 := time.Now()
			s, err := j.Start(ctx, bgjob.Spec{Command: "true", Session: "lat", Unique: true})
			lat = append(lat, time.Since(t0))
			if err != nil || s.PID == 0 {
				b.Fatalf("start %d of %d: %+v, %v", i, b.N, s, err)
			}
		}
		b.StopTimer()
		slices.Sort(lat)
		b.ReportMetric(float64(lat[len(lat)/2].Microseconds()), "p50-µs")
		b.ReportMetric(float64(lat[len(lat)*99/100].Microseconds()), "p99-µs")
	}
	b.Run("local", func(b *testing.B) {
		reg, err := bgjob.New(bgjob.Config{})
		if err != nil {
			b.Fatal(err)
		}
		defer reg.Close(context.Background())
		measure(b, reg)
	})
	b.Run("fleet", func(b *testing.B) {
		l := testLayout(b, "lat")
		for i := range 3 {
			newWorker(b, testCluster.urls[i], l, 16, bgjob.Config{Retention: bgjob.Retention{MaxJobs: 256}})
		}
		measure(b, newClient(b, testCluster.urls[0], ClientConfig{Layout: l}))
	})
}

// BenchmarkSteps measures, one at a time, the NATS steps a fleet job is
// made of, to tell where its time goes: a key-value read, a
// compare-and-set write of a record (replicated three times), a
// JetStream publish (replicated three times), and a core request-reply
// between connections on two nodes.
func BenchmarkSteps(b *testing.B) {
	l := testLayout(b, "steps")
	l, _ = l.normalize()
	nc := connect(b, testCluster.urls[0])
	js, _ := jetstream.New(nc)
	ctx := context.Background()
	s, err := openStore(ctx, js, l)
	if err != nil {
		b.Fatal(err)
	}
	rec := record{Phase: phaseRunning, Run: nonce(), Snap: bgjob.Snapshot{ID: "job_0123456789abcdef", Command: "true"}}
	rev, err := s.cas(ctx, "bench.job_0123456789abcdef", rec, 0, 0)
	if err != nil {
		b.Fatal(err)
	}
	b.Run("kv-get", func(b *testing.B) {
		for range b.N {
			if _, _, _, err := s.get(ctx, "bench.job_0123456789abcdef"); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("kv-cas", func(b *testing.B) {
		for range b.N {
			if rev, err = s.cas(ctx, "bench.job_0123456789abcdef", rec, rev, 0); err != nil {
				b.Fatal(err)
			}
		}
	})
	data, _ := json.Marshal(launch{ID: "job_0123456789abcdef", Run: "r", Spec: bgjob.Spec{Command: "true"}})
	b.Run("js-publish", func(b *testing.B) {
		for i := range b.N {
			if _, err := js.PublishMsg(ctx, &nats.Msg{Subject: l.outSubject("bench", "job_0123456789abcdef", "r"), Data: data}, jetstream.WithMsgID(fmt.Sprint(i))); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("request-reply", func(b *testing.B) {
		far := connect(b, testCluster.urls[2])
		sub, err := far.Subscribe(l.Prefix+".echo", func(m *nats.Msg) { m.Respond(m.Data) })
		if err != nil {
			b.Fatal(err)
		}
		defer sub.Unsubscribe()
		far.Flush()
		for range b.N {
			if _, err := nc.Request(l.Prefix+".echo", data, 5*time.Second); err != nil {
				b.Fatal(err)
			}
		}
	})
}
