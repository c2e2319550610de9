package bgjob

import (
	"sync"
	"sync/atomic"
)

// Delivery of watches' matches. A job's supervisor finds them (watch.go)
// and must not wait for the Admitter or OnMatch, so it hands them to the
// delivery goroutine, which admits each line, records the matches
// (durable mode), queues them for their session and calls OnMatch, in
// the order they were found. The goroutine runs while there is work and
// ends when there is none; at most one runs per registry, counted in
// Registry.wg like a job's. It is the one place matches wait in memory
// before they are queued, so it is bounded per job (maxBacklog): a job's
// matcher stops at a line's end once its job has that many waiting,
// keeps the rest of the chunk (its lag), and its supervisor reads no
// more output until there is room (supervise.go, matchRoom).

// maxBacklog bounds the matches of one job that wait for the delivery
// goroutine.
const maxBacklog = 1024

// maxQueuedMatches bounds a session's queue of undelivered matches; a
// match that finds it full is not queued (Match.Dropped counts it).
const maxQueuedMatches = 1024

// found is a match on its way to its queue: its Line is raw until the
// delivery goroutine admits it.
type found struct {
	j   *job
	m   Match
	seq uint64 // the job's count of matches delivered so far, this one included
}

// queuedMatch is a match in its session's queue.
type queuedMatch struct {
	m   Match
	j   *job
	seq uint64
}

// feed is the registry's matches on their way to the delivery goroutine.
type feed struct {
	mu    sync.Mutex
	items []found
	// marks holds the jobs whose scan mark the journal should record
	// (durable mode) though they have no match in items.
	marks   map[*job]bool
	running bool // a delivery goroutine runs (or was started)
}

// deliver hands the matches a job's watcher found to the delivery
// goroutine, and, in durable mode, how far the matcher got (mark.at < 0:
// not known). Matches are handed on in the order they were found; mark
// covers them all.
func (r *Registry) deliver(j *job, fs []found, mark scanMark) {
	track := r.jn.tracksMatches() && mark.at >= 0
	if len(fs) == 0 && !track {
		return
	}
	f := &r.feed
	f.mu.Lock()
	defer f.mu.Unlock()
	work := len(fs) > 0
	if len(fs) > 0 {
		f.items = append(f.items, fs...)
		j.ws.backlog += len(fs)
	}
	if track {
		j.ws.mark = mark
		if mark.at-j.ws.marked >= r.markStep() {
			if f.marks == nil {
				f.marks = map[*job]bool{}
			}
			f.marks[j] = true
			work = true
		}
	}
	if work && !f.running {
		f.running = true
		r.wg.Add(1) // the delivery goroutine
		go r.deliverAll()
	}
}

// markStep is how far a job's matcher must get before its progress is
// recorded on its own (with a match it always is): a quarter of the
// output file's bound on disk, which it holds back (watchState.hold).
func (r *Registry) markStep() int64 { return r.cfg.MaxOutputBytes / 4 }

// room returns how many more matches j may hand to the delivery
// goroutine now, and when it may hand none, a channel that is closed
// once it may.
func (r *Registry) room(j *job) (int, <-chan struct{}) {
	f := &r.feed
	f.mu.Lock()
	defer f.mu.Unlock()
	if n := maxBacklog - j.ws.backlog; n > 0 {
		return n, nil
	}
	if j.ws.room == nil {
		j.ws.room = make(chan struct{})
	}
	return 0, j.ws.room
}

// deliverAll is the delivery goroutine: it delivers what the feed holds
// until it is empty, then ends.
func (r *Registry) deliverAll() {
	var counted atomic.Bool
	counted.Store(true)
	release := func() {
		if counted.CompareAndSwap(true, false) {
			r.wg.Done()
		}
	}
	defer release()
	f := &r.feed
	for {
		f.mu.Lock()
		items, marked := f.items, f.marks
		f.items, f.marks = nil, nil
		if len(items) == 0 && len(marked) == 0 {
			f.running = false
			f.mu.Unlock()
			return
		}
		// The jobs of this batch, in the order of their first match,
		// with the marks that cover their matches.
		var jobs []*job
		marks := map[*job]scanMark{}
		for _, it := range items {
			if _, ok := marks[it.j]; !ok {
				jobs = append(jobs, it.j)
				marks[it.j] = scanMark{at: -1}
			}
		}
		for j := range marked {
			if _, ok := marks[j]; !ok {
				jobs = append(jobs, j)
			}
			marks[j] = scanMark{at: -1}
		}
		if r.jn.tracksMatches() {
			for _, j := range jobs {
				marks[j] = j.ws.mark
				j.ws.marked = j.ws.mark.at
			}
		}
		f.mu.Unlock()

		r.deliverBatch(items, jobs, marks, release)

		f.mu.Lock()
		for _, it := range items {
			it.j.ws.backlog--
		}
		for _, j := range jobs {
			if j.ws.room != nil && j.ws.backlog < maxBacklog {
				close(j.ws.room)
				j.ws.room = nil
			}
		}
		f.mu.Unlock()
	}
}

