//go:build unix

package bgjob_test

import (
	"errors"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// limitedRun runs spec to its end in a registry made from cfg and returns
// its final snapshot and the Category that Telemetry got for it, checking
// that Telemetry reported the end exactly once.
func limitedRun(t *testing.T, cfg bgjob.Config, spec bgjob.Spec) (bgjob.Snapshot, bgjob.Category) {
	t.Helper()
	tr := &telemetryRecorder{}
	cfg.Telemetry = tr
	r := newRegistry(t, cfg)
	s, err := r.Start(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	s = wait(t, r, s.ID)
	tr.mu.Lock()
	defer tr.mu.Unlock()
	if len(tr.finished) != 1 {
		t.Fatalf("Telemetry got %d JobFinished events; want 1", len(tr.finished))
	}
	return s, tr.finished[0].Category
}

// wantLimit checks that a limit stopped the job, with the reason given.
func wantLimit(t *testing.T, s bgjob.Snapshot, cat bgjob.Category, reason string) {
	t.Helper()
	if s.State != bgjob.Exited || s.ExitCode == 0 || cat != bgjob.CategoryLimit || s.Reason != reason {
		t.Fatalf("got %v exit %d, category %v, reason %q; want exited non-zero, category limit, reason %q\noutput: %q",
			s.State, s.ExitCode, cat, s.Reason, reason, s.Output.Text)
	}
}

func TestLimitsCPUTime(t *testing.T) {
	// The shell spins itself: the kernel sends it SIGXCPU after 1 s of
	// CPU time.
	s, cat := limitedRun(t, bgjob.Config{}, bgjob.Spec{Command: "while :; do :; done", Limits: bgjob.Limits{CPUTime: time.Second}})
	wantLimit(t, s, cat, "CPU time limit 1s reached")
	if s.ExitCode != 128+24 {
		t.Errorf("exit %d; want 152 (SIGXCPU)", s.ExitCode)
	}
	if cpu := s.Usage.UserCPU + s.Usage.SystemCPU; cpu < 800*time.Millisecond {
		t.Errorf("usage %+v; want at least 0.8 s of CPU time", s.Usage)
	}
}

func TestLimitsCPUTimeRoundsUp(t *testing.T) {
	// 1.2 s of CPU time is two seconds of RLIMIT_CPU, and the reason
	// says what was enforced.
	s, cat := limitedRun(t, bgjob.Config{}, bgjob.Spec{Command: "while :; do :; done", Limits: bgjob.Limits{CPUTime: 1200 * time.Millisecond}})
	wantLimit(t, s, cat, "CPU time limit 2s reached")
	// The kernel checks the limit against tick-sampled CPU time, which
	// may run some percent ahead of the exact time a cgroup reports
	// (0.88 s for a 1 s limit was seen): a limit of 1 s would have
	// stopped it well below 1.5 s.
	if cpu := s.Usage.UserCPU + s.Usage.SystemCPU; cpu < 1500*time.Millisecond {
		t.Errorf("usage %+v; want at least 1.5 s of CPU time", s.Usage)
	}
}

func TestLimitsFileSize(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "big")
	s, cat := limitedRun(t, bgjob.Config{}, bgjob.Spec{
		Command: "head -c 1000000 /dev/zero > " + f,
		Limits:  bgjob.Limits{FileSize: 64 << 10},
	})
	wantLimit(t, s, cat, "file size limit 64 KiB reached")
	if fi, err := os.Stat(f); err != nil || fi.Size() > 64<<10 {
		t.Errorf("file: %v, %v; want at most 64 KiB", fi.Size(), err)
	}
}

func TestLimitsMemoryEachProcess(t *testing.T) {
	perl, err := exec.LookPath("perl")
	if err != nil {
		t.Skip("no perl (Debian's perl-base) to allocate with")
	}
	// Without a cgroup, Memory bounds each process's address space:
	// Perl cannot make a 200 MiB string under 64 MiB, says "Out of
	// memory!" and exits.
	s, cat := limitedRun(t, bgjob.Config{Cgroup: "off"}, bgjob.Spec{
		Command: perl + ` -e '$x = "a" x (200 << 20); print length($x), "\n"'`,
		Limits:  bgjob.Limits{Memory: 64 << 20},
	})
	wantLimit(t, s, cat, "memory limit 64 MiB reached")
}

func TestLimitsOpenFiles(t *testing.T) {
	spec := helperSpec("openfiles", "100")
	spec.Limits = bgjob.Limits{OpenFiles: 16}
	s, cat := limitedRun(t, bgjob.Config{}, spec)
	wantLimit(t, s, cat, "open files limit 16 reached")
}

func TestLimitsLeaveWellBehavedJobsAlone(t *testing.T) {
	// Every limit this host can enforce, all generous: the job runs as it
	// would without them, and its shell sees them set.
	lim := bgjob.Limits{Memory: 1 << 30, CPUTime: time.Minute, FileSize: 1 << 20, OpenFiles: 256}
	s, cat := limitedRun(t, bgjob.Config{}, bgjob.Spec{
		Command: `ulimit -t; ulimit -f; ulimit -n; echo "args $# $0"; exit 3`,
		Limits:  lim,
	})
	if s.State != bgjob.Exited || s.ExitCode != 3 || cat != bgjob.CategoryCommand || s.Reason != "" {
		t.Fatalf("got %v exit %d category %v reason %q; want exited 3, category command, no reason", s.State, s.ExitCode, cat, s.Reason)
	}
	// The soft CPU limit (what ulimit shows), the file size in 512-byte
	// blocks, the descriptors; and the command sees sh -c's $0 and no
	// positional parameters, as without limits.
	if want := "60\n2048\n256\nargs 0 sh\n"; s.Output.Text != want {
		t.Errorf("output %q; want %q", s.Output.Text, want)
	}

	// A job that did not fail, or had no limits, is never taken for one
	// a limit stopped.
	// As documented, a job that fails with a limit's message in the end
	// of its output counts as stopped by it, whoever printed it.
	s, cat = limitedRun(t, bgjob.Config{}, bgjob.Spec{Command: "echo Too many open files; exit 1", Limits: lim})
	wantLimit(t, s, cat, "open files limit 256 reached")
	s, cat = limitedRun(t, bgjob.Config{}, bgjob.Spec{Command: "echo out of memory; exit 0", Limits: lim})
	if cat != bgjob.CategoryNone || s.Reason != "" {
		t.Errorf("a job that exited 0: category %v reason %q; want none", cat, s.Reason)
	}
	s, cat = limitedRun(t, bgjob.Config{}, bgjob.Spec{Command: "echo out of memory; exit 1"})
	if cat != bgjob.CategoryCommand || s.Reason != "" {
		t.Errorf("a job without limits: category %v reason %q; want command", cat, s.Reason)
	}
}

func TestLimitsMessageNeedsTheLimit(t *testing.T) {
	// The message of a limit the job did not have is the command's
	// failure: only Memory was set, and the job says it ran out of
	// descriptors.
	s, cat := limitedRun(t, bgjob.Config{}, bgjob.Spec{Command: "echo Too many open files >&2; exit 1", Limits: bgjob.Limits{Memory: 1 << 30}})
	if cat != bgjob.CategoryCommand || s.Reason != "" {
		t.Errorf("category %v reason %q; want command, no reason", cat, s.Reason)
	}
}

func TestLimitsArgsAndOtherShells(t *testing.T) {
	// Spec.Args and a Config.Shell other than the default get the limits
	// from a /bin/sh in front, which then execs their command line.
	s, cat := limitedRun(t, bgjob.Config{}, bgjob.Spec{Args: []string{"/bin/sh", "-c", "ulimit -n; ulimit -t"}, Limits: bgjob.Limits{OpenFiles: 40, CPUTime: 5 * time.Second}})
	if s.ExitCode != 0 || cat != bgjob.CategoryNone || s.Output.Text != "40\n5\n" {
		t.Errorf("Args: exit %d category %v output %q; want 0, none, \"40\\n5\\n\"", s.ExitCode, cat, s.Output.Text)
	}
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash")
	}
	s, _ = limitedRun(t, bgjob.Config{Shell: []string{bash, "-c"}}, bgjob.Spec{Command: `ulimit -n; echo "$BASH_VERSION" | cut -c1`, Limits: bgjob.Limits{OpenFiles: 40}})
	if s.ExitCode != 0 || !strings.HasPrefix(s.Output.Text, "40\n") || len(s.Output.Text) != 5 {
		t.Errorf("bash: exit %d output %q; want 40 and a bash version", s.ExitCode, s.Output.Text)
	}
	// The shell is in the job's limits too: the CPU spinner is bash.
	s, cat = limitedRun(t, bgjob.Config{Shell: []string{bash, "-c"}}, bgjob.Spec{Command: "while :; do :; done", Limits: bgjob.Limits{CPUTime: time.Second}})
	wantLimit(t, s, cat, "CPU time limit 1s reached")
}

