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

	"golang.org/x/sys/unix"
)

func defaultShell() []string { return []string{"/bin/sh", "-c"} }

// envKey returns the form of an environment key that identifies it: on
// Unix, the key itself.
func envKey(k string) string { return k }

// startJob carries out pl: the job's input (openInput), its output
// (openOutput), its containment (a new session, in sysProcAttr) and the
// spawn itself (forkJob).
func startJob(pl *plan) (*process, outputReader, error) {
	if !canSpawn {
		return nil, nil, ErrUnsupported
	}
	out, rd, err := openOutput(&pl.output)
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(out)
	in, err := openInput(pl.stdin)
	if err != nil {
		rd.Close()
		return nil, nil, fmt.Errorf("stdin: %w", err)
	}
	if pl.stdin != "" {
		defer unix.Close(in) // the shared /dev/null stays open
	}
	k, err := startKeeperOf(rd, &pl.output)
	if err != nil {
		rd.Close()
		return nil, nil, fmt.Errorf("keeper: %w", err)
	}
	p, err := forkJob(pl, in, out, pollPidfd(rd))
	if err != nil {
		if k != nil {
			k.stop()
		}
		rd.Close()
		return nil, nil, err
	}
	p.keep(k)
	if pl.output.file != "" && !p.releasable() {
		// Detach could not end a wait on this process.
		p.signal(true)
		p.reap()
		p.close()
		rd.Close()
		return nil, nil, fmt.Errorf("no pidfd: %w", ErrUnsupported)
	}
	return p, rd, nil
}

// openOutput makes what a job writes its stdout and stderr to: the
// descriptor for the child, which the caller closes once the child has
// it, and the reader for the host.
func openOutput(o *outputPlan) (int, outputReader, error) {
	// The write end stays a raw, blocking descriptor, as a child's stdout
	// should be; only the read end is non-blocking, waited on through
	// the runtime's poller (see newPipeReader), so that reads can have
	// deadlines.
	var pfd [2]int
	if err := rawPipe(&pfd); err != nil {
		return -1, nil, fmt.Errorf("pipe: %w", err)
	}
	// A new pipe's read end has no other status flag to keep.
	if _, err := unix.FcntlInt(uintptr(pfd[0]), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
		unix.Close(pfd[0])
		unix.Close(pfd[1])
		return -1, nil, fmt.Errorf("pipe: %w", err)
	}
	rd, err := newPipeReader(pfd[0])
	if err != nil {
		unix.Close(pfd[1])
		return -1, nil, fmt.Errorf("pipe: %w", err)
	}
	if o.file != "" {
		if err := teeInto(rd, o); err != nil {
			rd.Close()
			unix.Close(pfd[1])
			return -1, nil, fmt.Errorf("output: %w", err)
		}
	}
	return pfd[1], rd, nil
}

// forkJob starts pl's command line with pl's directory and environment,
// in as its input and the descriptor out as both stdout and stderr, in
// the containment pl asks for (see containAttr). With poll set, the
// shell's pidfd (where there is one) goes into the runtime's poller, for
// a waiter goroutine to wait on.
func forkJob(pl *plan, in, out int, poll bool) (*process, error) {
	path, err := lookShell(pl.argv[0])
	if err != nil {
		return nil, err
	}
	pidfd := -1
	sys, env, done, err := containAttr(pl, &pidfd)
	if err != nil {
		return nil, err
	}
	attr := &syscall.ProcAttr{Dir: pl.dir, Env: env, Files: []uintptr{uintptr(in), uintptr(out), uintptr(out)}, Sys: sys}
	pid, err := syscall.ForkExec(path, pl.argv, attr)
	done()
	if err != nil && pl.cg != nil && noCgroupSpawn(err) {
		// This kernel cannot spawn into a cgroup: this registry's jobs
		// are contained by their sessions from now on.
		pl.cgs.disable(err)
		pl.cgs.giveBack(pl)
		return forkJob(pl, in, out, poll)
	}
	if err != nil {
		if errors.Is(err, syscall.ENOENT) && isDir(pl.dir) != nil {
			return nil, fmt.Errorf("working directory %s: %w", pl.dir, err)
		}
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	p := &process{pid: pid}
	p.watchPidfd(pidfd, poll)
	p.contain(pl)
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

// openInput returns the descriptor a job reads as its standard input:
// the shared /dev/null when s is empty (see devNull), else an unlinked
// temporary file holding s, which the caller must close. A file, unlike
// a pipe, takes any size without a goroutine to feed it.
func openInput(s string) (int, error) {
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
