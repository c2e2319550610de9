package bgjob_test

import (
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// needBwrap skips unless bubblewrap is installed and can make its
// namespaces here (CI installs it, so there the tests run).
func needBwrap(t *testing.T) {
	t.Helper()
	path, err := exec.LookPath("bwrap")
	if err != nil {
		if os.Getenv("CI") != "" {
			t.Fatal("bwrap missing in CI, which installs bubblewrap")
		}
		t.Skip("no bwrap (Debian's bubblewrap package): sandbox tests not run")
	}
	if out, err := exec.Command(path, "--unshare-all", "--ro-bind", "/", "/", "true").CombinedOutput(); err != nil {
		t.Skipf("bwrap cannot make namespaces here: %v %s", err, out)
	}
}

// sandboxed runs cmd in dir under sb and returns its end.
func sandboxed(t *testing.T, r *bgjob.Registry, dir string, sb *bgjob.Sandbox, cmd string) bgjob.Snapshot {
	t.Helper()
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: cmd, Dir: dir, Sandbox: sb})
	if err != nil {
		t.Fatal(err)
	}
	return wait(t, r, s.ID)
}

func TestSandboxWrites(t *testing.T) {
	needBwrap(t)
	r := newRegistry(t, bgjob.Config{})
	dir, other, outside := t.TempDir(), t.TempDir(), t.TempDir()
	sb := &bgjob.Sandbox{Writable: []string{other}}
	// Its Dir, the Writable paths and its private /tmp take writes.
	s := sandboxed(t, r, dir, sb, fmt.Sprintf(`echo a > f && echo b > %s/f && echo c > "$TMPDIR/f" && cat f %s/f "$TMPDIR/f" && echo "$TMPDIR"`, other, other))
	if s.ExitCode != 0 || s.Output.Text != "a\nb\nc\n/tmp\n" {
		t.Fatalf("writes inside: exit %d %q", s.ExitCode, s.Output.Text)
	}
	// Anywhere else: refused by a read-only filesystem.
	home, _ := os.UserHomeDir()
	for _, p := range []string{"/etc/bgjob-sandbox-test", filepath.Join(home, "bgjob-sandbox-test"), "/var/tmp/bgjob-sandbox-test"} {
		s = sandboxed(t, r, dir, sb, "echo x > "+p)
		if s.ExitCode == 0 || !strings.Contains(s.Output.Text, "Read-only file system") {
			t.Errorf("write to %s: exit %d %q; want a read-only file system", p, s.ExitCode, s.Output.Text)
		}
		if _, err := os.Stat(p); err == nil {
			os.Remove(p)
			t.Errorf("%s was written on the host", p)
		}
	}
	// The host's /tmp is not the job's: a write there lands in the
	// private one and never reaches the host.
	sandboxed(t, r, dir, sb, fmt.Sprintf("mkdir -p %s && echo x > %s/f", outside, outside))
	if _, err := os.Stat(filepath.Join(outside, "f")); err == nil {
		t.Errorf("a write to the host's %s reached it", outside)
	}
}

func TestSandboxReads(t *testing.T) {
	needBwrap(t)
	r := newRegistry(t, bgjob.Config{})
	dir, listed, unlisted := t.TempDir(), t.TempDir(), t.TempDir()
	os.WriteFile(filepath.Join(listed, "a"), []byte("listed\n"), 0o644)
	os.WriteFile(filepath.Join(unlisted, "b"), []byte("secret\n"), 0o644)
	cmd := fmt.Sprintf("cat %s/a; cat %s/b; echo x > %s/c", listed, unlisted, listed)
	// Everything readable (the host's /tmp through "/" and the paths
	// listed under it): both files read, nothing writable.
	s := sandboxed(t, r, dir, &bgjob.Sandbox{Readable: []string{"/", listed, unlisted}}, cmd)
	if !strings.HasPrefix(s.Output.Text, "listed\nsecret\n") || !strings.Contains(s.Output.Text, "Read-only file system") {
		t.Errorf("whole filesystem readable: %q", s.Output.Text)
	}
	// With Readable nil the host's /tmp is the private one.
	s = sandboxed(t, r, dir, &bgjob.Sandbox{}, "cat "+listed+"/a")
	if s.ExitCode == 0 {
		t.Errorf("the host's /tmp showed through: %q", s.Output.Text)
	}
	// Reads listed: the unlisted file is not there, programs still run.
	s = sandboxed(t, r, dir, &bgjob.Sandbox{Readable: []string{listed}}, cmd)
	if !strings.HasPrefix(s.Output.Text, "listed\n") || strings.Contains(s.Output.Text, "secret") || !strings.Contains(s.Output.Text, "No such file") || !strings.Contains(s.Output.Text, "Read-only file system") {
		t.Errorf("reads listed: exit %d %q; want the listed file only, read-only", s.ExitCode, s.Output.Text)
	}
}

