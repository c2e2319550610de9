package bgjob

import (
	"bytes"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
)

// Hooks may call back into the registry: any method, on any job, their
// own included. Three cases would deadlock if a call from a hook waited
// as a call from elsewhere does, and the registry tells them apart by the
// goroutine that makes the call:
//
//   - A wait for a job's end from a hook (Wait, Cancel, a RunForeground
//     that joins) waits for the job to be finished, not for its hooks:
//     two jobs' hooks that wait for each other's job then both return.
//     From elsewhere it waits for the hooks too (job.done), so that a
//     Wait that returns has seen them.
//   - A wait for a job's end from that job's own JobStarted hook, which
//     runs in the goroutine that owns the job's supervisor before it
//     starts: the hook supervises the job to its end right there (its
//     end hooks run nested), and the launch then finds it ended.
//   - Close or Detach from a hook: the hook's goroutine counts in the
//     registry's wait group until its job's supervision is over, so Close
//     lets go of that count first (and from JobStarted, supervises the
//     job to its end as above), then waits for everything else. The
//     hook's goroutine itself ends after Close returns, once the hook
//     does: it is the caller.
//
// The Admitter and OnMatch of a match run in the delivery goroutine
// (deliver.go), with no job of their own: a wait from them waits for the
// job's end (not its hooks), and a Close or Detach from them lets go of
// the delivery goroutine's count first.
//
// A wait for a job's end from that job's final Admitter (the one call
// that runs while the job ends, before it is finished) cannot be served:
// Wait returns at once with an error, Cancel at once with the current
// snapshot, ReadWait with an error once it has nothing to serve. A wait
// for output (ReadWait, Follow) is a wait for the job's end where no
// output comes; a NextCompletion from a JobStarted hook that owns its
// job's supervisor supervises the job to its end first, as a wait for
// the job does (its completion may be the one it waits for).

// hookRun is what the registry knows of a goroutine while it runs a hook.
type hookRun struct {
	j *job
	// release, for the delivery goroutine's hooks (deliver.go), lets
	// go of its count in the wait group; j is nil then.
	release func()
	// sv is the job's supervisor while this goroutine owns it and has
	// not yet run it (JobStarted); nil otherwise. Only this goroutine
	// touches it.
	sv *supervisor
}

// hookRuns maps the goroutines that run a hook to what they run; hooking
// counts them, so that a call made outside any hook (almost every call)
// costs one atomic load to tell.
type hookRuns struct {
	hooking atomic.Int32
	runs    sync.Map // goroutine ID -> *hookRun
}

// during runs hook as a hook of j, in this goroutine; sv is j's
// supervisor if this goroutine owns it and has not run it.
func (h *hookRuns) during(j *job, sv *supervisor, hook func()) {
	g := goid()
	h.runs.Store(g, &hookRun{j: j, sv: sv})
	h.hooking.Add(1)
	defer func() {
		h.hooking.Add(-1)
		h.runs.Delete(g)
	}()
	hook()
}

// delivering runs hook (the Admitter or OnMatch) in the delivery goroutine
// (deliver.go), which release lets go of for a Close from the hook.
func (h *hookRuns) delivering(release func(), hook func()) {
	g := goid()
	h.runs.Store(g, &hookRun{release: release})
	h.hooking.Add(1)
	defer func() {
		h.hooking.Add(-1)
		h.runs.Delete(g)
	}()
	hook()
}

// current returns what the calling goroutine runs if it is in a hook, or
// nil.
func (h *hookRuns) current() *hookRun {
	if h.hooking.Load() == 0 {
		return nil
	}
	if v, ok := h.runs.Load(goid()); ok {
		return v.(*hookRun)
	}
	return nil
}

// goid returns the ID of the calling goroutine, from the first line of
// its stack trace ("goroutine 42 [running]:"). It costs about a
// microsecond, and is only called while some hook runs.
func goid() int64 {
	var buf [64]byte
	b := buf[:runtime.Stack(buf[:], false)]
	b = bytes.TrimPrefix(b, []byte("goroutine "))
	if i := bytes.IndexByte(b, ' '); i > 0 {
		b = b[:i]
	}
	id, _ := strconv.ParseInt(string(b), 10, 64)
	return id
}

// ended returns a channel that is closed when a caller may take j as
// ended: when its hooks have run (j.done), or, for a caller in a hook,
// when it is finished (j.over). A caller in j's own JobStarted hook
// supervises j to its end first. It returns nil if the caller cannot wait
// for j at all: it is in j's final admission.
func (r *Registry) ended(j *job) <-chan struct{} {
	h := r.hooks.current()
	if h == nil {
		return j.done
	}
	if h.j == j {
		r.runOwn(h)
	}
	if h.j == j && !r.isFinished(j) {
		return nil
	}
	return j.over
}

// runOwn supervises the job of the hook h to its end if h's goroutine owns
// its supervisor (a JobStarted hook): a wait there for anything the job
// does (its end, its output, its completion) would otherwise wait for
// ever. NextCompletion calls it for any wait from such a hook.
func (r *Registry) runOwn(h *hookRun) {
	if h != nil && h.sv != nil {
		h.sv.runHere()
		h.sv = nil
	}
}

// isFinished reports whether j has finished.
func (r *Registry) isFinished(j *job) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return j.finished
}

// leaveForClose prepares a Close or Detach made from a hook: the hook's
// own job is supervised to its end if the hook owns its supervisor
// (stop is the request Close or Detach made), and the goroutine's count
// in the wait group goes, so that Close does not wait for its caller.
func (r *Registry) leaveForClose() {
	h := r.hooks.current()
	if h == nil {
		return
	}
	r.runOwn(h)
	if h.release != nil {
		h.release()
		return
	}
	r.launchDone(h.j)
}

// launchDone lets go of j's launch count in the wait group, once: the
// supervisor's end does, or a Close from one of j's hooks before it.
func (r *Registry) launchDone(j *job) {
	if j.counted.CompareAndSwap(true, false) {
		r.wg.Done()
	}
}
