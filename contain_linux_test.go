package bgjob_test

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// escapes are commands whose processes leave the job's process group or
// session, or outlive its shell, each with the number of marked processes
// it starts. H stands for a marked sleeper.
var escapes = []struct {
	name  string
	cmd   string
	n     int
	exits bool // the job's shell exits at once: its processes are leftovers
}{
	{"timeout", "timeout 300 H; echo done", 1, false},
	{"set-m", "bash -c 'set -m; H & H'", 2, false},
	{"setsid-background", "setsid H & H", 2, false},
	{"setsid-fork", "setsid -f H; H", 2, false},
	{"exec-setsid", "exec setsid H", 1, true}, // setsid forks, as the shell leads its group
	{"nohup-setsid", "nohup setsid H >/dev/null 2>&1 & H", 2, false},
	{"double-fork", "( H & ); H", 2, false},
	{"stderr-writer-setsid", "setsid sh -c 'H & while :; do echo x >/dev/stderr; sleep 0.05; done' & H", 2, false},
}

// containModes are the two containments a Linux job can get.
var containModes = []struct {
	name   string
	cgroup string
	want   bgjob.Containment
}{
	{"cgroup", "", bgjob.ContainCgroup},
	{"session", "off", bgjob.ContainSession},
}

// Every way of stopping a job reaches every process it started, wherever
// it went: new process groups (timeout, set -m), new sessions (setsid,
// setsid -f, exec setsid, nohup setsid), double forks; with a cgroup of
// its own and, without one, by its session and its marker.
func TestEscapersAreStopped(t *testing.T) {
	for _, mode := range containModes {
		t.Run(mode.name, func(t *testing.T) {
			if mode.want == bgjob.ContainCgroup && !cgroupsHere(t) {
				t.Skip("no writable cgroup v2 hierarchy here: jobs are contained by their session")
			}
			for _, stop := range []string{"cancel", "timeout", "close", "shell-exits"} {
				for _, esc := range escapes {
					t.Run(stop+"/"+esc.name, func(t *testing.T) {
						token := newToken(t)
						cmd := strings.ReplaceAll(esc.cmd, "H", markedSleeper(token))
						spec := bgjob.Spec{Command: cmd, Env: helperEnv}
						exitFile := filepath.Join(t.TempDir(), "exit")
						if stop == "shell-exits" {
							// The shell exits once the test has seen its
							// processes run: they are leftovers then.
							spec.Command = "{ " + cmd + "; } & while [ ! -e " + exitFile + " ]; do sleep 0.01; done; exit 3"
						}
						if stop == "timeout" {
							spec.Timeout = 10 * time.Second // by the registry's synthetic clock
						}
						r, err := bgjob.New(bgjob.Config{Cgroup: mode.cgroup, KillGrace: 300 * time.Millisecond})
						if err != nil {
							t.Fatal(err)
						}
						clock := &fakeClock{now: time.Now()}
						bgjob.SetClock(r, clock.Now)
						closed := false
						defer func() {
							if !closed {
								r.Close(context.Background())
							}
						}()
						s, err := r.Start(ctxT(t), spec)
						if err != nil {
							t.Fatal(err)
						}
						if s.Containment != mode.want {
							t.Fatalf("containment %v; want %v", s.Containment, mode.want)
						}
						awaitMarked(t, token, esc.n, func() string {
							s, err := r.Status(s.ID)
							return fmt.Sprintf("job %v %d %q %q (%v)", s.State, s.ExitCode, s.Reason, s.Output.Text, err)
						})
						switch {
						case esc.exits && stop != "close" && stop != "shell-exits":
							// It ended by itself: what it left was stopped.
							if s = wait(t, r, s.ID); !strings.Contains(s.Output.Notice, "leftover") {
								t.Errorf("notice %q; want leftovers stopped", s.Output.Notice)
							}
						case stop == "cancel":
							if s, err = r.Cancel(s.ID); err != nil || s.State != bgjob.Cancelled {
								t.Errorf("Cancel: %v %v; want cancelled", s.State, err)
							}
						case stop == "timeout":
							clock.advance(r, 10*time.Second)
							if s = wait(t, r, s.ID); s.State != bgjob.TimedOut {
								t.Errorf("got %v; want timed_out", s.State)
							}
						case stop == "close":
							if err := r.Close(ctxT(t)); err != nil {
								t.Errorf("Close: %v", err)
							}
							closed = true
						case stop == "shell-exits":
							os.WriteFile(exitFile, nil, 0o600)
							if s = wait(t, r, s.ID); s.State != bgjob.Exited || s.ExitCode != 3 || !strings.Contains(s.Output.Notice, "leftover") {
								t.Errorf("got %v %d %q; want exited 3 with leftovers stopped", s.State, s.ExitCode, s.Output.Notice)
							}
						}
						assertNoneMarked(t, token)
					})
				}
			}
		})
	}
}