func TestSandboxNetwork(t *testing.T) {
	needBwrap(t)
	bash, err := exec.LookPath("bash")
	if err != nil {
		t.Skip("no bash for /dev/tcp")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	accepted := make(chan struct{}, 4)
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			io.WriteString(c, "hello\n")
			c.Close()
			accepted <- struct{}{}
		}
	}()
	port := ln.Addr().(*net.TCPAddr).Port
	r := newRegistry(t, bgjob.Config{})
	cmd := fmt.Sprintf(`%s -c 'exec 3<>/dev/tcp/127.0.0.1/%d && head -n1 <&3'`, bash, port)
	// Without network: its own loopback has nothing listening.
	s := sandboxed(t, r, t.TempDir(), &bgjob.Sandbox{}, cmd)
	if s.ExitCode == 0 || !strings.Contains(s.Output.Text, "Connection refused") {
		t.Errorf("no network: exit %d %q; want connection refused", s.ExitCode, s.Output.Text)
	}
	// With network: the host's loopback server answers.
	s = sandboxed(t, r, t.TempDir(), &bgjob.Sandbox{Network: true}, cmd)
	if s.ExitCode != 0 || s.Output.Text != "hello\n" {
		t.Errorf("network: exit %d %q; want hello", s.ExitCode, s.Output.Text)
	}
	select {
	case <-accepted:
	case <-time.After(10 * time.Second):
		t.Error("the server never saw the sandboxed connection")
	}
}

func TestSandboxHidesHostProcesses(t *testing.T) {
	needBwrap(t)
	r := newRegistry(t, bgjob.Config{})
	host := os.Getpid()
	s := sandboxed(t, r, t.TempDir(), &bgjob.Sandbox{}, fmt.Sprintf("kill -0 %d && echo signalled; test -e /proc/%d && echo seen; ls /proc | grep -c '^[0-9]'", host, host))
	if strings.Contains(s.Output.Text, "signalled") || strings.Contains(s.Output.Text, "seen") {
		t.Errorf("the job saw or signalled the host: %q", s.Output.Text)
	}
	lines := strings.Fields(s.Output.Text)
	if n, err := strconv.Atoi(lines[len(lines)-1]); err != nil || n > 9 {
		t.Errorf("the job sees %q processes; want only its own few", lines[len(lines)-1])
	}
}

// sandboxHelper copies the test binary into dir, which a sandbox shows
// (its /tmp is private, and the binary may live in the host's), and
// returns a helperCmd-like command line for it.
func sandboxHelper(t *testing.T, dir string, args ...string) string {
	t.Helper()
	bin := filepath.Join(dir, "helper.test")
	if _, err := os.Stat(bin); err != nil {
		if err := os.Link(os.Args[0], bin); err != nil {
			b, err := os.ReadFile(os.Args[0])
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(bin, b, 0o755); err != nil {
				t.Fatal(err)
			}
		}
	}
	q := []string{"'" + bin + "'"}
	for _, a := range args {
		q = append(q, "'"+a+"'")
	}
	return strings.Join(q, " ")
}

