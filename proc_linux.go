package bgjob

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const canSpawn = true

// procOS is what a Linux process adds to the Unix one: the shell's pidfd,
// how an adopted shell is watched, and what holds the job's tree.
type procOS struct {
	pidfd    *os.File // the shell's pidfd, if the kernel gave one
	pidfdNum int      // its number, or -1
	polled   bool     // pidfd is in the runtime's poller

	// adopted marks a process that a durable Registry found running at
	// New: not its child, so it is watched through its pidfd and its
	// exit code comes from the exit marker in the folder markerDir.
	adopted   bool
	markerDir string

	// The job's tree: its cgroup, handed back to cgs once empty; or,
	// with cgroup "", the shell's session and the processes started
	// since since (clock ticks after boot) whose environment holds
	// marker.
	cgroup    string
	cgs       *cgroups
	cg        *jobCgroup // the cgroup as the registry made it (not for an adopted job)
	cgroupRel string     // cgroup's path as /proc/PID/cgroup shows it (found by members)
	cgBase    cpuTimes   // an adopted job's: its cgroup's CPU time when the job got it
	marker    string
	since     uint64
	forks     uint64  // the system's count of created tasks as the job started (0: unknown)
	reaped    bool    // the shell was reaped: its PID may be reused
	keeper    *keeper // durable mode: the keeper of the job's output
	holder    *keeper // durable mode: the holder of an interactive job's input
	// seen holds a pidfd of each member seen while the job ends, and
	// sessions the sessions they were in: a process once seen stays in
	// the tree until it exits, even if it can no longer be recognised
	// (a dying process's environment cannot be read), and reapOrphans
	// reaps it if it dies the host's child.
	seen     map[int]*os.File
	sessions map[int]bool
}

// containAttr is the containment step of the spawn: the shell gets a
// session of its own and, if pl has a cgroup, is cloned straight into it
// (the returned function closes the cgroup's folder once the spawn is
// over); without a cgroup the job's environment gets its marker. pidfd
// receives the shell's pidfd.
func containAttr(pl *plan, pidfd *int) (*syscall.SysProcAttr, []string, func(), error) {
	sys := &syscall.SysProcAttr{Setsid: true, PidFD: pidfd}
	if g := pl.cg; g != nil {
		sys.UseCgroupFD, sys.CgroupFD = true, g.fd
		return sys, pl.env, func() {}, nil
	}
	env := pl.env
	if pl.marker != "" {
		env = append(slices.Clip(env), pl.marker)
		// Taken before the fork: every process of the job starts after
		// this tick (a tick earlier, for the rounding). The count of
		// created tasks is the last sample, however old, which only
		// makes newPIDsAbove more careful; settle refreshes it.
		pl.since, pl.forks = bootTicks()-1, lastForkCount()
	}
	return sys, env, func() {}, nil
}

// noCgroupSpawn reports whether a spawn into a cgroup failed because this
// kernel cannot clone into one (clone3 or CLONE_INTO_CGROUP missing,
// before Linux 5.7); the spawn is then tried again without.
func noCgroupSpawn(err error) bool {
	return errors.Is(err, unix.ENOSYS) || errors.Is(err, unix.EINVAL) || errors.Is(err, unix.EOPNOTSUPP)
}

// contain records in p what holds its tree, as pl placed it.
func (p *process) contain(pl *plan) {
	if g := pl.cg; g != nil {
		p.cgroup, p.cgs, p.cg = g.dir, pl.cgs, g
		return
	}
	p.marker, p.since, p.forks = pl.marker, pl.since, pl.forks
}

// settle does what the end of the job's containment needs, in its
// supervisor as the job starts to run, so that it overlaps the job rather
// than delaying its launch: with a cgroup, it does the registry's cgroup
// housekeeping; without, it refreshes the sample of the system's count
// of created tasks (see newPIDsAbove).
func (p *process) settle() {
	if p.cgroup != "" {
		if p.cgs != nil {
			p.cgs.tidy()
		}
		return
	}
	if p.marker != "" {
		// The spawn took the job's start marks (containAttr); refresh
		// the sample of created tasks for the next launches, here, off
		// their path.
		recentForkCount()
	}
}

