package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/bgjob/bgjob"
	"github.com/modelcontextprotocol/go-sdk/mcp"
)

// Options configure a [Server]. The zero Options are usable.
type Options struct {
	// Jail, if set, is a directory that every job's working directory
	// must lie in once symlinks are resolved. It is also the default
	// working directory. If Jail is empty, any directory is allowed and
	// the default is the host's working directory.
	Jail string

	// MaxRunning limits the jobs running at once across all sessions.
	// If MaxRunning is 0, bgjob's default (64) applies.
	MaxRunning int

	// Queue makes a command beyond MaxRunning wait for a free slot
	// instead of failing (bgjob's Config.Queue): it is "queued", with its
	// place, until a running job ends. A shell call counts the wait
	// against its wait_ms. MaxQueued bounds the queue (0: bgjob's
	// default, 1024); past it a call fails as without a queue.
	Queue     bool
	MaxQueued int

	// StateDir turns on bgjob's durable mode (Linux): jobs are kept on
	// disk and outlive the server. Connections then share one bgjob
	// session (Session, or "default"), so that a restarted server (a new
	// connection) still sees the jobs started before; a connection's
	// end no longer cancels its jobs, and Close lets the running jobs go
	// on (bgjob.Registry.Detach) for the next server to adopt. Where
	// durable mode is unsupported, New fails with an error wrapping
	// bgjob.ErrUnsupported.
	StateDir string

	// Session, if set, is the bgjob session of every connection, instead
	// of one session per connection.
	Session string

	// ProgressInterval is how often a waiting shell call sends a progress
	// notification (when the client asked for them). If it is 0, 1s.
	ProgressInterval time.Duration

	// KillGrace is how long a cancelled job has between SIGTERM and
	// SIGKILL. If it is 0, bgjob's default (2s) applies.
	KillGrace time.Duration

	// HeadBytes and TailBytes bound the output kept per job (the first
	// and the last bytes of its stream), and so the output a tool call
	// can return. If 0, bgjob's defaults (64 KiB and 1 MiB) apply.
	HeadBytes int
	TailBytes int

	// Sandbox runs every job in bgjob's sandbox (bubblewrap on Linux):
	// it may write the jail (Jail, else its own working directory) and a
	// private temp dir, read the rest of the filesystem, and reach no
	// network. New fails, with an error wrapping bgjob.ErrUnsupported,
	// where the sandbox cannot be made.
	Sandbox bool

	// Limits bound what each job may use: memory, live processes, CPU
	// cores and the rest of bgjob.Limits. New fails, with an error
	// wrapping bgjob.ErrUnsupported, if this host cannot enforce them
	// (processes and CPU need a cgroup v2 with those controllers).
	Limits bgjob.Limits

	// Jobs, if set, runs the jobs instead of a Registry of the server's
	// own: a fleet client (github.com/bgjob/bgjob/fleet), whose workers
	// run them on other machines. The server closes it. The options
	// that configure a local registry (Jail, MaxRunning, Queue,
	// MaxQueued, StateDir, KillGrace, HeadBytes, TailBytes, Sandbox,
	// Limits) must then be zero: they are the workers' (see
	// RegistryConfig); New fails naming the first one set.
	Jobs bgjob.Jobs

	// Logger receives the server's own diagnostics, never job output.
	// If Logger is nil, nothing is logged.
	Logger *slog.Logger
}

// Server is an MCP server whose tools run shell commands as bgjob jobs.
//
// Each MCP client connection is one bgjob session: its jobs are invisible
// to every other connection, and they are cancelled when it ends. With
// Options.Session or Options.StateDir set, all connections share one
// session instead and its jobs outlive them. A Server is safe for use by
// many goroutines; [Server.Close] stops it.
type Server struct {
	mcp   *mcp.Server
	reg   bgjob.Jobs // a local Registry, or Options.Jobs
	log   *slog.Logger
	fixed string // Options.Session, or "default" in durable mode: every connection's session
	// durable: Options.StateDir is set; Close detaches instead of stopping jobs.
	durable bool
	// remote: the jobs are Options.Jobs (a fleet), whose completions
	// each connection takes with NextCompletion (forward), and whose
	// matches, if the Jobs has NextMatch (a fleet client does), with
	// NextMatch.
	remote  bool
	matches matchSource // Options.Jobs's NextMatch, or nil
	notify  *notifier
	once    sync.Once // closes notify

	// watchers counts the goroutines that wait for a connection to end
	// (one per Connect); Close waits for them.
	watchers sync.WaitGroup

	// onSessionEnd, if set (by tests), is called when a connection has
	// ended and its jobs have been cancelled.
	onSessionEnd func(session string)

	// ready is closed once reg is set: a hook of the registry (which
	// may run while New adopts jobs) waits for it.
	ready chan struct{}

	mu       sync.Mutex // guards the fields below
	sessions map[*mcp.ServerSession]string
	byID     map[string]*mcp.ServerSession
	// untils maps the name of each until watch (untilPrefix and a random
	// token) to the call that waits for it.
	untils map[string]*untilWait
	closed bool
}

