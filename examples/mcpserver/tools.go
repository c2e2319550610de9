package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"time"

	"github.com/bgjob/bgjob"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Bounds on what a tool call may ask for. Values above a maximum are
// lowered to it, not refused: a model that asks to wait an hour gets the
// longest wait there is and a job ID to come back with.
const (
	defaultWait     = 30 * time.Second // shell's wait_ms and shell_wait's timeout_ms
	maxWait         = 10 * time.Minute
	defaultMaxBytes = 64 << 10 // shell_status's max_bytes
	maxMaxBytes     = 1 << 20
)

// ShellInput is the input of the shell tool.
type ShellInput struct {
	Command       string `json:"command" jsonschema:"the command line, run by /bin/sh -c"`
	Cwd           string `json:"cwd,omitempty" jsonschema:"working directory; relative paths are taken from the server's directory"`
	TimeoutMs     int64  `json:"timeout_ms,omitempty" jsonschema:"wall-clock limit in milliseconds, also after detaching; 0 means the server default (30 minutes)"`
	IdleTimeoutMs int64  `json:"idle_timeout_ms,omitempty" jsonschema:"limit in milliseconds on time without output; 0 means none"`
	WaitMs        int64  `json:"wait_ms,omitempty" jsonschema:"how long to wait inline before detaching, in milliseconds; 0 means 30000; at most 600000"`
	Background    bool   `json:"background,omitempty" jsonschema:"start the command and return its job_id at once"`
	Stdin         string `json:"stdin,omitempty" jsonschema:"text written to the command's standard input, which is then closed (unless interactive or tty)"`
	Interactive   bool   `json:"interactive,omitempty" jsonschema:"keep the command's standard input open: send it text, keys and EOF with shell_write; wait_ms defaults to 1000"`
	TTY           bool   `json:"tty,omitempty" jsonschema:"run the command under a pseudo-terminal (implies interactive), for prompts, REPLs and full-screen programs; shell_status and shell_write then return its screen; wait_ms defaults to 1000"`
	Rows          int    `json:"rows,omitempty" jsonschema:"the terminal's height with tty; 0 means 24"`
	Cols          int    `json:"cols,omitempty" jsonschema:"the terminal's width with tty; 0 means 80"`
	Leftovers     string `json:"leftovers,omitempty" jsonschema:"what happens to processes still running when the shell exits: stop (the default) stops them; wait keeps the job running until the last of them ends, as for a dev server started with &"`
	Priority      int    `json:"priority,omitempty" jsonschema:"when the server queues commands (-queue), a higher priority starts sooner; default 0"`
	Until         string `json:"until,omitempty" jsonschema:"a regular expression (Go syntax) matched against each line of output: as soon as a line matches, the call returns that line and the command goes on in the background (detached); waits at most wait_ms"`
}

// MatchInfo is the line that an until pattern matched.
type MatchInfo struct {
	Line     string `json:"line" jsonschema:"the matching line, without its line ending"`
	Offset   int64  `json:"offset" jsonschema:"absolute output offset of the line's first byte"`
	Withheld bool   `json:"withheld,omitempty" jsonschema:"the output policy withheld the line's text"`
}

func matchInfo(m bgjob.Match) *MatchInfo {
	return &MatchInfo{Line: m.Line, Offset: m.Offset, Withheld: m.Withheld}
}

// ScreenOutput is what a TTY job's terminal shows.
type ScreenOutput struct {
	Rows      []string `json:"rows" jsonschema:"the visible screen, one string per row, top first"`
	CursorRow int      `json:"cursor_row" jsonschema:"the cursor's row, from 0"`
	CursorCol int      `json:"cursor_col" jsonschema:"the cursor's column, from 0"`
	Notice    string   `json:"notice,omitempty"`
}

// ShellOutput is the structured result of the shell tool.
type ShellOutput struct {
	Detached        bool          `json:"detached" jsonschema:"true if the command is still running: use job_id with shell_status, shell_wait or shell_cancel"`
	JobID           string        `json:"job_id,omitempty" jsonschema:"the job's ID; set only when detached"`
	Joined          bool          `json:"joined,omitempty" jsonschema:"an identical command of this session was already running and this call joined it"`
	State           string        `json:"state" jsonschema:"queued, running, exited, cancelled, timed_out or failed"`
	QueuePosition   int           `json:"queue_position,omitempty" jsonschema:"while queued, its place in the queue: 1 starts next"`
	ExitCode        *int          `json:"exit_code,omitempty" jsonschema:"the exit status once the command has ended (124 timed out, 130 cancelled, 128+n killed by signal n, -1 failed to start)"`
	Output          string        `json:"output" jsonschema:"stdout and stderr interleaved; when too long, the head, an omission line and the tail"`
	OutputBytes     int64         `json:"output_bytes" jsonschema:"bytes the command has written so far"`
	OmittedBytes    int64         `json:"omitted_bytes,omitempty" jsonschema:"bytes of output_bytes not in output"`
	NextOffset      int64         `json:"next_offset" jsonschema:"offset to pass to shell_status to read the output that follows"`
	DurationMs      int64         `json:"duration_ms" jsonschema:"time from start to end, or to now while running"`
	Reason          string        `json:"reason,omitempty" jsonschema:"why the job failed, timed out, was cancelled or was stopped by a limit"`
	Notice          string        `json:"notice,omitempty" jsonschema:"truncation, withholding, leftover processes that were stopped"`
	CPUMs           int64         `json:"cpu_ms,omitempty" jsonschema:"CPU time (user and system) the job's processes used"`
	PeakMemoryBytes int64         `json:"peak_memory_bytes,omitempty" jsonschema:"the job's peak memory, where the system tells it"`
	Interactive     bool          `json:"interactive,omitempty" jsonschema:"the job takes input: use shell_write"`
	Screen          *ScreenOutput `json:"screen,omitempty" jsonschema:"a tty job's screen"`
	Matched         *MatchInfo    `json:"matched,omitempty" jsonschema:"the line that until matched"`
}

