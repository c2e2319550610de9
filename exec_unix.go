//go:build unix

package bgjob

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

func defaultShell() []string { return []string{"/bin/sh", "-c"} }

// envKey returns the form of an environment key that identifies it: on
// Unix, the key itself.
func envKey(k string) string { return k }

// process is a job's shell: the leader of a new session and process group
// whose ID is its PID.
type process struct {
	pid      int
	pidfd    *os.File // Linux: the shell's pidfd, if the kernel gave one
	pidfdNum int      // its number, or -1
	polled   bool     // pidfd is in the runtime's poller

	// adopted marks a process that a durable Registry found running at
	// New: not its child, so it is watched through its pidfd and its
	// exit code comes from the exit marker in the folder run.
	adopted bool
	run     string
}

// startProcess starts argv in a new session with the given directory and
// environment, stdin as its input and one pipe as both stdout and stderr.
// It returns the process and the parent's end of that pipe.
func startProcess(argv []string, dir string, env []string, stdin string) (*process, outputReader, error) {
	if !canSpawn {
		return nil, nil, ErrUnsupported
	}
	// The write end stays a raw, blocking descriptor, as a child's stdout
	// should be; only the read end is non-blocking, waited on through
	// the runtime's poller (see openOutput), so that reads can have
	// deadlines.
	var pfd [2]int
	if err := rawPipe(&pfd); err != nil {
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	defer unix.Close(pfd[1])
	// A new pipe's read end has no other status flag to keep.
	if _, err := unix.FcntlInt(uintptr(pfd[0]), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		unix.Close(pfd[0])
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	rd, err := openOutput(pfd[0])
	if err != nil {
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	p, err := forkJob(argv, dir, env, stdin, pfd[1], pollPidfd(rd))
	if err != nil {
		rd.Close()
		return nil, nil, err
	}
	return p, rd, nil
}

// forkJob starts argv in a new session with the given directory and
// environment, stdin as its input and the descriptor out as both stdout
// and stderr. With poll set, the shell's pidfd (where there is one) goes
// into the runtime's poller, for a waiter goroutine to wait on.
func forkJob(argv []string, dir string, env []string, stdin string, out int, poll bool) (*process, error) {
	path, err := lookShell(argv[0])
	if err != nil {
		return nil, err
	}
	in, err := stdinFile(stdin)
	if err != nil {
		return nil, fmt.Errorf("stdin: %w", err)
	}
	if stdin != "" {
		defer unix.Close(in) // the shared /dev/null stays open
	}
	pidfd := -1
	attr := &syscall.ProcAttr{
		Dir:   dir,
		Env:   env,
		Files: []uintptr{uintptr(in), uintptr(out), uintptr(out)},
		Sys:   sysProcAttr(&pidfd),
	}
	pid, err := syscall.ForkExec(path, argv, attr)
	if err != nil {
		if errors.Is(err, syscall.ENOENT) && isDir(dir) != nil {
			return nil, fmt.Errorf("working directory %s: %w", dir, err)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	p := &process{pid: pid, pidfdNum: -1}
	if pidfd >= 0 {
		// Non-blocking, so that the runtime's poller can wait on it; a
		// blocking descriptor stays out of the poller.
		if !poll || unix.SetNonblock(pidfd, true) == nil {
			p.pidfd, p.pidfdNum, p.polled = os.NewFile(uintptr(pidfd), "pidfd"), pidfd, poll
		} else {
			unix.Close(pidfd)
		}
	}
	return p, nil
}

// lookShell resolves a shell program that holds no '/' through the host's
// PATH.
func lookShell(path string) (string, error) {
	if strings.Contains(path, "/") {
		return path, nil
	}
	return exec.LookPath(path)
}

// stdinFile returns the descriptor a job reads as its standard input:
// the shared /dev/null when s is empty (see devNull), else an unlinked
// temporary file holding s, which the caller must close. A file, unlike
// a pipe, takes any size without a goroutine to feed it.
func stdinFile(s string) (int, error) {
	if s == "" {
		return openDevNull()
	}
	f, err := os.CreateTemp("", "bgjob-stdin-*")
	if err != nil {
		return -1, err
	}
	defer f.Close()
	os.Remove(f.Name())
	if _, err := f.WriteString(s); err != nil {
		return -1, err
	}
	if _, err := f.Seek(0, 0); err != nil {
		return -1, err
	}
	// A descriptor that outlives f, sharing its offset (now 0).
	return dupCloexec(int(f.Fd()))
}

// devNull is /dev/null, opened for reading by the first job without
// stdin and then kept for the life of the process, close-on-exec: every
// such job's shell gets it as its standard input, which saves an open and
// a close per job. fd is written once, under mu, before ok is set.
var devNull struct {
	mu sync.Mutex
	ok atomic.Bool
	fd int
}

func openDevNull() (int, error) {
	if devNull.ok.Load() {
		return devNull.fd, nil
	}
	devNull.mu.Lock()
	defer devNull.mu.Unlock()
	if !devNull.ok.Load() {
		fd, err := unix.Open(os.DevNull, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != nil {
			return -1, err // tried again by the next job
		}
		devNull.fd = fd
		devNull.ok.Store(true)
	}
	return devNull.fd, nil
}

// signal sends SIGTERM, or SIGKILL if kill is set, to the whole process
// group. A group that is already gone is not an error.
func (p *process) signal(kill bool) error {
	sig := unix.SIGTERM
	if kill {
		sig = unix.SIGKILL
	}
	if err := unix.Kill(-p.pid, sig); err != nil && err != unix.ESRCH {
		return err
	}
	return nil
}

// reap collects the shell's exit status: its exit code, or 128+n if signal
// n killed it.
func (p *process) reap() (int, error) {
	if p.adopted {
		return reapAdopted(p)
	}
	var ws unix.WaitStatus
	for {
		_, err := unix.Wait4(p.pid, &ws, 0, nil)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return exitUnknown, err
		}
		break
	}
	switch {
	case ws.Exited():
		return ws.ExitStatus(), nil
	case ws.Signaled():
		return 128 + int(ws.Signal()), nil
	}
	return exitUnknown, fmt.Errorf("unexpected wait status %#x", uint32(ws))
}

// leftovers returns how many processes of the group are still alive
// after the shell was reaped. Zombies do not count: they hold nothing but
// a PID, and where PID 1 does not reap orphans they never go away.
func (p *process) leftovers() int {
	// Fast path: no member at all, zombie or not.
	if err := unix.Kill(-p.pid, 0); err == unix.ESRCH {
		return 0
	}
	return len(liveMembers(p.pid))
}

// unwatch ends a wait on the process (see wait), for Detach.
func (p *process) unwatch() {
	if p.polled {
		p.pidfd.SetReadDeadline(time.Unix(1, 0))
	}
}

// release frees what the process holds once it has been reaped.
func (p *process) release() {
	if p.pidfd != nil {
		p.pidfd.Close()
	}
}

// awaitEmptyPolling waits until the group has no live process or the
// deadline passes, checking at growing intervals, for systems where no
// event tells that a process which is not our child has died. It returns
// the number of live processes left.
func awaitEmptyPolling(pgid int, deadline time.Time) int {
	d := time.Millisecond
	for {
		n := len(liveMembers(pgid))
		if n == 0 || !time.Now().Before(deadline) {
			return n
		}
		time.Sleep(min(d, time.Until(deadline)))
		d = min(2*d, 50*time.Millisecond)
	}
}
