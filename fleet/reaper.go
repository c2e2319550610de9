package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/bgjob/bgjob"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// reasonLost is the Reason of a job whose worker was lost.
const reasonLost = "worker lost"

// complete publishes the completion of an ended, pollable run. Its
// message ID is the run's, so that two publishers of the same end (a
// worker and a reaper, or a retry) queue it once.
func (s *store) complete(ctx context.Context, rec record) error {
	c := bgjob.Completion{
		ID: rec.Snap.ID, Session: rec.Snap.Session, Command: rec.Snap.Command,
		State: rec.Snap.State, ExitCode: rec.Snap.ExitCode, Ended: rec.Snap.Ended,
	}
	data, err := json.Marshal(c)
	if err != nil {
		return err
	}
	subject := s.l.doneSubject(SessionToken(c.Session))
	return retry(ctx, s.l, func(ctx context.Context) error {
		_, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}, jetstream.WithMsgID(string(c.ID)+"."+rec.Run))
		return err
	})
}

// lose records that the worker of the run at key is gone: a run it had
// started (or claimed, without Rerun) ends Failed with Reason "worker
// lost" and, if pollable, queues its completion; a claimed run with
// Rerun goes back to the queue, where its launch message comes back to
// another worker when its ack wait ends. The write is a compare-and-set,
// so when several reapers see the same loss, one of them records it.
// The caller has checked that rec.Worker's heartbeat is gone.
func (s *store) lose(ctx context.Context, key string, rec record, rev uint64) (record, error) {
	worker, run := rec.Worker, rec.Run
	for {
		if rec.Run != run || rec.Worker != worker || (rec.Phase != phaseClaimed && rec.Phase != phaseRunning) {
			return rec, nil // someone else moved it
		}
		next := rec
		var ttl time.Duration
		if rec.Phase == phaseClaimed && rec.Rerun {
			next.Phase, next.Worker, next.Snap.Reason = phaseQueued, "", "queued again: "+reasonLost
		} else {
			next.Phase = phaseEnded
			next.Snap.State, next.Snap.ExitCode, next.Snap.Reason = bgjob.Failed, -1, reasonLost
			next.Snap.Ended = time.Now()
			ttl = s.l.Retention
		}
		_, err := s.cas(ctx, key, next, rev, ttl)
		if errors.Is(err, errConflict) {
			var found bool
			if rec, rev, found, err = s.get(ctx, key); err != nil || !found {
				return rec, err
			}
			continue
		}
		if err != nil {
			return rec, err
		}
		if next.Phase == phaseEnded && next.Pollable {
			err = s.complete(ctx, next)
		}
		return next, err
	}
}

// reaper watches the heartbeats of a fleet's workers and records the
// loss of each worker whose heartbeat expires or is deleted without its
// jobs having ended. Every worker and client runs one; what they write
// is decided by compare-and-set, so the work is done once.
type reaper struct {
	s    *store
	log  *slog.Logger
	stop context.CancelFunc
	wg   sync.WaitGroup
}

// startReaper starts the reaper's goroutine, which Close ends.
func startReaper(s *store, log *slog.Logger) *reaper {
	ctx, cancel := context.WithCancel(context.Background())
	r := &reaper{s: s, log: log, stop: cancel}
	r.wg.Add(1)
	go func() { // ends when Close cancels ctx
		defer r.wg.Done()
		r.run(ctx)
	}()
	return r
}

func (r *reaper) close() {
	r.stop()
	r.wg.Wait()
}

// run watches hb.* until ctx ends; after the watcher's initial values
// (the workers alive now) it sweeps the records once for runs of workers
// that are gone, then reaps on every heartbeat that goes.
func (r *reaper) run(ctx context.Context) {
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		err := r.watch(ctx)
		if ctx.Err() != nil {
			return
		}
		r.log.Warn("bgjob/fleet: reaper: watch", "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
		if backoff < 5*time.Second {
			backoff *= 2
		}
	}
}

func (r *reaper) watch(ctx context.Context) error {
	w, err := r.s.workers.Watch(ctx, "hb.*")
	if err != nil {
		return err
	}
	defer w.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case e, ok := <-w.Updates():
			if !ok {
				return errors.New("watcher closed")
			}
			switch {
			case e == nil:
				r.sweep(ctx, "")
			case e.Operation() != jetstream.KeyValuePut:
				r.sweep(ctx, strings.TrimPrefix(e.Key(), "hb."))
			}
		}
	}
}

// sweep reaps the unfinished runs of worker, or with worker "", of
// every worker whose heartbeat is gone.
func (r *reaper) sweep(parent context.Context, worker string) {
	ctx, cancel := context.WithTimeout(parent, 10*r.s.l.RequestTimeout)
	defer cancel()
	recs, err := r.s.list(ctx, "*.*")
	if err != nil {
		if parent.Err() == nil { // not the reaper's close
			r.log.Warn("bgjob/fleet: reaper: list", "err", err)
		}
		return
	}
	dead := map[string]bool{}
	for key, rec := range recs {
		if rec.Worker == "" || (rec.Phase != phaseClaimed && rec.Phase != phaseRunning) || (worker != "" && rec.Worker != worker) {
			continue
		}
		gone, seen := dead[rec.Worker]
		if !seen {
			alive, err := r.s.alive(ctx, rec.Worker)
			if err != nil {
				r.log.Warn("bgjob/fleet: reaper: heartbeat", "worker", rec.Worker, "err", err)
				continue
			}
			gone = !alive
			dead[rec.Worker] = gone
		}
		if !gone {
			continue
		}
		cur, rev, found, err := r.s.get(ctx, key)
		if err != nil || !found {
			continue
		}
		if _, err := r.s.lose(ctx, key, cur, rev); err != nil {
			r.log.Warn("bgjob/fleet: reaper: record loss", "key", key, "err", err)
		}
	}
}
