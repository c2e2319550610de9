package bgjob

import (
	"bufio"
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
	"unsafe"

	"github.com/zeebo/blake3"
	"golang.org/x/sys/unix"
)

// A job's containment on Linux: a cgroup v2 of its own where the host can
// make one, else its session plus a marker in its environment.
//
// The registry makes a folder of its own in a cgroup v2 hierarchy
// (cgroups.dir) and each job a cgroup in it, which the job's shell is
// spawned straight into (clone3 with CLONE_INTO_CGROUP), so that no
// process of the job ever runs outside it. A stop signals every process
// group in the cgroup, then kills the cgroup (cgroup.kill); the job is
// done when the cgroup is empty. A cgroup costs a mkdir and an rmdir,
// done while some job runs (tidy, from the job's settle), never on a
// launch's path: a launch takes a cgroup made ahead or one a job left
// empty and untouched (see cgroups), and hands its emptied one back. A job
// with limits gets a new cgroup of its own, which goes when it ends.
//
// Without a cgroup, the job's tree is its session (every process group
// in it) and every process whose environment holds the job's marker,
// BGJOB_JOB=TOKEN.N, which survives setsid: both are found in /proc.

// markerVar is the environment variable that marks the processes of a job
// that has no cgroup.
const markerVar = "BGJOB_JOB"

// cgroups is a registry's containment root: its cgroup folder, or the
// token of its markers when it has none.
//
// Job cgroups are pooled. A cgroup that a job left empty and untouched is
// the next launch's: a mkdir and an rmdir per job would cost more than the
// rest of a short job's launch. "Untouched" is what an inotify watch on
// each cgroup's folder tells: a job may write its own cgroup's files
// (freeze it, change its type or limits, make cgroups inside it, chmod
// them), and any such change (any event but the kernel's own notices on
// its *.events files) has the cgroup removed rather than handed to
// another job. Without inotify, no cgroup is used twice.
type cgroups struct {
	dir    string // the registry's folder; "" when jobs get no cgroup
	prefix string // a random prefix of the job cgroups' names
	token  string // the registry's part of each marker
	log    *slog.Logger
	seq    atomic.Uint64
	off    atomic.Bool // set by disable: make no more job cgroups
	in     int         // the inotify instance watching the job cgroups, or -1 (a raw descriptor: never blocking)
	home   string      // the host's own cgroup folder at New, or "" if unknown
	guard  *guard      // memory mode: stops the jobs if the host dies
	ctl    controllers // the controllers the job cgroups have (see enableControllers)

	mu   sync.Mutex           // guards the fields below; taken after Registry.mu and job.mu, if at all
	free []*jobCgroup         // empty, untouched job cgroups, for the next launches
	dead []string             // job cgroups to remove
	byWD map[int32]*jobCgroup // the watched cgroups by watch descriptor
}

// maxFree bounds the pool of empty job cgroups a registry keeps.
const maxFree = 8

// jobCgroup is a job cgroup, with what a launch and the job's end need of
// it open already, so that neither opens a cgroup file on its way.
type jobCgroup struct {
	dir    string
	fd     int      // the folder, for clone3
	events *os.File // its cgroup.events, which tells when it is empty
	cpu    *os.File // its cpu.stat, for the job's usage; nil if it cannot be read
	base   cpuTimes // cpu.stat when the job got it (the jobs before used that)
	// last is cpu.stat as the job's end read it, once the cgroup was
	// empty (lastOK): the next job's base, read once for both.
	last    cpuTimes
	lastOK  bool
	wd      int32 // its inotify watch, or -1
	touched bool  // something other than the kernel changed it (guarded by cgroups.mu)
	reused  bool  // a job ran in it before: its memory.peak is not this job's
	limited bool  // limits were written to it: it is never reused
}

// closeFiles closes what g holds open.
func (g *jobCgroup) closeFiles() {
	if g.fd >= 0 {
		unix.Close(g.fd)
		g.fd = -1
	}
	if g.events != nil {
		g.events.Close()
		g.events = nil
	}
	if g.cpu != nil {
		g.cpu.Close()
		g.cpu = nil
	}
}

