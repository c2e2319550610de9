package bgjob

import (
	"fmt"
	"strings"
	"time"
)

// ID names a job. It is "job_" followed by 16 hex digits of a keyed hash of
// the job's launch parameters (see [Registry.Start]). Knowing an ID is the
// right to poll and cancel the job it names. The session is part of the
// hash, so an ID only ever names jobs of one session: a host that scopes
// IDs to a client gives the client a [Session] view, which finds no job
// of another session.
type ID string

// Spec describes a command to run as a job.
//
// Exactly one of Command and Args must be set; the zero value of every
// other field is usable. A Spec is validated before any process starts; a
// bad field gives an error that wraps [ErrInvalidSpec] and names the
// field.
type Spec struct {
	// Command is run as Config.Shell followed by Command, so on Unix
	// it is a /bin/sh command line by default. It must not be blank or
	// hold a NUL byte. It must be empty when Args is set.
	Command string

	// Args, if not empty, is an argument vector run with no shell:
	// Args[0] is the program and the rest its arguments, passed as they
	// are, so nothing needs quoting. As in os/exec, an Args[0] without a
	// path separator is looked up in the host's PATH when the job is
	// launched (never the job's Spec.Env PATH), and a relative path
	// with a separator is taken relative to the job's directory; the
	// program gets the path found as its argv[0]. A program that cannot
	// be found makes a Failed job, as a missing shell does (see
	// Snapshot.Err). Args[0] must not be empty, and no argument may hold
	// a NUL byte. It is also the fast path: one exec instead of a shell's
	// two.
	//
	// On Windows the command line is built by the rules that
	// CommandLineToArgvW (and the C runtime) split it by, every
	// argument quoted alike; cmd.exe given as Args[0] gets no special
	// treatment, so run cmd syntax through Command instead.
	//
	// A job launched with Args shows, as Snapshot.Command (and in its
	// Completion and AdmitRequest), the arguments quoted for a POSIX
	// shell: a word of letters, digits and @%+=:,./_- as it is, any
	// other in single quotes. On Unix, that Command run by /bin/sh runs
	// the same argv.
	Args []string

	// Dir is the working directory. If Dir is empty, Config.Dir is used;
	// a relative Dir is taken relative to that. It must exist and be a
	// directory when the job is launched.
	Dir string

	// Env is added to the job's base environment (Config.Env), replacing
	// variables of the same name. Keys must be non-empty and hold neither
	// '=' nor NUL; values must not hold NUL.
	Env map[string]string

	// Stdin is written to the job's standard input, which is then closed
	// (for an Interactive job, it is written first and the input stays
	// open). If Stdin is empty the job reads an empty input; it never
	// reads the host's standard input.
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
	// return only the jobs of the session they are given. A [Session]
	// view fills it in, and answers ErrNotFound for other sessions' IDs.
	Session string

	// Unique makes the launch always start a new job, even if an
	// identical one is running.
	Unique bool

	// Limits bounds what the job may use (see [Limits]); a zero field
	// takes Config.Limits's. A launch with limits this host cannot
	// enforce fails before any process starts, with ErrUnsupported.
	// Launches with different limits are different jobs: they never
	// coalesce.
	Limits Limits

	// Watches are the job's watches from its first byte of output on
	// (see [Watch]): each Pattern must be non-nil and each Name
	// distinct. [Registry.Watch] adds one to a running job. Launches
	// with different watches (names, patterns or Every, in order) are
	// different jobs: they never coalesce.
	Watches []Watch

	// Sandbox, if set, says what the job may write, read and reach (see
	// [Sandbox]); if nil, Config.Sandbox applies. A launch whose sandbox
	// this host cannot enforce fails before any process starts, with
	// ErrUnsupported; a bad path fails with ErrInvalidSpec naming it.
	Sandbox *Sandbox

	// Interactive keeps the job's standard input open after Stdin: the
	// host writes to it with [Registry.Write] and ends it with
	// [Registry.CloseInput] (the job then reads EOF). The input also
	// closes when the job ends. An interactive launch never joins a
	// running job, nor is joined: each launch is a conversation of its
	// own (as if Unique were set).
	Interactive bool

	// TTY, if not nil, runs the job under a pseudo-terminal of this size
	// (see [TTY]), and implies Interactive: the job's stdin, stdout and
	// stderr are the terminal, which is its controlling terminal, so
	// programs behave as they do for a person at a terminal (prompts,
	// colours, line editing, full-screen programs). The terminal's line
	// discipline is in the way of what is written and read: Write("\x03")
	// interrupts the job's foreground process group as Ctrl-C does, what
	// is written is echoed, and "\n" comes out as "\r\n". The job
	// stays in its own session and containment. Output.Text of a TTY
	// job is its stream with terminal escape sequences removed, Read
	// still serves the raw stream, and [Registry.Screen] renders the
	// screen. A TTY job gets TERM=xterm-256color unless Env sets TERM.
	//
	// On Windows the terminal is a pseudo console (ConPTY). In durable
	// mode, and on Unix systems other than Linux, a TTY launch fails
	// with ErrUnsupported before any process starts: the terminal lives
	// in the host, and would not survive its restart.
	TTY *TTY

	// Leftovers says what happens to the job's processes that are still
	// alive when its shell exits (see [Leftovers]). The zero value,
	// LeftoversStop, stops them; LeftoversWait keeps the job Running
	// until the last of them has ended, as for a dev server started in
	// the background ("npm run dev &"). Launches that differ in Leftovers
	// are different jobs: they never coalesce.
	Leftovers Leftovers

	// Priority orders the launches waiting in the queue (Config.Queue):
	// a higher Priority starts first, and launches of equal Priority
	// start in the order they came. It is not part of the job's
	// identity: an identical launch of another Priority joins the job,
	// which keeps the Priority it was launched with. Without a queue it
	// has no effect.
	Priority int
}

