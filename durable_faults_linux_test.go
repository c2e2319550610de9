package bgjob_test

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
	"golang.org/x/sys/unix"
)

// One Registry at a time on a state directory: a second New, in this
// process or another, fails with ErrInUse until the first is closed or
// detached, or its process dies.
func TestDurableOneRegistryPerStateDir(t *testing.T) {
	cfg := durable(t)
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := bgjob.New(cfg); !errors.Is(err, bgjob.ErrInUse) || !strings.Contains(err.Error(), "StateDir") {
		t.Errorf("second New in this process: %v; want ErrInUse naming StateDir", err)
	}
	r1.Close(ctxT(t))
	r2 := newRegistry(t, cfg) // free again
	r2.Close(ctxT(t))

	// Another process holds it, then dies.
	host := exec.Command(os.Args[0], "-test.run=^TestDurableLockHolder$", "-test.count=1")
	host.Env = append(os.Environ(), lockHolderEnv+"="+cfg.StateDir)
	out, _ := host.StdoutPipe()
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	defer host.Process.Kill()
	sc := bufio.NewScanner(out)
	for sc.Scan() && sc.Text() != "ready" {
	}
	if _, err := bgjob.New(cfg); !errors.Is(err, bgjob.ErrInUse) {
		t.Errorf("New while another process holds it: %v; want ErrInUse", err)
	}
	host.Process.Kill()
	host.Wait()
	newRegistry(t, cfg) // the crash let go of the lock
}

const lockHolderEnv = "BGJOB_TEST_LOCK_HOLDER"

// TestDurableLockHolder is the other process of
// TestDurableOneRegistryPerStateDir.
func TestDurableLockHolder(t *testing.T) {
	dir := os.Getenv(lockHolderEnv)
	if dir == "" {
		t.Skip("run by TestDurableOneRegistryPerStateDir")
	}
	if _, err := bgjob.New(bgjob.Config{StateDir: dir}); err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	fmt.Println("ready")
	select {}
}

// The lock's descriptor closes on exec: no job, keeper or other child
// of the host keeps the state directory locked.
func TestDurableLockClosesOnExec(t *testing.T) {
	cfg := durable(t)
	r := newRegistry(t, cfg)
	lock := filepath.Join(cfg.StateDir, "lock")
	found := false
	ents, _ := os.ReadDir("/proc/self/fd")
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); l != lock {
			continue
		}
		found = true
		info, _ := os.ReadFile("/proc/self/fdinfo/" + e.Name())
		var flags int64
		for _, line := range strings.Split(string(info), "\n") {
			if v, ok := strings.CutPrefix(line, "flags:"); ok {
				fmt.Sscanf(strings.TrimSpace(v), "%o", &flags)
			}
		}
		if flags&unix.O_CLOEXEC == 0 {
			t.Errorf("lock descriptor %s: flags %o; want O_CLOEXEC", e.Name(), flags)
		}
	}
	if !found {
		t.Error("no descriptor of the lock file while the Registry runs")
	}
	r.Close(ctxT(t))
}

// holdLock takes the state directory's lock in this process as a host
// named in it would (by another open of the file), writing holder as the
// file's content; closing the returned file lets go of it.
func holdLock(t *testing.T, cfg bgjob.Config, holder string) *os.File {
	t.Helper()
	r := newRegistry(t, cfg) // makes the state directory
	r.Close(ctxT(t))
	f, err := os.OpenFile(filepath.Join(cfg.StateDir, "lock"), os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB); err != nil {
		t.Fatal(err)
	}
	f.Truncate(0)
	f.WriteString(holder)
	return f
}

// deadPID returns the PID of a process that has exited and been reaped.
func deadPID(t *testing.T) int {
	t.Helper()
	c := exec.Command("true")
	if err := c.Run(); err != nil {
		t.Fatal(err)
	}
	return c.Process.Pid
}

