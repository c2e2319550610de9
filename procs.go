package bgjob

import (
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// A running job's tree, as snapshots show it (Snapshot.Processes and
// Snapshot.Ports), and the watcher of the leftover phase.
//
// A listing reads the system (Linux: /proc, the job's cgroup), which costs
// far more than the rest of a Status, so each job keeps its last listing
// (job.listed) and serves it again while it is younger than treeMaxAge
// and the job has written no output since: a job that prints "listening
// on :3000" is listed again by the next Status, and a quiet one is listed
// at most once a second however often it is polled.
//
// A listing may run in any goroutine, concurrently with the supervisor,
// which owns the process: it reads only the process's fields that were
// set before it was shared (its PID, its cgroup's folder, its marker),
// and holds job.usageMu with job.tree set, which the supervisor clears
// before it reaps the shell. Until then the shell's zombie holds its PID
// and the IDs of its session, so a process found by session is the
// job's.

// treeMaxAge is how long a listing of a job's tree is served again while
// the job writes no output.
const treeMaxAge = time.Second

// maxListed bounds the processes a snapshot lists: those of lowest PID.
const maxListed = 512

// maxCommandLine bounds each process's command line in a listing, in
// bytes.
const maxCommandLine = 4096

// treeList is a job's last listing of its tree. It is guarded by
// job.usageMu.
type treeList struct {
	at    time.Time // when it was taken (real time); zero: none
	total int64     // the job's output total then
	procs []Process // command lines as read, not yet admitted
	ports []int
	memo  treeMemo // what the platform's listing keeps between listings
}

// treeMemo is what a job's listings keep from one to the next, read once:
// the path of its cgroup as /proc shows it, and the start time of its
// shell (Linux).
type treeMemo struct {
	known bool
	rel   string
	since uint64
}

// treeOf returns the processes of j's tree and the ports they listen on,
// if j is running, from its last listing or a new one (see treeMaxAge);
// total is the job's output total in the snapshot being made. The command
// lines pass the Admitter.
func (r *Registry) treeOf(j *job, total int64) ([]Process, []int) {
	j.usageMu.Lock()
	p := j.tree
	if p == nil {
		j.usageMu.Unlock()
		return nil, nil
	}
	t := &j.listed
	if now := time.Now(); t.at.IsZero() || t.total != total || now.Sub(t.at) >= r.treeAge {
		t.procs, t.ports = p.list(&t.memo)
		t.at, t.total = now, total
	}
	procs, ports := slices.Clone(t.procs), slices.Clone(t.ports)
	j.usageMu.Unlock()
	r.admitCommands(j, procs)
	return procs, ports
}

// unlist ends the listing of j's tree, before the supervisor reaps the
// shell; a listing under way finishes first.
func (j *job) unlist() {
	j.usageMu.Lock()
	j.tree = nil
	j.listed = treeList{}
	j.usageMu.Unlock()
}

// admitCommands passes the command lines of procs through the Admitter as
// one text, a line each, and puts the admitted lines in their place. A
// command line may hold a secret (a token in an argument) as output may.
// If the Admitter withholds the text, or returns another number of lines
// (which could not be told apart), every command line is cleared.
func (r *Registry) admitCommands(j *job, procs []Process) {
	if len(procs) == 0 || r.cfg.Admitter == nil {
		return
	}
	var b strings.Builder
	for i, p := range procs {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(p.Command)
	}
	a := r.admit(AdmitRequest{ID: j.id, Session: j.spec.Session, Command: j.spec.Command, Text: b.String(), Partial: true})
	lines := strings.Split(a.Text, "\n")
	if a.Withhold || len(lines) != len(procs) {
		for i := range procs {
			procs[i].Command = ""
		}
		return
	}
	for i := range procs {
		procs[i].Command = lines[i]
	}
}

// procCommand turns the NUL-separated arguments of a process's command
// line into one line: spaces between arguments, control characters
// (newlines, which would split the admitted text, among them) as spaces,
// at most maxCommandLine bytes.
func procCommand(b []byte) string {
	for len(b) > 0 && b[len(b)-1] == 0 {
		b = b[:len(b)-1]
	}
	if len(b) > maxCommandLine {
		b = b[:maxCommandLine]
	}
	out := []byte(string(b))
	for i, c := range out {
		if c < ' ' || c == 0x7f {
			out[i] = ' '
		}
	}
	return strings.ToValidUTF8(string(out), "\uFFFD")
}

// emptyWatch waits, in a goroutine of its own, for a job's tree to be
// empty in the leftover phase (see supervisor.waitLeftovers). The
// platform's part (emptyOS, and wait) knows how; this part lets stop end
// the wait promptly from the supervisor: by closing quit, which an
// interval poll selects on, and by moving the read deadline of the file
// the wait is parked on (an inotify instance, a pidfd) into the past.
type emptyWatch struct {
	quit chan struct{}

	mu      sync.Mutex
	stopped bool
	cur     *os.File // the file the wait is parked on, if any

	emptyOS
}

func newEmptyWatch() *emptyWatch { return &emptyWatch{quit: make(chan struct{})} }

// stop ends the wait: wait returns false soon after, if it has not
// returned already.
func (w *emptyWatch) stop() {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.stopped {
		return
	}
	w.stopped = true
	close(w.quit)
	if w.cur != nil {
		w.cur.SetReadDeadline(time.Unix(1, 0))
	}
}

// park makes f the file the wait is about to block on, so that stop can
// interrupt it; it reports false if the watch was stopped already.
// park(nil) forgets the file.
func (w *emptyWatch) park(f *os.File) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.cur = f
	return !w.stopped
}

// Interval polls, for systems where no event tells that a process that is
// not the host's child has exited: the first look after pollFirst, each
// next one twice as late, up to pollMax.
const (
	pollFirst = 10 * time.Millisecond
	pollMax   = 500 * time.Millisecond
)

// poll waits until count returns 0, looking at growing intervals (see
// pollMax), and reports true; or false once stop was called.
func (w *emptyWatch) poll(count func() int) bool {
	d := pollFirst
	t := time.NewTimer(d)
	defer t.Stop()
	for {
		if count() == 0 {
			return true
		}
		select {
		case <-w.quit:
			return false
		case <-t.C:
		}
		d = min(2*d, pollMax)
		t.Reset(d)
	}
}
