package bgjob

import (
	"bytes"
	"context"
	"fmt"
	"math"
	"regexp"
	"sync"
	"sync/atomic"
	"time"
)

// Watches: a stage of the output chain (emit) that matches each line of a
// job's raw output against the job's watches and its WaitFor callers'
// patterns (watch_scan.go does the matching), and hands the matches on:
// a WaitFor caller's to the caller, a watch's to the delivery goroutine
// (deliver.go), which admits them, queues them for their session and
// calls Config.OnMatch.

// Watch asks to be told when a job prints a line that matches Pattern:
// each match becomes a [Match], queued for the job's session (see
// [Registry.Matches]) and passed to [Config.OnMatch]. Give a job its
// watches with [Spec.Watches], or add one to a running job with
// [Registry.Watch].
//
// Pattern is matched against each line of the job's raw output, before
// the Admitter: a line ends at '\n', and neither the "\n" nor a "\r"
// before it is part of the text the pattern sees, so `ready$` matches
// "ready\r\n" (a lone '\r', as progress bars print, does not end a line).
// A line longer than 4096 bytes is matched in pieces of 4096 bytes from
// its start (a match that would straddle two pieces is missed). Every
// byte the job writes is matched once, in order, including the bytes
// between the head and the tail that the registry does not keep, and
// lines that arrive in many small writes. The stream's last line is
// matched at the job's end even if it has no '\n'. Offsets count the
// raw stream, as Read's do. A TTY job's raw stream is what its terminal
// got, escape sequences and all: a pattern for a coloured line must
// allow for them (the line's "\r\n" ends it as "\n" does).
//
// A watch fires once, on the first line that matches, unless Every is
// set: then on every line that matches.
//
// A pattern with a literal that every match must contain (as in
// `(?i)error|listening on|ready in`) costs little: lines are searched for
// the literals first, so only lines that hold one meet the regexp. A
// pattern with none (`^\d+ms$`, `.`) runs on every line, which costs
// about a microsecond per line and can slow a job that prints fast.
//
// A match tells that the raw line matched, even where the Admitter
// withholds or rewrites the line: a host that takes patterns from a
// party that must not learn what the Admitter withholds should not let it
// set watches (or wait with WaitFor).
type Watch struct {
	// Name names the watch in its matches. A job's watches have
	// distinct names ("" is a name like any other).
	Name string
	// Pattern is the regexp; it must not be nil.
	Pattern *regexp.Regexp
	// Every makes the watch fire on every matching line, not only the
	// first.
	Every bool
}

// Match is a line of a job's output that matched a watch or a WaitFor
// pattern. It marshals to JSON with snake_case names, as Completion
// does.
type Match struct {
	ID      ID     `json:"job_id"`
	Session string `json:"session"`
	// Watch is the name of the watch that matched; "" for a match that
	// WaitFor returns.
	Watch string `json:"watch"`
	// Offset is the absolute stream offset of the line's first byte (of
	// the piece's, for a line matched in pieces).
	Offset int64 `json:"offset"`
	// Line is the line's text, without its "\n" or "\r\n", as the
	// Admitter admitted it (asked with Partial set); empty when the
	// Admitter withheld it.
	Line string `json:"line"`
	// Withheld reports that the Admitter withheld the line: Line is
	// then empty, and nothing of the line's text is in the Match.
	Withheld bool `json:"withheld,omitempty"`
	// At is when the registry matched the line (by the registry's
	// clock); for a line printed while no host ran (durable mode), when
	// a later host read it.
	At time.Time `json:"at"`
	// Dropped counts the matches of the same session that were not
	// queued just before this one because the queue was full (see
	// Registry.Matches); they did reach OnMatch.
	Dropped int64 `json:"dropped,omitempty"`
}

// EndedError is the error [Registry.WaitFor] returns when the job ends
// without a line that matches: it wraps [ErrJobEnded] and carries the
// job's final snapshot.
type EndedError struct {
	Snapshot Snapshot
}

func (e *EndedError) Error() string {
	return fmt.Sprintf("bgjob: wait for %s: %s (exit code %d) without a match: %s", e.Snapshot.ID, e.Snapshot.State, e.Snapshot.ExitCode, ErrJobEnded)
}

// Unwrap returns ErrJobEnded.
func (e *EndedError) Unwrap() error { return ErrJobEnded }

