package bgjob

import "time"

// Seams for the black-box tests in package bgjob_test.

// SetHooks installs test hooks: spawn runs just before a job's process is
// spawned, collect just before a RunForeground caller takes its final
// result.
func SetHooks(r *Registry, spawn, collect func(ID)) {
	r.hookSpawn, r.hookCollect = spawn, collect
}

// SetHeldHook installs a test hook that a job's supervisor calls each
// time it stops reading the job's output because the job has as many
// matches waiting for delivery as it may.
func SetHeldHook(r *Registry, held func(ID)) { r.hookHeld = held }

// SetClock replaces the registry's clock: retention, job times and the
// supervisor's timers read it. Call it before the first launch; after
// moving the clock, call Poke so that running jobs look at it.
func SetClock(r *Registry, now func() time.Time) { r.now = now }

// Poke wakes the supervisor of every running job, as a request would.
func Poke(r *Registry) {
	r.mu.Lock()
	var js []*job
	for _, j := range r.jobs {
		if !j.finished {
			js = append(js, j)
		}
	}
	r.mu.Unlock()
	for _, j := range js {
		j.poke()
	}
}

// RequestCancel asks for a job's stop without waiting for its end, as the
// first half of Cancel does.
func RequestCancel(r *Registry, id ID) {
	r.mu.Lock()
	j := r.jobs[id]
	r.mu.Unlock()
	if j != nil {
		j.request(stopCancel)
	}
}

// FailSpawns makes every later spawn fail at once without a process, for
// benchmarks of the registry's own bookkeeping.
func FailSpawns(r *Registry) {
	r.start = func(*plan) (*process, outputReader, error) {
		return nil, nil, ErrUnsupported
	}
}

// RealSpawns undoes FailSpawns.
func RealSpawns(r *Registry) { r.start = startJob }

// Retained returns the number of jobs in the retention set.
func Retained(r *Registry) int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.ret.h)
}

// HoldSlots takes n of the registry's running slots as if n jobs ran, so
// that launches queue (Config.Queue); the function it returns frees them,
// which starts the queued jobs as a job's end does.
func HoldSlots(r *Registry, n int) (release func()) {
	r.mu.Lock()
	r.running += n
	r.mu.Unlock()
	return func() {
		r.mu.Lock()
		r.running -= n
		next := r.nextLocked()
		r.mu.Unlock()
		r.startQueued(next)
	}
}

// SetTreeAge sets how long a listing of a job's tree is served again (see
// treeMaxAge); zero or negative lists the tree anew on every snapshot.
// Call it before the first launch.
func SetTreeAge(r *Registry, d time.Duration) { r.treeAge = d }
