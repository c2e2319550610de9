package bgjob

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
	"unicode/utf8"

	"github.com/zeebo/blake3"
)

// Durable mode keeps, under Config.StateDir:
//
//	idkey                       the ID key, when Config.IDKey is nil
//	sessions/SESSION/ID.GEN/    one folder per run of a job; SESSION is a
//	    record.json             keyed hash of the session, never its name
//	    output                  the job's stdout and stderr, written by it
//	    exit                    the shell's status, written by the wrapper
//	    input                   an interactive job's stdin: a FIFO (durable_io_linux.go)
//	    queued                  a queued job's environment and stdin, until it starts
//	quarantine/                 run folders whose record could not be read
//
// Folders are 0700 and files 0600.
const (
	recordFile    = "record.json"
	outputFile    = "output"
	inputFile     = "input" // an interactive job's FIFO
	markerFile    = "exit"
	queuedFile    = "queued" // a queued job's environment and stdin, until it starts
	idKeyFile     = "idkey"
	lockFile      = "lock"
	sessionsDir   = "sessions"
	quarantineDir = "quarantine"
	recordVersion = 1
	stateStarting = "starting"
)

// keeperWait bounds how long New waits, in all, for the keepers of jobs
// that ended while no host watched them to copy the last of their output
// (see awaitKeeper). A keeper has at most a pipe's worth left once the
// job's processes are gone, so only a keeper that is stopped or starved
// of CPU outlives it; the job's text may then end early, and says so.
const keeperWait = 2 * time.Second

// noticeKeeperBehind is the Output.Notice of a replayed job whose keeper
// had not finished (see keeperWait).
const noticeKeeperBehind = "output may end early: it was still being copied to disk when the job was replayed"

var (
	errGone         = errors.New("bgjob: process gone")
	errNoMarker     = errors.New("bgjob: no exit marker")
	errMarkerUnread = errors.New("exit marker unreadable")
	errReleased     = errors.New("bgjob: released by Detach")
)

// record is what a run folder's record.json holds. It never holds the
// job's environment or stdin, which may carry secrets.
type record struct {
	Version     int           `json:"version"`
	ID          ID            `json:"id"`
	Gen         uint64        `json:"gen"`
	Session     rawText       `json:"session"`
	Command     rawText       `json:"command"`
	Args        []rawText     `json:"args,omitempty"` // Spec.Args; Command then holds them quoted
	Dir         rawText       `json:"dir"`
	Timeout     time.Duration `json:"timeout_ns"`
	IdleTimeout time.Duration `json:"idle_timeout_ns"`
	// State is "starting" until the process exists, then a State's
	// String.
	State    string `json:"state"`
	ExitCode int    `json:"exit_code"`
	PID      int    `json:"pid,omitempty"`
	// StartTime is the process's start time, field 22 of /proc/PID/stat,
	// in clock ticks after the boot named by BootID: with the PID it
	// names the process, so a reused PID is never taken for the job.
	StartTime uint64 `json:"start_time,omitempty"`
	BootID    string `json:"boot_id,omitempty"`
	// Cgroup is the folder of the job's cgroup, if it has one; Marker
	// the entry in its environment that marks its processes, if not.
	Cgroup rawText `json:"cgroup,omitempty"`
	Marker string  `json:"marker,omitempty"`
	// CgroupCPUBase is the CPU time (user, system; microseconds) that
	// the cgroup had counted when the job got it, which the job's usage
	// leaves out.
	CgroupCPUBase [2]int64 `json:"cgroup_cpu_base_us,omitzero"`
	// Limits are the job's effective limits; Usage, once it ended, what
	// it used; Category how it ended ("limit" when a limit stopped it).
	Limits   *Limits `json:"limits,omitempty"`
	Usage    *Usage  `json:"usage,omitempty"`
	Category string  `json:"category,omitempty"`
	// KeeperPID and KeeperStart name the job's keeper (see
	// durable_io_linux.go), which copies its output to the file once
	// no host does.
	KeeperPID   int    `json:"keeper_pid,omitempty"`
	KeeperStart uint64 `json:"keeper_start,omitempty"`
	// Interactive: the job reads the run folder's FIFO (inputFile),
	// held open by the holder HolderPID (started at HolderStart) until
	// CloseInput, which sets InputClosed.
	Interactive bool      `json:"interactive,omitempty"`
	HolderPID   int       `json:"holder_pid,omitempty"`
	HolderStart uint64    `json:"holder_start,omitempty"`
	InputClosed bool      `json:"input_closed,omitempty"`
	Started     time.Time `json:"started"`
	Ended       time.Time `json:"ended,omitzero"`
	Reason      rawText   `json:"reason,omitempty"`
	Notice      string    `json:"notice,omitempty"` // about leftovers stopped
	// Leftovers is the job's Spec.Leftovers; Priority its Spec.Priority
	// and Sandbox its sandbox as resolved, which a queued job needs to
	// start after a restart. A queued job's environment and stdin are
	// in its input file, never here.
	Leftovers Leftovers `json:"leftovers,omitempty"`
	Priority  int       `json:"priority,omitempty"`
	Sandbox   *Sandbox  `json:"sandbox,omitempty"`
	// Stop is why the host began to stop the running job (a Cancel,
	// a timeout, Close), written before its first signal: if the host
	// dies before the end, the replay reports this end and not the
	// signal's exit status (or "lost", after SIGKILL), and a Registry
	// that adopts the job goes on stopping it.
	Stop *stopRecord `json:"stop,omitempty"`
	// Pollable: the job's end owes a completion.
	Pollable bool `json:"pollable"`
	// Evicted: retention dropped the job while its completion was still
	// undelivered; the folder stays until it is delivered.
	Evicted             bool `json:"evicted,omitempty"`
	CompletionDelivered bool `json:"completion_delivered"`

	// Watches are the job's watches: Spec.Watches, then those that
	// Registry.Watch added. Scanned is how far the job's output was
	// matched against them: every line before it (every piece, with
	// ScannedCut, when it is a piece's start); a later host matches the
	// output file from there on, and its holes never reach past it.
	// Matches are the matches queued and not yet delivered, with their
	// admitted lines; MatchSeq numbers the job's last match.
	Watches     []recWatch `json:"watches,omitempty"`
	Scanned     int64      `json:"scanned,omitempty"`
	ScannedCut  bool       `json:"scanned_cut,omitempty"`
	ScannedSkip bool       `json:"scanned_skip,omitempty"` // Scanned is inside a line: skip to its end
	Matches     []recMatch `json:"matches,omitempty"`
	MatchSeq    uint64     `json:"match_seq,omitempty"`
}