// bootTicks returns the time since boot in clock ticks (USER_HZ, 100 a
// second on Linux), the unit of a process's start time in /proc.
func bootTicks() uint64 {
	var ts unix.Timespec
	if unix.ClockGettime(unix.CLOCK_BOOTTIME, &ts) != nil {
		return 1
	}
	return uint64(ts.Sec)*100 + uint64(ts.Nsec)/1e7
}

// forkSample caches the system's count of created tasks (forkCount), which
// is slow to read, for recentForkCount.
var forkSample struct {
	mu sync.Mutex
	at time.Time
	n  uint64
}

// forkSampleAge is how old recentForkCount's answer may be.
const forkSampleAge = 100 * time.Millisecond

// lastForkCount returns the last sample of the count of tasks the system
// had created, however old (never more than the count now), without
// reading it: 0 if there is none yet.
func lastForkCount() uint64 {
	forkSample.mu.Lock()
	defer forkSample.mu.Unlock()
	return forkSample.n
}

// recentForkCount returns the count of tasks the system had created at
// most forkSampleAge ago: never more than the count now. It returns 0
// when unknown.
func recentForkCount() uint64 {
	forkSample.mu.Lock()
	defer forkSample.mu.Unlock()
	if now := time.Now(); now.Sub(forkSample.at) > forkSampleAge {
		if n, ok := forkCount(); ok {
			forkSample.at, forkSample.n = now, n
		} else {
			return 0
		}
	}
	return forkSample.n
}

// containment says what holds p's tree: its cgroup's folder, or its
// session and the marker in its environment.
func (p *process) containment() (Containment, string) {
	if p.cgroup != "" {
		return ContainCgroup, p.cgroup
	}
	return ContainSession, p.marker
}

// watchPidfd keeps the pidfd that the spawn gave (pidfd < 0: none). With
// poll set it must go into the runtime's poller, so it is made
// non-blocking; a pidfd that cannot be is dropped.
func (p *process) watchPidfd(pidfd int, poll bool) {
	p.pidfdNum = -1
	if pidfd < 0 {
		return
	}
	if !poll || unix.SetNonblock(pidfd, true) == nil {
		p.pidfd, p.pidfdNum, p.polled = os.NewFile(uintptr(pidfd), "pidfd"), pidfd, poll
	} else {
		unix.Close(pidfd)
	}
}

// keep gives p the keeper of its output, if it has one.
func (p *process) keep(k *keeper) { p.keeper = k }

// holdInput gives p the holder of its input, if it has one (durable
// mode), to be reaped at its end.
func (p *process) holdInput(in *inputPlan) { p.holder = in.holder }

// holderOf returns the PID of p's input holder, or 0.
func (p *process) holderOf() int {
	if p.holder == nil {
		return 0
	}
	return p.holder.pid
}

// keeperOf returns the PID of p's keeper, or 0.
func (p *process) keeperOf() int {
	if p.keeper == nil {
		return 0
	}
	return p.keeper.pid
}

// releasable reports whether a wait on p can be ended by unwatch: it
// waits on a pidfd.
func (p *process) releasable() bool { return p.pidfd != nil }

// unwatch ends a wait on the process (see wait), for Detach.
func (p *process) unwatch() {
	if p.polled {
		p.pidfd.SetReadDeadline(time.Unix(1, 0))
	}
}

// reap collects the shell's exit status; see platformProcess.
func (p *process) reap() (int, error) {
	p.reaped = true
	if p.adopted {
		return reapAdopted(p)
	}
	return p.reapChild()
}

