package bgjob

import (
	"errors"
	"io"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"slices"
)

// Durable mode's watches. A job's record holds its watches, how far its
// output was matched (Scanned), the offset of each watch's last match,
// and its matches that were queued and not yet delivered. A later host
// matches the output file from Scanned on: live, for a job it adopts
// (the file is read from its start, and the watcher skips to Scanned),
// or at once in New, for a job that ended while no host ran; a match at
// or before its watch's last one was found before, and is skipped. So
// each match is delivered once: before a restart, or after it from the
// record or the file, never both. The output file keeps what lies past
// Scanned (watchState.hold), so a host that dies leaves it there to
// match.

// tracksMatches: durable mode records watches and matches.
func (st *store) tracksMatches() bool { return true }

// watched records a watch that Registry.Watch added. The job's first
// watch sets Scanned to where it starts.
func (st *store) watched(j *job, w Watch, from scanMark) {
	rr := st.get(j)
	if rr == nil {
		return
	}
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if len(rr.rec.Watches) == 0 {
		rr.rec.Scanned, rr.rec.ScannedCut, rr.rec.ScannedSkip = from.at, from.cut, from.skip
	}
	rr.rec.Watches = append(rr.rec.Watches, recWatch{Name: rawText(w.Name), Pattern: rawText(w.Pattern.String()), Every: w.Every, From: from.at, Last: -1})
	if st.writeLocked(rr) && len(rr.rec.Watches) == 1 {
		j.ws.hold.Store(rr.rec.Scanned)
	}
}

// matching holds j's record until the returned function has recorded its
// matches: the queued ones as undelivered, every one as its watch's last,
// and mark as Scanned. Once the record is written, the output file may
// lose what lies before the new Scanned.
func (st *store) matching(j *job) func([]found, []bool, scanMark) {
	rr := st.get(j)
	if rr == nil {
		return matchNothing
	}
	rr.mu.Lock()
	return func(fs []found, queued []bool, mark scanMark) {
		defer rr.mu.Unlock()
		if rr.gone {
			return
		}
		addMatches(&rr.rec, fs, queued)
		if mark.at > rr.rec.Scanned || (mark.at == rr.rec.Scanned && rr.rec.ScannedSkip && !mark.skip) {
			rr.rec.Scanned, rr.rec.ScannedCut, rr.rec.ScannedSkip = mark.at, mark.cut, mark.skip
		}
		if st.writeLocked(rr) {
			j.ws.hold.Store(rr.rec.Scanned)
		}
	}
}

// addMatches records matches in rec: the queued ones as undelivered, each
// one as the last of its watch so far.
func addMatches(rec *record, fs []found, queued []bool) {
	for i, f := range fs {
		for k := range rec.Watches {
			if string(rec.Watches[k].Name) == f.m.Watch {
				rec.Watches[k].Last = max(rec.Watches[k].Last, f.m.Offset)
			}
		}
		rec.MatchSeq = max(rec.MatchSeq, f.seq)
		if queued[i] {
			rec.Matches = append(rec.Matches, recMatch{Seq: f.seq, Watch: rawText(f.m.Watch), Offset: f.m.Offset,
				Line: rawText(f.m.Line), Withheld: f.m.Withheld, At: f.m.At})
		}
	}
}

// matchesDelivered drops j's matches up to seq from its record. An
// evicted job's folder goes once nothing is owed any more.
func (st *store) matchesDelivered(j *job, seq uint64) {
	rr := st.get(j)
	if rr == nil {
		return
	}
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if rr.gone {
		return
	}
	n := len(rr.rec.Matches)
	rr.rec.Matches = slices.DeleteFunc(rr.rec.Matches, func(m recMatch) bool { return m.Seq <= seq })
	if len(rr.rec.Matches) == n {
		return
	}
	if rr.rec.Evicted && len(rr.rec.Matches) == 0 && (rr.rec.CompletionDelivered || !rr.rec.Pollable) {
		st.removeLocked(j, rr)
		return
	}
	st.writeLocked(rr)
}

