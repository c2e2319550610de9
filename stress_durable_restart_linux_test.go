package bgjob_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
	"golang.org/x/sys/unix"
)

// The restarts of TestStressDurable: in process (Detach, then New, under
// descriptor pressure or not) and by a crash host (TestStressDurableHost,
// at the end of this file); and the log handler the registries share.

// dLog counts the registries' log records and keeps the first few.
type dLog struct {
	mu    sync.Mutex
	n     int
	byMsg map[string]int
	first []string
}

func (l *dLog) Enabled(context.Context, slog.Level) bool { return true }
func (l *dLog) WithAttrs([]slog.Attr) slog.Handler       { return l }
func (l *dLog) WithGroup(string) slog.Handler            { return l }
func (l *dLog) Handle(_ context.Context, r slog.Record) error {
	var b strings.Builder
	b.WriteString(r.Message)
	r.Attrs(func(a slog.Attr) bool { fmt.Fprintf(&b, " %s=%v", a.Key, a.Value); return true })
	l.mu.Lock()
	defer l.mu.Unlock()
	l.n++
	if l.byMsg == nil {
		l.byMsg = map[string]int{}
	}
	l.byMsg[r.Message]++
	if len(l.first) < 8 {
		l.first = append(l.first, b.String())
	}
	return nil
}

// restart ends the current registry (Detach), crashes a host on the state
// directory if crash is set, and opens the next registry, under
// descriptor pressure if pressure is set. It returns false if the test
// cannot go on.
func (ds *dStress) restart(round int, crash, pressure bool) bool {
	ds.restarting.Store(true)
	old := ds.reg // only this goroutine writes ds.reg
	racing := ds.rng.IntN(2) == 0
	var err error
	if racing { // while the workers' calls are under way
		ds.n.racing.Add(1)
		err = old.Detach()
	}
	ds.regMu.Lock()
	defer ds.regMu.Unlock()
	ok := false
	defer func() { ds.broken.Store(!ok) }() // runs before the unlocks: no worker uses a detached registry
	if !racing {
		err = old.Detach()
	}
	if err != nil {
		ds.fail("round %d: Detach: %v", round, err)
	}
	for _, s := range dSessions {
		ds.drain(old, s, fmt.Sprintf("Completions of r%d after Detach", ds.gen))
	}
	if crash {
		if !ds.crash(round) {
			return false
		}
	} else {
		ds.n.inProc.Add(1)
	}
	r := ds.open(pressure)
	if r == nil {
		return false
	}
	ds.reg = r
	ds.gen++
	ds.n.adopted.Add(int64(r.Running()))
	ds.restarting.Store(false)
	for _, s := range dSessions {
		for _, snap := range r.List(s) {
			ds.checkSnap(fmt.Sprintf("List after restart %d", round), r, snap)
		}
	}
	ok = true
	return true
}

// open makes the next registry; under pressure, with few descriptors to
// spare, then more until New succeeds. A New that fails must leave every
// record as it was.
func (ds *dStress) open(pressure bool) *bgjob.Registry {
	cfg := ds.config()
	// No host runs now, and no Registry of this process: the state
	// directory's lock should be free. A dead crash host's lock may
	// linger for a moment (a child it was spawning holds a copy of the
	// descriptor until its exec), and New waits for it: the sighting is
	// counted, and New must still succeed.
	if h := dLockHolders(ds.state); len(h) > 0 {
		ds.n.inUse.Add(1)
		ds.t.Logf("the state directory's lock is held while no host runs, by %v", h)
	}
	if !pressure {
		r, err := bgjob.New(cfg)
		if err != nil {
			ds.fail("New: %v (lock holders now: %v)", err, dLockHolders(ds.state))
			return nil
		}
		return r
	}
	ds.n.pressured.Add(1)
	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		ds.t.Fatal(err)
	}
	before := dRecords(ds.state)
	for k := ds.rng.IntN(6); k < 400; k += 1 + ds.rng.IntN(3) {
		begin := time.Now()
		r, err := newWithSpare(ds.t, cfg, lim, k)
		ds.mu.Lock()
		ds.pressure = append(ds.pressure, [2]time.Time{begin, time.Now()})
		ds.mu.Unlock()
		if err == nil {
			ds.spare = append(ds.spare, k)
			return r
		}
		ds.n.failedNews.Add(1)
		ds.checkRecordsKept(before, dRecords(ds.state), err)
	}
	ds.fail("New failed with up to 400 descriptors to spare")
	return nil
}

