package bgjob

import (
	"errors"
	"io"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/windows"
)

// White-box tests of the Windows process layer. The child is the test
// binary's TestHelperProcess (in exec_windows_test.go).

func helperArgv(args ...string) []string {
	return append([]string{os.Args[0], "-test.run=TestHelperProcess", "--"}, args...)
}

func helperEnviron() []string { return append(os.Environ(), "BGJOB_WIN_HELPER=1") }

func TestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []string
		want string
	}{
		{"cmd-verbatim", []string{"cmd.exe", "/d", "/s", "/c", `echo "a b" & x ^| y`}, `cmd.exe /d /s /c "echo "a b" & x ^| y"`},
		{"cmd-path-any-case", []string{`C:\Windows\System32\CMD.EXE`, "/c", `dir "C:\x y"`}, `C:\Windows\System32\CMD.EXE /c "dir "C:\x y""`},
		{"cmd-empty-command", []string{"cmd", "/c", ""}, `cmd /c ""`},
		{"powershell-escaped", []string{"powershell.exe", "-NoProfile", "-NonInteractive", "-Command", `Write-Output "a b"`},
			`powershell.exe -NoProfile -NonInteractive -Command "Write-Output \"a b\""`},
		{"program-with-space", []string{`C:\Program Files\sh.exe`, "-c", `echo a\"b`}, `"C:\Program Files\sh.exe" -c "echo a\\\"b"`},
		{"empty-argument", []string{"prog", ""}, `prog ""`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := commandLine(tc.argv); got != tc.want {
				t.Errorf("got %s; want %s", got, tc.want)
			}
		})
	}
}

// Spec.Args: every argument quoted alike, cmd.exe included, so that
// CommandLineToArgvW gives Args back.
func TestArgsCommandLine(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []string
		want string
	}{
		{"cmd-not-verbatim", []string{"cmd.exe", "/c", `echo "a b"`}, `cmd.exe /c "echo \"a b\""`},
		{"spaces-and-quotes", []string{`C:\Program Files\p.exe`, "a  b", `c"d`, ""}, `"C:\Program Files\p.exe" "a  b" c\"d ""`},
		{"trailing-backslash", []string{"p", `C:\dir\`, `x\`}, `p C:\dir\ x\`},
		{"trailing-backslash-with-space", []string{"p", `C:\my dir\`}, `p "C:\my dir\\"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := argsCommandLine(tc.argv)
			if got != tc.want {
				t.Errorf("got %s; want %s", got, tc.want)
			}
			back, err := windows.DecomposeCommandLine(got)
			if err != nil || !slices.Equal(back, tc.argv) {
				t.Errorf("split back: %q, %v; want %q", back, err, tc.argv)
			}
		})
	}
}

func TestEnvBlock(t *testing.T) {
	t.Setenv("SYSTEMROOT", `C:\Windows`)
	block, err := envBlock([]string{"b=2", "=C:=C:\\x", "A=1", "SystemRoot=D:\\W"})
	if err != nil {
		t.Fatal(err)
	}
	var entries []string
	for s := block; len(s) > 1; {
		i := slices.Index(s, 0)
		entries = append(entries, windows.UTF16ToString(s[:i]))
		s = s[i+1:]
	}
	want := []string{"=C:=C:\\x", "A=1", "b=2", "SystemRoot=D:\\W"}
	if !slices.Equal(entries, want) {
		t.Errorf("got %q; want %q", entries, want)
	}
	if n := len(block); block[n-1] != 0 || block[n-2] != 0 {
		t.Errorf("block does not end in two NULs")
	}

	// SYSTEMROOT is added when missing; an empty env is "\0\0".
	block, _ = envBlock(nil)
	if s := windows.UTF16ToString(block); s != `SYSTEMROOT=C:\Windows` {
		t.Errorf("got %q; want SYSTEMROOT added", s)
	}
	os.Unsetenv("SYSTEMROOT")
	if block, _ = envBlock(nil); !slices.Equal(block, []uint16{0, 0}) {
		t.Errorf("got %v; want an empty block", block)
	}
}

// readers returns the output readers to test: the os.File one (Go 1.25
// and later) if this system gives it, and overlappedReader.
func readers(t *testing.T) map[string]func(windows.Handle) (outputReader, error) {
	m := map[string]func(windows.Handle) (outputReader, error){
		"overlapped": func(h windows.Handle) (outputReader, error) { return newOverlappedReader(h) },
	}
	r, w, err := namedPipe()
	if err != nil {
		t.Fatal(err)
	}
	rd, err := newOutputReader(r)
	if err != nil {
		t.Fatal(err)
	}
	_, isFile := rd.(*os.File)
	rd.Close()
	windows.CloseHandle(w)
	if isFile {
		m["os-file"] = func(h windows.Handle) (outputReader, error) { return newOutputReader(h) }
	} else {
		t.Log("os.NewFile gives no deadlines on this system: only overlappedReader is in use")
	}
	return m
}

