package bgjob

import (
	"bytes"
	"errors"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// controllers are the cgroup v2 controllers a registry's job cgroups
// have: those its folder is offered (its parent delegates them) and it
// could enable for its children.
type controllers struct{ memory, pids, cpu bool }

// enableControllers turns on, for the job cgroups in the registry's folder
// dir, each of the memory, pids and cpu controllers that dir is offered,
// and returns those it could. The folder holds no process, so the kernel
// allows it.
func enableControllers(dir string) controllers {
	var k controllers
	b, err := os.ReadFile(filepath.Join(dir, "cgroup.controllers"))
	if err != nil {
		return k
	}
	offered := strings.Fields(string(b))
	for _, c := range []struct {
		name string
		on   *bool
	}{{"memory", &k.memory}, {"pids", &k.pids}, {"cpu", &k.cpu}} {
		if slices.Contains(offered, c.name) {
			*c.on = os.WriteFile(filepath.Join(dir, "cgroup.subtree_control"), []byte("+"+c.name), 0) == nil
		}
	}
	return k
}

// covers reports whether any limit of l is one the controllers enforce.
func (k controllers) covers(l Limits) bool {
	return (l.Memory > 0 && k.memory) || (l.Processes > 0 && k.pids) || (l.CPU > 0 && k.cpu)
}

// rest returns l without the limits the controllers enforce.
func (k controllers) rest(l Limits) Limits {
	if k.memory {
		l.Memory = 0
	}
	if k.pids {
		l.Processes = 0
	}
	if k.cpu {
		l.CPU = 0
	}
	return l
}

// enforceable reports why a job with limits l cannot be launched here, or
// nil: Processes and CPU need a cgroup controller, the rest can be set on
// each process.
func (c *cgroups) enforceable(l Limits) *limitProblem {
	k := c.ctl
	if c.dir == "" || c.off.Load() {
		k = controllers{}
	}
	need := []struct {
		field, ctl string
		set, have  bool
	}{
		{"Limits.Processes", "pids", l.Processes > 0, k.pids},
		{"Limits.CPU", "cpu", l.CPU > 0, k.cpu},
	}
	for _, n := range need {
		if !n.set || n.have {
			continue
		}
		switch {
		case c.dir == "":
			return unsupported(n.field, "needs the cgroup "+n.ctl+" controller, and this host gives its jobs no cgroup")
		case c.off.Load():
			return unsupported(n.field, "needs the cgroup "+n.ctl+" controller, and this kernel cannot start a job in a cgroup")
		}
		return unsupported(n.field, "needs the cgroup "+n.ctl+" controller, which the registry's cgroup folder "+c.dir+
			" is not offered (its parent does not delegate it; see cgroup.subtree_control)")
	}
	return rlimitsAllowed(k.rest(l))
}

// makeLimited makes a new job cgroup and writes to it the limits of l
// that its controllers enforce. It is never reused.
func (c *cgroups) makeLimited(l Limits) (*jobCgroup, error) {
	g, err := c.make()
	if err != nil {
		return nil, err
	}
	g.limited = true
	write := func(file, v string) error {
		return os.WriteFile(filepath.Join(g.dir, file), []byte(v), 0)
	}
	if l.Memory > 0 && c.ctl.memory {
		// Over its memory the whole job is killed, not one process of
		// it; swap does not stretch the limit (where swap is counted).
		err = errors.Join(write("memory.max", strconv.FormatInt(l.Memory, 10)), write("memory.oom.group", "1"))
		if e := write("memory.swap.max", "0"); e != nil && !errors.Is(e, fs.ErrNotExist) {
			err = errors.Join(err, e)
		}
	}
	if l.Processes > 0 && c.ctl.pids && err == nil {
		err = write("pids.max", strconv.Itoa(l.Processes))
	}
	if l.CPU > 0 && c.ctl.cpu && err == nil {
		quota := int64(math.Ceil(l.CPU * cpuPeriod))
		err = write("cpu.max", strconv.FormatInt(quota, 10)+" "+strconv.Itoa(cpuPeriod))
	}
	if err != nil {
		c.recycle(g)
		return nil, err
	}
	return g, nil
}

// cpuTimes is a cgroup's CPU time so far, from its cpu.stat, in
// microseconds.
type cpuTimes struct{ user, system int64 }

// readCPUTimes reads an open cpu.stat from its start.
func readCPUTimes(f *os.File) (cpuTimes, bool) {
	if f == nil {
		return cpuTimes{}, false
	}
	var buf [512]byte
	n := preadOnce(f, buf[:])
	if n <= 0 {
		return cpuTimes{}, false
	}
	return parseCPUTimes(buf[:n])
}

// parseCPUTimes reads user_usec and system_usec from cpu.stat's text.
// The kernel splits the cgroup's CPU time between the two by sampling at
// each tick, so their sum may fall short of the exact total, usage_usec;
// they are scaled up to it, as the kernel does for a process's times.
func parseCPUTimes(b []byte) (cpuTimes, bool) {
	var t cpuTimes
	var usage int64
	seen := 0
	for _, line := range bytes.Split(b, []byte{'\n'}) {
		k, v, ok := bytes.Cut(line, []byte{' '})
		if !ok {
			continue
		}
		n, err := strconv.ParseInt(string(v), 10, 64)
		if err != nil {
			continue
		}
		switch string(k) {
		case "user_usec":
			t.user, seen = n, seen+1
		case "system_usec":
			t.system, seen = n, seen+1
		case "usage_usec":
			usage = n
		}
	}
	if sum := t.user + t.system; sum > 0 && usage > sum {
		t.user = int64(float64(usage) * float64(t.user) / float64(sum))
		t.system = usage - t.user
	}
	return t, seen == 2
}

// fileInt reads a cgroup file that holds one number (memory.peak).
func fileInt(path string) (int64, bool) {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0, false
	}
	n, err := strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
	return n, err == nil
}