// dLockHolders describes the processes that hold the flock of the state
// directory's lock file (from /proc/locks).
func dLockHolders(state string) []string {
	var st unix.Stat_t
	if unix.Stat(filepath.Join(state, "lock"), &st) != nil {
		return nil
	}
	b, _ := os.ReadFile("/proc/locks")
	var out []string
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		// 1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF
		if len(f) < 6 || f[1] != "FLOCK" || !strings.HasSuffix(f[5], fmt.Sprintf(":%d", st.Ino)) {
			continue
		}
		out = append(out, "lock taken by "+f[4])
	}
	if len(out) == 0 {
		return nil
	}
	// The processes that have the lock file open now: one of them holds
	// the lock (a flock belongs to an open file, shared across fork).
	lock := filepath.Join(state, "lock")
	for _, p := range procTable() {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", p.pid))
		for _, e := range fds {
			if l, _ := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", p.pid, e.Name())); l == lock {
				comm, _ := os.ReadFile(fmt.Sprintf("/proc/%d/comm", p.pid))
				cmd, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", p.pid))
				out = append(out, fmt.Sprintf("open in %d (parent %d, state %c, comm %q, test process %v): %.300q",
					p.pid, p.ppid, p.state, bytes.TrimSpace(comm), p.pid == os.Getpid(), bytes.ReplaceAll(cmd, []byte{0}, []byte{' '})))
			}
		}
	}
	return out
}

// dRecords returns the record.json of every run folder under state, by
// folder, and the entries of its quarantine.
func dRecords(state string) map[string]string {
	m := map[string]string{}
	runs, _ := filepath.Glob(filepath.Join(state, "sessions", "*", "job_*"))
	for _, run := range runs {
		b, err := os.ReadFile(filepath.Join(run, "record.json"))
		if err != nil {
			b = []byte("unreadable: " + err.Error())
		}
		m[run] = string(b)
	}
	q, _ := os.ReadDir(filepath.Join(state, "quarantine"))
	for _, e := range q {
		m["quarantine/"+e.Name()] = ""
	}
	return m
}

// checkRecordsKept checks the records after a failed New against those
// before it. The one change it lets pass is a record of a job whose shell
// ended while no host ran, rewritten with the end its exit marker tells:
// replay settles such records as it goes, before the step that failed.
func (ds *dStress) checkRecordsKept(before, after map[string]string, newErr error) {
	for run, b := range before {
		a, ok := after[run]
		_, quarantined := after["quarantine/"+filepath.Base(filepath.Dir(run))+"-"+filepath.Base(run)]
		switch {
		case !ok && quarantined && strings.HasPrefix(b, "unreadable:"):
			// A folder without a record (a launch a crash interrupted)
			// goes to the quarantine as replay meets it.
			ds.n.quarantined.Add(1)
		case !ok:
			ds.fail("failed New (%v): %s is gone", newErr, run)
		case a == b:
		case dSettled(b, a) && !dMarkedAlive(dRecPID(b), ds.mark):
			ds.n.settled.Add(1)
		default:
			ds.fail("failed New (%v) changed the record %s:\n%s\nwas\n%s", newErr, run, a, b)
		}
	}
	for run := range after {
		if _, ok := before[run]; !ok && !(strings.HasPrefix(run, "quarantine/") && ds.quarantinedOK(before, run)) {
			ds.fail("failed New (%v): %s appeared", newErr, run)
		}
	}
}

// quarantinedOK reports whether the quarantine entry q stands for a run
// folder that had no readable record before.
func (ds *dStress) quarantinedOK(before map[string]string, q string) bool {
	for run, b := range before {
		if strings.HasPrefix(b, "unreadable:") && q == "quarantine/"+filepath.Base(filepath.Dir(run))+"-"+filepath.Base(run) {
			return true
		}
	}
	return false
}

// dSettled reports whether record a is record b of a job that was
// starting or running, settled by replay: exited or failed (its exit
// marker, or none), or, if a host had begun to stop it (b's stop), ended
// as that stop ends it.
func dSettled(b, a string) bool {
	type rec struct {
		State string `json:"state"`
		Stop  *struct {
			State string `json:"state"`
		} `json:"stop"`
	}
	var rb, ra rec
	if json.Unmarshal([]byte(b), &rb) != nil || json.Unmarshal([]byte(a), &ra) != nil {
		return false
	}
	if rb.State != "running" && rb.State != "starting" {
		return false
	}
	if rb.Stop != nil {
		return ra.State == rb.Stop.State
	}
	return ra.State == "exited" || ra.State == "failed"
}

