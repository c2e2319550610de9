package bgjob

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// Interactive jobs. A job launched with Spec.Interactive (or Spec.TTY)
// has an input: the host's end of its standard input (a pipe, or the
// terminal's master side), made by the platform's startJob and handed
// to the job at spawn. Write, CloseInput and Resize reach the job
// through it; the supervisor closes it at the job's end.

// inputPlan says what a job reads as its standard input.
type inputPlan struct {
	data        string // Spec.Stdin: written first
	interactive bool   // the host keeps a write end after data
	tty         *TTY   // a pseudo-terminal of this size (implies interactive)
	// fifo, in durable mode, is the named pipe in the run folder that
	// an interactive job reads (see durable_io_linux.go). Then startJob
	// sets holder, the process that holds it open, and life, the write
	// end of the holder's life pipe, which the job's wrapper gets as
	// descriptor lifeFD (hasLife set).
	fifo    string
	holder  *keeper
	life    int
	hasLife bool

	// Set by startJob for an interactive job: conn, the host's end of
	// the input; and onEOF, in durable mode, what lets go of the other
	// holder of the input once the host closed it.
	conn  inputConn
	onEOF func() error
}

// dropConn closes an input made for a job that did not start.
func (ip *inputPlan) dropConn() {
	if ip.conn != nil {
		ip.conn.Close()
		ip.conn = nil
	}
	ip.dropLife()
	if ip.holder != nil {
		ip.holder.stop()
		ip.holder, ip.onEOF = nil, nil
	}
}

// inputConn is the host's end of an interactive job's input, made by the
// platform's startJob. Its writes honour deadlines; it is closed once.
type inputConn interface {
	Write(p []byte) (int, error)
	SetWriteDeadline(t time.Time) error
	Close() error
	// eof ends the input: closes a pipe; on a terminal, which stays
	// open, writes its end-of-file character without waiting.
	eof() error
	// resize sets a terminal's size (ErrNotInteractive for a pipe).
	resize(rows, cols uint16) error
	// writeNow writes what of p fits now, without waiting (0 where it
	// cannot tell).
	writeNow(p []byte) (int, error)
}

// input is an interactive job's input, made with the job and attached to
// its connection at spawn.
//
// One goroutine at a time writes (Write, CloseInput on a terminal, or
// the feeder of a long Spec.Stdin): it holds sem, which a waiter can
// give up on when its ctx ends, unlike a mutex. closed is set once,
// before conn's end is written or conn is closed; done is closed with
// it, waking those that wait for sem.
type input struct {
	tty   bool
	ready chan struct{} // closed by attach, or by end if the job never got a process
	conn  inputConn     // set by attach before ready closes; never changed
	// onEOF, set by attach for a durable job, lets go of what else holds
	// the input open (the holder) once the host closed it; it reports
	// whether that worked.
	onEOF func() error

	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	closed    atomic.Bool
	// why says who closed the input: inputByHost (CloseInput),
	// inputByEnd (the job's end) or inputByJob (the job closed its end).
	why atomic.Int32
	// ended is set when the job has ended and conn is closed (a terminal
	// is closed only then: Resize works until the job ends).
	ended atomic.Bool
}

const (
	inputByHost int32 = iota + 1
	inputByEnd
	inputByJob
)

func newInput(tty bool) *input {
	return &input{tty: tty, ready: make(chan struct{}), sem: make(chan struct{}, 1), done: make(chan struct{})}
}

// attach gives in its connection, once the job's process runs.
func (in *input) attach(c inputConn, onEOF func() error) {
	in.conn, in.onEOF = c, onEOF
	close(in.ready)
}

// markClosed records that the input is closed, once; it reports whether
// this call closed it.
func (in *input) markClosed(why int32) bool {
	first := false
	in.closeOnce.Do(func() {
		first = true
		in.why.Store(why)
		in.closed.Store(true)
		close(in.done)
	})
	return first
}

// closedErr is the error of a write to a closed input.
func (in *input) closedErr(op string, id ID) error {
	switch in.why.Load() {
	case inputByEnd:
		return fmt.Errorf("bgjob: %s %s: the job has ended: %w", op, id, ErrInputClosed)
	case inputByJob:
		return fmt.Errorf("bgjob: %s %s: the job closed its input: %w", op, id, ErrInputClosed)
	}
	return fmt.Errorf("bgjob: %s %s: CloseInput was called: %w", op, id, ErrInputClosed)
}

