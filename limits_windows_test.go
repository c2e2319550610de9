package bgjob_test

import (
	"context"
	"errors"
	"math"
	"os"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// Limits on Windows: the job's Job Object. Under Wine, whose Job Objects
// take limits without keeping or enforcing them, the registry refuses
// them with ErrUnsupported, and the tests that need a limit enforced
// skip, saying so.

// winCategories records the Category of every JobFinished event.
type winCategories struct {
	mu   sync.Mutex
	cats []bgjob.Category
}

func (w *winCategories) JobStarted(bgjob.Event) {}
func (w *winCategories) JobFinished(e bgjob.Event) {
	w.mu.Lock()
	w.cats = append(w.cats, e.Category)
	w.mu.Unlock()
}

// needLimits skips the test when err is the registry's refusal of limits
// that Wine's Job Objects do not keep, and fails it for any other error:
// Windows 10 and later (what Go supports) keep them all.
func needLimits(t *testing.T, err error) {
	t.Helper()
	if err == nil {
		return
	}
	if errors.Is(err, bgjob.ErrUnsupported) && underWine() {
		t.Skipf("Wine's Job Objects do not enforce this limit, and the registry says so: %v", err)
	}
	t.Fatal(err)
}

// requireLimits skips the test, as needLimits does, unless New takes
// limits l.
func requireLimits(t *testing.T, l bgjob.Limits) {
	t.Helper()
	r, err := bgjob.New(bgjob.Config{Limits: l})
	needLimits(t, err)
	r.Close(context.Background())
}

// winLimitedRun runs spec to its end in a registry made from cfg and
// returns its final snapshot and the Category Telemetry got for it.
func winLimitedRun(t *testing.T, cfg bgjob.Config, spec bgjob.Spec) (bgjob.Snapshot, bgjob.Category) {
	t.Helper()
	tel := &winCategories{}
	cfg.Telemetry = tel
	r := newWinRegistry(t, cfg)
	ctx, cancel := context.WithTimeout(context.Background(), 2*deadline)
	defer cancel()
	s, err := r.Start(ctx, spec)
	needLimits(t, err)
	if s, err = r.Wait(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	tel.mu.Lock()
	defer tel.mu.Unlock()
	if len(tel.cats) != 1 {
		t.Fatalf("Telemetry got %d JobFinished events; want 1", len(tel.cats))
	}
	return s, tel.cats[0]
}

// wantWinLimit checks that a limit stopped the job, with the reason given.
func wantWinLimit(t *testing.T, s bgjob.Snapshot, cat bgjob.Category, reason string) {
	t.Helper()
	if s.State != bgjob.Exited || s.ExitCode == 0 || cat != bgjob.CategoryLimit || s.Reason != reason {
		t.Fatalf("got %v exit %d, category %v, reason %q; want exited non-zero, category limit, reason %q\noutput: %q",
			s.State, s.ExitCode, cat, s.Reason, reason, s.Output.Text)
	}
}

// spinSpec runs the test binary's spin helper (main_test.go), with no
// shell: ms milliseconds of its own user CPU time, then exit 0.
func spinSpec(ms int) bgjob.Spec {
	return bgjob.Spec{Args: []string{os.Args[0], "spin", strconv.Itoa(ms)}, Env: map[string]string{"BGJOB_TEST_HELPER": "1"}, Unique: true}
}

func TestWindowsLimitsCPUTime(t *testing.T) {
	// The Job Object kills a process at its user time limit; the limit
	// is exact to 100 ns, and the reason says it as set.
	requireLimits(t, bgjob.Limits{CPUTime: time.Second})
	for _, tc := range []struct {
		name   string
		limit  time.Duration
		reason string
	}{
		{"whole-second", time.Second, "CPU time limit 1s reached"},
		{"fraction-kept", 1250 * time.Millisecond, "CPU time limit 1.25s reached"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			spec := spinSpec(60_000)
			spec.Limits = bgjob.Limits{CPUTime: tc.limit}
			s, cat := winLimitedRun(t, bgjob.Config{}, spec)
			wantWinLimit(t, s, cat, tc.reason)
			if s.Usage.UserCPU < tc.limit*9/10 || s.Usage.UserCPU > 10*tc.limit {
				t.Errorf("usage %+v; want about %v of user CPU time", s.Usage, tc.limit)
			}
		})
	}
}

func TestWindowsLimitsProcesses(t *testing.T) {
	// Three processes at once: the helper and two children, or one if
	// Windows counts the hidden console's host (conhost.exe) of a host
	// without a console. The next child is refused, the helper says so
	// and exits 3.
	s, cat := winLimitedRun(t, bgjob.Config{}, bgjob.Spec{Command: "children 5", Limits: bgjob.Limits{Processes: 3}})
	wantWinLimit(t, s, cat, "process limit 3 reached")
	if s.ExitCode != 3 || !strings.Contains(s.Output.Text, "child 1\n") || strings.Contains(s.Output.Text, "child 3\n") {
		t.Errorf("exit %d, output %q; want exit 3 after one or two children", s.ExitCode, s.Output.Text)
	}
}

func TestWindowsLimitsMemory(t *testing.T) {
	// The Job Object refuses the commit of 512 MiB: the Go runtime says
	// "out of memory" and exits; no process is killed.
	s, cat := winLimitedRun(t, bgjob.Config{}, bgjob.Spec{Command: "alloc 512", Limits: bgjob.Limits{Memory: 128 << 20}})
	wantWinLimit(t, s, cat, "memory limit 128 MiB reached")
	if strings.Contains(s.Output.Text, "allocated") {
		t.Errorf("output %q; want the allocation refused", s.Output.Text)
	}
	if s.Usage.PeakMemory > 128<<20 {
		t.Errorf("peak memory %d; want at most the limit, %d", s.Usage.PeakMemory, 128<<20)
	}
	// Below the limit the job runs as it would without it.
	s, cat = winLimitedRun(t, bgjob.Config{}, bgjob.Spec{Command: "alloc 32", Limits: bgjob.Limits{Memory: 128 << 20}})
	if s.ExitCode != 0 || cat != bgjob.CategoryNone || s.Output.Text != "allocated 32\n" {
		t.Errorf("32 MiB under 128: exit %d category %v output %q; want 0, none, allocated 32", s.ExitCode, cat, s.Output.Text)
	}
	if s.Usage.PeakMemory < 32<<20 {
		t.Errorf("32 MiB under 128: peak memory %d; want at least 32 MiB", s.Usage.PeakMemory)
	}
}

func TestWindowsLimitsCPU(t *testing.T) {
	// A hard cap of a fifth of a core: a second of CPU time takes about
	// five seconds. Half of that is asked, so that a busy machine's
	// scheduling does not fail the test; without the cap an idle machine
	// takes about one.
	spec := spinSpec(1000)
	spec.Limits = bgjob.Limits{CPU: 0.2}
	start := time.Now()
	s, cat := winLimitedRun(t, bgjob.Config{}, spec)
	wall := time.Since(start)
	if s.ExitCode != 0 || cat != bgjob.CategoryNone {
		t.Fatalf("exit %d category %v (%s); want 0, none", s.ExitCode, cat, s.Reason)
	}
	if wall < 2500*time.Millisecond {
		t.Errorf("1 s of CPU time at 0.2 core took %v; want at least 2.5 s", wall)
	}
}

func TestWindowsLimitsLeaveWellBehavedJobsAlone(t *testing.T) {
	// Every limit a Job Object holds, all generous, a CPU cap above the
	// machine's processors among them: the job runs as it would without
	// them, and its failure is its own.
	lim := bgjob.Limits{Memory: 1 << 30, Processes: 50, CPUTime: time.Minute, CPU: float64(runtime.NumCPU() + 1)}
	s, cat := winLimitedRun(t, bgjob.Config{}, bgjob.Spec{Command: "echo fine", Limits: lim})
	if s.ExitCode != 0 || cat != bgjob.CategoryNone || s.Output.Text != "fine\nerr:fine\n" {
		t.Errorf("exit %d category %v output %q; want 0, none, fine", s.ExitCode, cat, s.Output.Text)
	}
	s, cat = winLimitedRun(t, bgjob.Config{Limits: lim}, bgjob.Spec{Command: "exit 3"})
	if s.ExitCode != 3 || cat != bgjob.CategoryCommand || s.Reason != "" {
		t.Errorf("exit %d category %v reason %q; want 3, command, no reason", s.ExitCode, cat, s.Reason)
	}
	// The largest values a field can hold are good limits.
	largest := bgjob.Limits{Memory: math.MaxInt64, Processes: math.MaxInt, CPUTime: math.MaxInt64}
	if strconv.IntSize == 32 {
		largest.Memory = 0 // refused on a 32-bit host: see TestWindowsLimitsInvalid
	}
	s, cat = winLimitedRun(t, bgjob.Config{}, bgjob.Spec{Command: "exit 0", Limits: largest})
	if s.ExitCode != 0 || cat != bgjob.CategoryNone {
		t.Errorf("largest limits: exit %d category %v (%s); want 0, none", s.ExitCode, cat, s.Reason)
	}
}

func TestWindowsLimitsInvalid(t *testing.T) {
	r := newWinRegistry(t, bgjob.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	type refusal struct {
		l     bgjob.Limits
		field string
		err   error
	}
	bad := []refusal{
		// No Job Object form.
		{bgjob.Limits{FileSize: 1 << 20}, "Limits.FileSize", bgjob.ErrUnsupported},
		{bgjob.Limits{OpenFiles: 64}, "Limits.OpenFiles", bgjob.ErrUnsupported},
		{bgjob.Limits{Memory: 1 << 30, OpenFiles: 64}, "Limits.OpenFiles", bgjob.ErrUnsupported},
		// Values no limit has, as on every system.
		{bgjob.Limits{Memory: -1}, "Limits.Memory", bgjob.ErrInvalidSpec},
		{bgjob.Limits{Processes: -1}, "Limits.Processes", bgjob.ErrInvalidSpec},
		{bgjob.Limits{CPU: math.NaN()}, "Limits.CPU", bgjob.ErrInvalidSpec},
		{bgjob.Limits{CPU: 0.001}, "Limits.CPU", bgjob.ErrInvalidSpec},
		{bgjob.Limits{CPUTime: -time.Second}, "Limits.CPUTime", bgjob.ErrInvalidSpec},
	}
	if strconv.IntSize == 32 {
		bad = append(bad, refusal{bgjob.Limits{Memory: 1 << 40}, "Limits.Memory", bgjob.ErrInvalidSpec})
	}
	if underWine() {
		// Wine takes these and enforces none: the registry refuses
		// them rather than run a job without its limits.
		for _, l := range []struct {
			l     bgjob.Limits
			field string
		}{
			{bgjob.Limits{Memory: 1 << 30}, "Limits.Memory"},
			{bgjob.Limits{Processes: 10}, "Limits.Processes"},
			{bgjob.Limits{CPUTime: time.Second}, "Limits.CPUTime"},
			{bgjob.Limits{CPU: 1}, "Limits.CPU"},
		} {
			bad = append(bad, refusal{l.l, l.field, bgjob.ErrUnsupported})
		}
	}
	for _, b := range bad {
		_, err := r.Start(ctx, bgjob.Spec{Command: "exit 0", Limits: b.l})
		if !errors.Is(err, b.err) || !strings.Contains(err.Error(), "Spec."+b.field+":") {
			t.Errorf("Start with %+v: %v; want %v naming Spec.%s", b.l, err, b.err, b.field)
		}
		want := b.err
		if want == bgjob.ErrInvalidSpec {
			want = bgjob.ErrInvalidConfig
		}
		_, err = bgjob.New(bgjob.Config{Limits: b.l})
		if !errors.Is(err, want) || !strings.Contains(err.Error(), "Config."+b.field+":") {
			t.Errorf("New with %+v: %v; want %v naming Config.%s", b.l, err, want, b.field)
		}
	}
	if n := len(r.List("")); n != 0 {
		t.Errorf("%d jobs after refused launches; want none", n)
	}
}

func TestWindowsUsage(t *testing.T) {
	r := newWinRegistry(t, bgjob.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	// While it runs: the usage so far, from the Job Object.
	s, err := r.Start(ctx, spinSpec(60_000))
	if err != nil {
		t.Fatal(err)
	}
	var live bgjob.Usage
	for end := time.Now().Add(deadline); time.Now().Before(end); time.Sleep(20 * time.Millisecond) { // polling the figure itself, with a deadline
		st, err := r.Status(s.ID)
		if err != nil {
			t.Fatal(err)
		}
		if st.State != bgjob.Running {
			t.Fatalf("spinner ended: %v %q", st.State, st.Reason)
		}
		if live = st.Usage; live.UserCPU >= 300*time.Millisecond {
			break
		}
		if underWine() && time.Since(st.Started) > 3*time.Second && live == (bgjob.Usage{}) {
			r.Cancel(s.ID)
			t.Skip("Wine's Job Objects count no CPU time or memory (JOBOBJECT_BASIC_ACCOUNTING_INFORMATION and PeakJobMemoryUsed stay 0)")
		}
	}
	if live.UserCPU < 300*time.Millisecond || live.PeakMemory <= 0 {
		t.Errorf("running spinner: usage %+v; want its user CPU time so far and a peak memory", live)
	}
	r.Cancel(s.ID)

	// At the end: the whole run's.
	s, err = r.Start(ctx, spinSpec(1000))
	if err != nil {
		t.Fatal(err)
	}
	if s, err = r.Wait(ctx, s.ID); err != nil {
		t.Fatal(err)
	}
	if s.ExitCode != 0 || s.Usage.UserCPU < 800*time.Millisecond || s.Usage.UserCPU > time.Minute || s.Usage.PeakMemory <= 0 {
		t.Errorf("spinner: exit %d usage %+v; want at least 0.8 s of user CPU and a peak memory", s.ExitCode, s.Usage)
	}
	if s.Usage.PeakMemory > 1<<30 {
		t.Errorf("spinner: peak memory %d; want far less than 1 GiB", s.Usage.PeakMemory)
	}
}
