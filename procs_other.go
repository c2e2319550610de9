//go:build !linux

package bgjob

// Listing a running job's tree and watching it empty, elsewhere than
// Linux: no listing (Snapshot.Processes and Ports stay empty), and the
// leftover phase looks at the tree at intervals (see emptyWatch.poll),
// since no event tells that a process which is not the host's child has
// exited.

// list lists nothing here.
func (p *process) list(*treeMemo) ([]Process, []int) { return nil, nil }

// emptyOS is what the leftover watcher needs: a count of the tree's live
// processes that reads nothing the supervisor may change.
type emptyOS struct {
	count func() int
}

// emptyWatch returns the watcher of p's tree for the leftover phase.
func (p *process) emptyWatch() *emptyWatch {
	w := newEmptyWatch()
	w.count = p.treeCount
	return w
}

// wait blocks until the tree is empty (true) or stop is called (false).
func (w *emptyWatch) wait() bool { return w.poll(w.count) }