// recWatch is a watch in a record. Last is the offset of its last match
// (-1: none), so that a host that matches the output again skips what
// was matched before, and a watch without Every that matched is done.
type recWatch struct {
	Name    rawText `json:"name"`
	Pattern rawText `json:"pattern"`
	Every   bool    `json:"every,omitempty"`
	From    int64   `json:"from,omitempty"`
	Last    int64   `json:"last"`
}

// recMatch is an undelivered match in a record.
type recMatch struct {
	Seq      uint64    `json:"seq"`
	Watch    rawText   `json:"watch"`
	Offset   int64     `json:"offset"`
	Line     rawText   `json:"line,omitempty"`
	Withheld bool      `json:"withheld,omitempty"`
	At       time.Time `json:"at"`
}

// stopRecord is a record's account of a stop under way: the end it
// gives the job.
type stopRecord struct {
	State    string  `json:"state"`
	ExitCode int     `json:"exit_code"`
	Reason   rawText `json:"reason"`
}

func (s *stopRecord) outcome() outcome {
	return outcome{state: parseState(s.State), exitCode: s.ExitCode, reason: string(s.Reason)}
}

// rawText is a string that a record keeps byte for byte: in JSON it is a
// string when it is valid UTF-8, and {"base64": "..."} when it is not,
// since a JSON string cannot hold invalid UTF-8 (it would come back with
// U+FFFD in place of each bad byte).
type rawText string

func (t rawText) MarshalJSON() ([]byte, error) {
	if utf8.ValidString(string(t)) {
		return json.Marshal(string(t))
	}
	return json.Marshal(struct {
		Base64 []byte `json:"base64"`
	}{[]byte(t)})
}

func (t *rawText) UnmarshalJSON(b []byte) error {
	if len(b) > 0 && b[0] == '{' {
		var v struct {
			Base64 []byte `json:"base64"`
		}
		if err := json.Unmarshal(b, &v); err != nil {
			return err
		}
		*t = rawText(v.Base64)
		return nil
	}
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return err
	}
	*t = rawText(s)
	return nil
}

// rawTexts and strs convert Spec.Args to a record's and back; nil stays
// nil.
func rawTexts(ss []string) []rawText {
	if ss == nil {
		return nil
	}
	out := make([]rawText, len(ss))
	for i, s := range ss {
		out[i] = rawText(s)
	}
	return out
}

func strs(ts []rawText) []string {
	if ts == nil {
		return nil
	}
	out := make([]string, len(ts))
	for i, t := range ts {
		out[i] = string(t)
	}
	return out
}

// store is a Registry's state directory: durable mode's journal.
type store struct {
	// Set by openStore and never written again.
	dir  string
	lock *os.File // StateDir/lock, held (flock) until close
	// The lifeline: only the host holds lifeW, so it closes when the
	// host closes it (close) or dies. The jobs' keepers hold lifeR and
	// take the jobs' output over then.
	lifeR, lifeW *os.File
	watch        *fileWatch // the inotify of adopted jobs' output files, made by restore if needed
	key          [32]byte   // keys the session folder names
	boot         string     // this boot of the machine (see bootID)
	lim          readLimits
	log          *slog.Logger

	mu sync.Mutex // guards runs and trash; a leaf: nothing is taken while it is held
	// runs maps each job the journal keeps to its run folder's record.
	// A job is added by launching or restore and removed once its
	// folder is gone.
	runs map[*job]*runRec
	// trash holds the jobs forgotten by the registry since the last
	// purge: forgottenLocked appends, purge takes them all.
	trash []*job
}

// runRec is the record of one run of a job, in its run folder.
type runRec struct {
	dir string // the run folder, StateDir/sessions/SESSION/ID.GEN

	// mu guards rec and gone. It is taken before Registry.mu, never
	// after, since record writes do I/O: ending holds it across the
	// registry's table update.
	mu   sync.Mutex
	rec  record // the record as last written, or about to be
	gone bool   // the folder was removed: write nothing more
	// err is why the record of a queued job could not be written; its
	// launching fails with it.
	err error
}

// queuedInput is what a queued job's input file (queuedFile) holds: what its start needs
// and its record must not hold, since it may carry secrets. The file goes
// when the job starts or ends.
type queuedInput struct {
	Env   [][2]rawText `json:"env,omitempty"` // Spec.Env, sorted by key
	Stdin rawText      `json:"stdin,omitempty"`
	// Unique, with the rest of the record, is the job's Spec as it was
	// launched.
	Unique bool `json:"unique,omitempty"`
}