// JobInput names a job.
type JobInput struct {
	JobID string `json:"job_id" jsonschema:"a job ID returned by shell in this session"`
}

// StatusInput is the input of shell_status.
type StatusInput struct {
	JobID    string `json:"job_id" jsonschema:"a job ID returned by shell in this session"`
	Offset   int64  `json:"offset,omitempty" jsonschema:"absolute output offset to read from; pass the previous next_offset; 0 reads from the start"`
	MaxBytes int    `json:"max_bytes,omitempty" jsonschema:"at most about this many bytes of output; 0 means 65536; at most 1048576"`
}

// StatusOutput is the structured result of shell_status.
type StatusOutput struct {
	JobID       string        `json:"job_id"`
	Command     string        `json:"command"`
	State       string        `json:"state" jsonschema:"queued, running, exited, cancelled, timed_out or failed"`
	ExitCode    *int          `json:"exit_code,omitempty" jsonschema:"the exit status once the job has ended"`
	Output      string        `json:"output" jsonschema:"output from offset up to next_offset"`
	Offset      int64         `json:"offset" jsonschema:"absolute offset of the first byte of output"`
	NextOffset  int64         `json:"next_offset" jsonschema:"pass this as offset to the next shell_status call"`
	Skipped     int64         `json:"skipped,omitempty" jsonschema:"bytes between the offset asked for and offset that are no longer kept"`
	OutputBytes int64         `json:"output_bytes" jsonschema:"bytes the job has written so far"`
	Done        bool          `json:"done" jsonschema:"the job has ended and next_offset is the end of its output: nothing more to read"`
	Reason      string        `json:"reason,omitempty"`
	Notice      string        `json:"notice,omitempty"`
	Screen      *ScreenOutput `json:"screen,omitempty" jsonschema:"a tty job's screen"`
}

// WriteInput is the input of shell_write.
type WriteInput struct {
	JobID  string   `json:"job_id" jsonschema:"an interactive or tty job of this session"`
	Text   string   `json:"text,omitempty" jsonschema:"text to type, sent first; include \\n to end a line (on a tty, the enter key is also \\r)"`
	Keys   []string `json:"keys,omitempty" jsonschema:"keys sent after text, in order: enter, tab, esc, backspace, up, down, left, right, home, end, pgup, pgdn, space, or ctrl-A to ctrl-Z (ctrl-c interrupts, ctrl-d is end of file at a line's start)"`
	EOF    bool     `json:"eof,omitempty" jsonschema:"close the job's input after text and keys (on a tty, type its end-of-file character)"`
	WaitMs int64    `json:"wait_ms,omitempty" jsonschema:"how long to wait for the job's answer, in milliseconds; 0 means 1000; at most 600000"`
}

// WriteOutput is the structured result of shell_write.
type WriteOutput struct {
	JobID      string        `json:"job_id"`
	State      string        `json:"state" jsonschema:"running, exited, cancelled, timed_out or failed"`
	ExitCode   *int          `json:"exit_code,omitempty" jsonschema:"the exit status once the job has ended"`
	Written    int           `json:"written" jsonschema:"bytes sent to the job"`
	Output     string        `json:"output" jsonschema:"the output that came after the write, raw (a tty job's holds terminal escape sequences: read its screen)"`
	Offset     int64         `json:"offset" jsonschema:"absolute offset of output's first byte"`
	NextOffset int64         `json:"next_offset" jsonschema:"offset to pass to shell_status for what follows"`
	Screen     *ScreenOutput `json:"screen,omitempty" jsonschema:"a tty job's screen after the write"`
}

// WaitInput is the input of shell_wait.
type WaitInput struct {
	JobID      string `json:"job_id" jsonschema:"a job ID returned by shell in this session"`
	TimeoutMs  int64  `json:"timeout_ms,omitempty" jsonschema:"how long to wait in milliseconds; 0 means 30000; at most 600000"`
	Until      string `json:"until,omitempty" jsonschema:"a regular expression (Go syntax) matched against each line of output, those already printed included: return as soon as a line matches, instead of waiting for the end"`
	FromOffset int64  `json:"from_offset,omitempty" jsonschema:"with until: only lines that start at or after this output offset count; 0 means all"`
}

// WatchInput is the input of shell_watch.
type WatchInput struct {
	JobID   string `json:"job_id" jsonschema:"a job ID returned by shell in this session"`
	Pattern string `json:"pattern" jsonschema:"a regular expression (Go syntax) matched against each line of output printed from now on"`
	Name    string `json:"name,omitempty" jsonschema:"names the watch in its notifications; default: the pattern"`
	Every   bool   `json:"every,omitempty" jsonschema:"notify on every matching line, not only the first"`
}

// WatchOutput is the structured result of shell_watch.
type WatchOutput struct {
	JobID   string `json:"job_id"`
	Name    string `json:"name" jsonschema:"the watch's name, as its notifications give it"`
	Pattern string `json:"pattern"`
	Every   bool   `json:"every"`
}