// openCgroups finds where the registry's jobs get cgroups (Config.Cgroup)
// and makes the registry's folder there. A folder that a dead host left
// behind is emptied (its processes killed) and removed. With Cgroup "" a
// hierarchy that cannot be written means no cgroups, which is not an
// error; with a path it is.
func openCgroups(c *Config) (*cgroups, error) {
	cg, err := openCgroupFolder(c)
	if err != nil || c.StateDir != "" {
		return cg, err // in durable mode, jobs outlive their host on purpose
	}
	if cg.guard, err = startGuard(cg.dir, markerVar+"="+cg.token+".", c.KillGrace); err != nil {
		cg.close()
		return nil, fmt.Errorf("bgjob: new: guard: %w", err)
	}
	return cg, nil
}

// openCgroupFolder is openCgroups but for the guard.
func openCgroupFolder(c *Config) (*cgroups, error) {
	var tok [8]byte
	rand.Read(tok[:])
	cg := &cgroups{token: hex.EncodeToString(tok[:]), prefix: hex.EncodeToString(tok[:4]), log: c.Logger, byWD: make(map[int32]*jobCgroup), in: -1}
	parent := c.Cgroup
	switch parent {
	case "off":
		return cg, nil
	case "":
		parent = ownCgroup()
		if parent == "" {
			return cg, nil
		}
	default:
		if _, err := os.Stat(filepath.Join(parent, "cgroup.procs")); err != nil {
			return nil, configError("Cgroup", "%s is not a cgroup v2 folder: %v", parent, err)
		}
	}
	reapDeadHosts(parent, c.Logger)
	dir := filepath.Join(parent, registryCgroupName(c.StateDir, cg.prefix))
	if err := os.Mkdir(dir, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		if c.Cgroup != "" {
			return nil, configError("Cgroup", "%v", err)
		}
		c.Logger.Debug("bgjob: no cgroup for jobs; they are contained by their session", "err", err)
		return cg, nil
	}
	cg.dir = dir
	cg.home = ownCgroup()
	cg.ctl = enableControllers(dir)
	if fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC); err == nil {
		cg.in = fd
	} else {
		c.Logger.Debug("bgjob: no inotify: job cgroups are not reused", "err", err)
	}
	return cg, nil
}

// registryCgroupName names a registry's folder: by the host's PID and
// start time and the registry's own random prefix (a host may run several
// registries), or, in durable mode, by the state directory, so that the
// next host on it finds the cgroups of the jobs it adopts.
func registryCgroupName(stateDir, prefix string) string {
	if stateDir != "" {
		sum := blake3.Sum256([]byte(stateDir))
		return "bgjob-state-" + hex.EncodeToString(sum[:8])
	}
	start, _, _ := procStart(os.Getpid())
	return "bgjob-" + strconv.Itoa(os.Getpid()) + "-" + strconv.FormatUint(start, 10) + "-" + prefix
}

// ownCgroup returns the folder of the host's own cgroup in a mounted
// cgroup v2 hierarchy, or "" if there is none.
func ownCgroup() string {
	b, err := os.ReadFile("/proc/self/cgroup")
	if err != nil {
		return ""
	}
	var path string
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "0::"); ok {
			path = rest
		}
	}
	if path == "" || strings.HasSuffix(path, " (deleted)") {
		return ""
	}
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// ID PARENT MAJ:MIN ROOT MOUNTPOINT OPTIONS [OPTIONAL...] - FSTYPE SOURCE SUPER
		fields := strings.Fields(sc.Text())
		i := slices.Index(fields, "-")
		if i < 5 || i+1 >= len(fields) || fields[i+1] != "cgroup2" {
			continue
		}
		root, mnt := unescapeMount(fields[3]), unescapeMount(fields[4])
		rel, ok := strings.CutPrefix(path, root)
		if !ok || (rel != "" && root != "/" && rel[0] != '/') {
			continue
		}
		return filepath.Join(mnt, rel)
	}
	return ""
}

