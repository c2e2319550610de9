//go:build linux

// Command bench compares bgjob with os/exec and github.com/go-cmd/cmd on
// six workloads and prints one table, with bgjob's targets checked row by
// row. Run it from this directory:
//
//	go run .          # full sizes, about a minute on 2 cores
//	go run . -quick   # small sizes, for CI
//	go run . -strict  # exit 1 if a target is missed
//
// It is Linux-only: the foreground latency uses the kernel's process
// events connector (root) to learn when a child exited. Elsewhere it
// only says so (other.go).
package main

import (
	"flag"
	"fmt"
	"os"
	"runtime"
	"strings"
	"time"
)

// sizes of the workloads.
type sizes struct {
	spawn       int   // sequential runs per implementation
	interactive int   // TTY spawns per implementation, and round trips
	foreground  int   // sequential runs per implementation
	capture     int64 // bytes
	captureRuns int   // child processes per implementation
	fanout      int   // concurrent jobs
	retained    int   // finished jobs kept
	calls       int   // Status and Read calls each
	coalesce    int   // concurrent identical Starts
}

var (
	full  = sizes{interactive: 1000, spawn: 1000, foreground: 1000, capture: 1 << 30, captureRuns: 3, fanout: 1000, retained: 10000, calls: 20000, coalesce: 1000}
	quick = sizes{interactive: 200, spawn: 200, foreground: 200, capture: 64 << 20, captureRuns: 3, fanout: 200, retained: 1000, calls: 5000, coalesce: 200}
)

var workloads = []string{"spawn", "sandbox", "foreground", "capture", "fanout", "status", "coalesce", "interactive", "tree"}

