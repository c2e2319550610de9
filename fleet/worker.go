package fleet

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/bgjob/bgjob"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// WorkerConfig configures a [Worker]. The zero value is usable.
type WorkerConfig struct {
	Layout

	// Name names the worker in the fleet: in its heartbeat, its jobs'
	// records and its request subject. It must be unique in the fleet
	// while the worker lives. If Name is empty, a random one is made.
	// It may hold letters, digits, '-' and '_'.
	Name string

	// Slots is how many launches the worker runs at once: it takes a
	// launch from the work queue only while fewer run. If Slots is 0, it
	// is 16. It should not exceed the Registry's MaxRunning, and the
	// Registry's Retention.MaxJobs should be well above it, so that an
	// ended job is still there when the worker reads its end.
	Slots int

	// Heartbeat is how often the worker writes its heartbeat; HeartbeatTTL
	// is how long a heartbeat lasts, so how soon after the worker dies
	// its jobs are reported lost. If Heartbeat is 0 it is 1s; if
	// HeartbeatTTL is 0 it is 10s. HeartbeatTTL must be at least 1s and
	// more than twice Heartbeat; NATS keeps a heartbeat for HeartbeatTTL
	// cut to whole seconds (1.5s lasts 1s). It should be well above the time the
	// cluster takes to elect new leaders when it loses a server (a few
	// seconds): a worker that cannot write its heartbeat for longer is
	// taken for dead, and its running jobs are reported lost. When its
	// heartbeats come back it stops those jobs (fencing: nothing runs
	// that the fleet reports ended), so a partition longer than
	// HeartbeatTTL costs the jobs it caught. A test with three servers
	// on two busy cores lost two live workers' jobs with 3s.
	Heartbeat    time.Duration
	HeartbeatTTL time.Duration

	// AckWait is how long a launch the worker took stays invisible to
	// other workers before JetStream hands it out again: the time a
	// worker has to claim and start a launch, and how late a launch of
	// a lost worker is re-run when the client opted in (ClientConfig.Rerun).
	// If AckWait is 0, it is 30s. It applies when the pool's consumer is
	// made or updated.
	AckWait time.Duration

	// Matches, if not nil, is the feed that the Registry's
	// Config.OnMatch calls (see [MatchFeed]): the worker publishes the
	// matches of the jobs it runs to the fleet, where Client.Matches and
	// Client.NextMatch take them. If Matches is nil, the matches stay
	// with the Registry (its OnMatch and Matches queue), and no client
	// gets them.
	Matches *MatchFeed

	// Logger, if not nil, receives the worker's warnings. If Logger is
	// nil, they are discarded.
	Logger *slog.Logger

	// afterClaim, for tests, is called after the worker claimed a launch
	// and before it starts the job.
	afterClaim func()
	// muteBeats, for tests, while it holds true, makes the worker skip
	// its heartbeats as if cut off from JetStream (a partition).
	muteBeats *atomic.Bool
}

// Worker serves a local [bgjob.Registry] to a fleet: it takes launches
// from its pool's work queue while it has a free slot, runs them in the
// Registry, publishes each job's record (with its snapshot) at its start
// and end, its admitted output by offset, and its completion, answers
// Status, Read, ReadWait and Cancel for its jobs by request-reply, and
// writes a heartbeat that lasts HeartbeatTTL.
//
// Every text a worker sends has passed the Registry's Admitter: output
// is read through Registry.ReadWait, snapshots through Status and Wait.
//
// The worker takes over the Registry's completion queues (it drains the
// queue of each session whose job ends) and, with a MatchFeed, its match
// queues (it drains the queue of each session whose match it published),
// so a host should not read completions or matches from a Registry it
// serves. Its other methods stay the
// host's. Close the Worker before the Registry.
//
// A Worker is safe for concurrent use.
type Worker struct {
	nc   *nats.Conn
	js   jetstream.JetStream
	s    *store
	reg  *bgjob.Registry
	cfg  WorkerConfig
	log  *slog.Logger
	cons jetstream.Consumer
	rp   *reaper

	// ctx is the worker's life: the jobs' trackers and the requests read
	// through it; Close cancels it last. takeCtx ends the taking of
	// launches; Close cancels it first.
	ctx        context.Context
	cancel     context.CancelFunc
	takeCtx    context.Context
	stopTaking context.CancelFunc

	wg      sync.WaitGroup // the fetch loop, each launch's goroutine, the heartbeat
	rpcWG   sync.WaitGroup // requests being answered
	running atomic.Int64   // launches taken and not yet finalized
	freed   chan struct{}  // a slot freed (capacity 1)
	sub     *nats.Subscription
	// matchCh holds the matches from the MatchFeed for the relay; poke
	// wakes the relay when a run's Registry ID becomes known (both
	// capacity-bounded, never blocking a sender).
	matchCh   chan bgjob.Match
	poke      chan struct{}
	dropMu    sync.Mutex       // guards dropped
	dropped   map[string]int64 // matches refused by a full matchCh, by session
	firstBeat time.Time        // when NewWorker sent its heartbeat
	// detached is set by Detach: the runs are left to the next worker
	// of this name, unrecorded.
	detached atomic.Bool

	// mu guards the fields below.
	mu   sync.Mutex
	jobs map[bgjob.ID]*served // the runs this worker serves, by fleet ID
	// byLocal holds the same runs by their Registry ID, and those that
	// ended within matchLinger (lingering, oldest first), for the
	// relay; starting counts launches inside Registry.Start, whose
	// matches may come before their ID.
	byLocal   map[bgjob.ID]*served
	lingering []lingering
	starting  int
	rpcClosed bool // no request is answered any more
	closed    bool
}

