package bgjob

import (
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"
)

// Limits bound what a job may use. A zero field is no limit. Config.Limits
// holds the defaults of every job; a non-zero field of Spec.Limits
// replaces the default's.
//
// How each limit is enforced depends on where the job runs (see the
// README's "Limits" section for what was tested where):
//
//   - Linux, where the registry's cgroup folder is offered the memory,
//     pids or cpu controller (its parent delegates them): Memory,
//     Processes and CPU hold for the job's whole tree together, on the
//     job's own cgroup (memory.max with no swap, and memory.oom.group, so
//     that a job over its memory is killed whole; pids.max; cpu.max).
//   - Everywhere on Unix, and for what no controller covers: limits of
//     each process (setrlimit), set by the job's shell before it runs the
//     command and inherited by every process it starts. Memory is then
//     each process's address space (RLIMIT_AS), CPUTime each process's
//     CPU time (RLIMIT_CPU, whole seconds, rounded up), FileSize the
//     largest file a process may write (RLIMIT_FSIZE, whole 512-byte
//     blocks, rounded up), OpenFiles each process's descriptors
//     (RLIMIT_NOFILE). Processes and CPU have no such form: a launch that
//     sets them where no controller is offered fails with ErrUnsupported.
//   - Windows: the job's Job Object, set before the shell runs. Memory
//     is the memory all the job's processes commit together (rounded up
//     to whole pages), Processes the job's processes alive at once (the
//     shell among them; on a host without a console, Windows may count
//     the console host it starts for the job too), CPU a hard cap of the
//     job's share of all the system's processors, CPUTime the user time
//     of each process (to 100 ns). FileSize and OpenFiles have no Job
//     Object form and fail with ErrUnsupported; so does a limit this
//     system's Job Objects do not keep (checked once, on a Job Object
//     that holds no process): Wine, for one, takes every limit and
//     enforces none.
//
// A job that a limit stopped ends with Category CategoryLimit and a Reason
// that names the limit, such as "memory limit 512 MiB reached". The kernel
// says so for a cgroup's memory (an OOM kill) and processes (a refused
// fork), for CPU time (SIGXCPU) and file size (SIGXFSZ), and Windows for
// a Job Object's limits (its messages that a process was killed at its
// CPU time, or a process or an allocation was refused; Windows does not
// promise to deliver every one, and a job whose message is lost counts as
// a plain failure). A process over its address space, its descriptors or
// a Job Object's memory is not killed: its allocation or open fails, and
// most programs then exit with the system's message; a job that fails
// with such a message in the end of its output ("Cannot allocate memory",
// "out of memory", "Too many open files") while that limit was set is
// reported as stopped by it.
type Limits struct {
	// Memory is in bytes: the whole tree with a cgroup or on Windows,
	// else each process's address space.
	Memory int64 `json:"memory_bytes,omitempty"`
	// Processes is the number of live processes of the tree at once.
	Processes int `json:"processes,omitempty"`
	// CPU is in cores, such as 1.5: the tree's share of CPU time.
	CPU float64 `json:"cpu,omitempty"`
	// CPUTime is the CPU time (user and system) of each process on Unix,
	// the user time of each process on Windows.
	CPUTime time.Duration `json:"cpu_time_ns,omitempty"`
	// FileSize is the largest file, in bytes, that a process may write.
	FileSize int64 `json:"file_size_bytes,omitempty"`
	// OpenFiles is the number of descriptors each process may hold.
	OpenFiles int `json:"open_files,omitempty"`
}

// Usage is what a job's processes used: CPU time and peak memory. A
// finished job's covers its whole run; a running job's (where a cgroup or
// Job Object gives it) covers its run so far.
//
// With a cgroup (Linux) CPU time covers every process of the tree, and
// PeakMemory is the tree's peak where the memory controller is offered.
// Without one, the figures are those of the shell and the processes it
// waited for (getrusage), and PeakMemory is the largest resident set of a
// single one of them, but only when it exceeds the host's own peak: the
// kernel counts the host's resident set as that of a shell the host
// spawned, so below it the job's peak cannot be told, and PeakMemory is
// 0. On Windows they come from the Job Object and cover every process of
// the tree: their user and kernel time, and, as PeakMemory, the peak of
// the memory they committed together (not a resident set).
type Usage struct {
	UserCPU    time.Duration `json:"user_cpu_ns"`
	SystemCPU  time.Duration `json:"system_cpu_ns"`
	PeakMemory int64         `json:"peak_memory_bytes"`
}

