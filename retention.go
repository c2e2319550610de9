package bgjob

import (
	"container/heap"
	"time"
)

// retained is the set of finished, pollable jobs that nobody is waiting
// to read, ordered by end time so the oldest is evicted first in
// O(log n). Jobs whose result a RunForeground caller has not yet received
// are not in it: they join it once the last such caller has its result,
// so they can never be evicted before that.
type retained struct {
	h     jobHeap
	bytes int64 // the sum of the members' text sizes
}

type jobHeap []*job

func (h jobHeap) Len() int { return len(h) }
func (h jobHeap) Less(i, k int) bool {
	if !h[i].retEnd.Equal(h[k].retEnd) {
		return h[i].retEnd.Before(h[k].retEnd)
	}
	return h[i].gen < h[k].gen
}
func (h jobHeap) Swap(i, k int) {
	h[i], h[k] = h[k], h[i]
	h[i].heapIdx, h[k].heapIdx = i, k
}
func (h *jobHeap) Push(x any) {
	j := x.(*job)
	j.heapIdx = len(*h)
	*h = append(*h, j)
}
func (h *jobHeap) Pop() any {
	old := *h
	j := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	j.heapIdx = -1
	return j
}

// retainLocked adds a finished job to the retained set.
func (r *Registry) retainLocked(j *job) {
	if j.heapIdx >= 0 {
		return
	}
	heap.Push(&r.ret.h, j)
	r.ret.bytes += j.retBytes
}

// forgetLocked removes j from the table and from the retained set: the
// registry will not find it again.
func (r *Registry) forgetLocked(j *job) {
	if j.heapIdx >= 0 {
		heap.Remove(&r.ret.h, j.heapIdx)
		r.ret.bytes -= j.retBytes
	}
	if r.jobs[j.id] == j {
		delete(r.jobs, j.id)
	}
	r.jn.forgottenLocked(j) // the journal lets go of its record later, in purge
}

// resizeLocked records that a retained job's text changed size.
func (r *Registry) resizeLocked(j *job, bytes int64) {
	if j.heapIdx >= 0 {
		r.ret.bytes += bytes - j.retBytes
	}
	j.retBytes = bytes
}

// evictLocked forgets retained jobs, oldest first, while the set breaks a
// limit of Config.Retention at time now. The newest retained job always
// stays. Each eviction costs O(log n); when nothing is due it costs O(1).
func (r *Registry) evictLocked(now time.Time) {
	lim := r.cfg.Retention
	for len(r.ret.h) > 1 {
		oldest := r.ret.h[0]
		over := len(r.ret.h) > max(lim.MaxJobs, 0) ||
			r.ret.bytes > max(lim.MaxBytes, 0) ||
			now.Sub(oldest.retEnd) > max(lim.TTL, 0)
		if !over {
			return
		}
		r.forgetLocked(oldest)
	}
}
