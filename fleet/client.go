package fleet

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bgjob/bgjob"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// ClientConfig configures a [Client]. The zero value is usable.
type ClientConfig struct {
	Layout

	// IDKey keys the hash that makes job IDs; every client of a fleet
	// must have the same one, since identical launches join one job
	// only when their IDs are equal. If IDKey is nil, the fleet's shared
	// key is used: the first client makes 32 random bytes and stores
	// them in the workers bucket (config.idkey), and the others read
	// them, so whoever may read that bucket can guess IDs. A non-nil
	// IDKey must be at least 16 bytes long.
	IDKey []byte

	// Scoped limits the client to the session Session: Start and
	// RunForeground fill Spec.Session in (and refuse another session's
	// Spec, with ErrInvalidSpec), every lookup by ID answers ErrNotFound
	// for another session's job, and List, Completions and
	// NextCompletion of another session return nothing. A scoped client
	// uses only its session's subjects (see the package doc), so it can
	// run under a NATS user allowed just those.
	Scoped  bool
	Session string

	// StartTimeout bounds how long Start and RunForeground wait for a
	// worker to take a launch when ctx has no earlier deadline. A launch
	// no worker took by then is withdrawn and the call fails with
	// ErrNoWorker. If StartTimeout is 0, it is 1 minute.
	StartTimeout time.Duration

	// Rerun lets the fleet run a launch again when the worker that took
	// it is lost before it recorded the job started: the launch goes
	// back to the queue and another worker takes it once the work
	// queue's AckWait has passed. Such a job may have been started by
	// the lost worker just before it died (the start and its record are
	// not one step), so a job that must never run twice should not set
	// it. If Rerun is false, such a job ends Failed, "worker lost".
	Rerun bool

	// Logger, if not nil, receives the client's warnings. If Logger is
	// nil, they are discarded.
	Logger *slog.Logger
}

// ErrNoWorker: no worker took a launch within ClientConfig.StartTimeout
// (or before the ctx of Start or RunForeground ended); the launch was
// withdrawn. Returned by Start and RunForeground.
var ErrNoWorker = errors.New("bgjob/fleet: no worker took the launch")

// ErrUnavailable: NATS did not answer (a server down, no JetStream
// leader, the connection closed) within the Layout's timeouts. Returned
// by Start and RunForeground, and by Err for the methods that return no
// error.
var ErrUnavailable = errors.New("bgjob/fleet: NATS unavailable")

// Client runs jobs on a fleet of [Worker]s with the method set of a
// local [bgjob.Registry] (it satisfies [bgjob.Jobs]), so that a host
// switches between them by construction only.
//
// The methods mean what the Registry's do, with these differences, each
// a consequence of the network between the client and the job:
//
//   - Start returns once a worker has started the job, or the call has
//     joined one that is queued or running anywhere in the fleet. A
//     launch waits in its pool's work queue while every worker is busy
//     (there is no ErrTooManyRunning); one that no worker takes within
//     StartTimeout or ctx fails with ErrNoWorker and is withdrawn.
//   - A job that is queued, or claimed by a worker that has not yet
//     started it, is Queued (PID 0, Reason "queued in the fleet"); a
//     queued launch has no QueuePosition in the fleet.
//   - IDs come from the fleet's shared key over the Spec as the client
//     gave it (Dir unresolved), not from the worker's Registry.
//   - Status and Read of a running job ask its worker; of an ended job
//     they read the job's record and its published output. List gives
//     running jobs as their workers recorded them at their start (Status
//     gives the live text).
//   - A job whose worker dies ends Failed with Reason "worker lost",
//     once, however many clients and workers notice; its output up to
//     the last chunk the worker published stays readable.
//   - Completions and NextCompletion take from a work queue per
//     session: each completion goes to one caller in the whole fleet. A
//     client that dies between taking a completion and its
//     acknowledgement leaves it to be delivered again after 30s.
//   - List and Completions cannot return an error: on transport
//     trouble they return what they could read, and Err reports it.
//     Status of a running job whose worker does not answer returns the
//     job's record with the trouble in Reason.
//
// A Client is safe for concurrent use.
type Client struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	s    *store
	cfg  ClientConfig
	log  *slog.Logger
	key  *[32]byte
	rp   *reaper
	sub  *nats.Subscription
	inbx string

	lastErr atomic.Pointer[errBox]

	// mu guards the fields below.
	mu      sync.Mutex
	waiting map[string]chan reply         // start replies by token
	done    map[string]jetstream.Consumer // completion and match consumers by name
	closed  bool
	quit    chan struct{} // closed by Close
}

type errBox struct{ err error }

// NewClient connects a client to the fleet over nc: it makes the fleet's
// streams and buckets if they are missing and reads (or makes) the
// shared ID key. The client does not own nc; close it with
// [Client.Close] before nc.
func NewClient(nc *nats.Conn, cfg ClientConfig) (*Client, error) {
	l, err := cfg.Layout.normalize()
	if err != nil {
		return nil, err
	}
	cfg.Layout = l
	if cfg.IDKey != nil && len(cfg.IDKey) < 16 {
		return nil, fmt.Errorf("bgjob/fleet: ClientConfig.IDKey: %d bytes, want at least 16: %w", len(cfg.IDKey), errInvalidConfig)
	}
	if cfg.StartTimeout <= 0 {
		cfg.StartTimeout = time.Minute
	}
	setup, cancel := context.WithTimeout(context.Background(), 6*l.RequestTimeout)
	defer cancel()
	js, s, log, err := openFleet(setup, nc, l, cfg.Logger)
	if err != nil {
		return nil, err
	}
	c := &Client{nc: nc, js: js, s: s, cfg: cfg, log: log, waiting: map[string]chan reply{}, done: map[string]jetstream.Consumer{}, quit: make(chan struct{})}
	material := cfg.IDKey
	if material == nil {
		if material, err = sharedKey(setup, s); err != nil {
			return nil, fmt.Errorf("bgjob/fleet: shared ID key: %w", err)
		}
	}
	c.key = deriveKey(material)
	c.inbx = nc.NewInbox()
	if c.sub, err = nc.Subscribe(c.inbx+".*", c.started); err != nil {
		return nil, fmt.Errorf("bgjob/fleet: subscribe: %w", err)
	}
	c.rp = startReaper(s, log)
	return c, nil
}