// unescapeMount undoes the octal escapes (\040 for a blank, ...) of a
// path in /proc/self/mountinfo.
func unescapeMount(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}

// reapDeadHosts kills what the registries of hosts that are gone left in
// parent, and removes their folders. Only folders named as a memory-mode
// registry names its own (bgjob-PID-START-X) are touched, and only when no
// process with that PID and start time runs.
func reapDeadHosts(parent string, log *slog.Logger) {
	ents, err := os.ReadDir(parent)
	if err != nil {
		return
	}
	for _, e := range ents {
		pid, start, ok := parseHostCgroup(e.Name())
		if !ok || !e.IsDir() {
			continue
		}
		if st, _, err := procStart(pid); err != errGone && (err != nil || st == start) {
			continue // alive, or it cannot be told: left alone
		}
		dir := filepath.Join(parent, e.Name())
		n := killCgroupTree(dir)
		log.Warn("bgjob: removed the cgroup of a host that died", "folder", dir, "killed", n)
	}
}

// parseHostCgroup reads the PID and start time from a memory-mode
// registry's folder name, bgjob-PID-START-PREFIX.
func parseHostCgroup(name string) (pid int, start uint64, ok bool) {
	rest, ok := strings.CutPrefix(name, "bgjob-")
	if !ok {
		return 0, 0, false
	}
	p, s, ok := strings.Cut(rest, "-")
	if !ok {
		return 0, 0, false
	}
	s, _, _ = strings.Cut(s, "-")
	pid, err1 := strconv.Atoi(p)
	start, err2 := strconv.ParseUint(s, 10, 64)
	return pid, start, err1 == nil && err2 == nil && pid > 0
}

// killCgroupTree kills every process in the cgroup dir and its
// descendants, waits for them to die, and removes the folders. It returns
// how many processes it found alive.
func killCgroupTree(dir string) int {
	n := len(cgroupMembers(dir))
	if n > 0 || populated(filepath.Join(dir, "cgroup.events")) {
		cgroupKill(dir, "")
		deadline := deadlineIn(killWait)
		awaitGone(func() []int { return cgroupMembers(dir) }, deadline)
		awaitUnpopulated(dir, deadline)
	}
	removeCgroupTree(dir)
	return n
}

// removeCgroupTree removes the cgroup dir and its descendants, deepest
// first. A cgroup that is not empty stays.
func removeCgroupTree(dir string) {
	ents, _ := os.ReadDir(dir)
	for _, e := range ents {
		if e.IsDir() {
			removeCgroupTree(filepath.Join(dir, e.Name()))
		}
	}
	unix.Rmdir(dir)
}

// place is the containment step of a launch: it gives the job a cgroup
// (pl.cg) if the registry has a folder, and a marker (pl.marker) that goes
// into the job's environment if it ends up without one.
//
// Limits that the cgroup's controllers enforce are written to a new
// cgroup, and taken out of pl.limits; the rest stay there for the shell
// to set (see limitArgv). A job whose limits need a controller fails if
// it gets no cgroup.
func (c *cgroups) place(j *job, pl *plan) error {
	pl.marker = markerVar + "=" + c.token + "." + strconv.FormatUint(j.gen, 10)
	if c.dir == "" || c.off.Load() {
		return c.enforceableErr(pl.limits)
	}
	if c.ctl.covers(pl.limits) {
		g, err := c.makeLimited(pl.limits)
		if err != nil {
			return fmt.Errorf("cgroup limits: %w", err)
		}
		pl.cg = g
		pl.limits = c.ctl.rest(pl.limits)
		return nil
	}
	g, err := c.take()
	if err != nil {
		c.log.Warn("bgjob: no cgroup for the job; it is contained by its session", "id", j.id, "err", err)
		return c.enforceableErr(pl.limits)
	}
	pl.cg = g
	return nil
}

