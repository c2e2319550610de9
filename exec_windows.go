//go:build windows

package bgjob

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"time"
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

// process is a job's process tree on Windows: the shell, and the Job
// Object that holds it and everything it starts.
//
// The supervisor goroutine owns a process; the waiter only calls wait.
// Each handle is closed once, by release, after the waiter has returned
// (it returns before the supervisor reaps).
type process struct {
	pid int
	// proc is the shell's process handle. Holding it keeps the shell's
	// PID, which is also its console process group's ID, from being
	// reused until release.
	proc windows.Handle
	// job is the Job Object of the tree, set to kill everything in it
	// when its last handle closes: even if the host dies, no process of
	// the job outlives it.
	job windows.Handle
	// port receives the job's notifications once awaitEmpty first needs
	// them (associated lazily, so that a job that starts thousands of
	// processes does not queue a message for each); 0 before that or if
	// it could not be set up.
	port    windows.Handle
	watched bool
	// console reports whether the shell shares the host's console, so
	// that a CTRL_BREAK can reach its process group.
	console bool
}

// Windows exit code given to the processes of a job that is killed, as
// os.Process.Kill does.
const killExitCode = 1

// startProcess starts argv in a new console process group inside a new
// Job Object, with the given directory and environment, stdin as its
// input and one pipe as both stdout and stderr. It returns the process
// and the parent's end of that pipe.
//
// The shell is created suspended and assigned to the job before its
// first instruction runs, so nothing it starts can escape the job.
func startProcess(argv []string, dir string, env []string, stdin string) (_ *process, _ outputReader, err error) {
	path, err := lookPath(argv[0], dir)
	if err != nil {
		return nil, nil, err
	}
	app, err := windows.UTF16PtrFromString(path)
	if err != nil {
		return nil, nil, err
	}
	cmdline, err := windows.UTF16PtrFromString(commandLine(argv))
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

	in, err := stdinHandle(stdin)
	if err != nil {
		return nil, nil, fmt.Errorf("stdin: %w", err)
	}
	defer windows.CloseHandle(in)
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
	job, err := newJob()
	if err != nil {
		return nil, nil, fmt.Errorf("job object: %w", err)
	}
	defer func() {
		if err != nil {
			windows.CloseHandle(job) // kills the shell, if it was assigned
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
	p := &process{pid: int(pi.ProcessId), proc: pi.Process, job: job, console: console}
	return p, rd, nil
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

// stdinHandle returns the handle a job reads as its standard input: the
// NUL device when s is empty, else a temporary file holding s, positioned
// at its start and deleted when its last handle (ours or the job's)
// closes. A file, unlike a pipe, takes any size without a goroutine to
// feed it.
func stdinHandle(s string) (windows.Handle, error) {
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
// inheritable.
func outputPipe() (outputReader, windows.Handle, error) {
	r, w, err := namedPipe()
	if err != nil {
		return nil, 0, err
	}
	rd, err := newOutputReader(r)
	if err != nil {
		windows.CloseHandle(r)
		windows.CloseHandle(w)
		return nil, 0, err
	}
	return rd, w, nil
}

// namedPipe makes a one-way pipe whose read end r does overlapped I/O.
// Anonymous pipes cannot, so it is a named pipe with a random name, one
// instance and no remote clients. The write end w is opened at once, so
// no other process can take the instance.
func namedPipe() (r, w windows.Handle, err error) {
	name, err := windows.UTF16PtrFromString(fmt.Sprintf(`\\.\pipe\bgjob-%d-%s`, os.Getpid(), randomHex()))
	if err != nil {
		return 0, 0, err
	}
	r, err = windows.CreateNamedPipe(name,
		windows.PIPE_ACCESS_INBOUND|windows.FILE_FLAG_OVERLAPPED|windows.FILE_FLAG_FIRST_PIPE_INSTANCE,
		windows.PIPE_TYPE_BYTE|windows.PIPE_READMODE_BYTE|windows.PIPE_WAIT|windows.PIPE_REJECT_REMOTE_CLIENTS,
		1, 0, maxReadBuf, 0, nil)
	if err != nil {
		return 0, 0, err
	}
	w, err = windows.CreateFile(name, windows.GENERIC_WRITE|windows.FILE_READ_ATTRIBUTES, 0, nil, windows.OPEN_EXISTING, 0, 0)
	if err != nil {
		windows.CloseHandle(r)
		return 0, 0, err
	}
	return r, w, nil
}

// newOutputReader wraps the overlapped read end h of the output pipe.
//
// Since Go 1.25, os.NewFile puts an overlapped handle on the runtime's
// I/O completion port, and its reads then honour deadlines while
// holding no thread: that is preferred. It is tried on a copy of h,
// because an os.File that cannot poll is of no use and closes its handle
// when closed. Otherwise (an older Go, or a system that does not report
// the handle as overlapped) reads go through overlappedReader.
func newOutputReader(h windows.Handle) (outputReader, error) {
	self := windows.CurrentProcess()
	var dup windows.Handle
	if err := windows.DuplicateHandle(self, h, self, &dup, 0, false, windows.DUPLICATE_SAME_ACCESS); err == nil {
		f := os.NewFile(uintptr(dup), "bgjob-output")
		if f.SetReadDeadline(time.Time{}) == nil {
			windows.CloseHandle(h)
			return f, nil
		}
		// Not pollable: the file never touched the completion port.
		f.Close()
	}
	return newOverlappedReader(h)
}

// overlappedReader reads an overlapped handle with deadlines by waiting
// on the read's event and on a wake event that SetReadDeadline sets. A
// Read holds its goroutine's thread while it waits, and no goroutine is
// started. Read may run in one goroutine at a time; SetReadDeadline and
// Close in any.
type overlappedReader struct {
	h    windows.Handle
	ov   *windows.Overlapped // heap-allocated: the kernel writes to it while a read is pending
	wake windows.Handle      // auto-reset event: the deadline changed

	mu       sync.Mutex // guards deadline and closed
	deadline time.Time
	closed   bool
}

func newOverlappedReader(h windows.Handle) (*overlappedReader, error) {
	ev, err := windows.CreateEvent(nil, 1, 0, nil)
	if err != nil {
		return nil, err
	}
	wake, err := windows.CreateEvent(nil, 0, 0, nil)
	if err != nil {
		windows.CloseHandle(ev)
		return nil, err
	}
	return &overlappedReader{h: h, ov: &windows.Overlapped{HEvent: ev}, wake: wake}, nil
}

func (r *overlappedReader) SetReadDeadline(t time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return os.ErrClosed
	}
	r.deadline = t
	windows.SetEvent(r.wake)
	return nil
}

func (r *overlappedReader) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if len(b) > 1<<30 {
		b = b[:1<<30]
	}
	for {
		r.mu.Lock()
		d, closed := r.deadline, r.closed
		r.mu.Unlock()
		if closed {
			return 0, os.ErrClosed
		}
		if !d.IsZero() && !time.Now().Before(d) {
			return 0, os.ErrDeadlineExceeded
		}
		var n uint32
		windows.ResetEvent(r.ov.HEvent)
		err := windows.ReadFile(r.h, b, &n, r.ov)
		if err == windows.ERROR_IO_PENDING {
			n, err = r.await()
		}
		switch {
		case err == windows.ERROR_BROKEN_PIPE || err == windows.ERROR_PIPE_NOT_CONNECTED:
			return 0, io.EOF
		case err != nil:
			return int(n), err
		case n > 0:
			return int(n), nil
		}
		// A zero-byte write by the child: not the end, read again.
	}
}

// await waits for the pending read to complete, or for the deadline, in
// which case it cancels the read.
func (r *overlappedReader) await() (uint32, error) {
	var n uint32
	for {
		r.mu.Lock()
		d := r.deadline
		r.mu.Unlock()
		ms := uint32(windows.INFINITE)
		if !d.IsZero() {
			left := time.Until(d)
			if left <= 0 {
				break
			}
			// Round up, so that the wait does not end just before
			// the deadline; cap below INFINITE.
			ms = uint32(min((left+time.Millisecond-1)/time.Millisecond, windows.INFINITE-1))
		}
		ev, err := windows.WaitForMultipleObjects([]windows.Handle{r.ov.HEvent, r.wake}, false, ms)
		if err != nil {
			break
		}
		if ev == windows.WAIT_OBJECT_0 {
			err := windows.GetOverlappedResult(r.h, r.ov, &n, false)
			return n, err
		}
		// The deadline changed, or passed: look again.
	}
	windows.CancelIoEx(r.h, r.ov)
	err := windows.GetOverlappedResult(r.h, r.ov, &n, true)
	if err == windows.ERROR_OPERATION_ABORTED {
		return 0, os.ErrDeadlineExceeded
	}
	return n, err // it completed before the cancel
}

func (r *overlappedReader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return os.ErrClosed
	}
	r.closed = true
	windows.CloseHandle(r.wake)
	windows.CloseHandle(r.ov.HEvent)
	return windows.CloseHandle(r.h)
}

// newJob creates a Job Object that kills its processes when its last
// handle closes.
func newJob() (windows.Handle, error) {
	job, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		return 0, err
	}
	var info windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION
	info.BasicLimitInformation.LimitFlags = windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info))); err != nil {
		windows.CloseHandle(job)
		return 0, err
	}
	return job, nil
}