func TestLimitsFromConfig(t *testing.T) {
	// Config.Limits applies to every job; a Spec's field replaces its
	// own and leaves the others.
	cfg := bgjob.Config{Limits: bgjob.Limits{OpenFiles: 30, FileSize: 512}}
	s, _ := limitedRun(t, cfg, bgjob.Spec{Command: "ulimit -n; ulimit -f"})
	if s.Output.Text != "30\n1\n" {
		t.Errorf("defaults: %q; want 30 descriptors, 1 block", s.Output.Text)
	}
	s, _ = limitedRun(t, cfg, bgjob.Spec{Command: "ulimit -n; ulimit -f", Limits: bgjob.Limits{OpenFiles: 50}})
	if s.Output.Text != "50\n1\n" {
		t.Errorf("override: %q; want 50 descriptors, 1 block", s.Output.Text)
	}
}

func TestLimitsMakeDistinctJobs(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	ctx := ctxT(t)
	cmd := helperCmd("sleep", "300000")
	start := func(l bgjob.Limits) bgjob.Snapshot {
		s, err := r.Start(ctx, bgjob.Spec{Command: cmd, Env: helperEnv, Limits: l})
		if err != nil {
			t.Fatal(err)
		}
		return s
	}
	a, b := start(bgjob.Limits{}), start(bgjob.Limits{OpenFiles: 64})
	c := start(bgjob.Limits{OpenFiles: 64})
	if a.ID == b.ID || c.ID != b.ID || !c.Joined {
		t.Errorf("IDs %s %s %s (joined %v): want limits to make a distinct job, and the same limits to join", a.ID, b.ID, c.ID, c.Joined)
	}
	for _, id := range []bgjob.ID{a.ID, b.ID} {
		r.Cancel(id)
		wait(t, r, id)
	}
}