// JobResult is the structured result of shell_wait and shell_cancel.
type JobResult struct {
	JobID           string     `json:"job_id"`
	Command         string     `json:"command"`
	State           string     `json:"state" jsonschema:"queued, running, exited, cancelled, timed_out or failed"`
	Done            bool       `json:"done" jsonschema:"the job has ended"`
	ExitCode        *int       `json:"exit_code,omitempty" jsonschema:"the exit status once the job has ended"`
	Output          string     `json:"output" jsonschema:"the job's output; when too long, the head, an omission line and the tail"`
	OutputBytes     int64      `json:"output_bytes"`
	OmittedBytes    int64      `json:"omitted_bytes,omitempty"`
	DurationMs      int64      `json:"duration_ms"`
	Reason          string     `json:"reason,omitempty"`
	Notice          string     `json:"notice,omitempty"`
	CPUMs           int64      `json:"cpu_ms,omitempty" jsonschema:"CPU time (user and system) the job's processes used"`
	PeakMemoryBytes int64      `json:"peak_memory_bytes,omitempty" jsonschema:"the job's peak memory, where the system tells it"`
	Matched         *MatchInfo `json:"matched,omitempty" jsonschema:"the line that until matched"`
}

// ListOutput is the structured result of shell_list.
type ListOutput struct {
	Jobs []JobInfo `json:"jobs" jsonschema:"this session's jobs, running or kept after their end, oldest first"`
}

// JobInfo describes one job in shell_list.
type JobInfo struct {
	JobID         string        `json:"job_id"`
	Command       string        `json:"command"`
	Cwd           string        `json:"cwd"`
	State         string        `json:"state" jsonschema:"queued, running, exited, cancelled, timed_out or failed"`
	QueuePosition int           `json:"queue_position,omitempty" jsonschema:"while queued, its place in the queue: 1 starts next"`
	ExitCode      *int          `json:"exit_code,omitempty"`
	PID           int           `json:"pid,omitempty"`
	Started       string        `json:"started" jsonschema:"RFC 3339"`
	Ended         string        `json:"ended,omitempty" jsonschema:"RFC 3339"`
	OutputBytes   int64         `json:"output_bytes"`
	Reason        string        `json:"reason,omitempty"`
	Processes     []ProcessInfo `json:"processes,omitempty" jsonschema:"while running, the live processes of the job (Linux)"`
	Ports         []int         `json:"ports,omitempty" jsonschema:"while running, the TCP ports its processes listen on (Linux)"`
}

// ProcessInfo is a live process of a running job, in shell_list.
type ProcessInfo struct {
	PID     int    `json:"pid"`
	PPID    int    `json:"ppid" jsonschema:"its parent's PID"`
	Command string `json:"command" jsonschema:"its command line"`
}

func (s *Server) addTools() {
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name: "shell",
		Description: "Run a shell command. Waits up to wait_ms (default 30s) and returns its output and exit code; " +
			"if it is still running then, it goes on in the background and the result has detached: true and a job_id. " +
			"With background: true it returns the job_id at once. With until (a regular expression), it returns as soon as " +
			"a line of output matches, with that line in matched, and the command goes on: use it to start a server and " +
			"wait for it to be ready. Progress notifications are sent while waiting when the request carries a progress token.",
	}, s.shell)
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name: "shell_status",
		Description: "State of a job and its output from an offset: pass the previous next_offset to read only what is new. " +
			"done is true once the job has ended and all its output has been read.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, s.status)
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name: "shell_write",
		Description: "Send input to a job started with interactive or tty: text, then keys (ctrl-c, enter, up, ...), then eof if set. " +
			"Waits up to wait_ms for the job to answer and returns what it printed after the write (and a tty job's screen).",
	}, s.write)
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name: "shell_wait",
		Description: "Wait until a job ends, at most timeout_ms (default 30s), and return its state, exit code and output. " +
			"With until (a regular expression), return as soon as a line of its output matches (lines printed before the call count), with that line in matched.",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, s.wait)
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name: "shell_watch",
		Description: "Watch a running job's output: each later line that matches pattern (a regular expression) is sent " +
			"as a logging notification (logger \"bgjob\", event \"job_matched\", with the line and its offset) if the client " +
			"has set a logging level. Once, or for every matching line with every: true.",
	}, s.watch)
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name: "shell_cancel",
		Description: "Stop a job and every process it started (SIGTERM, then SIGKILL after a grace period) and return its final state. " +
			"Cancelling a job that has already ended changes nothing.",
		Annotations: &mcp.ToolAnnotations{DestructiveHint: ptr(true), IdempotentHint: true},
	}, s.cancel)
	mcp.AddTool(s.mcp, &mcp.Tool{
		Name: "shell_list",
		Description: "List this session's jobs: queued, running, and those kept after their end. " +
			"A running job shows its live processes and the TCP ports they listen on (a dev server's port).",
		Annotations: &mcp.ToolAnnotations{ReadOnlyHint: true},
	}, s.list)
}

func ptr[T any](v T) *T { return &v }

// jobs returns the bgjob session of an MCP connection: a view of the
// registry that reaches this connection's jobs only, and answers a job of
// another connection exactly as an unknown one (bgjob.ErrNotFound), so a
// client cannot even learn that another's job ID exists.
func (s *Server) jobs(ss *mcp.ServerSession) *bgjob.Session {
	return s.reg.Session(s.session(ss))
}

