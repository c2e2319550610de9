//go:build linux

package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"sync"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// The Go benchmarks run the same workloads in-process, for profiling:
//
//	go test -run '^$' -bench . -benchtime 200x
//	go test -run '^$' -bench 'Capture/bgjob' -benchtime 5x -cpuprofile cpu.out
//	go tool pprof -top cpu.out
//
// At the end, TestMain prints the one table of `go run .` for the
// workloads that ran (timings there are means over b.N, not medians, and
// capture has no per-process RSS: use `go run .` for the checked table).

var (
	retainedFlag = flag.Int("retained", 1000, "finished jobs retained for BenchmarkStatus and BenchmarkRead")
	captureFlag  = flag.Int64("capture", 64<<20, "bytes per BenchmarkCapture op")
	fanoutFlag   = flag.Int("fanout", 200, "concurrent jobs per BenchmarkFanout op")
	burstFlag    = flag.Int("burst", 1000, "concurrent Starts per BenchmarkCoalesceBurst op")
)

// The results recorded by the benchmarks for the table.
var recorded struct {
	sync.Mutex
	spawn, fg     map[int]time.Duration
	fgP99         map[int]time.Duration
	capture       map[int]float64
	fanout        map[int]fanoutResult
	status, read  stat
	coalesce      map[int]coalesceResult
	haveStatusRow bool
}

func TestMain(m *testing.M) {
	recorded.spawn = map[int]time.Duration{}
	recorded.fg = map[int]time.Duration{}
	recorded.fgP99 = map[int]time.Duration{}
	recorded.capture = map[int]float64{}
	recorded.fanout = map[int]fanoutResult{}
	recorded.coalesce = map[int]coalesceResult{}
	code := m.Run()
	if rows := recordedRows(); len(rows) > 0 {
		fmt.Println()
		render(os.Stdout, rows)
	}
	os.Exit(code)
}

func recordedRows() []row {
	r := &recorded
	var rows []row
	if len(r.spawn) > 0 {
		row := row{workload: "1 spawn", metric: "start+wait `true`, mean", unit: fmtDur,
			target: fmt.Sprintf("≤ %.2f× os/exec", spawnMaxRatio), check: relTo(spawnMaxRatio, true)}
		for k, d := range r.spawn {
			row.cells[k] = dur(d)
		}
		rows = append(rows, row)
	}
	if len(r.fg) > 0 {
		p99 := row{workload: "2 foreground latency", metric: "exit → return, p99", unit: fmtDur,
			target: "≤ " + fmtDur(float64(fgMaxP99)), check: atMost(float64(fgMaxP99))}
		med := row{workload: "2 foreground latency", metric: "exit → return, median", unit: fmtDur}
		for k := range r.fg {
			p99.cells[k], med.cells[k] = dur(r.fgP99[k]), dur(r.fg[k])
		}
		rows = append(rows, p99, med)
	}
	if len(r.capture) > 0 {
		tp := row{workload: "3 capture " + fmtMiB(float64(*captureFlag)/(1<<20)), metric: "throughput (mean)", unit: fmtMiBps,
			target: fmt.Sprintf("≥ %.2f× os/exec", captureMinRatio), check: relTo(captureMinRatio, false)}
		for k, v := range r.capture {
			tp.cells[k] = val(v)
		}
		rows = append(rows, tp)
	}
	if len(r.fanout) > 0 {
		var f [nImpl]fanoutResult
		fr := fanoutRows(f)
		for i := range fr {
			fr[i].workload = fmt.Sprintf("4 fan-out %d × sleep 1", *fanoutFlag)
			fr[i].cells = [nImpl]cell{}
		}
		for k, x := range r.fanout {
			fr[0].cells[k], fr[1].cells[k], fr[2].cells[k] = dur(x.wall), val(x.goroutines), val(x.heap)
		}
		rows = append(rows, fr...)
	}
	if len(r.status) > 0 || len(r.read) > 0 {
		rows = append(rows, statusRows(statusResult{retained: *retainedFlag, status: r.status, read: r.read})...)
	}
	if len(r.coalesce) > 0 {
		var c [nImpl]coalesceResult
		for k, x := range r.coalesce {
			c[k] = x
		}
		cr := coalesceRows(c)
		for i := range cr {
			cr[i].workload = fmt.Sprintf("6 coalesce %d × Start", *burstFlag)
			if _, ok := r.coalesce[osExec]; !ok {
				cr[i].cells[osExec] = na
			}
			if _, ok := r.coalesce[bgJob]; !ok {
				cr[i].cells[bgJob] = na
			}
		}
		rows = append(rows, cr...)
	}
	return rows
}

func eachImpl(b *testing.B, impls []int, f func(b *testing.B, impl int)) {
	for _, k := range impls {
		b.Run(implNames[k], func(b *testing.B) { f(b, k) })
	}
}

var all = []int{osExec, goCmd, bgJob}

