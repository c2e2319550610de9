//go:build linux

package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/bgjob/bgjob"
	"github.com/go-cmd/cmd"
)

// The three implementations, in column order.
const (
	osExec = iota
	goCmd
	bgJob
	nImpl
)

var implNames = [nImpl]string{"os/exec", "go-cmd", "bgjob"}

// Every implementation runs its command as /bin/sh -c COMMAND, which is
// what bgjob does with its default Config.Shell.
var shell = []string{"/bin/sh", "-c"}

func shArgs(command string) []string { return append(slices.Clone(shell[1:]), command) }

// stat is a set of timings.
type stat []time.Duration

func (s stat) sorted() stat {
	c := slices.Clone(s)
	slices.Sort(c)
	return c
}

// quantile returns the q-quantile (nearest rank) of s.
func (s stat) quantile(q float64) time.Duration {
	if len(s) == 0 {
		return 0
	}
	c := s.sorted()
	i := int(q*float64(len(c))+0.5) - 1
	return c[min(max(i, 0), len(c)-1)]
}

func (s stat) median() time.Duration { return s.quantile(0.5) }
func (s stat) p99() time.Duration    { return s.quantile(0.99) }

func newRegistry(cfg bgjob.Config) *bgjob.Registry {
	r, err := bgjob.New(cfg)
	if err != nil {
		fatalf("bgjob.New: %v", err)
	}
	return r
}

func closeRegistry(r *bgjob.Registry) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if err := r.Close(ctx); err != nil {
		fatalf("bgjob Close: %v", err)
	}
}

// runner runs `/bin/sh -c true` once to its end and returns the PID of
// the shell.
type runner func() (pid int, err error)

func osExecRun(command string) runner {
	return func() (int, error) {
		c := exec.Command(shell[0], shArgs(command)...)
		err := c.Run()
		if c.Process == nil {
			return 0, err
		}
		return c.Process.Pid, err
	}
}

func goCmdRun(command string) runner {
	return func() (int, error) {
		st := <-cmd.NewCmd(shell[0], shArgs(command)...).Start()
		if st.Error == nil && st.Exit != 0 {
			st.Error = fmt.Errorf("exit %d", st.Exit)
		}
		return st.PID, st.Error
	}
}

func bgjobRun(r *bgjob.Registry, command string) runner {
	ctx := context.Background()
	return func() (int, error) {
		res, err := r.RunForeground(ctx, bgjob.Spec{Command: command}, bgjob.Foreground{SoftCap: time.Minute})
		switch {
		case err != nil:
		case res.Detached:
			err = errors.New("detached")
		case res.State != bgjob.Exited || res.ExitCode != 0:
			err = fmt.Errorf("%v, exit %d: %s", res.State, res.ExitCode, res.Reason)
		}
		return res.PID, err
	}
}

func runners(reg *bgjob.Registry, command string) [nImpl]runner {
	return [nImpl]runner{osExecRun(command), goCmdRun(command), bgjobRun(reg, command)}
}

// osExecLikeBgjob runs command with os/exec set up the way bgjob runs a
// job: a new session, stdout and stderr captured through one pipe into a
// buffer, and an explicit working directory.
func osExecLikeBgjob(command string) runner {
	return osExecArgvLikeBgjob(append([]string{shell[0]}, shArgs(command)...)...)
}

// osExecArgvLikeBgjob runs argv as osExecLikeBgjob runs a command.
func osExecArgvLikeBgjob(argv ...string) runner {
	dir, err := os.Getwd()
	if err != nil {
		fatalf("getwd: %v", err)
	}
	return func() (int, error) {
		var out bytes.Buffer
		c := exec.Command(argv[0], argv[1:]...)
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		c.Stdout, c.Stderr, c.Dir = &out, &out, dir
		err := c.Run()
		if c.Process == nil {
			return 0, err
		}
		return c.Process.Pid, err
	}
}

// osExecArgv runs argv with os/exec, no shell: the floor of the Spec.Args
// row.
func osExecArgv(argv ...string) runner {
	return func() (int, error) {
		c := exec.Command(argv[0], argv[1:]...)
		err := c.Run()
		if c.Process == nil {
			return 0, err
		}
		return c.Process.Pid, err
	}
}