// take returns an empty job cgroup: one from the pool, or a new one. A
// pooled cgroup that something changed, or a process entered, while it
// waited (a job may write to its siblings' files) is dropped instead.
func (c *cgroups) take() (*jobCgroup, error) {
	c.noticeChanges()
	for {
		c.mu.Lock()
		var g *jobCgroup
		if n := len(c.free); n > 0 {
			g, c.free = c.free[n-1], c.free[:n-1]
		}
		if g != nil && g.touched {
			c.dropLocked(g)
			g = nil
			c.mu.Unlock()
			continue
		}
		c.mu.Unlock()
		if g == nil {
			return c.make()
		}
		if !populatedAt(g.events) {
			g.reused = true
			return g, nil
		}
		c.mu.Lock()
		c.dropLocked(g)
		c.mu.Unlock()
	}
}

// make makes a new job cgroup, opens it and its cgroup.events, and
// watches its folder.
func (c *cgroups) make() (*jobCgroup, error) {
	dir := filepath.Join(c.dir, c.prefix+"."+strconv.FormatUint(c.seq.Add(1), 10))
	if err := os.Mkdir(dir, 0o755); err != nil {
		return nil, err
	}
	fd, err := unix.Open(dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Rmdir(dir)
		return nil, err
	}
	events, err := os.Open(filepath.Join(dir, "cgroup.events"))
	if err != nil {
		unix.Close(fd)
		unix.Rmdir(dir)
		return nil, err
	}
	g := &jobCgroup{dir: dir, fd: fd, events: events, wd: -1}
	g.cpu, _ = os.Open(filepath.Join(dir, "cpu.stat"))
	if c.in >= 0 {
		const changes = unix.IN_MODIFY | unix.IN_ATTRIB | unix.IN_CREATE | unix.IN_DELETE | unix.IN_MOVED_FROM | unix.IN_MOVED_TO
		if wd, err := unix.InotifyAddWatch(c.in, dir, changes); err == nil {
			g.wd = int32(wd)
			c.mu.Lock()
			c.byWD[g.wd] = g
			c.mu.Unlock()
		}
	}
	return g, nil
}

// recycle takes back a job's cgroup once the job has ended and the cgroup
// is empty: into the pool if nothing but the kernel changed it, else to be
// removed (by tidy).
func (c *cgroups) recycle(g *jobCgroup) {
	c.noticeChanges()
	c.mu.Lock()
	reuse := g.wd >= 0 && !g.touched && !g.limited && len(c.free) < maxFree && !c.off.Load()
	c.mu.Unlock()
	if populatedAt(g.events) && hostIn(g.dir) {
		// The job moved the host into its cgroup (and so touched it).
		leave(g.dir, c.home)
	}
	if reuse {
		// Empty and not frozen: a job's freezing would have touched it,
		// but a cgroup whose last process is still exiting must wait.
		var buf [128]byte
		n := preadOnce(g.events, buf[:])
		reuse = bytes.Contains(buf[:n], []byte("populated 0")) && bytes.Contains(buf[:n], []byte("frozen 0"))
	}
	if reuse {
		// The next job's usage counts from here: from what the job's
		// end read, if it read the empty cgroup, whose counters no
		// longer move.
		if g.lastOK {
			g.base = g.last
		} else {
			g.base, _ = readCPUTimes(g.cpu)
		}
	}
	g.lastOK = false
	c.mu.Lock()
	defer c.mu.Unlock()
	if reuse {
		c.free = append(c.free, g)
		return
	}
	c.dropLocked(g)
}

// release lets go of the cgroup of a job that Detach released: the job
// runs on in it, and the next Registry finds it by its folder (see
// adoptProcess), so this one neither reuses nor removes it, but closes
// what it held open of it (the folder, cgroup.events, cpu.stat) and its
// watch. Without this, each released job kept a descriptor open for the
// life of the process.
func (c *cgroups) release(g *jobCgroup) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if g.wd >= 0 {
		delete(c.byWD, g.wd)
		if c.in >= 0 {
			unix.InotifyRmWatch(c.in, uint32(g.wd))
		}
		g.wd = -1
	}
	g.closeFiles()
}

