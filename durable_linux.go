package bgjob

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"

	"golang.org/x/sys/unix"
)

// wrapperScript runs the job's shell under a wrapper /bin/sh that writes
// the shell's status to the exit marker (the host's empty 0600 exit.tmp,
// filled, then renamed) and exits with it, so a job that ends while the
// host is down still records how it ended. Everything the wrapper runs
// comes to it as arguments ("$1" the run folder, then the shell's argv),
// so nothing is quoted into the script. An interactive job's wrapper
// also holds, as descriptor 4, the life pipe of its input's holder
// (durable_io_linux.go), which the job's shell does not get. The wrapper catches SIGTERM,
// SIGINT and SIGHUP with a no-op trap so that a polite group signal
// reaches the shell and the marker still gets written (a caught signal,
// unlike an ignored one, goes back to its default in the programs the
// wrapper starts). Its own stderr is /dev/null while it waits, since sh
// reports a child killed by a signal ("Killed") there and that must not
// join the job's output; an inner sh gets the real stderr back from
// descriptor 3 and execs the job's shell with it (same process, so the
// status is the shell's own).
const wrapperScript = `trap : HUP INT TERM
d=$1
shift
exec 3>&2 2>/dev/null
` + wrapperShell + ` -c 'exec "$@" 2>&3 3>&- 4>&-' sh "$@"
s=$?
echo "$s" 1<>"$d/exit.tmp" && command -p mv -f "$d/exit.tmp" "$d/exit"
exit "$s"`

// wrapperShell is the shell that runs wrapperScript.
const wrapperShell = "/bin/sh"

// durableCheck reports whether durable mode works here: it needs pidfds
// (to watch a process that is not the host's child) and the wrapper
// shell.
func durableCheck() error {
	fd, err := unix.PidfdOpen(os.Getpid(), 0)
	if err != nil {
		return fmt.Errorf("pidfd_open: %w: %w", err, ErrUnsupported)
	}
	unix.Close(fd)
	if _, err := os.Stat(wrapperShell); err != nil {
		return fmt.Errorf("%s: %w: %w", wrapperShell, err, ErrUnsupported)
	}
	return nil
}

// lockStateDir takes the state directory's lock (flock on StateDir/lock,
// held by an open file of the returned *os.File), or fails with ErrInUse.
// The file holds the PID of the holder, for the error message.
func lockStateDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	for {
		err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err != unix.EINTR {
			break
		}
	}
	if err == unix.EWOULDBLOCK {
		holder, _ := os.ReadFile(f.Name())
		f.Close()
		return nil, fmt.Errorf("held by the Registry of process %s: %w", strings.TrimSpace(string(holder)), ErrInUse)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock: %w", err)
	}
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+"\n"), 0)
	return f, nil
}

// unlockStateDir lets go of the lock. A child being spawned holds a copy
// of every descriptor until it execs, and with it the lock: the file is
// closed while no spawn is under way (ForkLock; Go's spawns on Linux
// return once the child has exec'd), so that no copy outlives it.
func unlockStateDir(f *os.File) {
	syscall.ForkLock.RLock()
	defer syscall.ForkLock.RUnlock()
	f.Close()
}

// wrapArgv returns argv run under the wrapper shell that writes its
// status to the exit marker in the run folder dir.
func wrapArgv(dir string, argv []string) []string {
	w := make([]string, 0, len(argv)+5)
	w = append(w, wrapperShell, "-c", wrapperScript, "sh", dir)
	return append(w, argv...)
}

// prepareMarker makes the exit marker's temporary file in the run folder
// dir, empty and 0600: its mode is set here, since the wrapper's umask is
// the job's. Its block is reserved now, and the wrapper writes into it
// without truncating (1<>), so that a job ending on a full disk still
// leaves its status.
func prepareMarker(dir string) error {
	tmp, err := unix.Open(filepath.Join(dir, markerFile+".tmp"), unix.O_WRONLY|unix.O_CREAT|unix.O_TRUNC|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return err
	}
	err = unix.Fallocate(tmp, unix.FALLOC_FL_KEEP_SIZE, 0, 4096)
	unix.Close(tmp)
	if err != nil && err != unix.EOPNOTSUPP {
		return err
	}
	return nil
}

