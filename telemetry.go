package bgjob

import (
	"context"
	"log/slog"
	"time"
)

// Telemetry is told when jobs start and end. JobStarted is called once
// for each new process (never for a launch that joined a running job);
// JobFinished exactly once for each execution, including one whose spawn
// failed (Category CategorySpawn, with no JobStarted before it). A re-run
// of the same ID is a new execution; polling never calls either.
//
// Methods are called from the goroutine that launched or supervises the
// job, never under the registry's lock. A slow method delays only the job
// it reports on, but must still not block for long.
type Telemetry interface {
	JobStarted(Event)
	JobFinished(Event)
}

// Event describes a job for [Telemetry]. It holds no output.
type Event struct {
	ID      ID
	Session string
	State   State
	// ExitCode is as in Snapshot; -1 in JobStarted.
	ExitCode int
	// Duration is the job's run time; 0 in JobStarted.
	Duration time.Duration
	// Bytes is the number of bytes the job wrote; 0 in JobStarted.
	Bytes int64
	// Background reports that the job was pollable: started by Start,
	// joined by Start, or detached from RunForeground.
	Background bool
	Category   Category
}

// Category classifies how a job ended, for error telemetry.
type Category int

const (
	// CategoryNone: still running, or exited with status 0.
	CategoryNone Category = iota
	// CategoryCommand: the command exited with a non-zero status.
	CategoryCommand
	// CategoryTimeout: the job hit its Timeout or IdleTimeout.
	CategoryTimeout
	// CategoryCancelled: the job was cancelled or the registry closed.
	CategoryCancelled
	// CategorySpawn: the job's process could not be started.
	CategorySpawn
	// CategoryLimit: one of the job's Limits stopped it; the job's
	// Reason names the limit.
	CategoryLimit
)

var categoryNames = [...]string{"none", "command", "timeout", "cancelled", "spawn", "limit"}

// String returns "none", "command", "timeout", "cancelled", "spawn" or
// "limit".
func (c Category) String() string {
	if c >= 0 && int(c) < len(categoryNames) {
		return categoryNames[c]
	}
	return "unknown"
}

// MarshalText returns the category's name, as String does, so that a
// Category is a string in JSON. A value outside the categories is an
// error.
func (c Category) MarshalText() ([]byte, error) {
	return marshalName("category", int(c), categoryNames[:])
}

// UnmarshalText sets c to the category that text names, as String gives
// it. Any other text is an error.
func (c *Category) UnmarshalText(text []byte) error {
	return unmarshalName("category", text, categoryNames[:], (*int)(c))
}

func categoryOf(s State, exitCode int) Category {
	switch s {
	case Exited:
		if exitCode != 0 {
			return CategoryCommand
		}
	case TimedOut:
		return CategoryTimeout
	case Cancelled:
		return CategoryCancelled
	case Failed:
		return CategorySpawn
	}
	return CategoryNone
}

// NewSlogTelemetry returns a Telemetry that logs each event to l: job
// starts at Debug, clean ends at Info, and ends with a Category other
// than CategoryNone at Warn. The records carry the event's fields and
// never the job's output.
func NewSlogTelemetry(l *slog.Logger) Telemetry {
	return slogTelemetry{l}
}

type slogTelemetry struct{ l *slog.Logger }

func (t slogTelemetry) JobStarted(e Event) {
	t.l.LogAttrs(context.Background(), slog.LevelDebug, "bgjob: job started",
		slog.String("id", string(e.ID)), slog.String("session", e.Session),
		slog.Bool("background", e.Background))
}

func (t slogTelemetry) JobFinished(e Event) {
	level := slog.LevelInfo
	if e.Category != CategoryNone {
		level = slog.LevelWarn
	}
	t.l.LogAttrs(context.Background(), level, "bgjob: job finished",
		slog.String("id", string(e.ID)), slog.String("session", e.Session),
		slog.String("state", e.State.String()), slog.Int("exit_code", e.ExitCode),
		slog.Duration("duration", e.Duration), slog.Int64("bytes", e.Bytes),
		slog.Bool("background", e.Background), slog.String("category", e.Category.String()))
}