// sharedKey reads the fleet's ID key, or makes it: the first writer wins.
func sharedKey(ctx context.Context, s *store) ([]byte, error) {
	var key []byte
	err := retry(ctx, s.l, func(ctx context.Context) error {
		e, err := s.workers.Get(ctx, "config.idkey")
		if err == nil {
			key = e.Value()
			return nil
		}
		if !errors.Is(err, jetstream.ErrKeyNotFound) {
			return err
		}
		fresh := make([]byte, 32)
		rand.Read(fresh)
		if _, err := s.workers.Create(ctx, "config.idkey", fresh); err != nil && !errors.Is(err, jetstream.ErrKeyExists) {
			return err
		}
		e, err = s.workers.Get(ctx, "config.idkey")
		if err != nil {
			return err
		}
		key = e.Value()
		return nil
	})
	return key, err
}

// started takes a worker's start reply.
func (c *Client) started(m *nats.Msg) {
	token := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	var r reply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return
	}
	c.mu.Lock()
	ch := c.waiting[token]
	c.mu.Unlock()
	if ch != nil {
		select {
		case ch <- r:
		default:
		}
	}
}

// Err reports the transport trouble met by the latest call that could
// not return it (List, Completions, a Status that fell back to a job's
// record), wrapping ErrUnavailable, or nil if that call met none.
func (c *Client) Err() error {
	if b := c.lastErr.Load(); b != nil {
		return b.err
	}
	return nil
}

func (c *Client) noteErr(err error) {
	if err != nil && !errors.Is(err, ErrUnavailable) {
		err = fmt.Errorf("%w: %w", ErrUnavailable, err)
	}
	c.lastErr.Store(&errBox{err})
}

func (c *Client) isClosed() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.closed
}

// opCtx is the context of a call that has none: a few requests' time.
func (c *Client) opCtx() (context.Context, context.CancelFunc) {
	return context.WithTimeout(context.Background(), 6*c.cfg.RequestTimeout)
}

// checkSpec refuses, before anything is sent, what no worker would run.
// The worker's Registry checks the rest (Dir, Env, Limits, ...).
func (c *Client) checkSpec(op string, spec *bgjob.Spec) error {
	if c.cfg.Scoped {
		if spec.Session != "" && spec.Session != c.cfg.Session {
			return fmt.Errorf("bgjob/fleet: %s: Spec.Session %q, in a client of session %q: %w", op, spec.Session, c.cfg.Session, bgjob.ErrInvalidSpec)
		}
		spec.Session = c.cfg.Session
	}
	if (strings.TrimSpace(spec.Command) == "") == (len(spec.Args) == 0) {
		return fmt.Errorf("bgjob/fleet: %s: Spec.Command and Spec.Args: want exactly one: %w", op, bgjob.ErrInvalidSpec)
	}
	if spec.Timeout < 0 || spec.IdleTimeout < 0 {
		return fmt.Errorf("bgjob/fleet: %s: Spec.Timeout or Spec.IdleTimeout negative: %w", op, bgjob.ErrInvalidSpec)
	}
	return nil
}

// Start launches spec on a worker of the pool, or joins the identical job
// queued or running in the fleet (Joined set; no process starts). A
// launch whose ID names an ended job starts a new run. It returns once a
// worker has started the job (or refused it, with the worker Registry's
// error: ErrInvalidSpec, ErrRejected, ...), or with ErrNoWorker once
// ctx or StartTimeout ends with no worker having taken it; if a worker
// took it meanwhile, Start returns its snapshot. The job outlives ctx.
func (c *Client) Start(ctx context.Context, spec bgjob.Spec) (bgjob.Snapshot, error) {
	s, _, err := c.start(ctx, "start", spec, false)
	return s, err
}