// defaultProgressInterval is short so that clients with a request timeout
// of their own (many reset it on progress) keep waiting for a long command.
const defaultProgressInterval = time.Second

// New returns a Server with its tools registered and its registry
// running. It fails if the registry cannot be created, for example with
// an error wrapping bgjob.ErrUnsupported when StateDir is set.
func New(opts Options) (*Server, error) {
	s := &Server{
		log:      opts.Logger,
		sessions: make(map[*mcp.ServerSession]string),
		byID:     make(map[string]*mcp.ServerSession),
		untils:   make(map[string]*untilWait),
		ready:    make(chan struct{}),
	}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	s.fixed = opts.Session
	if opts.Jobs != nil {
		// The jobs run elsewhere (a fleet's workers): what configures a
		// local registry is the workers' to set.
		if field := localOption(opts); field != "" {
			return nil, fmt.Errorf("Options.%s: configures a local registry; with Options.Jobs set it on the workers", field)
		}
		s.reg, s.remote = opts.Jobs, true
		s.matches, _ = opts.Jobs.(matchSource)
	} else {
		cfg, err := RegistryConfig(opts)
		if err != nil {
			return nil, err
		}
		cfg.Logger = s.log
		cfg.OnComplete = s.completed
		cfg.OnMatch = s.matched
		s.durable = cfg.StateDir != ""
		if s.durable && s.fixed == "" {
			s.fixed = "default"
		}
		// The hooks may run while New adopts jobs: the notifier first,
		// and they wait for ready before they use reg.
		s.notify = newNotifier(s)
		reg, err := bgjob.New(cfg)
		if err != nil {
			s.notify.close()
			return nil, err
		}
		s.reg = reg
	}
	if s.notify == nil {
		s.notify = newNotifier(s)
	}
	close(s.ready)
	s.mcp = mcp.NewServer(&mcp.Implementation{Name: "bgjob-mcpserver", Version: "v0.1.0"}, &mcp.ServerOptions{
		Instructions:              instructions,
		Logger:                    s.log,
		SupportedProtocolVersions: statefulVersions(),
	})
	s.addTools()
	return s, nil
}

// RegistryConfig returns the bgjob.Config of a Registry that runs jobs
// as opts ask, here or on a fleet worker (-worker): the Jail (as Dir and
// a Guard), limits, sandbox, queue and durable mode. Logger, OnComplete
// and OnMatch are the caller's to set.
func RegistryConfig(opts Options) (bgjob.Config, error) {
	cfg := bgjob.Config{
		MaxRunning:       opts.MaxRunning,
		Queue:            opts.Queue,
		MaxQueued:        opts.MaxQueued,
		Limits:           opts.Limits,
		ProgressInterval: opts.ProgressInterval,
		KillGrace:        opts.KillGrace,
		HeadBytes:        opts.HeadBytes,
		TailBytes:        opts.TailBytes,
	}
	if cfg.ProgressInterval == 0 {
		cfg.ProgressInterval = defaultProgressInterval
	}
	if opts.StateDir != "" {
		abs, err := filepath.Abs(opts.StateDir)
		if err != nil {
			return cfg, fmt.Errorf("state dir: %w", err)
		}
		cfg.StateDir = abs
	}
	if opts.Jail != "" {
		jail, err := resolveDir(opts.Jail)
		if err != nil {
			return cfg, fmt.Errorf("jail: %w", err)
		}
		cfg.Dir = jail
		if opts.Sandbox {
			cfg.Sandbox = &bgjob.Sandbox{Writable: []string{jail}}
		}
		cfg.Guard = jailGuard(jail)
	}
	if opts.Sandbox && cfg.Sandbox == nil {
		cfg.Sandbox = &bgjob.Sandbox{} // each job's working directory is writable
	}
	return cfg, nil
}

