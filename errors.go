package bgjob

import "errors"

// Errors returned by the registry. Each is wrapped with context; test for
// them with errors.Is.
var (
	// ErrNotFound: no job with that ID is running or retained.
	// Returned by Status, Read, Wait and Cancel.
	ErrNotFound = errors.New("bgjob: job not found")

	// ErrClosed: the registry has been closed. Returned by Start,
	// RunForeground, Readmit and Detach.
	ErrClosed = errors.New("bgjob: registry closed")

	// ErrTooManyRunning: the launch would exceed Config.MaxRunning
	// running jobs. Returned by Start and RunForeground; joining a
	// running job never fails with it.
	ErrTooManyRunning = errors.New("bgjob: too many running jobs")

	// ErrInvalidSpec: a Spec field is malformed; the message names it.
	// Returned by Start and RunForeground before any process starts.
	ErrInvalidSpec = errors.New("bgjob: invalid spec")

	// ErrRejected: Config.Guard refused the launch; the Guard's error is
	// wrapped too. Returned by Start and RunForeground.
	ErrRejected = errors.New("bgjob: rejected")

	// ErrUnsupported: the feature is not available on this platform or
	// in this configuration. Returned by New and Detach.
	ErrUnsupported = errors.New("bgjob: unsupported")

	// ErrInvalidConfig: a Config field is malformed; the message names
	// it. Returned by New.
	ErrInvalidConfig = errors.New("bgjob: invalid config")

	// ErrInUse: the state directory (Config.StateDir) is held by another
	// Registry, in this process or another; it is let go when that
	// Registry is closed or detached, or its process dies. Returned by
	// New.
	ErrInUse = errors.New("bgjob: state directory in use")

	// ErrInvalidArgument: an argument other than a Spec is out of range,
	// such as a negative offset; the message names it. Returned by Read.
	ErrInvalidArgument = errors.New("bgjob: invalid argument")
)
