//go:build windows

package bgjob

import (
	"errors"
	"fmt"
	"math"
	"os"
	"runtime"
	"strings"
	"sync"
	"time"
	"unsafe"

	"golang.org/x/sys/windows"
)

// On Windows a job's limits are its Job Object's (newJob sets them before
// the shell exists): Memory is the job's committed memory
// (JOB_OBJECT_LIMIT_JOB_MEMORY), Processes its active processes
// (JOB_OBJECT_LIMIT_ACTIVE_PROCESS), CPUTime each process's user time
// (JOB_OBJECT_LIMIT_PROCESS_TIME), CPU a hard cap of its CPU rate
// (JobObjectCpuRateControlInformation). FileSize and OpenFiles have no
// Job Object form.
//
// Which limit stopped a job is told by the messages Windows posts to the
// job's completion port, which is associated before the shell runs for a
// job with Memory, Processes or CPUTime: JOB_OBJECT_MSG_JOB_MEMORY_LIMIT
// (an allocation was refused), JOB_OBJECT_MSG_ACTIVE_PROCESS_LIMIT (a
// process was refused), JOB_OBJECT_MSG_END_OF_PROCESS_TIME (a process was
// killed at its time limit). Windows does not guarantee their delivery
// (see JOBOBJECT_ASSOCIATE_COMPLETION_PORT): a job whose message did not
// come counts as a plain failure (CategoryCommand), never as stopped by
// a limit it did not reach, and for Memory the end of its output can
// still tell (inferLimit). JobObjectLimitViolationInformation is not
// used: it reports the limits of JobObjectNotificationLimitInformation,
// which bgjob does not set, not the hard limits above.

// Definitions of the Windows SDK (winnt.h) that golang.org/x/sys/windows
// lacks.

// Messages of a job's completion port (JOB_OBJECT_MSG_*): the message is
// the count of bytes of the completion packet, the process ID its
// overlapped pointer.
const (
	jobMsgEndOfProcessTime   = 2  // JOB_OBJECT_MSG_END_OF_PROCESS_TIME
	jobMsgActiveProcessLimit = 3  // JOB_OBJECT_MSG_ACTIVE_PROCESS_LIMIT
	jobMsgJobMemoryLimit     = 10 // JOB_OBJECT_MSG_JOB_MEMORY_LIMIT
)

// Flags of jobCPURate.ControlFlags (JOB_OBJECT_CPU_RATE_CONTROL_*).
const (
	cpuRateControlEnable  = 0x1 // JOB_OBJECT_CPU_RATE_CONTROL_ENABLE
	cpuRateControlHardCap = 0x4 // JOB_OBJECT_CPU_RATE_CONTROL_HARD_CAP
)

// jobCPURate is JOBOBJECT_CPU_RATE_CONTROL_INFORMATION: a DWORD of flags,
// then a union of DWORD CpuRate, DWORD Weight and two WORDs (MinRate,
// MaxRate); 8 bytes in all, on every architecture.
type jobCPURate struct {
	ControlFlags uint32
	CpuRate      uint32 // cycles per 10,000 of all the system's processors
}

// maxCPURate is a CpuRate of the whole machine.
const maxCPURate = 10_000

// jobLimits is how a Job Object holds a job's limits.
type jobLimits struct {
	ext windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION
	cpu jobCPURate // ControlFlags 0: no CPU limit
	// watch: a message tells the breach of one of the limits, so the
	// job's port is associated before the shell runs.
	watch bool
}