func TestSandboxContainsAndStops(t *testing.T) {
	needBwrap(t)
	for _, mode := range containModes {
		t.Run(mode.name, func(t *testing.T) {
			r := newRegistry(t, bgjob.Config{Cgroup: mode.cgroup, KillGrace: 200 * time.Millisecond})
			dir := t.TempDir()
			// Escapers inside the sandbox are stopped by Cancel.
			token := newToken(t)
			h := sandboxHelper(t, dir, "sleep", "300000", token)
			s, err := r.Start(ctxT(t), bgjob.Spec{Command: fmt.Sprintf("setsid %s & setsid -f %s; nohup %s >/dev/null 2>&1 & echo up; sleep 300", h, h, h), Dir: dir, Env: helperEnv, Sandbox: &bgjob.Sandbox{}})
			if err != nil {
				t.Fatal(err)
			}
			awaitMarked(t, token, 3)
			if s, _ = r.Cancel(s.ID); s.State != bgjob.Cancelled {
				t.Errorf("cancel: %v", s.State)
			}
			assertNoneMarked(t, token)
			// A timeout.
			s, err = r.Start(ctxT(t), bgjob.Spec{Command: "sleep 300", Dir: dir, Timeout: 200 * time.Millisecond, Sandbox: &bgjob.Sandbox{}})
			if err != nil {
				t.Fatal(err)
			}
			if s = wait(t, r, s.ID); s.State != bgjob.TimedOut {
				t.Errorf("timeout: %v exit %d", s.State, s.ExitCode)
			}
			// Limits hold inside.
			s, err = r.Start(ctxT(t), bgjob.Spec{Command: "while :; do :; done", Dir: dir, Sandbox: &bgjob.Sandbox{}, Limits: bgjob.Limits{CPUTime: time.Second}})
			if err != nil {
				t.Fatal(err)
			}
			s = wait(t, r, s.ID)
			if s.Reason != "CPU time limit 1s reached" {
				t.Errorf("CPU limit in the sandbox: %v exit %d %q", s.State, s.ExitCode, s.Reason)
			}
		})
	}
}

func TestSandboxUnavailable(t *testing.T) {
	// No bubblewrap: New with a Config sandbox and a sandboxed Start both
	// fail with ErrUnsupported, saying what is missing, and nothing runs.
	_, err := bgjob.New(bgjob.Config{Sandbox: &bgjob.Sandbox{}, Bwrap: "/nonexistent/bwrap"})
	if !errors.Is(err, bgjob.ErrUnsupported) || !strings.Contains(err.Error(), "no bubblewrap") {
		t.Errorf("New: %v; want ErrUnsupported saying bubblewrap is missing", err)
	}
	r := newRegistry(t, bgjob.Config{Bwrap: "/nonexistent/bwrap"})
	marker := filepath.Join(t.TempDir(), "ran")
	_, err = r.Start(ctxT(t), bgjob.Spec{Command: "touch " + marker, Sandbox: &bgjob.Sandbox{}})
	if !errors.Is(err, bgjob.ErrUnsupported) || !strings.Contains(err.Error(), "Spec.Sandbox: sandbox: no bubblewrap") {
		t.Errorf("Start: %v; want ErrUnsupported saying bubblewrap is missing", err)
	}
	if _, err := os.Stat(marker); err == nil {
		t.Error("the command ran unsandboxed")
	}
	if n := len(r.List("")); n != 0 {
		t.Errorf("%d jobs after a refused launch", n)
	}
}

func TestSandboxBadPaths(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	for _, tc := range []struct {
		sb    bgjob.Sandbox
		field string
	}{
		{bgjob.Sandbox{Writable: []string{"relative/dir"}}, "Spec.Sandbox.Writable[0]"},
		{bgjob.Sandbox{Writable: []string{"/", "/nonexistent-bgjob"}}, "Spec.Sandbox.Writable[1]"},
		{bgjob.Sandbox{Readable: []string{""}}, "Spec.Sandbox.Readable[0]"},
		{bgjob.Sandbox{Readable: []string{"/tmp\x00x"}}, "Spec.Sandbox.Readable[0]"},
	} {
		sb := tc.sb
		_, err := r.Start(ctxT(t), bgjob.Spec{Command: "true", Sandbox: &sb})
		if !errors.Is(err, bgjob.ErrInvalidSpec) || !strings.Contains(err.Error(), tc.field+":") {
			t.Errorf("Start with %+v: %v; want ErrInvalidSpec naming %s", tc.sb, err, tc.field)
		}
		_, err = bgjob.New(bgjob.Config{Sandbox: &sb})
		cfield := "Config." + strings.TrimPrefix(tc.field, "Spec.")
		if !errors.Is(err, bgjob.ErrInvalidConfig) || !strings.Contains(err.Error(), cfield+":") {
			t.Errorf("New with %+v: %v; want ErrInvalidConfig naming %s", tc.sb, err, cfield)
		}
	}
}