// deliverBatch admits, records, queues and passes to OnMatch a batch of
// matches; jobs are the batch's jobs, marks how far each one's matcher
// got. The Admitter and OnMatch run as hooks (hooks.go), release letting
// go of the goroutine's count for a Close or Detach made from one.
func (r *Registry) deliverBatch(items []found, jobs []*job, marks map[*job]scanMark, release func()) {
	if r.cfg.Admitter != nil {
		r.hooks.delivering(release, func() {
			for i := range items {
				r.admitMatch(items[i].j, &items[i].m)
			}
		})
	}
	byJob := map[*job][]found{}
	for _, it := range items {
		byJob[it.j] = append(byJob[it.j], it)
	}
	for _, j := range jobs {
		its := byJob[j]
		// The record holds the job from before its matches are queued
		// until they are written, so that a delivery of them, which
		// the queue makes possible, is recorded after them.
		record := r.jn.matching(j)
		queued := make([]bool, len(its))
		r.mu.Lock()
		for i, it := range its {
			its[i].m, queued[i] = r.queueMatchLocked(queuedMatch{m: it.m, j: j, seq: it.seq})
		}
		r.mu.Unlock()
		record(its, queued, marks[j])
	}
	on := r.cfg.OnMatch
	if on == nil || len(items) == 0 {
		return
	}
	r.hooks.delivering(release, func() {
		for _, it := range items {
			on(it.m)
		}
	})
	for _, j := range jobs {
		if its := byJob[j]; len(its) > 0 {
			r.jn.matchesDelivered(j, its[len(its)-1].seq)
		}
	}
}

// matchQueue is a session's queue of undelivered matches, and the count
// of those it had no room for since the last one queued.
type matchQueue struct {
	q       []queuedMatch
	dropped int64
}

// queueMatchLocked queues a match for its session, unless the queue is
// full. It returns the match as queued (with its Dropped count), and
// whether it queued it. r.mu must be held.
func (r *Registry) queueMatchLocked(e queuedMatch) (Match, bool) {
	s := e.m.Session
	mq := r.matchQueues[s]
	if mq == nil {
		mq = &matchQueue{}
		r.matchQueues[s] = mq
	}
	if len(mq.q) >= maxQueuedMatches {
		mq.dropped++
		return e.m, false
	}
	e.m.Dropped, mq.dropped = mq.dropped, 0
	mq.q = append(mq.q, e)
	return e.m, true
}

// Matches returns the session's queued matches, oldest first, and empties
// the queue: each match is delivered once, even to concurrent callers.
// The matches of one job are in the order of their lines; those of
// different jobs in the order they were found, about. A match may come
// after its job's completion.
//
// A queue holds at most 1024 matches: a match that finds it full is not
// queued (it still reaches Config.OnMatch), and the next match queued
// counts it in Dropped. A host that learns of matches through OnMatch
// alone should drain the queue there, as with Completions.
//
// In durable mode each match returned is recorded as delivered, so no
// later Registry on the same StateDir returns it again.
func (r *Registry) Matches(session string) []Match {
	r.mu.Lock()
	mq := r.matchQueues[session]
	var q []queuedMatch
	if mq != nil {
		q = mq.q
		mq.q = nil
		if mq.dropped == 0 {
			delete(r.matchQueues, session)
		}
	}
	r.mu.Unlock()
	if len(q) == 0 {
		return nil
	}
	out := make([]Match, len(q))
	last := map[*job]uint64{}
	for i, e := range q {
		out[i] = e.m
		last[e.j] = max(last[e.j], e.seq)
	}
	for j, seq := range last {
		r.jn.matchesDelivered(j, seq)
	}
	return out
}