func dRecPID(rec string) int {
	i := strings.Index(rec, `"pid":`)
	if i < 0 {
		return 0
	}
	pid, _ := strconv.Atoi(strings.TrimRight(strings.SplitN(rec[i+6:], ",", 2)[0], "}"))
	return pid
}

// crash runs a host on the state directory and SIGKILLs it while it
// launches jobs, then SIGKILLs a few jobs while no host runs.
func (ds *dStress) crash(round int) bool {
	ds.n.crashes.Add(1)
	host := exec.Command(os.Args[0], "-test.run=^TestStressDurableHost$", "-test.count=1")
	host.Env = append(os.Environ(), dHostEnv+"="+ds.state, fmt.Sprintf("%s=%s %d %d %s", dHostArgs, ds.dir, ds.seed, round, ds.mark))
	var stderr bytes.Buffer
	host.Stderr = &stderr
	out, err := host.StdoutPipe()
	if err != nil {
		ds.t.Fatal(err)
	}
	born := time.Now()
	if err := host.Start(); err != nil {
		ds.t.Fatal(err)
	}
	lines := make(chan string, 1<<12)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	where := fmt.Sprintf("crash host %d", round)
	pending := map[int]int{}
	ready, ok := false, true
	kill := time.NewTimer(time.Hour)
	defer kill.Stop()
	timeout := time.After(2 * deadline)
	for ok {
		select {
		case l, open := <-lines:
			if !open {
				ok = false
				break
			}
			f := strings.Fields(l)
			switch {
			case len(f) == 0:
			case f[0] == "ready":
				ready = true
				kill.Reset(time.Duration(ds.rng.IntN(500)) * time.Millisecond) // the crash's moment
			case f[0] == "error":
				ds.fail("%s: %s", where, l)
				host.Process.Kill()
			case f[0] == "comp" && len(f) == 7:
				ended, _ := strconv.ParseInt(f[2], 10, 64)
				idx, _ := strconv.Atoi(f[3])
				session, _ := strconv.Unquote(f[6])
				if idx < 0 || idx >= len(ds.pool) {
					ds.fail("%s delivered a completion of %s with an unknown command", where, f[1])
					continue
				}
				ds.n.hostDelivered.Add(1)
				c := bgjob.Completion{ID: bgjob.ID(f[1]), Session: session, Command: ds.pool[idx].spec.Command, Ended: time.Unix(0, ended)}
				c.ExitCode, _ = strconv.Atoi(f[5])
				c.State = -1
				for _, st := range []bgjob.State{bgjob.Running, bgjob.Exited, bgjob.Cancelled, bgjob.TimedOut, bgjob.Failed} {
					if st.String() == f[4] {
						c.State = st
					}
				}
				ds.deliver(where, c, false)
			case f[0] == "launch" && len(f) == 2:
				idx, _ := strconv.Atoi(f[1])
				pending[idx]++
			case f[0] == "toomany" && len(f) == 2:
				idx, _ := strconv.Atoi(f[1])
				pending[idx]--
			case f[0] == "job" && len(f) == 5:
				idx, _ := strconv.Atoi(f[3])
				pid, _ := strconv.Atoi(f[2])
				pending[idx]--
				ds.n.hostLaunches.Add(1)
				ds.launched(ds.pool[idx], bgjob.Snapshot{ID: bgjob.ID(f[1]), PID: pid, Joined: f[4] == "true"}, true)
			default:
				ds.fail("%s: unexpected line %q", where, l)
			}
		case <-kill.C:
			host.Process.Kill()
		case <-timeout:
			ds.fail("%s: not ready within %v; stderr:\n%s", where, 2*deadline, stderr.String())
			host.Process.Kill()
			timeout = nil
		}
	}
	host.Wait()
	ds.mu.Lock()
	ds.hosts = append(ds.hosts, [2]time.Time{born, time.Now()})
	ds.mu.Unlock()
	if !ready {
		ds.fail("%s ended before it was ready; stderr:\n%s", where, stderr.String())
		return false
	}
	ds.mu.Lock()
	for idx, n := range pending {
		if n > 0 { // the launch the SIGKILL interrupted: its run may owe a completion
			ds.n.interrupted.Add(1)
			ds.inflight[idx] = true
			if ds.want[idx] == nil {
				ds.want[idx] = &[2]int{}
			}
			ds.want[idx][1] += n
		}
	}
	// SIGKILL a few running jobs while no host runs: they may be
	// recorded lost, and no other job may.
	// The ID is read from the process itself (its wrapper's argument is
	// its run folder), since a PID may have been reused by another job.
	victims := map[int]bgjob.ID{}
	for _, pid := range ds.pids {
		if id := dJobOf(pid, ds.state); id != "" && dMarkedAlive(pid, ds.mark) {
			victims[pid] = id
		}
	}
	pids := slices.Sorted(maps.Keys(victims))
	ds.rng.Shuffle(len(pids), func(i, j int) { pids[i], pids[j] = pids[j], pids[i] })
	pids = pids[:min(len(pids), 2)]
	for _, pid := range pids {
		ds.killed[victims[pid]] = true
	}
	ds.mu.Unlock()
	for _, pid := range pids {
		ds.n.killed.Add(1)
		syscall.Kill(-pid, syscall.SIGKILL)
		dWaitExit(ds.t, pid)
	}
	return true
}