// dropLocked has g removed by the next tidy; c.mu must be held.
func (c *cgroups) dropLocked(g *jobCgroup) {
	if g.wd >= 0 {
		delete(c.byWD, g.wd)
		if c.in >= 0 {
			unix.InotifyRmWatch(c.in, uint32(g.wd))
		}
		g.wd = -1
	}
	g.closeFiles()
	c.dead = append(c.dead, g.dir)
}

// noticeChanges reads the inotify events queued so far, without waiting,
// and marks the job cgroups that something other than the kernel changed.
// The kernel's own notices are changes of *.events files; a lost event
// (the queue overflowed) marks every cgroup.
func (c *cgroups) noticeChanges() {
	if c.in < 0 {
		return
	}
	var buf [4096]byte
	for {
		n, err := unix.Read(c.in, buf[:])
		if n <= 0 || err != nil {
			return
		}
		c.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			name := string(bytes.TrimRight(buf[off+unix.SizeofInotifyEvent:min(n, off+unix.SizeofInotifyEvent+int(ev.Len))], "\x00"))
			off += unix.SizeofInotifyEvent + int(ev.Len)
			switch {
			case ev.Mask&unix.IN_Q_OVERFLOW != 0:
				for _, g := range c.byWD {
					g.touched = true
				}
			case ev.Mask&unix.IN_MODIFY != 0 && ev.Mask&^(unix.IN_MODIFY|unix.IN_ISDIR) == 0 && strings.HasSuffix(name, ".events"):
				// The kernel's notice that the cgroup changed state.
			default:
				if g := c.byWD[ev.Wd]; g != nil {
					g.touched = true
				}
			}
		}
		c.mu.Unlock()
	}
}

// retire has the cgroup dir, which no jobCgroup stands for (an adopted
// job's), removed by the next tidy.
func (c *cgroups) retire(dir string) {
	c.mu.Lock()
	c.dead = append(c.dead, dir)
	c.mu.Unlock()
}

// tidy removes the job cgroups to remove and, if the pool is empty, makes
// one for the next launch. A job's settle calls it, while the job runs.
func (c *cgroups) tidy() {
	if c.dir == "" {
		return
	}
	c.mu.Lock()
	dead, empty := c.dead, len(c.free) == 0
	c.dead = nil
	c.mu.Unlock()
	var stuck []string
	for _, d := range dead {
		if err := unix.Rmdir(d); err == unix.EBUSY || err == unix.ENOTEMPTY {
			if !hasSubCgroups(d) {
				stuck = append(stuck, d) // a process stuck in the kernel: later
				continue
			}
			removeCgroupTree(d) // the job made cgroups inside its own
		}
	}
	var g *jobCgroup
	if empty && !c.off.Load() {
		g, _ = c.make() // none: the next launch makes its own
	}
	c.mu.Lock()
	c.dead = append(c.dead, stuck...)
	if g != nil {
		c.free = append(c.free, g)
	}
	c.mu.Unlock()
}

// close removes the registry's folder, once its jobs are done: the
// retired job cgroups, the spare and the folder itself. In durable mode
// the folder stays while it holds the cgroups of released jobs.
func (c *cgroups) close() {
	if c.guard != nil {
		c.guard.dismiss()
		c.guard = nil
	}
	if c.dir == "" {
		return
	}
	c.mu.Lock()
	for _, g := range c.free {
		c.dropLocked(g)
	}
	dead := c.dead
	c.free, c.dead = nil, nil
	c.mu.Unlock()
	if c.in >= 0 {
		unix.Close(c.in)
		c.in = -1
	}
	for _, d := range dead {
		awaitUnpopulated(d, deadlineIn(killWait))
		if err := unix.Rmdir(d); err != nil && err != unix.ENOENT {
			c.log.Warn("bgjob: remove job cgroup", "folder", d, "err", err)
		}
	}
	unix.Rmdir(c.dir) // fails while released jobs' cgroups are in it
}

