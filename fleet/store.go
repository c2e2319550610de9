package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// store reads and writes the fleet's key-value buckets by compare-and-set
// on a key's last revision, retrying what NATS may answer while a server
// is down or a stream elects a leader.
type store struct {
	js      jetstream.JetStream
	l       Layout
	jobs    jetstream.KeyValue
	workers jetstream.KeyValue
	jobsSt  jetstream.Stream // the jobs bucket's stream, for direct gets
}

func openStore(ctx context.Context, js jetstream.JetStream, l Layout) (*store, error) {
	s := &store{js: js, l: l}
	err := retry(ctx, l, func(ctx context.Context) error {
		if err := provision(ctx, js, l); err != nil {
			return err
		}
		var err error
		if s.jobs, err = js.KeyValue(ctx, l.jobsBucket()); err != nil {
			return err
		}
		if s.workers, err = js.KeyValue(ctx, l.workersBucket()); err != nil {
			return err
		}
		s.jobsSt, err = js.Stream(ctx, "KV_"+l.jobsBucket())
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("bgjob/fleet: open: %w", err)
	}
	return s, nil
}

// errConflict: the key's revision moved since it was read.
var errConflict = errors.New("bgjob/fleet: record changed")

// transient reports whether an error may go away by itself: a timeout, a
// server or a leader missing for a moment. The server's refusals (a wrong
// last sequence, not found) and a closed connection are not.
func transient(err error) bool {
	switch {
	case err == nil, errors.Is(err, errConflict), errors.Is(err, nats.ErrConnectionClosed),
		errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrMsgNotFound),
		errors.Is(err, context.Canceled):
		return false
	}
	var api *jetstream.APIError
	if errors.As(err, &api) {
		// The cluster's "temporarily unavailable" answers are worth
		// another try; other refusals are final.
		return api.Code == 503 || api.Code == 408 || api.ErrorCode == jetstream.JSErrCodeJetStreamNotEnabled
	}
	return true
}

// retry calls f with a per-attempt timeout until it succeeds, fails for
// good, or ctx ends; between attempts it waits a growing backoff (a
// timer: the retry itself is the event that can bring success).
func retry(ctx context.Context, l Layout, f func(ctx context.Context) error) error {
	backoff := 20 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, l.RequestTimeout)
		err := f(actx)
		cancel()
		if !transient(err) || ctx.Err() != nil {
			if err == nil || ctx.Err() == nil || !transient(err) {
				return err
			}
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		}
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return fmt.Errorf("%w (last: %v)", ctx.Err(), err)
		}
		if backoff < time.Second {
			backoff *= 2
		}
	}
}

// get returns a job's record and its revision. found is false for a key
// never written, deleted or expired; rev is then the revision to write
// over (0, or the delete marker's).
func (s *store) get(ctx context.Context, key string) (rec record, rev uint64, found bool, err error) {
	err = retry(ctx, s.l, func(ctx context.Context) error {
		m, err := s.jobsSt.GetLastMsgForSubject(ctx, "$KV."+s.l.jobsBucket()+"."+key)
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			rev, found = 0, false
			return nil
		}
		if err != nil {
			return err
		}
		rev = m.Sequence
		if deletedMsg(m.Header) || len(m.Data) == 0 {
			found = false
			return nil
		}
		rec = record{}
		if err := json.Unmarshal(m.Data, &rec); err != nil {
			return fmt.Errorf("bgjob/fleet: record %s: %w", key, err)
		}
		found = true
		return nil
	})
	return rec, rev, found, err
}

// deletedMsg reports whether a key-value message is a delete, a purge or
// a marker left by an expiry.
func deletedMsg(h nats.Header) bool {
	return h.Get("KV-Operation") != "" || h.Get(jetstream.MarkerReasonHeader) != ""
}

// cas writes rec at key if the key's last revision is rev (0: the key
// has never been written). ttl > 0 makes the value expire then. It
// returns the new revision, or errConflict. A write whose answer was
// lost and that is then found in place (by its Write nonce) succeeded.
func (s *store) cas(ctx context.Context, key string, rec record, rev uint64, ttl time.Duration) (uint64, error) {
	rec.Write = nonce()
	data, err := json.Marshal(rec)
	if err != nil {
		return 0, err
	}
	subject := "$KV." + s.l.jobsBucket() + "." + key
	var newRev uint64
	tried := false
	err = retry(ctx, s.l, func(ctx context.Context) error {
		opts := []jetstream.PublishOpt{jetstream.WithExpectLastSequencePerSubject(rev)}
		if ttl > 0 {
			opts = append(opts, jetstream.WithMsgTTL(ttl))
		}
		ack, err := s.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Data: data}, opts...)
		if err == nil {
			newRev = ack.Sequence
			return nil
		}
		if wrongLastSeq(err) {
			if tried {
				// An earlier attempt may have been written, its answer
				// lost: then the record holds our nonce.
				if cur, r, ok, gerr := s.get(ctx, key); gerr == nil && ok && cur.Write == rec.Write {
					newRev = r
					return nil
				}
			}
			return errConflict
		}
		tried = true
		return err
	})
	return newRev, err
}

// remove deletes a job's record if its last revision is rev.
func (s *store) remove(ctx context.Context, key string, rev uint64) error {
	err := retry(ctx, s.l, func(ctx context.Context) error {
		err := s.jobs.Delete(ctx, key, jetstream.LastRevision(rev))
		if wrongLastSeq(err) {
			return errConflict
		}
		return err
	})
	return err
}

func wrongLastSeq(err error) bool {
	var api *jetstream.APIError
	return errors.As(err, &api) && (api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || api.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequenceConstant)
}

// list returns the records of the keys matching filter (a key pattern,
// such as "TOKEN.*"), read from one watcher's initial values.
func (s *store) list(ctx context.Context, filter string) (map[string]record, error) {
	out := map[string]record{}
	err := retry(ctx, s.l, func(ctx context.Context) error {
		clear(out)
		w, err := s.jobs.Watch(ctx, filter, jetstream.IgnoreDeletes())
		if err != nil {
			return err
		}
		defer w.Stop()
		for {
			select {
			case e, ok := <-w.Updates():
				if !ok {
					return errors.New("bgjob/fleet: list: watcher closed")
				}
				if e == nil {
					return nil
				}
				var rec record
				if json.Unmarshal(e.Value(), &rec) == nil {
					out[e.Key()] = rec
				}
			case <-ctx.Done():
				return ctx.Err()
			}
		}
	})
	return out, err
}

// alive reports whether the worker's heartbeat is in the workers bucket.
func (s *store) alive(ctx context.Context, worker string) (bool, error) {
	var ok bool
	err := retry(ctx, s.l, func(ctx context.Context) error {
		_, err := s.workers.Get(ctx, "hb."+worker)
		switch {
		case err == nil:
			ok = true
			return nil
		case errors.Is(err, jetstream.ErrKeyNotFound), errors.Is(err, jetstream.ErrKeyDeleted):
			ok = false
			return nil
		}
		return err
	})
	return ok, err
}