// start is Start and the launch of RunForeground (fg): it returns the
// snapshot and the run.
func (c *Client) start(ctx context.Context, op string, spec bgjob.Spec, fg bool) (bgjob.Snapshot, string, error) {
	if c.isClosed() {
		return bgjob.Snapshot{}, "", fmt.Errorf("bgjob/fleet: %s: %w", op, bgjob.ErrClosed)
	}
	if err := c.checkSpec(op, &spec); err != nil {
		return bgjob.Snapshot{}, "", err
	}
	id, err := fleetID(c.key, spec)
	if err != nil {
		return bgjob.Snapshot{}, "", err
	}
	ctx, cancel := context.WithTimeout(ctx, c.cfg.StartTimeout)
	defer cancel()
	token := SessionToken(spec.Session)
	key := recordKey(token, string(id))
	command := spec.Command
	if command == "" {
		command = strings.Join(spec.Args, " ")
	}
	rec := record{
		Phase: phaseQueued, Run: nonce(), Pollable: !fg, Rerun: c.cfg.Rerun,
		Interactive: spec.Interactive || spec.TTY != nil, TTY: spec.TTY != nil,
		Snap: bgjob.Snapshot{ID: id, Session: spec.Session, Command: command, Dir: spec.Dir, State: bgjob.Queued, ExitCode: -1, Started: time.Now(), Reason: "queued in the fleet"},
	}
	// Coalescing: the record's key is the ID, and a compare-and-set on
	// its revision decides between a join and a new run.
	var rev uint64
	for {
		cur, curRev, found, err := c.s.get(ctx, key)
		if err != nil {
			return bgjob.Snapshot{}, "", c.launchError(op, id, err)
		}
		if found && cur.Phase != phaseEnded {
			if !fg && !cur.Pollable {
				cur.Pollable = true // a Start makes the job pollable, as locally
				if _, err := c.s.cas(ctx, key, cur, curRev, 0); errors.Is(err, errConflict) {
					continue
				} else if err != nil {
					return bgjob.Snapshot{}, "", c.launchError(op, id, err)
				}
			}
			s := cur.Snap
			s.Joined = true
			return s, cur.Run, nil
		}
		rev, err = c.s.cas(ctx, key, rec, curRev, 0)
		if errors.Is(err, errConflict) {
			continue // another client launched or joined meanwhile
		}
		if err != nil {
			return bgjob.Snapshot{}, "", c.launchError(op, id, err)
		}
		break
	}
	wait := make(chan reply, 1)
	token2 := nonce()
	c.mu.Lock()
	c.waiting[token2] = wait
	c.mu.Unlock()
	defer func() {
		c.mu.Lock()
		delete(c.waiting, token2)
		c.mu.Unlock()
	}()
	data, _ := json.Marshal(launch{ID: id, Run: rec.Run, Spec: spec, Reply: c.inbx + "." + token2})
	err = retry(ctx, c.cfg.Layout, func(ctx context.Context) error {
		_, err := c.js.PublishMsg(ctx, &nats.Msg{Subject: c.cfg.launchSubject(token), Data: data}, jetstream.WithMsgID(string(id)+"."+rec.Run))
		return err
	})
	if err != nil {
		c.withdraw(key, rec.Run)
		return bgjob.Snapshot{}, "", c.launchError(op, id, err)
	}
	// The worker answers on the inbox; a reply lost to a reconnect is
	// made up for by reading the record again now and then.
	backstop := time.NewTicker(time.Second)
	defer backstop.Stop()
	for {
		select {
		case r := <-wait:
			if err := r.err(); err != nil {
				return bgjob.Snapshot{}, "", fmt.Errorf("bgjob/fleet: %s %s: %w", op, id, err)
			}
			return *r.Snap, rec.Run, nil
		case <-backstop.C:
			cur, _, found, err := c.s.get(ctx, key)
			if err == nil && (!found || cur.Run != rec.Run) {
				return bgjob.Snapshot{}, "", fmt.Errorf("bgjob/fleet: %s %s: refused by its worker (the reason was lost): %w", op, id, bgjob.ErrRejected)
			}
			if err == nil && (cur.Phase == phaseRunning || cur.Phase == phaseEnded) {
				return cur.Snap, rec.Run, nil
			}
		case <-c.quit:
			return bgjob.Snapshot{}, "", fmt.Errorf("bgjob/fleet: %s %s: %w", op, id, bgjob.ErrClosed)
		case <-ctx.Done():
			if s, ok := c.withdraw(key, rec.Run); ok {
				return s, rec.Run, nil // a worker took it after all
			}
			_ = rev
			return bgjob.Snapshot{}, "", fmt.Errorf("bgjob/fleet: %s %s: %w (%w)", op, id, ErrNoWorker, ctx.Err())
		}
	}
}

// launchError wraps a transport error of a launch.
func (c *Client) launchError(op string, id bgjob.ID, err error) error {
	return fmt.Errorf("bgjob/fleet: %s %s: %w: %w", op, id, ErrUnavailable, err)
}

// withdraw takes back a launch no worker has claimed. If a worker has,
// it returns the job's snapshot and true.
func (c *Client) withdraw(key, run string) (bgjob.Snapshot, bool) {
	ctx, cancel := c.opCtx()
	defer cancel()
	for {
		rec, rev, found, err := c.s.get(ctx, key)
		if err != nil || !found || rec.Run != run {
			return bgjob.Snapshot{}, false
		}
		if rec.Phase != phaseQueued {
			return rec.Snap, true
		}
		if err := c.s.remove(ctx, key, rev); errors.Is(err, errConflict) {
			continue
		}
		return bgjob.Snapshot{}, false
	}
}

// validID matches the IDs the fleet makes; anything else names no job
// (and could not stand in a subject).
var validID = regexp.MustCompile(`^job_[0-9a-f]{16}$`)

// find returns the record of id: for a scoped client, in its session;
// otherwise in any session, by one direct get on the pattern
// "*.ID" of the jobs bucket.
func (c *Client) find(ctx context.Context, op string, id bgjob.ID) (string, record, uint64, error) {
	notFound := fmt.Errorf("bgjob/fleet: %s %s: %w", op, id, bgjob.ErrNotFound)
	if !validID.MatchString(string(id)) {
		return "", record{}, 0, notFound
	}
	var key string
	if c.cfg.Scoped {
		key = recordKey(SessionToken(c.cfg.Session), string(id))
	} else {
		var err error
		key, err = c.keyOf(ctx, id)
		if err != nil {
			return "", record{}, 0, fmt.Errorf("bgjob/fleet: %s %s: %w: %w", op, id, ErrUnavailable, err)
		}
		if key == "" {
			return "", record{}, 0, notFound
		}
	}
	rec, rev, found, err := c.s.get(ctx, key)
	if err != nil {
		return "", record{}, 0, fmt.Errorf("bgjob/fleet: %s %s: %w: %w", op, id, ErrUnavailable, err)
	}
	if !found {
		return "", record{}, 0, notFound
	}
	return key, rec, rev, nil
}