// cgroupMembers returns the processes of the cgroup dir and of its
// descendants (a job may make cgroups inside its own). Zombies are not
// members: a process leaves its cgroup when it exits.
func cgroupMembers(dir string) []int {
	var pids []int
	var walk func(string)
	walk = func(d string) {
		b, err := os.ReadFile(filepath.Join(d, "cgroup.procs"))
		if err != nil {
			return
		}
		for _, f := range bytes.Fields(b) {
			if pid, err := strconv.Atoi(string(f)); err == nil {
				pids = append(pids, pid)
			}
		}
		if !hasSubCgroups(d) {
			return
		}
		ents, _ := os.ReadDir(d)
		for _, e := range ents {
			if e.IsDir() {
				walk(filepath.Join(d, e.Name()))
			}
		}
	}
	walk(dir)
	return pids
}

// hasSubCgroups reports whether the cgroup dir has descendants, from its
// cgroup.stat, without listing the folder.
func hasSubCgroups(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.stat"))
	if err != nil {
		return true // unknown: look
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "nr_descendants "); ok {
			return strings.TrimSpace(v) != "0"
		}
	}
	return true
}

// cgroupKill kills every process of the cgroup dir and its descendants at
// once (cgroup.kill, Linux 5.14), or, where the kernel lacks it, each
// member in turn.
//
// A job that may write cgroup.procs of the host's cgroup (the same user, in
// a delegated hierarchy) could move the host into its own, and the kill
// would take the host with it: the host never kills a cgroup it is in. It
// goes back home first (home: its cgroup at New), or, if it cannot, kills
// the other members one by one.
func cgroupKill(dir, home string) error {
	if hostIn(dir) {
		if !leave(dir, home) {
			self := os.Getpid()
			for _, pid := range cgroupMembers(dir) {
				if pid != self {
					unix.Kill(pid, unix.SIGKILL)
				}
			}
			return fmt.Errorf("cgroup.kill: the host is in the job's cgroup %s and cannot leave it", dir)
		}
	}
	err := os.WriteFile(filepath.Join(dir, "cgroup.kill"), []byte("1"), 0)
	if err == nil {
		return nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("cgroup.kill: %w", err)
	}
	self := os.Getpid()
	for _, pid := range cgroupMembers(dir) {
		if pid != self {
			unix.Kill(pid, unix.SIGKILL)
		}
	}
	return nil
}

// owns reports whether dir is a job cgroup in the registry's folder.
func (c *cgroups) owns(dir string) bool {
	return c.dir != "" && filepath.Dir(filepath.Clean(dir)) == c.dir
}

// giveBack hands back the cgroup of a plan that was never carried out.
func (c *cgroups) giveBack(pl *plan) {
	if pl.cg != nil {
		c.recycle(pl.cg)
		pl.cg = nil
	}
}

// disable stops making cgroups, after a spawn into one failed in a way
// that says this kernel cannot (see noCgroupSpawn).
func (c *cgroups) disable(err error) {
	if !c.off.Swap(true) {
		c.log.Warn("bgjob: this kernel cannot spawn into a cgroup; jobs are contained by their session", "err", err)
	}
}

// clearExcept empties and removes the job cgroups in the registry's
// folder other than keep: in durable mode, the cgroups of jobs that ended
// (or whose records are gone) while no host watched them. Run by New,
// before the registry makes cgroups of its own.
func (c *cgroups) clearExcept(keep []string) {
	if c.dir == "" {
		return
	}
	ents, _ := os.ReadDir(c.dir)
	for _, e := range ents {
		dir := filepath.Join(c.dir, e.Name())
		if !e.IsDir() || slices.Contains(keep, dir) {
			continue
		}
		if n := killCgroupTree(dir); n > 0 {
			c.log.Warn("bgjob: killed the processes of a job that is gone", "cgroup", dir, "killed", n)
		}
	}
}