// cgroupsHere reports whether jobs get cgroups on this machine.
func cgroupsHere(t *testing.T) bool {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "true"})
	if err != nil {
		t.Fatal(err)
	}
	return s.Containment == bgjob.ContainCgroup
}

// A durable job keeps its containment across a restart: the record names
// its cgroup (or its marker), the next Registry adopts it with it, and a
// Cancel of the adopted job stops the processes that escaped its session.
func TestDurableAdoptedJobKeepsItsContainment(t *testing.T) {
	for _, mode := range containModes {
		t.Run(mode.name, func(t *testing.T) {
			if mode.want == bgjob.ContainCgroup && !cgroupsHere(t) {
				t.Skip("no writable cgroup v2 hierarchy here")
			}
			cfg := durable(t)
			cfg.Cgroup = mode.cgroup
			r1, err := bgjob.New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			token := newToken(t)
			s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "setsid " + markedSleeper(token) + " & " + markedSleeper(token), Env: helperEnv})
			if err != nil {
				t.Fatal(err)
			}
			awaitMarked(t, token, 2)
			if err := r1.Detach(); err != nil {
				t.Fatal(err)
			}
			rec := readRec(t, runFolders(t, cfg.StateDir)[0])
			if mode.want == bgjob.ContainCgroup && rec["cgroup"] == nil || mode.want == bgjob.ContainSession && rec["marker"] == nil {
				t.Errorf("record %v names neither the job's cgroup nor its marker", rec)
			}
			r2 := newRegistry(t, cfg)
			if n := r2.Running(); n != 1 {
				t.Fatalf("Running = %d after the restart; want 1 adopted", n)
			}
			c, err := r2.Cancel(s.ID)
			if err != nil || c.State != bgjob.Cancelled {
				t.Errorf("Cancel of the adopted job: %v %v; want cancelled", c.State, err)
			}
			assertNoneMarked(t, token)
		})
	}
}

// A durable job whose shell was killed while no host watched it is lost,
// and what it left (in its cgroup, or marked) is stopped by the next
// Registry.
func TestDurableLostJobLeavesNothing(t *testing.T) {
	for _, mode := range containModes {
		t.Run(mode.name, func(t *testing.T) { testDurableLostJobLeavesNothing(t, mode.cgroup, mode.want) })
	}
}

func testDurableLostJobLeavesNothing(t *testing.T, cgroup string, want bgjob.Containment) {
	if want == bgjob.ContainCgroup && !cgroupsHere(t) {
		t.Skip("no writable cgroup v2 hierarchy here")
	}
	cfg := durable(t)
	cfg.Cgroup = cgroup
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	token := newToken(t)
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: "setsid " + markedSleeper(token) + " & " + markedSleeper(token), Env: helperEnv})
	if err != nil {
		t.Fatal(err)
	}
	awaitMarked(t, token, 2)
	r1.Detach()
	// The wrapper and the job's shell die without an exit marker; the
	// setsid sleeper lives on in the job's cgroup.
	syscall.Kill(-s.PID, syscall.SIGKILL)
	waitExit(t, s.PID)
	r2 := newRegistry(t, cfg)
	f, err := r2.Status(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if f.State != bgjob.Failed || f.Reason != "lost" {
		t.Errorf("got %v %q; want failed, lost", f.State, f.Reason)
	}
	assertNoneMarked(t, token)
}