// keyOf finds the key of id in any session: the subject of the last
// message of the jobs bucket that matches $KV.BUCKET.*.ID, read from the
// bucket's leader (see store.lastMsg).
func (c *Client) keyOf(ctx context.Context, id bgjob.ID) (string, error) {
	pre := "$KV." + c.cfg.jobsBucket() + "."
	var key string
	err := retry(ctx, c.cfg.Layout, func(ctx context.Context) error {
		m, err := c.s.lastMsg(ctx, "KV_"+c.cfg.jobsBucket(), pre+"*."+string(id))
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			key = ""
			return nil
		}
		if err != nil {
			return err
		}
		key = strings.TrimPrefix(m.Subject, pre)
		return nil
	})
	return key, err
}

// ask sends a request to the worker of rec.
func (c *Client) ask(ctx context.Context, key string, rec record, req rpcRequest) (reply, error) {
	req.ID, req.Run = rec.Snap.ID, rec.Run
	data, _ := json.Marshal(req)
	token := key[:strings.IndexByte(key, '.')]
	m, err := c.nc.RequestWithContext(ctx, c.cfg.rpcSubject(rec.Worker, token), data)
	if err != nil {
		return reply{}, err
	}
	var r reply
	if err := json.Unmarshal(m.Data, &r); err != nil {
		return reply{}, err
	}
	return r, nil
}

// gone handles a worker that did not answer: if its heartbeat is gone,
// the run is recorded lost (as a reaper would) and the new record
// returned with true.
func (c *Client) gone(ctx context.Context, key string, rec record, rev uint64) (record, bool) {
	alive, err := c.s.alive(ctx, rec.Worker)
	if err != nil || alive {
		return rec, false
	}
	next, err := c.s.lose(ctx, key, rec, rev)
	if err != nil {
		return rec, false
	}
	return next, true
}

// Status returns a snapshot of the job: a running job's from its worker
// (its text admitted there), an ended or queued job's from its record.
// It fails with ErrNotFound if no such job is in the fleet (or, for a
// scoped client, in its session). If the worker of a running job does
// not answer, Status returns the job's record, noting the trouble in
// Reason, and Err reports it; if the worker's heartbeat is gone too, the
// job is recorded lost and returned so.
func (c *Client) Status(id bgjob.ID) (bgjob.Snapshot, error) {
	ctx, cancel := c.opCtx()
	defer cancel()
	key, rec, rev, err := c.find(ctx, "status", id)
	if err != nil {
		return bgjob.Snapshot{}, err
	}
	if rec.Phase != phaseRunning {
		return rec.Snap, nil
	}
	rctx, rcancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
	r, err := c.ask(rctx, key, rec, rpcRequest{Op: "status"})
	rcancel()
	if err == nil && r.err() == nil {
		return *r.Snap, nil
	}
	if err == nil && errors.Is(r.err(), bgjob.ErrNotFound) {
		// Ended at its worker since: the record says how.
		if _, rec2, _, err2 := c.find(ctx, "status", id); err2 == nil {
			return rec2.Snap, nil
		}
		return rec.Snap, nil
	}
	if err == nil {
		err = r.err()
	}
	if next, lost := c.gone(ctx, key, rec, rev); lost {
		return next.Snap, nil
	}
	c.noteErr(err)
	s := rec.Snap
	s.Reason = "fleet: worker " + rec.Worker + " did not answer: " + err.Error()
	return s, nil
}

// Read returns the job's admitted output from offset, as
// [bgjob.Registry.Read]: a running job's from its worker, an ended (or
// lost) job's from the output its worker published. Bytes never
// published (a lost worker's last) count as Skipped.
func (c *Client) Read(id bgjob.ID, offset int64, max int) (bgjob.Chunk, error) {
	ctx, cancel := c.opCtx()
	defer cancel()
	return c.read(ctx, "read", id, offset, max, false)
}

// ReadWait is Read that waits for output, as [bgjob.Registry.ReadWait]:
// it returns as soon as there is output at offset, the job has ended
// (Chunk.Done), or ctx is done. It waits at the job's worker, which
// answers when output comes; it does not poll. A queued job is waited
// for until it runs.
func (c *Client) ReadWait(ctx context.Context, id bgjob.ID, offset int64, max int) (bgjob.Chunk, error) {
	return c.read(ctx, "readwait", id, offset, max, true)
}