// bgjobArgsRun runs argv as a job of Spec.Args (no shell) to its end.
func bgjobArgsRun(r *bgjob.Registry, argv ...string) runner {
	ctx := context.Background()
	return func() (int, error) {
		res, err := r.RunForeground(ctx, bgjob.Spec{Args: argv}, bgjob.Foreground{SoftCap: time.Minute})
		switch {
		case err != nil:
		case res.Detached:
			err = errors.New("detached")
		case res.State != bgjob.Exited || res.ExitCode != 0:
			err = fmt.Errorf("%v, exit %d: %s", res.State, res.ExitCode, res.Reason)
		}
		return res.PID, err
	}
}

// argvTrue is the program of the Spec.Args row: `true` with no shell.
var argvTrue = []string{"/bin/true"}

// spawnResult: workload 1.
type spawnResult struct {
	median  [nImpl]time.Duration // bgjob: the default containment (a cgroup where there is one)
	contain bgjob.Containment    // what the default gave
	session time.Duration        // bgjob with Config.Cgroup "off": the job's session only
	like    time.Duration        // os/exec set up like bgjob (osExecLikeBgjob)
	// The Spec.Args row: os/exec of argvTrue, and bgjob's Spec.Args of
	// it in the job's session (Config.Cgroup "off"), as the session row;
	// argvLike is os/exec of argvTrue set up like bgjob.
	argvOS, argvBgjob, argvLike time.Duration
	// The limits row: bgjob in the job's session with spawnLimits set,
	// which this host enforces on each process (see bgjob.Limits).
	limited time.Duration
}

// spawnLimits are the limits of the limits row: generous, so that `true`
// runs as it would without them, and all of the kind every Unix host can
// enforce.
var spawnLimits = bgjob.Limits{Memory: 1 << 30, CPUTime: time.Minute, FileSize: 1 << 30, OpenFiles: 1024}

// shuffled returns the order of the implementations for one round: a
// fresh random order each round, so that no implementation always runs
// just after the same other one and pays for its leftovers (go-cmd, for
// one, is still tearing down when its status arrives). A rotation would
// not do: it keeps every implementation's predecessor fixed.
func shuffled(rng *rand.Rand, n int) []int { return rng.Perm(n) }

// runSpawn starts and waits for `true` n times with each implementation,
// sequentially, in a random order each round; and, in the same rounds,
// /bin/true with no shell through os/exec and through Spec.Args. It
// returns the median time per job.
func runSpawn(n int) spawnResult {
	reg := newRegistry(bgjob.Config{})
	defer closeRegistry(reg)
	plain := newRegistry(bgjob.Config{Cgroup: "off"})
	defer closeRegistry(plain)
	three := runners(reg, "true")
	limited := newRegistry(bgjob.Config{Cgroup: "off", Limits: spawnLimits})
	defer closeRegistry(limited)
	rs := append(three[:], osExecLikeBgjob("true"), bgjobRun(plain, "true"), osExecArgv(argvTrue...), bgjobArgsRun(plain, argvTrue...), osExecArgvLikeBgjob(argvTrue...), bgjobRun(limited, "true"))
	samples := make([]stat, len(rs))
	rng := rand.New(rand.NewPCG(3, 4))
	for i := range n + n/10 {
		for _, impl := range shuffled(rng, len(rs)) {
			t0 := time.Now()
			_, err := rs[impl]()
			d := time.Since(t0)
			if err != nil {
				fatalf("spawn %d: %v", impl, err)
			}
			if i >= n/10 { // the first tenth warms up
				samples[impl] = append(samples[impl], d)
			}
		}
	}
	var res spawnResult
	for k := range nImpl {
		res.median[k] = samples[k].median()
	}
	res.like = samples[nImpl].median()
	res.session = samples[nImpl+1].median()
	res.argvOS, res.argvBgjob, res.argvLike = samples[nImpl+2].median(), samples[nImpl+3].median(), samples[nImpl+4].median()
	res.limited = samples[nImpl+5].median()
	s, err := reg.Start(context.Background(), bgjob.Spec{Command: "true", Unique: true})
	if err != nil {
		fatalf("spawn: %v", err)
	}
	res.contain = s.Containment
	return res
}

// fgResult: workload 2.
type fgResult struct {
	median, p99 [nImpl]time.Duration
	err         string // why it could not be measured
}