// jobLimitsFor returns the Job Object settings of limits l on a system of
// cpus processors: kill on close always; Memory rounded up to whole pages
// (memory is committed in pages); Processes at most 2^32-1 (more than any
// system runs); CPUTime in 100 ns units, rounded up; CPU as a hard cap of
// the share of all processors, rounded up, from 1/10,000 to all of them.
// enforceable has refused what does not fit (Memory above the address
// space of a 32-bit host).
func jobLimitsFor(l Limits, cpus int) jobLimits {
	var lim jobLimits
	b := &lim.ext.BasicLimitInformation
	b.LimitFlags = windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE
	if l.Memory > 0 {
		b.LimitFlags |= windows.JOB_OBJECT_LIMIT_JOB_MEMORY
		lim.ext.JobMemoryLimit = uintptr(min(pagesUp(l.Memory), uint64(maxJobMemory)))
	}
	if l.Processes > 0 {
		b.LimitFlags |= windows.JOB_OBJECT_LIMIT_ACTIVE_PROCESS
		b.ActiveProcessLimit = uint32(min(uint64(l.Processes), math.MaxUint32))
	}
	if l.CPUTime > 0 {
		b.LimitFlags |= windows.JOB_OBJECT_LIMIT_PROCESS_TIME
		b.PerProcessUserTimeLimit = timeUnits(l.CPUTime)
	}
	lim.watch = l.Memory > 0 || l.Processes > 0 || l.CPUTime > 0
	if l.CPU > 0 {
		lim.cpu = jobCPURate{ControlFlags: cpuRateControlEnable | cpuRateControlHardCap, CpuRate: cpuRate(l.CPU, cpus)}
	}
	return lim
}

// pageSize is the unit of a Job Object's memory limit.
var pageSize = uint64(os.Getpagesize())

// maxJobMemory is the largest memory limit the host can set: a SIZE_T,
// rounded down to a page.
var maxJobMemory = uint64(^uintptr(0)) / pageSize * pageSize

// pagesUp returns n bytes (n > 0) rounded up to whole pages.
func pagesUp(n int64) uint64 { return (uint64(n) + pageSize - 1) / pageSize * pageSize }

// timeUnits returns d (d > 0) in the 100 ns units of a Job Object's time
// limits, rounded up.
func timeUnits(d time.Duration) int64 { return int64(d/100) + int64(min(d%100, 1)) }

// enforcedTime returns the time limit a Job Object holds for d (d > 0):
// d rounded up to 100 ns, or d itself where that would overflow.
func enforcedTime(d time.Duration) time.Duration {
	if u := timeUnits(d); u <= math.MaxInt64/100 {
		return time.Duration(u) * 100
	}
	return d
}

// cpuRate returns cores of cpus processors as a CpuRate: cycles per
// 10,000 of all of them, rounded up, from 1 to 10,000.
func cpuRate(cores float64, cpus int) uint32 {
	r := math.Ceil(cores / float64(max(cpus, 1)) * maxCPURate)
	return uint32(min(max(r, 1), maxCPURate))
}

// processors returns the number of processors of the system, in all its
// processor groups: a CPU rate is a share of them all, whatever the host
// process's affinity.
func processors() int {
	if n := windows.GetActiveProcessorCount(windows.ALL_PROCESSOR_GROUPS); n > 0 {
		return int(n)
	}
	return runtime.NumCPU()
}

// setCPURate sets job's CPU rate control.
func setCPURate(job windows.Handle, r jobCPURate) error {
	_, err := windows.SetInformationJobObject(job, windows.JobObjectCpuRateControlInformation,
		uintptr(unsafe.Pointer(&r)), uint32(unsafe.Sizeof(r)))
	return err
}

// jobSupport says which limits this system's Job Objects keep: kept holds
// the LimitFlags (JOB_OBJECT_LIMIT_*) that a Job Object, set to them,
// reported back with their values, and cpu why CPU rate control failed
// (nil if it was kept). Some systems accept a limit and ignore it: Wine,
// for one, takes every limit of JOBOBJECT_EXTENDED_LIMIT_INFORMATION,
// enforces none and reports none back, and refuses CPU rate control.
type jobSupport struct {
	kept uint32
	why  string // why the limits were not kept, when they were not
	cpu  error
}

// supported is the system's jobSupport, found out once, by the first
// launch (or New) with a limit a Job Object holds.
var supported = sync.OnceValue(probeJobs)

