package bgjob_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// queueHostEnv names the state directory of TestDurableQueueHost.
const queueHostEnv = "BGJOB_TEST_QUEUE_HOST_DIR"

// durableQueue is the Config of the durable queue tests: one slot.
func durableQueue(dir string) bgjob.Config {
	return bgjob.Config{StateDir: dir, MaxRunning: 1, Queue: true, KillGrace: 500 * time.Millisecond}
}

// queueLaunches are the launches of the durable queue tests, in order:
// a blocker that holds the only slot, then queued jobs whose output shows
// that their environment and stdin came back, and one cancelled while
// queued.
var queueLaunches = []struct {
	name string
	spec bgjob.Spec
}{
	{"blocker", bgjob.Spec{Command: "echo blocking; exec sleep 300"}},
	{"a", bgjob.Spec{Command: `printf '%s:%s\n' "$X" "$(cat)"`, Env: map[string]string{"X": "ax"}, Stdin: "in-a"}},
	{"b", bgjob.Spec{Command: "echo b", Unique: true}},
	{"c", bgjob.Spec{Command: `printf '%s:%s\n' "$X" "$(cat)"`, Env: map[string]string{"X": "cx\xff"}, Stdin: "in-c", Priority: 3}},
	{"gone", bgjob.Spec{Command: "echo never"}},
}

// launchQueue makes the launches of queueLaunches on r, cancels "gone",
// and returns the snapshots by name.
func launchQueue(r *bgjob.Registry) (map[string]bgjob.Snapshot, error) {
	out := map[string]bgjob.Snapshot{}
	for _, l := range queueLaunches {
		s, err := r.Start(context.Background(), l.spec)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", l.name, err)
		}
		if want := bgjob.Queued; l.name != "blocker" && s.State != want {
			return nil, fmt.Errorf("%s: %v; want queued", l.name, s.State)
		}
		out[l.name] = s
	}
	_, err := r.Cancel(out["gone"].ID)
	return out, err
}

// TestDurableQueueHost is the host of TestDurableQueueReplay's crash: it
// launches the queue, says each job's ID, and waits to be killed.
func TestDurableQueueHost(t *testing.T) {
	dir := os.Getenv(queueHostEnv)
	if dir == "" {
		t.Skip("run as the host of TestDurableQueueReplay")
	}
	r, err := bgjob.New(durableQueue(dir))
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	ids, err := launchQueue(r)
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	for name, s := range ids {
		fmt.Printf("job %s %s %d\n", name, s.ID, s.PID)
	}
	fmt.Println("ready")
	select {} // until SIGKILL
}

// Durable mode keeps the queue across a restart, after Detach or a crash
// of the host: the next Registry has the queued jobs Queued, in their
// order (priority, then arrival), with their environment and stdin (kept
// in an input file of mode 0600 until they start, never in the record);
// a job cancelled while queued stays cancelled; and a slot that frees
// starts them in that order.
func TestDurableQueueReplay(t *testing.T) {
	for _, restart := range []string{"detach", "crash"} {
		t.Run(restart, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "state")
			ids := map[string]bgjob.Snapshot{}
			switch restart {
			case "detach":
				r1, err := bgjob.New(durableQueue(dir))
				if err != nil {
					t.Fatal(err)
				}
				if ids, err = launchQueue(r1); err != nil {
					t.Fatal(err)
				}
				if err := r1.Detach(); err != nil {
					t.Fatal(err)
				}
				if s, _ := r1.Status(ids["a"].ID); s.State != bgjob.Queued {
					t.Errorf("released queued job: %v; want queued", s.State)
				}
			case "crash":
				host := exec.Command(os.Args[0], "-test.run=^TestDurableQueueHost$", "-test.count=1")
				host.Env = append(os.Environ(), queueHostEnv+"="+dir)
				out, _ := host.StdoutPipe()
				if err := host.Start(); err != nil {
					t.Fatal(err)
				}
				sc := bufio.NewScanner(out)
				for sc.Scan() && sc.Text() != "ready" {
					var name, id string
					var pid int
					if _, err := fmt.Sscanf(sc.Text(), "job %s %s %d", &name, &id, &pid); err == nil {
						ids[name] = bgjob.Snapshot{ID: bgjob.ID(id), PID: pid}
					} else if strings.HasPrefix(sc.Text(), "error") {
						t.Fatal(sc.Text())
					}
				}
				host.Process.Kill()
				host.Wait()
				if len(ids) != len(queueLaunches) {
					t.Fatalf("host launched %v; want %d jobs", ids, len(queueLaunches))
				}
				t.Cleanup(func() { syscall.Kill(-ids["blocker"].PID, syscall.SIGKILL) })
			}

			// The queued jobs' input is on disk, 0600, and not in their
			// records; the cancelled one's is gone.
			for _, run := range runFolders(t, dir) {
				rec := readRec(t, run)
				in := filepath.Join(run, "queued")
				fi, err := os.Stat(in)
				switch rec["state"] {
				case "queued":
					if err != nil || fi.Mode().Perm() != 0o600 {
						t.Errorf("%s: input %v %v; want a file of mode 0600", rec["id"], fi, err)
					}
					if b, _ := os.ReadFile(filepath.Join(run, "record.json")); strings.Contains(string(b), "in-") {
						t.Errorf("record %s holds the stdin", b)
					}
				default:
					if err == nil {
						t.Errorf("%s (%s): input file left", rec["id"], rec["state"])
					}
				}
			}

			tr := &telemetryRecorder{}
			cfg := durableQueue(dir)
			cfg.Telemetry = tr
			r := newRegistry(t, cfg)
			want := map[string]struct {
				state bgjob.State
				place int
			}{
				"blocker": {bgjob.Running, 0}, "c": {bgjob.Queued, 1}, "a": {bgjob.Queued, 2}, "b": {bgjob.Queued, 3},
				"gone": {bgjob.Cancelled, 0},
			}
			for name, w := range want {
				s, err := r.Status(ids[name].ID)
				if err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if s.State != w.state || s.QueuePosition != w.place {
					t.Errorf("%s after the restart: %v at place %d; want %v at %d", name, s.State, s.QueuePosition, w.state, w.place)
				}
			}
			if n := r.Running(); n != 1 {
				t.Errorf("Running = %d; want 1 (the adopted blocker)", n)
			}
			r.Cancel(ids["blocker"].ID)
			byID := map[bgjob.ID]string{}
			for name, text := range map[string]string{"a": "ax:in-a\n", "b": "b\n", "c": "cx\xff:in-c\n"} {
				byID[ids[name].ID] = name
				if s := wait(t, r, ids[name].ID); s.State != bgjob.Exited || s.Output.Text != text {
					t.Errorf("%s: %v %q; want exited %q", name, s.State, s.Output.Text, text)
				}
			}
			if got := tr.startOrder(byID); !slices.Equal(got, []string{"c", "a", "b"}) {
				t.Errorf("start order after the restart %v; want [c a b]", got)
			}
			for _, run := range runFolders(t, dir) {
				if _, err := os.Stat(filepath.Join(run, "queued")); err == nil {
					t.Errorf("%s: input file left after its start", run)
				}
			}
		})
	}
}
