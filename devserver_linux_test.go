package bgjob_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// awaitText reads the job's output with ReadWait, which wakes on output,
// until it holds sub, and returns what it read.
func awaitText(t *testing.T, r *bgjob.Registry, id bgjob.ID, sub string) string {
	t.Helper()
	ctx := ctxT(t)
	var out strings.Builder
	for off := int64(0); !strings.Contains(out.String(), sub); {
		c, err := r.ReadWait(ctx, id, off, 1<<16)
		if err != nil {
			t.Fatalf("ReadWait for %q: %v (output so far %q)", sub, err, out.String())
		}
		out.WriteString(c.Data)
		off = c.Next
		if c.Done && !strings.Contains(out.String(), sub) {
			s, _ := r.Status(id)
			t.Fatalf("job ended (%v %d %q) before printing %q: %q", s.State, s.ExitCode, s.Reason, sub, out.String())
		}
	}
	return out.String()
}

// portOf returns the port a serve helper announced in out.
func portOf(t *testing.T, out string) int {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if v, ok := strings.CutPrefix(line, "port "); ok {
			if n, err := strconv.Atoi(strings.TrimSpace(v)); err == nil {
				return n
			}
		}
	}
	t.Fatalf("no port in %q", out)
	return 0
}

// dial reports whether a TCP connection to the loopback port succeeds,
// and if send is not empty, sends it.
func dial(port int, send string) error {
	c, err := net.DialTimeout("tcp", "127.0.0.1:"+strconv.Itoa(port), 5*time.Second)
	if err != nil {
		return err
	}
	defer c.Close()
	if send != "" {
		_, err = c.Write([]byte(send))
	}
	return err
}

// serverSpec is a dev server started in the background by a shell that
// then exits with code 7: the serve helper, given the shell's PID.
func serverSpec(l bgjob.Leftovers) bgjob.Spec {
	return bgjob.Spec{Command: helperCmd("serve") + " $$ & exit 7", Env: helperEnv, Leftovers: l}
}

// With LeftoversWait a dev server that its shell left running keeps the
// job Running after the shell's exit, with its process and its port in
// the snapshot; Cancel stops it and frees the port; a server that exits
// by itself ends the job with the shell's exit code. Both containments.
func TestLeftoversWait(t *testing.T) {
	for _, mode := range containModes {
		t.Run(mode.name, func(t *testing.T) {
			if mode.want == bgjob.ContainCgroup && !cgroupsHere(t) {
				t.Skip("no writable cgroup v2 hierarchy here: jobs are contained by their session")
			}
			for _, end := range []string{"cancel", "server-exits", "timeout", "close"} {
				t.Run(end, func(t *testing.T) {
					r := newRegistry(t, bgjob.Config{Cgroup: mode.cgroup})
					clock := &fakeClock{now: time.Now()}
					bgjob.SetClock(r, clock.Now)
					spec := serverSpec(bgjob.LeftoversWait)
					spec.Timeout = time.Hour // by the synthetic clock
					s, err := r.Start(ctxT(t), spec)
					if err != nil {
						t.Fatal(err)
					}
					if s.Containment != mode.want {
						t.Fatalf("containment %v; want %v", s.Containment, mode.want)
					}
					out := awaitText(t, r, s.ID, "parent gone") // the shell has exited
					port := portOf(t, out)
					s, err = r.Status(s.ID)
					if err != nil {
						t.Fatal(err)
					}
					if s.State != bgjob.Running || s.ExitCode != -1 {
						t.Fatalf("after the shell's exit: %v %d; want running, -1", s.State, s.ExitCode)
					}
					if !slices.Contains(s.Ports, port) {
						t.Errorf("ports %v; want %d among them", s.Ports, port)
					}
					if len(s.Processes) != 1 || !strings.Contains(s.Processes[0].Command, "serve") || s.Processes[0].PID == s.PID {
						t.Errorf("processes %+v; want the server alone (the shell %d has exited)", s.Processes, s.PID)
					}
					if err := dial(port, ""); err != nil {
						t.Fatalf("dial the server: %v", err)
					}
					switch end {
					case "cancel":
						if s, err = r.Cancel(s.ID); err != nil || s.State != bgjob.Cancelled || s.ExitCode != 130 {
							t.Fatalf("Cancel: %v %d %v; want cancelled, 130", s.State, s.ExitCode, err)
						}
					case "server-exits":
						if err := dial(port, "quit\n"); err != nil {
							t.Fatal(err)
						}
						if s = wait(t, r, s.ID); s.State != bgjob.Exited || s.ExitCode != 7 || s.Output.Notice != "" {
							t.Fatalf("got %v %d %q; want exited 7 (the shell's code), no notice", s.State, s.ExitCode, s.Output.Notice)
						}
					case "timeout":
						clock.advance(r, time.Hour)
						if s = wait(t, r, s.ID); s.State != bgjob.TimedOut || s.ExitCode != 124 {
							t.Fatalf("got %v %d; want timed_out 124", s.State, s.ExitCode)
						}
					case "close":
						if err := r.Close(ctxT(t)); err != nil {
							t.Fatal(err)
						}
						if s, _ = r.Status(s.ID); s.State != bgjob.Cancelled {
							t.Fatalf("after Close: %v; want cancelled", s.State)
						}
					}
					if s.Processes != nil || s.Ports != nil {
						t.Errorf("ended job lists processes %v, ports %v; want none", s.Processes, s.Ports)
					}
					if err := dial(port, ""); !errors.Is(err, syscall.ECONNREFUSED) {
						t.Errorf("dial after the end: %v; want connection refused", err)
					}
				})
			}
		})
	}
}