// watchState is what a job holds for its watches.
type watchState struct {
	// wt is the job's watcher, made by its first watch (launch, Watch,
	// WaitFor or replay) and never replaced; nil until then.
	wt atomic.Pointer[watcher]
	// hold is the offset of the job's output from which a later host may
	// read the output file again to match it (durable mode): holes are
	// never punched past it (see holes.punch). MaxInt64 while the job
	// has no watch.
	hold atomic.Int64
	// free reports that the job's matches are no longer bounded (see
	// job.unbound): set once, by the supervisor.
	free atomic.Bool

	// Guarded by Registry.feed.mu (deliver.go): the job's matches that
	// wait for delivery, the channel that wakes its supervisor when
	// there is room for more, and in durable mode how far the matcher
	// got (mark) and how far the journal was told (marked).
	backlog int
	room    chan struct{}
	mark    scanMark
	marked  int64
}

// scanMark is how far a job's output was matched: every line and piece
// before at, which is a line's start (or, with cut, a piece's; or, with
// skip, a byte in a line that is passed over up to its end).
type scanMark struct {
	at   int64
	cut  bool
	skip bool
}

// markLocked returns the watcher's mark; wt.mu must be held.
func (wt *watcher) markLocked() scanMark {
	if wt.m.skip {
		at := wt.pos
		if len(wt.lag) > 0 {
			at = wt.lagAt
		}
		return scanMark{at: at, skip: true}
	}
	return scanMark{at: wt.m.carryAt, cut: wt.m.cut}
}

// watcher is a job's watches and the matcher its output passes through.
// The supervisor feeds it each chunk of output, in order, after the
// head/tail buffer; Watch and WaitFor add to it from any goroutine.
type watcher struct {
	r *Registry
	j *job

	// mu guards the fields below. The supervisor holds it while it
	// matches a piece of a chunk, never while it waits for room.
	mu sync.Mutex
	// watches holds the job's watches and the WaitFor patterns, in the
	// order they came; the ones that are done leave at the next compile.
	watches []*watch
	names   map[string]bool // the names of the job's watches, done ones too
	dirty   bool            // watches changed since m.prog was compiled
	m       matcher
	// pos is the offset of the next byte of the stream to come; bytes
	// before it were seen (or skipped) already, and those from lagAt on
	// wait in lag for room to match them (see take).
	pos   int64
	lag   []byte
	lagAt int64
	ended bool   // the stream ended (flush): nothing more is matched
	seq   uint64 // the last sequence number of a delivered match
	// found collects the watches' matches of the chunk being matched,
	// for delivery once mu is released.
	found []found
}

// waiter is a WaitFor caller's side of its pattern: the first match, once
// the matcher finds it.
type waiter struct {
	done chan struct{} // closed when m is set
	m    Match         // Line raw until the caller admits it
}

func newWatcher(r *Registry, j *job, pos int64) *watcher {
	wt := &watcher{r: r, j: j, pos: pos, names: map[string]bool{}}
	wt.m.prog = &program{}
	wt.m.carryAt = pos
	wt.m.hit = wt.hit
	return wt
}

// add adds a watch; mu must be held.
func (wt *watcher) addLocked(w *watch) {
	if w.wait == nil {
		wt.names[w.name] = true
	}
	wt.watches = append(wt.watches, w)
	wt.dirty = true
}

// liveLocked returns the offset from which the matcher will match the
// lines still to come: the line (or piece) in progress, or, when it
// skips the line in progress (whose start it never saw), the next byte.
// mu must be held.
func (wt *watcher) liveLocked() int64 { return wt.markLocked().at }

// compileLocked brings the matcher's program up to date with the
// watches; mu must be held.
func (wt *watcher) compileLocked() {
	if !wt.dirty {
		return
	}
	live := wt.watches[:0]
	for _, w := range wt.watches {
		if !w.done() {
			live = append(live, w)
		}
	}
	clear(wt.watches[len(live):])
	wt.watches = live
	wt.m.prog = compile(live)
	wt.dirty = false
}

// hit is the matcher's hit function: a WaitFor caller gets its match
// here, a watch's match goes to found. mu is held.
func (wt *watcher) hit(w *watch, off int64, text []byte) {
	j := wt.j
	m := Match{ID: j.id, Session: j.spec.Session, Watch: w.name, Offset: off, Line: string(text), At: wt.r.now()}
	if w.wait != nil {
		m.Watch = ""
		w.wait.m = m
		close(w.wait.done)
		wt.dirty = true
		return
	}
	if !w.every {
		wt.dirty = true
	}
	wt.seq++
	wt.found = append(wt.found, found{j: j, m: m, seq: wt.seq})
}