func (s *Server) shell(ctx context.Context, req *mcp.CallToolRequest, in ShellInput) (*mcp.CallToolResult, ShellOutput, error) {
	jobs := s.jobs(req.Session)
	spec := bgjob.Spec{
		Command:     in.Command,
		Dir:         in.Cwd,
		Stdin:       in.Stdin,
		Timeout:     time.Duration(in.TimeoutMs) * time.Millisecond,
		IdleTimeout: time.Duration(in.IdleTimeoutMs) * time.Millisecond,
		Priority:    in.Priority,
	}
	switch in.Leftovers {
	case "", "stop":
	case "wait":
		spec.Leftovers = bgjob.LeftoversWait
	default:
		return nil, ShellOutput{}, fmt.Errorf("leftovers %q: want stop or wait", in.Leftovers)
	}
	spec.Interactive = in.Interactive
	if in.TTY {
		if in.Rows < 0 || in.Cols < 0 || in.Rows > 1000 || in.Cols > 1000 {
			return nil, ShellOutput{}, errors.New("rows and cols must be between 0 and 1000")
		}
		spec.TTY = &bgjob.TTY{Rows: uint16(in.Rows), Cols: uint16(in.Cols)}
	}
	waitMs := in.WaitMs
	if waitMs == 0 && (in.Interactive || in.TTY) {
		waitMs = defaultInteractiveWait.Milliseconds() // show the first prompt, then let the caller answer
	}
	wait, err := duration("wait_ms", waitMs)
	if err != nil {
		return nil, ShellOutput{}, err
	}
	if in.TimeoutMs < 0 || in.IdleTimeoutMs < 0 {
		return nil, ShellOutput{}, errors.New("timeout_ms and idle_timeout_ms must not be negative")
	}
	var u *untilWait
	rctx := ctx // ends the inline wait: the request's ctx, or the until line
	if in.Until != "" {
		if in.Background {
			return nil, ShellOutput{}, errors.New("until waits for a line, background returns at once: set one of them")
		}
		if s.remote && s.matches == nil {
			// The until watch's match would not reach this server.
			return nil, ShellOutput{}, errors.New("until: these remote jobs carry no matches; start the job, then use shell_wait with until")
		}
		re, err := regexp.Compile(in.Until)
		if err != nil {
			return nil, ShellOutput{}, fmt.Errorf("until: %w", err)
		}
		// A watch of the job's own, named by a random token, which the
		// OnMatch hook routes to this call; it lets RunForeground detach
		// as soon as the line comes.
		var stop context.CancelFunc
		rctx, stop = context.WithCancel(ctx)
		defer stop()
		var tok [12]byte
		rand.Read(tok[:])
		name := untilPrefix + hex.EncodeToString(tok[:])
		u = &untilWait{found: make(chan bgjob.Match, 1), stop: stop}
		s.mu.Lock()
		s.untils[name] = u
		s.mu.Unlock()
		defer func() {
			s.mu.Lock()
			delete(s.untils, name)
			s.mu.Unlock()
		}()
		spec.Watches = []bgjob.Watch{{Name: name, Pattern: re}}
	}
	if in.Background {
		snap, err := jobs.Start(ctx, spec)
		if err != nil {
			return nil, ShellOutput{}, launchError(err)
		}
		out := s.withScreen(jobs, shellOutput(snap, true), snap)
		return textResult(shellText(out, 0)), out, nil
	}

	fg := bgjob.Foreground{SoftCap: wait}
	if tok := req.Params.GetProgressToken(); tok != nil {
		// OnProgress runs in this goroutine while RunForeground waits,
		// so ctx (the request's) is the right bound for the write.
		begin := time.Now()
		fg.OnProgress = func(snap bgjob.Snapshot) {
			elapsed := time.Since(begin)
			_ = req.Session.NotifyProgress(ctx, &mcp.ProgressNotificationParams{
				ProgressToken: tok,
				Progress:      elapsed.Seconds(),
				Total:         wait.Seconds(),
				Message: fmt.Sprintf("running for %s, %d bytes of output; detaches after %s",
					elapsed.Round(time.Second), snap.Output.Total, wait),
			})
		}
	}
	res, err := jobs.RunForeground(rctx, spec, fg)
	if err != nil {
		return nil, ShellOutput{}, launchError(err)
	}
	if res.Detached && ctx.Err() != nil && !res.Joined {
		// The client cancelled the request (or went away): it will never
		// see the job ID, so stop the job instead of leaving it behind.
		// A joined job belongs to an earlier call too, and goes on.
		snap, _ := jobs.Cancel(res.ID)
		return nil, shellOutput(snap, false), ctx.Err()
	}
	out := s.withScreen(jobs, shellOutput(res.Snapshot, res.Detached), res.Snapshot)
	if u != nil {
		select {
		case m := <-u.found:
			out.Matched = matchInfo(m)
		default:
		}
	}
	return textResult(shellText(out, wait)), out, nil
}

// defaultInteractiveWait is the wait_ms of an interactive or tty shell
// call: long enough to show a program's first prompt.
const defaultInteractiveWait = time.Second

// withScreen adds a detached TTY job's screen to a shell result.
func (s *Server) withScreen(jobs *bgjob.Session, out ShellOutput, snap bgjob.Snapshot) ShellOutput {
	out.Interactive = out.Detached && snap.State == bgjob.Running && isInteractive(jobs, snap.ID)
	if out.Detached {
		out.Screen = screenOf(jobs, snap.ID)
	}
	return out
}

// isInteractive reports whether a job takes input: a Write of nothing
// fails with ErrNotInteractive otherwise.
func isInteractive(jobs *bgjob.Session, id bgjob.ID) bool {
	_, err := jobs.Write(context.Background(), id, nil)
	return !errors.Is(err, bgjob.ErrNotInteractive)
}

// screenOf returns a TTY job's screen, or nil for another job.
func screenOf(jobs *bgjob.Session, id bgjob.ID) *ScreenOutput {
	sc, err := jobs.Screen(id)
	if err != nil {
		return nil
	}
	return &ScreenOutput{Rows: sc.Rows, CursorRow: sc.CursorRow, CursorCol: sc.CursorCol, Notice: sc.Notice}
}