// close frees the pidfd. Once the shell was reaped (its tree is empty by
// then), the job's cgroup goes back to be removed; a released job keeps
// it, and the registry lets go of what it held open of it.
//
// A released job's shell and keeper, when they are the host's children,
// are handed to noteReleased with their pidfds, so that the Registries of
// the process reap them once they have exited: nothing else would, and
// each would stay a zombie for the life of the process.
func (p *process) close() {
	switch {
	case p.pidfd == nil:
	case !p.reaped && !p.adopted:
		noteReleased(p.pidfd) // the host's child, released
	default:
		p.pidfd.Close()
	}
	p.pidfd = nil
	switch k := p.keeper; {
	case k == nil:
	case !p.reaped:
		// Released: the keeper takes the output over when the
		// lifeline closes.
		k.release()
	case p.adopted:
		// Adopted, and exited (the reader waited for it), unless the
		// drain's grace ran out: it then finishes its copy on its own.
		// One that the host released earlier is in noteReleased's
		// hands.
		k.reap(false)
	default:
		k.stop()
	}

	// The input's holder ends with the job's wrapper; a released job
	// keeps it.
	switch h := p.holder; {
	case h == nil:
	case !p.reaped:
		h.release()
	default:
		h.stop()
	}

	for _, f := range p.seen {
		f.Close()
	}
	switch {
	case p.cgs == nil:
	case !p.reaped:
		if p.cg != nil {
			p.cgs.release(p.cg)
		}
	case p.cg != nil:
		p.cgs.recycle(p.cg)
	case p.cgroup != "":
		p.cgs.retire(p.cgroup)
	}
}

// wait blocks until the shell has exited, without reaping it. With a
// pidfd the wait parks in the runtime's poller and holds no thread.
//
// Detach ends the wait early by moving the pidfd's read deadline into the
// past; wait then returns errReleased.
func (p *process) wait() error {
	if p.adopted {
		return p.waitAdopted()
	}
	if p.polled && canWaitPidfd(p.pidfdNum) {
		rc, err := p.pidfd.SyscallConn()
		if err == nil {
			var werr error
			err = rc.Read(func(fd uintptr) bool {
				var exited bool
				exited, werr = peekExit(int(fd))
				return exited || werr != nil
			})
			if err == nil {
				return werr
			}
			// The pidfd was closed or its deadline moved by Detach.
			return errReleased
		}
	}
	for {
		var info unix.Siginfo
		err := unix.Waitid(unix.P_PID, p.pid, &info, unix.WEXITED|unix.WNOWAIT, nil)
		if err != unix.EINTR {
			return err
		}
	}
}

// member is a live process of a job's tree.
type member struct{ pid, pgrp, session int }

// members returns the live processes of the job's tree: those of its
// cgroup, or without one, those of its session and those that carry its
// marker. Zombies are not members: they hold nothing but a PID. Nor is the
// host, which a hostile job may have moved into its cgroup.
//
// A PID is only a name: the process found under it may exit and the PID
// go to another job's process at any moment (pid_max is 32768 on many
// machines). So each member is pinned by a pidfd first and recognised
// after: a process that is alive through its pidfd once its test passed
// is the one the test saw (see admit).
func (p *process) members() []member {
	var buf [512]byte
	self := os.Getpid()
	if p.cgroup != "" {
		if p.cgroupRel == "" {
			p.cgroupRel = cgroupPath(p.cgroup)
		}
		pids := cgroupMembers(p.cgroup)
		ms := make([]member, 0, len(pids))
		for _, pid := range pids {
			if pid == self {
				continue
			}
			if m, ok := p.admit(pid, buf[:], p.inCgroup); ok {
				ms = append(ms, m)
			}
		}
		return ms
	}
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	// Every process of the job was created after its shell. Unless the
	// PIDs may have wrapped around since, those have higher PIDs, and
	// the rest need not be read.
	from := 0
	if p.newPIDsAbove() {
		from = p.pid
	}
	// The shell's session is the job's while the shell, not yet reaped,
	// holds its ID. Once it is reaped the ID may be another job's: its
	// shell may have been given the same PID. It is still the job's if a
	// process seen before, and alive now, is in it: a session's ID is not
	// handed out again while a process is in it.
	pinned := !p.reaped && !p.adopted
	marked := func(name string, st procStat) bool {
		return p.marker != "" && st.start >= p.since && hasMarker(name, p.marker)
	}
	var ms []member
	var bySession []int
	for _, name := range names {
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		pid, err := strconv.Atoi(name)
		if err != nil || pid < from || pid == self {
			continue
		}
		st, ok := readStat(name, buf[:])
		if !ok || !st.live() {
			continue
		}
		switch {
		case marked(name, st):
			if m, ok := p.admit(pid, buf[:], marked); ok {
				ms = append(ms, m)
			}
		case st.session == p.pid && p.pid > 0:
			bySession = append(bySession, pid)
		}
	}
	if len(bySession) > 0 && !pinned {
		pinned = p.sessionHeld(buf[:])
	}
	if pinned {
		inSession := func(_ string, st procStat) bool { return st.session == p.pid }
		for _, pid := range bySession {
			if m, ok := p.admit(pid, buf[:], inSession); ok {
				ms = append(ms, m)
			}
		}
	}
	return ms
}

