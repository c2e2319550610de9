package fleet

import (
	"context"
	"encoding/json"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/bgjob/bgjob"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// Matches of watches travel like completions: the worker whose Registry
// found a match publishes it to the session's work queue (P.match.SESSION),
// and a client takes it, once in the whole fleet.

// maxQueuedMatches bounds a session's undelivered matches in the fleet
// (the match stream's MaxMsgsPerSubject): past it, the oldest go.
const maxQueuedMatches = 16384

// relayBacklog bounds the matches a worker holds between its Registry's
// OnMatch and their publication: past it, a match is dropped and counted
// in the Dropped of the session's next match, so that a slow or
// unreachable NATS never blocks the Registry's delivery (and, through
// it, the jobs' output).
const relayBacklog = 1024

// matchLinger is how long a worker still carries the matches of a run
// after its end: a Registry may deliver a match after the job's end.
const matchLinger = time.Minute

// MatchFeed carries the matches of a worker Registry's watches to the
// fleet. The Registry is made before the worker that serves it, so its
// Config.OnMatch cannot name the worker; it names the feed instead, and
// the worker is given the same feed:
//
//	feed := new(fleet.MatchFeed)
//	reg, _ := bgjob.New(bgjob.Config{OnMatch: feed.OnMatch})
//	w, _ := fleet.NewWorker(nc, reg, fleet.WorkerConfig{Matches: feed})
//
// While the worker lives, each match of a job it runs (its Spec.Watches,
// or a Watch through the fleet) is published to the session's match
// queue, where [Client.Matches] and [Client.NextMatch] take it, once in
// the whole fleet, with the job's fleet ID. The match's Line is the one
// the worker's Registry admitted; no raw text leaves the worker. Matches
// of jobs the worker does not run (the host's own) are left to the
// Registry's Matches queue. A host that wants the matches itself too
// calls f.OnMatch from a hook of its own.
//
// A feed serves one worker at a time: NewWorker fails with a feed that
// another live worker holds; Close and Detach let go of it. Before and
// after, OnMatch does nothing. OnMatch never blocks: a worker that
// cannot publish as fast as matches come drops them past a backlog of
// 1,024, counting them in the Dropped of the session's next match.
type MatchFeed struct {
	w atomic.Pointer[Worker]
}

// OnMatch hands m to the feed's worker, if any; it is the Registry's
// Config.OnMatch (or is called from it). It never blocks.
func (f *MatchFeed) OnMatch(m bgjob.Match) {
	if w := f.w.Load(); w != nil {
		w.matched(m)
	}
}

// matched queues a match for the relay, or counts it dropped.
func (w *Worker) matched(m bgjob.Match) {
	select {
	case w.matchCh <- m:
	default:
		w.dropMu.Lock()
		w.dropped[m.Session]++
		w.dropMu.Unlock()
	}
}

// relay publishes the matches of the runs this worker serves, in the
// order they came (so a job's matches stay in the order of its lines).
// A match whose run is not known yet (found while Registry.Start had not
// returned its ID) waits until a start finishes; one that no run claims
// once no start is under way is the host's, and left. The relay ends
// when the worker's ctx does, after one last publication of what it
// holds, bounded by two RequestTimeouts.
func (w *Worker) relay() {
	defer w.wg.Done()
	var pending []bgjob.Match
	for {
		final := false
		select {
		case m := <-w.matchCh:
			pending = append(pending, m)
		case <-w.poke:
		case <-w.ctx.Done():
			final = true
		}
		// Take whatever else waits, so one lookup serves a batch.
	more:
		for len(pending) < relayBacklog {
			select {
			case m := <-w.matchCh:
				pending = append(pending, m)
			default:
				break more
			}
		}
		pending = w.publishMatches(pending, final)
		if final {
			return
		}
	}
}

// publishMatches publishes the pending matches whose run is known, and
// returns those still waiting for a start to finish (none if final).
func (w *Worker) publishMatches(pending []bgjob.Match, final bool) []bgjob.Match {
	type out struct {
		sv *served
		m  bgjob.Match
	}
	var send []out
	keep := pending[:0]
	w.mu.Lock()
	for _, m := range pending {
		if sv := w.byLocal[m.ID]; sv != nil {
			send = append(send, out{sv, m})
		} else if w.starting > 0 && !final {
			keep = append(keep, m)
		}
	}
	w.mu.Unlock()
	ctx := w.ctx
	if final {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(context.Background(), 2*w.cfg.RequestTimeout)
		defer cancel()
	}
	sessions := map[string]bool{}
	for i, o := range send {
		if !final && ctx.Err() != nil {
			// The worker is closing: the last pass publishes the rest.
			for _, o := range send[i:] {
				keep = append(keep, o.m)
			}
			break
		}
		m := o.m
		m.ID = o.sv.id
		// Dropped counts this worker's drops; the Registry's own
		// (its Matches queue full) reached OnMatch, so the fleet has them.
		w.dropMu.Lock()
		m.Dropped = w.dropped[m.Session]
		delete(w.dropped, m.Session)
		w.dropMu.Unlock()
		data, _ := json.Marshal(m)
		// One ID per match: a retry, or the same match given again by a
		// durable Registry's replay, is queued once.
		msgID := string(o.sv.id) + "." + o.sv.run + "." + strconv.FormatInt(m.Offset, 10) + "." + m.Watch
		err := retry(ctx, w.cfg.Layout, func(ctx context.Context) error {
			_, err := w.js.PublishMsg(ctx, &nats.Msg{Subject: w.cfg.matchSubject(o.sv.token), Data: data}, jetstream.WithMsgID(msgID))
			return err
		})
		if err != nil && !final && ctx.Err() != nil {
			keep = append(keep, o.m) // for the last pass
			continue
		}
		if err != nil {
			if ctx.Err() == nil || final {
				w.log.Warn("bgjob/fleet: publish match", "id", o.sv.id, "err", err)
			}
			continue
		}
		sessions[m.Session] = true
	}
	// The Registry queued them too (before OnMatch): the fleet has
	// them now, so its queue is emptied, as the completions' are.
	for session := range sessions {
		w.reg.Matches(session)
	}
	return keep
}

// startingRun counts a launch entering Registry.Start, whose matches may
// come before its ID is known.
func (w *Worker) startingRun() {
	w.mu.Lock()
	w.starting++
	w.mu.Unlock()
}

// startedRun records the Registry ID of a run that Start returned (local
// "" if it did not start), and wakes the relay for the matches that
// waited for it.
func (w *Worker) startedRun(sv *served, local bgjob.ID) {
	w.mu.Lock()
	w.starting--
	if local != "" {
		w.byLocal[local] = sv
	}
	w.mu.Unlock()
	select {
	case w.poke <- struct{}{}:
	default:
	}
}

// endedLocked notes the end of a run's service: its matches are carried
// for matchLinger more, then forgotten, oldest first. w.mu is held.
func (w *Worker) endedLocked(sv *served) {
	now := time.Now()
	if local, _ := sv.local.Load().(bgjob.ID); local != "" && w.byLocal[local] == sv {
		w.lingering = append(w.lingering, lingering{local, sv, now.Add(matchLinger)})
	}
	i := 0
	for ; i < len(w.lingering) && now.After(w.lingering[i].until); i++ {
		if l := w.lingering[i]; w.byLocal[l.local] == l.sv {
			delete(w.byLocal, l.local)
		}
	}
	w.lingering = w.lingering[i:]
}

// lingering is a run whose service ended, still carrying late matches.
type lingering struct {
	local bgjob.ID
	sv    *served
	until time.Time
}

// Matches returns the session's queued matches of watches (Spec.Watches,
// Watch), oldest first, and takes them from the fleet's queue: each is
// delivered once, to one caller of Matches or NextMatch in the whole
// fleet. A match's ID is the job's fleet ID and its Line the text the
// worker's Registry admitted. Only workers given a [MatchFeed] carry
// matches. The matches of one job come in the order of its lines; a match
// may come after its job's completion. The fleet keeps at most 16,384 of
// a session's undelivered matches (the oldest go), and a match whose
// worker could not keep up says how many before it were dropped. On
// transport trouble Matches returns what it took, and Err says why.
func (c *Client) Matches(session string) []bgjob.Match {
	return drain[bgjob.Match](c, matchQueue, session)
}

// NextMatch blocks until a match of the session is queued in the fleet,
// takes it and returns it, as NextCompletion does for completions; ctx
// bounds the wait. After Close it returns ErrClosed. It is not part of
// bgjob.Jobs (the Registry has Config.OnMatch instead): a host that
// serves both finds it with a type assertion.
func (c *Client) NextMatch(ctx context.Context, session string) (bgjob.Match, error) {
	return next[bgjob.Match](c, ctx, matchQueue, session)
}
