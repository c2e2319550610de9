//go:build windows

package bgjob

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"unsafe"

	"golang.org/x/sys/windows"
)

// defaultShell is cmd.exe with AutoRun commands off (/d) and the simple
// quoting rule (/s): see commandLine for how the command is passed.
//
// PowerShell is the usual alternative:
//
//	Config.Shell = []string{"powershell.exe", "-NoProfile", "-NonInteractive", "-Command"}
//
// (or "pwsh.exe" for PowerShell 7). Its command is passed as one argument
// quoted by the rules of CommandLineToArgvW, which PowerShell follows.
func defaultShell() []string { return []string{"cmd.exe", "/d", "/s", "/c"} }

// envKey returns the form of an environment key that identifies it:
// Windows compares keys without regard to case.
func envKey(k string) string { return strings.ToUpper(k) }

// startJob carries out pl: it starts pl's command line in a new console
// process group inside a new Job Object (its containment, holding pl's
// limits), with pl's directory and environment, its stdin as input and
// one pipe as both stdout and stderr (its output). It returns the
// process and the parent's end of that pipe.
//
// The shell is created suspended and assigned to the job before its
// first instruction runs, so nothing it starts can escape the job.
func startJob(pl *plan) (_ *process, _ outputReader, err error) {
	if pl.output.file != "" {
		return nil, nil, fmt.Errorf("output file: %w", ErrUnsupported)
	}
	argv, dir, env := pl.argv, pl.dir, pl.env
	path, err := lookPath(argv[0], dir)
	if err != nil {
		return nil, nil, err
	}
	app, err := windows.UTF16PtrFromString(path)
	if err != nil {
		return nil, nil, err
	}
	line := commandLine(argv)
	if pl.args {
		line = argsCommandLine(argv)
	}
	cmdline, err := windows.UTF16PtrFromString(line)
	if err != nil {
		return nil, nil, err
	}
	var dirp *uint16
	if dir != "" {
		if err := isDir(dir); err != nil {
			return nil, nil, fmt.Errorf("working directory: %w", err)
		}
		if dirp, err = windows.UTF16PtrFromString(dir); err != nil {
			return nil, nil, err
		}
	}
	block, err := envBlock(env)
	if err != nil {
		return nil, nil, err
	}
	if pl.input.tty != nil {
		return startOnConPTY(pl, app, cmdline, block, dirp)
	}

	in, err := stdinHandle(&pl.input)
	if err != nil {
		return nil, nil, fmt.Errorf("stdin: %w", err)
	}
	defer windows.CloseHandle(in)
	defer func() {
		if err != nil {
			pl.input.dropConn()
		}
	}()
	rd, w, err := outputPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	defer windows.CloseHandle(w)
	defer func() {
		if err != nil {
			rd.Close()
		}
	}()
	// The limits are set on the job before the shell exists, so that
	// no instruction of the job runs without them.
	job, port, err := newJob(pl.limits)
	if err != nil {
		return nil, nil, fmt.Errorf("job object: %w", err)
	}
	defer func() {
		if err != nil {
			windows.CloseHandle(job) // kills the shell, if it was assigned
			if port != 0 {
				windows.CloseHandle(port)
			}
		}
	}()

	// The child inherits exactly these two handles: inheritable copies
	// made here and named in PROC_THREAD_ATTRIBUTE_HANDLE_LIST, so that
	// no other process started meanwhile by the host takes them, and the
	// child takes no other inheritable handle of the host.
	self := windows.CurrentProcess()
	var inh [2]windows.Handle
	for i, h := range []windows.Handle{in, w} {
		if err := windows.DuplicateHandle(self, h, self, &inh[i], 0, true, windows.DUPLICATE_SAME_ACCESS); err != nil {
			return nil, nil, fmt.Errorf("duplicate handle: %w", err)
		}
		defer windows.CloseHandle(inh[i])
	}
	attrs, err := windows.NewProcThreadAttributeList(1)
	if err != nil {
		return nil, nil, err
	}
	defer attrs.Delete()
	if err := attrs.Update(windows.PROC_THREAD_ATTRIBUTE_HANDLE_LIST, unsafe.Pointer(&inh[0]), unsafe.Sizeof(inh)); err != nil {
		return nil, nil, err
	}
	si := new(windows.StartupInfoEx)
	si.Cb = uint32(unsafe.Sizeof(*si))
	si.Flags = windows.STARTF_USESTDHANDLES
	si.StdInput, si.StdOutput, si.StdErr = inh[0], inh[1], inh[1]
	si.ProcThreadAttributeList = attrs.List()

	// A new process group keeps a Ctrl+C typed at the host's console
	// from reaching the job, and lets CTRL_BREAK reach the job alone.
	// Without a console to share, the shell gets a hidden one rather
	// than a new window.
	flags := uint32(windows.CREATE_NEW_PROCESS_GROUP | windows.CREATE_SUSPENDED |
		windows.CREATE_UNICODE_ENVIRONMENT | windows.EXTENDED_STARTUPINFO_PRESENT)
	console := hasConsole()
	if !console {
		flags |= windows.CREATE_NO_WINDOW
	}
	var pi windows.ProcessInformation
	err = windows.CreateProcess(app, cmdline, nil, nil, true, flags, &block[0], dirp, &si.StartupInfo, &pi)
	runtime.KeepAlive(inh)
	runtime.KeepAlive(block)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	defer windows.CloseHandle(pi.Thread)
	if err := windows.AssignProcessToJobObject(job, pi.Process); err != nil {
		windows.TerminateProcess(pi.Process, killExitCode)
		windows.CloseHandle(pi.Process)
		return nil, nil, fmt.Errorf("assign to job object: %w", err)
	}
	if _, err := windows.ResumeThread(pi.Thread); err != nil {
		windows.TerminateJobObject(job, killExitCode)
		windows.CloseHandle(pi.Process)
		return nil, nil, fmt.Errorf("resume: %w", err)
	}
	p := &process{pid: int(pi.ProcessId), proc: pi.Process, job: job, port: port, watched: port != 0, console: console}
	return p, rd, nil
}

