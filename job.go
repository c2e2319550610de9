package bgjob

import (
	"time"
)

// ID names a job. It is "job_" followed by 16 hex digits of a keyed hash of
// the job's launch parameters (see [Registry.Start]). Knowing an ID is the
// right to poll and cancel the job it names. The session is part of the
// hash, so an ID only ever names jobs of one session: a host that scopes
// IDs to a client can check Snapshot.Session once.
type ID string

// Spec describes a command to run as a job.
//
// The zero value of every field but Command is usable. A Spec is validated
// before any process starts; a bad field gives an error that wraps
// [ErrInvalidSpec] and names the field.
type Spec struct {
	// Command is run as Config.Shell followed by Command, so on Unix
	// it is a /bin/sh command line by default. It must not be empty or
	// hold a NUL byte.
	Command string

	// Dir is the working directory. If Dir is empty, Config.Dir is used;
	// a relative Dir is taken relative to that. It must exist and be a
	// directory when the job is launched.
	Dir string

	// Env is added to the job's base environment (Config.Env), replacing
	// variables of the same name. Keys must be non-empty and hold neither
	// '=' nor NUL; values must not hold NUL.
	Env map[string]string

	// Stdin is written to the job's standard input, which is then closed.
	// If Stdin is empty the job reads an empty input; it never reads the
	// host's standard input.
	Stdin string

	// Timeout limits the job's wall-clock time from its start. If Timeout
	// is 0, Config.DefaultTimeout applies. A negative Timeout is invalid.
	Timeout time.Duration

	// IdleTimeout limits the time the job may go without writing any
	// output; every byte resets it. If IdleTimeout is 0 there is no idle
	// limit. A negative IdleTimeout is invalid.
	IdleTimeout time.Duration

	// Session scopes the job to an owner, such as one client connection.
	// Jobs of different sessions never coalesce, and List and Completions
	// return only the jobs of the session they are given.
	Session string

	// Unique makes the launch always start a new job, even if an
	// identical one is running.
	Unique bool
}

// State is the lifecycle state of a job. A job is Running until it reaches
// one of the terminal states, which it never leaves.
type State int

const (
	// Running: the job has been launched and has not ended.
	Running State = iota
	// Exited: the command ran to its end; ExitCode holds its status.
	Exited
	// Cancelled: the job was stopped by Cancel or Close.
	Cancelled
	// TimedOut: the job hit its Timeout or IdleTimeout.
	TimedOut
	// Failed: the job could not be run, for example because the shell
	// could not be started; Reason says why.
	Failed
)

var stateNames = [...]string{"running", "exited", "cancelled", "timed_out", "failed"}

