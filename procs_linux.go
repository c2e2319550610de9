package bgjob

import (
	"bytes"
	"encoding/binary"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"sync"
	"syscall"

	"golang.org/x/sys/unix"
)

// Listing a running job's tree (Snapshot.Processes, Snapshot.Ports) and
// watching it empty (the leftover phase), on Linux, from /proc and the
// job's cgroup. Neither touches what the supervisor owns in the process
// (its seen pidfds, its flags): see procs.go.

// list returns the live processes of p's tree, by PID, and the TCP ports
// they listen on; m keeps what one listing learns for the next. It may be
// called from any goroutine while job.tree holds p (see procs.go).
//
// Each process is pinned by a pidfd while it is recognised and read, and
// kept only if it is still alive after: then what was read under its PID
// was its own, not that of a process that took the PID meanwhile.
func (p *process) list(m *treeMemo) ([]Process, []int) {
	if !m.known {
		m.known = true
		switch {
		case p.cgroup != "":
			m.rel = cgroupPath(p.cgroup)
		case p.adopted:
			m.since = p.since // set before the process was shared
		default:
			// The shell, unreaped, is the one under its PID: every
			// process of the job started after it.
			m.since, _, _ = procStart(p.pid)
		}
	}
	var buf [512]byte
	var cands []int
	var test func(name string, st procStat) bool
	if p.cgroup != "" {
		if m.rel == "" {
			return nil, nil
		}
		cands = cgroupMembers(p.cgroup)
		test = func(name string, _ procStat) bool { return cgroupOf(name, m.rel) }
	} else {
		sess := !p.adopted && p.pid > 0
		cands = scanTree(p.pid, sess, p.marker, m.since, buf[:])
		test = func(name string, st procStat) bool {
			return sess && st.session == p.pid || p.marker != "" && st.start >= m.since && hasMarker(name, p.marker)
		}
	}
	slices.Sort(cands)
	self := os.Getpid()
	var (
		procs   []Process
		pins    []*os.File
		sockets map[uint64]bool
		nets    = map[string]int{} // a member of each network namespace
	)
	defer func() {
		for _, f := range pins {
			f.Close()
		}
	}()
	for _, pid := range cands {
		if pid == self || len(procs) == maxListed {
			continue
		}
		fd, err := unix.PidfdOpen(pid, 0)
		if err != nil {
			continue
		}
		f := os.NewFile(uintptr(fd), "pidfd")
		name := strconv.Itoa(pid)
		st, ok := readStat(name, buf[:])
		if !ok || !st.live() || !test(name, st) {
			f.Close()
			continue
		}
		cmd, _ := os.ReadFile("/proc/" + name + "/cmdline")
		n := len(sockets)
		sockets = socketsOf(name, sockets)
		if len(sockets) > n {
			if ns, err := os.Readlink("/proc/" + name + "/ns/net"); err == nil {
				if _, ok := nets[ns]; !ok {
					nets[ns] = pid
				}
			}
		}
		if pidfdExited(f) {
			f.Close()
			continue
		}
		pins = append(pins, f)
		procs = append(procs, Process{PID: pid, PPID: st.ppid, Command: procCommand(cmd)})
	}
	var ports []int
	for ns, pid := range nets {
		if ns == hostNetNS() {
			if ps, err := diagListening(sockets, ports); err == nil {
				ports = ps
				continue
			}
		}
		// Another network namespace (a sandbox's), or no sock_diag:
		// the namespace's tables in /proc, which list every socket.
		for _, file := range []string{"tcp", "tcp6"} {
			b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/net/" + file)
			if err == nil {
				ports = listening(b, sockets, ports)
			}
		}
	}
	slices.Sort(ports)
	return procs, slices.Compact(ports)
}

// hostNetNS names the host's network namespace, as /proc/PID/ns/net
// links to it ("net:[4026531840]").
var hostNetNS = sync.OnceValue(func() string {
	ns, _ := os.Readlink("/proc/self/ns/net")
	return ns
})

