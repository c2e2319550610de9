//go:build linux

package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/bgjob/bgjob"
	"golang.org/x/sys/unix"
)

// Workload 7, interactive jobs (issue #16): the spawn of a TTY job against
// os/exec started on a pseudo-terminal opened the same way (x/sys/unix,
// as bgjob does; library users never inherit this module's imports),
// and the round trip of a Write to the echo of it seen by ReadWait.

// interactiveResult: workload 7.
type interactiveResult struct {
	ptyOS, ttySession, ttyCgroup time.Duration // spawn medians
	contain                      bgjob.Containment
	pipeRTT, ttyRTT              stat // Write → echo seen in ReadWait
}

// openPTY opens a pseudo-terminal as bgjob does on Linux: /dev/ptmx,
// unlockpt (TIOCSPTLCK), ptsname (TIOCGPTN), the size (TIOCSWINSZ).
func openPTY() (master, slave *os.File, err error) {
	m, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, nil, err
	}
	if err := unix.IoctlSetPointerInt(m, unix.TIOCSPTLCK, 0); err != nil {
		unix.Close(m)
		return nil, nil, err
	}
	n, err := unix.IoctlGetUint32(m, unix.TIOCGPTN)
	if err == nil {
		err = unix.IoctlSetWinsize(m, unix.TIOCSWINSZ, &unix.Winsize{Row: 24, Col: 80})
	}
	if err != nil {
		unix.Close(m)
		return nil, nil, err
	}
	s, err := unix.Open("/dev/pts/"+strconv.FormatUint(uint64(n), 10), unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(m)
		return nil, nil, err
	}
	return os.NewFile(uintptr(m), "/dev/ptmx"), os.NewFile(uintptr(s), "pts"), nil
}

// osExecOnPTY runs command with os/exec on a new pseudo-terminal, its
// controlling terminal in a session of its own, and reads the master to
// the end, as bgjob runs a TTY job.
func osExecOnPTY(command string) runner {
	return func() (int, error) {
		m, s, err := openPTY()
		if err != nil {
			return 0, err
		}
		defer m.Close()
		c := exec.Command(shell[0], shArgs(command)...)
		c.Stdin, c.Stdout, c.Stderr = s, s, s
		c.SysProcAttr = &syscall.SysProcAttr{Setsid: true, Setctty: true, Ctty: 0}
		err = c.Start()
		s.Close()
		if err != nil {
			return 0, err
		}
		_, err = io.Copy(io.Discard, m)
		if errors.Is(err, syscall.EIO) { // the slave closed: the end
			err = nil
		}
		if werr := c.Wait(); err == nil {
			err = werr
		}
		return c.Process.Pid, err
	}
}

// bgjobOnTTY runs command as a TTY job to its end.
func bgjobOnTTY(r *bgjob.Registry, command string) runner {
	ctx := context.Background()
	return func() (int, error) {
		res, err := r.RunForeground(ctx, bgjob.Spec{Command: command, TTY: &bgjob.TTY{}}, bgjob.Foreground{SoftCap: time.Minute})
		switch {
		case err != nil:
		case res.Detached:
			err = errors.New("detached")
		case res.State != bgjob.Exited || res.ExitCode != 0:
			err = fmt.Errorf("%v, exit %d: %s", res.State, res.ExitCode, res.Reason)
		}
		return res.PID, err
	}
}

// roundTrips writes n lines to the interactive job id, one at a time, and
// times each from the Write to the moment ReadWait returns the job's echo
// of it (the line, ended as the job ends it).
func roundTrips(r *bgjob.Registry, id bgjob.ID, n int, from int64, end string) stat {
	ctx := context.Background()
	off := from
	var st stat
	for i := range n + n/10 {
		line := fmt.Sprintf("ping %06d", i)
		t0 := time.Now()
		if _, err := r.Write(ctx, id, []byte(line+"\n")); err != nil {
			fatalf("write: %v", err)
		}
		var got strings.Builder
		for !strings.Contains(got.String(), line+end) {
			c, err := r.ReadWait(ctx, id, off, 1<<16)
			if err != nil || c.Done {
				fatalf("read the echo of %q: %v (done %v)", line, err, c.Done)
			}
			got.WriteString(c.Data)
			off = c.Next
		}
		if d := time.Since(t0); i >= n/10 { // the first tenth warms up
			st = append(st, d)
		}
	}
	return st
}