// String returns "running", "exited", "cancelled", "timed_out" or "failed".
func (s State) String() string {
	if s >= 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// Done reports whether s is a terminal state.
func (s State) Done() bool { return s != Running }

// Exit codes that bgjob reports in place of the command's own status.
const (
	exitUnknown   = -1  // still running, or never ran
	exitTimedOut  = 124 // as timeout(1) reports it
	exitCancelled = 130 // as a shell reports an interrupt (128 + SIGINT)
)

// Snapshot is a copy of a job's state at one moment. Nothing in it is
// shared with the registry.
type Snapshot struct {
	ID      ID
	Session string
	Command string
	Dir     string // the working directory the job ran in
	State   State

	// ExitCode is, for Exited, the command's status (128+n if the
	// shell was killed by signal n); 124 for TimedOut; 130 for
	// Cancelled; -1 while running and for Failed.
	ExitCode int

	// PID is the shell's process ID; 0 if it never started, and on a
	// joiner's snapshot taken while the first launch is still spawning
	// the process (Status has it a moment later).
	PID     int
	Started time.Time // when the job was launched
	Ended   time.Time // zero while running

	// Joined is set on the Snapshot returned by Start or RunForeground
	// when the call joined a job that was already running instead of
	// starting a new one.
	Joined bool

	Output Output

	// Containment says what held the job's processes: on Linux a cgroup
	// of the job's own (ContainCgroup) wherever the host can make one,
	// else its session (ContainSession); a Job Object on Windows. It is
	// set once the process has started.
	Containment Containment

	// Reason is a short, content-free explanation for Failed, TimedOut
	// and Cancelled jobs, such as "idle for 30s" or "spawn: no such file
	// or directory". It never holds the command's output.
	Reason string
}

// Output is the admitted output of a job. stdout and stderr share one
// stream, so their interleaving is kept.
type Output struct {
	// Text is the admitted text. When bytes were dropped it is the head
	// of the stream, one omission line, and the tail.
	Text string

	// Total is the number of bytes the command has written so far.
	Total int64

	// Omitted is the number of bytes of Total that Text does not hold.
	Omitted int64

	// Withheld reports that the Admitter withheld the text; Text is
	// then empty.
	Withheld bool

	// Notice is a content-free remark for the reader: truncation,
	// withholding, leftover processes that were stopped.
	Notice string
}

// Chunk is a piece of a job's output stream returned by [Registry.Read].
type Chunk struct {
	// Data holds the admitted form of the stream's bytes from Offset up
	// to Next. Without an Admitter it is exactly those bytes.
	Data string

	// Offset is the absolute stream offset of the first byte Data
	// stands for.
	Offset int64

	// Next is the offset to pass to the next Read.
	Next int64

	// Skipped counts the bytes between the offset asked for and Offset
	// that the registry no longer holds (they were dropped between the
	// head and the tail, or are part of a line cut by that drop).
	Skipped int64

	// Done reports that the job has ended and Next is the end of the
	// stream: there is nothing more to read.
	Done bool
}

// Foreground configures [Registry.RunForeground].
type Foreground struct {
	// SoftCap is how long RunForeground waits inline before it
	// detaches. If SoftCap is 0, it waits 30s.
	SoftCap time.Duration

	// OnProgress, if not nil, is called about every
	// Config.ProgressInterval while RunForeground waits, with the real
	// time elapsed since the call began. It is called in the caller's
	// goroutine, never before the first interval has passed and never
	// after RunForeground returns. If it panics, the panic reaches the
	// caller and the job goes on, detached.
	OnProgress func(elapsed time.Duration)
}

// Result is what [Registry.RunForeground] returns.
type Result struct {
	// Snapshot is the final snapshot if the job ended inline, or the
	// running job's snapshot if it detached.
	Snapshot

	// Detached reports that the job is still running: poll it with
	// Status or Read, block on it with Wait, or stop it with Cancel.
	Detached bool
}

// Completion records that a pollable job ended. See
// [Registry.Completions].
type Completion struct {
	ID       ID
	Session  string
	Command  string
	State    State
	ExitCode int
	Ended    time.Time
}

// Containment is what holds a job's processes, so that a stop reaches
// every one of them and the job is done only when none is left. See
// Snapshot.Containment and Config.Cgroup.
type Containment int

const (
	// ContainSession: the job's shell leads a session of its own (Unix).
	// A stop reaches every process group of that session, and on Linux
	// also every process that carries the job's marker in its
	// environment (BGJOB_JOB), which finds processes that left the
	// session with setsid. A process that leaves the session and also
	// drops that variable (env -i, setsid env -u BGJOB_JOB ...) escapes.
	ContainSession Containment = iota
	// ContainCgroup: the job runs in a cgroup v2 of its own (Linux),
	// which no process of the job can leave: setsid, double forks and
	// daemons included. A stop signals every process group in it, then
	// kills the whole cgroup (cgroup.kill).
	ContainCgroup
	// ContainJobObject: the job runs in a Job Object (Windows), which
	// no process of the job can leave.
	ContainJobObject
)

var containNames = [...]string{"session", "cgroup", "job_object"}

// String returns "session", "cgroup" or "job_object".
func (c Containment) String() string {
	if c >= 0 && int(c) < len(containNames) {
		return containNames[c]
	}
	return "unknown"
}
