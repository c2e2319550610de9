package main

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os/exec"
	"time"

	"golang.org/x/sys/unix"
)

// exitWatch learns when processes exit from the kernel's process events
// connector (NETLINK_CONNECTOR, CN_IDX_PROC). The kernel stamps each exit
// event with CLOCK_MONOTONIC in do_exit, right after the parent has been
// notified, so "call returned" minus "exit stamp" is the latency that the
// library adds between the child's exit and its caller getting control
// back, to within a few microseconds (the stamp is taken a little after
// the parent's wait can already wake, so it errs on the side of a smaller
// latency, for every implementation alike).
//
// Nothing reads the socket while a measured call runs: events queue in the
// socket buffer and are drained after the call has returned, so the
// observer takes no CPU from the code it measures.
//
// It needs CAP_NET_ADMIN (root); openExitWatch fails without it.
type exitWatch struct {
	fd   int
	seen map[int]int64 // pid -> exit stamp (ns, CLOCK_MONOTONIC), drained but not yet asked for
	buf  []byte
}

const (
	cnIdxProc        = 1
	cnValProc        = 1
	procCnMcastListn = 1
	procEventExit    = 0x80000000
	nlmsgHdrLen      = 16
	cnMsgLen         = 20
)

func openExitWatch() (*exitWatch, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_CONNECTOR)
	if err != nil {
		return nil, fmt.Errorf("netlink connector socket: %w", err)
	}
	w := &exitWatch{fd: fd, seen: make(map[int]int64), buf: make([]byte, 64<<10)}
	// A big buffer so that the exits of other processes on the machine
	// cannot push ours out between two drains.
	unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 8<<20)
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: cnIdxProc}); err != nil {
		w.Close()
		return nil, fmt.Errorf("netlink connector bind: %w", err)
	}
	msg := make([]byte, nlmsgHdrLen+cnMsgLen+4)
	binary.LittleEndian.PutUint32(msg[0:], uint32(len(msg)))
	binary.LittleEndian.PutUint16(msg[4:], unix.NLMSG_DONE)
	binary.LittleEndian.PutUint32(msg[12:], uint32(unix.Getpid()))
	binary.LittleEndian.PutUint32(msg[16:], cnIdxProc)
	binary.LittleEndian.PutUint32(msg[20:], cnValProc)
	binary.LittleEndian.PutUint16(msg[32:], 4) // cn_msg.len
	binary.LittleEndian.PutUint32(msg[36:], procCnMcastListn)
	if err := unix.Sendto(fd, msg, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		w.Close()
		return nil, fmt.Errorf("netlink connector listen: %w", err)
	}
	// Prove that events flow (the kernel may lack CONFIG_PROC_EVENTS or
	// refuse the subscription silently): run a process and see it exit.
	pid, err := forkTrue()
	if err != nil {
		w.Close()
		return nil, err
	}
	if _, err := w.exitTime(pid, time.Second); err != nil {
		w.Close()
		return nil, fmt.Errorf("netlink connector: no exit event: %w", err)
	}
	return w, nil
}

func forkTrue() (int, error) {
	c := exec.Command("/bin/true")
	err := c.Run()
	if c.Process == nil {
		return 0, err
	}
	return c.Process.Pid, err
}

func (w *exitWatch) Close() { unix.Close(w.fd) }

// reset forgets the events drained so far (and drops those queued), so a
// PID reused later is not matched with an old exit.
func (w *exitWatch) reset() {
	for {
		if _, _, err := unix.Recvfrom(w.fd, w.buf, unix.MSG_DONTWAIT); err != nil {
			break
		}
	}
	clear(w.seen)
}

// exitTime returns the exit stamp of pid, waiting up to timeout for its
// event.
func (w *exitWatch) exitTime(pid int, timeout time.Duration) (int64, error) {
	deadline := time.Now().Add(timeout)
	for {
		if ts, ok := w.seen[pid]; ok {
			delete(w.seen, pid)
			return ts, nil
		}
		flags := unix.MSG_DONTWAIT
		if time.Now().After(deadline) {
			return 0, fmt.Errorf("no exit event for pid %d within %v", pid, timeout)
		}
		n, _, err := unix.Recvfrom(w.fd, w.buf, flags)
		if errors.Is(err, unix.EAGAIN) {
			time.Sleep(50 * time.Microsecond)
			continue
		}
		if errors.Is(err, unix.ENOBUFS) {
			return 0, fmt.Errorf("netlink connector overflowed: exit events lost")
		}
		if err != nil {
			return 0, err
		}
		w.parse(w.buf[:n])
	}
}

func (w *exitWatch) parse(b []byte) {
	for len(b) >= nlmsgHdrLen {
		l := int(binary.LittleEndian.Uint32(b))
		if l < nlmsgHdrLen || l > len(b) {
			return
		}
		m := b[nlmsgHdrLen:l]
		b = b[(l+3)&^3:]
		if len(m) < cnMsgLen+24 {
			continue
		}
		ev := m[cnMsgLen:]
		// struct proc_event: what u32, cpu u32, timestamp_ns u64, then
		// for exit: process_pid u32, process_tgid u32, ...
		if binary.LittleEndian.Uint32(ev[0:]) != procEventExit {
			continue
		}
		ts := int64(binary.LittleEndian.Uint64(ev[8:]))
		pid := int(binary.LittleEndian.Uint32(ev[16:]))
		tgid := int(binary.LittleEndian.Uint32(ev[20:]))
		if pid == tgid { // the process, not one of its threads
			w.seen[pid] = ts
		}
	}
}

// monoNow returns CLOCK_MONOTONIC in ns, the clock of the kernel's stamps.
func monoNow() int64 {
	var ts unix.Timespec
	unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts)
	return ts.Nano()
}