func BenchmarkSpawn(b *testing.B) {
	reg := newRegistry(bgjob.Config{})
	defer closeRegistry(reg)
	rs := runners(reg, "true")
	eachImpl(b, all, func(b *testing.B, k int) {
		for b.Loop() {
			if _, err := rs[k](); err != nil {
				b.Fatal(err)
			}
		}
		recorded.spawn[k] = b.Elapsed() / time.Duration(b.N)
	})
}

func BenchmarkForegroundLatency(b *testing.B) {
	w, err := openExitWatch()
	if err != nil {
		b.Skip(err)
	}
	defer w.Close()
	reg := newRegistry(bgjob.Config{})
	defer closeRegistry(reg)
	rs := runners(reg, "true")
	eachImpl(b, all, func(b *testing.B, k int) {
		var s stat
		for b.Loop() {
			b.StopTimer()
			w.reset()
			b.StartTimer()
			pid, err := rs[k]()
			ret := monoNow()
			if err != nil {
				b.Fatal(err)
			}
			b.StopTimer()
			exit, err := w.exitTime(pid, 2*time.Second)
			if err != nil {
				b.Fatal(err)
			}
			s = append(s, time.Duration(ret-exit))
			b.StartTimer()
		}
		b.ReportMetric(float64(s.median().Nanoseconds()), "exit→return-median-ns")
		b.ReportMetric(float64(s.p99().Nanoseconds()), "exit→return-p99-ns")
		recorded.fg[k], recorded.fgP99[k] = s.median(), s.p99()
	})
}

func BenchmarkCapture(b *testing.B) {
	eachImpl(b, all, func(b *testing.B, k int) {
		b.SetBytes(*captureFlag)
		for b.Loop() {
			got, err := capture(implNames[k], *captureFlag)
			if err != nil || got != *captureFlag {
				b.Fatalf("got %d bytes, %v; want %d", got, err, *captureFlag)
			}
		}
		recorded.capture[k] = float64(*captureFlag) * float64(b.N) / (1 << 20) / b.Elapsed().Seconds()
	})
}

func BenchmarkFanout(b *testing.B) {
	eachImpl(b, all, func(b *testing.B, k int) {
		var f fanoutResult
		for b.Loop() {
			f = runFanout(*fanoutFlag, k)
		}
		b.ReportMetric(f.goroutines, "goroutines/job")
		b.ReportMetric(f.heap, "heapB/job")
		recorded.fanout[k] = f
	})
}

// retainedRegistry returns a registry holding n finished, retained jobs,
// and their IDs.
func retainedRegistry(b *testing.B, n int) (*bgjob.Registry, []bgjob.ID) {
	reg := newRegistry(bgjob.Config{MaxRunning: 64, Retention: bgjob.Retention{MaxJobs: 2 * n}})
	ctx := context.Background()
	var ids []bgjob.ID
	for i := range n {
		if i >= 32 {
			reg.Wait(ctx, ids[i-32])
		}
		s, err := reg.Start(ctx, bgjob.Spec{Command: "echo retained", Unique: true})
		if err != nil {
			b.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	for _, id := range ids {
		reg.Wait(ctx, id)
	}
	return reg, ids
}

func BenchmarkStatus(b *testing.B) {
	reg, ids := retainedRegistry(b, *retainedFlag)
	defer closeRegistry(reg)
	var s stat
	i := 0
	for b.Loop() {
		t := time.Now()
		if _, err := reg.Status(ids[i%len(ids)]); err != nil {
			b.Fatal(err)
		}
		s = append(s, time.Since(t))
		i += 7919 // a prime: visits the IDs in a scattered order
	}
	recorded.status = s
}

func BenchmarkRead(b *testing.B) {
	reg, ids := retainedRegistry(b, *retainedFlag)
	defer closeRegistry(reg)
	var s stat
	i := 0
	for b.Loop() {
		t := time.Now()
		if _, err := reg.Read(ids[i%len(ids)], 0, 4096); err != nil {
			b.Fatal(err)
		}
		s = append(s, time.Since(t))
		i += 7919
	}
	recorded.read = s
}

// BenchmarkCoalesceJoin is the cost of one Start that joins a running
// job, alone (no contention).
func BenchmarkCoalesceJoin(b *testing.B) {
	reg := newRegistry(bgjob.Config{})
	defer closeRegistry(reg)
	ctx := context.Background()
	spec := bgjob.Spec{Command: "sleep 30"}
	first, err := reg.Start(ctx, spec)
	if err != nil {
		b.Fatal(err)
	}
	for b.Loop() {
		s, err := reg.Start(ctx, spec)
		if err != nil || !s.Joined {
			b.Fatalf("joined %v, %v", s.Joined, err)
		}
	}
	reg.Cancel(first.ID)
}

// BenchmarkCoalesceBurst is workload 6: -burst identical concurrent Starts.
func BenchmarkCoalesceBurst(b *testing.B) {
	eachImpl(b, []int{osExec, bgJob}, func(b *testing.B, k int) {
		var c coalesceResult
		for b.Loop() {
			c = runCoalesce(*burstFlag, k)
		}
		b.ReportMetric(float64(c.processes), "processes")
		b.ReportMetric(float64(c.perCall.median().Nanoseconds()), "join-median-ns")
		recorded.coalesce[k] = c
	})
}
