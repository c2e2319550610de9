package bgjob

import (
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Durable mode's output. A job writes to a pipe, as in memory mode: a file
// as its stdout would be truncated by a command that opens /dev/stdout or
// /dev/stderr by name (echo x >/dev/stderr reopens the file with O_TRUNC).
// The host reads the pipe and copies each piece into the run's output
// file before it takes it (tee): splice moves the bytes from the pipe into
// the file inside the kernel, so a host that dies at any moment leaves
// every byte either in the pipe or in the file, and the host reads them
// back from the page cache. As it writes, it frees the blocks between the
// kept head and tail (holes), so the file stays within MaxOutputBytes.
//
// A keeper process per job holds a copy of the pipe's read end and waits
// for the registry's lifeline to close: the host closes it on Detach, and
// the kernel when the host dies. Then the keeper copies the pipe to the
// file (cat), for as long as the job writes, and a later Registry that
// adopts the job follows the file (fileReader). A job that ends while its
// host runs has its keeper killed and reaped.

// readLimits bounds a job's output file on disk.
type readLimits struct {
	keep int64 // the head, rounded up: never punched
	tail int64 // bytes before the stream's offset that are never punched
	max  int64 // the disk use that triggers a punch
	// hold, if not nil, is the offset from which the job's watches may
	// read the file again after a restart (watchState.hold): never
	// punched either.
	hold *atomic.Int64
}

// holes keeps an output file within its readLimits as the stream grows.
type holes struct {
	lim  readLimits
	hole int64 // the end of the punched range; its start is lim.keep
}

// punch frees the disk blocks of the file fd between the kept head and
// the last lim.tail bytes before off, once the file uses more than
// lim.max bytes. FALLOC_FL_KEEP_SIZE keeps the file's size and so every
// offset; the holes read as zeros and only ever fall where the registry
// drops bytes anyway.
func (h *holes) punch(fd int, off int64) {
	if h.lim.max <= 0 || h.lim.keep+(off-h.hole) <= h.lim.max {
		return
	}
	to := (off - h.lim.tail) &^ 4095
	if h.lim.hold != nil {
		to = min(to, h.lim.hold.Load()&^4095)
	}
	if to <= h.hole {
		return
	}
	if err := unix.Fallocate(fd, unix.FALLOC_FL_PUNCH_HOLE|unix.FALLOC_FL_KEEP_SIZE, h.hole, to-h.hole); err != nil {
		h.lim.max = 0 // not supported by this file system: stop trying
		return
	}
	h.hole = to
}

// tee copies a job's output into its output file as the host reads it
// from the pipe (see muxReader).
type tee struct {
	f     *os.File
	fd    int
	off   int64 // bytes in the file: the stream's offset
	holes holes
	plain bool // splice is not supported here: read, then write
	lost  bool // the file cannot be written (a full disk): the pipe is read alone
	log   *slog.Logger
}

// openTee opens (or makes) the output file name for a tee.
func openTee(name string, lim readLimits, log *slog.Logger) (*tee, error) {
	f, err := os.OpenFile(name, os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, err
	}
	return &tee{f: f, fd: int(f.Fd()), off: fi.Size(), holes: holes{lim: lim, hole: lim.keep}, log: log}, nil
}

// take reads what the pipe holds into b, as a read of it would (n > 0;
// or 0 and EAGAIN when it is empty; or 0 and nil at its end), after
// copying it into the file.
func (t *tee) take(pipe int, b []byte) (int, error) {
	if !t.plain && !t.lost {
		off := t.off
		n, err := unix.Splice(pipe, nil, t.fd, &off, len(b), unix.SPLICE_F_NONBLOCK)
		switch {
		case n > 0:
			m, rerr := unix.Pread(t.fd, b[:n], t.off)
			if rerr != nil || m != int(n) {
				t.fail(fmt.Errorf("read back: %v", rerr))
				return 0, rerr // the bytes are in the file; the job's text misses them
			}
			t.off += n
			t.holes.punch(t.fd, t.off)
			return int(n), nil
		case err == unix.EAGAIN || err == unix.EINTR:
			return 0, unix.EAGAIN
		case err == nil: // the pipe's end
			return 0, nil
		case err == unix.EINVAL:
			t.plain = true
		default:
			t.fail(err) // nothing was moved: the pipe still holds it
		}
	}
	n, err := ignoringEINTR(pipe, b)
	if n > 0 && !t.lost {
		if _, werr := unix.Pwrite(t.fd, b[:n], t.off); werr != nil {
			t.fail(werr)
		} else {
			t.off += int64(n)
			t.holes.punch(t.fd, t.off)
		}
	}
	return n, err
}

// fail gives up on the file: from here on the job's output is kept in
// memory only, and a restart finds the file short.
func (t *tee) fail(err error) {
	if !t.lost {
		t.lost = true
		t.log.Warn("bgjob: output file not written; the output is kept in memory only", "file", t.f.Name(), "err", err)
	}
}

func (t *tee) close() { t.f.Close() }

// keeperScript waits for the lifeline (descriptor 3) to close, then
// copies the job's pipe (its stdin) to the output file (its stdout).
const keeperScript = `read _ <&3; exec cat`

// keeper is a durable job's keeper process (see above). The supervisor
// owns it with the job's process.
type keeper struct {
	pid   int
	pidfd *os.File // nil if the kernel gave none
	child bool     // it may be the host's child: it is reaped here
	mine  bool     // started by this host (not found at adoption): certainly its child
}

// startKeeper starts the keeper of a job: pipe is the read end of its
// output pipe, file its output file and lifeline the read end of the
// registry's lifeline. The keeper has a session of its own, outside the
// job's containment, so that stopping the job does not stop it.
func startKeeper(pipe int, file string, lifeline int) (*keeper, error) {
	out, err := unix.Open(file, unix.O_WRONLY|unix.O_APPEND|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(out)
	// The host reads the pipe non-blocking, and that flag belongs to its
	// open file, which a dup shares: cat would stop at the first empty
	// read. A new open of the same pipe is blocking.
	in, err := unix.Open("/proc/self/fd/"+strconv.Itoa(pipe), unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer unix.Close(in)
	null, err := openDevNull()
	if err != nil {
		return nil, err
	}
	pidfd := -1
	attr := &syscall.ProcAttr{
		Env:   []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		Files: []uintptr{uintptr(in), uintptr(out), uintptr(null), uintptr(lifeline)},
		Sys:   &syscall.SysProcAttr{Setsid: true, PidFD: &pidfd},
	}
	pid, err := syscall.ForkExec(wrapperShell, []string{"sh", "-c", keeperScript, "bgjob-keeper"}, attr)
	if err != nil {
		return nil, err
	}
	k := &keeper{pid: pid, child: true, mine: true}
	if pidfd >= 0 {
		k.pidfd = os.NewFile(uintptr(pidfd), "pidfd")
	}
	return k, nil
}

// exited reports whether the keeper has exited.
func (k *keeper) exited() bool { return k == nil || k.pidfd == nil || pidfdExited(k.pidfd) }

// stop ends the keeper of a job that ended while its host watched it:
// the host read everything, the keeper has nothing to do. It is killed and
// reaped.
func (k *keeper) stop() {
	if k.pidfd != nil {
		unix.PidfdSendSignal(int(k.pidfd.Fd()), unix.SIGKILL, nil, 0)
	} else {
		unix.Kill(k.pid, unix.SIGKILL)
	}
	k.reap(true)
}

// release lets go of k, a helper of a job that Detach released, which
// runs on: one this host started stays its child until it exits, and is
// reaped then by a later New, Close or Detach (noteReleased); any other
// is reaped now if it has exited, else let go of.
func (k *keeper) release() {
	if k.mine && k.pidfd != nil {
		noteReleased(k.pidfd)
		k.pidfd = nil
		return
	}
	k.reap(false)
}

// reap collects the keeper if it is the host's child (wait: block until it
// has exited), and lets go of its pidfd.
func (k *keeper) reap(wait bool) {
	if k.child {
		opts := unix.WEXITED
		if !wait {
			opts |= unix.WNOHANG
		}
		var info unix.Siginfo
		if k.pidfd != nil {
			for unix.Waitid(unix.P_PIDFD, int(k.pidfd.Fd()), &info, opts, nil) == unix.EINTR {
			}
		} else {
			for unix.Waitid(unix.P_PID, k.pid, &info, opts, nil) == unix.EINTR {
			}
		}
	}
	if k.pidfd != nil {
		k.pidfd.Close()
		k.pidfd = nil
	}
}

// fileWatch is a registry's one inotify instance for the output files of
// the jobs it adopted (whose keepers write them), and the goroutine that
// wakes each file's reader. It is made by the first adoption and ended by
// the store's close.
type fileWatch struct {
	in   *os.File // non-blocking, in the runtime's poller
	done chan struct{}

	mu   sync.Mutex
	wake map[int32]chan struct{}
}

func newFileWatch() (*fileWatch, error) {
	fd, err := unix.InotifyInit1(unix.IN_NONBLOCK | unix.IN_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("inotify: %w", err)
	}
	w := &fileWatch{in: os.NewFile(uintptr(fd), "inotify"), done: make(chan struct{}), wake: make(map[int32]chan struct{})}
	go w.run()
	return w, nil
}

// add watches the file name and returns the channel its changes poke.
func (w *fileWatch) add(name string) (int32, chan struct{}, error) {
	wd, err := unix.InotifyAddWatch(int(w.in.Fd()), name, unix.IN_MODIFY|unix.IN_CLOSE_WRITE)
	if err != nil {
		return -1, nil, fmt.Errorf("inotify: %w", err)
	}
	c := make(chan struct{}, 1)
	w.mu.Lock()
	w.wake[int32(wd)] = c
	w.mu.Unlock()
	return int32(wd), c, nil
}

func (w *fileWatch) remove(wd int32) {
	w.mu.Lock()
	delete(w.wake, wd)
	w.mu.Unlock()
	unix.InotifyRmWatch(int(w.in.Fd()), uint32(wd))
}

// run wakes the reader of each file that changed, until close.
func (w *fileWatch) run() {
	defer close(w.done)
	buf := make([]byte, 4096)
	for {
		n, err := w.in.Read(buf)
		if err != nil {
			return
		}
		w.mu.Lock()
		for off := 0; off+unix.SizeofInotifyEvent <= n; {
			ev := (*unix.InotifyEvent)(unsafe.Pointer(&buf[off]))
			off += unix.SizeofInotifyEvent + int(ev.Len)
			if c := w.wake[ev.Wd]; c != nil {
				select {
				case c <- struct{}{}:
				default:
				}
			} else if ev.Mask&unix.IN_Q_OVERFLOW != 0 {
				for _, c := range w.wake {
					select {
					case c <- struct{}{}:
					default:
					}
				}
			}
		}
		w.mu.Unlock()
	}
}

func (w *fileWatch) close() {
	w.in.Close()
	<-w.done
}

// fileReader follows an adopted job's output file, which its keeper
// writes. At the end of the file it waits for the file to change (its
// watch pokes it) or its deadline, and it reports io.EOF once done says
// that nothing more will come (the shell has exited, and so has the
// keeper). It punches holes behind what it has read, as tee does.
type fileReader struct {
	f     *os.File
	done  func() bool
	watch *fileWatch
	wd    int32
	wake  chan struct{}
	off   int64
	holes holes

	mu       sync.Mutex // guards deadline
	deadline time.Time
	poke     chan struct{} // SetReadDeadline's wake-up
}

func newFileReader(name string, done func() bool, lim readLimits, w *fileWatch) (*fileReader, error) {
	f, err := os.OpenFile(name, os.O_RDWR, 0)
	if err != nil {
		return nil, err
	}
	// The watch comes before the first read: a write after that read is
	// never missed.
	wd, wake, err := w.add(name)
	if err != nil {
		f.Close()
		return nil, err
	}
	return &fileReader{f: f, done: done, watch: w, wd: wd, wake: wake, holes: holes{lim: lim, hole: lim.keep},
		poke: make(chan struct{}, 1)}, nil
}

func (r *fileReader) Read(p []byte) (int, error) {
	for {
		n, err := r.f.Read(p)
		if n > 0 {
			r.off += int64(n)
			r.holes.punch(int(r.f.Fd()), r.off)
			return n, nil
		}
		if err != nil && err != io.EOF {
			return 0, err
		}
		if r.done() {
			// What was written just before the end.
			if n, _ := r.f.Read(p); n > 0 {
				r.off += int64(n)
				return n, nil
			}
			return 0, io.EOF
		}
		r.mu.Lock()
		d := r.deadline
		r.mu.Unlock()
		var timeout <-chan time.Time
		if !d.IsZero() {
			left := time.Until(d)
			if left <= 0 {
				return 0, os.ErrDeadlineExceeded
			}
			t := time.NewTimer(left)
			defer t.Stop()
			timeout = t.C
		}
		select {
		case <-r.wake:
		case <-r.poke:
		case <-timeout:
		}
	}
}

// SetReadDeadline sets the deadline of the wait at the end of the file;
// it may be called from any goroutine, and wakes a Read that waits.
func (r *fileReader) SetReadDeadline(t time.Time) error {
	r.mu.Lock()
	r.deadline = t
	r.mu.Unlock()
	select {
	case r.poke <- struct{}{}:
	default:
	}
	return nil
}

func (r *fileReader) Close() error {
	r.watch.remove(r.wd)
	return r.f.Close()
}

// Durable mode's input. An interactive job reads a named pipe in its run
// folder (inputFile), so that a host that adopts it after a restart can
// open it again and write on. A job reads end of file only once no
// process holds the FIFO open for writing: besides the host, which comes
// and goes, a holder process per job holds it open from the spawn on,
// so the host's death (or Detach) does not end the job's input.
// CloseInput closes the host's end and kills the holder: the job reads
// what was written, then EOF. The holder also ends by itself when the
// job does: it reads a life pipe whose only write end the job's wrapper
// shell holds (as descriptor 4, closed for the job's own command), and
// exits at its EOF, so it never outlives the job, whether or not a host
// watches.

// holderScript holds the FIFO (descriptor 3) until the life pipe (its
// stdin) ends.
const holderScript = `exec cat >/dev/null`

// lifeFD is the descriptor the wrapper shell gets the life pipe's write
// end as.
const lifeFD = 4

// makeFIFO makes the run folder's input FIFO, 0600.
func makeFIFO(name string) error {
	if err := unix.Mkfifo(name, 0o600); err != nil && err != unix.EEXIST {
		return err
	}
	return unix.Chmod(name, 0o600)
}

// openFIFO opens the durable interactive input in.fifo: the job's end,
// read blocking, which it returns; the host's end, non-blocking, in
// in.conn; and the holder, which holds a third, in in.holder, with the
// life pipe's write end for the wrapper in in.life.
func openFIFO(in *inputPlan) (int, error) {
	// O_NONBLOCK lets the read end open with no writer yet; the job
	// must read a blocking descriptor, so the flag goes once it is open.
	rfd, err := unix.Open(in.fifo, unix.O_RDONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, err
	}
	fail := func(err error) (int, error) {
		unix.Close(rfd)
		in.dropConn()
		return -1, err
	}
	if _, err := unix.FcntlInt(uintptr(rfd), unix.F_SETFL, 0); err != nil {
		return fail(err)
	}
	wfd, err := unix.Open(in.fifo, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return fail(err)
	}
	in.conn = &fileConn{File: os.NewFile(uintptr(wfd), in.fifo)}
	h, life, err := startHolder(in.fifo)
	if err != nil {
		return fail(fmt.Errorf("input holder: %w", err))
	}
	in.holder, in.life, in.hasLife = h, life, true
	in.onEOF = h.letGo
	return rfd, nil
}

// startHolder starts the holder of the FIFO name (see above) and returns
// it, with the write end of its life pipe.
func startHolder(name string) (*keeper, int, error) {
	hold, err := unix.Open(name, unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, -1, err
	}
	defer unix.Close(hold)
	var life [2]int
	if err := rawPipe(&life); err != nil {
		return nil, -1, err
	}
	defer unix.Close(life[0])
	null, err := openDevNull()
	if err != nil {
		unix.Close(life[1])
		return nil, -1, err
	}
	pidfd := -1
	attr := &syscall.ProcAttr{
		Env:   []string{"PATH=/usr/local/bin:/usr/bin:/bin"},
		Files: []uintptr{uintptr(life[0]), uintptr(null), uintptr(null), uintptr(hold)},
		Sys:   &syscall.SysProcAttr{Setsid: true, PidFD: &pidfd},
	}
	pid, err := syscall.ForkExec(wrapperShell, []string{"sh", "-c", holderScript, "bgjob-input"}, attr)
	if err != nil {
		unix.Close(life[1])
		return nil, -1, err
	}
	k := &keeper{pid: pid, child: true, mine: true}
	if pidfd >= 0 {
		k.pidfd = os.NewFile(uintptr(pidfd), "pidfd")
	}
	return k, life[1], nil
}

// letGo kills the holder, for CloseInput, from any goroutine: through
// its pidfd, which pins it, so a reused PID is never hit. Its reaping
// is left to the job's end (stop or reap).
func (k *keeper) letGo() error {
	var err error
	if k.pidfd != nil {
		err = unix.PidfdSendSignal(int(k.pidfd.Fd()), unix.SIGKILL, nil, 0)
	} else {
		err = unix.Kill(k.pid, unix.SIGKILL)
	}
	if err == unix.ESRCH {
		return nil // it has ended already: the job has
	}
	return err
}

// adoptInput opens again, after a restart, the input of an interactive
// job that rec describes: the host's end of its FIFO in run, and its
// holder. A FIFO with no reader left (the job closed its stdin) gives no
// connection: the input is closed.
func adoptInput(rec *record, run string) (inputConn, *keeper, error) {
	h, err := adoptKeeper(rec.HolderPID, rec.HolderStart)
	if err != nil {
		return nil, nil, fmt.Errorf("input holder: %w", err)
	}
	wfd, err := unix.Open(filepath.Join(run, inputFile), unix.O_WRONLY|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if err == unix.ENXIO || err == unix.ENOENT {
		return nil, h, nil
	}
	if err != nil {
		if h != nil {
			h.reap(false)
		}
		return nil, nil, err
	}
	return &fileConn{File: os.NewFile(uintptr(wfd), inputFile)}, h, nil
}