// reapZombieChildren reaps the host's zombie children that ours says are
// the job's: orphans of a job re-parented to the host, a subreaper. A
// zombie's PID cannot be reused until it is reaped, so the one that ours
// looked at is the one reaped.
func reapZombieChildren(ours func(pid string, session int) bool) {
	self := strconv.Itoa(os.Getpid())
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		name := e.Name()
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		b, err := os.ReadFile("/proc/" + name + "/stat")
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 || i+2 >= len(b) {
			continue
		}
		f := bytes.Fields(b[i+2:]) // state ppid pgrp session ...
		if len(f) < 4 || f[0][0] != 'Z' || string(f[1]) != self {
			continue
		}
		sid, _ := strconv.Atoi(string(f[3]))
		if !ours(name, sid) {
			continue
		}
		pid, _ := strconv.Atoi(name)
		var info unix.Siginfo
		unix.Waitid(unix.P_PID, pid, &info, unix.WEXITED|unix.WNOHANG, nil)
	}
}

// leave moves the host out of the cgroup dir, where a hostile job put it,
// back into home; it reports whether the host is out.
func leave(dir, home string) bool {
	if home == "" || os.WriteFile(filepath.Join(home, "cgroup.procs"), []byte(strconv.Itoa(os.Getpid())), 0) != nil {
		return false
	}
	return !hostIn(dir)
}

// hostIn reports whether the host's own process is in the cgroup dir or
// below it.
func hostIn(dir string) bool {
	rel := cgroupPath(dir)
	return rel != "" && cgroupOf("self", rel)
}

// cgroupOf reports whether the process pid ("self" for the host) is in
// the cgroup whose path /proc/PID/cgroup shows as rel, or below it.
func cgroupOf(pid, rel string) bool {
	b, err := os.ReadFile("/proc/" + pid + "/cgroup")
	if err != nil {
		return false
	}
	for _, line := range strings.Split(string(b), "\n") {
		if own, ok := strings.CutPrefix(line, "0::"); ok {
			return own == rel || strings.HasPrefix(own, rel+"/")
		}
	}
	return false
}

// cgroupPath returns the path of the cgroup folder dir in its hierarchy,
// as /proc/PID/cgroup shows it, or "" if dir is in no cgroup v2 mount.
func cgroupPath(dir string) string {
	f, err := os.Open("/proc/self/mountinfo")
	if err != nil {
		return ""
	}
	defer f.Close()
	best, path := -1, ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fields := strings.Fields(sc.Text())
		i := slices.Index(fields, "-")
		if i < 5 || i+1 >= len(fields) || fields[i+1] != "cgroup2" {
			continue
		}
		root, mnt := unescapeMount(fields[3]), unescapeMount(fields[4])
		rel, ok := strings.CutPrefix(dir, mnt)
		if !ok || (rel != "" && rel[0] != '/' && mnt != "/") || len(mnt) <= best {
			continue
		}
		best, path = len(mnt), filepath.Join(root, rel)
	}
	return path
}

// awaitUnpopulated waits until the cgroup dir and its descendants hold no
// task, as its cgroup.events says, or the deadline passes; it reports
// whether they are empty. Its processes may all be gone from cgroup.procs
// while one is still exiting (a process whose main thread exited before
// its other threads), so a cgroup is only empty when it says so. It wakes
// on inotify's event for cgroup.events, not by polling.
func awaitUnpopulated(dir string, deadline time.Time) bool {
	events := filepath.Join(dir, "cgroup.events")
	if !populated(events) {
		return true
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return false
	}
	in := os.NewFile(uintptr(fd), "inotify")
	defer in.Close()
	if _, err := unix.InotifyAddWatch(fd, events, unix.IN_MODIFY); err != nil {
		return !populated(events)
	}
	in.SetReadDeadline(deadline)
	buf := make([]byte, 1024)
	for populated(events) {
		if _, err := in.Read(buf); err != nil {
			return !populated(events)
		}
	}
	return true
}

// populated reports whether the cgroup.events file events says
// "populated 1" (or cannot be read, which also means: do not remove).
func populated(events string) bool {
	b, err := os.ReadFile(events)
	if err != nil {
		return !errors.Is(err, os.ErrNotExist)
	}
	return bytes.Contains(b, []byte("populated 1"))
}
