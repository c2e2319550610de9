package bgjob

import (
	"fmt"
	"time"
)

// journal keeps a record of each job where it outlives the host: durable
// mode's state directory (durable.go). The registry calls it at every
// step of every job's life, whatever the mode, and holds no other trace
// of durable mode; memJournal, for memory mode, does nothing.
//
// The registry calls launching, wrap, started, stopping (if the job is
// stopped) and ending in that order,
// for each job from its own launch or supervisor, outside Registry.mu;
// delivered and purge from any goroutine, outside Registry.mu;
// forgottenLocked with Registry.mu held. None calls a hook.
type journal interface {
	// restore rebuilds r from the journal, in New, before r is shared:
	// it fills r's table, queues and retention, and returns the running
	// jobs it adopted, for New to watch. It fails, adopting nothing,
	// if a job's process is alive but cannot be watched (no descriptor
	// left, say): New must fail then, rather than lose the job.
	restore(r *Registry) ([]adoption, error)

	// launching records j as starting, before its process exists. An
	// error fails the launch (Failed, with a "state: " reason) and
	// leaves no trace of the job in the journal.
	launching(j *job) error

	// wrap fits j's launch plan to the journal: durable mode wraps the
	// command line in the wrapper that writes the exit marker and sends
	// the output to the run's file.
	wrap(j *job, pl *plan) error

	// queueing begins the record of j, a new run, as queued, before the
	// launch decides (under Registry.mu) whether j waits in the queue;
	// the launch calls the function it returns with that decision once
	// it has let go of Registry.mu. Until then launching and ending of
	// j wait, so that a record of j as queued is never written after
	// its start or its end.
	queueing(j *job) func(queued bool)

	// started records j's process: its PID and what contains it.
	started(j *job, p *process)

	// stopping records why j's supervisor is about to stop it (a
	// Cancel, a timeout, Close), before its first signal, so that the
	// end is known even if the host dies before it.
	stopping(j *job, o outcome)

	// ending begins the record of j's end; the registry calls the
	// function it returns once the end is in its table. Between the
	// two, delivered and purge of j wait.
	ending(j *job) func(o outcome, ended time.Time, pollable bool)

	// delivered records that j's completion was delivered (returned by
	// Completions or passed to OnComplete), so that it never is again.
	delivered(j *job)

	// tracksMatches reports whether the journal keeps watches and their
	// matches (durable mode): only then does the delivery goroutine hand
	// it marks of how far each job's matcher got.
	tracksMatches() bool

	// watched records a watch added to j (Registry.Watch), which matches
	// from its matcher's mark on. (Spec.Watches are in the record that
	// launching writes.)
	watched(j *job, w Watch, from scanMark)

	// matching begins the record of matches of j; the delivery goroutine
	// calls the function it returns once they are queued, with every
	// match it has for j (queued reports those in their session's
	// queue: the rest were dropped) and mark, how far j's matcher got
	// (at < 0: unknown). Between the two, matchesDelivered of j waits.
	matching(j *job) func(fs []found, queued []bool, mark scanMark)

	// matchesDelivered records that j's matches up to sequence number
	// seq were delivered (by Matches, or to OnMatch), so that they
	// never are again.
	matchesDelivered(j *job, seq uint64)

	// inputClosed records that CloseInput closed j's input, so that a
	// later Registry that adopts the job knows.
	inputClosed(j *job)

	// forgottenLocked notes that the registry forgot j (evicted, replaced
	// by a new run, or collected by its last foreground caller); the
	// next purge lets go of its record, unless its completion is owed.
	forgottenLocked(j *job)

	// purge lets go of the records of the jobs forgotten since the last
	// purge. It does I/O, so the registry calls it outside its lock.
	purge()

	// releasable reports whether Detach may release running jobs: only
	// a journal that lets a later Registry adopt them allows it.
	releasable() error

	// close ends the journal once the registry has ended (Close or
	// Detach, after every goroutine): durable mode lets go of its state
	// directory. Records change no more afterwards.
	close()
}

// openJournal returns the journal that c asks for, and the ID key to use
// (Config.IDKey, or the one kept in the state directory).
func openJournal(c *Config) (journal, []byte, error) {
	if c.StateDir == "" {
		return memJournal{}, c.IDKey, nil
	}
	st, key, err := openStore(c)
	if err != nil {
		return nil, nil, err
	}
	return st, key, nil
}

// memJournal is the journal of memory mode: nothing outlives the host.
type memJournal struct{}

func (memJournal) restore(*Registry) ([]adoption, error) { return nil, nil }
func (memJournal) launching(*job) error                  { return nil }
func (memJournal) wrap(*job, *plan) error                { return nil }
func (memJournal) started(*job, *process)                {}
func (memJournal) queueing(*job) func(bool)              { return endQueueing }
func (memJournal) stopping(*job, outcome)                {}
func (memJournal) delivered(*job)                        {}
func (memJournal) inputClosed(*job)                      {}
func (memJournal) forgottenLocked(*job)                  {}
func (memJournal) purge()                                {}
func (memJournal) close()                                {}
func (memJournal) tracksMatches() bool                   { return false }
func (memJournal) watched(*job, Watch, scanMark)         {}
func (memJournal) matchesDelivered(*job, uint64)         {}

func (memJournal) matching(*job) func([]found, []bool, scanMark) { return matchNothing }

func matchNothing([]found, []bool, scanMark) {}

func (memJournal) ending(*job) func(outcome, time.Time, bool) { return endNothing }

func endNothing(outcome, time.Time, bool) {}

func endQueueing(bool) {}

func (memJournal) releasable() error {
	return fmt.Errorf("durable mode (Config.StateDir) is off: %w", ErrUnsupported)
}

// adoption is a running job that the journal found at New, to be watched
// once the Registry exists.
type adoption struct {
	j       *job
	p       *process
	rd      outputReader
	lastOut time.Time // when the job last wrote output, as far as the journal knows
	stop    *outcome  // a stop its last host began: the supervisor goes on with it
}
