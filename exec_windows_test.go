package bgjob_test

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"os/signal"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
	"golang.org/x/sys/windows"
)

// winHelperEnv makes the test binary act as a Windows helper process when
// it is started with -test.run=TestHelperProcess.
const winHelperEnv = "BGJOB_WIN_HELPER"

// winHelperShell runs the test binary as the job's "shell": the job's
// command holds the helper's mode and arguments, split on spaces.
func winHelperShell() []string {
	return []string{os.Args[0], "-test.run=TestHelperProcess", "--"}
}

// TestHelperProcess is not a test: it is the child of the Windows tests
// when winHelperEnv is set. Its modes:
//
//	exit N        exit with code N
//	echo WORDS    WORDS to stdout, "err:WORDS" to stderr
//	cat           stdin to stdout
//	sleep MS      sleep, then exit 0
//	tree          start a grandchild that sleeps, print "grandchild PID", sleep
//	spawn         start a grandchild that sleeps, print "grandchild PID", exit 0
//	break         print "ready", wait for CTRL_BREAK, print "got break", exit 7
//	args ARGS     each of ARGS as [ARG], as the helper got them
//	alloc MIB     commit and touch MIB MiB, print "allocated MIB", exit 0
//	children N    start N children that sleep, one after another, each
//	              followed by "child I"; on a failure say why, exit 3
func TestHelperProcess(t *testing.T) {
	if os.Getenv(winHelperEnv) != "1" {
		t.Skip("the child of the Windows tests, not a test")
	}
	args := os.Args
	for i, a := range args {
		if a == "--" {
			args = args[i+1:]
			break
		}
	}
	if len(args) == 1 {
		args = strings.Fields(args[0])
	}
	os.Exit(winHelper(args))
}

func winHelper(args []string) int {
	if len(args) == 0 {
		fmt.Fprintln(os.Stderr, "helper: no mode")
		return 2
	}
	num := func(i int) int {
		n, err := strconv.Atoi(args[i])
		if err != nil {
			panic(err)
		}
		return n
	}
	grandchild := func() *exec.Cmd {
		c := exec.Command(os.Args[0], "-test.run=TestHelperProcess", "--", "sleep", "600000")
		c.Stdout, c.Stderr = os.Stdout, os.Stderr
		if err := c.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Printf("grandchild %d\n", c.Process.Pid)
		return c
	}
	switch args[0] {
	case "exit":
		return num(1)
	case "echo":
		fmt.Println(strings.Join(args[1:], " "))
		fmt.Fprintln(os.Stderr, "err:"+strings.Join(args[1:], " "))
		return 0
	case "cat":
		if _, err := io.Copy(os.Stdout, os.Stdin); err != nil {
			fmt.Fprintln(os.Stderr, err)
			return 1
		}
		return 0
	case "sleep":
		time.Sleep(time.Duration(num(1)) * time.Millisecond)
		return 0
	case "tree":
		grandchild()
		time.Sleep(time.Hour)
		return 0
	case "spawn":
		grandchild()
		return 0
	case "prompt": // prompt: "name? ", a line from stdin, "hello, LINE"
		fmt.Print("name? ")
		line, _ := bufio.NewReader(os.Stdin).ReadString('\n')
		fmt.Printf("hello, %s\n", strings.TrimRight(line, "\r\n"))
		return 0
	case "console": // console: whether stdout is a console, and its size; then cat
		var info windows.ConsoleScreenBufferInfo
		err := windows.GetConsoleScreenBufferInfo(windows.Stdout, &info)
		fmt.Printf("console %v %dx%d\n", err == nil, info.Window.Right-info.Window.Left+1, info.Window.Bottom-info.Window.Top+1)
		io.Copy(os.Stdout, os.Stdin)
		return 0
	case "args":
		for _, a := range args[1:] {
			fmt.Printf("[%s]", a)
		}
		return 0
	case "alloc":
		b := make([]byte, num(1)<<20)
		for i := 0; i < len(b); i += 4096 {
			b[i] = 1
		}
		fmt.Printf("allocated %d\n", len(b)>>20)
		return 0
	case "children":
		for i := range num(1) {
			c := exec.Command(os.Args[0], "-test.run=TestHelperProcess", "--", "sleep", "600000")
			if err := c.Start(); err != nil {
				fmt.Fprintln(os.Stderr, "children:", err)
				return 3
			}
			fmt.Printf("child %d\n", i+1)
		}
		return 0
	case "break":
		c := make(chan os.Signal, 1)
		signal.Notify(c, os.Interrupt)
		fmt.Println("ready")
		<-c
		fmt.Println("got break")
		return 7
	}
	fmt.Fprintln(os.Stderr, "helper: unknown mode", args[0])
	return 2
}