// bootID names this boot of the machine, so a start time (counted from
// boot) is never compared across boots.
func bootID() string {
	b, _ := os.ReadFile("/proc/sys/kernel/random/boot_id")
	return strings.TrimSpace(string(b))
}

// adoptProcess takes over the running job of a record: its process, which
// must still be the one that started at the recorded start time, and its
// tree. It fails with errGone if that process is no longer running.
func adoptProcess(rec *record, run string, exited func() bool, lim readLimits, cgs *cgroups, w *fileWatch) (*process, outputReader, error) {
	pid, start := rec.PID, rec.StartTime
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err == unix.ESRCH || err == unix.EINVAL {
		return nil, nil, errGone
	}
	if err != nil {
		// No descriptor to watch it with: it may well be alive.
		return nil, nil, fmt.Errorf("pidfd_open: %w", err)
	}
	// Checked after the pidfd is open: the pidfd pins the process, so a
	// match now cannot be a later process that reuses the PID.
	st, zombie, err := procStart(pid)
	if err != nil && err != errGone {
		unix.Close(fd)
		return nil, nil, err
	}
	if err == errGone || st != start || zombie {
		if err == nil && st == start {
			// The job's own zombie, if it is the host's child (a
			// Registry of this process detached it): reap it.
			var info unix.Siginfo
			unix.Waitid(unix.P_PIDFD, fd, &info, unix.WEXITED|unix.WNOHANG, nil)
		}
		unix.Close(fd)
		return nil, nil, errGone
	}
	// Its keeper, if it runs: the job's output is all in the file only
	// once the keeper has copied the pipe's last bytes and exited.
	k, err := adoptKeeper(rec.KeeperPID, rec.KeeperStart)
	if err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("keeper: %w", err)
	}
	done := func() bool { return exited() && k.exited() }
	rd, err := newFileReader(filepath.Join(run, outputFile), done, lim, w)
	if err != nil {
		unix.Close(fd)
		if k != nil {
			k.reap(false)
		}
		return nil, nil, fmt.Errorf("output: %w", err)
	}
	p := &process{pid: pid}
	p.pidfd, p.pidfdNum, p.polled, p.adopted, p.markerDir = os.NewFile(uintptr(fd), "pidfd"), fd, true, true, run
	p.keeper = k
	// Its tree: the cgroup it was spawned into, or its session and its
	// marker (on processes started since its shell).
	// Only a cgroup in the registry's own folder: a record is data, and a
	// damaged one must not have the registry kill another cgroup.
	if _, err := os.Stat(filepath.Join(string(rec.Cgroup), "cgroup.procs")); rec.Cgroup != "" && err == nil && cgs.owns(string(rec.Cgroup)) {
		p.cgroup, p.cgs = string(rec.Cgroup), cgs
		p.cgBase = cpuTimes{user: rec.CgroupCPUBase[0], system: rec.CgroupCPUBase[1]}
	} else {
		p.marker, p.since = rec.Marker, start
	}
	return p, rd, nil
}

// adoptLeftovers takes over a job of Spec.Leftovers LeftoversWait whose
// shell is gone (its record's process ended, while no host or a detached
// one watched it) but whose tree lives on: its cgroup is populated, or
// processes started since its shell carry its marker. The job is adopted
// in its leftover phase: its shell counts as exited (the exit marker has
// its code), and the job ends when its tree is empty. It fails with
// errGone if the tree is empty too.
func adoptLeftovers(rec *record, run string, exited func() bool, lim readLimits, cgs *cgroups, w *fileWatch) (*process, outputReader, error) {
	// Its PID is no longer its shell's: it may be anyone's now.
	p := &process{pid: -1}
	p.adopted, p.markerDir, p.pidfdNum = true, run, -1
	cg := string(rec.Cgroup)
	switch {
	case cg != "" && cgs.owns(cg):
		if cgroupEmpty(cg, filepath.Join(cg, "cgroup.events")) {
			return nil, nil, errGone
		}
		p.cgroup, p.cgs = cg, cgs
		p.cgBase = cpuTimes{user: rec.CgroupCPUBase[0], system: rec.CgroupCPUBase[1]}
	case cg == "" && rec.Marker != "":
		p.marker, p.since = rec.Marker, rec.StartTime
		probe := &process{pid: -1}
		probe.marker, probe.since, probe.reaped = rec.Marker, rec.StartTime, true
		n := probe.leftovers()
		probe.close()
		if n == 0 {
			return nil, nil, errGone
		}
	default:
		return nil, nil, errGone
	}
	k, err := adoptKeeper(rec.KeeperPID, rec.KeeperStart)
	if err != nil {
		return nil, nil, fmt.Errorf("keeper: %w", err)
	}
	done := func() bool { return exited() && k.exited() }
	rd, err := newFileReader(filepath.Join(run, outputFile), done, lim, w)
	if err != nil {
		if k != nil {
			k.reap(false)
		}
		return nil, nil, fmt.Errorf("output: %w", err)
	}
	p.keeper = k
	return p, rd, nil
}