// acquire waits until the input is attached and this goroutine is its
// writer, or fails: the input closed, or ctx ended.
func (in *input) acquire(ctx context.Context, op string, id ID) error {
	if in.closed.Load() {
		return in.closedErr(op, id)
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("bgjob: %s %s: %w", op, id, err)
	}
	select {
	case <-in.ready:
	case <-in.done:
		return in.closedErr(op, id)
	case <-ctx.Done():
		return fmt.Errorf("bgjob: %s %s: %w", op, id, ctx.Err())
	}
	select {
	case in.sem <- struct{}{}:
	case <-in.done:
		return in.closedErr(op, id)
	case <-ctx.Done():
		return fmt.Errorf("bgjob: %s %s: %w", op, id, ctx.Err())
	}
	if in.closed.Load() {
		<-in.sem
		return in.closedErr(op, id)
	}
	if err := ctx.Err(); err != nil {
		<-in.sem // both were ready: ctx's end wins
		return fmt.Errorf("bgjob: %s %s: %w", op, id, err)
	}
	return nil
}

func (in *input) release() { <-in.sem }

// write writes p, as the writer (see acquire), until it is written, ctx
// ends (then the write's deadline moves into the past) or the input
// closes.
func (in *input) write(ctx context.Context, id ID, p []byte) (int, error) {
	if len(p) == 0 {
		// Nothing to wait for: only whether the input is open.
		if in.closed.Load() {
			return 0, in.closedErr("write", id)
		}
		return 0, nil
	}
	if err := in.acquire(ctx, "write", id); err != nil {
		return 0, err
	}
	defer in.release()
	c := in.conn
	c.SetWriteDeadline(time.Time{})
	fired := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		c.SetWriteDeadline(time.Unix(1, 0))
		close(fired)
	})
	n, err := c.Write(p)
	if !stop() {
		<-fired // its deadline must not reach the next writer
	}
	switch {
	case err == nil:
		return n, nil
	case errors.Is(err, os.ErrDeadlineExceeded) && ctx.Err() != nil:
		return n, fmt.Errorf("bgjob: write %s: %d of %d bytes written: %w", id, n, len(p), ctx.Err())
	case in.closed.Load():
		return n, in.closedErr("write", id)
	case brokenInput(err):
		in.markClosed(inputByJob)
		return n, in.closedErr("write", id)
	}
	return n, fmt.Errorf("bgjob: write %s: %w", id, err)
}

// brokenInput reports whether a write failed because the job no longer
// reads its input: a pipe without a reader, a terminal without a slave.
func brokenInput(err error) bool {
	return errors.Is(err, syscall.EPIPE) || errors.Is(err, syscall.EIO) || errors.Is(err, os.ErrClosed) ||
		errors.Is(err, io.ErrClosedPipe) || errBrokenPipe(err)
}

// closeInput ends the input for CloseInput: a pipe's write end closes
// (the job reads what was written, then EOF); a terminal gets its
// end-of-file character (it stays open for Resize, but Write fails from
// now on).
func (in *input) closeInput(id ID) error {
	if in.closed.Load() {
		return in.closedErr("close input", id)
	}
	select {
	case <-in.ready:
	case <-in.done:
		return in.closedErr("close input", id)
	}
	if !in.markClosed(inputByHost) {
		return in.closedErr("close input", id)
	}
	// A writer blocked on a full pipe or terminal gives up now: what it
	// wrote is in, the rest is not (it gets ErrInputClosed).
	in.conn.SetWriteDeadline(time.Unix(1, 0))
	in.sem <- struct{}{}
	defer in.release()
	err := in.conn.eof()
	if in.onEOF != nil {
		err = errors.Join(err, in.onEOF())
	}
	if err != nil {
		return fmt.Errorf("bgjob: close input %s: %w", id, err)
	}
	return nil
}

// end closes the input at the job's end, for good: from the supervisor,
// before the job is finished.
func (in *input) end() {
	in.markClosed(inputByEnd)
	select {
	case <-in.ready:
	default:
		in.attach(nil, nil) // the job never got a process
	}
	if in.conn == nil || in.ended.Swap(true) {
		return
	}
	in.conn.SetWriteDeadline(time.Unix(1, 0))
	in.sem <- struct{}{} // the writer, if any, gives up at once
	in.conn.Close()
	<-in.sem
}

