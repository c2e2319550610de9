//go:build linux

package bgjob_test

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// matchKey names a match for the durable tests' counts.
func matchKey(m bgjob.Match) string {
	return fmt.Sprintf("%s %s %d %s", m.ID, m.Watch, m.Offset, m.Line)
}

// awaitFile waits until the job's output file holds sub.
func awaitFile(t *testing.T, dir string, id bgjob.ID, sub string) {
	t.Helper()
	for end := time.Now().Add(deadline); time.Now().Before(end); time.Sleep(5 * time.Millisecond) {
		for _, run := range runFolders(t, dir) {
			if strings.HasPrefix(filepath.Base(run), string(id)+".") {
				if b, _ := os.ReadFile(filepath.Join(run, "output")); strings.Contains(string(b), sub) {
					return
				}
			}
		}
	}
	t.Fatalf("%s's output file never held %q", id, sub)
}

// A job adopted after a restart: what it printed while no host ran is
// matched by the next host, each match delivered once, and a match
// delivered before the restart never again.
func TestDurableWatchAdopted(t *testing.T) {
	cfg := durable(t)
	dir := t.TempDir()
	f, g := filepath.Join(dir, "f"), filepath.Join(dir, "g")
	log1 := newMatchLog()
	cfg.OnMatch = log1.on
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	cmd := fmt.Sprintf("echo 'first ready'; while [ ! -e %s ]; do sleep 0.01; done; echo 'second ready'; while [ ! -e %s ]; do sleep 0.01; done; echo 'third ready'; sleep 60", f, g)
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: cmd, Session: "s",
		Watches: []bgjob.Watch{{Name: "ready", Pattern: rx(`ready$`), Every: true}, {Name: "second", Pattern: rx(`^second`)}}})
	if err != nil {
		t.Fatal(err)
	}
	if ms := log1.await(t, 1); ms[0].Line != "first ready" {
		t.Fatalf("before the restart: %v", ms)
	}
	if err := r1.Detach(); err != nil {
		t.Fatal(err)
	}
	touch(t, f) // printed while no host runs
	awaitFile(t, cfg.StateDir, s.ID, "second ready")

	log2 := newMatchLog()
	cfg.OnMatch = log2.on
	r2 := newRegistry(t, cfg)
	log2.await(t, 2)
	touch(t, g)
	ms := log2.await(t, 3)
	want := []string{
		matchKey(bgjob.Match{ID: s.ID, Watch: "ready", Offset: 12, Line: "second ready"}),
		matchKey(bgjob.Match{ID: s.ID, Watch: "second", Offset: 12, Line: "second ready"}),
		matchKey(bgjob.Match{ID: s.ID, Watch: "ready", Offset: 25, Line: "third ready"}),
	}
	var got []string
	for _, m := range ms {
		got = append(got, matchKey(m))
	}
	if !slices.Equal(got, want) {
		t.Errorf("after the restart, OnMatch got %q; want %q", got, want)
	}
	q := r2.Matches("s")
	got = got[:0]
	for _, m := range q {
		got = append(got, matchKey(m))
	}
	if !slices.Equal(got, want) {
		t.Errorf("after the restart, Matches = %q; want %q", got, want)
	}
	if _, err := r2.Cancel(s.ID); err != nil {
		t.Fatal(err)
	}
	if err := r2.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	r1.Close(ctxT(t))

	r3 := newRegistry(t, cfg)
	if q := r3.Matches("s"); len(q) != 0 {
		t.Errorf("after a second restart: %v; want none, all were delivered", q)
	}
}

