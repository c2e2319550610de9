package fleet

import (
	"context"
	"encoding/base32"
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/nats-io/nats.go/jetstream"
)

// Layout says where a fleet lives in NATS. Every client and worker of one
// fleet must use the same Prefix and Replicas; Pool picks the workers
// that take a client's launches.
type Layout struct {
	// Prefix is the first token of every subject and the start of every
	// stream and bucket name of the fleet (see the package doc). If
	// Prefix is empty, it is "bgjob". It may hold letters, digits, '-'
	// and '_'.
	Prefix string

	// Pool names the work queue a client launches into and a worker
	// takes launches from. If Pool is empty, it is "default". It may
	// hold letters, digits, '-' and '_'.
	Pool string

	// Replicas is the number of copies JetStream keeps of every stream
	// and bucket. If Replicas is 0, it is 1, for a single server; a
	// cluster of three should use 3, so that losing one server loses
	// nothing. It applies when the fleet's streams are first made.
	Replicas int

	// RequestTimeout bounds each request to NATS (a key-value write, a
	// request to a worker). If RequestTimeout is 0, it is 5s.
	RequestTimeout time.Duration

	// Retention is how long an ended job's record and output are kept.
	// If Retention is 0, it is 1 hour. Completions are kept for a day
	// or until they are delivered.
	Retention time.Duration

	// OutputBytes bounds the output stream of the whole fleet (each
	// replica's disk): past it, the oldest chunks go. If OutputBytes is
	// 0, it is 1 GiB. Each job keeps at most its last 1,024 chunks of at
	// most 256 KiB. It applies when the stream is first made.
	OutputBytes int64
}

var nameRE = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// normalize fills in the zero fields and checks the names.
func (l Layout) normalize() (Layout, error) {
	if l.Prefix == "" {
		l.Prefix = "bgjob"
	}
	if l.Pool == "" {
		l.Pool = "default"
	}
	if !nameRE.MatchString(l.Prefix) {
		return l, fmt.Errorf("bgjob/fleet: Layout.Prefix %q: want letters, digits, '-' or '_': %w", l.Prefix, errInvalidConfig)
	}
	if !nameRE.MatchString(l.Pool) {
		return l, fmt.Errorf("bgjob/fleet: Layout.Pool %q: want letters, digits, '-' or '_': %w", l.Pool, errInvalidConfig)
	}
	if l.Replicas == 0 {
		l.Replicas = 1
	}
	if l.Replicas < 0 || l.Replicas > 5 {
		return l, fmt.Errorf("bgjob/fleet: Layout.Replicas %d: want 1 to 5: %w", l.Replicas, errInvalidConfig)
	}
	if l.RequestTimeout <= 0 {
		l.RequestTimeout = 5 * time.Second
	}
	if l.Retention <= 0 {
		l.Retention = time.Hour
	}
	if l.OutputBytes <= 0 {
		l.OutputBytes = 1 << 30
	}
	return l, nil
}

var errInvalidConfig = errors.New("invalid config")

// The fleet's streams, buckets and subjects, all derived from the prefix
// (P below) and, for launches, the pool:
//
//	P_launch   stream, work queue    P.launch.POOL.SESSION       a launch, taken by one worker
//	P_jobs     bucket                SESSION.ID                  the job's record (state, worker, snapshot)
//	P_workers  bucket                hb.WORKER, config.idkey     heartbeats (per-message TTL), the shared ID key
//	P_out      stream                P.out.SESSION.ID.RUN        admitted output chunks by offset
//	P_done     stream, work queue    P.done.SESSION              completions, each taken once
//	P_match    stream, work queue    P.match.SESSION             matches of watches, each taken once
//	           core request-reply    P.rpc.WORKER.SESSION        Status, Read, ReadWait, Cancel at the job's worker
func (l Layout) launchStream() string  { return l.Prefix + "_launch" }
func (l Layout) jobsBucket() string    { return l.Prefix + "_jobs" }
func (l Layout) workersBucket() string { return l.Prefix + "_workers" }
func (l Layout) outStream() string     { return l.Prefix + "_out" }
func (l Layout) doneStream() string    { return l.Prefix + "_done" }
func (l Layout) matchStream() string   { return l.Prefix + "_match" }