// lookShell resolves a shell program that holds no path separator
// through the host's PATH (with PATHEXT); startJob resolves any other
// path against the job's directory.
func lookShell(path string) (string, error) {
	if strings.ContainsAny(path, `/\:`) {
		return path, nil
	}
	return exec.LookPath(path)
}

// lookPath finds the program to run. A bare name is looked up in the
// host's PATH (with PATHEXT); a relative path is taken relative to the
// job's directory, as on Unix.
func lookPath(name, dir string) (string, error) {
	if strings.ContainsAny(name, `/\:`) && !filepath.IsAbs(name) && dir != "" {
		name = filepath.Join(dir, name)
	}
	p, err := exec.LookPath(name)
	if err != nil {
		return "", err
	}
	return filepath.Abs(p)
}

// commandLine turns argv into the single command line that CreateProcess
// takes. Each argument is quoted by the rules of CommandLineToArgvW (the
// C runtime's), which Go programs, PowerShell and most programs use to
// split it again; except that when the program is cmd.exe, the last
// argument (the job's command) is passed verbatim between one pair of
// double quotes:
//
//	cmd.exe /d /s /c "<command>"
//
// cmd does not split its command line by those rules. With /s it drops
// the first and the last quote after /c and runs the rest exactly as
// written, so the command is cmd syntax, as typed at a prompt: quote
// arguments that hold spaces ("C:\Program Files\x.exe" "a b"), escape
// cmd's metacharacters & | < > ^ ( ) with ^ when they are meant
// literally, and expect %NAME% to be expanded. A newline ends the command
// for cmd: run several with & or && instead. Without /s cmd keeps the
// quotes in a few cases, so a custom cmd shell should keep /s.
func commandLine(argv []string) string {
	var b strings.Builder
	verbatim := len(argv) > 1 && isCmd(argv[0])
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		if verbatim && i == len(argv)-1 {
			b.WriteString(`"` + a + `"`)
			continue
		}
		b.WriteString(windows.EscapeArg(a))
	}
	return b.String()
}