// adoptKeeper finds the keeper of an adopted job: process pid, if it is
// still the one that started at start; nil if it is gone (or there was
// none: a record of a version without keepers).
func adoptKeeper(pid int, start uint64) (*keeper, error) {
	if pid <= 0 {
		return nil, nil
	}
	fd, err := unix.PidfdOpen(pid, 0)
	if err == unix.ESRCH || err == unix.EINVAL {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("pidfd_open: %w", err)
	}
	st, zombie, err := procStart(pid)
	if err != nil && err != errGone {
		unix.Close(fd)
		return nil, err
	}
	if err == errGone || st != start || zombie {
		unix.Close(fd)
		return nil, nil
	}
	// It may be the host's child (a Registry of this process detached
	// it): then it is reaped at the job's end.
	return &keeper{pid: pid, pidfd: os.NewFile(uintptr(fd), "pidfd"), child: true}, nil
}

// stopMarked stops the processes that a job contained by its session
// left behind while no host watched it: those that carry its marker,
// started since its shell. It returns how many it found.
func stopMarked(rec *record) int {
	if rec.Marker == "" || rec.Cgroup != "" {
		return 0
	}
	// By the marker alone: the session's ID was the shell's PID, which
	// may have been reused since the shell died.
	p := &process{pid: -1}
	p.marker, p.since, p.reaped = rec.Marker, rec.StartTime, true
	n := p.leftovers()
	if n > 0 {
		p.signal(true)
		p.awaitEmpty(deadlineIn(killWait))
	}
	return n
}

// waitAdopted blocks until an adopted process has exited: its pidfd turns
// readable. It works for a process that is not the host's child.
func (p *process) waitAdopted() error {
	if p.pidfd == nil {
		return nil // adopted in its leftover phase: the shell is gone
	}
	rc, err := p.pidfd.SyscallConn()
	if err != nil {
		return errReleased
	}
	err = rc.Read(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(pfd, 0)
		return n > 0
	})
	if err != nil {
		return errReleased
	}
	return nil
}

// reapAdopted returns the exit code of an adopted process from its exit
// marker, or errNoMarker. If the process happens to be the host's child,
// it is reaped too.
func reapAdopted(p *process) (int, error) {
	if p.pidfd == nil {
		// Adopted in its leftover phase: nothing to reap.
	} else if rc, err := p.pidfd.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) {
			var info unix.Siginfo
			unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG, nil)
		})
	}
	code, ok, err := readMarker(p.markerDir)
	switch {
	case err != nil:
		return exitUnknown, fmt.Errorf("%w: %w", errMarkerUnread, err)
	case !ok:
		return exitUnknown, errNoMarker
	}
	return code, nil
}

// reserveSpare allocates, without changing its size, room for n bytes in
// the file name, so that the next write of that many bytes cannot fail
// for want of space. It is best effort: on failure it removes the file.
func reserveSpare(name string, n int64) {
	fd, err := unix.Open(name, unix.O_WRONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return
	}
	err = unix.Fallocate(fd, unix.FALLOC_FL_KEEP_SIZE, 0, (n+4095)&^4095)
	unix.Close(fd)
	if err != nil {
		os.Remove(name)
	}
}