// screenText is the text form of a screen: its rows down to the last one
// that is not blank, in a frame.
func screenText(sc *ScreenOutput) string {
	last := len(sc.Rows)
	for last > 0 && sc.Rows[last-1] == "" {
		last--
	}
	var b strings.Builder
	fmt.Fprintf(&b, "\n--- screen (%d rows, cursor at row %d, column %d) ---\n", len(sc.Rows), sc.CursorRow, sc.CursorCol)
	for _, r := range sc.Rows[:last] {
		b.WriteString(r)
		b.WriteByte('\n')
	}
	b.WriteString("--- end of screen ---")
	return b.String()
}

// duration converts a tool's millisecond argument: 0 is the default wait,
// negative is an error, more than maxWait is lowered to it.
func duration(name string, ms int64) (time.Duration, error) {
	switch {
	case ms < 0:
		return 0, fmt.Errorf("%s must not be negative", name)
	case ms == 0:
		return defaultWait, nil
	case ms > maxWait.Milliseconds():
		return maxWait, nil
	}
	return time.Duration(ms) * time.Millisecond, nil
}

// launchError words a refused launch for the model. Each is a tool error,
// so the model sees it and can correct its call.
func launchError(err error) error {
	switch {
	case errors.Is(err, bgjob.ErrRejected) && errors.Is(err, errOutsideJail):
		return errors.New("refused: cwd is outside the directory this server may run commands in")
	case errors.Is(err, bgjob.ErrRejected):
		return fmt.Errorf("refused: %w", err)
	case errors.Is(err, bgjob.ErrTooManyRunning):
		return errors.New("too many jobs are running (or waiting in the queue); wait for or cancel one (see shell_list)")
	case errors.Is(err, bgjob.ErrInvalidSpec):
		return fmt.Errorf("invalid call: %w", err)
	case errors.Is(err, bgjob.ErrClosed):
		return errors.New("the server is shutting down")
	}
	return err
}

func exitCode(snap bgjob.Snapshot) *int {
	if !snap.State.Done() {
		return nil
	}
	return ptr(snap.ExitCode)
}

func elapsed(snap bgjob.Snapshot) time.Duration {
	if snap.Ended.IsZero() {
		return time.Since(snap.Started)
	}
	return snap.Ended.Sub(snap.Started)
}

func shellOutput(snap bgjob.Snapshot, detached bool) ShellOutput {
	out := ShellOutput{
		Detached:      detached,
		Joined:        snap.Joined,
		State:         snap.State.String(),
		QueuePosition: snap.QueuePosition,
		ExitCode:      exitCode(snap),
		Output:        snap.Output.Text,
		OutputBytes:   snap.Output.Total,
		OmittedBytes:  snap.Output.Omitted,
		NextOffset:    snap.Output.Total,
		DurationMs:    elapsed(snap).Milliseconds(),
		Reason:        snap.Reason,
		Notice:        snap.Output.Notice,
	}
	out.CPUMs, out.PeakMemoryBytes = usage(snap)
	if detached {
		out.JobID = string(snap.ID)
	}
	return out
}

// shellText is the short text form of a shell result: one header line,
// then the output.
func shellText(out ShellOutput, wait time.Duration) string {
	var b strings.Builder
	switch {
	case out.Detached && out.State == "queued":
		fmt.Fprintf(&b, "queued (place %d) as %s: it starts when a running job ends.", out.QueuePosition, out.JobID)
	case out.Detached && wait == 0:
		fmt.Fprintf(&b, "started in the background as %s.", out.JobID)
	case out.Detached && out.Matched != nil:
		fmt.Fprintf(&b, "until matched at offset %d: still running, detached as %s.", out.Matched.Offset, out.JobID)
	case out.Detached:
		fmt.Fprintf(&b, "still running after %s: detached as %s.", wait, out.JobID)
	default:
		fmt.Fprintf(&b, "%s, exit code %d, in %s.", out.State, *out.ExitCode, time.Duration(out.DurationMs)*time.Millisecond)
	}
	if out.Reason != "" {
		fmt.Fprintf(&b, " %s.", out.Reason)
	}
	if out.Notice != "" {
		fmt.Fprintf(&b, " (%s)", out.Notice)
	}
	if !out.Detached {
		b.WriteString(usageText(out.CPUMs, out.PeakMemoryBytes))
	}
	if out.Detached {
		fmt.Fprintf(&b, " Read more with shell_status (offset %d), or use shell_wait / shell_cancel.", out.NextOffset)
	}
	if m := out.Matched; m != nil {
		b.WriteString(matchText(m))
	}
	if out.Interactive {
		b.WriteString(" It takes input: send it with shell_write.")
	}
	if out.Screen != nil {
		b.WriteString(screenText(out.Screen))
	} else if out.Output != "" {
		b.WriteString("\n")
		b.WriteString(out.Output)
	}
	return b.String()
}

// matchText is the text form of an until line: " Matched line: ..."
func matchText(m *MatchInfo) string {
	if m.Withheld {
		return " The matching line was withheld by the output policy."
	}
	return fmt.Sprintf(" Matched line: %q.", m.Line)
}

func textResult(text string) *mcp.CallToolResult {
	return &mcp.CallToolResult{Content: []mcp.Content{&mcp.TextContent{Text: text}}}
}

func notFound(id string) error {
	return fmt.Errorf("no job %q in this session (it may have ended long ago and been forgotten)", id)
}