// runForeground measures, for n sequential runs of `true`, the time
// between the kernel's record of the shell's exit and the return of the
// call that ran it (see exitWatch).
func runForeground(n int) fgResult {
	w, err := openExitWatch()
	if err != nil {
		return fgResult{err: err.Error()}
	}
	defer w.Close()
	reg := newRegistry(bgjob.Config{})
	defer closeRegistry(reg)
	rs := runners(reg, "true")
	var samples [nImpl]stat
	rng := rand.New(rand.NewPCG(5, 6))
	for i := range n + n/10 {
		for _, impl := range shuffled(rng, nImpl) {
			w.reset()
			pid, err := rs[impl]()
			ret := monoNow()
			if err != nil {
				fatalf("foreground %s: %v", implNames[impl], err)
			}
			exit, err := w.exitTime(pid, 2*time.Second)
			if err != nil {
				return fgResult{err: err.Error()}
			}
			if i >= n/10 {
				samples[impl] = append(samples[impl], time.Duration(max(ret-exit, 0)))
			}
		}
	}
	var res fgResult
	for k := range nImpl {
		res.median[k], res.p99[k] = samples[k].median(), samples[k].p99()
	}
	return res
}

// fanoutResult: workload 4.
type fanoutResult struct {
	n          int
	wall       time.Duration // first start to last end
	startAll   time.Duration // first start to "all running"
	alive      int           // processes alive when the counts were taken
	goroutines float64       // per running job
	heap       float64       // HeapAlloc bytes per running job
}

// memNow returns the goroutine count and the live heap after a full GC.
func memNow() (int, uint64) {
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return runtime.NumGoroutine(), ms.HeapAlloc
}

// processAlive reports whether pid is a live process (not a zombie).
func processAlive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	i := bytes.LastIndexByte(b, ')')
	return i >= 0 && i+2 < len(b) && b[i+2] != 'Z' && b[i+2] != 'X'
}

func countAlive(pids []int) int {
	n := 0
	for _, p := range pids {
		if processAlive(p) {
			n++
		}
	}
	return n
}

// fanout runs n concurrent `sleep 1` jobs, each capturing its output as
// the implementation does by default (os/exec: stdout and stderr into
// one bytes.Buffer). Counts are taken once every job has its process.
type fanoutImpl struct {
	start func(i int) // start job i
	ready func() []int
	wait  func()
}

func runFanout(n int, impl int) fanoutResult {
	command := "sleep 1"
	var fi fanoutImpl
	var reg *bgjob.Registry
	switch impl {
	case osExec:
		cmds := make([]*exec.Cmd, n)
		bufs := make([]bytes.Buffer, n)
		fi.start = func(i int) {
			c := exec.Command(shell[0], shArgs(command)...)
			c.Stdout, c.Stderr = &bufs[i], &bufs[i]
			if err := c.Start(); err != nil {
				fatalf("fan-out os/exec: %v", err)
			}
			cmds[i] = c
		}
		fi.ready = func() []int {
			pids := make([]int, n)
			for i, c := range cmds {
				pids[i] = c.Process.Pid
			}
			return pids
		}
		fi.wait = func() {
			for _, c := range cmds {
				if err := c.Wait(); err != nil {
					fatalf("fan-out os/exec: %v", err)
				}
			}
		}
	case goCmd:
		cmds := make([]*cmd.Cmd, n)
		chans := make([]<-chan cmd.Status, n)
		fi.start = func(i int) {
			cmds[i] = cmd.NewCmd(shell[0], shArgs(command)...)
			chans[i] = cmds[i].Start()
		}
		fi.ready = func() []int {
			// go-cmd's Start returns before the process exists.
			pids := make([]int, n)
			for i, c := range cmds {
				for {
					st := c.Status()
					if st.PID != 0 || st.Error != nil {
						pids[i] = st.PID
						break
					}
					time.Sleep(100 * time.Microsecond)
				}
			}
			return pids
		}
		fi.wait = func() {
			for _, ch := range chans {
				if st := <-ch; st.Error != nil || st.Exit != 0 {
					fatalf("fan-out go-cmd: %v, exit %d", st.Error, st.Exit)
				}
			}
		}
	case bgJob:
		reg = newRegistry(bgjob.Config{MaxRunning: 2 * n, Retention: bgjob.Retention{MaxJobs: 2 * n}})
		ids := make([]bgjob.ID, n)
		pids := make([]int, n)
		ctx := context.Background()
		fi.start = func(i int) {
			s, err := reg.Start(ctx, bgjob.Spec{Command: command, Unique: true})
			if err != nil {
				fatalf("fan-out bgjob: %v", err)
			}
			ids[i], pids[i] = s.ID, s.PID
		}
		fi.ready = func() []int { return pids }
		fi.wait = func() {
			for _, id := range ids {
				s, err := reg.Wait(ctx, id)
				if err != nil || s.State != bgjob.Exited || s.ExitCode != 0 {
					fatalf("fan-out bgjob: %v %v %d %s", err, s.State, s.ExitCode, s.Reason)
				}
			}
		}
	}
	g0, h0 := memNow()
	t0 := time.Now()
	for i := range n {
		fi.start(i)
	}
	pids := fi.ready()
	startAll := time.Since(t0)
	// Goroutines, and the jobs they serve, counted back to back: for
	// bgjob the jobs not yet finished (a job whose process has just
	// exited keeps its goroutines until it is finished), for the others
	// the processes alive.
	gNow := runtime.NumGoroutine()
	holders := -1
	if reg != nil {
		holders = reg.Running()
	}
	_, h1 := memNow()
	alive := countAlive(pids)
	if holders < 0 {
		holders = alive
	}
	fi.wait()
	wall := time.Since(t0)
	if reg != nil {
		closeRegistry(reg)
	}
	// Starting n processes on a small machine can take longer than the
	// jobs last: divide the heap by the jobs still running when it was
	// measured. That overstates it (the records of finished jobs are
	// counted too), never understates it.
	per := float64(max(alive, 1))
	return fanoutResult{
		n: n, wall: wall, startAll: startAll, alive: alive,
		goroutines: float64(gNow-g0) / float64(max(holders, 1)),
		heap:       float64(int64(h1)-int64(h0)) / per,
	}
}