// admit returns the member that pid is if test says it is one of the
// job's, and keeps a pidfd of it in seen. The test runs while a pidfd
// pins the process, and the process must still be alive after it: then
// what the test read under the PID was that process's.
func (p *process) admit(pid int, buf []byte, test func(name string, st procStat) bool) (member, bool) {
	f := p.seen[pid]
	if f != nil && pidfdExited(f) {
		// The process seen under this PID is gone; the PID may be
		// another's now.
		f.Close()
		delete(p.seen, pid)
		f = nil
	}
	fresh := f == nil
	if fresh {
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			return member{}, false
		}
		f = os.NewFile(uintptr(fd), "pidfd")
	}
	name := strconv.Itoa(pid)
	st, ok := readStat(name, buf)
	if !ok || !st.live() || !test(name, st) || pidfdExited(f) {
		if fresh {
			f.Close()
		}
		return member{}, false
	}
	if fresh {
		if p.seen == nil {
			p.seen = make(map[int]*os.File)
		}
		p.seen[pid] = f
	}
	if p.sessions == nil {
		p.sessions = make(map[int]bool)
	}
	p.sessions[st.session] = true
	return member{pid, st.pgrp, st.session}, true
}

// sessionHeld reports whether a process seen before, and alive now, is in
// the shell's session, which is then still the job's.
func (p *process) sessionHeld(buf []byte) bool {
	for pid, f := range p.seen {
		if st, ok := readStat(strconv.Itoa(pid), buf); ok && st.live() && st.session == p.pid && !pidfdExited(f) {
			return true
		}
	}
	return false
}

// inCgroup reports whether the process name is in the job's cgroup or
// below it, as its /proc/PID/cgroup says.
func (p *process) inCgroup(name string, _ procStat) bool {
	return p.cgroupRel != "" && cgroupOf(name, p.cgroupRel)
}

// newPIDsAbove reports whether every process created since the job's
// shell has a PID above the shell's: the last PID handed out is above it,
// and too few tasks were created since (and exist now, each holding a
// PID the allocator skips) for the allocator to have gone round pid_max.
func (p *process) newPIDsAbove() bool {
	if p.forks == 0 || p.pid <= 0 {
		return false
	}
	forks, ok := forkCount()
	if !ok || forks < p.forks {
		return false
	}
	b, err := os.ReadFile("/proc/loadavg") // "0.20 0.18 0.12 1/80 11206": tasks, last PID
	if err != nil {
		return false
	}
	f := strings.Fields(string(b))
	if len(f) < 5 {
		return false
	}
	_, total, _ := strings.Cut(f[3], "/")
	tasks, err1 := strconv.Atoi(total)
	last, err2 := strconv.Atoi(f[4])
	max := pidMax()
	if err1 != nil || err2 != nil || max == 0 || last < p.pid {
		return false
	}
	return forks-p.forks+uint64(tasks) < uint64(max-p.pid)
}

// forkCount returns how many tasks (processes and threads) the system has
// created since boot: the "processes" line of /proc/stat.
func forkCount() (uint64, bool) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	i := bytes.Index(b, []byte("\nprocesses "))
	if i < 0 {
		return 0, false
	}
	v, _, _ := bytes.Cut(b[i+len("\nprocesses "):], []byte("\n"))
	n, err := strconv.ParseUint(string(v), 10, 64)
	return n, err == nil
}