// TTY is the size of a job's terminal (see Spec.TTY). A zero Rows is 24,
// a zero Cols 80.
type TTY struct {
	Rows, Cols uint16
}

// Screen is what a TTY job's terminal shows, as [Registry.Screen]
// renders it.
type Screen struct {
	// Rows holds the visible screen, one string per row, top first,
	// without trailing blanks. Its length is the terminal's height,
	// unless the Admitter changed the number of lines.
	Rows []string `json:"rows"`

	// CursorRow and CursorCol are the cursor's position, counted from
	// 0 at the top left.
	CursorRow int `json:"cursor_row"`
	CursorCol int `json:"cursor_col"`

	// Withheld reports that the Admitter withheld the screen's text;
	// Rows is then nil.
	Withheld bool `json:"withheld,omitempty"`

	// Notice is a content-free remark: the Admitter's, or that the
	// screen was rebuilt from the latest output only (see
	// Registry.Screen).
	Notice string `json:"notice,omitempty"`
}

// Leftovers says what happens to a job's processes that outlive its
// shell. See Spec.Leftovers.
type Leftovers int

const (
	// LeftoversStop stops what outlives the shell: when the shell
	// exits, the processes left in the job's tree get SIGTERM, then
	// after Config.KillGrace SIGKILL, and Output.Notice counts them.
	// The job ends with the shell's exit code.
	LeftoversStop Leftovers = iota
	// LeftoversWait keeps the job Running after its shell has exited,
	// as long as a process of its tree is alive: its output is still
	// read, its timeouts still apply, Cancel and Close still stop the
	// whole tree. The job ends when its last process has ended, with
	// the shell's exit code. A zombie does not count.
	LeftoversWait
)

var leftoverNames = [...]string{"stop", "wait"}

// String returns "stop" or "wait".
func (l Leftovers) String() string {
	if l >= 0 && int(l) < len(leftoverNames) {
		return leftoverNames[l]
	}
	return "unknown"
}

// MarshalText returns the name String gives, so that a Leftovers is a
// string in JSON. A value outside the two is an error.
func (l Leftovers) MarshalText() ([]byte, error) {
	return marshalName("leftovers", int(l), leftoverNames[:])
}

// UnmarshalText sets l to the value that text names, as String gives
// it.
func (l *Leftovers) UnmarshalText(text []byte) error {
	return unmarshalName("leftovers", text, leftoverNames[:], (*int)(l))
}

// Process is a live process of a running job's tree, in
// Snapshot.Processes.
type Process struct {
	PID  int `json:"pid"`
	PPID int `json:"ppid"` // its parent's PID (0 if its parent is in another PID namespace)
	// Command is the process's command line, its arguments joined by
	// spaces, as the Admitter admitted it: a secret on a command line
	// passes the same policy as one in the output. Empty when the
	// Admitter withheld the command lines, or when it cannot be read
	// (another user's process).
	Command string `json:"command"`
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
	// Queued: the launch waits for a free slot (Config.Queue) and has
	// no process yet; Snapshot.QueuePosition tells its place. It leaves
	// the queue Running, or Cancelled if it is cancelled first.
	Queued
)

var stateNames = [...]string{"running", "exited", "cancelled", "timed_out", "failed", "queued"}

// String returns "running", "exited", "cancelled", "timed_out", "failed"
// or "queued".
func (s State) String() string {
	if s >= 0 && int(s) < len(stateNames) {
		return stateNames[s]
	}
	return "unknown"
}