// Undelivered matches survive a restart, once; so do matches of a job
// that ended while no host ran, found by the next host's New.
func TestDurableWatchUndelivered(t *testing.T) {
	cfg := durable(t)
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	done, err := r1.Start(ctxT(t), bgjob.Spec{Command: "echo 'ERROR one'; echo fine; echo 'error two'", Session: "s",
		Watches: []bgjob.Watch{{Name: "err", Pattern: rx(`(?i)^error`), Every: true}}})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, r1, done.ID)
	later, err := r1.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("echo one; while [ ! -e %s ]; do sleep 0.01; done; echo 'ERROR late'; printf 'error, no newline'", f), Session: "s",
		Watches: []bgjob.Watch{{Name: "err", Pattern: rx(`(?i)^error`), Every: true}}})
	if err != nil {
		t.Fatal(err)
	}
	waitOutput(t, r1, later.ID, "one", 1)
	// Every match of done is found and queued before Detach returns.
	if err := r1.Detach(); err != nil {
		t.Fatal(err)
	}
	touch(t, f)
	waitExit(t, later.PID)

	log2 := newMatchLog()
	cfg.OnMatch = log2.on
	r2 := newRegistry(t, cfg)
	var got []string
	for _, m := range r2.Matches("s") {
		got = append(got, matchKey(m))
	}
	want := []string{
		matchKey(bgjob.Match{ID: done.ID, Watch: "err", Offset: 0, Line: "ERROR one"}),
		matchKey(bgjob.Match{ID: done.ID, Watch: "err", Offset: 15, Line: "error two"}),
		matchKey(bgjob.Match{ID: later.ID, Watch: "err", Offset: 4, Line: "ERROR late"}),
		matchKey(bgjob.Match{ID: later.ID, Watch: "err", Offset: 15, Line: "error, no newline"}),
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("after the restart, Matches = %q; want %q", got, want)
	}
	if n := len(log2.all()); n != 0 {
		t.Errorf("OnMatch called %d times for replayed matches; want none (as OnComplete)", n)
	}
	if err := r2.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	r1.Close(ctxT(t))
	r3 := newRegistry(t, cfg)
	if q := r3.Matches("s"); len(q) != 0 {
		t.Errorf("after a second restart: %v; want none", q)
	}
}

const watchHostEnv = "BGJOB_TEST_WATCH_HOST_DIR"

// TestDurableWatchHost is the host of TestDurableWatchCrash, which kills
// it with SIGKILL.
func TestDurableWatchHost(t *testing.T) {
	dir := os.Getenv(watchHostEnv)
	if dir == "" {
		t.Skip("run as the host of TestDurableWatchCrash")
	}
	r, err := bgjob.New(bgjob.Config{StateDir: dir})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(1)
	}
	watches := []bgjob.Watch{{Name: "all", Pattern: rx(`^[wa] `), Every: true}, {Name: "first", Pattern: rx(`one$`)}}
	for name, cmd := range map[string]string{
		// Ends while no host runs, its last line without a newline.
		"ends": "echo 'w one'; while [ ! -e " + filepath.Join(dir, "..", "f") + " ]; do sleep 0.01; done; echo 'w two'; printf 'w three'",
		// Adopted.
		"runs": "echo 'a one'; while [ ! -e " + filepath.Join(dir, "..", "g") + " ]; do sleep 0.01; done; echo 'a two'; sleep 60",
	} {
		s, err := r.Start(context.Background(), bgjob.Spec{Command: cmd, Session: "s", Watches: watches})
		if err != nil {
			fmt.Println("error", err)
			os.Exit(1)
		}
		fmt.Printf("job %s %s %d\n", name, s.ID, s.PID)
	}
	fmt.Println("ready")
	select {} // until SIGKILL
}