// openStore creates the state directory's layout if needed and returns
// the store and the ID key: Config.IDKey if set, else the persisted one
// (made on first use), so IDs stay stable across restarts.
func openStore(c *Config) (*store, []byte, error) {
	if err := durableCheck(); err != nil {
		return nil, nil, fmt.Errorf("bgjob: new: Config.StateDir: %w", err)
	}
	st := &store{dir: c.StateDir, log: c.Logger, runs: make(map[*job]*runRec)}
	for _, d := range []string{st.dir, filepath.Join(st.dir, sessionsDir)} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return nil, nil, fmt.Errorf("bgjob: new: Config.StateDir: %w", err)
		}
	}
	// One Registry at a time: a second one would share the run folders,
	// adopt the same jobs and deliver their completions twice. The lock
	// is the kernel's (flock), so a host that dies lets go of it.
	lock, err := lockStateDir(st.dir)
	if err != nil {
		return nil, nil, fmt.Errorf("bgjob: new: Config.StateDir %s: %w", st.dir, err)
	}
	st.lock = lock
	ok := false
	defer func() {
		if !ok {
			unlockStateDir(lock)
		}
	}()
	// The boot's name dates every running record: one that cannot be
	// read now (no descriptor left) must fail New, or replay would take
	// every running job for one of an earlier boot and record it lost.
	if st.boot, err = bootID(); err != nil {
		return nil, nil, fmt.Errorf("bgjob: new: boot ID: %w", err)
	}
	// Children of this process that earlier Registries released and
	// that have exited since: reaped now (see noteReleased).
	reapReleased()
	if st.lifeR, st.lifeW, err = os.Pipe(); err != nil {
		return nil, nil, fmt.Errorf("bgjob: new: lifeline: %w", err)
	}
	defer func() {
		if !ok {
			st.lifeR.Close()
			st.lifeW.Close()
		}
	}()
	key := c.IDKey
	if key == nil {
		var err error
		if key, err = st.idKey(); err != nil {
			return nil, nil, fmt.Errorf("bgjob: new: Config.StateDir: id key: %w", err)
		}
	}
	blake3.DeriveKey("github.com/bgjob/bgjob 2026-11 session folder key", key, st.key[:])
	keep := (int64(c.HeadBytes) + lineSlack + 4095) &^ 4095
	st.lim = readLimits{keep: keep, tail: int64(c.TailBytes) + 2*lineSlack, max: c.MaxOutputBytes}
	ok = true
	return st, key, nil
}

// relock makes sure the store may write: while the registry runs it holds
// the lock; after close (a Completions call on a closed registry records
// a delivery) it takes the lock again for the write, unless another
// Registry holds it now, which then owns the records: nothing is written.
//
// The writes after close take the lock one at a time (relocking), in the
// whole process: two at once would find the lock held, by this very
// process, and the second would be refused as if another Registry owned
// the records, leaving a delivery unrecorded (TestStressDurable saw a
// completion delivered twice so).
func (st *store) relock() (unlock func(), ok bool) {
	st.mu.Lock()
	held := st.lock != nil
	st.mu.Unlock()
	if held {
		return func() {}, true
	}
	relocking.Lock()
	l, err := lockStateDir(st.dir)
	if err != nil {
		relocking.Unlock()
		st.log.Warn("bgjob: record not written after Close", "err", err)
		return nil, false
	}
	return func() {
		unlockStateDir(l)
		relocking.Unlock()
	}, true
}

// relocking serializes relock's takings of a lock; see there. A record
// lock (runRec.mu) may be held when it is taken, never the reverse.
var relocking sync.Mutex

// close lets go of the state directory, once the registry has ended: the
// next New on it may proceed.
func (st *store) close() {
	st.mu.Lock()
	lock := st.lock
	st.lock = nil
	st.mu.Unlock()
	if lock == nil {
		return // closed already
	}
	// The keepers of released jobs take their output over now.
	st.lifeW.Close()
	st.lifeR.Close()
	if st.watch != nil {
		st.watch.close()
	}
	unlockStateDir(lock)
	reapReleased()
}

// idKey reads the persisted ID key, or makes and persists one.
func (st *store) idKey() ([]byte, error) {
	name := filepath.Join(st.dir, idKeyFile)
	b, err := os.ReadFile(name)
	if err == nil {
		if len(b) < 16 {
			return nil, fmt.Errorf("%s: %d bytes; at least 16 are needed", name, len(b))
		}
		return b, nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	key := make([]byte, 32)
	rand.Read(key)
	if err := writeFileSync(st.dir, idKeyFile, key); err != nil {
		return nil, err
	}
	return key, nil
}

// sessionDir returns the folder of a session's runs, named by a keyed
// hash so that the state directory never shows a session's name.
func (st *store) sessionDir(session string) string {
	h, _ := blake3.NewKeyed(st.key[:])
	h.WriteString(session)
	var sum [16]byte
	h.Digest().Read(sum[:])
	return filepath.Join(st.dir, sessionsDir, hex.EncodeToString(sum[:]))
}

// writeFileSync writes name in dir durably: a temporary file, fsync,
// rename, fsync of the folder. The temporary file is not truncated before
// the write, so blocks reserved in it (see reserveSpare) are used.
func writeFileSync(dir, name string, data []byte) error {
	tmp := filepath.Join(dir, name+".tmp")
	f, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE, 0o600)
	if err != nil {
		return err
	}
	_, err = f.Write(data)
	if err == nil {
		err = f.Truncate(int64(len(data)))
	}
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, filepath.Join(dir, name))
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(dir)
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// writeLocked writes the record, and reports whether it did; rr.mu must
// be held.
func (st *store) writeLocked(rr *runRec) bool {
	if rr.gone {
		return false
	}
	unlock, ok := st.relock()
	if !ok {
		return false
	}
	defer unlock()
	b, err := json.Marshal(&rr.rec)
	if err == nil {
		err = writeFileSync(rr.dir, recordFile, b)
	}
	if err != nil {
		st.log.Warn("bgjob: write record", "id", rr.rec.ID, "err", err)
		return false
	}
	// Keep room for the next update (its end, its delivery), taken as the
	// rename frees the old record's, so it can be written on a full disk.
	reserveSpare(filepath.Join(rr.dir, recordFile+".tmp"), int64(len(b))+1024)
	return true
}