// dJobOf returns the ID of the job whose wrapper shell is process pid, or
// "": the wrapper's argument after its script is its run folder,
// STATE/sessions/SESSION/ID.GEN.
func dJobOf(pid int, state string) bgjob.ID {
	cmd, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return ""
	}
	for _, a := range strings.Split(string(cmd), "\x00") {
		if rest, ok := strings.CutPrefix(a, state+"/sessions/"); ok {
			base := filepath.Base(rest)
			if i := strings.LastIndexByte(base, '.'); i > 0 && strings.HasPrefix(base, "job_") {
				return bgjob.ID(base[:i])
			}
		}
	}
	return ""
}

// dWaitExit waits for process pid to exit (a zombie counts).
func dWaitExit(t *testing.T, pid int) {
	fd, err := unix.PidfdOpen(pid, 0)
	if err != nil {
		return // gone already
	}
	defer unix.Close(fd)
	for end := time.Now().Add(deadline); time.Now().Before(end); {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		if n, _ := unix.Poll(pfd, int(time.Until(end)/time.Millisecond)+1); n == 1 {
			return
		}
	}
	t.Errorf("process %d did not exit within %v of SIGKILL", pid, deadline)
}

// The crash host: the test binary, run by TestStressDurable with these
// variables set, opens a Registry on the state directory (adopting the
// test's released jobs and replaying the rest), delivers the completions
// it owes and prints them, launches jobs, prints "ready", and goes on
// launching until it is killed. It prints "launch IDX" before each Start
// and "job ID PID IDX" after, so that the test knows which launch the
// SIGKILL interrupted.
const (
	dHostEnv  = "BGJOB_DSTRESS_HOST" // the state directory
	dHostArgs = "BGJOB_DSTRESS_ARGS" // dir, seed, round, mark
)

func TestStressDurableHost(t *testing.T) {
	state := os.Getenv(dHostEnv)
	if state == "" {
		t.Skip("run as the crash host of TestStressDurable")
	}
	out := bufio.NewWriter(os.Stdout)
	say := func(format string, args ...any) {
		fmt.Fprintf(out, format+"\n", args...)
		out.Flush()
	}
	var dir, mark string
	var seed, round uint64
	if _, err := fmt.Sscan(os.Getenv(dHostArgs), &dir, &seed, &round, &mark); err != nil {
		say("error args: %v", err)
		os.Exit(1)
	}
	pool := dPool(rand.New(rand.NewPCG(seed, 7)))
	byCmd := map[string]int{}
	for _, ss := range pool {
		byCmd[ss.spec.Command] = ss.idx
	}
	r, err := bgjob.New(dConfig(dir, state, mark))
	if err != nil {
		say("error New: %v", err)
		os.Exit(1)
	}
	for _, s := range dSessions {
		for _, c := range r.Completions(s) {
			idx, ok := byCmd[c.Command]
			if !ok {
				idx = -1
			}
			say("comp %s %d %d %s %d %q", c.ID, c.Ended.UnixNano(), idx, c.State, c.ExitCode, c.Session)
		}
	}
	rng := rand.New(rand.NewPCG(seed, round))
	launch := func() {
		ss := pool[rng.IntN(len(pool))]
		spec := ss.spec
		spec.Unique = rng.IntN(4) == 0
		say("launch %d", ss.idx)
		s, err := r.Start(context.Background(), spec)
		switch {
		case errors.Is(err, bgjob.ErrTooManyRunning):
			say("toomany %d", ss.idx)
		case err != nil:
			say("error Start: %v", err)
			os.Exit(1)
		default:
			say("job %s %d %d %v", s.ID, s.PID, ss.idx, s.Joined)
		}
	}
	for range 4 + rng.IntN(8) {
		launch()
	}
	say("ready")
	for {
		launch()
		time.Sleep(time.Duration(rng.IntN(30)) * time.Millisecond) // pacing until the SIGKILL
	}
}
