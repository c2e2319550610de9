package bgjob

import "errors"

// Errors returned by the registry. Each is wrapped with context; test for
// them with errors.Is.
var (
	// ErrNotFound: no job with that ID is running or retained, or,
	// through a [Session] view, none of that session. Returned by
	// Status, Read, ReadWait, Wait, Cancel, Watch and WaitFor (of a
	// Registry or a Session), and by the Read of a reader from Follow.
	ErrNotFound = errors.New("bgjob: job not found")

	// ErrClosed: the registry has been closed. Returned by Start,
	// RunForeground, Readmit and Detach, by NextCompletion once
	// Close or Detach has returned and the session's queue is empty,
	// and by Cancel of a job that Detach released.
	ErrClosed = errors.New("bgjob: registry closed")

	// ErrTooManyRunning: the launch would exceed Config.MaxRunning
	// running jobs, or with Config.Queue, Config.MaxQueued queued ones.
	// Returned by Start and RunForeground; joining a running or queued
	// job never fails with it.
	ErrTooManyRunning = errors.New("bgjob: too many running jobs")

	// ErrInvalidSpec: a Spec field is malformed; the message names it.
	// Returned by Start and RunForeground before any process starts.
	ErrInvalidSpec = errors.New("bgjob: invalid spec")

	// ErrRejected: Config.Guard refused the launch; the Guard's error is
	// wrapped too. Returned by Start and RunForeground.
	ErrRejected = errors.New("bgjob: rejected")

	// ErrUnsupported: the feature is not available on this platform or
	// in this configuration. Returned by New and Detach, and by Start and
	// RunForeground for limits or a sandbox this host cannot enforce
	// (the message names the field and what is missing), and for
	// Spec.TTY in durable mode or where there are no pseudo-terminals,
	// before any process starts.
	ErrUnsupported = errors.New("bgjob: unsupported")

	// ErrInvalidConfig: a Config field is malformed; the message names
	// it. Returned by New.
	ErrInvalidConfig = errors.New("bgjob: invalid config")

	// ErrInUse: the state directory (Config.StateDir) is held by another
	// Registry, in this process or another; it is let go when that
	// Registry is closed or detached, or its process dies. (A dead process's
	// lock may be let go a moment late, while a child it was starting
	// still holds a copy: New waits up to 2s for that.) Returned by
	// New.
	ErrInUse = errors.New("bgjob: state directory in use")

	// ErrInvalidArgument: an argument other than a Spec is out of range,
	// such as a negative offset, or an offset inside a line of text that
	// the Admitter rewrote (continue from Chunk.Next); the message names
	// it. Returned by Read, ReadWait and a Follow reader's Read, by
	// Watch (no Pattern, a name taken), WaitFor (no pattern, a negative
	// offset) and Resize for a zero size, and by Wait called from the
	// job's own Admitter as the job ends.
	ErrInvalidArgument = errors.New("bgjob: invalid argument")

	// ErrSpawn: the job never ran: its process could not be started (a
	// missing shell or program, a working directory removed before the
	// spawn, no descriptors left, a Config.Launcher that failed), its
	// sandbox could not be made, or its record could not be written.
	// Returned by Snapshot.Err (and so by Result's) for such a job. Start
	// and RunForeground return the job's snapshot with a nil error, since
	// a job was launched and can be polled: check s.Err() too.
	ErrSpawn = errors.New("bgjob: job never ran")

	// ErrJobEnded: the job's output has ended. WaitFor returns an
	// *EndedError that wraps it (and holds the final snapshot) when the
	// job ends without a line that matches; Watch returns it for a job
	// that has ended.
	ErrJobEnded = errors.New("bgjob: job ended")

	// ErrInputClosed: the job's input is closed: by CloseInput, by the
	// job's end, or by the job itself (it closed its end of the pipe).
	// Returned by Write and CloseInput (of a Registry or a Session).
	ErrInputClosed = errors.New("bgjob: input closed")

	// ErrNotInteractive: the job was not launched with Spec.Interactive
	// (for Write and CloseInput) or Spec.TTY (for Resize and Screen).
	// Returned by Write, CloseInput, Resize and Screen (of a Registry or
	// a Session).
	ErrNotInteractive = errors.New("bgjob: job not interactive")
)
