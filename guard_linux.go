package bgjob

import (
	"os"
	"strconv"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A registry's jobs must not outlive its host, however the host dies:
// Close, a return from main without Close, SIGTERM with no handler,
// SIGKILL, the OOM killer. Outside durable mode each Registry starts a
// guard: a small shell process in a session of its own, outside the jobs'
// containment, that holds the read end of a pipe (the lifeline) whose
// write end only the host holds. When the host closes the registry it
// writes "bye" and closes its end, and the guard exits. When the host dies
// the kernel closes the write end, the guard reads EOF without "bye", and
// stops every job of the registry: SIGTERM to each process, then after
// Config.KillGrace SIGKILL (cgroup.kill of each job cgroup). Without
// cgroups it finds the jobs' processes by their marker (BGJOB_JOB=TOKEN.N
// in their environment), as the leftover check does.
//
// Pdeathsig on each shell would stop only the shell, and Go delivers it
// when the thread that spawned the shell exits, which a goroutine that
// locked its thread may cause at any time: the guard does not need it.

// guardScript is the guard's program: $1 is the registry's cgroup folder
// ("" without cgroups), $2 the prefix of its jobs' markers, $3 the grace
// in seconds.
const guardScript = `read -r word
[ "$word" = bye ] && exit 0
trap '' HUP INT TERM
dir=$1 mark=$2 grace=$3
pids() {
	if [ -n "$dir" ]; then
		cat "$dir"/*/cgroup.procs 2>/dev/null
	else
		for e in /proc/[0-9]*/environ; do
			if tr '\0' '\n' <"$e" 2>/dev/null | grep -q -F -- "$mark"; then
				p=${e%/environ}
				echo "${p#/proc/}"
			fi
		done
	fi
}
for p in $(pids); do kill -TERM "$p" 2>/dev/null; done
sleep "$grace"
if [ -n "$dir" ]; then
	for k in "$dir"/*/cgroup.kill; do echo 1 >"$k" 2>/dev/null; done
else
	for p in $(pids); do kill -KILL "$p" 2>/dev/null; done
fi`

// guard is a registry's guard process and the host's end of its lifeline.
type guard struct {
	pid  int
	life *os.File // the write end of the lifeline
}

// startGuard starts the guard of a registry whose job cgroups are in dir
// ("" if none) and whose jobs' markers start with mark.
func startGuard(dir, mark string, grace time.Duration) (*guard, error) {
	r, w, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	defer r.Close()
	null, err := openDevNull()
	if err != nil {
		w.Close()
		return nil, err
	}
	secs := strconv.FormatFloat(grace.Seconds(), 'f', 3, 64)
	attr := &syscall.ProcAttr{
		Env:   []string{"PATH=/usr/local/bin:/usr/bin:/bin", "LC_ALL=C"},
		Files: []uintptr{r.Fd(), uintptr(null), uintptr(null)},
		Sys:   &syscall.SysProcAttr{Setsid: true},
	}
	pid, err := syscall.ForkExec(wrapperShell, []string{"sh", "-c", guardScript, "bgjob-guard", dir, mark, secs}, attr)
	if err != nil {
		w.Close()
		return nil, err
	}
	return &guard{pid: pid, life: w}, nil
}

// dismiss tells the guard that the host closed the registry, and reaps
// it.
func (g *guard) dismiss() {
	g.life.Write([]byte("bye\n"))
	g.life.Close()
	var ws unix.WaitStatus
	for {
		if _, err := unix.Wait4(g.pid, &ws, 0, nil); err != unix.EINTR {
			return
		}
	}
}