// probeJobs sets a Job Object of its own to a limit of each kind, reads
// them back, and closes it: no process is ever in it.
func probeJobs() jobSupport {
	var s jobSupport
	job, err := windows.CreateJobObject(nil, nil)
	if err != nil {
		s.why, s.cpu = "CreateJobObject: "+err.Error(), err
		return s
	}
	defer windows.CloseHandle(job)
	want := jobLimitsFor(Limits{Memory: 1 << 30, Processes: 8, CPUTime: time.Second, CPU: 1}, 2)
	if _, err := windows.SetInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&want.ext)), uint32(unsafe.Sizeof(want.ext))); err != nil {
		s.why = "setting it failed: " + err.Error()
	} else {
		var got windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION
		if err := windows.QueryInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
			uintptr(unsafe.Pointer(&got)), uint32(unsafe.Sizeof(got)), nil); err != nil {
			s.why = "reading it back failed: " + err.Error()
		} else {
			s.kept = keptLimits(want.ext, got)
			s.why = "set on a Job Object and read back, it was not there, so the job would run without it"
		}
	}
	s.cpu = setCPURate(job, want.cpu)
	if s.cpu == nil {
		var got jobCPURate
		err := windows.QueryInformationJobObject(job, windows.JobObjectCpuRateControlInformation,
			uintptr(unsafe.Pointer(&got)), uint32(unsafe.Sizeof(got)), nil)
		switch {
		case err != nil:
			s.cpu = fmt.Errorf("reading it back: %w", err)
		case got != want.cpu:
			s.cpu = errors.New("set on a Job Object and read back, it was not there")
		}
	}
	return s
}

// keptLimits returns the limit flags of want that got holds, each with
// its value.
func keptLimits(want, got windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION) uint32 {
	var kept uint32
	w, g := &want.BasicLimitInformation, &got.BasicLimitInformation
	has := func(f uint32) bool { return w.LimitFlags&f != 0 && g.LimitFlags&f != 0 }
	if has(windows.JOB_OBJECT_LIMIT_JOB_MEMORY) && got.JobMemoryLimit == want.JobMemoryLimit {
		kept |= windows.JOB_OBJECT_LIMIT_JOB_MEMORY
	}
	if has(windows.JOB_OBJECT_LIMIT_ACTIVE_PROCESS) && g.ActiveProcessLimit == w.ActiveProcessLimit {
		kept |= windows.JOB_OBJECT_LIMIT_ACTIVE_PROCESS
	}
	if has(windows.JOB_OBJECT_LIMIT_PROCESS_TIME) && g.PerProcessUserTimeLimit == w.PerProcessUserTimeLimit {
		kept |= windows.JOB_OBJECT_LIMIT_PROCESS_TIME
	}
	return kept
}

// enforceable reports why limits l cannot be launched here, or nil.
// FileSize and OpenFiles have no Job Object form; a limit this system's
// Job Objects do not keep (see jobSupport) is refused rather than left
// unenforced.
func enforceable(l Limits) *limitProblem {
	switch {
	case l.FileSize > 0:
		return unsupported("Limits.FileSize", "Windows has no limit of a file's size for a job")
	case l.OpenFiles > 0:
		return unsupported("Limits.OpenFiles", "Windows has no limit of a process's handles for a job")
	case l.Memory > 0 && pagesUp(l.Memory) > maxJobMemory:
		return &limitProblem{field: "Limits.Memory", why: fmt.Sprintf("%d is above the largest a Job Object of this host takes, %d", l.Memory, maxJobMemory)}
	case l.Memory == 0 && l.Processes == 0 && l.CPUTime == 0 && l.CPU == 0:
		return nil
	}
	s := supported()
	for _, f := range []struct {
		field, what string
		set         bool
		flag        uint32
	}{
		{"Limits.Memory", "limit of the job's memory", l.Memory > 0, windows.JOB_OBJECT_LIMIT_JOB_MEMORY},
		{"Limits.Processes", "limit of active processes", l.Processes > 0, windows.JOB_OBJECT_LIMIT_ACTIVE_PROCESS},
		{"Limits.CPUTime", "limit of a process's time", l.CPUTime > 0, windows.JOB_OBJECT_LIMIT_PROCESS_TIME},
	} {
		if f.set && s.kept&f.flag == 0 {
			return unsupported(f.field, "this system's Job Objects do not keep the "+f.what+": "+s.why)
		}
	}
	if l.CPU > 0 && s.cpu != nil {
		return unsupported("Limits.CPU", "this system's Job Objects refuse CPU rate control: "+strings.TrimSuffix(s.cpu.Error(), "."))
	}
	return nil
}