// underWine reports whether the tests run under Wine, which some tests
// cannot be run on.
func underWine() bool {
	return windows.NewLazySystemDLL("ntdll.dll").NewProc("wine_get_version").Find() == nil
}

// newWinRegistry returns a Registry whose default shell is the helper,
// closed at the end of the test.
func newWinRegistry(t *testing.T, cfg bgjob.Config) *bgjob.Registry {
	t.Helper()
	if cfg.Shell == nil {
		cfg.Shell = winHelperShell()
	}
	if cfg.KillGrace == 0 {
		cfg.KillGrace = 500 * time.Millisecond
	}
	cfg.Env = append(os.Environ(), winHelperEnv+"=1")
	r, err := bgjob.New(cfg)
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), deadline)
		defer cancel()
		if err := r.Close(ctx); err != nil {
			t.Errorf("Close: %v", err)
		}
	})
	return r
}

// runWin starts spec and waits for its end.
func runWin(t *testing.T, r *bgjob.Registry, spec bgjob.Spec) bgjob.Snapshot {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	s, err := r.Start(ctx, spec)
	if err != nil {
		t.Fatalf("Start(%q): %v", spec.Command, err)
	}
	s, err = r.Wait(ctx, s.ID)
	if err != nil {
		t.Fatalf("Wait(%q): %v", spec.Command, err)
	}
	return s
}

// awaitWinOutput waits until the job's output holds sub, and returns the
// output.
func awaitWinOutput(t *testing.T, r *bgjob.Registry, id bgjob.ID, sub string) string {
	t.Helper()
	for end := time.Now().Add(deadline); time.Now().Before(end); {
		s, err := r.Status(id)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(s.Output.Text, sub) {
			return s.Output.Text
		}
		if s.State.Done() {
			t.Fatalf("job ended (%v) before printing %q: %q", s.State, sub, s.Output.Text)
		}
		time.Sleep(5 * time.Millisecond) // polling the event itself, with a deadline
	}
	t.Fatalf("no %q in the output within %v", sub, deadline)
	return ""
}

// grandchildPID returns the PID that a "tree" or "spawn" helper printed.
func grandchildPID(t *testing.T, out string) int {
	t.Helper()
	for _, line := range strings.Split(out, "\n") {
		if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "grandchild "); ok {
			pid, err := strconv.Atoi(rest)
			if err != nil {
				t.Fatalf("bad grandchild line %q", line)
			}
			return pid
		}
	}
	t.Fatalf("no grandchild PID in %q", out)
	return 0
}

// assertExited fails the test if process pid is still running.
func assertExited(t *testing.T, what string, pid int) {
	t.Helper()
	h, err := windows.OpenProcess(windows.SYNCHRONIZE|windows.PROCESS_QUERY_LIMITED_INFORMATION, false, uint32(pid))
	if err != nil {
		return // gone
	}
	defer windows.CloseHandle(h)
	// The job's end waited for the tree to be empty: no grace here.
	if ev, _ := windows.WaitForSingleObject(h, 0); ev != windows.WAIT_OBJECT_0 {
		t.Errorf("%s %d is still running after the job ended; want it killed", what, pid)
	}
}

func TestWindowsExitCodes(t *testing.T) {
	r := newWinRegistry(t, bgjob.Config{})
	for _, tc := range []struct {
		name    string
		command string
		want    int
	}{
		{"exit-0", "exit 0", 0},
		{"exit-3", "exit 3", 3},
		{"exit-large", "exit 300", 300},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := runWin(t, r, bgjob.Spec{Command: tc.command})
			if s.State != bgjob.Exited || s.ExitCode != tc.want {
				t.Errorf("got %v exit %d (%s); want exited %d", s.State, s.ExitCode, s.Reason, tc.want)
			}
			if s.PID == 0 {
				t.Errorf("got PID 0; want the shell's PID")
			}
		})
	}
}

func TestWindowsOutputCapture(t *testing.T) {
	r := newWinRegistry(t, bgjob.Config{})
	s := runWin(t, r, bgjob.Spec{Command: "echo hello world"})
	want := "hello world\nerr:hello world\n"
	if s.State != bgjob.Exited || s.ExitCode != 0 {
		t.Fatalf("got %v exit %d (%s); want exited 0", s.State, s.ExitCode, s.Reason)
	}
	if s.Output.Text != want || s.Output.Total != int64(len(want)) {
		t.Errorf("got output %q (total %d); want %q (total %d)", s.Output.Text, s.Output.Total, want, len(want))
	}
}