// localOption names the first option set that configures a local
// registry, or returns "".
func localOption(opts Options) string {
	switch {
	case opts.Jail != "":
		return "Jail"
	case opts.MaxRunning != 0:
		return "MaxRunning"
	case opts.Queue:
		return "Queue"
	case opts.MaxQueued != 0:
		return "MaxQueued"
	case opts.StateDir != "":
		return "StateDir"
	case opts.KillGrace != 0:
		return "KillGrace"
	case opts.HeadBytes != 0:
		return "HeadBytes"
	case opts.TailBytes != 0:
		return "TailBytes"
	case opts.Sandbox:
		return "Sandbox"
	case !opts.Limits.IsZero():
		return "Limits"
	}
	return ""
}

const instructions = `Run shell commands with the shell tool. A command that is still running ` +
	`after wait_ms (default 30s) keeps running in the background and the call returns its job_id ` +
	`with detached: true; follow it with shell_status (incremental output by offset), ` +
	`shell_wait, or shell_cancel. shell_list shows this connection's jobs, and for running ones ` +
	`their processes and the TCP ports they listen on. For a dev server started in the ` +
	`background ("npm run dev &"), pass leftovers: "wait" so that the job runs as long as the server. ` +
	`To start a server or a watcher and go on as soon as it is ready, pass until (a regular expression) ` +
	`to shell or shell_wait: the call returns the first matching line of output at once, the job goes on. ` +
	`shell_watch asks to be told of every later line that matches a pattern. ` +
	`When a detached job ends, and when a watched line appears, the server sends a logging notification ` +
	`(logger "bgjob") if the client has set a logging level.`

// statelessVersion is the first MCP revision without per-connection state
// (SEP-2575): no logging/setLevel, so a server cannot be told that a
// client wants notifications between requests.
const statelessVersion = "2026-07-28"

// statefulVersions are the protocol revisions the server speaks: those
// the SDK supports that keep a connection's state (its log level). Job
// completions are pushed as logging notifications between requests,
// which the stateless revision has no place for; a client that prefers
// it falls back to the initialize handshake.
func statefulVersions() []string {
	var vs []string
	for _, v := range mcp.SupportedProtocolVersions() {
		if v < statelessVersion {
			vs = append(vs, v)
		}
	}
	return vs
}

// resolveDir makes dir absolute and resolves its symlinks.
func resolveDir(dir string) (string, error) {
	abs, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	real, err := filepath.EvalSymlinks(abs)
	if err != nil {
		return "", err
	}
	fi, err := os.Stat(real)
	if err != nil {
		return "", err
	}
	if !fi.IsDir() {
		return "", fmt.Errorf("%s is not a directory", dir)
	}
	return real, nil
}

// errOutsideJail is what the guard refuses a working directory with.
var errOutsideJail = errors.New("working directory is outside the allowed directory")

// jailGuard is the Config.Guard of a jailed server: it refuses a job whose
// working directory, with symlinks resolved, is not the jail or below it.
// Resolving matters: "jail/link" pointing at "/" is lexically inside the
// jail and really outside it.
//
// This jails the starting directory only; the command itself can still
// cd anywhere the server's user may. It is a guard against mistakes, not
// a sandbox.
func jailGuard(jail string) func(context.Context, bgjob.Spec) error {
	return func(_ context.Context, spec bgjob.Spec) error {
		real, err := filepath.EvalSymlinks(spec.Dir)
		if err != nil {
			return fmt.Errorf("resolve working directory: %w", err)
		}
		if !within(jail, real) {
			return errOutsideJail
		}
		return nil
	}
}

// within reports whether path is root or lies below it. Both are clean
// absolute paths.
func within(root, path string) bool {
	rel, err := filepath.Rel(root, path)
	if err != nil {
		return false
	}
	return rel == "." || (rel != ".." && !strings.HasPrefix(rel, ".."+string(filepath.Separator)))
}

// Connect serves one MCP connection over t until the client goes away or
// Close is called. The connection is a bgjob session of its own; when it
// ends, its running jobs are cancelled, since no other connection can
// reach them.
func (s *Server) Connect(ctx context.Context, t mcp.Transport) (*mcp.ServerSession, error) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil, bgjob.ErrClosed
	}
	// Counted under mu so that Close, which sets closed under mu, waits
	// for every watcher that was ever started.
	s.watchers.Add(1)
	s.mu.Unlock()
	ss, err := s.mcp.Connect(ctx, t, nil)
	if err != nil {
		s.watchers.Done()
		return nil, err
	}
	id := s.session(ss)
	go func() { // ends when the connection does; Close closes it
		defer s.watchers.Done()
		var fwd sync.WaitGroup
		fctx, stop := context.WithCancel(context.Background())
		if s.remote {
			fwd.Add(1)
			go func() { // ends when stop is called, below
				defer fwd.Done()
				forward(s, fctx, id, "completions", s.reg.NextCompletion, func(c bgjob.Completion) {
					s.notify.push([]note{{session: c.Session, id: c.ID, data: JobCompleted{Event: "job_completed", Completion: c}}})
				})
			}()
		}
		if s.matches != nil {
			fwd.Add(1)
			go func() { // ends when stop is called, below
				defer fwd.Done()
				forward(s, fctx, id, "matches", s.matches.NextMatch, func(m bgjob.Match) { s.route([]bgjob.Match{m}) })
			}()
		}
		_ = ss.Wait()
		stop()
		fwd.Wait()
		s.endSession(ss)
	}()
	return ss, nil
}