func (c *Client) read(ctx context.Context, op string, id bgjob.ID, offset int64, max int, wait bool) (bgjob.Chunk, error) {
	if offset < 0 {
		return bgjob.Chunk{}, fmt.Errorf("bgjob/fleet: %s %s: offset %d: negative: %w", op, id, offset, bgjob.ErrInvalidArgument)
	}
	if max <= 0 {
		return bgjob.Chunk{}, fmt.Errorf("bgjob/fleet: %s %s: max %d: not positive: %w", op, id, max, bgjob.ErrInvalidArgument)
	}
	fctx, fcancel := context.WithTimeout(context.Background(), 6*c.cfg.RequestTimeout)
	key, rec, rev, err := c.find(fctx, op, id)
	fcancel()
	if err != nil {
		return bgjob.Chunk{}, err
	}
	empty := bgjob.Chunk{Offset: offset, Next: offset}
	for {
		switch rec.Phase {
		case phaseEnded:
			return c.readStored(ctx, key, rec, offset, max)
		case phaseQueued, phaseClaimed:
			if !wait {
				return empty, nil
			}
			if rec, rev, err = c.await(ctx, key, rec.Run, func(r record) bool { return r.Phase == phaseRunning || r.Phase == phaseEnded }); err != nil {
				return empty, fmt.Errorf("bgjob/fleet: %s %s: %w", op, id, err)
			}
			continue
		}
		req := rpcRequest{Op: "read", Offset: offset, Max: max}
		rctx, rcancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
		if wait {
			req.Op = "readwait"
			req.Wait = maxWait
			if dl, ok := ctx.Deadline(); ok {
				req.Wait = min(time.Until(dl), maxWait)
			}
			rcancel()
			rctx, rcancel = context.WithTimeout(ctx, req.Wait+c.cfg.RequestTimeout)
		}
		r, err := c.ask(rctx, key, rec, req)
		rcancel()
		if err == nil {
			rerr := r.err()
			if rerr == nil {
				if r.Chunk.Next != offset || r.Chunk.Done || !wait {
					return *r.Chunk, nil
				}
				continue // the worker's wait ended with nothing yet: ask again
			}
			if !errors.Is(rerr, bgjob.ErrNotFound) && !errors.Is(rerr, errStarting) {
				return empty, fmt.Errorf("bgjob/fleet: %s %s: %w", op, id, rerr)
			}
		} else if ctx.Err() != nil {
			return empty, fmt.Errorf("bgjob/fleet: %s %s: %w", op, id, ctx.Err())
		} else if next, lost := c.gone(ctx, key, rec, rev); lost {
			rec = next
			continue
		} else if !wait {
			return empty, fmt.Errorf("bgjob/fleet: %s %s: %w: %w", op, id, ErrUnavailable, err)
		}
		// The worker has let go of the run (it ended), is starting it,
		// or did not answer while alive: read the record again.
		gctx, gcancel := context.WithTimeout(ctx, 6*c.cfg.RequestTimeout)
		cur, curRev, found, gerr := c.s.get(gctx, key)
		gcancel()
		if gerr != nil {
			return empty, fmt.Errorf("bgjob/fleet: %s %s: %w: %w", op, id, ErrUnavailable, gerr)
		}
		if !found || cur.Run != rec.Run {
			return empty, fmt.Errorf("bgjob/fleet: %s %s: %w", op, id, bgjob.ErrNotFound)
		}
		if cur.Phase == phaseRunning && err == nil && errors.Is(r.err(), bgjob.ErrNotFound) {
			// Ended at the worker, its end not yet recorded: wait for it.
			if cur, curRev, err = c.await(ctx, key, rec.Run, func(r record) bool { return r.Phase == phaseEnded }); err != nil {
				return empty, fmt.Errorf("bgjob/fleet: %s %s: %w", op, id, err)
			}
		}
		rec, rev = cur, curRev
	}
}

// await watches the record at key until its run `run` satisfies ok, or
// is gone (ErrNotFound), or ctx ends.
func (c *Client) await(ctx context.Context, key, run string, ok func(record) bool) (record, uint64, error) {
	for {
		rec, rev, err := c.awaitOnce(ctx, key, run, ok)
		if err == nil || !transient(err) || ctx.Err() != nil {
			return rec, rev, err
		}
	}
}

func (c *Client) awaitOnce(ctx context.Context, key, run string, ok func(record) bool) (record, uint64, error) {
	w, err := c.s.jobs.Watch(ctx, key)
	if err != nil {
		return record{}, 0, err
	}
	defer w.Stop()
	for {
		select {
		case e, open := <-w.Updates():
			if !open {
				return record{}, 0, errors.New("bgjob/fleet: watcher closed")
			}
			if e == nil {
				continue
			}
			if e.Operation() != jetstream.KeyValuePut {
				return record{}, 0, bgjob.ErrNotFound
			}
			var rec record
			if json.Unmarshal(e.Value(), &rec) != nil {
				continue
			}
			if rec.Run != run {
				return rec, e.Revision(), bgjob.ErrNotFound
			}
			if ok(rec) {
				return rec, e.Revision(), nil
			}
		case <-c.quit:
			return record{}, 0, bgjob.ErrClosed
		case <-ctx.Done():
			return record{}, 0, ctx.Err()
		}
	}
}

// storedChunk is a chunk of published output.
type storedChunk struct {
	offset, next, skipped int64
	data                  string
}