// errUnreadable marks a record that cannot be read or is corrupt (and is
// then quarantined), as opposed to one that could not be read now (no
// descriptor left, say), which fails New instead.
var errUnreadable = errors.New("unreadable record")

// readRecord reads and checks a run folder's record, which must name the
// folder's job and generation.
func readRecord(run string) (*record, error) {
	b, err := os.ReadFile(filepath.Join(run, recordFile))
	if errors.Is(err, os.ErrNotExist) || errors.Is(err, syscall.EISDIR) {
		return nil, fmt.Errorf("%w: %w", errUnreadable, err)
	}
	if err != nil {
		return nil, err
	}
	rec, err := decodeRecord(b)
	if err != nil {
		return nil, fmt.Errorf("%w: %w", errUnreadable, err)
	}
	if filepath.Base(run) != string(rec.ID)+"."+strconv.FormatUint(rec.Gen, 10) {
		return nil, fmt.Errorf("%w: record of %s.%d in folder %s", errUnreadable, rec.ID, rec.Gen, filepath.Base(run))
	}
	return rec, nil
}

// decodeRecord parses a record and checks what replay relies on.
func decodeRecord(b []byte) (*record, error) {
	var rec record
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, err
	}
	switch {
	case rec.Version != recordVersion:
		return nil, fmt.Errorf("record version %d; want %d", rec.Version, recordVersion)
	case !strings.HasPrefix(string(rec.ID), "job_"):
		return nil, fmt.Errorf("record ID %q", rec.ID)
	case rec.Gen == 0 || rec.Gen > 1<<62:
		// Replay continues the generations after the largest it finds.
		return nil, fmt.Errorf("record generation %d", rec.Gen)
	case rec.State != stateStarting && parseState(rec.State) < 0:
		return nil, fmt.Errorf("record state %q", rec.State)
	case rec.Stop != nil && parseState(rec.Stop.State) <= Running:
		return nil, fmt.Errorf("record stop state %q", rec.Stop.State)
	}
	if len(rec.Args) == 0 {
		rec.Args = nil // "args": [] is no Args, as an omitted field is
	}
	return &rec, nil
}

func parseState(s string) State {
	for i, n := range stateNames {
		if n == s {
			return State(i)
		}
	}
	return -1
}

// readMarker reads the exit code the wrapper shell left in run: ok is
// false if there is none (or it is not a number), and err says that it
// could not be read now.
func readMarker(run string) (code int, ok bool, err error) {
	b, err := os.ReadFile(filepath.Join(run, markerFile))
	if errors.Is(err, os.ErrNotExist) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, err
	}
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	return n, err == nil, nil
}

// get returns j's record, or nil if the journal keeps none for it.
func (st *store) get(j *job) *runRec {
	st.mu.Lock()
	defer st.mu.Unlock()
	return st.runs[j]
}

// launching makes j's run folder and writes its record, state
// "starting", before the process exists. On failure it leaves no
// half-made folder for the next replay to quarantine.
func (st *store) launching(j *job) error {
	if rr := st.get(j); rr != nil {
		return st.dequeued(j, rr)
	}
	rr := st.newRun(j, stateStarting)
	if err := st.makeRun(j, rr); err != nil {
		return err
	}
	st.mu.Lock()
	st.runs[j] = rr
	st.mu.Unlock()
	return nil
}

// newRun returns the run record of j, a new run, in the given state.
func (st *store) newRun(j *job, state string) *runRec {
	rr := &runRec{dir: filepath.Join(st.sessionDir(j.spec.Session), string(j.id)+"."+strconv.FormatUint(j.gen, 10))}
	rr.rec = record{
		Version: recordVersion, ID: j.id, Gen: j.gen, Session: rawText(j.spec.Session),
		Command: rawText(j.spec.Command), Args: rawTexts(j.spec.Args), Dir: rawText(j.spec.Dir), Timeout: j.timeout, IdleTimeout: j.spec.IdleTimeout,
		State: state, ExitCode: exitUnknown, Started: j.started, Pollable: true,
		Leftovers: j.spec.Leftovers, Priority: j.spec.Priority, Sandbox: j.spec.Sandbox,
		Interactive: j.spec.Interactive,
	}
	if !j.limits.IsZero() {
		l := j.limits
		rr.rec.Limits = &l
	}
	for _, w := range j.spec.Watches {
		rr.rec.Watches = append(rr.rec.Watches, recWatch{Name: rawText(w.Name), Pattern: rawText(w.Pattern.String()), Every: w.Every, Last: -1})
	}
	return rr
}

// queueing registers a record for j before the launch decides whether j
// is queued, holding it until the returned function has written it as
// queued (or, if j was not queued, unregistered it).
func (st *store) queueing(j *job) func(bool) {
	rr := &runRec{}
	rr.mu.Lock()
	st.mu.Lock()
	st.runs[j] = rr
	st.mu.Unlock()
	return func(queued bool) {
		defer rr.mu.Unlock()
		if !queued {
			st.mu.Lock()
			delete(st.runs, j)
			st.mu.Unlock()
			return
		}
		fresh := st.newRun(j, Queued.String())
		rr.dir, rr.rec = fresh.dir, fresh.rec
		if err := st.writeQueued(j, rr); err != nil {
			// The job stays queued in memory; its start fails with
			// this, as a launch whose record cannot be written does.
			st.log.Warn("bgjob: write queued record", "id", j.id, "err", err)
			rr.err, rr.gone = err, true
		}
	}
}