// session returns the bgjob session of an MCP connection: the MCP session
// ID where the transport has one (streamable HTTP), otherwise a random ID
// made on first use (stdio and in-memory connections have none, and two
// of them must still be told apart).
func (s *Server) session(ss *mcp.ServerSession) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	if id, ok := s.sessions[ss]; ok {
		return id
	}
	id := ss.ID()
	if s.fixed != "" {
		id = s.fixed
	} else if id == "" {
		var b [12]byte
		rand.Read(b[:])
		id = "conn_" + hex.EncodeToString(b[:])
	}
	s.sessions[ss] = id
	s.byID[id] = ss // with a fixed session: the latest connection gets its notifications
	return id
}

// endSession forgets a connection and cancels its running jobs.
func (s *Server) endSession(ss *mcp.ServerSession) {
	s.mu.Lock()
	id, ok := s.sessions[ss]
	delete(s.sessions, ss)
	if ok && s.byID[id] == ss {
		delete(s.byID, id)
	}
	shared := s.fixed != ""
	s.mu.Unlock()
	if !ok {
		return
	}
	if shared {
		// Other connections (or the next server) may still use the
		// session's jobs: leave them running.
		if s.onSessionEnd != nil {
			s.onSessionEnd(id)
		}
		return
	}
	var wg sync.WaitGroup
	jobs := s.reg.Session(id)
	for _, snap := range jobs.List() {
		if snap.State.Done() {
			continue
		}
		wg.Add(1)
		go func() { // Cancel blocks up to the kill grace: stop them together
			defer wg.Done()
			_, _ = jobs.Cancel(snap.ID)
		}()
	}
	wg.Wait()
	if s.onSessionEnd != nil {
		s.onSessionEnd(id)
	}
}

// Close ends every connection, stops every running job (in durable mode:
// releases them, running, for the next server to adopt) and waits for all
// the goroutines of the server and its registry. ctx bounds the polite
// stop of the jobs, as in bgjob.Registry.Close.
func (s *Server) Close(ctx context.Context) error {
	s.mu.Lock()
	s.closed = true
	var open []*mcp.ServerSession
	for ss := range s.sessions {
		open = append(open, ss)
	}
	s.mu.Unlock()
	for _, ss := range open {
		_ = ss.Close()
	}
	s.watchers.Wait()
	var err error
	if s.durable {
		// Let running jobs go on for the next server to adopt.
		err = s.reg.Detach()
	} else {
		err = s.reg.Close(ctx)
	}
	// The registry calls OnComplete for the jobs it stops; the notifier
	// drops those, as their connections are gone, and then ends.
	s.once.Do(s.notify.close)
	return err
}

// completed is the registry's OnComplete hook. It runs on a goroutine of
// the registry, which must not block on a slow client, so it only hands
// the session's completions to the notifier. Draining Completions here
// keeps the registry's queue bounded and delivers each completion once.
func (s *Server) completed(c bgjob.Completion) {
	<-s.ready
	var ns []note
	for _, c := range s.reg.Completions(c.Session) {
		ns = append(ns, note{session: c.Session, id: c.ID, data: JobCompleted{Event: "job_completed", Completion: c}})
	}
	s.notify.push(ns)
}

// matchSource is what a fleet client offers beyond bgjob.Jobs for the
// matches of watches: a Registry has Config.OnMatch instead.
type matchSource interface {
	NextMatch(ctx context.Context, session string) (bgjob.Match, error)
}

// forward takes the session's completions (or matches) from remote jobs
// (a fleet has no OnComplete or OnMatch: they wait in the fleet, each
// for one taker) with next and hands each to use, until ctx ends.
func forward[T any](s *Server, ctx context.Context, session, what string, next func(context.Context, string) (T, error), use func(T)) {
	for {
		v, err := next(ctx, session)
		if err == nil {
			use(v)
			continue
		}
		if ctx.Err() != nil || errors.Is(err, bgjob.ErrClosed) {
			return
		}
		s.log.Warn("mcpserver: "+what, "session", session, "err", err)
		t := time.NewTimer(time.Second) // the fleet is unreachable: try again
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return
		}
	}
}