var procGetConsoleWindow = windows.NewLazySystemDLL("kernel32.dll").NewProc("GetConsoleWindow")

// hasConsole reports whether the host is attached to a console.
func hasConsole() bool {
	if procGetConsoleWindow.Find() != nil {
		return false
	}
	h, _, _ := procGetConsoleWindow.Call()
	return h != 0
}

// wait blocks until the shell has exited. The process handle stays open,
// so its PID is not reused until release.
func (p *process) wait() error {
	ev, err := windows.WaitForSingleObject(p.proc, windows.INFINITE)
	if err != nil {
		return err
	}
	if ev != windows.WAIT_OBJECT_0 {
		return fmt.Errorf("wait: unexpected result %#x", ev)
	}
	return nil
}

// signal asks the job to stop, with CTRL_BREAK to its console process
// group, or, if kill is set, terminates every process of its Job Object.
// A job that does not share the host's console cannot be sent CTRL_BREAK:
// then the polite step does nothing and the kill after the grace ends it.
func (p *process) signal(kill bool) error {
	if kill {
		return windows.TerminateJobObject(p.job, killExitCode)
	}
	if !p.console {
		return nil
	}
	return windows.GenerateConsoleCtrlEvent(windows.CTRL_BREAK_EVENT, uint32(p.pid))
}

