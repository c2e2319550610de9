package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
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
}

// openFleet opens JetStream on nc and the fleet's store within ctx, for a
// new Client or Worker, and returns the logger it is to use: logger, or
// one that discards if that is nil.
func openFleet(ctx context.Context, nc *nats.Conn, l Layout, logger *slog.Logger) (jetstream.JetStream, *store, *slog.Logger, error) {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, nil, nil, fmt.Errorf("bgjob/fleet: %w", err)
	}
	s, err := openStore(ctx, js, l)
	if err != nil {
		return nil, nil, nil, err
	}
	return js, s, logger, nil
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
		s.workers, err = js.KeyValue(ctx, l.workersBucket())
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
// over (0, or the delete marker's). It reads from the bucket's leader
// (see lastMsg), so a record just written is always seen.
func (s *store) get(ctx context.Context, key string) (rec record, rev uint64, found bool, err error) {
	err = retry(ctx, s.l, func(ctx context.Context) error {
		m, err := s.lastMsg(ctx, "KV_"+s.l.jobsBucket(), "$KV."+s.l.jobsBucket()+"."+key)
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

// lastMsg returns the last message of stream whose subject matches
// subject (which may hold wildcards), asking the stream's leader
// (STREAM.MSG.GET). A direct get, which the KV API and Stream.GetMsg use
// when a stream allows it, may be answered by a replica that has not yet
// applied the latest writes: a worker that read a launch's record there
// could find it missing and drop the launch, and a reaper could find a
// live worker's new heartbeat missing and report its jobs lost (both
// seen under load with three replicas). Every read that decides
// something goes to the leader.
func (s *store) lastMsg(ctx context.Context, stream, subject string) (*jetstream.RawStreamMsg, error) {
	req, _ := json.Marshal(struct {
		LastFor string `json:"last_by_subj"`
	}{subject})
	m, err := s.js.Conn().RequestWithContext(ctx, "$JS.API.STREAM.MSG.GET."+stream, req)
	if err != nil {
		return nil, err
	}
	var resp struct {
		Message *struct {
			Subject  string    `json:"subject"`
			Sequence uint64    `json:"seq"`
			Header   []byte    `json:"hdrs"`
			Data     []byte    `json:"data"`
			Time     time.Time `json:"time"`
		} `json:"message"`
		Error *jetstream.APIError `json:"error"`
	}
	if err := json.Unmarshal(m.Data, &resp); err != nil {
		return nil, fmt.Errorf("bgjob/fleet: get from %s: %w", stream, err)
	}
	if resp.Error != nil {
		if resp.Error.ErrorCode == jetstream.JSErrCodeMessageNotFound || resp.Error.Code == 404 {
			return nil, jetstream.ErrMsgNotFound
		}
		return nil, resp.Error
	}
	if resp.Message == nil {
		return nil, fmt.Errorf("bgjob/fleet: get from %s: empty answer", stream)
	}
	out := &jetstream.RawStreamMsg{Subject: resp.Message.Subject, Sequence: resp.Message.Sequence, Data: resp.Message.Data, Time: resp.Message.Time}
	if len(resp.Message.Header) > 0 {
		if out.Header, err = nats.DecodeHeadersMsg(resp.Message.Header); err != nil {
			return nil, fmt.Errorf("bgjob/fleet: get from %s: %w", stream, err)
		}
	}
	return out, nil
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

// alive reports whether the worker's heartbeat is in the workers bucket,
// as its leader has it (see lastMsg).
func (s *store) alive(ctx context.Context, worker string) (bool, error) {
	var ok bool
	err := retry(ctx, s.l, func(ctx context.Context) error {
		m, err := s.lastMsg(ctx, "KV_"+s.l.workersBucket(), "$KV."+s.l.workersBucket()+".hb."+worker)
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			ok = false
			return nil
		case err != nil:
			return err
		}
		ok = !deletedMsg(m.Header) && len(m.Data) > 0
		return nil
	})
	return ok, err
}