// resize sets the size of a TTY job's terminal.
func (in *input) resize(id ID, rows, cols uint16) error {
	select {
	case <-in.ready:
	case <-in.done:
		if in.conn == nil || in.ended.Load() {
			return fmt.Errorf("bgjob: resize %s: the job has ended: %w", id, ErrInputClosed)
		}
	}
	if in.ended.Load() {
		return fmt.Errorf("bgjob: resize %s: the job has ended: %w", id, ErrInputClosed)
	}
	if err := in.conn.resize(rows, cols); err != nil {
		if in.ended.Load() {
			return fmt.Errorf("bgjob: resize %s: the job has ended: %w", id, ErrInputClosed)
		}
		return fmt.Errorf("bgjob: resize %s: %w", id, err)
	}
	return nil
}

// feed writes a long Spec.Stdin that did not fit into the input at once,
// as its first writer: the job's Write calls wait behind it. It is the
// feeder goroutine, counted in the registry's wait group; it ends when
// all is written or the input closes.
func (in *input) feed(r *Registry, data []byte) {
	defer r.wg.Done()
	defer in.release()
	in.conn.SetWriteDeadline(time.Time{})
	if _, err := in.conn.Write(data); err != nil && !in.closed.Load() && brokenInput(err) {
		in.markClosed(inputByJob)
	}
}

// prime writes Spec.Stdin into a newly attached input: what fits at
// once, and the rest from a feeder goroutine that holds the input until
// it is done.
func (in *input) prime(r *Registry, data string) {
	if data == "" || in.conn == nil {
		return
	}
	in.sem <- struct{}{}
	n, err := in.conn.writeNow([]byte(data))
	if n == len(data) {
		in.release()
		return
	}
	if err != nil {
		if brokenInput(err) {
			in.markClosed(inputByJob)
		}
		in.release()
		return
	}
	r.wg.Add(1)
	go in.feed(r, []byte(data[n:])) // releases sem when done
}

// Write writes p to the standard input of the interactive job id (see
// Spec.Interactive and Spec.TTY), in order with the job's other writes:
// concurrent calls are written one after the other, never interleaved.
// It returns once all of p is in the job's input pipe or terminal,
// which is at once unless the job has not read what was written before
// and the pipe (64 KiB on Linux) or the terminal's input buffer is full;
// then it waits for the job to read. ctx bounds that wait: if ctx ends
// first, Write returns how much was written and an error wrapping
// ctx.Err(). Nothing Write waits for holds up the job or the registry.
//
// On a TTY job's terminal what is written is typed: it passes through
// the terminal's line discipline, so it is echoed (unless the program
// turned echo off), a program reading lines sees a line only at "\n" or
// "\r", and control characters act as keys: "\x03" interrupts the
// foreground process group (SIGINT), "\x1a" suspends it, "\x04" at the
// start of a line is end of file. A line discipline holds about 4 KiB
// of a line not yet ended; a longer line is cut.
//
// A Write of nothing returns at once: 0, and the error a Write would
// get if the input is not open.
//
// Write fails with ErrNotFound for an unknown ID, ErrNotInteractive for
// a job not launched with Spec.Interactive or Spec.TTY, and
// ErrInputClosed once the input is closed: by CloseInput, by the job's
// end, or by the job (it closed its stdin, or exited and left no reader).
func (r *Registry) Write(ctx context.Context, id ID, p []byte) (int, error) {
	return r.write(ctx, anySession, id, p)
}

func (r *Registry) write(ctx context.Context, sc scope, id ID, p []byte) (int, error) {
	in, err := r.inputOf(sc, "write", id)
	if err != nil {
		return 0, err
	}
	return in.write(ctx, id, p)
}

// inputOf finds the input of an interactive job.
func (r *Registry) inputOf(sc scope, op string, id ID) (*input, error) {
	j, err := r.lookup(sc, op, id)
	if err != nil {
		return nil, err
	}
	if j.in == nil {
		return nil, fmt.Errorf("bgjob: %s %s: launched without Spec.Interactive: %w", op, id, ErrNotInteractive)
	}
	return j.in, nil
}

