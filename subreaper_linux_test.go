package bgjob_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	"github.com/bgjob/bgjob"
)

// TestSubreaper runs in a child test process, since becoming a subreaper
// changes the whole process for good.
func TestSubreaper(t *testing.T) {
	if os.Getenv("BGJOB_TEST_SUBREAPER") != "1" {
		cmd := exec.Command(os.Args[0], "-test.run=^TestSubreaper$", "-test.v")
		cmd.Env = append(os.Environ(), "BGJOB_TEST_SUBREAPER=1")
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestSubreaper") {
			t.Fatalf("child test: %v\n%s", err, out)
		}
		return
	}
	r := newRegistry(t, bgjob.Config{Subreaper: true})
	// The shell exits at once, orphaning two sleeps; they become the
	// host's children, are stopped as leftovers and must be reaped.
	s, err := r.Start(context.Background(), bgjob.Spec{Command: "sleep 300 & sleep 300 & exit 0"})
	if err != nil {
		t.Fatal(err)
	}
	s = wait(t, r, s.ID)
	if !strings.Contains(s.Output.Notice, "2 leftover") {
		t.Errorf("notice %q; want 2 leftovers stopped", s.Output.Notice)
	}
	if z := zombieChildren(); len(z) > 0 {
		t.Errorf("zombie children of the host: %v; want none", z)
	}

	// Processes that left the job's session are re-parented to the host
	// when their parent dies: they are stopped too, and reaped.
	for _, mode := range containModes {
		r := newRegistry(t, bgjob.Config{Subreaper: true, Cgroup: mode.cgroup})
		for _, esc := range escapes {
			token := newToken(t)
			s, err := r.Start(ctxT(t), bgjob.Spec{Command: strings.ReplaceAll(esc.cmd, "H", markedSleeper(token)), Env: helperEnv})
			if err != nil {
				t.Fatal(err)
			}
			awaitMarked(t, token, esc.n)
			r.Cancel(s.ID)
			assertNoneMarked(t, token)
		}
		if z := zombieChildren(); len(z) > 0 {
			var names []string
			for pid := range z {
				b, _ := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
				c, _ := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
				names = append(names, string(b)[:40]+" cgroup "+string(c))
			}
			t.Errorf("%s: zombie children of the host after escapers: %v; want none", mode.name, names)
		}
	}
}