// writeQueued makes a queued job's run folder, its input file and its
// record. On failure it leaves no half-made folder.
func (st *store) writeQueued(j *job, rr *runRec) error {
	in := queuedInput{Stdin: rawText(j.spec.Stdin), Unique: j.spec.Unique}
	for k, v := range j.spec.Env {
		in.Env = append(in.Env, [2]rawText{rawText(k), rawText(v)})
	}
	slices.SortFunc(in.Env, func(a, b [2]rawText) int { return strings.Compare(string(a[0]), string(b[0])) })
	return st.makeRun(j, rr, runFile{queuedFile, &in})
}

// runFile is a file that makeRun writes into a new run folder: v in JSON.
type runFile struct {
	name string
	v    any
}

// makeRun makes rr's run folder and writes into it each of files, in
// order, then rr's record, each synced. On failure it leaves no
// half-made folder for the next replay to quarantine.
func (st *store) makeRun(j *job, rr *runRec, files ...runFile) error {
	err := os.MkdirAll(filepath.Dir(rr.dir), 0o700)
	if err == nil {
		if err = os.Mkdir(rr.dir, 0o700); errors.Is(err, os.ErrExist) {
			err = nil
		}
	}
	files = append(files, runFile{recordFile, &rr.rec})
	for _, f := range files {
		if err != nil {
			break
		}
		var b []byte
		if b, err = json.Marshal(f.v); err == nil {
			err = writeFileSync(rr.dir, f.name, b)
		}
	}
	if err != nil {
		if rerr := os.RemoveAll(rr.dir); rerr != nil {
			st.log.Warn("bgjob: remove run folder", "id", j.id, "err", rerr)
		}
	}
	return err
}

// dequeued records that j, queued, is starting: its record says
// "starting" and its input file goes. It fails, leaving no folder, if
// the queued record could not be written or this one cannot.
func (st *store) dequeued(j *job, rr *runRec) error {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	err := rr.err
	if err == nil {
		rr.rec.State, rr.rec.Started = stateStarting, j.started
		var b []byte
		if b, err = json.Marshal(&rr.rec); err == nil {
			err = writeFileSync(rr.dir, recordFile, b)
		}
		if err != nil {
			os.RemoveAll(rr.dir)
		}
	}
	if err != nil {
		rr.gone = true
		st.mu.Lock()
		delete(st.runs, j)
		st.mu.Unlock()
		return err
	}
	st.dropInput(rr)
	return nil
}

// dropInput removes a queued job's input file (queuedFile), once it is
// not needed.
func (st *store) dropInput(rr *runRec) {
	if err := os.Remove(filepath.Join(rr.dir, queuedFile)); err != nil && !errors.Is(err, os.ErrNotExist) {
		st.log.Warn("bgjob: remove queued input file", "id", rr.rec.ID, "err", err)
	}
}

// wrap sends j's output to its run folder's file and runs its command
// line under the wrapper that writes the exit marker there.
func (st *store) wrap(j *job, pl *plan) error {
	rr := st.get(j)
	if rr == nil {
		return fmt.Errorf("no record: %w", ErrUnsupported)
	}
	if err := prepareMarker(rr.dir); err != nil {
		return fmt.Errorf("exit marker: %w", err)
	}
	lim := st.lim
	lim.hold = &j.ws.hold
	pl.output = outputPlan{file: filepath.Join(rr.dir, outputFile), lim: lim, lifeline: st.lifeR, log: st.log}
	if j.spec.Interactive {
		pl.input.fifo = filepath.Join(rr.dir, inputFile)
		if err := makeFIFO(pl.input.fifo); err != nil {
			return fmt.Errorf("input: %w", err)
		}
	}
	pl.argv = wrapArgv(rr.dir, pl.argv)
	return nil
}

// started records the process of a started job, and its cgroup, so that
// a later Registry that adopts the job stops its whole tree.
func (st *store) started(j *job, p *process) {
	rr := st.get(j)
	if rr == nil {
		return
	}
	start, _, _ := procStart(p.pid)
	kind, where := p.containment()
	rr.mu.Lock()
	defer rr.mu.Unlock()
	rr.rec.State, rr.rec.PID, rr.rec.StartTime, rr.rec.BootID = Running.String(), p.pid, start, st.boot
	if kind == ContainCgroup {
		rr.rec.Cgroup = rawText(where)
		rr.rec.CgroupCPUBase = p.cpuBase()
	} else {
		rr.rec.Marker = where
	}
	if k := p.keeperOf(); k > 0 {
		rr.rec.KeeperPID = k
		rr.rec.KeeperStart, _, _ = procStart(k)
	}
	if h := p.holderOf(); h > 0 {
		rr.rec.HolderPID = h
		rr.rec.HolderStart, _, _ = procStart(h)
	}
	st.writeLocked(rr)
}

// stopping records why j is being stopped, before its first signal.
func (st *store) stopping(j *job, o outcome) {
	rr := st.get(j)
	if rr == nil {
		return
	}
	stop := &stopRecord{State: o.state.String(), ExitCode: o.exitCode, Reason: rawText(o.reason)}
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.rec.Stop != nil && *rr.rec.Stop == *stop {
		return // an adopted job's stop, which its last host recorded
	}
	rr.rec.Stop = stop
	st.writeLocked(rr)
}

