package bgjob

import (
	"fmt"
	"time"
)

// The queue (Config.Queue): launches beyond MaxRunning wait here, as
// Queued jobs without a process, until a running job's end frees a slot.
//
// A queued job is in the table (so an identical launch joins it, and
// Status, Cancel and Wait find it) and holds a count in Registry.wg, as a
// running one does; it is not counted in Registry.running. It leaves the
// queue in one of three ways, each under Registry.mu, so exactly one
// happens:
//
//   - a slot frees: finish (or New, after a restart) takes the first
//     jobs of the queue (nextLocked) and each gets a goroutine that
//     spawns and supervises it (runQueued), inheriting its count;
//   - Cancel, or Close, takes it out (dropLocked) and finishes it as
//     Cancelled, outside the lock (unqueue);
//   - Detach releases it: its durable record stays "queued", for the
//     next Registry to queue again.
//
// The order is a treap keyed by (Priority descending, generation
// ascending): the generation is handed out at admission, so it is the
// order of arrival, and it survives a restart in durable mode (replay
// continues the generations after the largest it finds). Each node
// counts its subtree, so a job's place (Snapshot.QueuePosition) is found
// in O(log n), as are insertion, removal and taking the first.

// queueNode is a job's node in the queue's treap.
type queueNode struct {
	j           *job
	prio        uint64 // the treap's heap priority (random), not Spec.Priority
	size        int    // nodes in this subtree
	left, right *queueNode
}

// jobQueue is the queue of waiting launches. It is guarded by
// Registry.mu, like the fields of job that it uses (queued).
type jobQueue struct {
	root *queueNode
	rng  uint64 // xorshift state for the nodes' heap priorities
}

// before reports whether a waits ahead of b: higher Spec.Priority first,
// then the earlier generation.
func before(a, b *job) bool {
	if a.spec.Priority != b.spec.Priority {
		return a.spec.Priority > b.spec.Priority
	}
	return a.gen < b.gen
}

func (n *queueNode) sz() int {
	if n == nil {
		return 0
	}
	return n.size
}

func (n *queueNode) fix() { n.size = 1 + n.left.sz() + n.right.sz() }

// random returns the next heap priority: a xorshift64 sequence, which
// only has to look random to the treap's shape.
func (q *jobQueue) random() uint64 {
	if q.rng == 0 {
		q.rng = uint64(time.Now().UnixNano()) | 1
	}
	q.rng ^= q.rng << 13
	q.rng ^= q.rng >> 7
	q.rng ^= q.rng << 17
	return q.rng
}

// len returns the number of queued jobs.
func (q *jobQueue) len() int { return q.root.sz() }

// split splits t into the nodes that wait ahead of j and the rest.
func split(t *queueNode, j *job) (l, r *queueNode) {
	if t == nil {
		return nil, nil
	}
	if before(t.j, j) {
		t.right, r = split(t.right, j)
		t.fix()
		return t, r
	}
	l, t.left = split(t.left, j)
	t.fix()
	return l, t
}

// merge joins l and r, every node of l waiting ahead of every node of r.
func merge(l, r *queueNode) *queueNode {
	switch {
	case l == nil:
		return r
	case r == nil:
		return l
	case l.prio > r.prio:
		l.right = merge(l.right, r)
		l.fix()
		return l
	}
	r.left = merge(l, r.left)
	r.fix()
	return r
}

// push queues j.
func (q *jobQueue) push(j *job) {
	n := &queueNode{j: j, prio: q.random(), size: 1}
	l, r := split(q.root, j)
	q.root = merge(merge(l, n), r)
	j.queued = true
}

// remove takes j out of the queue; it reports whether j was in it.
func (q *jobQueue) remove(j *job) bool {
	if !j.queued {
		return false
	}
	q.root = removeNode(q.root, j)
	j.queued = false
	return true
}

func removeNode(t *queueNode, j *job) *queueNode {
	switch {
	case t == nil:
		return nil
	case t.j == j:
		return merge(t.left, t.right)
	case before(j, t.j):
		t.left = removeNode(t.left, j)
	default:
		t.right = removeNode(t.right, j)
	}
	t.fix()
	return t
}

// pop takes the first job out of the queue, or returns nil.
func (q *jobQueue) pop() *job {
	if q.root == nil {
		return nil
	}
	var j *job
	q.root, j = popFirst(q.root)
	j.queued = false
	return j
}

func popFirst(t *queueNode) (*queueNode, *job) {
	if t.left == nil {
		return t.right, t.j
	}
	var j *job
	t.left, j = popFirst(t.left)
	t.fix()
	return t, j
}