// reap returns the shell's exit code. Windows has no zombies: nothing is
// collected, the handle is closed by release.
func (p *process) reap() (int, error) {
	var code uint32
	if err := windows.GetExitCodeProcess(p.proc, &code); err != nil {
		return exitUnknown, err
	}
	// As os.ProcessState.ExitCode: NTSTATUS codes such as 0xC000013A
	// (ended by CTRL_BREAK) come out as large positive numbers.
	return int(code), nil
}

// jobAccounting is JOBOBJECT_BASIC_ACCOUNTING_INFORMATION.
type jobAccounting struct {
	TotalUserTime             int64
	TotalKernelTime           int64
	ThisPeriodTotalUserTime   int64
	ThisPeriodTotalKernelTime int64
	TotalPageFaultCount       uint32
	TotalProcesses            uint32
	ActiveProcesses           uint32
	TotalTerminatedProcesses  uint32
}

// jobCompletionPort is JOBOBJECT_ASSOCIATE_COMPLETION_PORT.
type jobCompletionPort struct {
	CompletionKey  uintptr
	CompletionPort windows.Handle
}

// active returns the number of live processes in the job. A process that
// has exited is gone: Windows keeps no zombies.
func (p *process) active() int {
	var info jobAccounting
	err := windows.QueryInformationJobObject(p.job, windows.JobObjectBasicAccountingInformation,
		uintptr(unsafe.Pointer(&info)), uint32(unsafe.Sizeof(info)), nil)
	if err != nil {
		return 0
	}
	return int(info.ActiveProcesses)
}

// leftovers returns how many processes of the job are still alive after
// the shell has exited.
func (p *process) leftovers() int { return p.live() }

// live returns the number of processes of the job that are alive, not
// counting the console host (conhost.exe) that Windows starts inside the
// job when the shell gets a console of its own (the host has none): it
// serves the job's processes, and exits after the last of them.
func (p *process) live() int {
	n := p.active()
	if n == 0 || p.console {
		return n
	}
	pids, err := p.pids(n)
	if err != nil {
		return n
	}
	live := 0
	for _, pid := range pids {
		if isLive(pid) {
			live++
		}
	}
	return live
}

// pids returns the IDs of the processes in the job; about n are expected.
func (p *process) pids(n int) ([]uint32, error) {
	for size := n + 8; ; size *= 2 {
		// JOBOBJECT_BASIC_PROCESS_ID_LIST: two counts, then the IDs
		// as ULONG_PTRs.
		buf := make([]uintptr, 1+size)
		err := windows.QueryInformationJobObject(p.job, windows.JobObjectBasicProcessIdList,
			uintptr(unsafe.Pointer(&buf[0])), uint32(len(buf))*uint32(unsafe.Sizeof(buf[0])), nil)
		if err == windows.ERROR_MORE_DATA && size < 1<<16 {
			continue
		}
		if err != nil {
			return nil, err
		}
		counts := (*[2]uint32)(unsafe.Pointer(&buf[0]))
		ids := make([]uint32, 0, counts[1])
		for _, id := range buf[1 : 1+min(int(counts[1]), size)] {
			ids = append(ids, uint32(id))
		}
		return ids, nil
	}
}