// ending takes j's record until the returned function has recorded how
// j ended.
func (st *store) ending(j *job) func(outcome, time.Time, bool) {
	rr := st.get(j)
	if rr == nil {
		return endNothing
	}
	rr.mu.Lock()
	return func(o outcome, ended time.Time, pollable bool) {
		defer rr.mu.Unlock()
		if rr.rec.State == Queued.String() && !rr.gone {
			st.dropInput(rr) // cancelled while queued
		}
		rr.rec.State, rr.rec.ExitCode, rr.rec.Reason, rr.rec.Notice = o.state.String(), o.exitCode, rawText(o.reason), o.notice
		rr.rec.Usage, rr.rec.Category = nil, ""
		if o.usage != (Usage{}) {
			rr.rec.Usage = &o.usage
		}
		if o.limit != "" {
			rr.rec.Category = CategoryLimit.String()
		}
		rr.rec.Ended, rr.rec.Pollable = ended, pollable
		st.writeLocked(rr)
	}
}

// delivered records that j's completion was delivered, so that no later
// Registry delivers it again. An evicted job's folder goes with it.
func (st *store) delivered(j *job) {
	rr := st.get(j)
	if rr == nil {
		return
	}
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.gone || rr.rec.CompletionDelivered {
		return
	}
	rr.rec.CompletionDelivered = true
	if rr.rec.Evicted && len(rr.rec.Matches) == 0 {
		st.removeLocked(j, rr)
		return
	}
	st.writeLocked(rr)
}

// inputClosed records that CloseInput closed j's input.
func (st *store) inputClosed(j *job) {
	rr := st.get(j)
	if rr == nil {
		return
	}
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if !rr.rec.InputClosed {
		rr.rec.InputClosed = true
		st.writeLocked(rr)
	}
}

// forgottenLocked queues j for the next purge.
func (st *store) forgottenLocked(j *job) {
	st.mu.Lock()
	if st.runs[j] != nil {
		st.trash = append(st.trash, j)
	}
	st.mu.Unlock()
}

// purge lets go of the jobs forgotten since the last purge: a folder
// goes, unless its completion is still owed; then the record says the
// job was evicted, and the folder goes once the completion is delivered.
func (st *store) purge() {
	st.mu.Lock()
	t := st.trash
	st.trash = nil
	st.mu.Unlock()
	for _, j := range t {
		rr := st.get(j)
		if rr == nil {
			continue
		}
		rr.mu.Lock()
		switch {
		case rr.gone:
		case rr.rec.State != stateStarting && rr.rec.State != Running.String() &&
			(rr.rec.Pollable && !rr.rec.CompletionDelivered || len(rr.rec.Matches) > 0):
			if !rr.rec.Evicted {
				rr.rec.Evicted = true
				st.writeLocked(rr)
			}
		default:
			st.removeLocked(j, rr)
		}
		rr.mu.Unlock()
	}
}

// removeLocked removes j's run folder; rr.mu must be held.
func (st *store) removeLocked(j *job, rr *runRec) {
	unlock, ok := st.relock()
	if !ok {
		return
	}
	defer unlock()
	rr.gone = true
	if err := os.RemoveAll(rr.dir); err != nil {
		st.log.Warn("bgjob: remove run folder", "id", j.id, "err", err)
	}
	st.mu.Lock()
	delete(st.runs, j)
	st.mu.Unlock()
}

// releasable: durable mode lets Detach release its jobs.
func (st *store) releasable() error { return nil }