// The folder of a host that died is emptied and removed by the next New,
// with the processes of the jobs in it.
func TestDeadHostCgroupIsCleared(t *testing.T) {
	if !cgroupsHere(t) {
		t.Skip("no writable cgroup v2 hierarchy here")
	}
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 300"})
	if err != nil {
		t.Fatal(err)
	}
	// A parent of the test's own (Config.Cgroup), which no other test's
	// New looks into.
	parent := filepath.Join(filepath.Dir(filepath.Dir(cgroupOf(t, s.PID))), "bgjob-test-"+strconv.Itoa(os.Getpid()))
	if err := os.Mkdir(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	defer os.Remove(parent)
	// A folder named as a registry of a host that is gone (PID 1 with
	// another start time), holding a live process.
	dead := filepath.Join(parent, "bgjob-1-999999999-0badc0de")
	job := filepath.Join(dead, "job")
	if err := os.MkdirAll(job, 0o755); err != nil {
		t.Fatal(err)
	}
	token := newToken(t)
	cmd := exec.Command(os.Args[0], "sleep", "300000", token)
	cmd.Env = append(os.Environ(), "BGJOB_TEST_HELPER=1")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go cmd.Wait()
	if err := os.WriteFile(filepath.Join(job, "cgroup.procs"), []byte(strconv.Itoa(cmd.Process.Pid)), 0); err != nil {
		t.Fatal(err)
	}
	r2, err := bgjob.New(bgjob.Config{Cgroup: parent})
	if err != nil {
		t.Fatal(err)
	}
	r2.Close(context.Background())
	if _, err := os.Stat(dead); !os.IsNotExist(err) {
		t.Errorf("the dead host's folder is still there: %v", err)
	}
	assertNoneMarked(t, token)
	r.Cancel(s.ID)
}

// cgroupOf returns the cgroup v2 folder of process pid: its path in the
// hierarchy, under where the hierarchy is mounted.
func cgroupOf(t *testing.T, pid int) string {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		t.Fatal(err)
	}
	mnt := cgroupMount(t)
	for _, line := range strings.Split(string(b), "\n") {
		if rel, ok := strings.CutPrefix(line, "0::"); ok {
			return filepath.Join(mnt, rel)
		}
	}
	t.Fatal("no cgroup v2 line")
	return ""
}

// cgroupMount returns where the cgroup v2 hierarchy is mounted.
func cgroupMount(t *testing.T) string {
	t.Helper()
	mi, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(mi), "\n") {
		if f := strings.Fields(line); len(f) > 8 && strings.Contains(line, " - cgroup2 ") && f[3] == "/" {
			return f[4]
		}
	}
	t.Fatal("no cgroup v2 hierarchy")
	return ""
}