// argsCommandLine turns a job's Spec.Args into the command line that
// CreateProcess takes: every argument quoted by the rules of
// CommandLineToArgvW, with no special case for cmd.exe, so that a program
// that splits its command line by those rules gets Args back as they were.
func argsCommandLine(argv []string) string {
	var b strings.Builder
	for i, a := range argv {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(windows.EscapeArg(a))
	}
	return b.String()
}

func isCmd(prog string) bool {
	base := strings.ToLower(filepath.Base(prog))
	return base == "cmd" || base == "cmd.exe"
}

// envBlock returns env as the block CreateProcess takes: NUL-terminated
// UTF-16 strings sorted by key regardless of case (as Windows asks),
// ended by an empty string. SYSTEMROOT is added from the host when env
// lacks it: without it, many programs (and Winsock) fail to start.
func envBlock(env []string) ([]uint16, error) {
	env = slices.Clone(env)
	has := false
	for _, kv := range env {
		if k, _, _ := strings.Cut(kv, "="); envKey(k) == "SYSTEMROOT" {
			has = true
		}
	}
	if v, ok := os.LookupEnv("SYSTEMROOT"); ok && !has {
		env = append(env, "SYSTEMROOT="+v)
	}
	key := func(kv string) string {
		// "=C:=C:\dir" entries have a key starting with '='.
		if i := strings.IndexByte(kv[min(1, len(kv)):], '='); i >= 0 {
			return envKey(kv[:i+min(1, len(kv))])
		}
		return envKey(kv)
	}
	slices.SortStableFunc(env, func(a, b string) int { return strings.Compare(key(a), key(b)) })
	var block []uint16
	for _, kv := range env {
		if kv == "" {
			continue
		}
		s, err := windows.UTF16FromString(kv)
		if err != nil {
			return nil, fmt.Errorf("environment: %w", err)
		}
		block = append(block, s...)
	}
	if len(block) == 0 {
		block = append(block, 0)
	}
	return append(block, 0), nil
}

// stdinHandle returns the handle a job reads as its standard input: for
// an interactive job, a pipe whose host end goes to in.conn (Spec.Stdin
// is written into it after the spawn); else the NUL device when there
// is no Spec.Stdin, or a temporary file holding it, positioned at its
// start and deleted when its last handle (ours or the job's) closes. A
// file, unlike a pipe, takes any size without a goroutine to feed it.
func stdinHandle(in *inputPlan) (windows.Handle, error) {
	if in.interactive {
		w, r, err := inputPipe()
		if err != nil {
			return 0, err
		}
		in.conn = pipeConn{w}
		return r, nil
	}
	s := in.data
	share := uint32(windows.FILE_SHARE_READ | windows.FILE_SHARE_WRITE | windows.FILE_SHARE_DELETE)
	if s == "" {
		return windows.CreateFile(windows.StringToUTF16Ptr("NUL"), windows.GENERIC_READ, share, nil, windows.OPEN_EXISTING, 0, 0)
	}
	name, err := windows.UTF16PtrFromString(filepath.Join(os.TempDir(), "bgjob-stdin-"+randomHex()))
	if err != nil {
		return 0, err
	}
	h, err := windows.CreateFile(name, windows.GENERIC_READ|windows.GENERIC_WRITE, share, nil,
		windows.CREATE_NEW, windows.FILE_ATTRIBUTE_TEMPORARY|windows.FILE_FLAG_DELETE_ON_CLOSE, 0)
	if err != nil {
		return 0, err
	}
	for b := []byte(s); len(b) > 0; {
		var n uint32
		if err := windows.WriteFile(h, b, &n, nil); err != nil {
			windows.CloseHandle(h)
			return 0, err
		}
		b = b[n:]
	}
	if _, err := windows.Seek(h, 0, 0); err != nil {
		windows.CloseHandle(h)
		return 0, err
	}
	return h, nil
}

func randomHex() string {
	var b [8]byte
	rand.Read(b[:])
	return hex.EncodeToString(b[:])
}

// outputPipe makes the job's output pipe: the parent's end as an
// outputReader, the child's as a plain write handle. Neither handle is
