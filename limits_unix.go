//go:build unix

package bgjob

import (
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// limitArgv has the job's shell set the limits left in pl.limits on
// itself before it runs the command, so that every process of the job
// inherits them (setrlimit through the shell's ulimit builtin; both the
// soft and the hard limit, so no process can raise them). The command is
// never put into the script: with the default shell, the script evals
// its first argument, the command, after dropping it from the positional
// parameters, so the command sees what sh -c gives it; with another
// shell, or Spec.Args, a /bin/sh in front sets the limits and execs the
// command line.
func limitArgv(pl *plan, defaultShell bool) {
	l := pl.limits
	var sets []string
	if l.Memory > 0 {
		sets = append(sets, "ulimit -v "+strconv.FormatInt(kib(l.Memory), 10))
	}
	if l.CPUTime > 0 {
		// The hard limit a second above the soft one: at the soft limit
		// the kernel sends SIGXCPU, which tells why the job stopped; at
		// the hard limit, SIGKILL.
		s := seconds(l.CPUTime)
		sets = append(sets, "ulimit -t "+strconv.FormatInt(s+1, 10), "ulimit -S -t "+strconv.FormatInt(s, 10))
	}
	if l.FileSize > 0 {
		sets = append(sets, "ulimit -f "+strconv.FormatInt(blocks(l.FileSize), 10))
	}
	if l.OpenFiles > 0 {
		sets = append(sets, "ulimit -n "+strconv.Itoa(l.OpenFiles))
	}
	if len(sets) == 0 {
		return
	}
	script := strings.Join(sets, " && ") + " || exit 125\n"
	if defaultShell && !pl.args && len(pl.argv) == 3 {
		// argv is {sh, -c, command}.
		pl.argv = []string{pl.argv[0], pl.argv[1], script + `eval "shift;$1"`, "sh", pl.argv[2]}
		return
	}
	pl.argv = append([]string{limitShell, "-c", script + `exec "$@"`, "sh"}, pl.argv...)
}

// limitShell runs the limits' script in front of a command line that is
// not the default shell's.
const limitShell = "/bin/sh"

// rlimitsAllowed reports why limits l, set on each process, cannot be
// launched here, or nil. Processes and CPU have no per-process form. A
// limit above the host's own hard limit could not be set by the job's
// shell, unless the host may raise it.
func rlimitsAllowed(l Limits) *limitProblem {
	switch {
	case l.Processes > 0:
		return unsupported("Limits.Processes", "needs a cgroup with the pids controller, which this host does not give its jobs")
	case l.CPU > 0:
		return unsupported("Limits.CPU", "needs a cgroup with the cpu controller, which this host does not give its jobs")
	}
	if unix.Geteuid() == 0 {
		return nil
	}
	checks := []struct {
		field    string
		resource int
		v        uint64
	}{
		{"Limits.Memory", unix.RLIMIT_AS, uint64(kib(l.Memory)) * 1024},
		{"Limits.CPUTime", unix.RLIMIT_CPU, uint64(seconds(l.CPUTime) + 1)},
		{"Limits.FileSize", unix.RLIMIT_FSIZE, uint64(blocks(l.FileSize)) * 512},
		{"Limits.OpenFiles", unix.RLIMIT_NOFILE, uint64(l.OpenFiles)},
	}
	for _, c := range checks {
		if c.v == 0 || (c.field == "Limits.CPUTime" && l.CPUTime == 0) {
			continue
		}
		var rl unix.Rlimit
		if unix.Getrlimit(c.resource, &rl) == nil && rl.Max != unix.RLIM_INFINITY && c.v > uint64(rl.Max) {
			return &limitProblem{field: c.field, why: fmt.Sprintf("%d is above the host's own hard limit, %d", c.v, rl.Max)}
		}
	}
	return nil
}

// signalLimit returns the reason of the limit of l whose signal ended the
// job's shell with code (128+n): SIGXCPU for CPU time, SIGXFSZ for file
// size; "" for any other code.
func signalLimit(l Limits, code int) string {
	switch {
	case l.CPUTime > 0 && code == 128+int(unix.SIGXCPU):
		return cpuTimeReason(l.CPUTime)
	case l.FileSize > 0 && code == 128+int(unix.SIGXFSZ):
		return fileSizeReason(l.FileSize)
	}
	return ""
}

// rusageUsage converts the rusage of the reaped shell. Its peak memory
// is only the job's when it exceeds the host's own peak: the shell was
// spawned from the host (vfork on Linux), and the kernel counts the
// resident set of the memory it ran on before its exec, the host's, as
// the shell's. Below that the job's peak is unknown, and left 0.
func rusageUsage(ru *unix.Rusage) Usage {
	u := Usage{
		UserCPU:   timevalDuration(ru.Utime),
		SystemCPU: timevalDuration(ru.Stime),
	}
	var self unix.Rusage
	if unix.Getrusage(unix.RUSAGE_SELF, &self) == nil && ru.Maxrss > self.Maxrss {
		u.PeakMemory = int64(ru.Maxrss) * maxrssUnit
	}
	return u
}

func timevalDuration(tv unix.Timeval) time.Duration { return time.Duration(tv.Nano()) }

// maxrssUnit is the unit of rusage's ru_maxrss: bytes on Apple's systems,
// KiB elsewhere.
var maxrssUnit = map[bool]int64{true: 1, false: 1024}[runtime.GOOS == "darwin" || runtime.GOOS == "ios"]

// kib returns n bytes in whole KiB, rounded up: the unit of ulimit -v.
func kib(n int64) int64 { return n/1024 + min(n%1024, 1) }