// IsZero reports whether l sets no limit.
func (l Limits) IsZero() bool { return l == Limits{} }

// over returns l with each zero field taken from d.
func (l Limits) over(d Limits) Limits {
	if l.Memory == 0 {
		l.Memory = d.Memory
	}
	if l.Processes == 0 {
		l.Processes = d.Processes
	}
	if l.CPU == 0 {
		l.CPU = d.CPU
	}
	if l.CPUTime == 0 {
		l.CPUTime = d.CPUTime
	}
	if l.FileSize == 0 {
		l.FileSize = d.FileSize
	}
	if l.OpenFiles == 0 {
		l.OpenFiles = d.OpenFiles
	}
	return l
}

// check returns the name of the first field of l that holds a value no
// limit can have, with why; "" if all are good.
func (l Limits) check() (field, why string) {
	switch {
	case l.Memory < 0:
		return "Limits.Memory", "negative (" + strconv.FormatInt(l.Memory, 10) + ")"
	case l.Processes < 0:
		return "Limits.Processes", "negative (" + strconv.Itoa(l.Processes) + ")"
	case math.IsNaN(l.CPU) || math.IsInf(l.CPU, 0) || l.CPU < 0:
		return "Limits.CPU", "not a positive number of cores (" + strconv.FormatFloat(l.CPU, 'g', -1, 64) + ")"
	case l.CPU > 0 && l.CPU*cpuPeriod < 1000:
		// cpu.max takes at least 1 ms of each period.
		return "Limits.CPU", "below 0.01 core (" + strconv.FormatFloat(l.CPU, 'g', -1, 64) + ")"
	case l.CPU > maxCPU:
		return "Limits.CPU", "above " + strconv.Itoa(maxCPU) + " cores (" + strconv.FormatFloat(l.CPU, 'g', -1, 64) + ")"
	case l.CPUTime < 0:
		return "Limits.CPUTime", "negative (" + l.CPUTime.String() + ")"
	case l.FileSize < 0:
		return "Limits.FileSize", "negative (" + strconv.FormatInt(l.FileSize, 10) + ")"
	case l.OpenFiles < 0:
		return "Limits.OpenFiles", "negative (" + strconv.Itoa(l.OpenFiles) + ")"
	}
	return "", ""
}

// cpuPeriod is the period, in microseconds, of a CPU limit's quota
// (cpu.max): the cgroup default, 100 ms.
const cpuPeriod = 100_000

// maxCPU bounds Limits.CPU so that its quota fits any integer type.
const maxCPU = 1 << 20

// seconds returns d in whole seconds, rounded up: RLIMIT_CPU's unit.
func seconds(d time.Duration) int64 {
	s := int64(d / time.Second)
	if d%time.Second != 0 {
		s++
	}
	return s
}

// blocks returns n bytes in whole 512-byte blocks, rounded up: the unit
// of the shell's ulimit -f.
func blocks(n int64) int64 { return n/512 + min(n%512, 1) }

// sizeText writes n bytes as a person would: "512 MiB", "1.5 GiB", "100
// bytes".
func sizeText(n int64) string {
	if n < 1024 {
		return strconv.FormatInt(n, 10) + " bytes"
	}
	units := [...]string{"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"}
	v, u := float64(n)/1024, 0
	for v >= 1024 && u < len(units)-1 {
		v, u = v/1024, u+1
	}
	return strings.TrimSuffix(strconv.FormatFloat(v, 'f', 1, 64), ".0") + " " + units[u]
}

// Reasons for a job a limit stopped.
func memoryReason(n int64) string  { return "memory limit " + sizeText(n) + " reached" }
func processesReason(n int) string { return "process limit " + strconv.Itoa(n) + " reached" }
func cpuTimeReason(d time.Duration) string {
	return cpuTimeReasonAs(time.Duration(seconds(d)) * time.Second) // RLIMIT_CPU's whole seconds
}
func fileSizeReason(n int64) string { return "file size limit " + sizeText(n) + " reached" }
func openFilesReason(n int) string  { return "open files limit " + strconv.Itoa(n) + " reached" }

