package fleet

import (
	"context"
	"errors"
	"io"
	"time"

	"github.com/bgjob/bgjob"
)

// defaultSoftCap is Foreground.SoftCap's zero value, as locally.
const defaultSoftCap = 30 * time.Second

// RunForeground launches spec (or joins the identical job in the fleet)
// and waits for it inline, as [bgjob.Registry.RunForeground]: woken by
// the job's record when the job ends (no polling), it returns the final
// snapshot if the job ends within fg.SoftCap; at the soft cap, or when
// ctx is done, it returns the running job's snapshot with Detached set,
// and the job becomes pollable and yields a Completion. OnProgress is
// called about every Interval (or 5s) with the job's live snapshot
// (Status). A job only RunForeground callers held that ended inline
// yields no Completion, and its record is removed once the caller who
// launched it has its result.
//
// ctx bounds the inline wait and the launch; errors are as for Start.
func (c *Client) RunForeground(ctx context.Context, spec bgjob.Spec, fg bgjob.Foreground) (bgjob.Result, error) {
	begin := time.Now()
	snap, run, err := c.start(ctx, "run", spec, true)
	if err != nil {
		return bgjob.Result{}, err
	}
	joined := snap.Joined
	key := recordKey(SessionToken(snap.Session), string(snap.ID))
	softCap := fg.SoftCap
	if softCap <= 0 {
		softCap = defaultSoftCap
	}
	every := fg.Interval
	if every <= 0 {
		every = 5 * time.Second
	}
	wctx, cancel := context.WithDeadline(ctx, begin.Add(softCap))
	defer cancel()
	ended := func(r record) bool { return r.Phase == phaseEnded }
	for {
		var progress <-chan time.Time
		var t *time.Timer
		if fg.OnProgress != nil {
			t = time.NewTimer(every)
			progress = t.C
		}
		pctx, pcancel := context.WithCancel(wctx)
		type outcome struct {
			rec record
			rev uint64
			err error
		}
		got := make(chan outcome, 1)
		go func() { // ends with pctx, which this loop cancels
			rec, rev, err := c.await(pctx, key, run, ended)
			got <- outcome{rec, rev, err}
		}()
		select {
		case o := <-got:
			pcancel()
			if t != nil {
				t.Stop()
			}
			if o.err == nil {
				return c.collect(key, o.rec, o.rev, joined), nil
			}
			if errors.Is(o.err, bgjob.ErrNotFound) {
				// Replaced, or removed by the caller who launched it
				// after it ended inline: it has ended.
				s := snap
				s.Joined = joined
				return bgjob.Result{Snapshot: s}, nil
			}
			return c.detach(key, run, joined, snap)
		case <-progress:
			pcancel()
			<-got
			if s, err := c.Status(snap.ID); err == nil {
				if s.State.Done() {
					continue // the record tells the end next round
				}
				fg.OnProgress(s)
			}
		}
	}
}

// collect returns the result of a job that ended inline. A job nobody
// made pollable has its record removed by the caller that launched it,
// as a local job is forgotten once its foreground caller has its result.
func (c *Client) collect(key string, rec record, rev uint64, joined bool) bgjob.Result {
	if !rec.Pollable && !joined {
		ctx, cancel := c.opCtx()
		c.s.remove(ctx, key, rev)
		cancel()
	}
	s := rec.Snap
	s.Joined = joined
	return bgjob.Result{Snapshot: s}
}

// detach makes the job pollable (a compare-and-set: if it ended
// meanwhile, the caller gets the end inline instead) and returns it
// running.
func (c *Client) detach(key, run string, joined bool, snap bgjob.Snapshot) (bgjob.Result, error) {
	ctx, cancel := c.opCtx()
	defer cancel()
	for {
		rec, rev, found, err := c.s.get(ctx, key)
		if err != nil || !found || rec.Run != run {
			s := snap
			s.Joined = joined
			return bgjob.Result{Snapshot: s, Detached: true}, nil
		}
		if rec.Phase == phaseEnded {
			return c.collect(key, rec, rev, joined), nil
		}
		if !rec.Pollable {
			rec.Pollable = true
			if _, err := c.s.cas(ctx, key, rec, rev, 0); errors.Is(err, errConflict) {
				continue
			}
		}
		s := rec.Snap
		if live, err := c.Status(rec.Snap.ID); err == nil && !live.State.Done() {
			s = live
		}
		s.Joined = joined
		return bgjob.Result{Snapshot: s, Detached: true}, nil
	}
}

// Follow returns a reader of the job's admitted output from offset on, to
// its end, as [bgjob.Registry.Follow], over ReadWait: each Read blocks
// until there is output, the job ends (io.EOF) or ctx is done.
func (c *Client) Follow(ctx context.Context, id bgjob.ID, offset int64) io.Reader {
	return &follower{c: c, ctx: ctx, id: id, next: offset}
}

// follower is the reader Follow returns.
type follower struct {
	c    *Client
	ctx  context.Context
	id   bgjob.ID
	next int64
	buf  string
	err  error
}

// followMin is the least a follower asks for, whatever the caller's
// buffer: what does not fit waits in buf.
const followMin = 32 << 10

func (f *follower) Read(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	for f.buf == "" {
		if f.err != nil {
			return 0, f.err
		}
		ch, err := f.c.ReadWait(f.ctx, f.id, f.next, max(len(p), followMin))
		if err != nil {
			f.err = err
			return 0, err
		}
		f.buf, f.next = ch.Data, ch.Next
		if ch.Done && f.buf == "" {
			f.err = io.EOF
		} else if ch.Done {
			f.err = io.EOF // after buf is read
		}
	}
	n := copy(p, f.buf)
	f.buf = f.buf[n:]
	return n, nil
}