func (s *Server) status(_ context.Context, req *mcp.CallToolRequest, in StatusInput) (*mcp.CallToolResult, StatusOutput, error) {
	jobs := s.jobs(req.Session)
	snap, err := jobs.Status(bgjob.ID(in.JobID))
	if err != nil {
		return nil, StatusOutput{}, notFound(in.JobID)
	}
	max := in.MaxBytes
	switch {
	case max < 0:
		return nil, StatusOutput{}, errors.New("max_bytes must not be negative")
	case max == 0:
		max = defaultMaxBytes
	case max > maxMaxBytes:
		max = maxMaxBytes
	}
	c, err := jobs.Read(snap.ID, in.Offset, max)
	switch {
	case errors.Is(err, bgjob.ErrNotFound):
		return nil, StatusOutput{}, notFound(in.JobID)
	case errors.Is(err, bgjob.ErrInvalidArgument):
		return nil, StatusOutput{}, fmt.Errorf("offset %d is out of range (0 to %d)", in.Offset, snap.Output.Total)
	case err != nil:
		return nil, StatusOutput{}, err
	}
	if c.Done && !snap.State.Done() {
		// The job ended between Status and Read: report its end with
		// the chunk that says so.
		if s2, err := jobs.Status(snap.ID); err == nil {
			snap = s2
		}
	}
	out := StatusOutput{
		JobID:       string(snap.ID),
		Command:     snap.Command,
		State:       snap.State.String(),
		ExitCode:    exitCode(snap),
		Output:      c.Data,
		Offset:      c.Offset,
		NextOffset:  c.Next,
		Skipped:     c.Skipped,
		OutputBytes: max64(snap.Output.Total, c.Next),
		Done:        c.Done,
		Reason:      snap.Reason,
		Notice:      snap.Output.Notice,
		Screen:      screenOf(jobs, snap.ID),
	}
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", out.JobID, out.State)
	if out.ExitCode != nil {
		fmt.Fprintf(&b, ", exit code %d", *out.ExitCode)
	}
	fmt.Fprintf(&b, "; output bytes %d to %d", out.Offset, out.NextOffset)
	if out.Skipped > 0 {
		fmt.Fprintf(&b, " (%d bytes skipped: no longer kept)", out.Skipped)
	}
	if out.Done {
		b.WriteString("; done.")
	} else {
		fmt.Fprintf(&b, "; next offset %d.", out.NextOffset)
	}
	if out.Screen != nil {
		b.WriteString(screenText(out.Screen))
	} else if out.Output != "" {
		b.WriteString("\n")
		b.WriteString(out.Output)
	}
	return textResult(b.String()), out, nil
}

// keyBytes maps shell_write's key names to what a terminal sends.
var keyBytes = map[string]string{
	"enter": "\r", "return": "\r", "tab": "\t", "esc": "\x1b", "escape": "\x1b", "backspace": "\x7f", "space": " ",
	"up": "\x1b[A", "down": "\x1b[B", "right": "\x1b[C", "left": "\x1b[D",
	"home": "\x1b[H", "end": "\x1b[F", "pgup": "\x1b[5~", "pgdn": "\x1b[6~", "delete": "\x1b[3~",
}

// keySeq returns the bytes of a key name; enter is "\n" on a pipe.
func keySeq(name string, tty bool) (string, error) {
	k := strings.ToLower(strings.TrimSpace(name))
	if (k == "enter" || k == "return") && !tty {
		return "\n", nil
	}
	if seq, ok := keyBytes[k]; ok {
		return seq, nil
	}
	if c, ok := strings.CutPrefix(k, "ctrl-"); ok && len(c) == 1 && c[0] >= 'a' && c[0] <= 'z' {
		return string(rune(c[0] - 'a' + 1)), nil
	}
	if c, ok := strings.CutPrefix(k, "ctrl+"); ok && len(c) == 1 && c[0] >= 'a' && c[0] <= 'z' {
		return string(rune(c[0] - 'a' + 1)), nil
	}
	return "", fmt.Errorf("unknown key %q: use enter, tab, esc, backspace, space, up, down, left, right, home, end, pgup, pgdn, delete or ctrl-a to ctrl-z", name)
}

// settle is how long shell_write waits after the job's last output before
// it takes the answer as whole (the wait_ms bound applies too).
const settle = 150 * time.Millisecond