// A host killed at any moment (here, just after its jobs printed their
// first lines, whose matches it may or may not have recorded): the next
// host delivers each match once.
func TestDurableWatchCrash(t *testing.T) {
	base := t.TempDir()
	dir := filepath.Join(base, "state")
	host := exec.Command(os.Args[0], "-test.run=^TestDurableWatchHost$", "-test.count=1")
	host.Env = append(os.Environ(), watchHostEnv+"="+dir)
	out, _ := host.StdoutPipe()
	if err := host.Start(); err != nil {
		t.Fatal(err)
	}
	type started struct {
		id  bgjob.ID
		pid int
	}
	jobs := map[string]started{}
	sc := bufio.NewScanner(out)
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		if len(f) == 4 && f[0] == "job" {
			pid, _ := strconv.Atoi(f[3])
			jobs[f[1]] = started{bgjob.ID(f[2]), pid}
		}
		if sc.Text() == "ready" {
			break
		}
		if len(f) > 0 && f[0] == "error" {
			t.Fatal(sc.Text())
		}
	}
	if len(jobs) != 2 {
		t.Fatalf("host started %d jobs; want 2", len(jobs))
	}
	awaitFile(t, dir, jobs["ends"].id, "w one")
	awaitFile(t, dir, jobs["runs"].id, "a one")
	host.Process.Kill()
	host.Wait()
	t.Cleanup(func() {
		for _, j := range jobs {
			syscall.Kill(-j.pid, syscall.SIGKILL)
		}
	})
	touch(t, filepath.Join(base, "f"))
	touch(t, filepath.Join(base, "g"))
	waitExit(t, jobs["ends"].pid)
	awaitFile(t, dir, jobs["runs"].id, "a two")

	log := newMatchLog()
	cfg := bgjob.Config{StateDir: dir, KillGrace: 500 * time.Millisecond, OnMatch: log.on}
	r := newRegistry(t, cfg)
	// "a two" is matched live, by the adopted job's reader; "a one" came
	// before it, from the record or the file.
	for ms := log.all(); !slices.ContainsFunc(ms, func(m bgjob.Match) bool { return m.Line == "a two" }); {
		ms = log.await(t, len(ms)+1)
	}
	var got []string
	for _, m := range r.Matches("s") {
		got = append(got, matchKey(m))
	}
	e, a := jobs["ends"].id, jobs["runs"].id
	want := []string{
		matchKey(bgjob.Match{ID: e, Watch: "all", Offset: 0, Line: "w one"}),
		matchKey(bgjob.Match{ID: e, Watch: "first", Offset: 0, Line: "w one"}),
		matchKey(bgjob.Match{ID: e, Watch: "all", Offset: 6, Line: "w two"}),
		matchKey(bgjob.Match{ID: e, Watch: "all", Offset: 12, Line: "w three"}),
		matchKey(bgjob.Match{ID: a, Watch: "all", Offset: 0, Line: "a one"}),
		matchKey(bgjob.Match{ID: a, Watch: "first", Offset: 0, Line: "a one"}),
		matchKey(bgjob.Match{ID: a, Watch: "all", Offset: 6, Line: "a two"}),
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("after the crash, Matches = %q; want %q", got, want)
	}
	if _, err := r.Cancel(a); err != nil {
		t.Fatal(err)
	}
	if err := r.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	r2 := newRegistry(t, bgjob.Config{StateDir: dir})
	if q := r2.Matches("s"); len(q) != 0 {
		t.Errorf("after a second restart: %v; want none", q)
	}
}