func TestWindowsStdin(t *testing.T) {
	r := newWinRegistry(t, bgjob.Config{})
	big := strings.Repeat("0123456789abcdef", 1<<14) // 256 KiB: more than a pipe buffer
	for _, tc := range []struct{ name, stdin string }{
		{"empty-is-nul-device", ""},
		{"text", "line one\nline two\r\n\x00binary\xff"},
		{"larger-than-a-pipe", big},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := runWin(t, r, bgjob.Spec{Command: "cat", Stdin: tc.stdin, Unique: true})
			if s.State != bgjob.Exited || s.ExitCode != 0 {
				t.Fatalf("got %v exit %d (%s) %q; want exited 0", s.State, s.ExitCode, s.Reason, s.Output.Text)
			}
			if s.Output.Text != tc.stdin {
				t.Errorf("got %d bytes of output; want the %d bytes of stdin", len(s.Output.Text), len(tc.stdin))
			}
		})
	}
}

func TestWindowsCancelKillsTree(t *testing.T) {
	r := newWinRegistry(t, bgjob.Config{})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	s, err := r.Start(ctx, bgjob.Spec{Command: "tree"})
	if err != nil {
		t.Fatal(err)
	}
	gc := grandchildPID(t, awaitWinOutput(t, r, s.ID, "grandchild "))
	s, err = r.Cancel(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if s.State != bgjob.Cancelled || s.ExitCode != 130 {
		t.Errorf("got %v exit %d (%s); want cancelled 130", s.State, s.ExitCode, s.Reason)
	}
	assertExited(t, "shell", s.PID)
	assertExited(t, "grandchild", gc)
}

func TestWindowsLeftoverIsStopped(t *testing.T) {
	// The shell exits at once; its grandchild keeps the output pipe open
	// and would run on: the job ends anyway, and stops it.
	r := newWinRegistry(t, bgjob.Config{KillGrace: 200 * time.Millisecond})
	start := time.Now()
	s := runWin(t, r, bgjob.Spec{Command: "spawn"})
	if s.State != bgjob.Exited || s.ExitCode != 0 {
		t.Errorf("got %v exit %d (%s); want exited 0", s.State, s.ExitCode, s.Reason)
	}
	if !strings.Contains(s.Output.Notice, "leftover") {
		t.Errorf("got notice %q; want one about leftover processes", s.Output.Notice)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("the job took %v; want it to end soon after its shell", d)
	}
	assertExited(t, "grandchild", grandchildPID(t, s.Output.Text))
}

func TestWindowsTimeouts(t *testing.T) {
	r := newWinRegistry(t, bgjob.Config{})
	for _, tc := range []struct {
		name   string
		spec   bgjob.Spec
		reason string
	}{
		{"wall", bgjob.Spec{Command: "tree", Timeout: 700 * time.Millisecond}, "timed out after"},
		{"idle", bgjob.Spec{Command: "sleep 600000", IdleTimeout: 700 * time.Millisecond}, "idle for"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := runWin(t, r, tc.spec)
			if s.State != bgjob.TimedOut || s.ExitCode != 124 || !strings.HasPrefix(s.Reason, tc.reason) {
				t.Errorf("got %v exit %d reason %q; want timed_out 124 %q...", s.State, s.ExitCode, s.Reason, tc.reason)
			}
			assertExited(t, "shell", s.PID)
			if strings.Contains(s.Output.Text, "grandchild ") {
				assertExited(t, "grandchild", grandchildPID(t, s.Output.Text))
			}
		})
	}
}

func TestWindowsCmdShell(t *testing.T) {
	// The default shell: cmd.exe /d /s /c "<command>", the command
	// passed verbatim.
	r, err := bgjob.New(bgjob.Config{})
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close(context.Background())
	for _, tc := range []struct {
		name, command, out string
		code               int
	}{
		{"exit-code", "exit /b 3", "", 3},
		{"quotes-kept", `echo "a b" c`, "\"a b\" c\r\n", 0},
		{"operators", `echo one& echo two`, "one\r\ntwo\r\n", 0},
		{"escaped-metachar", `echo a^&b`, "a&b\r\n", 0},
		{"env", `echo %BGJOB_X%`, "x y\r\n", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := runWin(t, r, bgjob.Spec{Command: tc.command, Env: map[string]string{"BGJOB_X": "x y"}})
			if s.State != bgjob.Exited || s.ExitCode != tc.code || s.Output.Text != tc.out {
				t.Errorf("got %v exit %d %q (%s); want exited %d %q", s.State, s.ExitCode, s.Output.Text, s.Reason, tc.code, tc.out)
			}
		})
	}
}