// A host that died can leave its lock held for a moment (a child it was
// spawning holds a copy of the lock's descriptor until its exec): New
// waits for it, a bounded time, when the holder the lock file names is
// gone; a live holder fails it at once.
func TestDurableLockOfDeadHost(t *testing.T) {
	t.Run("released-soon", func(t *testing.T) {
		cfg := durable(t)
		f := holdLock(t, cfg, fmt.Sprintf("%d 1\n", deadPID(t)))
		type result struct {
			r   *bgjob.Registry
			err error
		}
		done := make(chan result, 1)
		go func() {
			r, err := bgjob.New(cfg)
			done <- result{r, err}
		}()
		select {
		case res := <-done:
			t.Fatalf("New returned %v while the lock was held; want it to wait", res.err)
		case <-time.After(100 * time.Millisecond): // New is waiting: let go
		}
		f.Close()
		select {
		case res := <-done:
			if res.err != nil {
				t.Fatalf("New after the dead host's lock was let go: %v", res.err)
			}
			res.r.Close(ctxT(t))
		case <-time.After(deadline):
			t.Fatal("New did not return")
		}
	})
	t.Run("never-released", func(t *testing.T) {
		cfg := durable(t)
		f := holdLock(t, cfg, fmt.Sprintf("%d\n", deadPID(t)))
		defer f.Close()
		begin := time.Now()
		_, err := bgjob.New(cfg)
		if took := time.Since(begin); !errors.Is(err, bgjob.ErrInUse) || took < time.Second || took > 10*time.Second {
			t.Errorf("New with a dead holder's lock never let go: %v after %v; want ErrInUse after about 2s", err, took)
		}
	})
	t.Run("live-holder", func(t *testing.T) {
		cfg := durable(t)
		st, _ := os.ReadFile("/proc/self/stat")
		fields := strings.Fields(string(st[strings.LastIndexByte(string(st), ')')+2:]))
		f := holdLock(t, cfg, fmt.Sprintf("%d %s\n", os.Getpid(), fields[19]))
		defer f.Close()
		begin := time.Now()
		_, err := bgjob.New(cfg)
		if took := time.Since(begin); !errors.Is(err, bgjob.ErrInUse) || took > time.Second {
			t.Errorf("New with a live holder: %v after %v; want ErrInUse at once", err, took)
		}
	})
}

// While a host watches, each job's output file stays within
// MaxOutputBytes plus one read (256 KiB) and a page, however many jobs
// flood at once.
func TestDurableDiskBoundUnderFloods(t *testing.T) {
	cfg := durable(t)
	cfg.HeadBytes, cfg.TailBytes, cfg.MaxOutputBytes = 64<<10, 64<<10, 4<<20
	bound := cfg.MaxOutputBytes + 256<<10 + 4096
	r := newRegistry(t, cfg)
	const floods, size = 3, 200 << 20
	var ids []bgjob.ID
	for i := range floods {
		s, err := r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("yes flood%d | head -c %d", i, size)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	// Sample the files' disk use while the floods run.
	var peak int64
	var wg sync.WaitGroup
	stop := make(chan struct{})
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			for _, f := range runOutputs(cfg.StateDir) {
				var st unix.Stat_t
				if unix.Stat(f, &st) == nil && st.Blocks*512 > peak {
					peak = st.Blocks * 512
				}
			}
			select {
			case <-stop:
				return
			case <-time.After(time.Millisecond): // a sampling interval, not a wait for an event
			}
		}
	}()
	for _, id := range ids {
		if s := wait(t, r, id); s.State != bgjob.Exited || s.Output.Total != size {
			t.Errorf("flood: %v, %d bytes; want exited, %d", s.State, s.Output.Total, size)
		}
	}
	close(stop)
	wg.Wait()
	t.Logf("peak disk use of an output file: %.1f MiB (bound %.1f MiB)", float64(peak)/(1<<20), float64(bound)/(1<<20))
	if peak > bound {
		t.Errorf("an output file used %d bytes on disk; want at most %d", peak, bound)
	}
}

// runOutputs returns the output files under a state directory.
func runOutputs(dir string) []string {
	fs, _ := filepath.Glob(filepath.Join(dir, "sessions", "*", "job_*", "output"))
	return fs
}

// After a restart, a job's idle time counts from its last output, not from
// the adoption or its start.
func TestDurableAdoptedIdleCountsFromLastOutput(t *testing.T) {
	cfg := durable(t)
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "for i in $(seq 30); do echo tick $i; sleep 0.1; done", IdleTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r1, s.ID, "tick 15", 1) // 1.5 s: longer than the idle limit since the start
	if err := r1.Detach(); err != nil {
		t.Fatal(err)
	}
	r2 := newRegistry(t, cfg)
	if s = wait(t, r2, s.ID); s.State != bgjob.Exited || !strings.Contains(s.Output.Text, "tick 30") {
		t.Errorf("adopted chatty job: %v %q; want exited after tick 30", s.State, s.Reason)
	}
}

// Every string a record keeps comes back byte for byte: a command and a
// session that are not UTF-8 find their job and its completion again.
func TestDurableNonUTF8RoundTrips(t *testing.T) {
	cfg := durable(t)
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	session, command := "client-\xff", "printf 'caf\\351\\n'; sleep 0.3"
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: command, Session: session})
	if err != nil {
		t.Fatal(err)
	}
	r1.Detach()
	r2 := newRegistry(t, cfg)
	l := r2.List(session)
	if len(l) != 1 || l[0].ID != s.ID || l[0].Command != command || l[0].Session != session {
		t.Fatalf("List(%q) after a restart: %+v; want the job with its exact command", session, l)
	}
	wait(t, r2, s.ID)
	cs := r2.Completions(session)
	if len(cs) != 1 || cs[0].ID != s.ID || cs[0].Command != command {
		t.Errorf("Completions(%q): %+v; want the job's", session, cs)
	}
	if got, _ := r2.Status(s.ID); got.Output.Text != "caf\xe9\n" {
		t.Errorf("text %q; want %q", got.Output.Text, "caf\xe9\n")
	}
}