// restore rebuilds the registry from the state directory (replay); see
// Config.StateDir. It runs in New, before the Registry is shared.
func (st *store) restore(r *Registry) (adopted []adoption, err error) {
	sessions, err := os.ReadDir(filepath.Join(st.dir, sessionsDir))
	if err != nil {
		return nil, fmt.Errorf("replay: %w", err)
	}
	defer func() {
		if err != nil {
			for _, a := range adopted {
				a.rd.Close()
				a.p.close()
			}
			adopted = nil
		}
	}()
	var (
		owed []queued
		byID = make(map[ID]*job)
		gone []*job // finished runs nobody holds: discarded after
	)
	boot := st.boot
	// The keepers of jobs that ended while no host watched them are
	// waited for until keeperBy: keeperWait from the first such wait.
	var keeperBy time.Time
	for _, s := range sessions {
		sdir := filepath.Join(st.dir, sessionsDir, s.Name())
		runs, err := os.ReadDir(sdir)
		if err != nil {
			return nil, fmt.Errorf("replay: %w", err)
		}
		for _, e := range runs {
			if !e.IsDir() {
				continue
			}
			run := filepath.Join(sdir, e.Name())
			rec, err := readRecord(run)
			if errors.Is(err, errUnreadable) {
				st.quarantine(run, s.Name()+"-"+e.Name(), err)
				continue
			}
			if err != nil {
				return nil, fmt.Errorf("replay %s: %w", e.Name(), err)
			}
			rr := &runRec{dir: run, rec: *rec}
			j := &job{
				id: rec.ID, gen: rec.Gen,
				spec:    Spec{Session: string(rec.Session), Command: string(rec.Command), Args: strs(rec.Args), Dir: string(rec.Dir), IdleTimeout: rec.IdleTimeout},
				timeout: rec.Timeout, started: rec.Started,
				over: make(chan struct{}), done: make(chan struct{}), released: make(chan struct{}), wake: make(chan struct{}, 1), heapIdx: -1,
				state: Running, exitCode: exitUnknown, pid: rec.PID,
			}
			j.spec.Timeout = rec.Timeout
			j.spec.Leftovers, j.spec.Priority, j.spec.Sandbox = rec.Leftovers, rec.Priority, rec.Sandbox
			if rec.Interactive {
				// Its input, closed unless adoption opens it again (or
				// it is queued: requeue gives it a new one).
				j.spec.Interactive = true
				j.in = newInput(false)
				j.in.markClosed(inputByEnd)
				j.in.attach(nil, nil)
			}
			if rec.Limits != nil {
				j.limits = *rec.Limits
			}
			st.runs[j] = rr
			r.seq = max(r.seq, rec.Gen)
			var o outcome
			short := "" // a notice that the output file may not hold all the output
			switch rec.State {
			case Queued.String():
				// It waits in the queue again, in its place: its
				// generation keeps its order of arrival. It has not
				// run: its watches (those added while it waited too)
				// match from its first byte, as Spec.Watches do.
				j.spec.Watches = st.specWatches(j, &rr.rec)
				if why := r.requeue(j, run); why != "" {
					o = outcome{state: Failed, exitCode: exitUnknown, reason: why}
					break
				}
				if old := byID[j.id]; old == nil || old.gen < j.gen {
					if old != nil {
						gone = append(gone, old)
					}
					byID[j.id] = j
				} else {
					gone = append(gone, j) // a newer run replaced it: cannot be
				}
				continue
			case stateStarting:
				o = outcome{state: Failed, exitCode: exitUnknown, reason: "spawn aborted"}
			case Running.String():
				if rec.BootID == boot {
					if st.watch == nil {
						if st.watch, err = newFileWatch(); err != nil {
							return nil, fmt.Errorf("adopt %s: %w", rec.ID, err)
						}
					}
					lim := st.lim
					lim.hold = &j.ws.hold
					j.ws.hold.Store(math.MaxInt64)
					p, rd, err := adoptProcess(rec, run, j.exited.Load, lim, r.cg, st.watch)
					if err == errGone && rec.Leftovers == LeftoversWait {
						// Its shell is gone; its tree may live on.
						p, rd, err = adoptLeftovers(rec, run, j.exited.Load, lim, r.cg, st.watch)
					}
					if err != nil && err != errGone {
						return nil, fmt.Errorf("adopt %s (process %d): %w", rec.ID, rec.PID, err)
					}
					if err == nil && rec.Interactive {
						err = adoptJobInput(j, p, rec, run)
						if err != nil {
							rd.Close()
							p.close()
							return nil, fmt.Errorf("adopt %s (process %d): %w", rec.ID, rec.PID, err)
						}
					}
					if err == nil {
						j.out = newOutbuf(r.cfg.HeadBytes, r.cfg.TailBytes)
						st.restoreWatches(r, j, rr, false)
						j.pollable = true
						rr.rec.Pollable = true
						j.rd.Store(&rd)
						a := adoption{j: j, p: p, rd: rd}
						if rec.Stop != nil {
							o := rec.Stop.outcome() // its host was stopping it: go on
							a.stop = &o
						}
						if fi, err := os.Stat(filepath.Join(run, outputFile)); err == nil {
							a.lastOut = fi.ModTime()
						}
						adopted = append(adopted, a)
						if old := byID[j.id]; old == nil || old.gen < j.gen {
							if old != nil {
								gone = append(gone, old)
							}
							byID[j.id] = j
						}
						continue
					}
				}
				code, ok, err := readMarker(run)
				switch {
				case err != nil:
					return nil, fmt.Errorf("replay %s: exit marker: %w", rec.ID, err)
				case rec.Stop != nil:
					// A host was stopping it, and died: it ended by that
					// stop (its signal's status, or no marker after
					// SIGKILL), or else as that stop would have ended it.
					o = rec.Stop.outcome()
				case ok:
					o = outcome{state: Exited, exitCode: code}
					if code != 0 {
						o.limit = signalLimit(j.limits, code) // the kernel's word, from the exit status
					}
				default:
					o = outcome{state: Failed, exitCode: exitUnknown, reason: "lost"}
				}
				// Its shell is gone; what it left must go too, before
				// its keeper is waited for: a leftover that holds the
				// pipe would keep the keeper copying.
				if n := stopLeftovers(rec, r.cg); n > 0 {
					o.notice = fmt.Sprintf("stopped %d leftover process(es) of the job", n)
				}
				rr.rec.Notice = o.notice
				// Its output is all in the file only once its keeper
				// has copied the pipe's last bytes and exited (the
				// keeper may be slow to get there, or this host's
				// child, released by Detach, which must be reaped).
				if rec.BootID == boot {
					done, err := awaitKeeper(rec.KeeperPID, rec.KeeperStart, &keeperBy)
					if err != nil {
						return nil, fmt.Errorf("replay %s: keeper: %w", rec.ID, err)
					}
					if !done {
						st.log.Warn("bgjob: replay: the keeper of a job that ended has not finished copying its output; its text may end early",
							"id", rec.ID, "keeper", rec.KeeperPID, "waited", keeperWait)
						short = noticeKeeperBehind
					}
				}
			default:
				o = outcome{state: parseState(rec.State), exitCode: rec.ExitCode, reason: string(rec.Reason), notice: rec.Notice}
				if rec.Usage != nil {
					o.usage = *rec.Usage
				}
				if rec.Category == CategoryLimit.String() {
					o.limit = o.reason
				}
			}
			if rec.State == stateStarting || rec.State == Running.String() || rec.State == Queued.String() {
				// It ended while no Registry watched it: its end is
				// recorded now, and its completion is owed to its
				// session since no foreground caller is left.
				ended := time.Now()
				if fi, err := os.Stat(filepath.Join(run, markerFile)); err == nil {
					ended = fi.ModTime()
				}
				if o.limit != "" {
					o.reason = o.limit
					rr.rec.Category = CategoryLimit.String()
				}
				rr.rec.State, rr.rec.ExitCode, rr.rec.Reason, rr.rec.Ended, rr.rec.Pollable =
					o.state.String(), o.exitCode, rawText(o.reason), ended, true
				st.writeLocked(rr) // rr is not shared yet
			}
			j.state, j.exitCode, j.reason, j.ended = o.state, o.exitCode, o.reason, rr.rec.Ended
			j.usage = o.usage
			j.pollable, j.finished = rr.rec.Pollable, true
			close(j.over)
			close(j.done)
			st.restoreWatches(r, j, rr, true)
			if j.pollable && !rr.rec.CompletionDelivered {
				owed = append(owed, queued{c: Completion{ID: j.id, Session: j.spec.Session, Command: j.spec.Command,
					State: j.state, ExitCode: j.exitCode, Ended: j.ended}, j: j})
			}
			if !j.pollable || rr.rec.Evicted {
				gone = append(gone, j)
				continue
			}
			if j.fin, err = r.rebuild(j, run, joinNotices(o.notice, short)); err != nil {
				return nil, fmt.Errorf("replay %s: output: %w", rec.ID, err)
			}
			if old := byID[j.id]; old == nil || old.gen < j.gen {
				if old != nil {
					gone = append(gone, old)
				}
				byID[j.id] = j
			} else {
				gone = append(gone, j)
			}
		}
	}
	slices.SortFunc(owed, func(a, b queued) int { return a.c.Ended.Compare(b.c.Ended) })
	for _, q := range owed {
		r.queues[q.c.Session] = append(r.queues[q.c.Session], q)
	}
	for id, j := range byID {
		r.jobs[id] = j
		switch {
		case j.finished:
			j.retEnd, j.retBytes = j.ended, int64(len(j.fin.out.Text))
			r.retainLocked(j)
		case j.state == Queued:
			r.waiting.push(j)
			r.wg.Add(1) // as launch counts a queued job; runQueued or unqueue lets go
			j.counted.Store(true)
		default:
			r.running++
			j.admitted = true
		}
	}
	r.evictLocked(r.now())
	st.trash = append(st.trash, gone...)
	var keep []string
	for _, a := range adopted {
		if kind, dir := a.p.containment(); kind == ContainCgroup {
			keep = append(keep, dir)
		}
	}
	r.cg.clearExcept(keep)
	return adopted, nil
}