// statusResult: workload 5.
type statusResult struct {
	retained         int
	fill             time.Duration // time to run the retained jobs
	status, read     stat
	statusMiss       int // lookups of a retained job that failed
	readBytesPerCall int
}

// runStatus fills a registry with n finished, retained jobs (real
// processes, up to 32 at a time) and then times Status and Read of random
// ones, one call at a time.
func runStatus(n, calls int) statusResult {
	reg := newRegistry(bgjob.Config{MaxRunning: 64, Retention: bgjob.Retention{MaxJobs: 2 * n}})
	defer closeRegistry(reg)
	ctx := context.Background()
	ids := make([]bgjob.ID, 0, n)
	t0 := time.Now()
	const window = 32
	for i := range n {
		if i >= window {
			if _, err := reg.Wait(ctx, ids[i-window]); err != nil {
				fatalf("status fill: %v", err)
			}
		}
		s, err := reg.Start(ctx, bgjob.Spec{Command: "echo retained", Unique: true})
		if err != nil {
			fatalf("status fill: %v", err)
		}
		ids = append(ids, s.ID)
	}
	for _, id := range ids[max(0, n-window):] {
		if _, err := reg.Wait(ctx, id); err != nil {
			fatalf("status fill: %v", err)
		}
	}
	res := statusResult{retained: n, fill: time.Since(t0)}
	rng := rand.New(rand.NewPCG(1, 2))
	runtime.GC()
	for range calls {
		id := ids[rng.IntN(n)]
		t := time.Now()
		s, err := reg.Status(id)
		d := time.Since(t)
		if err != nil || s.State != bgjob.Exited {
			res.statusMiss++
		}
		res.status = append(res.status, d)
	}
	for range calls {
		id := ids[rng.IntN(n)]
		t := time.Now()
		c, err := reg.Read(id, 0, 4096)
		d := time.Since(t)
		if err != nil || !c.Done {
			res.statusMiss++
		}
		res.readBytesPerCall = len(c.Data)
		res.read = append(res.read, d)
	}
	return res
}

// coalesceResult: workload 6.
type coalesceResult struct {
	n         int
	processes int64
	joined    int
	perCall   stat // the calls that joined (bgjob) or every call (os/exec)
	wall      time.Duration
}

type countStarts struct{ n atomic.Int64 }

func (c *countStarts) JobStarted(bgjob.Event)  { c.n.Add(1) }
func (c *countStarts) JobFinished(bgjob.Event) {}

