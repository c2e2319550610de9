package bgjob

import (
	"math"
	"strings"
	"testing"
	"time"
	"unsafe"

	"golang.org/x/sys/windows"
)

// White-box tests of the Job Object's limits: the settings made of a
// Limits, the probe of what the system keeps, and the messages that tell
// which limit stopped a job. They run under Wine too, which keeps no
// limit: there they check what the registry makes of that.

func TestJobLimitsFor(t *testing.T) {
	page := uintptr(pageSize)
	kill := uint32(windows.JOB_OBJECT_LIMIT_KILL_ON_JOB_CLOSE)
	for _, tc := range []struct {
		name  string
		l     Limits
		cpus  int
		flags uint32
		check func(jobLimits) string
	}{
		{"none", Limits{}, 4, kill, func(j jobLimits) string {
			if j.watch || j.cpu != (jobCPURate{}) {
				return "no port and no CPU rate"
			}
			return ""
		}},
		{"memory-in-pages", Limits{Memory: 1000}, 4, kill | windows.JOB_OBJECT_LIMIT_JOB_MEMORY, func(j jobLimits) string {
			if j.ext.JobMemoryLimit != page || !j.watch {
				return "one page, watched"
			}
			return ""
		}},
		{"memory-whole-pages-kept", Limits{Memory: 64 << 20}, 4, kill | windows.JOB_OBJECT_LIMIT_JOB_MEMORY, func(j jobLimits) string {
			if j.ext.JobMemoryLimit != 64<<20 {
				return "64 MiB"
			}
			return ""
		}},
		{"processes", Limits{Processes: 7}, 4, kill | windows.JOB_OBJECT_LIMIT_ACTIVE_PROCESS, func(j jobLimits) string {
			if j.ext.BasicLimitInformation.ActiveProcessLimit != 7 || !j.watch {
				return "7, watched"
			}
			return ""
		}},
		{"processes-beyond-a-dword", Limits{Processes: math.MaxInt}, 4, kill | windows.JOB_OBJECT_LIMIT_ACTIVE_PROCESS, func(j jobLimits) string {
			if j.ext.BasicLimitInformation.ActiveProcessLimit != math.MaxUint32 {
				return "2^32-1"
			}
			return ""
		}},
		{"cpu-time-in-100ns", Limits{CPUTime: 1250 * time.Millisecond}, 4, kill | windows.JOB_OBJECT_LIMIT_PROCESS_TIME, func(j jobLimits) string {
			if j.ext.BasicLimitInformation.PerProcessUserTimeLimit != 12_500_000 || !j.watch {
				return "12,500,000, watched"
			}
			return ""
		}},
		{"cpu-time-rounds-up", Limits{CPUTime: 1}, 4, kill | windows.JOB_OBJECT_LIMIT_PROCESS_TIME, func(j jobLimits) string {
			if j.ext.BasicLimitInformation.PerProcessUserTimeLimit != 1 {
				return "1 (never 0, which no limit would be)"
			}
			return ""
		}},
		{"cpu-time-largest", Limits{CPUTime: math.MaxInt64}, 4, kill | windows.JOB_OBJECT_LIMIT_PROCESS_TIME, func(j jobLimits) string {
			if j.ext.BasicLimitInformation.PerProcessUserTimeLimit != math.MaxInt64/100+1 {
				return "MaxInt64 ns in 100 ns units, rounded up, with no overflow"
			}
			return ""
		}},
		{"cpu-half-of-two", Limits{CPU: 1}, 2, kill, func(j jobLimits) string {
			if j.cpu != (jobCPURate{ControlFlags: cpuRateControlEnable | cpuRateControlHardCap, CpuRate: 5000}) || j.watch {
				return "a hard cap of 5000, no port"
			}
			return ""
		}},
		{"cpu-rounds-up", Limits{CPU: 1}, 3, kill, func(j jobLimits) string {
			if j.cpu.CpuRate != 3334 {
				return "3334"
			}
			return ""
		}},
		{"cpu-at-least-one", Limits{CPU: 0.01}, 1024, kill, func(j jobLimits) string {
			if j.cpu.CpuRate != 1 {
				return "1"
			}
			return ""
		}},
		{"cpu-at-most-all", Limits{CPU: 8}, 2, kill, func(j jobLimits) string {
			if j.cpu.CpuRate != maxCPURate {
				return "10000"
			}
			return ""
		}},
		{"file-limits-not-here", Limits{FileSize: 1, OpenFiles: 1}, 4, kill, func(j jobLimits) string { return "" }},
	} {
		t.Run(tc.name, func(t *testing.T) {
			j := jobLimitsFor(tc.l, tc.cpus)
			if got := j.ext.BasicLimitInformation.LimitFlags; got != tc.flags {
				t.Errorf("flags %#x; want %#x", got, tc.flags)
			}
			if want := tc.check(j); want != "" {
				t.Errorf("got %+v; want %s", j, want)
			}
		})
	}
	for _, tc := range []struct{ d, want time.Duration }{
		{1, 100},
		{100, 100},
		{1250 * time.Millisecond, 1250 * time.Millisecond},
		{math.MaxInt64, math.MaxInt64},
	} {
		if got := enforcedTime(tc.d); got != tc.want {
			t.Errorf("enforcedTime(%d): got %d; want %d", tc.d, got, tc.want)
		}
	}
	if unsafe.Sizeof(jobCPURate{}) != 8 {
		t.Errorf("JOBOBJECT_CPU_RATE_CONTROL_INFORMATION is %d bytes; want 8", unsafe.Sizeof(jobCPURate{}))
	}
}