// With LeftoversStop (the default) the same server is stopped when its
// shell exits, and the job ends then with the shell's code.
func TestLeftoversStop(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	s, err := r.Start(ctxT(t), serverSpec(bgjob.LeftoversStop))
	if err != nil {
		t.Fatal(err)
	}
	s = wait(t, r, s.ID)
	if s.State != bgjob.Exited || s.ExitCode != 7 || !strings.Contains(s.Output.Notice, "stopped 1 leftover") {
		t.Fatalf("got %v %d %q; want exited 7, one leftover stopped", s.State, s.ExitCode, s.Output.Notice)
	}
	if strings.Contains(s.Output.Text, "port ") {
		if err := dial(portOf(t, s.Output.Text), ""); !errors.Is(err, syscall.ECONNREFUSED) {
			t.Errorf("dial after the end: %v; want connection refused", err)
		}
	}
}

// Leftovers outside the two values is refused; the two are different jobs.
func TestLeftoversSpec(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	_, err := r.Start(ctxT(t), bgjob.Spec{Command: "true", Leftovers: 2})
	if !errors.Is(err, bgjob.ErrInvalidSpec) || !strings.Contains(err.Error(), "Spec.Leftovers") {
		t.Errorf("Leftovers 2: %v; want ErrInvalidSpec naming Spec.Leftovers", err)
	}
	spec := helperSpec("sleep", "300000")
	a, err := r.Start(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	spec.Leftovers = bgjob.LeftoversWait
	b, err := r.Start(ctxT(t), spec)
	if err != nil {
		t.Fatal(err)
	}
	if a.ID == b.ID || b.Joined {
		t.Errorf("LeftoversWait launch joined the LeftoversStop job (%s, %s)", a.ID, b.ID)
	}
	for _, id := range []bgjob.ID{a.ID, b.ID} {
		r.Cancel(id)
	}
}

// Snapshot.Processes lists a three-level tree with each process's parent,
// and its command lines pass the Admitter; a withholding Admitter clears
// them. Both containments.
func TestProcessesListsTree(t *testing.T) {
	for _, mode := range containModes {
		t.Run(mode.name, func(t *testing.T) {
			if mode.want == bgjob.ContainCgroup && !cgroupsHere(t) {
				t.Skip("no writable cgroup v2 hierarchy here: jobs are contained by their session")
			}
			for _, policy := range []string{"none", "redact", "withhold"} {
				t.Run(policy, func(t *testing.T) {
					cfg := bgjob.Config{Cgroup: mode.cgroup}
					switch policy {
					case "redact":
						cfg.Admitter = bgjob.AdmitterFunc(func(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
							return bgjob.Admitted{Text: strings.ReplaceAll(req.Text, "hunter2", "[secret]")}, nil
						})
					case "withhold":
						cfg.Admitter = bgjob.AdmitterFunc(func(_ context.Context, req bgjob.AdmitRequest) (bgjob.Admitted, error) {
							if strings.Contains(req.Text, "hunter2") {
								return bgjob.Admitted{Withhold: true}, nil
							}
							return bgjob.Admitted{Text: req.Text}, nil
						})
					}
					r := newRegistry(t, cfg)
					s, err := r.Start(ctxT(t), bgjob.Spec{Command: helperCmd("tree", "3") + " --password=hunter2", Env: helperEnv})
					if err != nil {
						t.Fatal(err)
					}
					defer r.Cancel(s.ID)
					awaitText(t, r, s.ID, "ready")
					s, err = r.Status(s.ID)
					if err != nil {
						t.Fatal(err)
					}
					// The helpers say who they are: pid P ppid Q.
					var chain [][2]int
					for _, line := range strings.Split(s.Output.Text, "\n") {
						var pid, ppid int
						if _, err := fmt.Sscanf(line, "pid %d ppid %d", &pid, &ppid); err == nil {
							chain = append(chain, [2]int{pid, ppid})
						}
					}
					if len(chain) != 3 {
						t.Fatalf("output %q; want three helpers", s.Output.Text)
					}
					byPID := map[int]bgjob.Process{}
					for i, p := range s.Processes {
						byPID[p.PID] = p
						if i > 0 && p.PID <= s.Processes[i-1].PID {
							t.Errorf("processes not by PID: %+v", s.Processes)
						}
					}
					for i, c := range chain {
						p, ok := byPID[c[0]]
						switch {
						case !ok:
							t.Errorf("helper %d (pid %d) not listed in %+v", i, c[0], s.Processes)
						case p.PPID != c[1]:
							t.Errorf("helper %d: ppid %d; want %d", i, p.PPID, c[1])
						case i > 0 && p.PPID != chain[i-1][0]:
							t.Errorf("helper %d: parent %d; want the helper before it, %d", i, p.PPID, chain[i-1][0])
						}
						want := "tree " + strconv.Itoa(3-i)
						switch policy {
						case "withhold":
							if p.Command != "" {
								t.Errorf("withheld command line %q; want empty", p.Command)
							}
						default:
							if !strings.Contains(p.Command, want) {
								t.Errorf("helper %d: command %q; want it to hold %q", i, p.Command, want)
							}
						}
					}
					if _, ok := byPID[s.PID]; !ok && !slices.ContainsFunc(chain, func(c [2]int) bool { return c[0] == s.PID }) {
						t.Errorf("the shell %d is not listed in %+v", s.PID, s.Processes)
					}
					for _, p := range s.Processes {
						if policy != "none" && strings.Contains(p.Command, "hunter2") {
							t.Errorf("command line %q holds the secret; the Admitter must see it", p.Command)
						}
						if policy == "redact" && p.PID == chain[0][0] && !strings.Contains(p.Command, "[secret]") {
							t.Errorf("command line %q; want the Admitter's rewrite", p.Command)
						}
					}
					if s.Ports != nil {
						t.Errorf("ports %v; want none", s.Ports)
					}
				})
			}
		})
	}
}

// In durable mode a dev server outlives its host as any job does: a job
// whose shell had exited, leaving its server running (LeftoversWait), is
// adopted by the next Registry in its leftover phase: Running, with its
// port, ending with the shell's code when the server exits, or stopped
// whole by Cancel. Both containments.
func TestDurableLeftoversAdopted(t *testing.T) {
	for _, mode := range containModes {
		t.Run(mode.name, func(t *testing.T) {
			for _, end := range []string{"server-exits", "cancel"} {
				t.Run(end, func(t *testing.T) {
					cfg := durable(t)
					cfg.Cgroup = mode.cgroup
					r1, err := bgjob.New(cfg)
					if err != nil {
						t.Fatal(err)
					}
					s, err := r1.Start(ctxT(t), serverSpec(bgjob.LeftoversWait))
					if err != nil {
						t.Fatal(err)
					}
					if mode.want == bgjob.ContainCgroup && s.Containment != mode.want {
						r1.Close(ctxT(t))
						t.Skip("no writable cgroup v2 hierarchy here: jobs are contained by their session")
					}
					port := portOf(t, awaitText(t, r1, s.ID, "parent gone"))
					if err := r1.Detach(); err != nil {
						t.Fatal(err)
					}
					r2 := newRegistry(t, cfg)
					a, err := r2.Status(s.ID)
					if err != nil {
						t.Fatal(err)
					}
					if a.State != bgjob.Running || !slices.Contains(a.Ports, port) {
						t.Fatalf("adopted: %v, ports %v; want running with port %d", a.State, a.Ports, port)
					}
					switch end {
					case "server-exits":
						if err := dial(port, "quit\n"); err != nil {
							t.Fatal(err)
						}
						if a = wait(t, r2, s.ID); a.State != bgjob.Exited || a.ExitCode != 7 {
							t.Errorf("got %v %d; want exited 7, the shell's code", a.State, a.ExitCode)
						}
					case "cancel":
						if a, err = r2.Cancel(s.ID); err != nil || a.State != bgjob.Cancelled {
							t.Errorf("Cancel: %v %v; want cancelled", a.State, err)
						}
					}
					if err := dial(port, ""); !errors.Is(err, syscall.ECONNREFUSED) {
						t.Errorf("dial after the end: %v; want connection refused", err)
					}
				})
			}
		})
	}
}

// A sandboxed job has a network namespace of its own: its ports are read
// there, through one of its processes, and its processes are listed from
// the host's view. Both containments.
func TestPortsInSandbox(t *testing.T) {
	needBwrap(t)
	for _, mode := range containModes {
		t.Run(mode.name, func(t *testing.T) {
			r := newRegistry(t, bgjob.Config{Cgroup: mode.cgroup})
			dir := t.TempDir()
			s, err := r.Start(ctxT(t), bgjob.Spec{Command: sandboxHelper(t, dir, "serve"), Dir: dir, Env: helperEnv, Sandbox: &bgjob.Sandbox{}})
			if err != nil {
				t.Fatal(err)
			}
			defer r.Cancel(s.ID)
			port := portOf(t, awaitText(t, r, s.ID, "port "))
			if s, err = r.Status(s.ID); err != nil {
				t.Fatal(err)
			}
			if !slices.Contains(s.Ports, port) {
				t.Errorf("ports %v; want %d among them", s.Ports, port)
			}
			if !slices.ContainsFunc(s.Processes, func(p bgjob.Process) bool { return strings.Contains(p.Command, "helper.test serve") }) {
				t.Errorf("processes %+v; want the server among them", s.Processes)
			}
		})
	}
}