// served is a run this worker claimed.
type served struct {
	id    bgjob.ID
	run   string
	token string
	key   string

	local     atomic.Value   // bgjob.ID in the Registry, once started
	cancelled atomic.Bool    // a Cancel came: stop it, or never start it
	fenced    atomic.Bool    // the fleet settled the run without this worker: stopped
	ended     chan struct{}  // closed once the end is recorded
	final     bgjob.Snapshot // set before ended closes
}

// NewWorker starts serving reg to the fleet over nc: it makes the fleet's
// streams and buckets if they are missing, writes its heartbeat, and
// starts taking launches. The worker does not own nc or reg; close it
// with [Worker.Close] before either.
func NewWorker(nc *nats.Conn, reg *bgjob.Registry, cfg WorkerConfig) (*Worker, error) {
	l, err := cfg.Layout.normalize()
	if err != nil {
		return nil, err
	}
	cfg.Layout = l
	if cfg.Name == "" {
		cfg.Name = "w-" + nonce()
	}
	if !nameRE.MatchString(cfg.Name) {
		return nil, fmt.Errorf("bgjob/fleet: WorkerConfig.Name %q: want letters, digits, '-' or '_': %w", cfg.Name, errInvalidConfig)
	}
	if cfg.Slots <= 0 {
		cfg.Slots = 16
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = time.Second
	}
	if cfg.HeartbeatTTL <= 0 {
		cfg.HeartbeatTTL = 10 * time.Second
	}
	if cfg.HeartbeatTTL < time.Second || cfg.HeartbeatTTL <= 2*cfg.Heartbeat {
		return nil, fmt.Errorf("bgjob/fleet: WorkerConfig.HeartbeatTTL %v: want at least 1s and more than twice Heartbeat (%v): %w", cfg.HeartbeatTTL, cfg.Heartbeat, errInvalidConfig)
	}
	if cfg.AckWait <= 0 {
		cfg.AckWait = 30 * time.Second
	}
	setup, cancelSetup := context.WithTimeout(context.Background(), 6*l.RequestTimeout)
	defer cancelSetup()
	js, s, log, err := openFleet(setup, nc, l, cfg.Logger)
	if err != nil {
		return nil, err
	}
	w := &Worker{nc: nc, js: js, s: s, reg: reg, cfg: cfg, log: log, freed: make(chan struct{}, 1), jobs: map[bgjob.ID]*served{},
		byLocal: map[bgjob.ID]*served{}, matchCh: make(chan bgjob.Match, relayBacklog), poke: make(chan struct{}, 1), dropped: map[string]int64{}}
	err = retry(setup, l, func(ctx context.Context) error {
		var err error
		w.cons, err = js.CreateOrUpdateConsumer(ctx, l.launchStream(), jetstream.ConsumerConfig{
			Durable:       l.poolConsumer(),
			FilterSubject: l.Prefix + ".launch." + l.Pool + ".>",
			AckPolicy:     jetstream.AckExplicitPolicy,
			AckWait:       cfg.AckWait,
			MaxDeliver:    -1,
			MaxAckPending: 100000,
			Replicas:      l.Replicas,
		})
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("bgjob/fleet: pool consumer: %w", err)
	}
	w.firstBeat = time.Now()
	if err := w.beat(setup); err != nil {
		return nil, fmt.Errorf("bgjob/fleet: heartbeat: %w", err)
	}
	// The feed first: a match found from here on reaches the relay
	// (adopt drains what the Registry queued before).
	if cfg.Matches != nil && !cfg.Matches.w.CompareAndSwap(nil, w) {
		return nil, fmt.Errorf("bgjob/fleet: WorkerConfig.Matches: the feed serves another worker: %w", errInvalidConfig)
	}
	// The worker's life starts before its first request can come.
	w.ctx, w.cancel = context.WithCancel(context.Background())
	w.takeCtx, w.stopTaking = context.WithCancel(w.ctx)
	w.sub, err = nc.Subscribe(l.rpcSubject(cfg.Name, "*"), w.request)
	if err != nil {
		w.letFeedGo()
		w.cancel()
		return nil, fmt.Errorf("bgjob/fleet: subscribe: %w", err)
	}
	if err := w.adopt(setup); err != nil {
		w.detached.Store(true) // leave what was adopted unrecorded
		w.letFeedGo()
		w.sub.Unsubscribe()
		w.cancel()
		w.wg.Wait()
		return nil, fmt.Errorf("bgjob/fleet: adopt: %w", err)
	}
	w.rp = startReaper(s, log)
	w.wg.Add(2)
	go w.heartbeats() // ends when Close cancels ctx
	go w.take()       // ends when Close cancels takeCtx
	if cfg.Matches != nil {
		w.wg.Add(1)
		go w.relay() // ends when Close or Detach cancels ctx
	}
	return w, nil
}

// letFeedGo detaches the MatchFeed from the worker; the relay then
// publishes what it holds and ends with ctx.
func (w *Worker) letFeedGo() {
	if w.cfg.Matches != nil {
		w.cfg.Matches.w.CompareAndSwap(w, nil)
	}
}

// Name returns the worker's name in the fleet.
func (w *Worker) Name() string { return w.cfg.Name }

// heartbeat is the value of a worker's heartbeat key.
type heartbeat struct {
	Pool    string    `json:"pool"`
	Slots   int       `json:"slots"`
	Running int64     `json:"running"`
	At      time.Time `json:"at"`
}

// beat writes the heartbeat, which expires after HeartbeatTTL.
func (w *Worker) beat(ctx context.Context) error {
	data, _ := json.Marshal(heartbeat{Pool: w.cfg.Pool, Slots: w.cfg.Slots, Running: w.running.Load(), At: time.Now()})
	subject := "$KV." + w.cfg.workersBucket() + ".hb." + w.cfg.Name
	actx, cancel := context.WithTimeout(ctx, w.cfg.RequestTimeout)
	defer cancel()
	_, err := w.js.PublishMsg(actx, &nats.Msg{Subject: subject, Data: data}, jetstream.WithMsgTTL(w.cfg.HeartbeatTTL))
	return err
}

// heartbeats writes the heartbeat every Heartbeat, and fences the
// worker after a gap (see fence).
func (w *Worker) heartbeats() {
	defer w.wg.Done()
	t := time.NewTicker(w.cfg.Heartbeat)
	defer t.Stop()
	last := w.firstBeat // when the last heartbeat that was stored was sent
	var fenceUntil time.Time
	for {
		select {
		case <-w.ctx.Done():
			return
		case <-t.C:
		}
		sent := time.Now()
		var err error
		if w.cfg.muteBeats != nil && w.cfg.muteBeats.Load() {
			err = errors.New("muted (test)")
		} else {
			err = w.beat(w.ctx)
		}
		if err != nil {
			if w.ctx.Err() == nil {
				w.log.Warn("bgjob/fleet: heartbeat", "worker", w.cfg.Name, "err", err)
			}
			continue
		}
		now := time.Now()
		// The last stored heartbeat may have expired before this one
		// was stored if this one's answer came long after that one was
		// sent: then the reapers may have settled this worker's runs
		// "worker lost", and for a while (a reaper's sweep may record
		// the loss a little later) every beat checks. "Long" is half of
		// HeartbeatTTL, not all of it: the server keeps a heartbeat for
		// HeartbeatTTL cut to whole seconds (1.5s lasts 1s), and its
		// expiry timers are not exact. Beats come every Heartbeat, less
		// than half the TTL, so a healthy worker never checks.
		if now.Sub(last) >= w.cfg.HeartbeatTTL/2 {
			w.log.Warn("bgjob/fleet: heartbeat gap: checking for runs settled without this worker", "worker", w.cfg.Name, "gap", now.Sub(last))
			fenceUntil = now.Add(fenceWindow(w.cfg.Layout, w.cfg.HeartbeatTTL))
		}
		last = sent
		if now.Before(fenceUntil) {
			w.fence()
		}
	}
}

// fenceWindow is how long after a heartbeat gap a worker keeps checking
// its runs: a reaper that saw the heartbeat gone records the loss
// within its sweep's bound (10 RequestTimeouts).
func fenceWindow(l Layout, ttl time.Duration) time.Duration {
	return ttl + 10*l.RequestTimeout
}

// fence stops the jobs of the runs the fleet settled without this
// worker: a run whose record ended (a reaper recorded it "worker lost"
// while the worker's heartbeat was gone), was given to another worker,
// or was replaced by a new run of its ID. The fleet has told everyone
// such a job ended, so it must not run on. Its end is not recorded
// again (finish finds the record ended), and no second completion is
// queued.
func (w *Worker) fence() {
	w.mu.Lock()
	svs := make([]*served, 0, len(w.jobs))
	for _, sv := range w.jobs {
		svs = append(svs, sv)
	}
	w.mu.Unlock()
	for _, sv := range svs {
		local, _ := sv.local.Load().(bgjob.ID)
		if local == "" || sv.fenced.Load() {
			continue // not started: its start finds the record taken (serve)
		}
		ctx, cancel := context.WithTimeout(w.ctx, w.cfg.RequestTimeout)
		rec, _, found, err := w.s.get(ctx, sv.key)
		cancel()
		if err != nil || !found {
			continue
		}
		if rec.Run == sv.run && rec.Worker == w.cfg.Name && rec.Phase != phaseEnded {
			continue
		}
		if sv.fenced.Swap(true) {
			continue
		}
		w.log.Warn("bgjob/fleet: fenced: the fleet settled this run without the worker; stopping its job",
			"id", sv.id, "local", local, "phase", rec.Phase, "reason", rec.Snap.Reason)
		w.wg.Add(1)
		go func() { // ends with the job, KillGrace at most
			defer w.wg.Done()
			w.reg.Cancel(local)
		}()
	}
}

// take fetches launches while the worker has free slots, and hands each
// to a goroutine of its own (serve).
func (w *Worker) take() {
	defer w.wg.Done()
	backoff := 50 * time.Millisecond
	for w.takeCtx.Err() == nil {
		free := int64(w.cfg.Slots) - w.running.Load()
		if free <= 0 {
			select {
			case <-w.freed:
			case <-w.takeCtx.Done():
			}
			continue
		}
		fctx, cancel := context.WithTimeout(w.takeCtx, 5*time.Second)
		batch, err := w.cons.Fetch(int(free), jetstream.FetchContext(fctx))
		if err == nil {
			for m := range batch.Messages() {
				w.running.Add(1)
				w.wg.Add(1)
				go w.serve(m) // ends when the run's end is recorded, or it is given back
			}
			err = batch.Error()
		}
		cancel()
		if err == nil || errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || w.takeCtx.Err() != nil {
			backoff = 50 * time.Millisecond
			continue
		}
		w.log.Warn("bgjob/fleet: fetch", "worker", w.cfg.Name, "err", err)
		t := time.NewTimer(backoff)
		select {
		case <-t.C:
		case <-w.takeCtx.Done():
			t.Stop()
		}
		if backoff < 2*time.Second {
			backoff *= 2
		}
	}
}

// release frees the slot of a launch.
func (w *Worker) release() {
	w.running.Add(-1)
	select {
	case w.freed <- struct{}{}:
	default:
	}
}

// serve claims a launch, starts its job, and follows it to its end.
func (w *Worker) serve(m jetstream.Msg) {
	defer w.wg.Done()
	defer w.release()
	var l launch
	if err := json.Unmarshal(m.Data(), &l); err != nil || l.ID == "" || l.Run == "" {
		w.log.Warn("bgjob/fleet: bad launch", "subject", m.Subject(), "err", err)
		m.Term()
		return
	}
	token := SessionToken(l.Spec.Session)
	if !strings.HasSuffix(m.Subject(), "."+token) {
		// A launch must be published on its own session's subject, so
		// that subject permissions decide who may launch in a session.
		w.log.Warn("bgjob/fleet: launch on another session's subject", "subject", m.Subject())
		m.Term()
		return
	}
	sv := &served{id: l.ID, run: l.Run, token: token, key: recordKey(token, string(l.ID)), ended: make(chan struct{})}
	ctx := w.ctx
	rec, rev, ok := w.claim(ctx, m, sv)
	if !ok {
		return
	}
	if w.cfg.afterClaim != nil {
		w.cfg.afterClaim()
	}
	w.mu.Lock()
	closing := w.closed
	if !closing {
		w.jobs[l.ID] = sv
	}
	w.mu.Unlock()
	if closing {
		// Give the launch back to the fleet: another worker takes it.
		rec.Phase, rec.Worker = phaseQueued, ""
		if _, err := w.s.cas(ctx, sv.key, rec, rev, 0); err == nil {
			m.Nak()
		} else {
			m.Term()
		}
		return
	}
	defer w.forget(sv)

	var snap bgjob.Snapshot
	var err error
	if sv.cancelled.Load() {
		// A Cancel before the spawn prevents it.
		snap = rec.Snap
		snap.State, snap.ExitCode, snap.Reason, snap.Ended = bgjob.Cancelled, 130, "cancelled before start", time.Now()
		w.finish(sv, snap, "")
		m.Ack()
		w.answer(l.Reply, reply{Snap: &sv.final})
		return
	}
	spec := l.Spec
	spec.Unique = true // the fleet coalesced already; the worker never joins
	w.startingRun()
	snap, err = w.reg.Start(ctx, spec)
	if err != nil {
		w.startedRun(sv, "")
	} else {
		sv.local.Store(snap.ID)
		w.startedRun(sv, snap.ID)
	}
	if errors.Is(err, bgjob.ErrTooManyRunning) {
		// The Registry is busier than the worker's slots say (the host
		// runs jobs of its own): give the launch back for a while.
		rec.Phase, rec.Worker = phaseQueued, ""
		if _, err := w.s.cas(ctx, sv.key, rec, rev, 0); err == nil {
			m.NakWithDelay(time.Second)
		}
		return
	}
	if err != nil {
		// Refused (a bad Spec, the Guard): no job; free the ID.
		w.s.remove(ctx, sv.key, rev)
		m.Ack()
		w.answer(l.Reply, errorReply(err))
		return
	}
	local := snap.ID
	snap = w.fleetSnap(sv, snap)
	for {
		rec.Phase, rec.Local, rec.Snap = phaseRunning, local, snap
		rev, err = w.s.cas(ctx, sv.key, rec, rev, 0)
		if !errors.Is(err, errConflict) {
			break
		}
		// A client changed the record meanwhile (made it pollable, or
		// a reaper found this worker's heartbeat gone): read it again.
		var found bool
		rec, rev, found, err = w.s.get(ctx, sv.key)
		if err != nil || !found || rec.Run != sv.run || rec.Worker != w.cfg.Name || rec.Phase != phaseClaimed {
			err = errConflict
			break
		}
	}
	if err != nil {
		// The fleet no longer holds this run as ours: stop it.
		w.log.Warn("bgjob/fleet: run taken from worker", "id", sv.id, "err", err)
		w.reg.Cancel(local)
		m.Term()
		return
	}
	m.Ack()
	w.answer(l.Reply, reply{Snap: &snap})
	if sv.cancelled.Load() {
		go w.reg.Cancel(local) // a Cancel came during the start; it ends with the job
	}
	w.follow(sv, local, 0)
}

// claim moves the run's record from queued to claimed by this worker. It
// settles the launch message itself when it does not claim.
func (w *Worker) claim(ctx context.Context, m jetstream.Msg, sv *served) (record, uint64, bool) {
	for {
		rec, rev, found, err := w.s.get(ctx, sv.key)
		if err != nil {
			m.Nak() // JetStream hands it out again
			return rec, 0, false
		}
		if !found || rec.Run != sv.run || rec.Phase != phaseQueued {
			m.Term() // withdrawn, replaced, cancelled, or taken: never run twice
			return rec, 0, false
		}
		rec.Phase, rec.Worker, rec.Snap.Reason = phaseClaimed, w.cfg.Name, ""
		rev, err = w.s.cas(ctx, sv.key, rec, rev, 0)
		if errors.Is(err, errConflict) {
			continue
		}
		if err != nil {
			m.Nak()
			return rec, 0, false
		}
		return rec, rev, true
	}
}

// fleetSnap turns a snapshot of the local Registry into the fleet's.
func (w *Worker) fleetSnap(sv *served, s bgjob.Snapshot) bgjob.Snapshot {
	s.ID = sv.id
	s.Joined = false
	return s
}

// answer sends a start reply to a client's inbox, if it gave one.
func (w *Worker) answer(inbox string, r reply) {
	if inbox == "" {
		return
	}
	data, _ := json.Marshal(r)
	w.nc.Publish(inbox, data)
}

// forget drops a served run once it ended.
func (w *Worker) forget(sv *served) {
	w.mu.Lock()
	if w.jobs[sv.id] == sv {
		delete(w.jobs, sv.id)
	}
	w.endedLocked(sv)
	w.mu.Unlock()
}

// readMax is the most a worker reads of a job's output at once, well
// within NATS's default payload limit.
const readMax = 256 << 10

// follow publishes the job's admitted output by offset as it comes, then
// records its end.
// It publishes from offset next on (0, or where an adopted run's last
// published chunk ended). A worker that detaches leaves the run
// unrecorded, for the next worker of its name to adopt.
func (w *Worker) follow(sv *served, local bgjob.ID, next int64) {
	subject := w.cfg.outSubject(sv.token, string(sv.id), sv.run)
	for {
		c, err := w.reg.ReadWait(w.ctx, local, next, readMax)
		if err != nil {
			break
		}
		if c.Data != "" || c.Skipped > 0 {
			// Published one at a time: while a publish waits for its
			// ack, output gathers in the Registry for the next chunk.
			h := nats.Header{}
			h.Set(hdrOffset, strconv.FormatInt(c.Offset, 10))
			h.Set(hdrNext, strconv.FormatInt(c.Next, 10))
			h.Set(hdrSkipped, strconv.FormatInt(c.Skipped, 10))
			msgID := string(sv.id) + "." + sv.run + "." + strconv.FormatInt(c.Offset, 10)
			err := retry(w.ctx, w.cfg.Layout, func(ctx context.Context) error {
				_, err := w.js.PublishMsg(ctx, &nats.Msg{Subject: subject, Header: h, Data: []byte(c.Data)}, jetstream.WithMsgID(msgID))
				return err
			})
			if err != nil && w.ctx.Err() == nil {
				w.log.Warn("bgjob/fleet: publish output", "id", sv.id, "err", err)
			}
		}
		next = c.Next
		if c.Done {
			break
		}
	}
	if w.detached.Load() {
		return
	}
	final, err := w.reg.Wait(w.ctx, local)
	if err != nil && w.detached.Load() {
		return
	}
	if err != nil {
		// Evicted before its end was read (Retention.MaxJobs too low),
		// or the worker is closing with the job still running.
		final = bgjob.Snapshot{Session: "", State: bgjob.Failed, ExitCode: -1, Ended: time.Now(), Reason: "worker: " + err.Error()}
		if s, ok := w.recordSnap(sv); ok {
			final = s
			final.State, final.ExitCode, final.Ended, final.Reason = bgjob.Failed, -1, time.Now(), "worker: "+err.Error()
		}
	}
	w.finish(sv, w.fleetSnap(sv, final), local)
}

// recordSnap returns the snapshot in the run's record.
func (w *Worker) recordSnap(sv *served) (bgjob.Snapshot, bool) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*w.cfg.RequestTimeout)
	defer cancel()
	rec, _, found, err := w.s.get(ctx, sv.key)
	if err != nil || !found || rec.Run != sv.run {
		return bgjob.Snapshot{}, false
	}
	return rec.Snap, true
}