// eventCount returns the count of key in a cgroup's *.events file
// ("oom_kill 2"), 0 if it has none.
func eventCount(path, key string) int64 {
	b, err := os.ReadFile(path)
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, key+" "); ok {
			n, _ := strconv.ParseInt(v, 10, 64)
			return n
		}
	}
	return 0
}

// cgroupUsage adds to u what the job's cgroup knows: the CPU time of all
// its processes since base, and, unless another job ran in it first, its
// peak memory.
func cgroupUsage(u Usage, cpu *os.File, dir string, base cpuTimes, fresh bool) (Usage, cpuTimes, bool) {
	t, ok := readCPUTimes(cpu)
	if ok {
		u.UserCPU = time.Duration(max(t.user-base.user, 0)) * time.Microsecond
		u.SystemCPU = time.Duration(max(t.system-base.system, 0)) * time.Microsecond
	}
	if fresh {
		if n, ok := fileInt(filepath.Join(dir, "memory.peak")); ok && n > 0 {
			u.PeakMemory = n
		}
	}
	return u, t, ok
}

// usage returns what the job's processes used, once the shell was reaped:
// from its cgroup, where it has one, and the shell's rusage.
func (p *process) usage() Usage {
	switch {
	case p.cg != nil:
		u, t, ok := cgroupUsage(p.used, p.cg.cpu, p.cg.dir, p.cg.base, !p.cg.reused)
		// Read from the empty cgroup, the times are the next job's base
		// too (see cgroups.recycle).
		p.cg.last, p.cg.lastOK = t, ok && !populatedAt(p.cg.events)
		return u
	case p.cgroup != "":
		// Adopted: the cgroup, opened now; the base its record kept.
		f, err := os.Open(filepath.Join(p.cgroup, "cpu.stat"))
		if err != nil {
			return p.used
		}
		defer f.Close()
		u, _, _ := cgroupUsage(p.used, f, p.cgroup, p.cgBase, p.cgBase == cpuTimes{})
		return u
	}
	return p.used
}

// liveUsage returns what a running job has used so far, where its cgroup
// tells.
func (p *process) liveUsage() (Usage, bool) {
	if p.cg == nil || p.cg.cpu == nil {
		return Usage{}, false
	}
	u, _, _ := cgroupUsage(Usage{}, p.cg.cpu, p.cg.dir, p.cg.base, !p.cg.reused)
	return u, true
}

// limitHit returns the reason of the limit of l that stopped the job,
// which ended with code, as the kernel tells it: its cgroup's OOM kills
// and refused forks, or the signal of a process limit; "" if none did.
func (p *process) limitHit(l Limits, code int) string {
	if p.cgroup != "" {
		if l.Memory > 0 && cgroupMemoryLimited(p.cgroup) &&
			eventCount(filepath.Join(p.cgroup, "memory.events"), "oom_kill") > 0 {
			return memoryReason(l.Memory)
		}
		if l.Processes > 0 && eventCount(filepath.Join(p.cgroup, "pids.events"), "max") > 0 {
			return processesReason(l.Processes)
		}
	}
	return signalLimit(l, code)
}

// inferable returns the limits of l whose breach only the job's output can
// tell: those set on each process rather than on its cgroup.
func (p *process) inferable(l Limits) Limits {
	if p.cgroup != "" && cgroupMemoryLimited(p.cgroup) {
		l.Memory = 0
	}
	return l
}

// cgroupMemoryLimited reports whether the cgroup dir has a memory limit.
func cgroupMemoryLimited(dir string) bool {
	b, err := os.ReadFile(filepath.Join(dir, "memory.max"))
	return err == nil && strings.TrimSpace(string(b)) != "max"
}

// cpuBase returns the CPU time (user, system; microseconds) the job's
// cgroup had counted when the job got it, for its record.
func (p *process) cpuBase() [2]int64 {
	if p.cg != nil {
		return [2]int64{p.cg.base.user, p.cg.base.system}
	}
	return [2]int64{p.cgBase.user, p.cgBase.system}
}
