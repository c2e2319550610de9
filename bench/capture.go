//go:build linux

package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"os/exec"
	"regexp"
	"slices"
	"strconv"
	"time"

	"github.com/bgjob/bgjob"
	"github.com/go-cmd/cmd"
	"golang.org/x/sys/unix"
)

// captureLine is what `yes` repeats: 64-byte lines with the newline.
const captureLine = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde"

func captureCommand(n int64) string {
	return "yes " + captureLine + " | head -c " + strconv.FormatInt(n, 10)
}

// captureWatches are the watches of the capture row with watches: the
// patterns an agent host sets on a dev server or a build, none of which
// the captured lines match (so that the row measures matching, not
// delivery).
var captureWatches = []bgjob.Watch{
	{Name: "problem", Pattern: regexp.MustCompile(`(?i)error|listening on|ready in`), Every: true},
	{Name: "warning", Pattern: regexp.MustCompile(`(?i)\bwarn(ing)?\b`), Every: true},
	{Name: "crash", Pattern: regexp.MustCompile(`panic:|FAIL|Traceback \(most recent call last\)`)},
	{Name: "built", Pattern: regexp.MustCompile(`(?i)compiled successfully|webpack \d+\.\d+\.\d+`)},
}

// captureReport is what a capture child prints as JSON.
type captureReport struct {
	Impl    string  `json:"impl"`
	Bytes   int64   `json:"bytes"`   // bytes the implementation saw (os/exec: asked for)
	Seconds float64 `json:"seconds"` // from the call to its return
	MaxRSS  int64   `json:"maxrss"`  // KiB, getrusage(RUSAGE_SELF) of the child
	CPU     float64 `json:"cpu"`     // user+system seconds of the child itself
}

// captureResult: workload 3.
type captureResult struct {
	mibps  float64 // median of the runs
	rssMiB float64 // largest of the runs
	all    []float64
	cpu    []float64 // CPU seconds per GiB of the capturing process, per run
	runs   int
	err    string
}

// captureChild runs one capture of n bytes in this process and prints a
// captureReport. It is the body of `bench -capture-child IMPL`: peak RSS
// is per process and for its whole life, so each implementation gets a
// process of its own.
func captureChild(impl string, n int64) {
	t0 := time.Now()
	got, err := capture(impl, n)
	if err != nil {
		fatalf("capture %s: %v", impl, err)
	}
	secs := time.Since(t0).Seconds()
	var ru unix.Rusage
	unix.Getrusage(unix.RUSAGE_SELF, &ru)
	cpu := time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
	json.NewEncoder(os.Stdout).Encode(captureReport{Impl: impl, Bytes: got, Seconds: secs, MaxRSS: ru.Maxrss, CPU: cpu})
}

// capture runs a command that writes n bytes with the implementation
// impl and returns how many bytes it saw.
func capture(impl string, n int64) (int64, error) {
	command := captureCommand(n)
	var got int64
	switch impl {
	case "os/exec":
		// The floor: os/exec copies the pipe into io.Discard.
		c := exec.Command(shell[0], shArgs(command)...)
		c.Stdout, c.Stderr = io.Discard, io.Discard
		if err := c.Run(); err != nil {
			return 0, err
		}
		got = n
	case "go-cmd":
		// go-cmd's buffered mode keeps every line (over 1 GiB of strings
		// for 1 GiB of output); its streaming mode is the one meant for
		// big outputs: lines on channels, which must be drained.
		c := cmd.NewCmdOptions(cmd.Options{Streaming: true}, shell[0], shArgs(command)...)
		status := c.Start()
		stdout, stderr := c.Stdout, c.Stderr
		for stdout != nil || stderr != nil {
			select {
			case l, ok := <-stdout:
				if !ok {
					stdout = nil
					continue
				}
				got += int64(len(l)) + 1
			case l, ok := <-stderr:
				if !ok {
					stderr = nil
					continue
				}
				got += int64(len(l)) + 1
			}
		}
		if st := <-status; st.Error != nil || st.Exit != 0 {
			return 0, fmt.Errorf("%v, exit %d", st.Error, st.Exit)
		}
	case "bgjob", "bgjob-durable", "bgjob-watch":
		cfg := bgjob.Config{}
		spec := bgjob.Spec{Command: command}
		if impl == "bgjob-watch" {
			spec.Watches = captureWatches
			cfg.OnMatch = func(m bgjob.Match) {
				fatalf("capture with watches: unexpected match %+v", m)
			}
		}
		if impl == "bgjob-durable" {
			dir, err := os.MkdirTemp("", "bgjob-bench-state-")
			if err != nil {
				return 0, err
			}
			defer os.RemoveAll(dir)
			cfg.StateDir = dir
		}
		r := newRegistry(cfg)
		defer closeRegistry(r)
		res, err := r.RunForeground(context.Background(), spec, bgjob.Foreground{SoftCap: 10 * time.Minute})
		if err != nil {
			return 0, err
		}
		if res.Detached || res.ExitCode != 0 {
			return 0, fmt.Errorf("detached %v, exit %d %s", res.Detached, res.ExitCode, res.Reason)
		}
		got = res.Output.Total
	default:
		return 0, fmt.Errorf("unknown implementation %q", impl)
	}
	return got, nil
}

// runCapture runs each implementation's capture of n bytes in a child
// process (this program, re-executed), runs times, interleaved; and
// bgjob's in durable mode (its output copied to a file as it is read)
// and with four watches (captureWatches) as the last ones.
func runCapture(n int64, runs int) (res [nImpl]captureResult, durable, watched captureResult) {
	exe, err := os.Executable()
	if err != nil {
		for k := range res {
			res[k].err = err.Error()
		}
		durable.err, watched.err = err.Error(), err.Error()
		return res, durable, watched
	}
	impls := append(implNames[:], "bgjob-durable", "bgjob-watch")
	for range runs {
		for k, impl := range impls {
			r := &durable
			switch {
			case k < nImpl:
				r = &res[k]
			case impl == "bgjob-watch":
				r = &watched
			}
			if r.err != "" {
				continue
			}
			out, err := exec.Command(exe, "-capture-child", impl, "-capture-bytes", strconv.FormatInt(n, 10)).Output()
			var rep captureReport
			if err == nil {
				err = json.Unmarshal(out, &rep)
			}
			if err == nil && rep.Bytes != n {
				err = fmt.Errorf("captured %d bytes; want %d", rep.Bytes, n)
			}
			if err != nil {
				if ee, ok := err.(*exec.ExitError); ok {
					err = fmt.Errorf("%v: %s", err, ee.Stderr)
				}
				r.err = err.Error()
				continue
			}
			r.runs++
			r.all = append(r.all, float64(n)/(1<<20)/rep.Seconds)
			r.mibps = median(r.all)
			r.cpu = append(r.cpu, rep.CPU*(1<<30)/float64(n))
			r.rssMiB = max(r.rssMiB, float64(rep.MaxRSS)/1024)
		}
	}
	return res, durable, watched
}

func median(v []float64) float64 {
	c := slices.Clone(v)
	slices.Sort(c)
	if len(c)%2 == 1 {
		return c[len(c)/2]
	}
	return (c[len(c)/2-1] + c[len(c)/2]) / 2
}