// The output file's holes never reach what a later host must match: with
// watches, the disk stays bounded while a host reads, and the next host
// matches from where the last one stopped, never the holes (which read as
// NUL bytes: a watch for NUL would see them).
func TestDurableWatchHoles(t *testing.T) {
	cfg := durable(t)
	cfg.HeadBytes, cfg.TailBytes = 4096, 4096
	cfg.MaxOutputBytes = 1<<20 + 8192
	dir := t.TempDir()
	f := filepath.Join(dir, "f")
	log1 := newMatchLog()
	cfg.OnMatch = log1.on
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	const n = 8 << 20
	// After MARK one, a long line the first host matches in pieces
	// without a match, so that how far it got is recorded now and then
	// only: the holes must not pass that.
	cmd := fmt.Sprintf("%s; echo; echo 'MARK one'; %s; while [ ! -e %s ]; do sleep 0.01; done; echo; echo 'MARK two'; sleep 60",
		helperCmd("pattern", strconv.Itoa(n)), helperCmd("pattern", strconv.Itoa(n)), f)
	s, err := r1.Start(ctxT(t), bgjob.Spec{Command: cmd, Env: helperEnv,
		Watches: []bgjob.Watch{{Name: "mark", Pattern: rx(`^MARK`), Every: true}, {Name: "nul", Pattern: rx(`\x00`), Every: true}}})
	if err != nil {
		t.Fatal(err)
	}
	if ms := log1.await(t, 1); len(ms) != 1 || ms[0].Line != "MARK one" || ms[0].Offset != n+1 {
		t.Fatalf("before the restart: %v", ms)
	}
	for {
		if st, err := r1.Status(s.ID); err != nil || st.Output.Total == 2*n+10 {
			break
		}
		time.Sleep(5 * time.Millisecond) // polling the output's total, with the test's deadline
	}
	out := ""
	for _, run := range runFolders(t, cfg.StateDir) {
		out = filepath.Join(run, "output")
	}
	used := func() int64 {
		var st syscall.Stat_t
		if err := syscall.Stat(out, &st); err != nil {
			t.Fatal(err)
		}
		return st.Blocks * 512
	}
	if u := used(); u > 4<<20 {
		t.Errorf("output file uses %d bytes while the host reads; want it bounded near %d", u, cfg.MaxOutputBytes)
	}
	if err := r1.Detach(); err != nil {
		t.Fatal(err)
	}
	touch(t, f)
	awaitFile(t, cfg.StateDir, s.ID, "MARK two")

	log2 := newMatchLog()
	cfg.OnMatch = log2.on
	r2 := newRegistry(t, cfg)
	ms := log2.await(t, 1)
	if len(ms) != 1 || ms[0].Line != "MARK two" || ms[0].Offset != 2*n+11 {
		t.Errorf("after the restart: %v; want MARK two at %d, once", ms[:min(len(ms), 5)], 2*n+11)
	}
	if u := used(); u > 4<<20 {
		t.Errorf("output file uses %d bytes once the next host read it; want it bounded near %d", u, cfg.MaxOutputBytes)
	}
	if _, err := r2.Cancel(s.ID); err != nil {
		t.Fatal(err)
	}
	for _, m := range append(log1.all(), log2.all()...) {
		if m.Watch == "nul" {
			t.Errorf("a NUL matched at %d: a hole was read as output", m.Offset)
		}
	}
	r1.Close(ctxT(t))
}

// A queued job's watches, those of its Spec and one added while it
// waits, come back with it after a restart (Detach), and match its
// output once it starts; in memory a watch added to a queued job
// matches from its first byte too.
func TestDurableWatchQueued(t *testing.T) {
	for _, mode := range []string{"memory", "durable"} {
		t.Run(mode, func(t *testing.T) {
			cfg := bgjob.Config{MaxRunning: 1, Queue: true, KillGrace: 500 * time.Millisecond}
			if mode == "durable" {
				cfg.StateDir = filepath.Join(t.TempDir(), "state")
			}
			log := newMatchLog()
			first := cfg
			if mode == "memory" {
				first.OnMatch = log.on
			}
			r1, err := bgjob.New(first)
			if err != nil {
				t.Fatal(err)
			}
			blocker, err := r1.Start(ctxT(t), bgjob.Spec{Command: "exec sleep 300"})
			if err != nil {
				t.Fatal(err)
			}
			q, err := r1.Start(ctxT(t), bgjob.Spec{Command: "echo hello world", Watches: []bgjob.Watch{{Name: "spec", Pattern: rx(`^hello`)}}})
			if err != nil || q.State != bgjob.Queued {
				t.Fatalf("queued launch: %v, %v; want queued", q.State, err)
			}
			if err := r1.Watch(q.ID, bgjob.Watch{Name: "added", Pattern: rx(`world$`)}); err != nil {
				t.Fatalf("Watch of a queued job: %v", err)
			}
			r := r1
			if mode == "durable" {
				if err := r1.Detach(); err != nil {
					t.Fatal(err)
				}
				cfg.OnMatch = log.on
				r = newRegistry(t, cfg)
			} else {
				t.Cleanup(func() { r1.Close(context.Background()) })
			}
			if _, err := r.Cancel(blocker.ID); err != nil {
				t.Fatal(err)
			}
			if s := wait(t, r, q.ID); s.State != bgjob.Exited {
				t.Fatalf("queued job: %v; want exited", s.State)
			}
			got := map[string]int64{}
			for _, m := range log.await(t, 2) {
				if m.ID != q.ID || m.Line != "hello world" {
					t.Errorf("match %+v; want the queued job's line", m)
				}
				got[m.Watch] = m.Offset
			}
			if len(got) != 2 || got["spec"] != 0 || got["added"] != 0 {
				t.Errorf("matches by watch %v; want spec and added at 0", got)
			}
		})
	}
}