// readStored serves a read of an ended job from the output its worker
// published, with Read's semantics: Skipped for what is not held, an
// offset inside a rewritten chunk refused.
func (c *Client) readStored(ctx context.Context, key string, rec record, offset int64, max int) (bgjob.Chunk, error) {
	token := key[:strings.IndexByte(key, '.')]
	subject := c.cfg.outSubject(token, string(rec.Snap.ID), rec.Run)
	st, err := c.js.Stream(ctx, c.cfg.outStream())
	if err != nil {
		return bgjob.Chunk{}, fmt.Errorf("bgjob/fleet: read %s: %w: %w", rec.Snap.ID, ErrUnavailable, err)
	}
	out := bgjob.Chunk{Offset: offset, Next: offset}
	var data strings.Builder
	started := false
	end := rec.Snap.Output.Total
	for seq := uint64(1); ; {
		var m *jetstream.RawStreamMsg
		err := retry(ctx, c.cfg.Layout, func(ctx context.Context) error {
			var err error
			m, err = st.GetMsg(ctx, seq, jetstream.WithGetMsgSubject(subject))
			return err
		})
		if errors.Is(err, jetstream.ErrMsgNotFound) {
			break
		}
		if err != nil {
			return bgjob.Chunk{}, fmt.Errorf("bgjob/fleet: read %s: %w: %w", rec.Snap.ID, ErrUnavailable, err)
		}
		seq = m.Sequence + 1
		ch := storedChunk{data: string(m.Data)}
		fmt.Sscan(m.Header.Get(hdrOffset), &ch.offset)
		fmt.Sscan(m.Header.Get(hdrNext), &ch.next)
		end = max64(end, ch.next)
		if ch.next <= offset {
			continue
		}
		if !started {
			started = true
			switch {
			case ch.offset >= offset:
				out.Skipped, out.Offset = ch.offset-offset, ch.offset
			case int64(len(ch.data)) == ch.next-ch.offset:
				ch.data = ch.data[offset-ch.offset:] // raw bytes: cut at the offset
			default:
				return bgjob.Chunk{}, fmt.Errorf("bgjob/fleet: read %s: offset %d: inside a line the Admitter rewrote (continue from Chunk.Next): %w", rec.Snap.ID, offset, bgjob.ErrInvalidArgument)
			}
		} else if ch.offset != out.Next {
			break // a gap: the next read reports it as Skipped
		}
		if room := max - data.Len(); len(ch.data) > room && started && data.Len() > 0 {
			break
		} else if len(ch.data) > room && int64(len(ch.data)) == ch.next-max64(ch.offset, offset) {
			ch.next -= int64(len(ch.data) - room) // raw bytes: cut at max
			ch.data = ch.data[:room]
		}
		data.WriteString(ch.data)
		out.Next = ch.next
		if data.Len() >= max {
			break
		}
	}
	out.Data = data.String()
	if !started && offset < end {
		// Nothing held at or after offset: the rest was never published.
		out.Skipped, out.Offset, out.Next = end-offset, end, end
	}
	if !started && offset > end {
		return bgjob.Chunk{}, fmt.Errorf("bgjob/fleet: read %s: offset %d: past the end (%d): %w", rec.Snap.ID, offset, end, bgjob.ErrInvalidArgument)
	}
	out.Done = out.Next >= end
	return out, nil
}

func max64(a, b int64) int64 {
	if a > b {
		return a
	}
	return b
}

// Wait blocks until the job has ended or ctx is done, watching the job's
// record (no polling). It returns the final snapshot, or the current one
// and an error wrapping ctx.Err(). It fails with ErrNotFound if no such
// job is in the fleet.
func (c *Client) Wait(ctx context.Context, id bgjob.ID) (bgjob.Snapshot, error) {
	fctx, fcancel := context.WithTimeout(ctx, 6*c.cfg.RequestTimeout)
	key, rec, _, err := c.find(fctx, "wait", id)
	fcancel()
	if err != nil {
		return bgjob.Snapshot{}, err
	}
	if rec.Phase == phaseEnded {
		return rec.Snap, nil
	}
	final, _, err := c.await(ctx, key, rec.Run, func(r record) bool { return r.Phase == phaseEnded })
	if err != nil {
		if errors.Is(err, bgjob.ErrNotFound) && final.Run != "" {
			return final.Snap, nil // ended and launched again since
		}
		return rec.Snap, fmt.Errorf("bgjob/fleet: wait %s: %w", id, err)
	}
	return final.Snap, nil
}

// cancelTimeout bounds a Cancel's wait for the worker: the kill grace of
// its Registry and the recording of the end.
const cancelTimeout = time.Minute

// Cancel stops the job for everyone who started or joined it, as
// [bgjob.Registry.Cancel]: at its worker (SIGTERM, grace, SIGKILL), and
// returns the final snapshot once the end is recorded. A queued job is
// cancelled before any worker starts it. It fails with ErrNotFound if no
// such job is in the fleet.
func (c *Client) Cancel(id bgjob.ID) (bgjob.Snapshot, error) {
	ctx, cancel := context.WithTimeout(context.Background(), cancelTimeout)
	defer cancel()
	key, rec, rev, err := c.find(ctx, "cancel", id)
	if err != nil {
		return bgjob.Snapshot{}, err
	}
	for {
		switch rec.Phase {
		case phaseEnded:
			return rec.Snap, nil
		case phaseQueued:
			next := rec
			next.Phase = phaseEnded
			next.Snap.State, next.Snap.ExitCode, next.Snap.Reason, next.Snap.Ended = bgjob.Cancelled, 130, "cancelled before start", time.Now()
			_, err := c.s.cas(ctx, key, next, rev, c.cfg.Retention)
			if err == nil {
				if next.Pollable {
					c.s.complete(ctx, next)
				}
				return next.Snap, nil
			}
			if !errors.Is(err, errConflict) {
				return rec.Snap, fmt.Errorf("bgjob/fleet: cancel %s: %w: %w", id, ErrUnavailable, err)
			}
		default:
			r, err := c.ask(ctx, key, rec, rpcRequest{Op: "cancel"})
			if err == nil && r.err() == nil {
				return *r.Snap, nil
			}
			if err != nil {
				if next, lost := c.gone(ctx, key, rec, rev); lost {
					return next.Snap, nil
				}
				if ctx.Err() != nil {
					return rec.Snap, fmt.Errorf("bgjob/fleet: cancel %s: %w: %w", id, ErrUnavailable, err)
				}
			} else if !errors.Is(r.err(), bgjob.ErrNotFound) {
				return rec.Snap, fmt.Errorf("bgjob/fleet: cancel %s: %w", id, r.err())
			}
			// Ended meanwhile, or its worker answered for nothing yet:
			// the record tells.
			var found bool
			cur, curRev, found, gerr := c.s.get(ctx, key)
			if gerr != nil {
				return rec.Snap, fmt.Errorf("bgjob/fleet: cancel %s: %w: %w", id, ErrUnavailable, gerr)
			}
			if !found || cur.Run != rec.Run {
				return rec.Snap, nil
			}
			if cur.Phase == phaseRunning && err == nil {
				if cur, curRev, err = c.await(ctx, key, rec.Run, func(r record) bool { return r.Phase == phaseEnded }); err != nil {
					return rec.Snap, fmt.Errorf("bgjob/fleet: cancel %s: %w", id, err)
				}
			}
			rec, rev = cur, curRev
			continue
		}
		var found bool
		rec, rev, found, err = c.s.get(ctx, key)
		if err != nil || !found {
			return rec.Snap, fmt.Errorf("bgjob/fleet: cancel %s: %w", id, bgjob.ErrNotFound)
		}
	}
}