func TestJobSupport(t *testing.T) {
	s := supported()
	all := uint32(windows.JOB_OBJECT_LIMIT_JOB_MEMORY | windows.JOB_OBJECT_LIMIT_ACTIVE_PROCESS | windows.JOB_OBJECT_LIMIT_PROCESS_TIME)
	t.Logf("this system's Job Objects keep limits %#x of %#x (%s); CPU rate control: %v", s.kept, all, s.why, s.cpu)
	if !underWine() {
		// Windows 10 and later, which Go needs, keep them all.
		if s.kept != all || s.cpu != nil {
			t.Errorf("kept %#x, CPU rate control %v; want %#x and nil", s.kept, s.cpu, all)
		}
		return
	}
	// Wine 8 takes the limits, reads none back, and refuses CPU rate
	// control; a later Wine that keeps them is welcome.
	if s.kept != all && s.kept != 0 {
		t.Errorf("kept %#x; want none or all", s.kept)
	}
	p := enforceable(Limits{Memory: 1 << 30, CPU: 1})
	switch {
	case s.kept == 0 && (p == nil || !p.unsupported || p.field != "Limits.Memory"):
		t.Errorf("enforceable(Memory) with no limit kept: %+v; want Limits.Memory unsupported", p)
	case s.kept == all && s.cpu != nil && (p == nil || !p.unsupported || p.field != "Limits.CPU"):
		t.Errorf("enforceable(CPU) with CPU rate control refused: %+v; want Limits.CPU unsupported", p)
	}
}

func TestNewJobLimits(t *testing.T) {
	// A job with a limit a message tells gets its port at once, before
	// any process is in it; one without gets none until awaitEmpty.
	for _, tc := range []struct {
		name string
		l    Limits
		port bool
	}{
		{"none", Limits{}, false},
		{"memory", Limits{Memory: 1 << 30}, true},
		{"processes", Limits{Processes: 4}, true},
		{"cpu-time", Limits{CPUTime: time.Minute}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job, port, err := newJob(tc.l)
			if err != nil {
				t.Fatal(err)
			}
			defer windows.CloseHandle(job)
			if port != 0 {
				defer windows.CloseHandle(port)
			}
			if (port != 0) != tc.port {
				t.Errorf("port %v; want one: %v", port, tc.port)
			}
			if supported().kept == 0 {
				return // Wine: nothing to read back
			}
			var got windows.JOBOBJECT_EXTENDED_LIMIT_INFORMATION
			if err := windows.QueryInformationJobObject(job, windows.JobObjectExtendedLimitInformation,
				uintptr(unsafe.Pointer(&got)), uint32(unsafe.Sizeof(got)), nil); err != nil {
				t.Fatal(err)
			}
			want := jobLimitsFor(tc.l, processors())
			if got.BasicLimitInformation.LimitFlags != want.ext.BasicLimitInformation.LimitFlags {
				t.Errorf("flags %#x; want %#x", got.BasicLimitInformation.LimitFlags, want.ext.BasicLimitInformation.LimitFlags)
			}
		})
	}
}

