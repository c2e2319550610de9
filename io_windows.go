//go:build windows

package bgjob

import (
	"fmt"
	"io"
	"os"
	"sync"
	"time"

	"golang.org/x/sys/windows"
)

// outputPipe makes the job's output pipe: the parent's end as an
// outputReader, the child's as a plain write handle. Neither handle is
// inheritable.
func outputPipe() (outputReader, windows.Handle, error) {
	r, w, err := namedPipe()
	if err != nil {
		return nil, 0, err
	}
	rd, err := newOutputReader(r)
	if err != nil {
		windows.CloseHandle(r)
		windows.CloseHandle(w)
		return nil, 0, err
	}
	return rd, w, nil
}

// namedPipe makes a one-way pipe whose read end r does overlapped I/O.
// Anonymous pipes cannot, so it is a named pipe with a random name, one
// instance and no remote clients. The write end w is opened at once, so
// no other process can take the instance.
func namedPipe() (r, w windows.Handle, err error) {
	name, err := windows.UTF16PtrFromString(fmt.Sprintf(`\\.\pipe\bgjob-%d-%s`, os.Getpid(), randomHex()))
	if err != nil {
		return 0, 0, err
	}
	r, err = windows.CreateNamedPipe(name,
		windows.PIPE_ACCESS_INBOUND|windows.FILE_FLAG_OVERLAPPED|windows.FILE_FLAG_FIRST_PIPE_INSTANCE,
		windows.PIPE_TYPE_BYTE|windows.PIPE_READMODE_BYTE|windows.PIPE_WAIT|windows.PIPE_REJECT_REMOTE_CLIENTS,
		1, 0, maxReadBuf, 0, nil)
	if err != nil {
		return 0, 0, err
	}
	w, err = windows.CreateFile(name, windows.GENERIC_WRITE|windows.FILE_READ_ATTRIBUTES, 0, nil, windows.OPEN_EXISTING, 0, 0)
	if err != nil {
		windows.CloseHandle(r)
		return 0, 0, err
	}
	return r, w, nil
}

// newOutputReader wraps the overlapped read end h of the output pipe.
//
// Since Go 1.25, os.NewFile puts an overlapped handle on the runtime's
// I/O completion port, and its reads then honour deadlines while
// holding no thread: that is preferred. It is tried on a copy of h,
// because an os.File that cannot poll is of no use and closes its handle
// when closed. Otherwise (an older Go, or a system that does not report
// the handle as overlapped) reads go through overlappedReader.
func newOutputReader(h windows.Handle) (outputReader, error) {
	self := windows.CurrentProcess()
	var dup windows.Handle
	if err := windows.DuplicateHandle(self, h, self, &dup, 0, false, windows.DUPLICATE_SAME_ACCESS); err == nil {
		f := os.NewFile(uintptr(dup), "bgjob-output")
		if f.SetReadDeadline(time.Time{}) == nil {
			windows.CloseHandle(h)
			return f, nil
		}
		// Not pollable: the file never touched the completion port.
		f.Close()
	}
	return newOverlappedReader(h)
}

// overlappedReader reads an overlapped handle with deadlines by waiting
// on the read's event and on a wake event that SetReadDeadline sets. A
// Read holds its goroutine's thread while it waits, and no goroutine is
// started. Read may run in one goroutine at a time; SetReadDeadline and
// Close in any.
type overlappedReader struct {
	h    windows.Handle
	ov   *windows.Overlapped // heap-allocated: the kernel writes to it while a read is pending
	wake windows.Handle      // auto-reset event: the deadline changed

	mu       sync.Mutex // guards deadline and closed
	deadline time.Time
	closed   bool
}

func newOverlappedReader(h windows.Handle) (*overlappedReader, error) {
	ev, err := windows.CreateEvent(nil, 1, 0, nil)
	if err != nil {
		return nil, err
	}
	wake, err := windows.CreateEvent(nil, 0, 0, nil)
	if err != nil {
		windows.CloseHandle(ev)
		return nil, err
	}
	return &overlappedReader{h: h, ov: &windows.Overlapped{HEvent: ev}, wake: wake}, nil
}

func (r *overlappedReader) SetReadDeadline(t time.Time) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return os.ErrClosed
	}
	r.deadline = t
	windows.SetEvent(r.wake)
	return nil
}

func (r *overlappedReader) Read(b []byte) (int, error) {
	if len(b) == 0 {
		return 0, nil
	}
	if len(b) > 1<<30 {
		b = b[:1<<30]
	}
	for {
		r.mu.Lock()
		d, closed := r.deadline, r.closed
		r.mu.Unlock()
		if closed {
			return 0, os.ErrClosed
		}
		if !d.IsZero() && !time.Now().Before(d) {
			return 0, os.ErrDeadlineExceeded
		}
		var n uint32
		windows.ResetEvent(r.ov.HEvent)
		err := windows.ReadFile(r.h, b, &n, r.ov)
		if err == windows.ERROR_IO_PENDING {
			n, err = r.await()
		}
		switch {
		case err == windows.ERROR_BROKEN_PIPE || err == windows.ERROR_PIPE_NOT_CONNECTED:
			return 0, io.EOF
		case err != nil:
			return int(n), err
		case n > 0:
			return int(n), nil
		}
		// A zero-byte write by the child: not the end, read again.
	}
}

// await waits for the pending read to complete, or for the deadline, in
// which case it cancels the read.
func (r *overlappedReader) await() (uint32, error) {
	var n uint32
	for {
		r.mu.Lock()
		d := r.deadline
		r.mu.Unlock()
		ms := uint32(windows.INFINITE)
		if !d.IsZero() {
			left := time.Until(d)
			if left <= 0 {
				break
			}
			// Round up, so that the wait does not end just before
			// the deadline; cap below INFINITE.
			ms = uint32(min((left+time.Millisecond-1)/time.Millisecond, windows.INFINITE-1))
		}
		ev, err := windows.WaitForMultipleObjects([]windows.Handle{r.ov.HEvent, r.wake}, false, ms)
		if err != nil {
			break
		}
		if ev == windows.WAIT_OBJECT_0 {
			err := windows.GetOverlappedResult(r.h, r.ov, &n, false)
			return n, err
		}
		// The deadline changed, or passed: look again.
	}
	windows.CancelIoEx(r.h, r.ov)
	err := windows.GetOverlappedResult(r.h, r.ov, &n, true)
	if err == windows.ERROR_OPERATION_ABORTED {
		return 0, os.ErrDeadlineExceeded
	}
	return n, err // it completed before the cancel
}

func (r *overlappedReader) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.closed {
		return os.ErrClosed
	}
	r.closed = true
	windows.CloseHandle(r.wake)
	windows.CloseHandle(r.ov.HEvent)
	return windows.CloseHandle(r.h)
}