// List returns snapshots of the session's jobs in the fleet, queued,
// running or ended within the Layout's Retention, oldest first. A running
// job's snapshot is the one its worker recorded when it started it (its
// text empty); Status gives the live one. On transport trouble it
// returns what it read, and Err says why.
func (c *Client) List(session string) []bgjob.Snapshot {
	if c.cfg.Scoped && session != c.cfg.Session {
		return nil
	}
	ctx, cancel := c.opCtx()
	defer cancel()
	recs, err := c.s.list(ctx, SessionToken(session)+".*")
	c.noteErr(err)
	if err != nil {
		c.lastErr.Store(&errBox{fmt.Errorf("%w: list: %w", ErrUnavailable, err)})
	} else {
		c.lastErr.Store(nil)
	}
	out := make([]bgjob.Snapshot, 0, len(recs))
	for _, rec := range recs {
		if rec.Pollable || rec.Phase != phaseEnded {
			out = append(out, rec.Snap)
		}
	}
	slices.SortFunc(out, func(a, b bgjob.Snapshot) int { return a.Started.Compare(b.Started) })
	return out
}

// queue is one of the fleet's per-session work queues that a client
// takes from: completions or matches.
type queue struct {
	name    string // "completions" or "matches", for errors
	next    string // "next completion" or "next match", for errors
	durable string // the consumer's name before the session token
	stream  func(Layout) string
	subject func(Layout, string) string
}

var (
	doneQueue  = queue{"completions", "next completion", "done-", Layout.doneStream, Layout.doneSubject}
	matchQueue = queue{"matches", "next match", "match-", Layout.matchStream, Layout.matchSubject}
)

// consumer returns a session's consumer of q: a durable pull consumer of
// the work queue, shared by every client, so each message goes to one of
// them.
func (c *Client) consumer(ctx context.Context, q queue, token string) (jetstream.Consumer, error) {
	name := q.durable + token
	c.mu.Lock()
	cons := c.done[name]
	c.mu.Unlock()
	if cons != nil {
		return cons, nil
	}
	err := retry(ctx, c.cfg.Layout, func(ctx context.Context) error {
		var err error
		cons, err = c.js.CreateOrUpdateConsumer(ctx, q.stream(c.cfg.Layout), jetstream.ConsumerConfig{
			Durable:           name,
			FilterSubject:     q.subject(c.cfg.Layout, token),
			AckPolicy:         jetstream.AckExplicitPolicy,
			AckWait:           30 * time.Second,
			MaxDeliver:        -1,
			InactiveThreshold: 24 * time.Hour,
			Replicas:          c.cfg.Replicas,
		})
		return err
	})
	if err != nil {
		return nil, err
	}
	c.mu.Lock()
	c.done[name] = cons
	c.mu.Unlock()
	return cons, nil
}

// Completions returns the session's queued completions, oldest first,
// and takes them from the fleet's queue: each is delivered once, to one
// caller in the whole fleet. On transport trouble it returns what it
// took, and Err says why.
func (c *Client) Completions(session string) []bgjob.Completion {
	return drain[bgjob.Completion](c, doneQueue, session)
}

// drain takes every message of the session's queue q that is there now.
func drain[T any](c *Client, q queue, session string) []T {
	if c.cfg.Scoped && session != c.cfg.Session {
		return nil
	}
	ctx, cancel := c.opCtx()
	defer cancel()
	var out []T
	cons, err := c.consumer(ctx, q, SessionToken(session))
	for err == nil {
		var batch jetstream.MessageBatch
		batch, err = cons.FetchNoWait(256)
		if err != nil {
			break
		}
		n := 0
		for m := range batch.Messages() {
			n++
			if v, ok := take[T](c, ctx, m); ok {
				out = append(out, v)
			}
		}
		err = batch.Error()
		if n == 0 {
			break
		}
	}
	if err != nil {
		c.lastErr.Store(&errBox{fmt.Errorf("%w: %s: %w", ErrUnavailable, q.name, err)})
	} else {
		c.lastErr.Store(nil)
	}
	return out
}