func (s *Server) write(ctx context.Context, req *mcp.CallToolRequest, in WriteInput) (*mcp.CallToolResult, WriteOutput, error) {
	jobs := s.jobs(req.Session)
	id := bgjob.ID(in.JobID)
	before, err := jobs.Status(id)
	if err != nil {
		return nil, WriteOutput{}, notFound(in.JobID)
	}
	tty := screenOf(jobs, id) != nil
	data := in.Text
	for _, k := range in.Keys {
		seq, err := keySeq(k, tty)
		if err != nil {
			return nil, WriteOutput{}, err
		}
		data += seq
	}
	if in.WaitMs < 0 {
		return nil, WriteOutput{}, errors.New("wait_ms must not be negative")
	}
	waitMs := in.WaitMs
	if waitMs == 0 {
		waitMs = defaultInteractiveWait.Milliseconds()
	}
	wait, _ := duration("wait_ms", waitMs)
	wctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	out := WriteOutput{JobID: in.JobID}
	if data != "" {
		out.Written, err = jobs.Write(wctx, id, []byte(data))
	}
	if err == nil && in.EOF {
		err = jobs.CloseInput(id)
		if data != "" && errors.Is(err, bgjob.ErrInputClosed) {
			// The job read what was written and ended (or closed its
			// stdin) before the end of file: its input is closed, as
			// asked.
			err = nil
		}
	}
	switch {
	case errors.Is(err, bgjob.ErrNotInteractive):
		return nil, WriteOutput{}, errors.New("the job was not started with interactive or tty: it takes no input")
	case errors.Is(err, bgjob.ErrInputClosed):
		return nil, WriteOutput{}, fmt.Errorf("the job's input is closed (it was closed with eof, or the job ended or stopped reading): %w", err)
	case err != nil:
		return nil, WriteOutput{}, err
	}
	// The answer: output from the offset before the write, until the job
	// is quiet for a moment, ends, or wait_ms passes.
	off := before.Output.Total
	var b strings.Builder
	out.Offset = off
	for {
		c, err := jobs.ReadWait(wctx, id, off, maxMaxBytes)
		if err != nil {
			break
		}
		b.WriteString(c.Data)
		off = c.Next
		if c.Done || b.Len() >= maxMaxBytes {
			break
		}
		// Wait on for more only while it keeps coming.
		sctx, scancel := context.WithTimeout(wctx, settle)
		c, err = jobs.ReadWait(sctx, id, off, maxMaxBytes)
		scancel()
		if err != nil {
			break
		}
		b.WriteString(c.Data)
		off = c.Next
		if c.Done {
			break
		}
	}
	out.NextOffset = off
	snap, err := jobs.Status(id)
	if err != nil {
		return nil, WriteOutput{}, notFound(in.JobID)
	}
	out.State, out.ExitCode = snap.State.String(), exitCode(snap)
	out.Screen = screenOf(jobs, id)
	if out.Screen == nil {
		out.Output = b.String()
	}
	var t strings.Builder
	fmt.Fprintf(&t, "%s %s", out.JobID, out.State)
	if out.ExitCode != nil {
		fmt.Fprintf(&t, ", exit code %d", *out.ExitCode)
	}
	fmt.Fprintf(&t, "; wrote %d bytes; output bytes %d to %d.", out.Written, out.Offset, out.NextOffset)
	if out.Screen != nil {
		t.WriteString(screenText(out.Screen))
	} else if out.Output != "" {
		t.WriteString("\n")
		t.WriteString(out.Output)
	}
	return textResult(t.String()), out, nil
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

func jobResult(snap bgjob.Snapshot) JobResult {
	r := JobResult{
		JobID:        string(snap.ID),
		Command:      snap.Command,
		State:        snap.State.String(),
		Done:         snap.State.Done(),
		ExitCode:     exitCode(snap),
		Output:       snap.Output.Text,
		OutputBytes:  snap.Output.Total,
		OmittedBytes: snap.Output.Omitted,
		DurationMs:   elapsed(snap).Milliseconds(),
		Reason:       snap.Reason,
		Notice:       snap.Output.Notice,
	}
	r.CPUMs, r.PeakMemoryBytes = usage(snap)
	return r
}

// usage returns what a job used, for a tool's result.
func usage(snap bgjob.Snapshot) (cpuMs, peak int64) {
	u := snap.Usage
	return (u.UserCPU + u.SystemCPU).Milliseconds(), u.PeakMemory
}

// usageText is the text form of a job's usage: " Used 1.2s of CPU, peak
// memory 31 MiB." or less; "" if nothing is known.
func usageText(cpuMs, peak int64) string {
	if cpuMs == 0 && peak == 0 {
		return ""
	}
	s := fmt.Sprintf(" Used %s of CPU", time.Duration(cpuMs)*time.Millisecond)
	if peak > 0 {
		s += fmt.Sprintf(", peak memory %.1f MiB", float64(peak)/(1<<20))
	}
	return s + "."
}

func jobText(r JobResult) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%s %s", r.JobID, r.State)
	if r.ExitCode != nil {
		fmt.Fprintf(&b, ", exit code %d", *r.ExitCode)
	}
	fmt.Fprintf(&b, ", %s.", time.Duration(r.DurationMs)*time.Millisecond)
	if r.Reason != "" {
		fmt.Fprintf(&b, " %s.", r.Reason)
	}
	if r.Notice != "" {
		fmt.Fprintf(&b, " (%s)", r.Notice)
	}
	b.WriteString(usageText(r.CPUMs, r.PeakMemoryBytes))
	if r.Output != "" {
		b.WriteString("\n")
		b.WriteString(r.Output)
	}
	return b.String()
}

func (s *Server) wait(ctx context.Context, req *mcp.CallToolRequest, in WaitInput) (*mcp.CallToolResult, JobResult, error) {
	timeout, err := duration("timeout_ms", in.TimeoutMs)
	if err != nil {
		return nil, JobResult{}, err
	}
	wctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	if in.Until != "" {
		return s.waitUntil(ctx, wctx, req, in, timeout)
	}
	if in.FromOffset != 0 {
		return nil, JobResult{}, errors.New("from_offset goes with until")
	}
	snap, err := s.jobs(req.Session).Wait(wctx, bgjob.ID(in.JobID))
	switch {
	case errors.Is(err, bgjob.ErrNotFound):
		return nil, JobResult{}, notFound(in.JobID)
	case err != nil && ctx.Err() != nil:
		return nil, JobResult{}, ctx.Err() // the request itself was cancelled
	}
	// A wait that timed out is not an error: the result says done: false.
	out := jobResult(snap)
	text := jobText(out)
	if !out.Done {
		text = fmt.Sprintf("%s still running after waiting %s.", out.JobID, timeout)
	}
	return textResult(text), out, nil
}