func (l Layout) launchSubject(token string) string {
	return l.Prefix + ".launch." + l.Pool + "." + token
}
func (l Layout) outSubject(token string, id string, run string) string {
	return l.Prefix + ".out." + token + "." + id + "." + run
}
func (l Layout) doneSubject(token string) string  { return l.Prefix + ".done." + token }
func (l Layout) matchSubject(token string) string { return l.Prefix + ".match." + token }
func (l Layout) rpcSubject(worker, token string) string {
	return l.Prefix + ".rpc." + worker + "." + token
}
func (l Layout) poolConsumer() string { return "pool-" + l.Pool }

// recordKey is the key of a job's record in the jobs bucket.
func recordKey(token, id string) string { return token + "." + id }

// sessionEncoding encodes session names that are not plain tokens.
var sessionEncoding = base32.HexEncoding.WithPadding(base32.NoPadding)

// SessionToken returns the subject token that stands for a session in
// every subject and key of the fleet: the name itself when it is 1 to 64
// letters, digits, '-' or '_'; otherwise '=' followed by the base32hex
// of its bytes ("=" alone for the empty session). The mapping is
// one-to-one, so NATS permissions on a session's subjects (see the
// package doc) give exactly that session's jobs.
func SessionToken(session string) string {
	if nameRE.MatchString(session) {
		return session
	}
	return "=" + sessionEncoding.EncodeToString([]byte(session))
}

// provision makes the fleet's streams and buckets if they are missing. It
// never changes one that exists, so that a client with other settings
// cannot reconfigure a running fleet.
func provision(ctx context.Context, js jetstream.JetStream, l Layout) error {
	streams := []jetstream.StreamConfig{
		{
			Name:      l.launchStream(),
			Subjects:  []string{l.Prefix + ".launch.>"},
			Retention: jetstream.WorkQueuePolicy,
			Replicas:  l.Replicas,
			MaxAge:    24 * time.Hour,
		},
		{
			Name:              l.outStream(),
			Subjects:          []string{l.Prefix + ".out.>"},
			Replicas:          l.Replicas,
			MaxAge:            l.Retention,
			MaxMsgsPerSubject: 1024,
			MaxBytes:          l.OutputBytes,
			Discard:           jetstream.DiscardOld,
			// No direct gets: a replica may answer one before it has
			// a chunk its leader acknowledged, and a read of an ended
			// job would miss its last output.
			AllowDirect: false,
		},
		{
			Name:      l.doneStream(),
			Subjects:  []string{l.Prefix + ".done.>"},
			Retention: jetstream.WorkQueuePolicy,
			Replicas:  l.Replicas,
			MaxAge:    24 * time.Hour,
		},
		{
			// Made by a fleet of an older version too: provision
			// adds a missing stream to an existing fleet.
			Name:      l.matchStream(),
			Subjects:  []string{l.Prefix + ".match.>"},
			Retention: jetstream.WorkQueuePolicy,
			Replicas:  l.Replicas,
			MaxAge:    24 * time.Hour,
			// A watch with Every on a chatty job: a session's
			// undelivered matches are bounded, the oldest go.
			MaxMsgsPerSubject: maxQueuedMatches,
			Discard:           jetstream.DiscardOld,
		},
	}
	for _, cfg := range streams {
		if _, err := js.Stream(ctx, cfg.Name); err == nil {
			continue
		} else if !errors.Is(err, jetstream.ErrStreamNotFound) {
			return fmt.Errorf("bgjob/fleet: stream %s: %w", cfg.Name, err)
		}
		if _, err := js.CreateStream(ctx, cfg); err != nil && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("bgjob/fleet: create stream %s: %w", cfg.Name, err)
		}
	}
	buckets := []jetstream.KeyValueConfig{
		{Bucket: l.jobsBucket(), Replicas: l.Replicas, LimitMarkerTTL: time.Minute},
		{Bucket: l.workersBucket(), Replicas: l.Replicas, LimitMarkerTTL: time.Minute},
	}
	for _, cfg := range buckets {
		if _, err := js.KeyValue(ctx, cfg.Bucket); err == nil {
			continue
		} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
			return fmt.Errorf("bgjob/fleet: bucket %s: %w", cfg.Bucket, err)
		}
		if _, err := js.CreateKeyValue(ctx, cfg); err != nil && !errors.Is(err, jetstream.ErrBucketExists) && !errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			return fmt.Errorf("bgjob/fleet: create bucket %s: %w", cfg.Bucket, err)
		}
	}
	return nil
}