// cpuTimeReasonAs is the reason of a CPU time limit enforced as d (a Job
// Object's is exact to 100 ns).
func cpuTimeReasonAs(d time.Duration) string { return "CPU time limit " + d.String() + " reached" }

// inferLimit looks at the end of the output of a job that failed while
// limits of each process held it, for the system's message that a process
// ran out of the address space or descriptors it was given, and returns
// the reason of that limit, or "". Such a process is not killed; it fails
// its allocation or open and, most often, says so as it exits.
func inferLimit(l Limits, tail string) string {
	if l.Memory > 0 {
		for _, m := range memoryMessages {
			if strings.Contains(tail, m) {
				return memoryReason(l.Memory)
			}
		}
	}
	if l.OpenFiles > 0 && (strings.Contains(tail, "Too many open files") || strings.Contains(tail, "too many open files")) {
		return openFilesReason(l.OpenFiles)
	}
	return ""
}

// memoryMessages are what programs print when an allocation fails:
// strerror(ENOMEM) and Go's form of it, C libraries', awk's, Perl's,
// Python's, C++'s; Windows's texts of ERROR_NOT_ENOUGH_MEMORY and
// ERROR_OUTOFMEMORY ("Not enough memory resources are available ..."),
// of ERROR_COMMITMENT_LIMIT ("The paging file is too small ..."), what a
// job over its Job Object's memory gets, and .NET's exception.
var memoryMessages = []string{
	"Cannot allocate memory",
	"cannot allocate",
	"out of memory",
	"Out of memory",
	"memory exhausted",
	"MemoryError",
	"bad_alloc",
	"Not enough memory resources",
	"paging file is too small",
	"OutOfMemoryException",
}

// inferTail is how much of a failed job's output inferLimit reads: its
// last bytes.
const inferTail = 4096

// limitProblem says why a job's limits cannot be launched: a field of
// Limits, and why. The caller makes it an error of its own (naming
// Spec.Limits or Config.Limits).
type limitProblem struct {
	field, why  string
	unsupported bool // this host cannot enforce the limit; else the value is wrong
}

// unsupported is the problem of a limit this host cannot enforce.
func unsupported(field, why string) *limitProblem {
	return &limitProblem{field: field, why: why, unsupported: true}
}

// err makes p an error of the launch or the Config: owner is "Spec" or
// "Config", and invalid the error a wrong value wraps.
func (p *limitProblem) err(owner string, invalid error) error {
	kind := invalid
	if p.unsupported {
		kind = ErrUnsupported
	}
	return fmt.Errorf("%s.%s: %s: %w", owner, p.field, p.why, kind)
}

// enforceableErr is enforceable's problem as a launch's error, or nil.
func (c *cgroups) enforceableErr(l Limits) error {
	if p := c.enforceable(l); p != nil {
		return p.err("Spec", ErrInvalidSpec)
	}
	return nil
}

// watchUsage sets the process from which a snapshot of the running job
// reads its usage so far, and lists its tree; nil, before the process is
// closed, ends that (see also unlist).
func (j *job) watchUsage(p *process) {
	j.usageMu.Lock()
	j.live, j.tree = p, p
	j.usageRead = usageRead{}
	if p == nil {
		j.listed = treeList{}
	}
	j.usageMu.Unlock()
}

// usageAge is how long a running job's usage, once read, serves its
// snapshots: reading it (cpu.stat makes the kernel gather the cgroup's
// counters) costs microseconds alone and milliseconds when many callers
// ask at once, as when a thousand identical Starts join one job.
const usageAge = 50 * time.Millisecond

// liveUsage returns the running job's usage so far, where its process
// can tell it: read anew at most every usageAge.
func (j *job) liveUsage() (Usage, bool) {
	j.usageMu.Lock()
	defer j.usageMu.Unlock()
	if j.live == nil {
		return Usage{}, false
	}
	now := time.Now()
	if c := &j.usageRead; c.at.IsZero() || now.Sub(c.at) >= usageAge {
		c.u, c.ok = j.live.liveUsage()
		c.at = now
	}
	return j.usageRead.u, j.usageRead.ok
}

// usageRead is a running job's last read of its usage (see usageAge).
type usageRead struct {
	at time.Time
	u  Usage
	ok bool
}