// waitUntil is shell_wait with until: it waits for a line that matches,
// or the job's end, or the timeout (wctx).
func (s *Server) waitUntil(ctx, wctx context.Context, req *mcp.CallToolRequest, in WaitInput, timeout time.Duration) (*mcp.CallToolResult, JobResult, error) {
	re, err := regexp.Compile(in.Until)
	if err != nil {
		return nil, JobResult{}, fmt.Errorf("until: %w", err)
	}
	if in.FromOffset < 0 {
		return nil, JobResult{}, errors.New("from_offset must not be negative")
	}
	jobs := s.jobs(req.Session)
	id := bgjob.ID(in.JobID)
	m, err := jobs.WaitFor(wctx, id, re, in.FromOffset)
	var ended *bgjob.EndedError
	switch {
	case errors.Is(err, bgjob.ErrNotFound):
		return nil, JobResult{}, notFound(in.JobID)
	case errors.As(err, &ended):
		// The job ended without such a line: its final result.
		out := jobResult(ended.Snapshot)
		return textResult(jobText(out) + "\nNo line matched until."), out, nil
	case err != nil && ctx.Err() != nil:
		return nil, JobResult{}, ctx.Err()
	}
	snap, serr := jobs.Status(id)
	if serr != nil {
		return nil, JobResult{}, notFound(in.JobID)
	}
	out := jobResult(snap)
	if err != nil {
		// The timeout: not an error, the result says so.
		return textResult(fmt.Sprintf("%s still running after waiting %s; no line matched until.", out.JobID, timeout)), out, nil
	}
	out.Matched = matchInfo(m)
	text := fmt.Sprintf("%s %s: until matched at offset %d.%s", out.JobID, out.State, m.Offset, matchText(out.Matched))
	return textResult(text), out, nil
}

// watch is shell_watch: it adds a watch to a running job, whose matches
// the OnMatch hook sends as notifications.
func (s *Server) watch(_ context.Context, req *mcp.CallToolRequest, in WatchInput) (*mcp.CallToolResult, WatchOutput, error) {
	re, err := regexp.Compile(in.Pattern)
	if err != nil {
		return nil, WatchOutput{}, fmt.Errorf("pattern: %w", err)
	}
	name := in.Name
	if name == "" {
		name = in.Pattern
	}
	if strings.HasPrefix(name, untilPrefix) {
		return nil, WatchOutput{}, fmt.Errorf("name: %q is reserved", untilPrefix)
	}
	if s.remote && s.matches == nil {
		return nil, WatchOutput{}, errors.New("shell_watch: these remote jobs carry no matches; use shell_wait with until")
	}
	err = s.jobs(req.Session).Watch(bgjob.ID(in.JobID), bgjob.Watch{Name: name, Pattern: re, Every: in.Every})
	switch {
	case errors.Is(err, bgjob.ErrNotFound):
		return nil, WatchOutput{}, notFound(in.JobID)
	case errors.Is(err, bgjob.ErrJobEnded):
		return nil, WatchOutput{}, fmt.Errorf("job %s has ended: nothing more to watch (shell_wait with until looks at its output)", in.JobID)
	case errors.Is(err, bgjob.ErrInvalidArgument):
		return nil, WatchOutput{}, fmt.Errorf("job %s has a watch named %q already", in.JobID, name)
	case err != nil:
		return nil, WatchOutput{}, err
	}
	out := WatchOutput{JobID: in.JobID, Name: name, Pattern: in.Pattern, Every: in.Every}
	how := "the first line"
	if in.Every {
		how = "each line"
	}
	text := fmt.Sprintf("watching %s: %s from now on that matches %q is sent as a logging notification (logger \"bgjob\", event \"job_matched\", watch %q).",
		in.JobID, how, in.Pattern, name)
	return textResult(text), out, nil
}

func (s *Server) cancel(_ context.Context, req *mcp.CallToolRequest, in JobInput) (*mcp.CallToolResult, JobResult, error) {
	snap, err := s.jobs(req.Session).Cancel(bgjob.ID(in.JobID))
	if err != nil {
		return nil, JobResult{}, notFound(in.JobID)
	}
	out := jobResult(snap)
	return textResult(jobText(out)), out, nil
}

func (s *Server) list(_ context.Context, req *mcp.CallToolRequest, _ struct{}) (*mcp.CallToolResult, ListOutput, error) {
	snaps := s.jobs(req.Session).List()
	out := ListOutput{Jobs: make([]JobInfo, 0, len(snaps))}
	var b strings.Builder
	fmt.Fprintf(&b, "%d jobs.", len(snaps))
	for _, snap := range snaps {
		info := JobInfo{
			JobID:         string(snap.ID),
			Command:       snap.Command,
			Cwd:           snap.Dir,
			State:         snap.State.String(),
			QueuePosition: snap.QueuePosition,
			ExitCode:      exitCode(snap),
			PID:           snap.PID,
			Started:       snap.Started.UTC().Format(time.RFC3339Nano),
			OutputBytes:   snap.Output.Total,
			Reason:        snap.Reason,
			Ports:         snap.Ports,
		}
		if !snap.Ended.IsZero() {
			info.Ended = snap.Ended.UTC().Format(time.RFC3339Nano)
		}
		for _, p := range snap.Processes {
			info.Processes = append(info.Processes, ProcessInfo{PID: p.PID, PPID: p.PPID, Command: p.Command})
		}
		out.Jobs = append(out.Jobs, info)
		fmt.Fprintf(&b, "\n%s %s", info.JobID, info.State)
		switch {
		case info.ExitCode != nil:
			fmt.Fprintf(&b, " (exit %d)", *info.ExitCode)
		case info.QueuePosition > 0:
			fmt.Fprintf(&b, " (place %d)", info.QueuePosition)
		}
		fmt.Fprintf(&b, ": %s", oneLine(info.Command, 80))
		if len(info.Ports) > 0 {
			ports := make([]string, len(info.Ports))
			for i, p := range info.Ports {
				ports[i] = strconv.Itoa(p)
			}
			fmt.Fprintf(&b, "\n  listening on port %s", strings.Join(ports, ", "))
		}
		for _, p := range info.Processes {
			fmt.Fprintf(&b, "\n  pid %d (parent %d): %s", p.PID, p.PPID, oneLine(p.Command, 80))
		}
	}
	return textResult(b.String()), out, nil
}

// oneLine shortens a command for a listing.
func oneLine(s string, n int) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > n {
		s = s[:n] + "..."
	}
	return s
}