// take acknowledges a message of a queue (a completion, a match) and
// waits for the server to confirm it, so the message is this caller's
// alone.
func take[T any](c *Client, ctx context.Context, m jetstream.Msg) (T, bool) {
	var v T
	if err := json.Unmarshal(m.Data(), &v); err != nil {
		m.Term()
		return v, false
	}
	// An acknowledgement whose answer did not come may have been
	// applied: dropping the message then would lose it. It is sent
	// again (the same delivery's ack is idempotent) while the message's
	// AckWait (30s) is far from over.
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, c.cfg.RequestTimeout)
		err := m.DoubleAck(actx)
		cancel()
		if err == nil {
			return v, true
		}
		timedOut := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout)
		if !timedOut || attempt == 3 || ctx.Err() != nil {
			return v, false // not ours after all: it comes again, to someone
		}
	}
}

// NextCompletion blocks until a completion of the session is queued in
// the fleet, takes it and returns it; each completion goes to one caller
// of Completions or NextCompletion in the whole fleet. ctx bounds the
// wait. After Close it returns ErrClosed.
func (c *Client) NextCompletion(ctx context.Context, session string) (bgjob.Completion, error) {
	return next[bgjob.Completion](c, ctx, doneQueue, session)
}

// next blocks until a message of the session's queue q comes, and takes it.
func next[T any](c *Client, ctx context.Context, q queue, session string) (T, error) {
	var zero T
	op := q.next
	if c.cfg.Scoped && session != c.cfg.Session {
		<-ctx.Done()
		return zero, fmt.Errorf("bgjob/fleet: %s: %w", op, ctx.Err())
	}
	for {
		if c.isClosed() {
			return zero, fmt.Errorf("bgjob/fleet: %s: %w", op, bgjob.ErrClosed)
		}
		if ctx.Err() != nil {
			return zero, fmt.Errorf("bgjob/fleet: %s: %w", op, ctx.Err())
		}
		cons, err := c.consumer(ctx, q, SessionToken(session))
		if err != nil {
			if ctx.Err() != nil {
				continue
			}
			return zero, fmt.Errorf("bgjob/fleet: %s: %w: %w", op, ErrUnavailable, err)
		}
		// One pull request at a time, so a message is never held by
		// a request this caller has given up; Close ends it.
		fctx, cancel := context.WithTimeout(ctx, maxWait)
		stop := context.AfterFunc(fctxQuit(c.quit), cancel)
		batch, err := cons.Fetch(1, jetstream.FetchContext(fctx))
		if err == nil {
			for m := range batch.Messages() {
				if v, ok := take[T](c, ctx, m); ok {
					stop()
					cancel()
					return v, nil
				}
			}
		}
		stop()
		cancel()
	}
}

// fctxQuit turns a quit channel into a context that ends with it.
func fctxQuit(quit chan struct{}) context.Context {
	return quitCtx{quit}
}

type quitCtx struct{ quit chan struct{} }

func (q quitCtx) Deadline() (time.Time, bool) { return time.Time{}, false }
func (q quitCtx) Done() <-chan struct{}       { return q.quit }
func (q quitCtx) Err() error {
	select {
	case <-q.quit:
		return context.Canceled
	default:
		return nil
	}
}
func (q quitCtx) Value(any) any { return nil }

// Close stops the client: pending launches and waits return ErrClosed,
// and its goroutines end. Jobs in the fleet go on. Close is idempotent.
func (c *Client) Close(ctx context.Context) error {
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	close(c.quit)
	c.mu.Unlock()
	c.sub.Unsubscribe()
	c.rp.close()
	return nil
}

// Session returns the view of the fleet scoped to the session name (see
// [bgjob.SessionOf]): each of its methods that takes an ID checks the
// job's session with one Status first. A host that serves one session
// per connection can use a Client with ClientConfig.Scoped instead,
// which needs no such check and runs under NATS permissions of that
// session alone.
func (c *Client) Session(name string) *bgjob.Session { return bgjob.SessionOf(c, name) }

// Running returns how many jobs of the fleet are running, started by a
// worker or claimed by one that is starting them (for a scoped client,
// in its session): the fleet's count, read from the jobs bucket, not
// this client's. Queued launches do not count. On transport trouble it
// returns what it could count, and Err says why.
func (c *Client) Running() int {
	ctx, cancel := c.opCtx()
	defer cancel()
	filter := "*.*"
	if c.cfg.Scoped {
		filter = SessionToken(c.cfg.Session) + ".*"
	}
	recs, err := c.s.list(ctx, filter)
	if err != nil {
		c.lastErr.Store(&errBox{fmt.Errorf("%w: running: %w", ErrUnavailable, err)})
	} else {
		c.lastErr.Store(nil)
	}
	n := 0
	for _, rec := range recs {
		if rec.Phase == phaseRunning || rec.Phase == phaseClaimed {
			n++
		}
	}
	return n
}

// Readmit cannot be done by a client: the Admitter runs in each
// worker's Registry, so that no unadmitted byte leaves the machine that
// ran the job, and the text of ended jobs in the fleet (their records
// and published output) has passed it already. Readmit returns an error
// wrapping ErrUnsupported; call [bgjob.Registry.Readmit] on each
// worker's Registry, whose running jobs' text is admitted on every
// read anyway.
func (c *Client) Readmit(ctx context.Context) error {
	return fmt.Errorf("bgjob/fleet: readmit: the Admitter runs on the workers (call Registry.Readmit there): %w", bgjob.ErrUnsupported)
}

// Detach lets the host exit without stopping its jobs, as
// [bgjob.Registry.Detach] does in durable mode. Jobs in the fleet never
// depend on the client that launched them, so Detach is Close: the
// client lets go, and the jobs, their records and their completions stay
// in the fleet for any client. It returns nil.
func (c *Client) Detach() error { return c.Close(context.Background()) }

var _ bgjob.Jobs = (*Client)(nil)
