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
// (openOutput), or both at once when they are a terminal (startOnTTY),
// its containment (a new session, in sysProcAttr) and the spawn itself
// (forkJob). An interactive job's input is left in pl.input.conn.
func startJob(pl *plan) (*process, outputReader, error) {
	if !canSpawn {
		return nil, nil, ErrUnsupported
	}
	if pl.input.tty != nil {
		return startOnTTY(pl)
	}
	out, rd, err := openOutput(&pl.output)
	if err != nil {
		return nil, nil, err
	}
	defer unix.Close(out)
	in, owned, err := openInput(&pl.input)
	if err != nil {
		rd.Close()
		return nil, nil, fmt.Errorf("stdin: %w", err)
	}
	if owned {
		defer unix.Close(in) // the shared /dev/null stays open
	}
	// On failure from here on, the host's end of the input goes too.
	fail := func(err error) (*process, outputReader, error) {
		rd.Close()
		pl.input.dropConn()
		return nil, nil, err
	}
	k, err := startKeeperOf(rd, &pl.output)
	if err != nil {
		return fail(fmt.Errorf("keeper: %w", err))
	}
	p, err := forkJob(pl, in, out, pollPidfd(rd))
	if err != nil {
		if k != nil {
			k.stop()
		}
		return fail(err)
	}
	p.keep(k)
	pl.input.dropLife() // the wrapper has it
	p.holdInput(&pl.input)
	if pl.output.file != "" && !p.releasable() {
		// Detach could not end a wait on this process.
		p.signal(true)
		p.reap()
		p.close()
		return fail(fmt.Errorf("no pidfd: %w", ErrUnsupported))
	}
	return p, rd, nil
}

// startOnTTY carries out pl for a job on a pseudo-terminal: the slave is
// its stdin, stdout, stderr and controlling terminal; the host reads the
// master as the job's output (through the same reader as a pipe's) and
// writes a copy of it as the job's input.
func startOnTTY(pl *plan) (*process, outputReader, error) {
	if pl.output.file != "" {
		return nil, nil, fmt.Errorf("terminal with an output file: %w", ErrUnsupported) // refused at launch
	}
	rows, cols := ttySize(pl.input.tty)
	m, slave, err := openPTY(rows, cols)
	if err != nil {
		return nil, nil, fmt.Errorf("pseudo-terminal: %w", err)
	}
	defer unix.Close(slave) // the job has it once it is spawned
	w, err := dupCloexec(m)
	if err != nil {
		unix.Close(m)
		return nil, nil, fmt.Errorf("pseudo-terminal: %w", err)
	}
	conn := &fileConn{File: os.NewFile(uintptr(w), "/dev/ptmx"), tty: true}
	rd, err := newPipeReader(m) // takes m
	if err != nil {
		conn.Close()
		return nil, nil, fmt.Errorf("pseudo-terminal: %w", err)
	}
	p, err := forkJob(pl, slave, slave, pollPidfd(rd))
	if err != nil {
		conn.Close()
		rd.Close()
		return nil, nil, err
	}
	pl.input.conn = conn
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
	if pl.input.tty != nil {
		// The slave, the child's descriptor 0, becomes the controlling
		// terminal of its new session.
		sys.Setctty, sys.Ctty = true, 0
	}
	files := []uintptr{uintptr(in), uintptr(out), uintptr(out)}
	if pl.input.hasLife {
		// Durable mode's wrapper holds the input holder's life pipe
		// (see durable_io_linux.go); descriptor 3 stays closed.
		files = append(files, ^uintptr(0), uintptr(pl.input.life))
	}
	attr := &syscall.ProcAttr{Dir: pl.dir, Env: env, Files: files, Sys: sys}
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

// dropLife closes the host's copy of the life pipe's write end, once the
// job's wrapper has its own or will not.
func (ip *inputPlan) dropLife() {
	if ip.hasLife {
		unix.Close(ip.life)
		ip.hasLife = false
	}
}

// openInput returns the descriptor a job reads as its standard input,
// and whether the caller must close it once the child has it:
//   - an interactive job's: a pipe (or, in durable mode, the run's FIFO,
//     see openFIFO), whose host end, non-blocking and in the runtime's
//     poller, goes to in.conn; Spec.Stdin is written into it after the
//     spawn (input.prime);
//   - else, with Spec.Stdin, an unlinked temporary file holding it: a
//     file, unlike a pipe, takes any size without a goroutine to feed it;
//   - else the shared /dev/null (see devNull).
func openInput(in *inputPlan) (int, bool, error) {
	switch {
	case in.fifo != "":
		fd, err := openFIFO(in)
		return fd, err == nil, err
	case in.interactive:
		var pfd [2]int
		if err := rawPipe(&pfd); err != nil {
			return -1, false, err
		}
		// Only the host's end is non-blocking: the job reads a plain
		// pipe.
		if _, err := unix.FcntlInt(uintptr(pfd[1]), unix.F_SETFL, unix.O_NONBLOCK); err != nil {
			unix.Close(pfd[0])
			unix.Close(pfd[1])
			return -1, false, err
		}
		in.conn = &fileConn{File: os.NewFile(uintptr(pfd[1]), "|1")}
		return pfd[0], true, nil
	case in.data == "":
		fd, err := openDevNull()
		return fd, false, err
	}
	f, err := os.CreateTemp("", "bgjob-stdin-*")
	if err != nil {
		return -1, false, err
	}
	defer f.Close()
	os.Remove(f.Name())
	if _, err := f.WriteString(in.data); err != nil {
		return -1, false, err
	}
	if _, err := f.Seek(0, 0); err != nil {
		return -1, false, err
	}
	// A descriptor that outlives f, sharing its offset (now 0).
	fd, err := dupCloexec(int(f.Fd()))
	return fd, err == nil, err
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