// diagListening adds to ports the local port of each listening TCP socket
// (IPv4 and IPv6) of the host's network namespace whose inode is in
// sockets, as the kernel's sock_diag netlink interface reports them. It
// asks for listening sockets only, which the kernel finds in its table of
// listeners, where /proc/net/tcp walks every socket's hash bucket (some
// milliseconds on a machine with a large table).
func diagListening(sockets map[uint64]bool, ports []int) ([]int, error) {
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, unix.NETLINK_SOCK_DIAG)
	if err != nil {
		return ports, err
	}
	defer unix.Close(fd)
	buf := make([]byte, 32<<10)
	for seq, family := range []uint8{unix.AF_INET, unix.AF_INET6} {
		// struct nlmsghdr, then struct inet_diag_req_v2: family,
		// protocol, extensions, padding, the states wanted (a bit per
		// TCP state), and a socket ID of zeros (any).
		req := make([]byte, unix.SizeofNlMsghdr+diagReqLen)
		binary.NativeEndian.PutUint32(req[0:], uint32(len(req)))
		binary.NativeEndian.PutUint16(req[4:], unix.SOCK_DIAG_BY_FAMILY)
		binary.NativeEndian.PutUint16(req[6:], unix.NLM_F_REQUEST|unix.NLM_F_DUMP)
		binary.NativeEndian.PutUint32(req[8:], uint32(seq+1))
		r := req[unix.SizeofNlMsghdr:]
		r[0], r[1] = family, unix.IPPROTO_TCP
		binary.NativeEndian.PutUint32(r[4:], 1<<tcpStateListen)
		if err := unix.Sendto(fd, req, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
			return ports, err
		}
	read:
		for {
			n, _, err := unix.Recvfrom(fd, buf, 0)
			if err == unix.EINTR {
				continue
			}
			if err != nil {
				return ports, err
			}
			msgs, err := syscall.ParseNetlinkMessage(buf[:n])
			if err != nil {
				return ports, err
			}
			for _, m := range msgs {
				switch m.Header.Type {
				case unix.NLMSG_DONE:
					break read
				case unix.NLMSG_ERROR:
					return ports, errors.New("sock_diag: error reply")
				}
				// struct inet_diag_msg: family, state, timer, retrans,
				// then the socket ID (source port first, big-endian),
				// ..., and the inode last.
				if len(m.Data) < diagMsgLen {
					continue
				}
				ino := uint64(binary.NativeEndian.Uint32(m.Data[diagMsgLen-4:]))
				if m.Data[1] == tcpStateListen && sockets[ino] {
					ports = append(ports, int(binary.BigEndian.Uint16(m.Data[4:])))
				}
			}
		}
	}
	return ports, nil
}

// The sizes of struct inet_diag_req_v2 and struct inet_diag_msg, and the
// number of TCP_LISTEN among the kernel's TCP states.
const (
	diagReqLen     = 56
	diagMsgLen     = 72
	tcpStateListen = 10
)

// scanTree returns the PIDs that /proc shows as possibly the job's whose
// shell is pid: live processes of its session (with sess), or, with a
// marker, those started at or after since (whose environment the caller
// checks). It reads each process's stat only.
func scanTree(pid int, sess bool, marker string, since uint64, buf []byte) []int {
	d, err := os.Open("/proc")
	if err != nil {
		return nil
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	var out []int
	for _, name := range names {
		if name[0] < '0' || name[0] > '9' {
			continue
		}
		st, ok := readStat(name, buf)
		if !ok || !st.live() {
			continue
		}
		if sess && st.session == pid || marker != "" && st.start >= since {
			if n, err := strconv.Atoi(name); err == nil {
				out = append(out, n)
			}
		}
	}
	return out
}

// socketsOf adds to set the inodes of the sockets that process pid holds
// open, from the links in /proc/PID/fd ("socket:[INODE]").
func socketsOf(pid string, set map[uint64]bool) map[uint64]bool {
	dir := "/proc/" + pid + "/fd/"
	d, err := os.Open(dir)
	if err != nil {
		return set
	}
	names, _ := d.Readdirnames(-1)
	d.Close()
	var buf [64]byte
	for _, fd := range names {
		n, err := unix.Readlink(dir+fd, buf[:])
		if err != nil || n <= 0 {
			continue
		}
		ino, ok := bytes.CutPrefix(buf[:n], []byte("socket:["))
		if !ok || len(ino) < 2 || ino[len(ino)-1] != ']' {
			continue
		}
		if v, err := strconv.ParseUint(string(ino[:len(ino)-1]), 10, 64); err == nil {
			if set == nil {
				set = make(map[uint64]bool)
			}
			set[v] = true
		}
	}
	return set
}

// tcpListen is the state of a listening socket in /proc/net/tcp.
const tcpListen = "0A"

// listening adds to ports the local port of each listening socket of b, a
// /proc/PID/net/tcp or tcp6 table, whose inode is in sockets. A line is
// "sl local_address rem_address st tx:rx tr:when retrnsmt uid timeout
// inode ...", the address as hex IP:PORT.
func listening(b []byte, sockets map[uint64]bool, ports []int) []int {
	if len(sockets) == 0 {
		return ports
	}
	_, b, _ = bytes.Cut(b, []byte("\n")) // the header
	for len(b) > 0 {
		var line []byte
		line, b, _ = bytes.Cut(b, []byte("\n"))
		f := bytes.Fields(line)
		if len(f) < 10 || string(f[3]) != tcpListen {
			continue
		}
		ino, err := strconv.ParseUint(string(f[9]), 10, 64)
		if err != nil || !sockets[ino] {
			continue
		}
		i := bytes.LastIndexByte(f[1], ':')
		if i < 0 {
			continue
		}
		if port, err := strconv.ParseUint(string(f[1][i+1:]), 16, 16); err == nil {
			ports = append(ports, int(port))
		}
	}
	return ports
}

// emptyOS is what the leftover watcher needs of the process, copied by
// the supervisor as the phase begins: the watcher never reads the
// process itself.
type emptyOS struct {
	pid    int    // the shell, unreaped: its session is the job's
	sess   bool   // the session tells the job's processes (not adopted)
	cgroup string // the job's cgroup, or ""
	marker string
	since  uint64
}

// emptyWatch returns the watcher of p's tree for the leftover phase. The
// supervisor calls it, and may read all of p.
func (p *process) emptyWatch() *emptyWatch {
	w := newEmptyWatch()
	w.pid, w.sess, w.cgroup, w.marker, w.since = p.pid, !p.adopted && p.pid > 0, p.cgroup, p.marker, p.since
	return w
}

// wait blocks until the tree is empty (true) or stop is called (false).
// With a cgroup it waits on inotify for cgroup.events to say "populated
// 0"; without, on a pidfd of each member in turn, then looks again for
// processes started meanwhile. Both park in the runtime's poller, so no
// thread blocks, and stop interrupts them through the file's deadline.
func (w *emptyWatch) wait() bool {
	if w.cgroup != "" {
		return w.waitCgroup()
	}
	for {
		fs := w.members()
		if len(fs) == 0 {
			return true
		}
		ok := true
		for _, f := range fs {
			if ok {
				ok = w.awaitExit(f)
			}
			f.Close()
		}
		if !ok {
			return false
		}
	}
}

// waitCgroup waits for the job's cgroup to be empty; without inotify it
// looks at intervals.
func (w *emptyWatch) waitCgroup() bool {
	events := filepath.Join(w.cgroup, "cgroup.events")
	empty := func() int {
		if cgroupEmpty(w.cgroup, events) {
			return 0
		}
		return 1
	}
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return w.poll(empty)
	}
	in := os.NewFile(uintptr(fd), "inotify")
	defer in.Close()
	if _, err := unix.InotifyAddWatch(fd, events, unix.IN_MODIFY); err != nil {
		return w.poll(empty)
	}
	if !w.park(in) {
		return false
	}
	defer w.park(nil)
	buf := make([]byte, 1024)
	for empty() > 0 {
		if _, err := in.Read(buf); err != nil {
			if errors.Is(err, os.ErrDeadlineExceeded) {
				return false // stopped
			}
			w.park(nil)
			return w.poll(empty)
		}
	}
	return true
}