// adoptJobInput gives an adopted interactive job its input again: the
// host's end of its FIFO, and the holder that keeps it open; a job whose
// input was closed (by CloseInput, or by the job) gets a closed one.
func adoptJobInput(j *job, p *process, rec *record, run string) error {
	j.in = newInput(false)
	if rec.InputClosed {
		j.in.markClosed(inputByHost)
		j.in.attach(nil, nil)
		return nil
	}
	conn, h, err := adoptInput(rec, run)
	if err != nil {
		return fmt.Errorf("input: %w", err)
	}
	p.holdInput(&inputPlan{holder: h})
	if conn == nil {
		j.in.markClosed(inputByJob)
		j.in.attach(nil, nil)
		return nil
	}
	var onEOF func() error
	if h != nil {
		onEOF = h.letGo
	}
	j.in.attach(conn, onEOF)
	return nil
}

// requeue makes j, replayed from a queued record in the run folder run,
// a queued job again: with its environment and stdin from the input file,
// its base environment this registry's. It returns why it cannot (the
// job then fails), or "".
func (r *Registry) requeue(j *job, run string) string {
	b, err := os.ReadFile(filepath.Join(run, queuedFile))
	var in queuedInput
	if err == nil {
		err = json.Unmarshal(b, &in)
	}
	if err != nil {
		return "lost: queued, but its input could not be read"
	}
	if sb := j.spec.Sandbox; sb != nil {
		if err := r.sandbox.ready(r.cfg.Bwrap); err != nil {
			return "sandbox: " + err.Error()
		}
	}
	j.spec.Stdin, j.spec.Unique = string(in.Stdin), in.Unique
	j.env = r.cfg.Env
	if len(in.Env) > 0 {
		j.spec.Env = make(map[string]string, len(in.Env))
		extra := make([]string, 0, len(in.Env))
		for _, kv := range in.Env {
			j.spec.Env[string(kv[0])] = string(kv[1])
			extra = append(extra, string(kv[0])+"="+string(kv[1]))
		}
		j.env = mergeEnv(r.cfg.Env, extra)
	}
	if j.spec.Interactive {
		j.in = newInput(j.spec.TTY != nil) // it has not run: its input is new
	}
	j.state, j.pid = Queued, 0
	j.out = newOutbuf(r.cfg.HeadBytes, r.cfg.TailBytes)
	r.startWatches(j)
	j.pollable = true // no foreground caller is left to hold it
	return ""
}

// rebuild makes a replayed job's final output from its output file: the
// head and the tail, through the same buffer and admission as a live job.
func (r *Registry) rebuild(j *job, run, notice string) (*final, error) {
	b := newOutbuf(r.cfg.HeadBytes, r.cfg.TailBytes)
	f, err := os.Open(filepath.Join(run, outputFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	if err == nil {
		if fi, err := f.Stat(); err == nil {
			size := fi.Size()
			head := min(size, int64(r.cfg.HeadBytes))
			buf := make([]byte, head)
			n, _ := io.ReadFull(f, buf)
			b.write(buf[:n])
			from := max(int64(n), size-int64(r.cfg.TailBytes))
			b.total += from - int64(n) // dropped between head and tail
			if from < size {
				buf = make([]byte, size-from)
				n, _ := f.ReadAt(buf, from)
				b.write(buf[:n])
			}
		}
		f.Close()
	}
	return r.admitFinal(j, b.view(), notice), nil
}

// quarantine moves an unreadable run folder out of the way and logs it.
func (st *store) quarantine(run, name string, cause error) {
	q := filepath.Join(st.dir, quarantineDir)
	dst := filepath.Join(q, name)
	err := os.MkdirAll(q, 0o700)
	if err == nil {
		err = os.Rename(run, dst)
	}
	st.log.Warn("bgjob: unreadable job record quarantined", "folder", run, "to", dst, "cause", cause, "err", err)
}
