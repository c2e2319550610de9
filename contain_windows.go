//go:build windows

package bgjob

import (
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/windows"
)

// process is a job's process tree on Windows: the shell, and the Job
// Object that holds it and everything it starts.
//
// The supervisor goroutine owns a process; the waiter only calls wait.
// Each handle is closed once, by close, after the waiter has returned
// (it returns before the supervisor reaps).
type process struct {
	pid int
	// proc is the shell's process handle. Holding it keeps the shell's
	// PID, which is also its console process group's ID, from being
	// reused until close.
	proc windows.Handle
	// job is the Job Object of the tree, set to kill everything in it
	// when its last handle closes: even if the host dies, no process of
	// the job outlives it.
	job windows.Handle
	// port receives the job's notifications: from the start for a job
	// with a limit whose breach a message tells (see newJob), else once
	// awaitEmpty first needs them (associated lazily, so that a job that
	// starts thousands of processes does not queue a message for each);
	// 0 before that or if it could not be set up. watched says it was
	// tried.
	port    windows.Handle
	watched bool
	// hits holds a bit (1<<msg) for each limit message the supervisor
	// has read from port (see noteMessage).
	hits uint32
	// console reports whether the shell shares the host's console, so
	// that a CTRL_BREAK can reach its process group.
	console bool
}

// Windows exit code given to the processes of a job that is killed, as
// os.Process.Kill does.
const killExitCode = 1

// newJob creates a Job Object that kills its processes when its last
// handle closes, set to limits l (see jobLimitsFor). For a job with a
// limit whose breach only a message tells (Memory, Processes, CPUTime),
// it also returns the completion port those messages go to, associated
// now, before any process is in the job; 0 if it could not be (the
// limits hold all the same, but limitHit cannot tell which one stopped
// the job). Such a job's port holds the job's every message (two small
// ones per process it starts) until the job ends, when limitHit and
// awaitEmpty read them and close frees the rest: the price of knowing
// why a limited job failed. A CPU limit
// the system refuses is an error: the job never runs without it.
func newJob(l Limits) (job, port windows.Handle, err error) {
	job, err = windows.CreateJobObject(nil, nil)
	if err != nil {
		return 0, 0, err
	}
	lim := jobLimitsFor(l, processors())
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&lim.ext)), uint32(unsafe.Sizeof(lim.ext))); err != nil {
		windows.CloseHandle(job)
		return 0, 0, err
	}
	if lim.cpu.ControlFlags != 0 {
		if err := setCPURate(job, lim.cpu); err != nil {
			windows.CloseHandle(job)
			return 0, 0, fmt.Errorf("Limits.CPU: CPU rate control: %w", err)
		}
	}
	if lim.watch {
		port = watchJob(job)
	}
	return job, port, nil
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
// so its PID is not reused until close.
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
// A failure while no process of the job is alive is not an error: the
// tree is already gone (the shell's console group, for one, goes with
// the shell).
func (p *process) signal(kill bool) error {
	var err error
	switch {
	case kill:
		err = windows.TerminateJobObject(p.job, killExitCode)
	case p.console:
		err = windows.GenerateConsoleCtrlEvent(windows.CTRL_BREAK_EVENT, uint32(p.pid))
	}
	if err != nil && p.active() == 0 {
		return nil
	}
	return err
}

// reap returns the shell's exit code. Windows has no zombies: nothing is
// collected, the handle is closed by close.
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

// treeCount counts the live processes of the job, for the leftover
// watcher, which may call it from its own goroutine: it reads only the
// Job Object's handle and the console flag, set before the process was
// shared, and the supervisor stops the watcher before it closes them.
func (p *process) treeCount() int { return p.live() }

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
		p.nextMessage(uint32((step + time.Millisecond - 1) / time.Millisecond))
	}
}

// nextMessage waits up to ms milliseconds for the next message of the
// job's port, notes it (noteMessage), and reports whether one came.
func (p *process) nextMessage(ms uint32) bool {
	var msg uint32
	var key, ov uintptr // ov holds a PID, not a pointer: keep it away from the GC
	err := windows.GetQueuedCompletionStatus(p.port, &msg, &key, (**windows.Overlapped)(unsafe.Pointer(&ov)), ms)
	if err != nil {
		return false
	}
	p.noteMessage(msg)
	return true
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

// close closes the process's handles, each once. Closing the job's last
// handle kills whatever is still in it.
func (p *process) close() {
	for _, h := range []*windows.Handle{&p.proc, &p.job, &p.port} {
		if *h != 0 {
			windows.CloseHandle(*h)
			*h = 0
		}
	}
}

// keeperOf returns 0: durable mode is unsupported on Windows.
func (p *process) keeperOf() int { return 0 }

// settle has nothing to prepare: the Job Object is made with the process.
func (p *process) settle() {}

// containment says what holds p's tree: its Job Object.
func (p *process) containment() (Containment, string) { return ContainJobObject, "" }

// enableSubreaper is Linux only; New refuses Config.Subreaper elsewhere.
func enableSubreaper() error { return ErrUnsupported }

// unwatch is for Detach, which durable mode alone has: never on Windows.
func (p *process) unwatch() {}

// watchExit reports whether rd will report the exit of p: on Windows it
// never does, and a waiter goroutine waits on the process handle.
func watchExit(outputReader, *process) bool { return false }