// cgroupEmpty reports whether the cgroup dir holds no process of the job:
// its cgroup.events says "populated 0", or the host is the only process
// in it (a hostile job moved it in; the supervisor's end moves it out).
func cgroupEmpty(dir, events string) bool {
	if !populated(events) {
		return true
	}
	if !hostIn(dir) {
		return false
	}
	self := os.Getpid()
	for _, pid := range cgroupMembers(dir) {
		if pid != self {
			return false
		}
	}
	return true
}

// members returns a pidfd (in the runtime's poller) of each live process
// of the job's session, or carrying its marker: each recognised while its
// pidfd pins it, as list does.
func (w *emptyWatch) members() []*os.File {
	var buf [512]byte
	self := os.Getpid()
	var fs []*os.File
	for _, pid := range scanTree(w.pid, w.sess, w.marker, w.since, buf[:]) {
		if pid == self {
			continue
		}
		fd, err := unix.PidfdOpen(pid, unix.PIDFD_NONBLOCK)
		if err != nil {
			continue
		}
		f := os.NewFile(uintptr(fd), "pidfd")
		name := strconv.Itoa(pid)
		st, ok := readStat(name, buf[:])
		if !ok || !st.live() || !(w.sess && st.session == w.pid || w.marker != "" && st.start >= w.since && hasMarker(name, w.marker)) || pidfdExited(f) {
			f.Close()
			continue
		}
		fs = append(fs, f)
	}
	return fs
}

// awaitExit waits until the process of pidfd f has exited (a zombie
// counts), and reports true; or false once stop was called.
func (w *emptyWatch) awaitExit(f *os.File) bool {
	rc, err := f.SyscallConn()
	if err != nil {
		return true // not pollable: look again
	}
	if !w.park(f) {
		return false
	}
	defer w.park(nil)
	err = rc.Read(func(fd uintptr) bool {
		pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
		n, _ := unix.Poll(pfd, 0)
		return n > 0
	})
	switch {
	case err == nil:
		return true
	case errors.Is(err, os.ErrDeadlineExceeded):
		return false // stopped
	}
	// The pidfd is not in the poller: look at intervals.
	w.park(nil)
	return w.poll(func() int {
		if pidfdExited(f) {
			return 0
		}
		return 1
	})
}