// A job's cgroup goes to a later job only if nothing but the kernel
// changed it: one that the job wrote to (its limits, freezing itself) is
// removed instead, and the next job runs as usual.
func TestTouchedCgroupIsNotReused(t *testing.T) {
	if !cgroupsHere(t) {
		t.Skip("no writable cgroup v2 hierarchy here")
	}
	r := newRegistry(t, bgjob.Config{KillGrace: 200 * time.Millisecond})
	// Each job prints the folder of its cgroup.
	const where = `echo "$(sed -n 's/^0:://p' /proc/self/cgroup)"`
	run := func(cmd string) bgjob.Snapshot {
		t.Helper()
		res, err := r.RunForeground(ctxT(t), bgjob.Spec{Command: where + "; " + cmd, Unique: true}, bgjob.Foreground{SoftCap: deadline})
		if err != nil || res.Detached {
			t.Fatalf("%q: %v detached %v", cmd, err, res.Detached)
		}
		return res.Snapshot
	}
	cgroupOfJob := func(s bgjob.Snapshot) string { return strings.TrimSpace(strings.SplitN(s.Output.Text, "\n", 2)[0]) }

	// The pool hands out the cgroup last given back: the one the
	// previous job left.
	a := cgroupOfJob(run("true"))
	if b := cgroupOfJob(run("true")); b != a {
		t.Errorf("an untouched cgroup was not reused: %s, then %s", a, b)
	}
	// A job that writes its cgroup's files.
	touched := run(`echo 3 > "$(awk '$9=="cgroup2"{print $5}' /proc/self/mountinfo | head -1)$(sed -n 's/^0:://p' /proc/self/cgroup)/cgroup.max.depth"`)
	if touched.ExitCode != 0 {
		t.Fatalf("the job could not write its cgroup: %q", touched.Output.Text)
	}
	tc := cgroupOfJob(touched)
	for range 4 {
		if c := cgroupOfJob(run("true")); c == tc {
			t.Fatalf("the cgroup %s that a job wrote to went to a later job", tc)
		}
	}
	// A job that freezes itself: it is killed, and the next one runs.
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: where + `; echo 1 > "$(awk '$9=="cgroup2"{print $5}' /proc/self/mountinfo | head -1)$(sed -n 's/^0:://p' /proc/self/cgroup)/cgroup.freeze"; sleep 300`, Unique: true})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r, s.ID, "/", 1)
	st, _ := r.Status(s.ID)
	events := filepath.Join(cgroupMount(t), cgroupOfJob(st), "cgroup.events")
	for end := time.Now().Add(deadline); ; time.Sleep(5 * time.Millisecond) { // watching a state, with a deadline
		if b, _ := os.ReadFile(events); strings.Contains(string(b), "frozen 1") {
			break
		}
		if time.Now().After(end) {
			t.Fatalf("the job did not freeze itself: %s", events)
		}
	}
	if s, err = r.Cancel(s.ID); err != nil || s.State != bgjob.Cancelled {
		t.Fatalf("Cancel of a frozen job: %v %v", s.State, err)
	}
	for range 4 {
		if c := run("echo alive"); !strings.Contains(c.Output.Text, "alive") || cgroupOfJob(c) == cgroupOfJob(s) {
			t.Fatalf("after a frozen job: %q in %s (the frozen job's: %s)", c.Output.Text, cgroupOfJob(c), cgroupOfJob(s))
		}
	}
}

// A job that moves the host into its own cgroup (the same user may, in a
// delegated hierarchy) is stopped without taking the host with it.
func TestJobCannotTrapTheHost(t *testing.T) {
	if !cgroupsHere(t) || os.Getenv("BGJOB_TEST_TRAP") == "" && !t.Run("in-a-child", func(t *testing.T) {
		// In a child test process: this one's cgroup is moved.
		cmd := exec.Command(os.Args[0], "-test.run=^TestJobCannotTrapTheHost$", "-test.v")
		cmd.Env = append(os.Environ(), "BGJOB_TEST_TRAP=1")
		// A session of its own: if the job took its host down with
		// it, the test process and its group would be spared.
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		out, err := cmd.CombinedOutput()
		if err != nil || !strings.Contains(string(out), "--- PASS: TestJobCannotTrapTheHost") {
			t.Fatalf("child test: %v\n%s", err, out)
		}
	}) {
		return
	}
	if os.Getenv("BGJOB_TEST_TRAP") == "" {
		return
	}
	home, _ := os.ReadFile("/proc/self/cgroup")
	r := newRegistry(t, bgjob.Config{KillGrace: 200 * time.Millisecond})
	trap := `echo ` + strconv.Itoa(os.Getpid()) + ` > "$(awk '$9=="cgroup2"{print $5}' /proc/self/mountinfo | head -1)$(sed -n 's/^0:://p' /proc/self/cgroup)/cgroup.procs" && echo trapped; sleep 300`
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: trap})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r, s.ID, "trapped", 1)
	if s, err = r.Cancel(s.ID); err != nil || s.State != bgjob.Cancelled {
		t.Errorf("Cancel: %v %v; want cancelled", s.State, err)
	}
	// Still alive (this line runs), and back in its own cgroup.
	if now, _ := os.ReadFile("/proc/self/cgroup"); string(now) != string(home) {
		t.Errorf("the host's cgroup is now %q; want %q", now, home)
	}
}