// pidMax is the system's pid_max, or 0 if unknown.
var pidMax = sync.OnceValue(func() int {
	b, err := os.ReadFile("/proc/sys/kernel/pid_max")
	if err != nil {
		return 0
	}
	n, _ := strconv.Atoi(strings.TrimSpace(string(b)))
	return n
})

// procStat is what members (and a listing) needs of /proc/PID/stat.
type procStat struct {
	state               byte
	ppid, pgrp, session int
	start               uint64 // clock ticks after boot
}

// live reports whether the process is neither a zombie nor dead.
func (st procStat) live() bool { return st.state != 'Z' && st.state != 'X' }

// readStat reads a process's state, group, session and start time from
// /proc/PID/stat.
func readStat(pid string, buf []byte) (procStat, bool) {
	fd, err := unix.Open("/proc/"+pid+"/stat", unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return procStat{}, false
	}
	n, err := unix.Read(fd, buf)
	unix.Close(fd)
	if err != nil || n <= 0 {
		return procStat{}, false
	}
	b := buf[:n]
	// The command name may hold anything, ')' too: the fields start
	// after its last ')'. Then: state (3), ppid, pgrp, session, ...,
	// starttime (22).
	i := bytes.LastIndexByte(b, ')')
	if i < 0 || i+2 >= len(b) {
		return procStat{}, false
	}
	f := bytes.Fields(b[i+2:])
	if len(f) < 20 {
		return procStat{}, false
	}
	ppid, _ := strconv.Atoi(string(f[1]))
	pg, err1 := strconv.Atoi(string(f[2]))
	sid, err2 := strconv.Atoi(string(f[3]))
	start, err3 := strconv.ParseUint(string(f[19]), 10, 64)
	return procStat{state: f[0][0], ppid: ppid, pgrp: pg, session: sid, start: start}, err1 == nil && err2 == nil && err3 == nil
}

// hasMarker reports whether the environment process pid started with
// holds the entry marker. Another user's process cannot be read, and so
// is never taken for the job's.
func hasMarker(pid, marker string) bool {
	b, err := os.ReadFile("/proc/" + pid + "/environ")
	if err != nil {
		return false
	}
	for len(b) > 0 {
		e, rest, _ := bytes.Cut(b, []byte{0})
		if string(e) == marker {
			return true
		}
		b = rest
	}
	return false
}

// signal sends SIGTERM, or SIGKILL if kill is set, to every process group
// of the job's tree: the shell's own (while the shell, not yet reaped,
// pins its ID) and that of each member. A job with a cgroup is killed
// with cgroup.kill, which reaches every process at once, forks included.
// A tree that is already gone is not an error.
func (p *process) signal(kill bool) error {
	if kill && p.cgroup != "" {
		home := ""
		if p.cgs != nil {
			home = p.cgs.home
		}
		return cgroupKill(p.cgroup, home)
	}
	sig := unix.SIGTERM
	if kill {
		sig = unix.SIGKILL
	}
	groups := make([]int, 0, 4)
	if !p.reaped && !p.adopted {
		groups = append(groups, p.pid) // the unreaped shell holds the ID
	}
	// Never the host's own group: no process of the job can be in it
	// (it is of another session), unless a hostile job moved the host
	// into its cgroup, and the host is not to be stopped with it.
	own := unix.Getpgrp()
	for _, m := range p.members() {
		if m.pgrp > 0 && m.pgrp != own && !slices.Contains(groups, m.pgrp) {
			groups = append(groups, m.pgrp)
		}
	}
	var first error
	for _, g := range groups {
		if err := unix.Kill(-g, sig); err != nil && err != unix.ESRCH && first == nil {
			first = err
		}
	}
	// And each process seen before, through its pidfd, wherever it went.
	for _, f := range p.seen {
		if rc, err := f.SyscallConn(); err == nil {
			rc.Control(func(fd uintptr) { unix.PidfdSendSignal(int(fd), sig, nil, 0) })
		}
	}
	return first
}

// leftovers returns how many processes of the job's tree are still alive
// after the shell exited.
func (p *process) leftovers() int {
	switch {
	case len(p.seen) > 0:
	case p.cg != nil && !populatedAt(p.cg.events):
		// The cgroup says it is empty: nothing to list.
		return 0
	case p.cgroup == "" && lastPID() == p.pid:
		// No process was created since the job's shell (a command
		// that forks nothing), which has exited: there is nothing to
		// look for.
		return 0
	}
	return len(p.tree())
}