func TestOutputReaderDeadlines(t *testing.T) {
	for name, mk := range readers(t) {
		t.Run(name, func(t *testing.T) {
			r, w, err := namedPipe()
			if err != nil {
				t.Fatal(err)
			}
			rd, err := mk(r)
			if err != nil {
				t.Fatal(err)
			}
			defer rd.Close()
			wf := os.NewFile(uintptr(w), "w")
			buf := make([]byte, 64)

			// No data: the read ends at its deadline.
			start := time.Now()
			rd.SetReadDeadline(start.Add(100 * time.Millisecond))
			if n, err := rd.Read(buf); n != 0 || !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("got %d, %v; want 0, a deadline error", n, err)
			}
			if d := time.Since(start); d < 90*time.Millisecond || d > 5*time.Second {
				t.Errorf("the read took %v; want about 100ms", d)
			}

			// A poke (deadline moved into the past) ends a blocked read.
			rd.SetReadDeadline(time.Time{})
			go func() {
				time.Sleep(50 * time.Millisecond)
				rd.SetReadDeadline(time.Unix(1, 0))
			}()
			start = time.Now()
			if _, err := rd.Read(buf); !errors.Is(err, os.ErrDeadlineExceeded) {
				t.Errorf("got %v; want a deadline error after the poke", err)
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("the poked read took %v", d)
			}

			// Data, then EOF when the writer closes.
			rd.SetReadDeadline(time.Now().Add(10 * time.Second))
			wf.Write([]byte("hello"))
			if n, err := rd.Read(buf); err != nil || string(buf[:n]) != "hello" {
				t.Errorf("got %q, %v; want \"hello\"", buf[:n], err)
			}
			wf.Close()
			if n, err := rd.Read(buf); n != 0 || err != io.EOF {
				t.Errorf("got %d, %v; want EOF", n, err)
			}
		})
	}
}

func TestOverlappedReaderUseAfterClose(t *testing.T) {
	// A poke can come after the supervisor closed the reader: it must
	// fail, not touch a closed handle.
	r, w, err := namedPipe()
	if err != nil {
		t.Fatal(err)
	}
	windows.CloseHandle(w)
	rd, err := newOverlappedReader(r)
	if err != nil {
		t.Fatal(err)
	}
	rd.Close()
	if err := rd.SetReadDeadline(time.Unix(1, 0)); !errors.Is(err, os.ErrClosed) {
		t.Errorf("got %v; want ErrClosed", err)
	}
	if err := rd.Close(); !errors.Is(err, os.ErrClosed) {
		t.Errorf("second Close: got %v; want ErrClosed", err)
	}
}

// readUntil reads rd until the output holds sub.
func readUntil(t *testing.T, rd outputReader, sub string) string {
	t.Helper()
	var out []byte
	buf := make([]byte, 512)
	rd.SetReadDeadline(time.Now().Add(30 * time.Second))
	for !strings.Contains(string(out), sub) {
		n, err := rd.Read(buf)
		out = append(out, buf[:n]...)
		if err != nil {
			t.Fatalf("read: %v (output so far %q)", err, out)
		}
	}
	return string(out)
}

func TestJobObjectHoldsTree(t *testing.T) {
	p, rd, err := startJob(&plan{argv: helperArgv("tree"), dir: "", env: helperEnviron()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	defer rd.Close()
	readUntil(t, rd, "grandchild ")
	if n := p.live(); n != 2 {
		t.Errorf("live: got %d; want 2 (shell and grandchild)", n)
	}
	if err := p.signal(true); err != nil {
		t.Fatalf("kill: %v", err)
	}
	if err := p.wait(); err != nil {
		t.Fatal(err)
	}
	if n := p.awaitEmpty(time.Now().Add(10 * time.Second)); n != 0 {
		t.Errorf("live after kill: got %d; want 0", n)
	}
	// TerminateJobObject ended the console host too, if the job had
	// one: nothing at all is left in the job.
	if n := p.active(); n != 0 {
		t.Errorf("ActiveProcesses after kill: got %d; want 0", n)
	}
	if code, err := p.reap(); err != nil || code != killExitCode {
		t.Errorf("reap: got %d, %v; want %d", code, err, killExitCode)
	}
}

func TestNoLeftoversAfterPlainExit(t *testing.T) {
	// The shell's own exit must not count as a leftover, even right
	// after the wait returns.
	for i := range 10 {
		p, rd, err := startJob(&plan{argv: helperArgv("exit", "0"), dir: "", env: helperEnviron()})
		if err != nil {
			t.Fatal(err)
		}
		if err := p.wait(); err != nil {
			t.Fatal(err)
		}
		if n := p.leftovers(); n != 0 {
			t.Errorf("run %d: leftovers: got %d; want 0", i, n)
		}
		rd.Close()
		p.close()
	}
}

func TestAwaitEmptyWakesOnExit(t *testing.T) {
	// A leftover that exits by itself ends awaitEmpty at once, not at its
	// deadline.
	p, rd, err := startJob(&plan{argv: helperArgv("sleep", "300"), dir: "", env: helperEnviron()})
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	defer rd.Close()
	start := time.Now()
	if n := p.awaitEmpty(start.Add(20 * time.Second)); n != 0 {
		t.Errorf("got %d live; want 0", n)
	}
	if d := time.Since(start); d > 5*time.Second {
		t.Errorf("awaitEmpty took %v; want it to end when the process exits", d)
	}
	if p.port == 0 {
		t.Log("no job completion port on this system: awaitEmpty polled")
	}
}

func TestStartFailures(t *testing.T) {
	for _, tc := range []struct {
		name string
		argv []string
		dir  string
	}{
		{"no-such-program", []string{`C:\no\such\program.exe`, "x"}, ""},
		{"no-such-dir", helperArgv("exit", "0"), `C:\no\such\dir`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			p, rd, err := startJob(&plan{argv: tc.argv, dir: tc.dir, env: helperEnviron()})
			if err == nil {
				rd.Close()
				p.wait()
				p.close()
				t.Fatal("started; want an error")
			}
		})
	}
}
