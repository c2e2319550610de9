//go:build windows

package bgjob

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/windows"
)

// A TTY job on Windows runs attached to a pseudo console (ConPTY,
// Windows 10 1809 and later): the host writes the console's input as
// keys and reads its output, a VT stream, through the same reader as a
// pipe's. The console belongs to the job's input (conptyConn), which
// closes it at the job's end.

var procCreatePseudoConsole = windows.NewLazySystemDLL("kernel32.dll").NewProc("CreatePseudoConsole")

// ttySupported reports whether this Windows has pseudo consoles.
func ttySupported() error {
	if procCreatePseudoConsole.Find() != nil {
		return fmt.Errorf("no pseudo console (ConPTY needs Windows 10 1809 or later): %w", ErrUnsupported)
	}
	return nil
}

// startOnConPTY carries out pl for a TTY job: as startJob, except that
// the shell gets no standard handles of its own but the pseudo console,
// and no console process group of its own, so that Ctrl-C typed at the
// console reaches it. A cancel therefore has no polite step: the Job
// Object is terminated after the grace.
func startOnConPTY(pl *plan, app, cmdline *uint16, block []uint16, dirp *uint16) (_ *process, _ outputReader, err error) {
	rd, out, err := outputPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	defer windows.CloseHandle(out)
	defer func() {
		if err != nil {
			rd.Close()
		}
	}()
	w, in, err := inputPipe()
	if err != nil {
		return nil, nil, fmt.Errorf("pipe: %w", err)
	}
	defer windows.CloseHandle(in)
	rows, cols := ttySize(pl.input.tty)
	var hpc windows.Handle
	if err := windows.CreatePseudoConsole(windows.Coord{X: int16(cols), Y: int16(rows)}, in, out, 0, &hpc); err != nil {
		w.Close()
		return nil, nil, fmt.Errorf("pseudo console: %w", err)
	}
	conn := &conptyConn{inputWriter: w, hpc: hpc}
	defer func() {
		if err != nil {
			conn.Close()
		}
	}()
	// The limits are set on the job before the shell exists, as in
	// startJob.
	job, port, err := newJob(pl.limits)
	if err != nil {
		return nil, nil, fmt.Errorf("job object: %w", err)
	}
	defer func() {
		if err != nil {
			windows.CloseHandle(job)
			if port != 0 {
				windows.CloseHandle(port)
			}
		}
	}()

	attrs, err := windows.NewProcThreadAttributeList(1)
	if err != nil {
		return nil, nil, err
	}
	defer attrs.Delete()
	// The attribute's value is the HPCON itself, passed as a pointer.
	if err := attrs.Update(windows.PROC_THREAD_ATTRIBUTE_PSEUDOCONSOLE, *(*unsafe.Pointer)(unsafe.Pointer(&hpc)), unsafe.Sizeof(hpc)); err != nil {
		return nil, nil, err
	}
	si := new(windows.StartupInfoEx)
	si.Cb = uint32(unsafe.Sizeof(*si))
	si.ProcThreadAttributeList = attrs.List()
	// No STARTF_USESTDHANDLES and no inherited handles: the shell's
	// standard handles are the pseudo console's.
	flags := uint32(windows.CREATE_SUSPENDED | windows.CREATE_UNICODE_ENVIRONMENT | windows.EXTENDED_STARTUPINFO_PRESENT)
	var pi windows.ProcessInformation
	err = windows.CreateProcess(app, cmdline, nil, nil, false, flags, &block[0], dirp, &si.StartupInfo, &pi)
	runtime.KeepAlive(block)
	if err != nil {
		return nil, nil, err
	}
	defer windows.CloseHandle(pi.Thread)
	if err := windows.AssignProcessToJobObject(job, pi.Process); err != nil {
		windows.TerminateProcess(pi.Process, killExitCode)
		windows.CloseHandle(pi.Process)
		return nil, nil, fmt.Errorf("assign to job object: %w", err)
	}
	if _, err := windows.ResumeThread(pi.Thread); err != nil {
		windows.TerminateJobObject(job, killExitCode)
		windows.CloseHandle(pi.Process)
		return nil, nil, fmt.Errorf("resume: %w", err)
	}
	pl.input.conn = conn
	return &process{pid: int(pi.ProcessId), proc: pi.Process, job: job, port: port, watched: port != 0}, rd, nil
}