// take is the watch stage of the output chain: it matches the chunk p,
// which starts at offset base, and hands its matches on. It never
// waits. While the job's matches are bounded (see watchState.free), once
// the job has as many matches waiting for delivery as it may
// (maxBacklog), the matcher stops at a line's end and the rest of the
// chunk waits in wt.lag, which the supervisor matches (catchUp) before
// it reads more output: it reads nothing while there is a lag, so the
// lag holds at most the rest of one read.
func (wt *watcher) take(p []byte, base int64) {
	r, j := wt.r, wt.j
	free := j.ws.free.Load()
	room := -1
	if !free {
		room, _ = r.room(j)
	}
	wt.mu.Lock()
	if skip := wt.pos - base; skip > 0 {
		// Seen when the watcher was made, or matched before a
		// restart.
		if skip >= int64(len(p)) {
			wt.mu.Unlock()
			return
		}
		p, base = p[skip:], base+skip
	}
	if wt.ended {
		wt.mu.Unlock()
		return
	}
	wt.pos = base + int64(len(p))
	wt.compileLocked()
	if len(wt.lag) > 0 && free {
		// The bound was lifted after this lag was left (see unbound).
		wt.m.feed(wt.lag, wt.lagAt, -1)
		wt.lag = nil
	}
	if len(wt.lag) > 0 || room == 0 {
		if len(wt.lag) == 0 {
			wt.lagAt = base
		}
		wt.lag = append(wt.lag, p...)
	} else if n := wt.m.feed(p, base, room); n < len(p) {
		wt.lag, wt.lagAt = append(wt.lag[:0], p[n:]...), base+int64(n)
	}
	fs, mark := wt.takeFoundLocked()
	wt.mu.Unlock()
	r.deliver(j, fs, mark)
}

// takeFoundLocked returns the matches found and not yet handed on, and
// the mark that covers them; wt.mu must be held.
func (wt *watcher) takeFoundLocked() ([]found, scanMark) {
	fs := wt.found
	wt.found = nil
	mark := wt.markLocked()
	if len(wt.names) == 0 {
		mark.at = -1 // only WaitFor callers: nothing to record
	}
	return fs, mark
}

// catchUp matches the watcher's lag as far as the job's room for
// matches allows, and returns nil when the lag is gone and there is room
// for more, else a channel that is closed when there is room.
func (wt *watcher) catchUp() <-chan struct{} {
	r, j := wt.r, wt.j
	for {
		room, wait := r.room(j)
		wt.mu.Lock()
		if len(wt.lag) == 0 || room == 0 || wt.ended {
			wt.mu.Unlock()
			return wait
		}
		wt.compileLocked()
		n := wt.m.feed(wt.lag, wt.lagAt, room)
		wt.lag, wt.lagAt = wt.lag[n:], wt.lagAt+int64(n)
		if len(wt.lag) == 0 {
			wt.lag = nil
		}
		fs, mark := wt.takeFoundLocked()
		wt.mu.Unlock()
		r.deliver(j, fs, mark)
	}
}

// matchRoom is what the supervisor asks before it reads more output
// while the job's matches are bounded: it returns nil if it may read,
// else a channel that is closed when it may try again, once some of the
// job's matches were delivered (see take).
func (j *job) matchRoom() <-chan struct{} {
	if wt := j.ws.wt.Load(); wt != nil && !j.ws.free.Load() {
		return wt.catchUp()
	}
	return nil
}

// unbound lifts the bound on j's matches for good: the supervisor calls
// it once it must read whatever the job prints, whatever OnMatch does (a
// stop has begun, the shell has exited). The lag is matched now, and
// every later chunk at once: the matches waiting for delivery may then
// exceed maxBacklog by what the job prints until its end, which the
// stop (KillGrace, then SIGKILL) and the drain (drainGrace) bound in
// time.
func (j *job) unbound() {
	if j.ws.free.Load() || j.ws.free.Swap(true) {
		return
	}
	wt := j.ws.wt.Load()
	if wt == nil {
		return
	}
	wt.mu.Lock()
	if len(wt.lag) == 0 || wt.ended {
		wt.mu.Unlock()
		return
	}
	wt.compileLocked()
	wt.m.feed(wt.lag, wt.lagAt, -1)
	wt.lag = nil
	fs, mark := wt.takeFoundLocked()
	wt.mu.Unlock()
	wt.r.deliver(j, fs, mark)
}

