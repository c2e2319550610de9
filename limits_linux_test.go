package bgjob_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// controllersOffered returns the cgroup folder a registry would make its
// jobs' cgroups in, if it is offered the memory, pids and cpu controllers;
// else "" and what is missing.
func controllersOffered(t *testing.T) (string, string) {
	t.Helper()
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "cat /proc/self/cgroup"})
	if err != nil {
		t.Fatal(err)
	}
	s = wait(t, r, s.ID)
	if s.Containment != bgjob.ContainCgroup {
		return "", "jobs get no cgroup here"
	}
	// The job's cgroup is in the registry's folder, whose parent is the
	// host's: what that parent's subtree_control holds, the folder is
	// offered.
	var rel string
	for _, line := range strings.Split(s.Output.Text, "\n") {
		if r, ok := strings.CutPrefix(line, "0::"); ok {
			rel = r
		}
	}
	folder := filepath.Dir(filepath.Join(cgroupMount(t), rel))
	b, err := os.ReadFile(filepath.Join(folder, "cgroup.controllers"))
	if err != nil {
		return "", err.Error()
	}
	have := strings.Fields(string(b))
	var missing []string
	for _, c := range []string{"memory", "pids", "cpu"} {
		if !strings.Contains(" "+strings.Join(have, " ")+" ", " "+c+" ") {
			missing = append(missing, c)
		}
	}
	if len(missing) > 0 {
		return "", "the registry's cgroup folder is not offered " + strings.Join(missing, ", ") + " (offered: " + strings.Join(have, " ") + ")"
	}
	return folder, ""
}

// TestLimitsCgroupControllers runs where the registry's cgroup folder is
// offered memory, pids and cpu (cgroup v2 with delegated controllers);
// elsewhere it skips, saying what is missing.
func TestLimitsCgroupControllers(t *testing.T) {
	if _, why := controllersOffered(t); why != "" {
		t.Skip("cgroup v2 limits not run: " + why)
	}
	// Memory for the whole tree: a job over it is killed whole (an OOM
	// kill, memory.oom.group), and the kernel says why.
	s, cat := limitedRun(t, bgjob.Config{}, bgjob.Spec{
		Command: `x=$(head -c 300000000 /dev/zero | tr '\0' a); echo ${#x}`,
		Limits:  bgjob.Limits{Memory: 64 << 20},
	})
	wantLimit(t, s, cat, "memory limit 64 MiB reached")
	if s.Usage.PeakMemory == 0 || s.Usage.PeakMemory > 80<<20 {
		t.Errorf("peak memory %d; want the cgroup's peak, about 64 MiB", s.Usage.PeakMemory)
	}
	// Processes for the whole tree: forks beyond 8 fail, and the job that
	// fails because of it is reported stopped by the limit.
	s, cat = limitedRun(t, bgjob.Config{}, bgjob.Spec{
		Command: `for i in $(seq 20); do sleep 5 & done; wait`,
		Limits:  bgjob.Limits{Processes: 8},
	})
	wantLimit(t, s, cat, "process limit 8 reached")
	// CPU: at half a core, 1 s of CPU time takes at least 2 s (a bound
	// that load can only lengthen).
	start := time.Now()
	s, _ = limitedRun(t, bgjob.Config{}, bgjob.Spec{Command: helperCmd("spin", "1000"), Env: helperEnv, Limits: bgjob.Limits{CPU: 0.5}})
	if took := time.Since(start); s.ExitCode != 0 || took < 1900*time.Millisecond {
		t.Errorf("spin at half a core: exit %d after %v; want about 2 s", s.ExitCode, took)
	}
}

func TestDurableLimits(t *testing.T) {
	cfg := durable(t)
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	// One job ends under r1, stopped by its file size limit.
	done, err := r1.Start(ctxT(t), bgjob.Spec{Command: "head -c 100000 /dev/zero > " + filepath.Join(t.TempDir(), "f"), Limits: bgjob.Limits{FileSize: 4096}})
	if err != nil {
		t.Fatal(err)
	}
	done = wait(t, r1, done.ID)
	wantLimit(t, done, bgjob.CategoryLimit, "file size limit 4 KiB reached")
	// Another spins into its CPU time limit after r1 let go of it.
	spin, err := r1.Start(ctxT(t), bgjob.Spec{Command: "while :; do :; done", Limits: bgjob.Limits{CPUTime: time.Second}})
	if err != nil {
		t.Fatal(err)
	}
	if err := r1.Detach(); err != nil {
		t.Fatal(err)
	}
	r1.Close(ctxT(t))

	tr := &telemetryRecorder{}
	cfg.Telemetry = tr
	r2 := newRegistry(t, cfg)
	s := wait(t, r2, spin.ID)
	tr.mu.Lock()
	var cat bgjob.Category
	if len(tr.finished) == 1 {
		cat = tr.finished[0].Category
	}
	tr.mu.Unlock()
	wantLimit(t, s, cat, "CPU time limit 1s reached")
	if s.Usage.UserCPU+s.Usage.SystemCPU < 800*time.Millisecond && s.Containment == bgjob.ContainCgroup {
		t.Errorf("adopted spinner's usage %+v; want its cgroup's CPU time, at least 0.8 s", s.Usage)
	}
	// The job that ended before the restart comes back as it ended.
	d, err := r2.Status(done.ID)
	if err != nil {
		t.Fatal(err)
	}
	if d.Reason != done.Reason || d.ExitCode != done.ExitCode || d.Usage != done.Usage {
		t.Errorf("after restart: exit %d reason %q usage %+v; want exit %d reason %q usage %+v", d.ExitCode, d.Reason, d.Usage, done.ExitCode, done.Reason, done.Usage)
	}
	for _, run := range runFolders(t, cfg.StateDir) {
		rec := readRec(t, run)
		if rec["limits"] == nil || rec["category"] != "limit" {
			t.Errorf("record %s: limits %v category %v; want both kept", filepath.Base(run), rec["limits"], rec["category"])
		}
	}
}