// finish records the run's end: its record becomes ended (unless a
// reaper recorded its loss first) and, if pollable, its completion is
// queued. Then sv.ended closes.
func (w *Worker) finish(sv *served, final bgjob.Snapshot, local bgjob.ID) {
	defer close(sv.ended)
	sv.final = final
	// The end is recorded even while the worker closes: a context of
	// its own, not the worker's.
	ctx, cancel := context.WithTimeout(context.Background(), 10*w.cfg.RequestTimeout)
	defer cancel()
	for {
		rec, rev, found, err := w.s.get(ctx, sv.key)
		if err != nil {
			w.log.Warn("bgjob/fleet: record end", "id", sv.id, "err", err)
			return
		}
		if !found || rec.Run != sv.run || rec.Worker != w.cfg.Name || rec.Phase == phaseEnded {
			return // replaced, or recorded lost by a reaper
		}
		rec.Phase, rec.Snap = phaseEnded, final
		_, err = w.s.cas(ctx, sv.key, rec, rev, w.cfg.Retention)
		if errors.Is(err, errConflict) {
			continue
		}
		if err != nil {
			w.log.Warn("bgjob/fleet: record end", "id", sv.id, "err", err)
			return
		}
		if rec.Pollable {
			if err := w.s.complete(ctx, rec); err != nil {
				w.log.Warn("bgjob/fleet: completion", "id", sv.id, "err", err)
			}
		}
		break
	}
	if local != "" {
		w.reg.Completions(final.Session) // the worker's Registry queues them too: drop them
	}
}