// CloseInput ends the input of the interactive job id: the job reads
// what was written, then end of file. Afterwards Write fails with
// ErrInputClosed; the job itself goes on until it ends. A Write blocked
// on a full input when CloseInput is called returns at once, with
// ErrInputClosed and what it wrote.
//
// On a TTY job the terminal stays (Resize still works): CloseInput types
// the terminal's end-of-file character (VEOF, normally Ctrl-D), which a
// program reading lines sees as end of file at the start of a line (in
// the middle of one, it only ends that line), and a full-screen program
// in raw mode sees as a key. On Windows it is Ctrl-Z and Enter at the
// pseudo console. It does not wait: if the terminal's input buffer is
// full, CloseInput returns an error, though Write fails from now on.
//
// In durable mode the input stays open across a restart of the host
// (see Config.StateDir), and CloseInput after one still ends it.
//
// CloseInput fails with ErrNotFound, ErrNotInteractive as Write does,
// and with ErrInputClosed if the input was closed already.
func (r *Registry) CloseInput(id ID) error {
	return r.closeInput(anySession, id)
}

func (r *Registry) closeInput(sc scope, id ID) error {
	in, err := r.inputOf(sc, "close input", id)
	if err != nil {
		return err
	}
	if err := in.closeInput(id); err != nil {
		return err
	}
	j, err := r.lookup(sc, "close input", id)
	if err == nil {
		r.jn.inputClosed(j)
	}
	return nil
}

// Resize sets the size of the TTY job id's terminal to rows by cols, as a
// terminal window resized by a person: the job's foreground process
// group gets SIGWINCH (on Windows the pseudo console tells its
// programs), and Screen renders the new size from the output that
// follows. rows and cols must be positive.
//
// Resize fails with ErrNotFound for an unknown ID, ErrNotInteractive for
// a job without Spec.TTY, ErrInputClosed once the job has ended, and
// ErrInvalidArgument for a zero size.
func (r *Registry) Resize(id ID, rows, cols uint16) error {
	return r.resize(anySession, id, rows, cols)
}

func (r *Registry) resize(sc scope, id ID, rows, cols uint16) error {
	j, err := r.lookup(sc, "resize", id)
	if err != nil {
		return err
	}
	if j.scr == nil {
		return fmt.Errorf("bgjob: resize %s: launched without Spec.TTY: %w", id, ErrNotInteractive)
	}
	if rows == 0 || cols == 0 {
		return fmt.Errorf("bgjob: resize %s: size %dx%d: rows and cols must be positive: %w", id, rows, cols, ErrInvalidArgument)
	}
	// The screen learns of the size first, at the stream's offset now:
	// the output that follows is drawn for it.
	j.scr.resize(j, rows, cols)
	return j.in.resize(id, rows, cols)
}

// Screen renders what the TTY job id's terminal shows now: each row of
// text and the cursor's position, as a terminal emulator
// (github.com/charmbracelet/x/vt) draws the job's output. Colours and
// other attributes are not kept; a wide character takes its one place
// in the row's string. After the job's end it is the last screen. The
// rows pass the Admitter as one text (Partial set), joined by "\n".
//
// The emulator is fed lazily, by Screen itself, with the output that
// came since the last call, so a job nobody looks at costs nothing. If
// more than 256 KiB came since (or the registry no longer holds it),
// the screen is rebuilt from the latest 256 KiB alone, starting at a
// line, and Screen.Notice says so: the state that older output set up
// (an alternate screen, a scroll region, attributes) is lost then,
// though a program that redraws, and plain text, come out right. The
// emulator does not answer a program's queries (cursor position, device
// attributes): one that waits for an answer waits for its own timeout.
//
// Screen fails with ErrNotFound for an unknown ID and ErrNotInteractive
// for a job without Spec.TTY.
func (r *Registry) Screen(id ID) (Screen, error) {
	return r.screen(anySession, id)
}

func (r *Registry) screen(sc scope, id ID) (Screen, error) {
	j, err := r.lookup(sc, "screen", id)
	if err != nil {
		return Screen{}, err
	}
	if j.scr == nil {
		return Screen{}, fmt.Errorf("bgjob: screen %s: launched without Spec.TTY: %w", id, ErrNotInteractive)
	}
	s := j.scr.render(j)
	a := r.admit(AdmitRequest{ID: j.id, Session: j.spec.Session, Command: j.spec.Command,
		Text: strings.Join(s.Rows, "\n"), Partial: true})
	s.Notice = joinNotices(s.Notice, a.Notice)
	if a.Withhold {
		s.Rows, s.Withheld = nil, true
		return s, nil
	}
	s.Rows = strings.Split(a.Text, "\n")
	return s, nil
}