func TestLimitsInvalid(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	bad := []struct {
		l     bgjob.Limits
		field string
	}{
		{bgjob.Limits{Memory: -1}, "Limits.Memory"},
		{bgjob.Limits{Processes: -1}, "Limits.Processes"},
		{bgjob.Limits{CPU: -0.5}, "Limits.CPU"},
		{bgjob.Limits{CPU: math.NaN()}, "Limits.CPU"},
		{bgjob.Limits{CPU: math.Inf(1)}, "Limits.CPU"},
		{bgjob.Limits{CPU: 0.001}, "Limits.CPU"},
		{bgjob.Limits{CPU: 1 << 30}, "Limits.CPU"},
		{bgjob.Limits{CPUTime: -time.Second}, "Limits.CPUTime"},
		{bgjob.Limits{FileSize: math.MinInt64}, "Limits.FileSize"},
		{bgjob.Limits{OpenFiles: -1}, "Limits.OpenFiles"},
	}
	for _, b := range bad {
		_, err := r.Start(ctxT(t), bgjob.Spec{Command: "true", Limits: b.l})
		if !errors.Is(err, bgjob.ErrInvalidSpec) || !strings.Contains(err.Error(), "Spec."+b.field+":") {
			t.Errorf("Start with %+v: %v; want ErrInvalidSpec naming Spec.%s", b.l, err, b.field)
		}
		_, err = bgjob.New(bgjob.Config{Limits: b.l})
		if !errors.Is(err, bgjob.ErrInvalidConfig) || !strings.Contains(err.Error(), "Config."+b.field+":") {
			t.Errorf("New with %+v: %v; want ErrInvalidConfig naming Config.%s", b.l, err, b.field)
		}
	}
	if n := len(r.List("")); n != 0 {
		t.Errorf("%d jobs after refused launches; want none", n)
	}
	// Extremes that are good values: the largest sizes run.
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "ulimit -v; ulimit -f", Limits: bgjob.Limits{Memory: math.MaxInt64, FileSize: math.MaxInt64, CPUTime: math.MaxInt64}})
	if err != nil && os.Geteuid() != 0 && strings.Contains(err.Error(), "above the host's own hard limit") {
		return // as it should be: a host that may not raise its limits cannot give them
	}
	if err != nil {
		t.Fatal(err)
	}
	if s = wait(t, r, s.ID); s.ExitCode != 0 {
		t.Errorf("largest limits: exit %d, output %q", s.ExitCode, s.Output.Text)
	}
}