// Output chunk headers.
const (
	hdrOffset  = "Bgjob-Offset"
	hdrNext    = "Bgjob-Next"
	hdrSkipped = "Bgjob-Skipped"
)

// maxWait bounds how long a worker holds a ReadWait request.
const maxWait = 30 * time.Second

// request answers a request from a client; it runs in its own goroutine,
// since ReadWait and Cancel may block.
func (w *Worker) request(m *nats.Msg) {
	w.mu.Lock()
	if w.rpcClosed {
		w.mu.Unlock()
		return
	}
	w.rpcWG.Add(1)
	w.mu.Unlock()
	go func() { // ends with the answer; Close waits for it
		defer w.rpcWG.Done()
		r := w.handle(m)
		data, _ := json.Marshal(r)
		m.Respond(data)
	}()
}

func (w *Worker) handle(m *nats.Msg) reply {
	var req rpcRequest
	if err := json.Unmarshal(m.Data, &req); err != nil {
		return errorReply(fmt.Errorf("bgjob/fleet: request: %w", bgjob.ErrInvalidArgument))
	}
	token := m.Subject[strings.LastIndexByte(m.Subject, '.')+1:]
	w.mu.Lock()
	sv := w.jobs[req.ID]
	w.mu.Unlock()
	// A request on one session's subject never reaches another
	// session's job: it is not found, as an unknown ID.
	if sv == nil || sv.token != token || (req.Run != "" && req.Run != sv.run) {
		return errorReply(fmt.Errorf("bgjob/fleet: %s %s: %w", req.Op, req.ID, bgjob.ErrNotFound))
	}
	local, _ := sv.local.Load().(bgjob.ID)
	if req.Op == "cancel" {
		sv.cancelled.Store(true)
		if local != "" {
			w.reg.Cancel(local)
		}
		select {
		case <-sv.ended:
			s := sv.final
			return reply{Snap: &s}
		case <-w.ctx.Done():
			return errorReply(fmt.Errorf("bgjob/fleet: cancel %s: %w", req.ID, bgjob.ErrClosed))
		}
	}
	if local == "" {
		return errorReply(fmt.Errorf("bgjob/fleet: %s %s: starting: %w", req.Op, req.ID, errStarting))
	}
	switch req.Op {
	case "status":
		s, err := w.reg.Status(local)
		if err != nil {
			return errorReply(err)
		}
		s = w.fleetSnap(sv, s)
		return reply{Snap: &s}
	case "read", "readwait":
		var c bgjob.Chunk
		var err error
		if req.Op == "read" {
			c, err = w.reg.Read(local, req.Offset, req.Max)
		} else {
			wait := min(max(req.Wait, 0), maxWait)
			ctx, cancel := context.WithTimeout(w.ctx, wait)
			c, err = w.reg.ReadWait(ctx, local, req.Offset, req.Max)
			cancel()
			if errors.Is(err, context.DeadlineExceeded) {
				err = nil // nothing yet: the client asks again
			}
		}
		if err != nil {
			return errorReply(err)
		}
		return reply{Chunk: &c}
	case "write":
		wait := min(max(req.Wait, 0), maxWait)
		ctx, cancel := context.WithTimeout(w.ctx, wait)
		n, err := w.reg.Write(ctx, local, req.Data)
		cancel()
		r := reply{N: n}
		if err != nil {
			r = errorReply(err)
			r.N = n
		}
		return r
	case "closeinput":
		if err := w.reg.CloseInput(local); err != nil {
			return errorReply(err)
		}
		return reply{}
	case "resize":
		if err := w.reg.Resize(local, req.Rows, req.Cols); err != nil {
			return errorReply(err)
		}
		return reply{}
	case "screen":
		sc, err := w.reg.Screen(local)
		if err != nil {
			return errorReply(err)
		}
		return reply{Screen: &sc}
	case "watch", "waitfor":
		re, err := regexp.Compile(req.Pattern)
		if err != nil {
			return errorReply(fmt.Errorf("bgjob/fleet: %s %s: pattern: %v: %w", req.Op, req.ID, err, bgjob.ErrInvalidArgument))
		}
		if req.Op == "watch" {
			if err := w.reg.Watch(local, bgjob.Watch{Name: req.Name, Pattern: re, Every: req.Every}); err != nil {
				return errorReply(err)
			}
			return reply{}
		}
		ctx, cancel := context.WithTimeout(w.ctx, min(max(req.Wait, 0), maxWait))
		m, err := w.reg.WaitFor(ctx, local, re, req.Offset)
		cancel()
		var ended *bgjob.EndedError
		switch {
		case errors.As(err, &ended):
			r := errorReply(err)
			s := w.fleetSnap(sv, ended.Snapshot)
			r.Snap = &s
			return r
		case errors.Is(err, context.DeadlineExceeded):
			return reply{} // nothing yet: the client asks again
		case err != nil:
			return errorReply(err)
		}
		m.ID = sv.id
		return reply{Match: &m}
	}
	return errorReply(fmt.Errorf("bgjob/fleet: request %q: %w", req.Op, bgjob.ErrInvalidArgument))
}