// A job whose process lives is never recorded lost: when a restart cannot
// watch it (no descriptor left), New fails and leaves its record as it
// was, and the next New adopts it. And a registry watches every adopted
// job's file with one inotify instance.
func TestDurableAdoptionUnderShortage(t *testing.T) {
	cfg := durable(t)
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	var ids []bgjob.ID
	for i := range 5 {
		s, err := r1.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("echo %d; sleep 60", i)})
		if err != nil {
			t.Fatal(err)
		}
		ids = append(ids, s.ID)
	}
	r1.Detach()
	defer func() {
		for _, run := range runFolders(t, cfg.StateDir) {
			if pid, ok := readRec(t, run)["pid"].(float64); ok {
				syscall.Kill(-int(pid), syscall.SIGKILL)
			}
		}
	}()
	before := map[string]string{}
	for _, run := range runFolders(t, cfg.StateDir) {
		b, _ := os.ReadFile(filepath.Join(run, "record.json"))
		before[run] = string(b)
	}

	// With k descriptors to spare, for k from 0 up: New fails (with the
	// records left as they were) until it adopts every job.
	var lim unix.Rlimit
	unix.Getrlimit(unix.RLIMIT_NOFILE, &lim)
	adoptFailures := 0
	for k := 0; ; k++ {
		if k > 64 {
			t.Fatal("New never adopted the jobs")
		}
		r, err := newWithSpare(t, cfg, lim, k)
		if err != nil {
			if strings.Contains(err.Error(), "adopt") {
				adoptFailures++
			}
			for _, run := range runFolders(t, cfg.StateDir) {
				if b, _ := os.ReadFile(filepath.Join(run, "record.json")); string(b) != before[run] {
					t.Fatalf("%d spare: %s: record changed by the failed New (%v):\n%s\nwas\n%s", k, run, err, b, before[run])
				}
			}
			continue
		}
		n := r.Running()
		r.Detach()
		if n != len(ids) {
			t.Fatalf("%d spare: New succeeded with %d of %d jobs adopted", k, n, len(ids))
		}
		t.Logf("New failed with up to %d spare descriptors (%d times while adopting), adopted all with %d", k-1, adoptFailures, k)
		break
	}
	if adoptFailures == 0 {
		t.Error("no New failed while adopting; want the shortage to hit the adoption")
	}

	inotifyBefore := inotifyInstances(t)
	r2 := newRegistry(t, cfg)
	if n := r2.Running(); n != len(ids) {
		t.Fatalf("Running = %d; want %d adopted", n, len(ids))
	}
	if n := inotifyInstances(t) - inotifyBefore; n > 2 {
		t.Errorf("%d inotify instances for %d adopted jobs; want one for their files (and one for the cgroups)", n, len(ids))
	}
	for _, id := range ids {
		if s, err := r2.Cancel(id); err != nil || s.State != bgjob.Cancelled {
			t.Errorf("Cancel of an adopted job: %v %v", s.State, err)
		}
	}
}

// inotifyInstances counts the process's open inotify instances.
func inotifyInstances(t *testing.T) int {
	ents, _ := os.ReadDir("/proc/self/fd")
	n := 0
	for _, e := range ents {
		if l, _ := os.Readlink("/proc/self/fd/" + e.Name()); l == "anon_inode:inotify" {
			n++
		}
	}
	return n
}

// newWithSpare runs New with only k descriptors free below RLIMIT_NOFILE.
func newWithSpare(t *testing.T, cfg bgjob.Config, lim unix.Rlimit, k int) (*bgjob.Registry, error) {
	ents, _ := os.ReadDir("/proc/self/fd")
	highest := 0
	for _, e := range ents {
		var n int
		fmt.Sscan(e.Name(), &n)
		highest = max(highest, n)
	}
	tight := lim
	tight.Cur = uint64(highest + 1 + 64)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &tight); err != nil {
		t.Fatal(err)
	}
	defer unix.Setrlimit(unix.RLIMIT_NOFILE, &lim)
	var filler []int
	for {
		fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			break
		}
		filler = append(filler, fd)
	}
	k = min(k, len(filler))
	for _, fd := range filler[len(filler)-k:] {
		unix.Close(fd)
	}
	defer func() {
		for _, fd := range filler[:len(filler)-k] {
			unix.Close(fd)
		}
	}()
	return bgjob.New(cfg)
}