func main() {
	var (
		quickFlag = flag.Bool("quick", false, "small sizes (64 MiB capture, 200 fan-out, 1000 retained), for CI")
		strict    = flag.Bool("strict", false, "exit 1 if bgjob misses a target")
		only      = flag.String("only", "", "comma-separated workloads to run: "+strings.Join(workloads, ","))
		child     = flag.String("capture-child", "", "internal: run one capture in this process")
		listen    = flag.Bool("listen-child", false, "internal: be a dev server for the tree workload")
		chatty    = flag.Bool("chatty", false, "internal: with -listen-child, write a line every 500 µs")
		childN    = flag.Int64("capture-bytes", 0, "internal: bytes for -capture-child")
	)
	flag.Parse()
	if *child != "" {
		captureChild(*child, *childN)
		return
	}
	if *listen {
		listenChild(*chatty)
		return
	}
	sz := full
	if *quickFlag {
		sz = quick
	}
	run := map[string]bool{}
	for _, w := range strings.Split(*only, ",") {
		if w = strings.TrimSpace(w); w != "" {
			if !contains(workloads, w) {
				fatalf("-only: unknown workload %q (have %s)", w, strings.Join(workloads, ","))
			}
			run[w] = true
		}
	}
	want := func(w string) bool { return len(run) == 0 || run[w] }

	begin := time.Now()
	fmt.Printf("bgjob bench: %s/%s, %d CPUs, %s, %s sizes, load average %s at start\n\n", runtime.GOOS, runtime.GOARCH, runtime.NumCPU(), runtime.Version(), map[bool]string{true: "quick", false: "full"}[*quickFlag], loadAvg())
	var rows []row
	var notes []string
	step := func(name string, f func()) {
		if !want(name) {
			return
		}
		t := time.Now()
		f()
		fmt.Fprintf(os.Stderr, "bench: %s done in %v\n", name, time.Since(t).Round(time.Millisecond))
	}
	step("spawn", func() {
		s := runSpawn(sz.spawn)
		rows = append(rows, spawnRows(s)...)
		notes = append(notes, fmt.Sprintf("spawn: %d sequential runs of /bin/sh -c true per implementation, interleaved; os/exec is exec.Command(...).Run() (no output kept); os/exec set up as bgjob runs a job (Setsid, stdout+stderr through one pipe into a buffer, Dir) took %v, bgjob in its session %.2f× that, in its cgroup %.2f×",
			sz.spawn, s.like.Round(100*time.Nanosecond), float64(s.session)/float64(s.like), float64(s.median[bgJob])/float64(s.like)))
		notes = append(notes, fmt.Sprintf("spawn with Spec.Args: %s with no shell, in the same rounds; os/exec is exec.Command(%q).Run(); set up as bgjob runs a job it took %v, bgjob (Spec.Args, its session) %.2f× that",
			argvTrue[0], argvTrue[0], s.argvLike.Round(100*time.Nanosecond), float64(s.argvBgjob)/float64(s.argvLike)))
		notes = append(notes, fmt.Sprintf("spawn with Limits: %+v, set by the job's shell on itself (ulimit) before it evals the command; bgjob in its session %.2f× os/exec set up as bgjob runs a job, %.2f× bgjob without limits",
			spawnLimits, float64(s.limited)/float64(s.like), float64(s.limited)/float64(s.session)))
	})
	step("sandbox", func() {
		n := max(sz.spawn/5, 20)
		s := runSandbox(n)
		rows = append(rows, sandboxRows(s)...)
		if s.err == "" {
			notes = append(notes, fmt.Sprintf("sandbox: %d sequential runs of a sandboxed `true` each, interleaved; os/exec runs the same command line, set up as bgjob runs a job: %s", n, strings.Join(s.argv, " ")))
		}
	})
	step("foreground", func() {
		rows = append(rows, fgRows(runForeground(sz.foreground))...)
		notes = append(notes, fmt.Sprintf("foreground latency: %d runs each; kernel exit stamp (proc connector) to the caller's return, CLOCK_MONOTONIC", sz.foreground))
	})
	step("capture", func() {
		c, durable, watched := runCapture(sz.capture, sz.captureRuns)
		rows = append(rows, captureRows(c, durable, watched, sz.capture)...)
		if watched.err == "" && c[bgJob].err == "" {
			notes = append(notes, fmt.Sprintf("capture: with 4 watches (regexps such as `(?i)error|listening on|ready in`, none matching) at %.2f× memory mode's throughput, CPU %.2f s/GiB", watched.mibps/c[bgJob].mibps, median(watched.cpu)))
		}
		if durable.err == "" && c[bgJob].err == "" {
			notes = append(notes, fmt.Sprintf("capture: durable mode (output copied to a file as it is read, with splice) at %.2f× memory mode's throughput", durable.mibps/c[bgJob].mibps))
		}
		var a []string
		for k := range nImpl {
			a = append(a, fmt.Sprintf("%s %.2f", implNames[k], median(c[k].cpu)))
		}
		notes = append(notes, "capture: CPU seconds per GiB of the capturing process (median run): "+strings.Join(a, ", "))
		notes = append(notes, fmt.Sprintf("capture: `yes <63 chars> | head -c %d`, each implementation in a child process of its own, %d run(s) each; os/exec copies into io.Discard (the floor), go-cmd streams lines on its channels, bgjob keeps head+tail", sz.capture, sz.captureRuns))
	})
	step("fanout", func() {
		var f [nImpl]fanoutResult
		for k := range nImpl {
			f[k] = runFanout(sz.fanout, k)
		}
		rows = append(rows, fanoutRows(f)...)
		var a []string
		for k := range nImpl {
			a = append(a, fmt.Sprintf("%s %d/%d alive after %v", implNames[k], f[k].alive, f[k].n, f[k].startAll.Round(time.Millisecond)))
		}
		notes = append(notes, "fan-out: deltas taken once every job has its process; goroutines divided by the jobs they serve, counted at the same instant (bgjob: Registry.Running, others: live processes), heap by the processes still alive ("+strings.Join(a, ", ")+"); heap is HeapAlloc after a GC (records of finished jobs included, goroutine stacks not)")
	})
	step("status", func() {
		s := runStatus(sz.retained, sz.calls)
		rows = append(rows, statusRows(s)...)
		n := fmt.Sprintf("status: %d real `echo retained` jobs run in %v, then %d Status and %d Read(id, 0, 4096) of random ones", s.retained, s.fill.Round(time.Millisecond), sz.calls, sz.calls)
		if s.statusMiss > 0 {
			n += fmt.Sprintf("; %d lookups FAILED", s.statusMiss)
			rows[len(rows)-4].check = func([nImpl]cell) bool { return false }
		}
		notes = append(notes, n)
	})
	step("coalesce", func() {
		var c [nImpl]coalesceResult
		c[osExec] = runCoalesce(sz.coalesce, osExec)
		c[bgJob] = runCoalesce(sz.coalesce, bgJob)
		rows = append(rows, coalesceRows(c)...)
		notes = append(notes, fmt.Sprintf("coalesce: %d goroutines released at once, each one Start of `sleep 1`; bgjob processes counted by Telemetry.JobStarted, %d calls joined; os/exec has no coalescing (one exec.Cmd.Start each); burst wall time os/exec %v, bgjob %v",
			sz.coalesce, c[bgJob].joined, c[osExec].wall.Round(time.Microsecond), c[bgJob].wall.Round(time.Microsecond)))
	})
	step("interactive", func() {
		s := runInteractive(sz.interactive)
		rows = append(rows, interactiveRows(s)...)
		notes = append(notes, fmt.Sprintf("interactive: %d sequential runs of /bin/sh -c true on a new pseudo-terminal per implementation, interleaved; os/exec opens it with x/sys/unix as bgjob does, starts the shell with Setsid+Setctty and reads the master to its end; bgjob in its cgroup %.2f× os/exec; round trips: %d lines written one at a time to cat (pipe: median %v; terminal with echo off: median %v)",
			sz.interactive, float64(s.ttyCgroup)/float64(s.ptyOS), sz.interactive, s.pipeRTT.median().Round(time.Microsecond), s.ttyRTT.median().Round(time.Microsecond)))
	})
	step("tree", func() {
		n := max(sz.calls/10, 500)
		for _, cg := range []string{"", "off"} {
			t := runTree(n, cg)
			rows = append(rows, treeRows(t)...)
			if t.err == "" {
				notes = append(notes, fmt.Sprintf("tree (%s): a dev server (a listener and a sleep that its shell left running, LeftoversWait), %d processes and %d port in each snapshot; %d Status calls of it quiet, then %d of a chatty one (a line every 500 µs, 1 ms between calls: %d calls came after output, each listing the tree anew)",
					t.mode, t.procs, t.ports, n, n, t.chattyListings))
			}
		}
	})
	failed := render(os.Stdout, rows)
	fmt.Println()
	for _, n := range notes {
		fmt.Println("- " + n)
	}
	fmt.Printf("\ntotal %v, load average %s at the end\n", time.Since(begin).Round(time.Millisecond), loadAvg())
	if busy() {
		fmt.Println("warning: other processes kept the machine busy; timings are unreliable")
	}
	if failed {
		fmt.Println("some targets missed (FAIL)")
		if *strict {
			os.Exit(1)
		}
	}
}

func contains(l []string, s string) bool {
	for _, x := range l {
		if x == s {
			return true
		}
	}
	return false
}

// loadAvg returns the 1-minute load average, or "?".
func loadAvg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?"
	}
	return f[0]
}

// busy reports whether the 1-minute load average says that more than
// this benchmark ran (it alone keeps it near 1 on this machine).
func busy() bool {
	var l float64
	if _, err := fmt.Sscan(loadAvg(), &l); err != nil {
		return false
	}
	return l > float64(runtime.NumCPU())
}