func TestWindowsSpawnFailure(t *testing.T) {
	r := newWinRegistry(t, bgjob.Config{Shell: []string{`C:\no\such\shell.exe`, "/c"}})
	s := runWin(t, r, bgjob.Spec{Command: "exit 0"})
	if s.State != bgjob.Failed || !strings.HasPrefix(s.Reason, "spawn: ") {
		t.Errorf("got %v (%s); want failed with a spawn reason", s.State, s.Reason)
	}
}

func TestWindowsCtrlBreakIsPolite(t *testing.T) {
	if underWine() {
		// Wine 8 turns CTRL_BREAK into SIGQUIT, whose handler ends a
		// thread without calling the process's console control handlers
		// (server/console.c, dlls/ntdll/unix/signal_x86_64.c): the
		// event never reaches Go's os/signal.
		t.Skip("Wine does not deliver CTRL_BREAK to console control handlers")
	}
	if !hasConsoleWindow() {
		// A host without a console (a service, CI) gives its jobs a
		// hidden console of their own, which CTRL_BREAK cannot reach.
		// Give the test one, as a console host has.
		if ok, _, err := procAllocConsole.Call(); ok == 0 {
			t.Fatalf("AllocConsole: %v", err)
		}
		defer procFreeConsole.Call()
	}
	// The break goes to the job's process group only, never the host.
	host := make(chan os.Signal, 1)
	signal.Notify(host, os.Interrupt)
	defer signal.Stop(host)

	r := newWinRegistry(t, bgjob.Config{KillGrace: 20 * time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	s, err := r.Start(ctx, bgjob.Spec{Command: "break"})
	if err != nil {
		t.Fatal(err)
	}
	awaitWinOutput(t, r, s.ID, "ready")
	start := time.Now()
	s, err = r.Cancel(s.ID)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(s.Output.Text, "got break") {
		t.Errorf("got output %q; want the helper to see CTRL_BREAK", s.Output.Text)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Errorf("Cancel took %v; want the polite stop to end the job before the grace", d)
	}
	select {
	case <-host:
		t.Errorf("the host got the job's CTRL_BREAK; want only the job's group to")
	default:
	}
}

var (
	kernel32             = windows.NewLazySystemDLL("kernel32.dll")
	procGetConsoleWindow = kernel32.NewProc("GetConsoleWindow")
	procAllocConsole     = kernel32.NewProc("AllocConsole")
	procFreeConsole      = kernel32.NewProc("FreeConsole")
)

func hasConsoleWindow() bool {
	if procGetConsoleWindow.Find() != nil {
		return false
	}
	h, _, _ := procGetConsoleWindow.Call()
	return h != 0
}

// Spec.Args on Windows: the command line is built by the rules that
// CommandLineToArgvW splits it by, so the program gets every argument
// back as it was, with no shell in between.
func TestWindowsArgs(t *testing.T) {
	r := newWinRegistry(t, bgjob.Config{})
	words := []string{"a  b", `c"d`, "", `e\`, `f g\`, "%PATH%", "h&i|j"}
	s := runWin(t, r, bgjob.Spec{Args: append(winHelperShell(), append([]string{"args"}, words...)...)})
	var want strings.Builder
	for _, w := range words {
		want.WriteString("[" + w + "]")
	}
	if s.State != bgjob.Exited || s.ExitCode != 0 || s.Output.Text != want.String() {
		t.Errorf("got %v %d %q (%s); want exited 0 %q", s.State, s.ExitCode, s.Output.Text, s.Reason, want.String())
	}
	// A program that is not there: a job that never ran.
	s = runWin(t, r, bgjob.Spec{Args: []string{`C:\no\such\program.exe`}})
	if !errors.Is(s.Err(), bgjob.ErrSpawn) {
		t.Errorf("missing program: %v %q; want Err wrapping ErrSpawn", s.State, s.Reason)
	}
}

// selfUserCPU returns the user CPU time this process has used.
func selfUserCPU() time.Duration {
	var creation, exit, kernel, user windows.Filetime
	if windows.GetProcessTimes(windows.CurrentProcess(), &creation, &exit, &kernel, &user) != nil {
		return 0
	}
	return time.Duration(uint64(user.HighDateTime)<<32|uint64(user.LowDateTime)) * 100
}