// MarshalText returns the state's name, as String does, so that a State
// is a string in JSON. A value outside the six states is an error.
func (s State) MarshalText() ([]byte, error) {
	return marshalName("state", int(s), stateNames[:])
}

// UnmarshalText sets s to the state that text names, as String gives
// it. Any other text is an error.
func (s *State) UnmarshalText(text []byte) error {
	return unmarshalName("state", text, stateNames[:], (*int)(s))
}

// marshalName and unmarshalName turn the enumerations' values to their
// names and back.
func marshalName(what string, v int, names []string) ([]byte, error) {
	if v < 0 || v >= len(names) {
		return nil, fmt.Errorf("bgjob: marshal %s %d: no such %s", what, v, what)
	}
	return []byte(names[v]), nil
}

func unmarshalName(what string, text []byte, names []string, v *int) error {
	for i, n := range names {
		if string(text) == n {
			*v = i
			return nil
		}
	}
	return fmt.Errorf("bgjob: unmarshal %s %q: want one of %s", what, text, strings.Join(names, ", "))
}

// Done reports whether s is a terminal state: not Running, not Queued.
func (s State) Done() bool { return s != Running && s != Queued }

// Exit codes that bgjob reports in place of the command's own status.
const (
	exitUnknown   = -1  // still running, or never ran
	exitTimedOut  = 124 // as timeout(1) reports it
	exitCancelled = 130 // as a shell reports an interrupt (128 + SIGINT)
)

// Snapshot is a copy of a job's state at one moment. Nothing in it is
// shared with the registry.
//
// A Snapshot marshals to JSON with snake_case names, the fields of the
// MCP example's tools (job_id, exit_code, cwd, ...), times in RFC 3339,
// State and Containment by name, so a host can return it as it is.
type Snapshot struct {
	ID      ID     `json:"job_id"`
	Session string `json:"session"`
	// Command is the job's Spec.Command, or for a job launched with
	// Spec.Args, those arguments quoted for a POSIX shell (see Args).
	Command string `json:"command"`
	Dir     string `json:"cwd"` // the working directory the job ran in
	State   State  `json:"state"`

	// ExitCode is, for Exited, the command's status (128+n if the
	// shell was killed by signal n); 124 for TimedOut; 130 for
	// Cancelled; -1 while running or queued and for Failed.
	ExitCode int `json:"exit_code"`

	// PID is the shell's process ID; 0 if it never started, and on a
	// joiner's snapshot taken while the first launch is still spawning
	// the process (Status has it a moment later).
	PID int `json:"pid"`
	// Started is when the job was launched; for a job that waited in
	// the queue, when it left the queue to run (while Queued, when it
	// was queued). Its Timeout counts from there.
	Started time.Time `json:"started"`
	Ended   time.Time `json:"ended,omitzero"` // zero while running or queued

	// Joined is set on the Snapshot returned by Start or RunForeground
	// when the call joined a job that was already running instead of
	// starting a new one.
	Joined bool `json:"joined,omitempty"`

	Output Output `json:"output"`

	// Containment says what held the job's processes: on Linux a cgroup
	// of the job's own (ContainCgroup) wherever the host can make one,
	// else its session (ContainSession); a Job Object on Windows. It is
	// set once the process has started.
	Containment Containment `json:"containment"`

	// Reason is a short, content-free explanation for Failed, TimedOut
	// and Cancelled jobs, such as "idle for 30s" or "spawn: no such file
	// or directory". It never holds the command's output.
	Reason string `json:"reason,omitempty"`

	// Usage is what the job's processes used (see [Usage]): for a
	// finished job, its whole run; for a running one, its run so far
	// where its cgroup (Linux) or Job Object (Windows) tells it, else
	// zero. A running job's usage is read at most every 50ms: snapshots
	// taken closer together share one reading.
	Usage Usage `json:"usage,omitzero"`

	// QueuePosition is a Queued job's place in the queue: 1 for the
	// next to start. It is 0 for a job that is not queued.
	QueuePosition int `json:"queue_position,omitempty"`

	// Processes lists the live processes of a running job's tree, by
	// PID, and Ports the TCP ports they listen on (sorted, each once),
	// on Linux (see [Registry.Status] for how fresh they are and what
	// they cost). Status, List, Wait and a RunForeground result that
	// detaches fill them in; they are nil for a job that is not
	// running, in the snapshot that Start returns, and on other
	// systems.
	Processes []Process `json:"processes,omitempty"`
	Ports     []int     `json:"ports,omitempty"`
}