func TestNewJobCPURefused(t *testing.T) {
	// A CPU limit the system refuses fails the launch, naming the field;
	// it never runs the job without it.
	job, port, err := newJob(Limits{CPU: 0.5})
	if supported().cpu == nil {
		if err != nil {
			t.Fatalf("newJob with CPU rate control kept by the probe: %v", err)
		}
		windows.CloseHandle(job)
		if port != 0 {
			t.Errorf("port %v for a CPU limit alone; want none", port)
		}
		return
	}
	if err == nil || !strings.HasPrefix(err.Error(), "Limits.CPU: CPU rate control: ") {
		t.Fatalf("newJob with CPU rate control refused: %v; want an error naming Limits.CPU", err)
	}
	// The same from the spawn, which a launch reaches only if the
	// probe had let the limit pass.
	p, rd, err := startJob(&plan{argv: helperArgv("exit", "0"), env: helperEnviron(), limits: Limits{CPU: 0.5}})
	if err == nil {
		rd.Close()
		p.wait()
		p.close()
		t.Fatal("startJob ran a job whose CPU limit was refused")
	}
	if !strings.Contains(err.Error(), "job object: Limits.CPU: CPU rate control: ") {
		t.Errorf("startJob: %v; want the CPU rate control's error", err)
	}
}

func TestLimitHitFromMessages(t *testing.T) {
	// The port's messages, as Windows posts them (the message in the
	// byte count), tell which limit stopped the job; the newest run of
	// each case has a job of its own.
	all := Limits{Memory: 64 << 20, Processes: 3, CPUTime: 1500 * time.Millisecond}
	for _, tc := range []struct {
		name string
		l    Limits
		msgs []uint32
		want string
	}{
		{"no-message", all, nil, ""},
		{"others-only", all, []uint32{6, 7, 4}, ""}, // NEW_PROCESS, EXIT_PROCESS, ACTIVE_PROCESS_ZERO
		{"memory", all, []uint32{6, jobMsgJobMemoryLimit, 7}, "memory limit 64 MiB reached"},
		{"processes", all, []uint32{jobMsgActiveProcessLimit}, "process limit 3 reached"},
		{"cpu-time", all, []uint32{jobMsgEndOfProcessTime}, "CPU time limit 1.5s reached"},
		{"cpu-time-before-memory", all, []uint32{jobMsgJobMemoryLimit, jobMsgEndOfProcessTime}, "CPU time limit 1.5s reached"},
		{"processes-before-memory", all, []uint32{jobMsgJobMemoryLimit, jobMsgActiveProcessLimit}, "process limit 3 reached"},
		{"limit-not-set", Limits{Memory: 64 << 20}, []uint32{jobMsgEndOfProcessTime}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			job, port, err := newJob(tc.l)
			if err != nil {
				t.Fatal(err)
			}
			if port == 0 {
				windows.CloseHandle(job)
				t.Skip("no job completion port on this system")
			}
			p := &process{job: job, port: port, watched: true}
			defer p.close()
			for _, m := range tc.msgs {
				if err := windows.PostQueuedCompletionStatus(port, m, uintptr(job), nil); err != nil {
					t.Fatal(err)
				}
			}
			if got := p.limitHit(tc.l, 1); got != tc.want {
				t.Errorf("got %q; want %q", got, tc.want)
			}
			// limitHit read every message.
			if p.nextMessage(0) {
				t.Errorf("a message was left on the port")
			}
		})
	}
}

func TestLimitHitAfterAwaitEmpty(t *testing.T) {
	// A message that awaitEmpty reads while it waits for the job's
	// processes still counts. The job has its port from the start.
	l := Limits{CPUTime: time.Minute}
	p, rd, err := startJob(&plan{argv: helperArgv("sleep", "300"), env: helperEnviron(), limits: l})
	if err != nil {
		t.Fatal(err)
	}
	defer p.close()
	defer rd.Close()
	if p.port == 0 {
		t.Skip("no job completion port on this system")
	}
	if err := windows.PostQueuedCompletionStatus(p.port, jobMsgEndOfProcessTime, uintptr(p.job), nil); err != nil {
		t.Fatal(err)
	}
	if n := p.awaitEmpty(time.Now().Add(20 * time.Second)); n != 0 {
		t.Fatalf("awaitEmpty: %d live; want 0", n)
	}
	if p.hits&(1<<jobMsgEndOfProcessTime) == 0 {
		t.Errorf("hits %#x; want the message awaitEmpty read noted", p.hits)
	}
	if got, want := p.limitHit(l, 1), "CPU time limit 1m0s reached"; got != want {
		t.Errorf("got %q; want %q", got, want)
	}
}

func TestLiveUsageOfAnEmptyJob(t *testing.T) {
	job, _, err := newJob(Limits{})
	if err != nil {
		t.Fatal(err)
	}
	p := &process{job: job}
	defer p.close()
	if u, ok := p.liveUsage(); !ok || u != (Usage{}) {
		t.Errorf("got %+v, %v; want zero usage, true", u, ok)
	}
}

// underWine reports whether the tests run under Wine.
func underWine() bool {
	return windows.NewLazySystemDLL("ntdll.dll").NewProc("wine_get_version").Find() == nil
}