func TestLimitsNeedingControllers(t *testing.T) {
	// Processes and CPU exist only as cgroup controllers. Where the
	// registry's cgroup folder is not offered them, a launch that sets
	// them fails before any process starts, naming the field; so does
	// New with them in Config.Limits.
	r := newRegistry(t, bgjob.Config{Cgroup: "off"})
	for _, l := range []bgjob.Limits{{Processes: 10}, {CPU: 0.5}} {
		_, err := r.Start(ctxT(t), bgjob.Spec{Command: "true", Limits: l})
		if !errors.Is(err, bgjob.ErrUnsupported) || !strings.Contains(err.Error(), "Spec.Limits.") {
			t.Errorf("Start with %+v and no cgroup: %v; want ErrUnsupported naming the field", l, err)
		}
		if _, err := bgjob.New(bgjob.Config{Cgroup: "off", Limits: l}); !errors.Is(err, bgjob.ErrUnsupported) || !strings.Contains(err.Error(), "Config.Limits.") {
			t.Errorf("New with %+v and no cgroup: %v; want ErrUnsupported naming the field", l, err)
		}
	}
}

func TestUsage(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	// A job that uses 1 s of user CPU in a child of its shell.
	s, err := r.Start(ctxT(t), helperSpec("spin", "1000"))
	if err != nil {
		t.Fatal(err)
	}
	s = wait(t, r, s.ID)
	if s.ExitCode != 0 || s.Usage.UserCPU < 800*time.Millisecond || s.Usage.UserCPU > time.Minute {
		t.Errorf("spinner: exit %d usage %+v; want at least 0.8 s of user CPU", s.ExitCode, s.Usage)
	}
	// A job whose shell holds at least 100 MiB, and more than this test
	// host ever held: without a cgroup's memory.peak, a peak below the
	// host's own cannot be told (see Usage).
	var self syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &self)
	n := max(100<<20, self.Maxrss*1024+(32<<20))
	s, err = r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf(`x=$(head -c %d /dev/zero | tr '\0' a); echo ${#x}`, n)})
	if err != nil {
		t.Fatal(err)
	}
	s = wait(t, r, s.ID)
	if s.Output.Text != fmt.Sprintln(n) || s.Usage.PeakMemory < n {
		t.Errorf("%d bytes: output %q usage %+v; want peak memory of at least that", n, s.Output.Text, s.Usage)
	}
	// A job that used next to nothing reports next to nothing.
	s, _ = r.Start(ctxT(t), bgjob.Spec{Command: "true"})
	s = wait(t, r, s.ID)
	if s.Usage.UserCPU > 500*time.Millisecond || s.Usage.PeakMemory > 100<<20 {
		t.Errorf("true: usage %+v; want little", s.Usage)
	}
}