// populatedAt reports whether the open cgroup.events file f says
// "populated 1", reading it again from its start; if it cannot be read,
// it says so too (then the cgroup is listed).
func populatedAt(f *os.File) bool {
	var buf [128]byte
	n := preadOnce(f, buf[:])
	if n <= 0 {
		return true
	}
	return bytes.Contains(buf[:n], []byte("populated 1"))
}

// preadOnce reads a small kernel file (cgroup.events, cpu.stat) from its
// start with one pread, which the kernel answers whole; os.File.ReadAt
// would make a second to find the end. It returns the bytes read, 0 on
// an error.
func preadOnce(f *os.File, buf []byte) int {
	rc, err := f.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	rc.Control(func(fd uintptr) {
		for {
			m, err := unix.Pread(int(fd), buf, 0)
			if err == unix.EINTR {
				continue
			}
			n = max(m, 0)
			return
		}
	})
	return n
}

// lastPID returns the last PID handed out in the host's PID namespace, or
// 0 if unknown. The file stays open: each job's end reads it.
func lastPID() int {
	f := nsLastPID()
	if f == nil {
		return 0
	}
	var buf [32]byte
	n := preadOnce(f, buf[:])
	pid, _ := strconv.Atoi(strings.TrimSpace(string(buf[:n])))
	return pid
}

// nsLastPID is /proc/sys/kernel/ns_last_pid, opened once.
var nsLastPID = sync.OnceValue(func() *os.File {
	f, _ := os.Open("/proc/sys/kernel/ns_last_pid")
	return f
})

// tree returns the PIDs of the live processes of the job's tree: its
// members, and those seen before that have not exited.
func (p *process) tree() []int {
	ms := p.members()
	pids := make([]int, 0, len(ms)+len(p.seen))
	for _, m := range ms {
		pids = append(pids, m.pid)
	}
	for pid, f := range p.seen {
		if !slices.Contains(pids, pid) && !pidfdExited(f) {
			pids = append(pids, pid)
		}
	}
	return pids
}

// pidfdExited reports whether the process of pidfd f has exited.
func pidfdExited(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return true
	}
	exited := true
	rc.Control(func(fd uintptr) {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, err := unix.Poll(pfd, 0)
		exited = err != nil || n > 0
	})
	return exited
}

// awaitEmpty waits until the job's tree has no live process or the
// deadline passes, and returns the number still alive. It waits on a
// pidfd of each member, so it wakes when they die rather than polling.
func (p *process) awaitEmpty(deadline time.Time) int {
	n := awaitGone(p.tree, deadline)
	if n == 0 && p.cgroup != "" && p.cgs != nil && populated(filepath.Join(p.cgroup, "cgroup.events")) && hostIn(p.cgroup) {
		leave(p.cgroup, p.cgs.home) // a hostile job moved the host in
	}
	if n == 0 && p.cgroup != "" && !awaitUnpopulated(p.cgroup, deadline) {
		return 1 // a process still exiting
	}
	return n
}

// awaitGone waits until live returns no process or the deadline passes,
// and returns how many live last returned. It waits on each process's
// pidfd in turn, and looks again once they are gone (a process may have
// forked meanwhile); without pidfds it looks at growing intervals.
func awaitGone(live func() []int, deadline time.Time) int {
	for {
		pids := live()
		if len(pids) == 0 || !time.Now().Before(deadline) {
			return len(pids)
		}
		for _, pid := range pids {
			if !waitDeath(pid, deadline) {
				return awaitPolling(live, deadline)
			}
		}
	}
}

// deadlineIn returns the real time d from now.
func deadlineIn(d time.Duration) time.Time { return time.Now().Add(d) }