// limitArgv: the Job Object enforces the limits, not the command line.
func limitArgv(*plan, bool) {}

// noteMessage records a message of the job's port that tells a limit was
// reached.
func (p *process) noteMessage(msg uint32) {
	switch msg {
	case jobMsgEndOfProcessTime, jobMsgActiveProcessLimit, jobMsgJobMemoryLimit:
		p.hits |= 1 << msg
	}
}

// limitHit returns the reason of the limit of l that stopped the job, as
// the job's messages tell it (the rest of them are read now; awaitEmpty
// may have read some already): a process killed at its time limit first,
// then a process refused, then an allocation refused; "" if none came.
// code does not tell: the shell passes on the exit code of whatever
// failed.
func (p *process) limitHit(l Limits, code int) string {
	for p.port != 0 && p.nextMessage(0) {
	}
	seen := func(msg uint32) bool { return p.hits&(1<<msg) != 0 }
	switch {
	case l.CPUTime > 0 && seen(jobMsgEndOfProcessTime):
		return cpuTimeReasonAs(enforcedTime(l.CPUTime))
	case l.Processes > 0 && seen(jobMsgActiveProcessLimit):
		return processesReason(l.Processes)
	case l.Memory > 0 && seen(jobMsgJobMemoryLimit):
		return memoryReason(l.Memory)
	}
	return ""
}

// inferable returns the limits of l whose breach the job's output may
// tell when no message did: Memory, since a Job Object over its memory
// refuses the allocation and does not kill the process, which most often
// says so as it exits.
func (p *process) inferable(l Limits) Limits { return Limits{Memory: l.Memory} }

// usage returns what the job's processes used, from its Job Object: their
// user and kernel time, and the peak of their committed memory together.
func (p *process) usage() Usage {
	u, _ := p.liveUsage()
	return u
}

// liveUsage returns what the job's processes have used so far (see
// usage). The Job Object's handle is valid until close, which comes after
// the job's usageMu let go of p.
func (p *process) liveUsage() (Usage, bool) {
	var acct jobAccounting
	if err := windows.QueryInformationJobObject(p.job, windows.JobObjectBasicAccountingInformation,
		uintptr(unsafe.Pointer(&acct)), uint32(unsafe.Sizeof(acct)), nil); err != nil {
		return Usage{}, false
	}
	// Both times are in 100 ns units.
	u := Usage{UserCPU: time.Duration(acct.TotalUserTime) * 100, SystemCPU: time.Duration(acct.TotalKernelTime) * 100}
	var ext windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION
	if windows.QueryInformationJobObject(p.job, windows.JobObjectExtendedLimitInformation,
		uintptr(unsafe.Pointer(&ext)), uint32(unsafe.Sizeof(ext)), nil) == nil {
		u.PeakMemory = int64(min(uint64(ext.PeakJobMemoryUsed), math.MaxInt64))
	}
	return u, true
}

// cpuBase: no cgroup here.
func (p *process) cpuBase() [2]int64 { return [2]int64{} }

// signalLimit: no signal ends a job on Windows.
func signalLimit(Limits, int) string { return "" }