// end matches what is left of the stream once the job has ended: the
// lag, if any, at once (the job's end never waits for OnMatch), then the
// stream's last line, which had no '\n'. finish calls it first, after
// the last chunk.
func (wt *watcher) end() {
	wt.mu.Lock()
	if wt.ended {
		wt.mu.Unlock()
		return
	}
	wt.compileLocked()
	if len(wt.lag) > 0 {
		wt.m.feed(wt.lag, wt.lagAt, -1)
		wt.lag = nil
	}
	wt.m.flush()
	wt.ended = true
	fs, _ := wt.takeFoundLocked()
	mark := scanMark{at: wt.pos}
	if len(wt.names) == 0 {
		mark.at = -1
	}
	wt.mu.Unlock()
	wt.r.deliver(wt.j, fs, mark)
}

// emitWatched passes a chunk to j's watcher, if it has one; base is the
// chunk's offset in the stream.
func (j *job) emitWatched(p []byte, base int64) {
	if wt := j.ws.wt.Load(); wt != nil {
		wt.take(p, base)
	}
}

// watcherOf returns j's watcher, making it if need be; nil if j's output
// has ended. A watcher made now starts at the end of the stream so far,
// with the line in progress taken from the head/tail buffer when it is
// held and no longer than maxLine, or else skipped.
func (r *Registry) watcherOf(j *job) *watcher {
	if wt := j.ws.wt.Load(); wt != nil {
		return wt
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if wt := j.ws.wt.Load(); wt != nil {
		return wt
	}
	b := j.out
	if j.fin != nil || b == nil {
		return nil
	}
	total := b.total
	wt := newWatcher(r, j, total)
	if start, ok := b.lineStart(); ok {
		wt.m.carry = b.appendRange(nil, start, total)
		wt.m.carryAt = start
	} else {
		wt.m.skip = true
	}
	j.ws.wt.Store(wt)
	return wt
}

// lineStart returns the offset of the start of the line in progress (the
// byte after the stream's last '\n'), if the buffer holds that line whole
// and it is no longer than maxLine.
func (b *outbuf) lineStart() (int64, bool) {
	headEnd, tailBegin := int64(len(b.head)), b.total-int64(b.tailLen())
	for off := b.total - 1; off >= max(0, b.total-maxLine); off-- {
		var c byte
		switch {
		case off >= tailBegin:
			c = b.tailAt(int(off - tailBegin))
		case off < headEnd:
			c = b.head[off]
		default:
			return 0, false // dropped
		}
		if c == '\n' {
			return off + 1, true
		}
	}
	if b.total <= maxLine && (tailBegin == headEnd || b.total == headEnd) {
		return 0, true // the stream's first line, held whole
	}
	return 0, false
}

// newWatches turns a Spec's watches into a watcher's, starting at from.
func newWatches(ws []Watch, from int64) []*watch {
	out := make([]*watch, len(ws))
	for i, w := range ws {
		out[i] = &watch{name: w.Name, re: w.Pattern, every: w.Every, from: from, last: -1, lits: literals(w.Pattern)}
	}
	return out
}

// startWatches gives a job launched with Spec.Watches its watcher, before
// its process starts.
func (r *Registry) startWatches(j *job) {
	if len(j.spec.Watches) == 0 {
		j.ws.hold.Store(math.MaxInt64)
		return
	}
	j.ws.hold.Store(0)
	wt := newWatcher(r, j, 0)
	for _, w := range newWatches(j.spec.Watches, 0) {
		wt.addLocked(w)
	}
	j.ws.wt.Store(wt)
}

// checkWatches checks a Spec's watches, naming the field.
func checkWatches(ws []Watch) error {
	names := map[string]bool{}
	for i, w := range ws {
		switch {
		case w.Pattern == nil:
			return specError("Watches", "Watches[%d] (%q): no Pattern", i, w.Name)
		case names[w.Name]:
			return specError("Watches", "Watches[%d]: the name %q is taken by an earlier watch", i, w.Name)
		}
		names[w.Name] = true
	}
	return nil
}

// Watch adds a watch to a running job. It matches the lines that end
// from now on: the line in progress and those after it, not the lines
// already complete (WaitFor looks back at those). A line in progress that
// is longer than 4096 bytes, or that the registry no longer holds whole,
// is passed over; the watch starts at the next one.
//
// Watch fails with ErrNotFound for an unknown ID, with ErrInvalidArgument
// for a nil Pattern or a Name another watch of the job has, and with an
// error wrapping ErrJobEnded if the job's output has ended. In durable
// mode the watch is in the job's record before Watch returns.
func (r *Registry) Watch(id ID, w Watch) error { return r.watch(anySession, id, w) }

func (r *Registry) watch(sc scope, id ID, w Watch) error {
	if w.Pattern == nil {
		return fmt.Errorf("bgjob: watch %s: no Pattern: %w", id, ErrInvalidArgument)
	}
	j, err := r.lookup(sc, "watch", id)
	if err != nil {
		return err
	}
	wt := r.watcherOf(j)
	if wt == nil {
		return fmt.Errorf("bgjob: watch %s: %w", id, ErrJobEnded)
	}
	wt.mu.Lock()
	switch {
	case wt.ended:
		wt.mu.Unlock()
		return fmt.Errorf("bgjob: watch %s: %w", id, ErrJobEnded)
	case wt.names[w.Name]:
		wt.mu.Unlock()
		return fmt.Errorf("bgjob: watch %s: the name %q is taken: %w", id, w.Name, ErrInvalidArgument)
	}
	mark := wt.markLocked()
	if len(wt.names) == 0 {
		// In durable mode, the output from here on must stay on disk
		// for a later host to match (see watchState.hold).
		j.ws.hold.Store(mark.at)
	}
	wt.addLocked(newWatches([]Watch{w}, mark.at)[0])
	wt.mu.Unlock()
	r.jn.watched(j, w, mark)
	return nil
}

// WaitFor blocks until the job prints a line that matches re and starts
// at or after the stream offset from, and returns that line as a Match
// (its Watch empty). Lines printed before the call count: WaitFor first
// searches the output the registry holds (the head and the tail; a line
// in the dropped middle is no longer there to find), then waits for the
// lines to come, which it sees whole as a watch does (see [Watch]: raw
// lines, pieces of 4096 bytes). It returns the first such line in the
// stream.
//
// When the job ends without one, WaitFor returns an [*EndedError] that
// wraps ErrJobEnded and holds the final snapshot. Once the job has ended
// the raw bytes are gone, so WaitFor on an ended job searches its final
// admitted text instead: the same where no Admitter changed it, line by
// line where one rewrote lines, and nothing where it withheld the text.
// When ctx ends first, WaitFor returns an error wrapping ctx.Err(). A
// job that Detach released never ends, so WaitFor on it returns only on
// a match or at ctx's end.
//
// The line passes the Admitter (asked with Partial set) before it is
// returned: a withholding verdict gives a Match with Withheld set and no
// text. WaitFor fails with ErrNotFound for an unknown ID and with
// ErrInvalidArgument for a nil re or a negative from. It may be called
// from a hook, as ReadWait may.
func (r *Registry) WaitFor(ctx context.Context, id ID, re *regexp.Regexp, from int64) (Match, error) {
	return r.waitFor(ctx, anySession, id, re, from)
}

func (r *Registry) waitFor(ctx context.Context, sc scope, id ID, re *regexp.Regexp, from int64) (Match, error) {
	const op = "wait for"
	switch {
	case re == nil:
		return Match{}, fmt.Errorf("bgjob: %s %s: no pattern: %w", op, id, ErrInvalidArgument)
	case from < 0:
		return Match{}, fmt.Errorf("bgjob: %s %s: offset %d: negative: %w", op, id, from, ErrInvalidArgument)
	}
	j, err := r.lookup(sc, op, id)
	if err != nil {
		return Match{}, err
	}
	// The pattern goes live first, then what was printed before it is
	// searched: nothing can fall between the two.
	wa := &waiter{done: make(chan struct{})}
	w := &watch{re: re, from: from, last: -1, lits: literals(re), wait: wa}
	live := int64(math.MaxInt64) // the search covers what the matcher will not
	wt := r.watcherOf(j)
	if wt != nil {
		wt.mu.Lock()
		if !wt.ended {
			wt.addLocked(w)
			live = wt.liveLocked()
		}
		wt.mu.Unlock()
		defer func() {
			wt.mu.Lock()
			w.fired, wt.dirty = true, true // done: it leaves now
			wt.compileLocked()
			wt.mu.Unlock()
		}()
	}
	if from < live {
		if m, raw, ok := r.searchHeld(j, w, live); ok {
			if raw {
				r.admitMatch(j, &m)
			}
			return m, nil
		}
	}
	ended := r.ended(j)
	if ended == nil {
		return Match{}, fmt.Errorf("bgjob: %s %s: called from the job's own Admitter while it ends: %w", op, id, ErrInvalidArgument)
	}
	select {
	case <-wa.done:
	case <-ended:
		select {
		case <-wa.done: // the stream's last line, matched at its end
		default:
			return Match{}, &EndedError{Snapshot: r.snapshot(j)}
		}
	case <-ctx.Done():
		return Match{}, fmt.Errorf("bgjob: %s %s: %w", op, id, ctx.Err())
	}
	m := wa.m
	r.admitMatch(j, &m)
	return m, nil
}

// admitMatch passes a match's raw line through the Admitter.
func (r *Registry) admitMatch(j *job, m *Match) {
	a := r.admit(AdmitRequest{ID: j.id, Session: j.spec.Session, Command: j.spec.Command, Text: m.Line, Partial: true})
	if a.Withhold {
		m.Line, m.Withheld = "", true
		return
	}
	m.Line = a.Text
}

// searchHeld searches the output that j holds for the first line that
// matches w and starts before to: the raw head and tail of a running job
// (raw reports that the match's line is raw, to be admitted), or the
// admitted text of an ended one.
func (r *Registry) searchHeld(j *job, w *watch, to int64) (m Match, raw, ok bool) {
	// The held bytes, copied under the lock and matched outside it.
	j.mu.Lock()
	f := j.fin
	if f != nil && f.raw != nil {
		f = f.raw // a TTY job's raw stream, which its watches match
	}
	var head, tail []byte
	var tailAt int64
	if f == nil {
		b := j.out
		to = min(to, b.total)
		tailAt = b.total - int64(b.tailLen())
		head = b.appendRange(nil, 0, min(int64(len(b.head)), to))
		if tailAt > int64(len(b.head)) {
			if tailAt < to {
				tail = b.appendRange(nil, tailAt, to)
			}
		} else if int64(len(b.head)) < to {
			// Nothing dropped: one piece.
			head = b.appendRange(head, int64(len(b.head)), to)
		}
	}
	j.mu.Unlock()

	// The search has a watch of its own: the live one is the
	// supervisor's.
	var first *Match
	sw := &watch{re: w.re, from: w.from, last: -1, lits: w.lits}
	mt := matcher{prog: compile([]*watch{sw})}
	mt.hit = func(_ *watch, off int64, text []byte) {
		if first == nil {
			first = &Match{ID: j.id, Session: j.spec.Session, Offset: off, Line: string(text), At: r.now()}
		}
	}
	if f != nil {
		searchFinal(&mt, f)
		if first != nil {
			return *first, false, true
		}
		return Match{}, false, false
	}
	held := func(p []byte, base int64) {
		mt.feed(p, base, -1)
		if len(mt.carry) == maxLine && !mt.skip {
			// to is the start of a piece that the live matcher has
			// (see liveLocked): the one before it is complete.
			mt.testAll(mt.carry, mt.carryAt)
		}
	}
	held(head, 0)
	if first == nil && tail != nil {
		// The tail's first line began in the dropped middle.
		mt = matcher{prog: mt.prog, hit: mt.hit, skip: true}
		held(tail, tailAt)
	}
	if first != nil {
		return *first, true, true
	}
	return Match{}, false, false
}

// searchFinal feeds an ended job's admitted text to a matcher, where its
// offsets are known: a segment kept byte for byte as it is, a segment
// rewritten line for line one line at a time, at its raw line's offset.
// The head's last line, if the omission cut it, is not matched; nor is
// the tail's first, unless the tail begins at a line's start.
func searchFinal(mt *matcher, f *final) {
	for k, s := range f.segs {
		text := f.out.Text[s.lo:s.hi]
		last := k == len(f.segs)-1
		mt.carry, mt.cut, mt.carryAt = mt.carry[:0], false, s.start
		mt.skip = k > 0 && !f.tailLine
		switch {
		case int64(len(text)) == s.end-s.start && s.rawLines == nil:
			mt.feed([]byte(text), s.start, -1)
			if last {
				mt.flush()
			}
		default:
			adm := lineStarts(text)
			if s.rawLines == nil || len(adm) != len(s.rawLines) {
				continue // not mapped: no offsets to give
			}
			for i := 0; i <= len(adm); i++ {
				lo, hi := lineAt(adm, i), lineEnd(adm, i, int32(len(text)))
				line := []byte(text[lo:hi])
				complete := bytes.HasSuffix(line, []byte("\n"))
				if (i == 0 && mt.skip) || (!complete && !last) || len(line) == 0 {
					continue
				}
				mt.pieces(bytes.TrimSuffix(line, []byte("\n")), s.start+int64(lineAt(s.rawLines, i)))
			}
		}
	}
}