// Err returns an error wrapping [ErrSpawn] if the job never ran: it is
// Failed and its process was never started (its shell or program could
// not be spawned, or its record written), or its sandbox could not be
// made, so its command never started; Reason says why. It returns
// nil for every other job, running or ended: a command that exited
// with a non-zero status, timed out or was cancelled did run, and its
// State and ExitCode tell how it ended.
//
// Start and RunForeground return a job that failed to spawn with a nil
// error, since the job exists and can be polled; check both:
//
//	s, err := r.Start(ctx, spec)
//	if err == nil {
//		err = s.Err()
//	}
func (s Snapshot) Err() error {
	if s.State != Failed || (s.PID != 0 && !strings.HasPrefix(s.Reason, "spawn:") && !strings.HasPrefix(s.Reason, "state:") && !strings.HasPrefix(s.Reason, "sandbox:")) {
		return nil
	}
	return fmt.Errorf("bgjob: %s: %s: %w", s.ID, s.Reason, ErrSpawn)
}

// Output is the admitted output of a job. stdout and stderr share one
// stream, so their interleaving is kept.
type Output struct {
	// Text is the admitted text. When bytes were dropped it is the head
	// of the stream, one omission line, and the tail.
	Text string `json:"text"`

	// Total is the number of bytes the command has written so far.
	Total int64 `json:"total_bytes"`

	// Omitted is the number of bytes of Total that Text does not hold.
	Omitted int64 `json:"omitted_bytes"`

	// Withheld reports that the Admitter withheld the text; Text is
	// then empty.
	Withheld bool `json:"withheld,omitempty"`

	// Notice is a content-free remark for the reader: truncation,
	// withholding, leftover processes that were stopped.
	Notice string `json:"notice,omitempty"`
}

// Chunk is a piece of a job's output stream returned by [Registry.Read].
//
// Continue from Next, never from Offset+len(Data): with an Admitter, Data
// is admitted text whose length may differ from the raw bytes it stands
// for, while offsets count raw bytes.
type Chunk struct {
	// Data holds the admitted form of the stream's bytes from Offset up
	// to Next. Without an Admitter it is exactly those bytes.
	Data string `json:"data"`

	// Offset is the absolute stream offset of the first byte Data
	// stands for.
	Offset int64 `json:"offset"`

	// Next is the offset to pass to the next Read.
	Next int64 `json:"next_offset"`

	// Skipped counts the bytes between the offset asked for and Offset
	// that the registry no longer holds: they were dropped between the
	// head and the tail (or are part of a line cut by that drop), or,
	// after the job ended, the Admitter's verdict on them cannot be
	// served by offset (it changed the number of lines of the head or
	// the tail, which are then served whole, from their start). It
	// never counts bytes that Read could serve: an offset inside a line
	// of rewritten text is an error, not a skip.
	Skipped int64 `json:"skipped,omitempty"`

	// Done reports that the job has ended and Next is the end of the
	// stream: there is nothing more to read.
	Done bool `json:"done"`
}

// Foreground configures [Registry.RunForeground].
type Foreground struct {
	// SoftCap is how long RunForeground waits inline before it
	// detaches. If SoftCap is 0, it waits 30s.
	SoftCap time.Duration

	// Interval is how often OnProgress is called. If Interval is zero
	// or negative, Config.ProgressInterval applies.
	Interval time.Duration

	// OnProgress, if not nil, is called about every Interval while
	// RunForeground waits, with a snapshot of the running job (its
	// output admitted, as Status gives it; Queued, with its place, while
	// it waits in the queue); the job's age is time.Since(s.Started). It is called in the caller's goroutine,
	// never before the first interval has passed, never once the job
	// has ended and never after RunForeground returns. If it panics,
	// the panic reaches the caller and the job goes on, detached.
	OnProgress func(s Snapshot)
}

// Result is what [Registry.RunForeground] returns.
type Result struct {
	// Snapshot is the final snapshot if the job ended inline, or the
	// running job's snapshot if it detached.
	Snapshot

	// Detached reports that the job is still running: poll it with
	// Status or Read, block on it with Wait, or stop it with Cancel.
	Detached bool `json:"detached"`
}

// Completion records that a pollable job ended. See
// [Registry.Completions] and [Registry.NextCompletion]. It marshals to
// JSON with the names of Snapshot's fields.
type Completion struct {
	ID       ID        `json:"job_id"`
	Session  string    `json:"session"`
	Command  string    `json:"command"`
	State    State     `json:"state"`
	ExitCode int       `json:"exit_code"`
	Ended    time.Time `json:"ended"`
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

// MarshalText returns the containment's name, as String does.
func (c Containment) MarshalText() ([]byte, error) {
	return marshalName("containment", int(c), containNames[:])
}

// UnmarshalText sets c to the containment that text names.
func (c *Containment) UnmarshalText(text []byte) error {
	return unmarshalName("containment", text, containNames[:], (*int)(c))
}
