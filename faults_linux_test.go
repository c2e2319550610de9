package bgjob_test

import (
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
	"golang.org/x/sys/unix"
)

// TestFaultEMFILE runs in a child test process whose RLIMIT_NOFILE leaves
// from 0 to a few free descriptors at each launch: every launch either
// runs or ends as a clean Failed job saying "too many open files", and
// no descriptor is lost.
func TestFaultEMFILE(t *testing.T) {
	if os.Getenv("BGJOB_TEST_EMFILE") != "1" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestFaultEMFILE$", "-test.v", "-test.count=1")
		cmd.Env = append(os.Environ(), "BGJOB_TEST_EMFILE=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestFaultEMFILE") {
			t.Fatalf("child test process: %v\n%s", err, out)
		}
		for _, l := range strings.Split(string(out), "\n") {
			if strings.Contains(l, "launches failed with EMFILE") {
				t.Log(strings.TrimSpace(l))
			}
		}
		return
	}

	r := newRegistry(t, bgjob.Config{KillGrace: 100 * time.Millisecond})
	// A first job, so the runtime's poller exists before the counting.
	wait(t, r, mustStart(t, r, bgjob.Spec{Command: "echo warm"}).ID)
	before := stressFDs()

	var lim unix.Rlimit
	if err := unix.Getrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
		t.Fatal(err)
	}
	restore := func() {
		if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &lim); err != nil {
			t.Fatal(err)
		}
	}
	defer restore()
	// The limit is set above the highest descriptor open now, taken
	// from the names alone: a descriptor whose target cannot be read still
	// counts against the limit.
	highest := 0
	ents, err := os.ReadDir("/proc/self/fd")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range ents {
		n, _ := strconv.Atoi(e.Name())
		highest = max(highest, n)
	}
	// Room above it for the largest budget tried below; fillUp takes
	// what a budget does not free.
	const most = 64
	low := lim
	low.Cur = uint64(highest + 1 + most)
	if err := unix.Setrlimit(unix.RLIMIT_NOFILE, &low); err != nil {
		t.Fatal(err)
	}
	// Fill every free slot below the limit, then free k of them for
	// each launch.
	var fill []int
	fillUp := func() {
		for {
			fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
			if err != nil {
				if err != unix.EMFILE {
					t.Fatalf("open: %v", err)
				}
				return
			}
			fill = append(fill, fd)
		}
	}
	free := func(k int) {
		for ; k > 0 && len(fill) > 0; k-- {
			unix.Close(fill[len(fill)-1])
			fill = fill[:len(fill)-1]
		}
	}
	// How many descriptors a launch needs depends on the kernel and the
	// Go release, so the budget grows until two budgets in a row ran.
	var failed, ran int
	firstRan := -1
	reasons := map[string]int{}
	for k := 0; k <= most && (firstRan < 0 || k < firstRan+2); k++ {
		fillUp()
		if k == 0 && len(fill) == 0 {
			t.Fatalf("no descriptor below the limit %d to fill; open: %v", low.Cur, stressFDs())
		}
		free(k)
		for _, fg := range []bool{false, true} {
			var s bgjob.Snapshot
			var err error
			if fg {
				var res bgjob.Result
				res, err = r.RunForeground(ctxT(t), bgjob.Spec{Command: "echo ok", Unique: true}, bgjob.Foreground{})
				s = res.Snapshot
			} else {
				s, err = r.Start(ctxT(t), bgjob.Spec{Command: "echo ok", Unique: true})
				if err == nil {
					s = wait(t, r, s.ID)
				}
			}
			switch {
			case err != nil:
				t.Errorf("%d free descriptors: launch error %v; want a job", k, err)
			case s.State == bgjob.Failed && strings.Contains(s.Reason, "too many open files") && s.ExitCode == -1:
				failed++
				reasons[s.Reason]++
			case s.State == bgjob.Exited && s.ExitCode == 0 && s.Output.Text == "ok\n":
				ran++
				if firstRan < 0 {
					firstRan = k
				}
			default:
				t.Errorf("%d free descriptors: got %v exit %d %q reason %q; want exited \"ok\" or failed with EMFILE", k, s.State, s.ExitCode, s.Output.Text, s.Reason)
			}
		}
	}
	// A job with a leftover child, at the smallest budget that spawns:
	// its end must still be clean (no pidfd to spare means polling).
	if firstRan >= 0 {
		fillUp()
		free(firstRan)
		s := wait(t, r, mustStart(t, r, bgjob.Spec{Command: "sleep 300 & echo ok", Unique: true}).ID)
		if s.State != bgjob.Exited && s.State != bgjob.Failed {
			t.Errorf("leftover job at %d free descriptors: %v %q", firstRan, s.State, s.Reason)
		}
		assertGone(t, s)
	}
	free(len(fill))
	restore()
	t.Logf("limit %d: %d launches failed with EMFILE, %d ran; first ran with %d free", low.Cur, failed, ran, firstRan)
	if failed == 0 || ran == 0 {
		t.Errorf("%d failed, %d ran; want both outcomes between 0 and %d free descriptors; failures: %v", failed, ran, most, reasons)
	}
	s := wait(t, r, mustStart(t, r, bgjob.Spec{Command: "echo after"}).ID)
	if s.State != bgjob.Exited || s.Output.Text != "after\n" {
		t.Errorf("after the limit is lifted: %v %q", s.State, s.Output.Text)
	}
	if after := stressFDs(); len(after) != len(before) {
		t.Errorf("descriptors: %d before, %d after\nbefore %v\nafter  %v", len(before), len(after), before, after)
	}
}