// specWatches returns the watches of a queued job's record as
// Spec.Watches; a pattern that no longer compiles is dropped and logged.
func (st *store) specWatches(j *job, rec *record) []Watch {
	var ws []Watch
	for _, w := range rec.Watches {
		re, err := regexp.Compile(string(w.Pattern))
		if err != nil {
			st.log.Warn("bgjob: a watch's pattern does not compile; the watch is dropped", "id", j.id, "watch", string(w.Name), "err", err)
			continue
		}
		ws = append(ws, Watch{Name: string(w.Name), Pattern: re, Every: w.Every})
	}
	return ws
}

// restoreWatches gives a replayed job its watches back, from its record
// rr (not shared yet). A running job that New adopts (ended false) gets
// a watcher that the output file's reader feeds from Scanned on. An
// ended one has its output file matched from Scanned to its end here,
// and its new matches admitted, queued and recorded. The matches the
// record holds undelivered are queued again, first, their lines
// admitted again by the current Admitter.
func (st *store) restoreWatches(r *Registry, j *job, rr *runRec, ended bool) {
	j.ws.hold.Store(math.MaxInt64)
	rec := &rr.rec
	if len(rec.Watches) == 0 && len(rec.Matches) == 0 {
		return
	}
	for _, m := range rec.Matches {
		mt := Match{ID: j.id, Session: j.spec.Session, Watch: string(m.Watch), Offset: m.Offset, Line: string(m.Line), Withheld: m.Withheld, At: m.At}
		if !mt.Withheld {
			r.admitMatch(j, &mt)
		}
		r.queueMatchLocked(queuedMatch{m: mt, j: j, seq: m.Seq})
	}
	if len(rec.Watches) == 0 {
		return
	}
	wt := newWatcher(r, j, rec.Scanned)
	wt.m.cut, wt.m.skip = rec.ScannedCut, rec.ScannedSkip
	wt.seq = rec.MatchSeq
	for _, w := range rec.Watches {
		re, err := regexp.Compile(string(w.Pattern))
		if err != nil {
			st.log.Warn("bgjob: a watch's pattern does not compile; the watch is dropped", "id", j.id, "watch", string(w.Name), "err", err)
			continue
		}
		nw := newWatches([]Watch{{Name: string(w.Name), Pattern: re, Every: w.Every}}, w.From)[0]
		nw.last = w.Last
		nw.fired = w.Last >= 0 && !w.Every
		wt.addLocked(nw)
	}
	if !ended {
		j.ws.hold.Store(rec.Scanned)
		j.ws.marked = rec.Scanned
		j.ws.wt.Store(wt)
		return
	}
	// The job ended while no host ran: match what it printed since.
	f, err := os.Open(filepath.Join(rr.dir, outputFile))
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		st.log.Warn("bgjob: output not matched against the job's watches", "id", j.id, "err", err)
		return
	}
	wt.compileLocked()
	if f != nil {
		buf := make([]byte, maxReadBuf)
		off := rec.Scanned
		for {
			n, err := f.ReadAt(buf, off)
			if n > 0 {
				wt.m.feed(buf[:n], off, -1)
				off += int64(n)
				wt.pos = off
			}
			if err != nil {
				if err != io.EOF {
					st.log.Warn("bgjob: output not matched to its end", "id", j.id, "err", err)
				}
				break
			}
		}
		f.Close()
	}
	wt.m.flush()
	fs := wt.found
	queued := make([]bool, len(fs))
	for i := range fs {
		r.admitMatch(j, &fs[i].m)
		fs[i].m, queued[i] = r.queueMatchLocked(queuedMatch{m: fs[i].m, j: j, seq: fs[i].seq})
	}
	addMatches(rec, fs, queued)
	rec.Scanned, rec.ScannedCut, rec.ScannedSkip = wt.pos, false, false
	st.writeLocked(rr)
}