// waitDeath waits until process pid has exited (a zombie counts) or the
// deadline passes. It returns false if it cannot wait on a pidfd.
func waitDeath(pid int, deadline time.Time) bool {
	fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
	if err == unix.ESRCH {
		return true
	}
	if err != nil {
		return false
	}
	f := os.NewFile(uintptr(fd), "pidfd")
	defer f.Close()
	rc, err := f.SyscallConn()
	if err != nil {
		return false
	}
	f.SetReadDeadline(deadline)
	// A pidfd turns readable when its process exits.
	rc.Read(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(pfd, 0)
		if n > 0 && subreaper.Load() {
			// An orphan of the job re-parented to the host (a
			// subreaper) is reaped here; anyone else's process is not
			// the host's child, and WNOHANG leaves it.
			var info unix.Siginfo
			unix.Waitid(unix.P_PIDFD, int(fd), &info, unix.WEXITED|unix.WNOHANG, nil)
		}
		return n > 0
	})
	return true
}

// subreaper is set once the host has become a child subreaper.
var subreaper atomic.Bool

func enableSubreaper() error {
	if err := unix.Prctl(unix.PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0); err != nil {
		return err
	}
	subreaper.Store(true)
	return nil
}

// reapOrphans reaps the zombies of the job's group that were re-parented
// to the host because it is a subreaper. It only waits for members of
// this group, and only once none of them is alive, so it never takes a
// child that belongs to anyone else.
//
// The job's other processes that died re-parented to the host are
// reaped too: those seen alive during its end (through their pidfds), and
// with a cgroup, every zombie child of the host that died in it.
func (p *process) reapOrphans() {
	if !subreaper.Load() {
		return
	}
	for pid, f := range p.seen {
		var info unix.Siginfo
		unix.Waitid(unix.P_PIDFD, int(f.Fd()), &info, unix.WEXITED|unix.WNOHANG, nil)
		f.Close()
		delete(p.seen, pid)
	}
	// A zombie of the job that died after its parent, unseen: it still
	// names its cgroup in /proc/PID/cgroup, and its session, which only
	// the job's processes can be in, in /proc/PID/stat.
	if p.cgroup != "" {
		if rel := cgroupPath(p.cgroup); rel != "" {
			reapZombieChildren(func(pid string, _ int) bool {
				cg, _ := os.ReadFile("/proc/" + pid + "/cgroup")
				return bytes.Contains(cg, []byte("0::"+rel+"\n"))
			})
		}
	} else {
		reapZombieChildren(func(_ string, sid int) bool { return sid == p.pid || p.sessions[sid] })
	}
	for {
		var ws unix.WaitStatus
		pid, err := unix.Wait4(-p.pid, &ws, unix.WNOHANG, nil)
		if err == unix.EINTR {
			continue
		}
		if pid <= 0 || err != nil {
			return
		}
	}
}

// dupCloexec duplicates fd; the copy closes on exec.
func dupCloexec(fd int) (int, error) { return unix.FcntlInt(uintptr(fd), unix.F_DUPFD_CLOEXEC, 0) }

// rawPipe makes a pipe whose ends close on exec.
func rawPipe(p *[2]int) error { return unix.Pipe2(p[:], unix.O_CLOEXEC) }

// procStart returns the start time of process pid (field 22 of
// /proc/PID/stat, in clock ticks after boot) and whether it is a zombie.
// It fails with errGone if there is no such process, and with the error
// itself if it cannot tell (no descriptor left, say).
func procStart(pid int) (start uint64, zombie bool, err error) {
	if pid <= 0 {
		return 0, false, errGone
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, unix.ESRCH) {
		return 0, false, errGone
	}
	if err != nil {
		return 0, false, err
	}
	// The fields after the command name, which may hold ')': state is
	// field 3, starttime field 22.
	i := bytes.LastIndexByte(b, ')')
	f := bytes.Fields(b[min(i+2, len(b)):])
	if i < 0 || len(f) < 20 {
		return 0, false, fmt.Errorf("/proc/%d/stat: malformed", pid)
	}
	st, err := strconv.ParseUint(string(f[19]), 10, 64)
	if err != nil {
		return 0, false, fmt.Errorf("/proc/%d/stat: %w", pid, err)
	}
	return st, f[0][0] == 'Z' || f[0][0] == 'X', nil
}