// consoleHost is the path of the console host, lower-cased.
var consoleHost = sync.OnceValue(func() string {
	dir, err := windows.GetSystemDirectory()
	if err != nil {
		return ""
	}
	return strings.ToLower(filepath.Join(dir, "conhost.exe"))
})

// isLive reports whether process pid counts as a live process of a job:
// it is running, and it is not the system's conhost.exe.
func isLive(pid uint32) bool {
	h, err := windows.OpenProcess(windows.PROCESS_QUERY_LIMITED_INFORMATION|windows.SYNCHRONIZE, false, pid)
	if err == windows.ERROR_INVALID_PARAMETER {
		return false // exited since the list was taken
	}
	if err != nil {
		return true // alive, but not ours to inspect
	}
	defer windows.CloseHandle(h)
	if ev, _ := windows.WaitForSingleObject(h, 0); ev == windows.WAIT_OBJECT_0 {
		return false
	}
	var buf [windows.MAX_PATH + 1]uint16
	n := uint32(len(buf))
	if err := windows.QueryFullProcessImageName(h, 0, &buf[0], &n); err != nil {
		return true
	}
	host := consoleHost()
	return host == "" || strings.ToLower(windows.UTF16ToString(buf[:n])) != host
}

// awaitEmpty waits until the job has no live process or the deadline
// passes, and returns the number still alive (as live counts them). It
// wakes on the job's messages (JOB_OBJECT_MSG_EXIT_PROCESS,
// JOB_OBJECT_MSG_ACTIVE_PROCESS_ZERO, ...) and counts again; each wait is
// also capped, so that a system that does not post job messages is only
// slower.
func (p *process) awaitEmpty(deadline time.Time) int {
	if !p.watched {
		p.watched = true
		p.port = watchJob(p.job)
	}
	for {
		// Counted after the port was set up: a process that exits
		// after this count posts a message that ends the wait below.
		n := p.live()
		left := time.Until(deadline)
		if n == 0 || left <= 0 {
			return n
		}
		step := min(left, awaitStep)
		if p.port == 0 {
			time.Sleep(min(step, 10*time.Millisecond))
			continue
		}
		var msg uint32
		var key, ov uintptr // ov holds a PID, not a pointer: keep it away from the GC
		windows.GetQueuedCompletionStatus(p.port, &msg, &key,
			(**windows.Overlapped)(unsafe.Pointer(&ov)), uint32((step+time.Millisecond-1)/time.Millisecond))
	}
}

// awaitStep caps each wait of awaitEmpty for a job message.
const awaitStep = 100 * time.Millisecond

// watchJob returns a completion port that receives job's messages, or 0.
func watchJob(job windows.Handle) windows.Handle {
	port, err := windows.CreateIoCompletionPort(windows.InvalidHandle, 0, 0, 1)
	if err != nil {
		return 0
	}
	assoc := jobCompletionPort{CompletionKey: uintptr(job), CompletionPort: port}
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectAssociateCompletionPortInformation,
		uintptr(unsafe.Pointer(&assoc)), uint32(unsafe.Sizeof(assoc))); err != nil {
		windows.CloseHandle(port)
		return 0
	}
	return port
}

// reapOrphans does nothing: Windows keeps no zombies.
func (p *process) reapOrphans() {}

// release closes the process's handles, each once. Closing the job's
// last handle kills whatever is still in it.
func (p *process) release() {
	for _, h := range []*windows.Handle{&p.proc, &p.job, &p.port} {
		if *h != 0 {
			windows.CloseHandle(*h)
			*h = 0
		}
	}
}

// enableSubreaper is Linux only; New refuses Config.Subreaper elsewhere.
func enableSubreaper() error { return ErrUnsupported }

// unwatch is for Detach, which durable mode alone has: never on Windows.
func (p *process) unwatch() {}

// watchExit reports whether rd will report the exit of p: on Windows it
// never does, and a waiter goroutine waits on the process handle.
func watchExit(outputReader, *process) bool { return false }