// untilPrefix begins the name of the watch that a shell call with until
// sets on its job; shell_watch refuses names that begin with it.
const untilPrefix = "until:"

// untilWait is a shell call with until, waiting for its job's line.
type untilWait struct {
	found chan bgjob.Match // buffered, 1: the first match
	stop  func()           // lets the call's RunForeground detach
}

// matched is the registry's OnMatch hook. As completed does, it drains
// the session's queue (matches a restarted server found are in it too):
// a match of a shell call's until watch goes to that call, every other
// one to the notifier.
func (s *Server) matched(m bgjob.Match) {
	<-s.ready
	s.route(s.reg.Matches(m.Session))
}

// route hands each match of an until watch to its shell call and the
// others to the notifier.
func (s *Server) route(ms []bgjob.Match) {
	var ns []note
	for _, m := range ms {
		if strings.HasPrefix(m.Watch, untilPrefix) {
			s.mu.Lock()
			u := s.untils[m.Watch]
			s.mu.Unlock()
			if u != nil {
				select {
				case u.found <- m:
				default:
				}
				u.stop()
			}
			continue // a call that has returned already: nobody to tell
		}
		ns = append(ns, note{session: m.Session, id: m.ID, data: JobMatched{Event: "job_matched", Match: m}})
	}
	s.notify.push(ns)
}

// notifier sends completion and match notifications from a goroutine of
// its own, so that a client that does not read its input never stalls the
// registry.
type notifier struct {
	s    *Server
	wake chan struct{} // buffered, 1
	quit chan struct{} // closed by close
	done chan struct{} // closed when the goroutine ends

	mu    sync.Mutex // guards queue
	queue []note
}

// note is a notification waiting to be sent to its session's connection.
type note struct {
	session string
	id      bgjob.ID
	data    any // JobCompleted or JobMatched
}

// maxQueued bounds the notifications waiting to be sent; beyond it the
// oldest are dropped (and logged). Clients can always poll shell_list.
const maxQueued = 1024

// notifyTimeout bounds one notification write to a client.
const notifyTimeout = 5 * time.Second

func newNotifier(s *Server) *notifier {
	n := &notifier{s: s, wake: make(chan struct{}, 1), quit: make(chan struct{}), done: make(chan struct{})}
	go n.run() // ends when close is called
	return n
}

func (n *notifier) push(ns []note) {
	if len(ns) == 0 {
		return
	}
	n.mu.Lock()
	n.queue = append(n.queue, ns...)
	if d := len(n.queue) - maxQueued; d > 0 {
		n.s.log.Warn("mcpserver: dropping notifications", "count", d)
		n.queue = append(n.queue[:0], n.queue[d:]...)
	}
	n.mu.Unlock()
	select {
	case n.wake <- struct{}{}:
	default:
	}
}

func (n *notifier) run() {
	defer close(n.done)
	for {
		select {
		case <-n.quit:
			return
		case <-n.wake:
		}
		n.mu.Lock()
		q := n.queue
		n.queue = nil
		n.mu.Unlock()
		for _, c := range q {
			n.send(c)
		}
	}
}

// send tells the owning connection, if it is still there, that a job
// ended or printed a watched line, as a logging notification at level
// "notice" from logger "bgjob". The SDK sends it only if the client has
// set a logging level at or below notice (logging/setLevel), as the MCP
// spec intends.
func (n *notifier) send(c note) {
	n.s.mu.Lock()
	ss := n.s.byID[c.session]
	n.s.mu.Unlock()
	if ss == nil {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), notifyTimeout)
	defer cancel()
	err := ss.Log(ctx, &mcp.LoggingMessageParams{Logger: "bgjob", Level: "notice", Data: c.data})
	if err != nil {
		n.s.log.Debug("mcpserver: notification", "id", c.id, "err", err)
	}
}

func (n *notifier) close() {
	close(n.quit)
	<-n.done
}

// JobCompleted is the data of the logging notification sent when a
// detached or background job ends: bgjob's Completion as it marshals
// (job_id, session, command, state, exit_code, and ended in RFC 3339),
// with an event name.
type JobCompleted struct {
	Event string `json:"event"` // always "job_completed"
	bgjob.Completion
}

// JobMatched is the data of the logging notification sent for each line
// that a watch set with shell_watch matches: bgjob's Match as it marshals
// (job_id, session, watch, offset, line, withheld, at), with an event
// name.
type JobMatched struct {
	Event string `json:"event"` // always "job_matched"
	bgjob.Match
}
