package bgjob

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
)

// sortedQueue is the model of jobQueue: a slice kept in queue order, with
// O(n) insertion, removal and place. It is also the baseline of
// BenchmarkJobQueue.
type sortedQueue []*job

func (q *sortedQueue) push(j *job) {
	i, _ := slices.BinarySearchFunc(*q, j, func(a, b *job) int {
		if before(a, b) {
			return -1
		}
		return 1
	})
	*q = slices.Insert(*q, i, j)
}

func (q *sortedQueue) remove(j *job) bool {
	i := slices.Index(*q, j)
	if i < 0 {
		return false
	}
	*q = slices.Delete(*q, i, i+1)
	return true
}

func (q *sortedQueue) pop() *job {
	if len(*q) == 0 {
		return nil
	}
	j := (*q)[0]
	*q = (*q)[1:]
	return j
}

func (q sortedQueue) place(j *job) int { return slices.Index(q, j) + 1 }

// The treap agrees with the model over random pushes (priorities of a
// small range, so that equals are common), removals, pops and places.
func TestJobQueueAgainstModel(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	var q jobQueue
	var m sortedQueue
	var all []*job
	gen := uint64(0)
	for step := range 20000 {
		switch op := rng.IntN(10); {
		case op < 5:
			gen++
			j := &job{gen: gen}
			j.spec.Priority = rng.IntN(5) - 2
			q.push(j)
			m.push(j)
			all = append(all, j)
		case op < 7 && len(all) > 0:
			j := all[rng.IntN(len(all))]
			if got, want := q.remove(j), m.remove(j); got != want {
				t.Fatalf("step %d: remove = %v; want %v", step, got, want)
			}
		case op < 8:
			if got, want := q.pop(), m.pop(); got != want {
				t.Fatalf("step %d: pop = %v; want %v", step, got, want)
			}
		default:
			if len(all) == 0 {
				continue
			}
			j := all[rng.IntN(len(all))]
			if got, want := q.place(j), m.place(j); got != want {
				t.Fatalf("step %d: place = %d; want %d", step, got, want)
			}
		}
		if q.len() != len(m) {
			t.Fatalf("step %d: len %d; want %d", step, q.len(), len(m))
		}
	}
	if got := q.drain(); !slices.Equal(got, m) {
		t.Fatalf("drain: %d jobs in another order than the model's %d", len(got), len(m))
	}
	if q.len() != 0 || q.pop() != nil {
		t.Fatalf("after drain: len %d", q.len())
	}
}

// BenchmarkJobQueue measures the queue's own work per job, with n jobs
// queued: a push, the job's place, and a pop, of eight priorities. The
// treap's time per job grows with log n; "sorted-slice", the baseline in
// the same run, is the plain structure whose insertion and place are
// O(n).
func BenchmarkJobQueue(b *testing.B) {
	type queue interface {
		push(*job)
		pop() *job
		place(*job) int
	}
	for _, kind := range []string{"treap", "sorted-slice"} {
		for _, n := range []int{100, 1000, 10000, 100000} {
			b.Run(fmt.Sprintf("%s/queued=%d", kind, n), func(b *testing.B) {
				var q queue = &jobQueue{}
				if kind == "sorted-slice" {
					q = &sortedQueue{}
				}
				gen := uint64(0)
				mk := func() *job {
					gen++
					j := &job{gen: gen}
					j.spec.Priority = int(gen % 8)
					return j
				}
				for range n {
					q.push(mk())
				}
				b.ResetTimer()
				for i := 0; i < b.N; i++ {
					j := mk()
					q.push(j)
					if q.place(j) == 0 {
						b.Fatal("not queued")
					}
					q.pop()
				}
			})
		}
	}
}