// place returns j's place in the queue, 1 for the first; 0 if j is not
// queued.
func (q *jobQueue) place(j *job) int {
	if !j.queued {
		return 0
	}
	ahead := 0
	for t := q.root; t != nil; {
		switch {
		case t.j == j:
			return ahead + t.left.sz() + 1
		case before(j, t.j):
			t = t.left
		default:
			ahead += t.left.sz() + 1
			t = t.right
		}
	}
	return 0
}

// all returns the queued jobs in their order, and empties the queue.
func (q *jobQueue) drain() []*job {
	out := make([]*job, 0, q.len())
	var walk func(*queueNode)
	walk = func(t *queueNode) {
		if t == nil {
			return
		}
		walk(t.left)
		t.j.queued = false
		out = append(out, t.j)
		walk(t.right)
	}
	walk(q.root)
	q.root = nil
	return out
}

// admitQueuedLocked queues j, a new run that finds every slot taken, if
// the queue is on and has room. r.mu must be held; j is not in the table
// yet. It reports whether j was queued; the caller then adds j to the
// table as for a run that starts.
func (r *Registry) admitQueuedLocked(j *job) bool {
	if !r.cfg.Queue || r.waiting.len() >= r.cfg.MaxQueued {
		return false
	}
	j.state = Queued // j is not shared yet: j.mu is not needed
	r.waiting.push(j)
	return true
}

// nextLocked takes from the queue the jobs that the free slots let start,
// counts them as running, and returns them; the caller runs each with
// runQueued once it has let go of r.mu. Nothing starts once the
// registry is closed.
func (r *Registry) nextLocked() []*job {
	var out []*job
	for !r.closed && r.running < r.cfg.MaxRunning {
		j := r.waiting.pop()
		if j == nil {
			break
		}
		r.running++
		j.admitted = true
		j.mu.Lock()
		j.state = Running
		j.started = r.now() // its Timeout counts from here
		j.mu.Unlock()
		out = append(out, j)
	}
	return out
}

// runQueued runs a job that left the queue, in a goroutine of its own
// that inherits the job's count in r.wg: it spawns the job and supervises
// it to its end, as launch does for a background job.
func (r *Registry) runQueued(j *job) {
	sv := r.spawn(j)
	if sv == nil {
		return // it ended at once; spawn let go of the count
	}
	r.announce(j, sv)
	if !sv.over {
		sv.run()
	}
}

// startQueued starts the jobs that nextLocked took, each in its own
// goroutine.
func (r *Registry) startQueued(js []*job) {
	for _, j := range js {
		go r.runQueued(j)
	}
}

// dropLocked takes j out of the queue for Cancel; it reports whether j
// was queued, and must then be ended with unqueue once r.mu is let go.
func (r *Registry) dropLocked(j *job) bool {
	if !r.waiting.remove(j) {
		return false
	}
	j.leaving = true
	return true
}

// unqueue ends a job taken out of the queue (by Cancel or Close): it never
// ran, so it is Cancelled with why, and its count in r.wg goes.
func (r *Registry) unqueue(j *job, req int32) {
	defer r.launchDone(j)
	r.finish(j, outcome{state: Cancelled, exitCode: exitCancelled, reason: stopReason(req) + " while queued"})
}

// queuePlace returns j's place in the queue (0 if it is not queued), its
// state, which, read under Registry.mu, agrees with the place (a job
// leaves the queue under it), and whether j is leaving the queue to be
// cancelled (see unqueue).
func (r *Registry) queuePlace(j *job) (int, State, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	j.mu.Lock()
	s := j.state
	j.mu.Unlock()
	return r.waiting.place(j), s, j.leaving && !j.finished
}

// awaitUnqueued waits until j, which a Cancel or Close took out of the
// queue, is finished, so that no snapshot shows a queued job without a
// place: it takes moments (no process is involved). It returns false if
// the caller cannot wait, being j's own final Admitter.
func (r *Registry) awaitUnqueued(j *job) bool {
	if h := r.hooks.current(); h != nil && h.j == j && !r.isFinished(j) {
		return false
	}
	<-j.over
	return true
}

// queueFull is the error of a launch that finds the queue full.
func (r *Registry) queueFull(op string) error {
	return fmt.Errorf("bgjob: %s: Config.MaxRunning %d and Config.MaxQueued %d: %w", op, r.cfg.MaxRunning, r.cfg.MaxQueued, ErrTooManyRunning)
}