func TestSandboxFailureIsReported(t *testing.T) {
	needBwrap(t)
	r := newRegistry(t, bgjob.Config{})
	gone := t.TempDir()
	// The writable path vanishes between the launch's checks and the
	// spawn: bubblewrap cannot make the sandbox, and says so.
	bgjob.SetHooks(r, func(bgjob.ID) { os.Remove(gone) }, nil)
	s := sandboxed(t, r, t.TempDir(), &bgjob.Sandbox{Writable: []string{gone}}, "echo ran")
	if s.State != bgjob.Failed || !strings.HasPrefix(s.Reason, "sandbox: bwrap: ") || !errors.Is(s.Err(), bgjob.ErrSpawn) || strings.Contains(s.Output.Text, "ran") {
		t.Errorf("got %v exit %d reason %q output %q; want failed, a sandbox reason, ErrSpawn", s.State, s.ExitCode, s.Reason, s.Output.Text)
	}
}

func TestLauncher(t *testing.T) {
	var seen [][]string
	launch := func(argv []string) ([]string, error) {
		seen = append(seen, argv)
		if strings.Contains(strings.Join(argv, " "), "refuse-me") {
			return nil, errors.New("no runner for this")
		}
		return append([]string{"env", "LAUNCHED=yes"}, argv...), nil
	}
	r := newRegistry(t, bgjob.Config{Launcher: launch})
	s, _ := r.Start(ctxT(t), bgjob.Spec{Command: `echo "$LAUNCHED"`})
	if s = wait(t, r, s.ID); s.Output.Text != "yes\n" {
		t.Errorf("launched: %q; want the Launcher's environment", s.Output.Text)
	}
	s, _ = r.Start(ctxT(t), bgjob.Spec{Command: "echo refuse-me"})
	s = wait(t, r, s.ID)
	if s.State != bgjob.Failed || !strings.Contains(s.Reason, "launcher: no runner for this") || !errors.Is(s.Err(), bgjob.ErrSpawn) {
		t.Errorf("refused by the Launcher: %v %q; want failed with its error", s.State, s.Reason)
	}
	if _, err := exec.LookPath("bwrap"); err == nil {
		// With a sandbox, the Launcher gets bwrap's command line.
		s, _ = r.Start(ctxT(t), bgjob.Spec{Command: `echo "$LAUNCHED"`, Sandbox: &bgjob.Sandbox{}})
		s = wait(t, r, s.ID)
		last := seen[len(seen)-1]
		if filepath.Base(last[0]) != "bwrap" || s.Output.Text != "yes\n" {
			t.Errorf("sandboxed: the Launcher got %q; output %q", last, s.Output.Text)
		}
	}
}

func TestSandboxTTYAndInput(t *testing.T) {
	needBwrap(t)
	r := newRegistry(t, bgjob.Config{})
	// A terminal inside the sandbox: the job's controlling terminal, its
	// size, and Ctrl-C through its line discipline.
	res, err := r.RunForeground(ctxT(t), bgjob.Spec{
		Command: `test -t 0 && test -t 1 && stty size`, Dir: t.TempDir(),
		TTY: &bgjob.TTY{Rows: 30, Cols: 100}, Sandbox: &bgjob.Sandbox{},
	}, bgjob.Foreground{SoftCap: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if res.State != bgjob.Exited || res.ExitCode != 0 || res.Output.Text != "30 100\n" {
		t.Errorf("tty in a sandbox: %v exit %d %q; want a 30x100 terminal", res.State, res.ExitCode, res.Output.Text)
	}
	// Interactive input inside the sandbox.
	s, err := r.Start(ctxT(t), bgjob.Spec{Command: "read x; echo got:$x", Dir: t.TempDir(), Interactive: true, Sandbox: &bgjob.Sandbox{}})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Write(ctxT(t), s.ID, []byte("hello\n")); err != nil {
		t.Fatal(err)
	}
	if s = wait(t, r, s.ID); s.Output.Text != "got:hello\n" {
		t.Errorf("input in a sandbox: %q", s.Output.Text)
	}
}
