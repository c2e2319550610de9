//go:build windows

package bgjob

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/windows"
)

// Interactive jobs on Windows: the job's stdin is the client end of a
// named pipe whose server end the host writes, overlapped, so that a
// write waits without a thread and honours its deadline; a TTY job's
// input and output are a pseudo console's (conpty_windows.go).

// inputWriter is the host's end of a job's input: an *os.File on the
// runtime's I/O completion port (Go 1.25 and later), else an
// overlappedReader used for writing.
type inputWriter interface {
	Write(p []byte) (int, error)
	SetWriteDeadline(t time.Time) error
	Close() error
}

// inputPipe makes an interactive job's stdin pipe: the host's end, and
// the job's (a plain, synchronous read handle, not inheritable).
func inputPipe() (inputWriter, windows.Handle, error) {
	name, err := windows.UTF16PtrFromString(fmt.Sprintf(`\\.\pipe\bgjob-in-%d-%s`, os.Getpid(), randomHex()))
	if err != nil {
		return nil, 0, err
	}
	w, err := windows.CreateNamedPipe(name,
		windows.PIPE_ACCESS_OUTBOUND|windows.FILE_FLAG_OVERLAPPED|windows.FILE_FLAG_FIRST_PIPE_INSTANCE,
		windows.PIPE_TYPE_BYTE|windows.PIPE_READMODE_BYTE|windows.PIPE_WAIT|windows.PIPE_REJECT_REMOTE_CLIENTS,
		1, 64<<10, 0, 0, nil)
	if err != nil {
		return nil, 0, err
	}
	// The client end is opened at once, so no other process can take
	// the instance.
	r, err := windows.CreateFile(name, windows.GENERIC_READ|windows.FILE_WRITE_ATTRIBUTES, 0, nil, windows.OPEN_EXISTING, 0, 0)
	if err != nil {
		windows.CloseHandle(w)
		return nil, 0, err
	}
	iw, err := newInputWriter(w)
	if err != nil {
		windows.CloseHandle(w)
		windows.CloseHandle(r)
		return nil, 0, err
	}
	return iw, r, nil
}

// newInputWriter wraps the overlapped write end h, as newOutputReader
// does a read end: on the completion port if the runtime takes it, else
// through an overlappedReader, which writes too.
func newInputWriter(h windows.Handle) (inputWriter, error) {
	self := windows.CurrentProcess()
	var dup windows.Handle
	if err := windows.DuplicateHandle(self, h, self, &dup, 0, false, windows.DUPLICATE_SAME_ACCESS); err == nil {
		f := os.NewFile(uintptr(dup), "bgjob-input")
		if f.SetWriteDeadline(time.Time{}) == nil {
			windows.CloseHandle(h)
			return f, nil
		}
		f.Close()
	}
	return newOverlappedReader(h)
}

// SetWriteDeadline sets the deadline of Write: the reader's one, as an
// overlappedReader is used in one direction only.
func (r *overlappedReader) SetWriteDeadline(t time.Time) error { return r.SetReadDeadline(t) }

// Write writes b to the overlapped handle, waiting for the pipe to take
// it until the deadline.
func (r *overlappedReader) Write(b []byte) (int, error) {
	written := 0
	for written < len(b) {
		r.mu.Lock()
		d, closed := r.deadline, r.closed
		r.mu.Unlock()
		if closed {
			return written, os.ErrClosed
		}
		if !d.IsZero() && !time.Now().Before(d) {
			return written, os.ErrDeadlineExceeded
		}
		var n uint32
		windows.ResetEvent(r.ov.HEvent)
		chunk := b[written:]
		if len(chunk) > 1<<30 {
			chunk = chunk[:1<<30]
		}
		err := windows.WriteFile(r.h, chunk, &n, r.ov)
		if err == windows.ERROR_IO_PENDING {
			n, err = r.await()
		}
		written += int(n)
		if err != nil {
			return written, err
		}
	}
	return written, nil
}

// pipeConn is an interactive job's stdin pipe (see inputConn).
type pipeConn struct{ inputWriter }

func (c pipeConn) eof() error                  { return c.Close() }
func (c pipeConn) resize(uint16, uint16) error { return ErrNotInteractive }
func (c pipeConn) writeNow([]byte) (int, error) {
	return 0, nil // no write without waiting here: a feeder writes Spec.Stdin
}

// errBrokenPipe reports a write to a pipe whose reader is gone.
func errBrokenPipe(err error) bool {
	return errors.Is(err, windows.ERROR_BROKEN_PIPE) || errors.Is(err, windows.ERROR_NO_DATA) ||
		errors.Is(err, windows.ERROR_PIPE_NOT_CONNECTED)
}

// keeper is durable mode's keeper or input holder: none on Windows,
// where durable mode is unsupported.
type keeper struct{}

func (*keeper) stop()        {}
func (*keeper) letGo() error { return nil }

// holdInput: durable mode is unsupported on Windows.
func (p *process) holdInput(*inputPlan) {}

// holderOf returns 0: durable mode is unsupported on Windows.
func (p *process) holderOf() int { return 0 }

// dropLife: there is no life pipe on Windows.
func (ip *inputPlan) dropLife() {}

// conptyConn is a TTY job's input on Windows: the pipe the pseudo
// console reads as typed keys, and the pseudo console itself, which it
// owns: closed with it, at the job's end, under mu so that a Resize
// never reaches a closed one.
type conptyConn struct {
	inputWriter
	mu     sync.Mutex
	hpc    windows.Handle
	closed bool
}

// eof types Ctrl-Z and Enter, the console's end of file for a program
// reading lines, waiting a moment at most.
func (c *conptyConn) eof() error {
	c.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	_, err := c.Write([]byte("\x1a\r"))
	if errors.Is(err, os.ErrDeadlineExceeded) {
		return errors.New("the console's input is full: end of file not typed")
	}
	return err
}

// resize sets the pseudo console's size. Wine does not implement it
// (E_NOTIMPL).
func (c *conptyConn) resize(rows, cols uint16) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return os.ErrClosed
	}
	return windows.ResizePseudoConsole(c.hpc, windows.Coord{X: int16(cols), Y: int16(rows)})
}

func (c *conptyConn) writeNow([]byte) (int, error) { return 0, nil }

// Close closes the input and then the pseudo console, which ends the
// programs still attached to it.
func (c *conptyConn) Close() error {
	err := c.inputWriter.Close()
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.closed {
		c.closed = true
		windows.ClosePseudoConsole(c.hpc)
	}
	return err
}
