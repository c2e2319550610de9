package bgjob

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

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
// The file holds the PID and start time of the holder, for the error
// message and for the wait below.
//
// A host that dies lets go of the lock, but not always at once: a flock
// belongs to an open file, and every copy of its descriptor holds it. A
// child that the host was spawning when it died holds a copy until its
// exec closes it (this descriptor closes on exec). TestStressDurable saw
// a SIGKILLed host's lock held for up to 375 ms after the host was
// reaped, under load, by no process that /proc showed with the file
// open. So when the holder that the file names is dead, lockStateDir
// tries again for up to lockWait before it gives up. The kernel says
// nothing when a flock is let go, so it looks again at growing
// intervals.
func lockStateDir(dir string) (*os.File, error) {
	f, err := os.OpenFile(filepath.Join(dir, lockFile), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	giveUp := time.Now().Add(lockWait)
	for pause := time.Millisecond; ; pause = min(2*pause, 50*time.Millisecond) {
		for {
			err = unix.Flock(int(f.Fd()), unix.LOCK_EX|unix.LOCK_NB)
			if err != unix.EINTR {
				break
			}
		}
		if err != unix.EWOULDBLOCK {
			break
		}
		holder, _ := os.ReadFile(f.Name())
		pid, alive := lockHolder(holder)
		if alive || !time.Now().Before(giveUp) {
			f.Close()
			return nil, fmt.Errorf("held by the Registry of process %s: %w", pid, ErrInUse)
		}
		time.Sleep(pause)
	}
	if err != nil {
		f.Close()
		return nil, fmt.Errorf("lock: %w", err)
	}
	start, _, _ := procStart(os.Getpid())
	f.Truncate(0)
	f.WriteAt([]byte(strconv.Itoa(os.Getpid())+" "+strconv.FormatUint(start, 10)+"\n"), 0)
	return f, nil
}

// lockWait bounds how long lockStateDir waits for a lock whose holder has
// died (see there).
const lockWait = 2 * time.Second

// lockHolder reads the lock file's content, "PID START" (START, the
// process's start time, is missing from files of earlier versions), and
// reports the PID and whether that process may still be alive: unless it
// is known to be gone (or a zombie, which holds no file), it counts as
// alive, and the lock as in use.
func lockHolder(b []byte) (string, bool) {
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return "?", true
	}
	pid, err := strconv.Atoi(f[0])
	if err != nil || pid <= 0 {
		return f[0], true
	}
	st, zombie, err := procStart(pid)
	switch {
	case err == errGone || err == nil && zombie:
		return f[0], false
	case err != nil || len(f) < 2:
		return f[0], true
	}
	start, err := strconv.ParseUint(f[1], 10, 64)
	return f[0], err != nil || start == st
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

// bootIDFile names the boot; a test may point it elsewhere.
var bootIDFile = "/proc/sys/kernel/random/boot_id"

// bootID names this boot of the machine, so a start time (counted from
// boot) is never compared across boots. It fails if the name cannot be
// read (no descriptor left, say): a wrong name would make every running
// job look like one of an earlier boot.
func bootID() (string, error) {
	b, err := os.ReadFile(bootIDFile)
	id := strings.TrimSpace(string(b))
	if err == nil && id == "" {
		err = errors.New("empty")
	}
	if err != nil {
		return "", fmt.Errorf("%s: %w", bootIDFile, err)
	}
	return id, nil
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

// released holds a pidfd of each of the host's children that a Registry
// let go of unreaped: the shells and keepers of the jobs that Detach
// released. No Registry watches them any more, and only the host can
// reap them (the Registry that adopts such a job may be in another
// process), so every Registry of the process reaps those that have
// exited as it opens its state directory and as it lets go of it
// (reapReleased). A pidfd names its process for good, so a PID that is
// reused meanwhile is never reaped instead; and since only the host's
// own children are held, none of the host's other children is taken.
// A child that is never reaped by another Registry's adoption or by
// reapReleased stays here (a descriptor) until it is.
var released struct {
	mu   sync.Mutex
	kids []*os.File
}

// noteReleased takes the pidfd of a child of the host that was released
// unreaped; reapReleased reaps it once it has exited.
func noteReleased(pidfd *os.File) {
	released.mu.Lock()
	released.kids = append(released.kids, pidfd)
	released.mu.Unlock()
}

// reapReleased reaps the released children that have exited, and lets go
// of those that another reaped (the Registry of this process that
// adopted their job, say).
func reapReleased() {
	released.mu.Lock()
	defer released.mu.Unlock()
	kept := released.kids[:0]
	for _, f := range released.kids {
		if unreaped(f) {
			kept = append(kept, f)
		} else {
			f.Close()
		}
	}
	clear(released.kids[len(kept):])
	released.kids = kept
}

// unreaped reaps the child of pidfd f if it has exited, and reports
// whether it is still to be reaped: alive, or not known to be gone.
func unreaped(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	alive := false
	rc.Control(func(fd uintptr) {
		var info unix.Siginfo
		for {
			err := unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG, nil)
			if err == unix.EINTR {
				continue
			}
			// With WNOHANG, a child that has not exited leaves info
			// zero; ECHILD: it was reaped already.
			alive = err == nil && info.Signo == 0
			return
		}
	})
	return alive
}

// awaitKeeper waits until the keeper of a job whose shell has ended has
// exited, or the deadline passes: the keeper is process pid if that is
// still the one that started at start. Its exit means that the job's
// pipe is at its end and the keeper copied all of it to the output file.
// The deadline, if zero, is set to keeperWait from now. A keeper that
// has exited is reaped if it is the host's child (a Registry of this
// process started it, then Detach released it). awaitKeeper reports
// whether the keeper is gone (or was never there); an error says that it
// cannot tell now (no descriptor left).
func awaitKeeper(pid int, start uint64, deadline *time.Time) (bool, error) {
	if pid <= 0 {
		return true, nil // a record of a version without keepers
	}
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err == unix.ESRCH || err == unix.EINVAL {
		return true, nil
	}
	if err != nil {
		return false, fmt.Errorf("pidfd_open: %w", err)
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	// Checked once the pidfd pins the process, as in adoptProcess.
	st, _, err := procStart(pid)
	switch {
	case err == errGone, err == nil && st != start:
		return true, nil // gone; its PID is another's now
	case err != nil:
		return false, err
	}
	rc, err := f.SyscallConn()
	if err != nil {
		return false, err
	}
	if !pidfdExited(f) {
		if deadline.IsZero() {
			*deadline = time.Now().Add(keeperWait)
		}
		// A pidfd turns readable when its process exits; the read
		// deadline ends the wait.
		f.SetReadDeadline(*deadline)
		rc.Read(func(fd uintptr) bool {
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, _ := unix.Poll(pfd, 0)
			return n > 0
		})
	}
	if !pidfdExited(f) {
		return false, nil
	}
	rc.Control(func(fd uintptr) {
		var info unix.Siginfo
		for unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG, nil) == unix.EINTR {
		}
	})
	return true, nil
}

// stopLeftovers stops what a job left behind that ended while no host
// watched it: the processes of its cgroup (one in the registry's folder,
// which is removed), or those that carry its marker, started since its
// shell. It returns how many it found.
func stopLeftovers(rec *record, cgs *cgroups) int {
	if rec.Cgroup != "" {
		if !cgs.owns(string(rec.Cgroup)) {
			return 0 // a record is data: another folder is not the registry's to kill
		}
		return killCgroupTree(string(rec.Cgroup))
	}
	return stopMarked(rec)
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