// errStarting: the run is claimed and its process not yet started.
var errStarting = errors.New("bgjob/fleet: job starting")

// adopt settles the runs the fleet records as this worker's, left by an
// earlier worker of the same Name (one that died, or detached, before
// its heartbeat expired): a run its Registry still holds (in durable
// mode, replayed from the StateDir) is served again, and its output
// published on from where it was; a run the Registry does not hold, or
// one claimed and not yet started, is recorded lost, as a reaper would
// (at most once; with Rerun, a claimed run goes back to the queue). A
// run the fleet already recorded lost whose job the Registry still runs
// is cancelled there: the fleet has told everyone it ended.
func (w *Worker) adopt(ctx context.Context) error {
	recs, err := w.s.list(ctx, "*.*")
	if err != nil {
		return err
	}
	sessions := map[string]bool{} // of the runs adopted
	defer func() {
		if w.cfg.Matches == nil {
			return
		}
		// Matches the Registry queued before the feed reached this
		// worker (a durable Registry's replay, a job's lines while
		// no worker served it): the relay publishes those of the
		// adopted runs, once (the publication's message ID).
		for session := range sessions {
			for _, m := range w.reg.Matches(session) {
				w.matched(m)
			}
		}
	}()
	for key, rec := range recs {
		if rec.Worker != w.cfg.Name {
			continue
		}
		var snap bgjob.Snapshot
		held := false
		if rec.Local != "" {
			if s, err := w.reg.Status(rec.Local); err == nil {
				snap, held = s, true
			}
		}
		switch {
		case rec.Phase == phaseEnded && held && !snap.State.Done() && rec.Snap.Reason == reasonLost:
			w.wg.Add(1)
			go func() { // ends with the job, KillGrace at most
				defer w.wg.Done()
				w.reg.Cancel(rec.Local)
			}()
		case rec.Phase == phaseRunning && held:
			sv := &served{id: rec.Snap.ID, run: rec.Run, token: key[:strings.IndexByte(key, '.')], key: key, ended: make(chan struct{})}
			sv.local.Store(rec.Local)
			from := w.published(ctx, sv)
			w.mu.Lock()
			w.jobs[sv.id] = sv
			w.byLocal[rec.Local] = sv
			w.mu.Unlock()
			sessions[rec.Snap.Session] = true
			w.running.Add(1)
			w.wg.Add(1)
			go func() { // ends when the run's end is recorded
				defer w.wg.Done()
				defer w.release()
				defer w.forget(sv)
				w.follow(sv, rec.Local, from)
			}()
			w.log.Info("bgjob/fleet: adopted", "id", sv.id, "local", rec.Local, "pid", snap.PID, "from", from)
		case rec.Phase == phaseRunning || rec.Phase == phaseClaimed:
			cur, rev, found, err := w.s.get(ctx, key)
			if err != nil {
				return err
			}
			if found {
				if _, err := w.s.lose(ctx, key, cur, rev); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// published returns where the output the fleet holds of sv's run ends:
// the Next of its last published chunk, or 0.
func (w *Worker) published(ctx context.Context, sv *served) int64 {
	m, err := w.s.lastMsg(ctx, w.cfg.outStream(), w.cfg.outSubject(sv.token, string(sv.id), sv.run))
	if err != nil {
		return 0
	}
	n, err := strconv.ParseInt(m.Header.Get(hdrNext), 10, 64)
	if err != nil {
		return 0
	}
	return n
}

// Detach stops the worker without stopping its jobs, for a restart of
// the host in durable mode: it takes no more launches, stops answering
// requests and publishing output, and leaves its heartbeat to expire.
// Call the Registry's Detach after it. A worker started again with the
// same Name, on a Registry of the same StateDir, within HeartbeatTTL of
// the last heartbeat adopts the jobs (see NewWorker), a job that ended
// meanwhile with its real end; until then, Status shows their records
// and the other requests fail with ErrUnavailable. If none comes back in time, the
// reapers record the jobs lost. Detach waits for every goroutine the
// worker started; it is a no-op after Close or Detach.
func (w *Worker) Detach() error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	w.rpcClosed = true
	w.mu.Unlock()
	w.detached.Store(true)
	w.stopTaking()
	w.sub.Unsubscribe()
	w.letFeedGo()
	w.cancel()
	w.rpcWG.Wait()
	w.wg.Wait()
	w.rp.close()
	return nil
}

// Close stops the worker: it takes no more launches, cancels the jobs it
// runs (their ends are recorded, Cancelled, and their completions
// queued), stops answering requests, and deletes its heartbeat, so that
// no job of it is reported lost. It waits for every goroutine it started.
// If ctx ends first, it stops waiting for the jobs' ends, which a reaper
// then records as lost, and returns ctx.Err() wrapped. Close is
// idempotent; the Registry stays open.
func (w *Worker) Close(ctx context.Context) error {
	w.mu.Lock()
	if w.closed {
		w.mu.Unlock()
		return nil
	}
	w.closed = true
	var svs []*served
	for _, sv := range w.jobs {
		svs = append(svs, sv)
	}
	w.mu.Unlock()
	w.stopTaking()
	var err error
	for _, sv := range svs {
		sv.cancelled.Store(true)
		if local, _ := sv.local.Load().(bgjob.ID); local != "" {
			go w.reg.Cancel(local) // ends with the job, KillGrace at most
		}
	}
	for _, sv := range svs {
		select {
		case <-sv.ended:
		case <-ctx.Done():
			err = fmt.Errorf("bgjob/fleet: close worker: %w", ctx.Err())
		}
		if err != nil {
			break
		}
	}
	w.mu.Lock()
	w.rpcClosed = true
	w.mu.Unlock()
	w.sub.Unsubscribe()
	w.letFeedGo()
	w.cancel()
	w.rpcWG.Wait()
	w.wg.Wait()
	if err == nil {
		dctx, cancel := context.WithTimeout(context.Background(), w.cfg.RequestTimeout)
		w.s.workers.Delete(dctx, "hb."+w.cfg.Name)
		cancel()
	}
	w.rp.close()
	return err
}