// runInteractive measures workload 7 with n runs of each kind.
func runInteractive(n int) interactiveResult {
	reg := newRegistry(bgjob.Config{})
	defer closeRegistry(reg)
	plain := newRegistry(bgjob.Config{Cgroup: "off"})
	defer closeRegistry(plain)
	rs := []runner{osExecOnPTY("true"), bgjobOnTTY(plain, "true"), bgjobOnTTY(reg, "true")}
	samples := make([]stat, len(rs))
	rng := rand.New(rand.NewPCG(7, 8))
	for i := range n + n/10 {
		for _, k := range shuffled(rng, len(rs)) {
			t0 := time.Now()
			if _, err := rs[k](); err != nil {
				fatalf("tty spawn %d: %v", k, err)
			}
			if d := time.Since(t0); i >= n/10 {
				samples[k] = append(samples[k], d)
			}
		}
	}
	res := interactiveResult{ptyOS: samples[0].median(), ttySession: samples[1].median(), ttyCgroup: samples[2].median()}
	s, err := reg.Start(context.Background(), bgjob.Spec{Command: "true", TTY: &bgjob.TTY{}})
	if err != nil {
		fatalf("tty spawn: %v", err)
	}
	res.contain = s.Containment

	// Round trips: cat on a pipe; cat on a terminal whose echo is off
	// (the line comes back from cat, ended by "\r\n").
	p, err := plain.Start(context.Background(), bgjob.Spec{Command: "cat", Interactive: true})
	if err != nil {
		fatalf("interactive: %v", err)
	}
	res.pipeRTT = roundTrips(plain, p.ID, n, 0, "\n")
	plain.CloseInput(p.ID)
	t, err := plain.Start(context.Background(), bgjob.Spec{Command: "stty -echo; echo ready; exec cat", TTY: &bgjob.TTY{}})
	if err != nil {
		fatalf("tty: %v", err)
	}
	c, err := plain.ReadWait(context.Background(), t.ID, 0, 64)
	for err == nil && !strings.Contains(c.Data, "ready\r\n") {
		c, err = plain.ReadWait(context.Background(), t.ID, 0, 64)
	}
	if err != nil {
		fatalf("tty: %v", err)
	}
	res.ttyRTT = roundTrips(plain, t.ID, n, c.Next, "\r\n")
	plain.Cancel(t.ID)
	return res
}

// Targets of workload 7.
const (
	ttySpawnRatio = 1.15 // a TTY job against os/exec on a pseudo-terminal
	echoMaxP99    = time.Millisecond
)

func interactiveRows(s interactiveResult) []row {
	session := row{
		workload: "7 interactive", metric: "start+wait `true` on a terminal, median (session)",
		cells: [nImpl]cell{dur(s.ptyOS), na, dur(s.ttySession)},
		unit:  fmtDur, target: fmt.Sprintf("≤ %.2f× os/exec", ttySpawnRatio), check: relTo(ttySpawnRatio, true),
	}
	cgroup := row{
		workload: "7 interactive", metric: "start+wait `true` on a terminal, median (cgroup)",
		cells: [nImpl]cell{dur(s.ptyOS), na, dur(s.ttyCgroup)},
		unit:  fmtDur,
	}
	if s.contain != bgjob.ContainCgroup {
		cgroup.note = "no writable cgroup v2 hierarchy here: jobs got " + s.contain.String() + " containment"
	}
	pipe := row{
		workload: "7 interactive", metric: "Write → echo seen by ReadWait, p99 (cat, pipe)",
		cells: [nImpl]cell{na, na, dur(s.pipeRTT.p99())},
		unit:  fmtDur, target: "≤ " + fmtDur(float64(echoMaxP99)), check: atMost(float64(echoMaxP99)),
	}
	tty := row{
		workload: "7 interactive", metric: "Write → echo seen by ReadWait, p99 (cat, terminal)",
		cells: [nImpl]cell{na, na, dur(s.ttyRTT.p99())},
		unit:  fmtDur, target: "≤ " + fmtDur(float64(echoMaxP99)), check: atMost(float64(echoMaxP99)),
	}
	return []row{session, cgroup, pipe, tty}
}