// burst releases n goroutines at once, each making one call, and returns
// each call's duration and the wall time of the whole burst.
func burst(n int, call func(i int)) (stat, time.Duration) {
	var ready, done sync.WaitGroup
	gate := make(chan struct{})
	durs := make(stat, n)
	ready.Add(n)
	done.Add(n)
	for i := range n {
		go func() {
			defer done.Done()
			ready.Done()
			<-gate
			t := time.Now()
			call(i)
			durs[i] = time.Since(t)
		}()
	}
	ready.Wait()
	t0 := time.Now()
	close(gate)
	done.Wait()
	return durs, time.Since(t0)
}

// runCoalesce makes n identical concurrent Starts of `sleep 1`. For bgjob
// the processes are counted by Config.Telemetry's JobStarted; os/exec has
// no coalescing, so each call is a process of its own.
func runCoalesce(n int, impl int) coalesceResult {
	command := "sleep 1"
	res := coalesceResult{n: n}
	switch impl {
	case osExec:
		cmds := make([]*exec.Cmd, n)
		durs, wall := burst(n, func(i int) {
			c := exec.Command(shell[0], shArgs(command)...)
			if err := c.Start(); err != nil {
				fatalf("coalesce os/exec: %v", err)
			}
			cmds[i] = c
		})
		for _, c := range cmds {
			c.Wait()
		}
		res.processes, res.perCall, res.wall = int64(n), durs, wall
	case bgJob:
		var starts countStarts
		reg := newRegistry(bgjob.Config{MaxRunning: 2 * n, Telemetry: &starts})
		defer closeRegistry(reg)
		ctx := context.Background()
		joined := make([]bool, n)
		ids := make([]bgjob.ID, n)
		durs, wall := burst(n, func(i int) {
			s, err := reg.Start(ctx, bgjob.Spec{Command: command})
			if err != nil {
				fatalf("coalesce bgjob: %v", err)
			}
			joined[i], ids[i] = s.Joined, s.ID
		})
		for i, j := range joined {
			if j {
				res.joined++
				res.perCall = append(res.perCall, durs[i])
			}
		}
		if _, err := reg.Wait(ctx, ids[0]); err != nil {
			fatalf("coalesce bgjob: %v", err)
		}
		res.processes, res.wall = starts.n.Load(), wall
	}
	return res
}

func fatalf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
	os.Exit(2)
}

// sandboxResult: the sandbox row of workload 1.
type sandboxResult struct {
	osExec, bgjob time.Duration // medians
	argv          []string      // the bwrap command line both ran
	err           string        // why it could not be measured
}

// runSandbox measures n sequential runs of a sandboxed `true`: bgjob's,
// with its default containment, and os/exec of the very bwrap command
// line bgjob ran (which a Launcher that changes nothing records), set up
// as bgjob runs a job.
func runSandbox(n int) sandboxResult {
	var argv []string
	reg, err := bgjob.New(bgjob.Config{Launcher: func(a []string) ([]string, error) {
		argv = a
		return a, nil
	}})
	if err != nil {
		fatalf("sandbox: %v", err)
	}
	defer closeRegistry(reg)
	res, err := reg.RunForeground(context.Background(), bgjob.Spec{Command: "true", Sandbox: &bgjob.Sandbox{}}, bgjob.Foreground{SoftCap: time.Minute})
	if err == nil {
		err = res.Err()
	}
	if err != nil || res.ExitCode != 0 {
		return sandboxResult{err: fmt.Sprintf("no sandbox here: %v %s", err, res.Reason)}
	}
	ctx := context.Background()
	rs := []runner{
		osExecArgvLikeBgjob(argv...),
		func() (int, error) {
			res, err := reg.RunForeground(ctx, bgjob.Spec{Command: "true", Sandbox: &bgjob.Sandbox{}}, bgjob.Foreground{SoftCap: time.Minute})
			if err == nil && (res.State != bgjob.Exited || res.ExitCode != 0) {
				err = fmt.Errorf("%v, exit %d: %s", res.State, res.ExitCode, res.Reason)
			}
			return res.PID, err
		},
	}
	samples := make([]stat, len(rs))
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range n + n/10 {
		for _, impl := range shuffled(rng, len(rs)) {
			t0 := time.Now()
			_, err := rs[impl]()
			d := time.Since(t0)
			if err != nil {
				fatalf("sandbox %d: %v", impl, err)
			}
			if i >= n/10 {
				samples[impl] = append(samples[impl], d)
			}
		}
	}
	return sandboxResult{osExec: samples[0].median(), bgjob: samples[1].median(), argv: argv}
}
