package bgjob

import (
	"bytes"
	"fmt"
	"strconv"
	"strings"
)

// lineSlack is how far the head's end and the tail's start may move to
// fall on a line boundary. Cutting at lines means a line is shown whole
// or not at all, so a secret on a line that straddles the omission is
// never shown in two halves that a redactor could not recognise.
const lineSlack = 4096

// The output chain. Every raw chunk a job writes passes down it once, in
// stream order, from the supervisor (the only writer): first the job's
// head/tail buffer, then its watches (watch.go), which see every byte,
// the dropped ones too. Text leaves the registry only through the
// Admitter (admission.go), never from here.

// emit passes a raw chunk of j's output down the output chain, and wakes
// the readers that wait for it: the head/tail buffer, then the watches
// (watch.go), which may wait for their matches to be delivered.
func (j *job) emit(p []byte) {
	j.mu.Lock()
	base := j.out.total
	j.out.write(p)
	j.wakeReadersLocked()
	j.mu.Unlock()
	j.emitWatched(p, base)
}

// wakeReadersLocked wakes the readers waiting for j's output to change.
// j.mu must be held.
func (j *job) wakeReadersLocked() {
	if j.changed != nil {
		close(j.changed)
		j.changed = nil
	}
}

// outputChangedLocked returns a channel that is closed when j's output
// next changes. j.mu must be held.
func (j *job) outputChangedLocked() <-chan struct{} {
	if j.changed == nil {
		j.changed = make(chan struct{})
	}
	return j.changed
}

// outbuf keeps the head and the tail of a job's output stream. Memory
// grows with the output up to headCap+tailCap and never beyond; what
// falls between the two is counted, not kept. It is not safe for
// concurrent use: the job's mutex guards it.
type outbuf struct {
	headCap, tailCap int

	head  []byte // the first bytes of the stream, up to headCap
	ring  []byte // the tail: in order until full, then a ring of tailCap bytes
	w     int    // when full, the index of the oldest byte in ring
	full  bool   // the ring has wrapped: bytes were dropped before the tail
	total int64  // bytes written
}

func newOutbuf(headCap, tailCap int) *outbuf {
	return &outbuf{headCap: headCap, tailCap: tailCap}
}

// write appends p to the stream.
func (b *outbuf) write(p []byte) {
	b.total += int64(len(p))
	if n := b.headCap - len(b.head); n > 0 {
		n = min(n, len(p))
		b.head = appendGrow(b.head, p[:n], b.headCap)
		p = p[n:]
	}
	if len(p) == 0 {
		return
	}
	if len(p) >= b.tailCap {
		// p alone fills the tail: keep its last tailCap bytes.
		p = p[len(p)-b.tailCap:]
		if len(b.ring) < b.tailCap {
			b.ring = make([]byte, b.tailCap)
		}
		copy(b.ring, p)
		b.w, b.full = 0, true
		return
	}
	if !b.full {
		if len(b.ring)+len(p) <= b.tailCap {
			b.ring = appendGrow(b.ring, p, b.tailCap)
			return
		}
		// The ring wraps from here on: give it its full size once.
		r := make([]byte, b.tailCap)
		copy(r, b.ring)
		b.w = len(b.ring)
		b.ring, b.full = r, true
	}
	n := copy(b.ring[b.w:], p)
	copy(b.ring, p[n:])
	b.w = (b.w + len(p)) % b.tailCap
}

// appendGrow appends p to s, growing s by doubling but never past limit,
// so a quiet job holds little memory and a loud one no more than limit.
func appendGrow(s, p []byte, limit int) []byte {
	need := len(s) + len(p)
	if need > cap(s) {
		c := max(2*cap(s), 512, need)
		c = min(c, limit)
		t := make([]byte, len(s), c)
		copy(t, s)
		s = t
	}
	return append(s, p...)
}

func (b *outbuf) tailLen() int { return len(b.ring) }

// tailAt returns byte i of the tail, counted from its oldest byte.
func (b *outbuf) tailAt(i int) byte {
	if b.full {
		i += b.w
		if i >= b.tailCap {
			i -= b.tailCap
		}
	}
	return b.ring[i]
}

// held returns the ranges of the stream the buffer holds: [0, headEnd)
// and [tailBegin, total). When nothing was dropped they meet
// (headEnd == tailBegin). When bytes were dropped, the head ends and the
// tail begins on a line boundary when one lies within lineSlack bytes.
func (b *outbuf) held() (headEnd, tailBegin int64) {
	headEnd = int64(len(b.head))
	tailBegin = b.total - int64(b.tailLen())
	if tailBegin == headEnd {
		return headEnd, tailBegin
	}
	if i := bytes.LastIndexByte(b.head[max(0, len(b.head)-lineSlack):], '\n'); i >= 0 {
		headEnd = int64(max(0, len(b.head)-lineSlack) + i + 1)
	}
	for i := 0; i < min(lineSlack, b.tailLen()-1); i++ {
		if b.tailAt(i) == '\n' {
			tailBegin += int64(i + 1)
			break
		}
	}
	return headEnd, tailBegin
}

// appendRange appends the held bytes [from, to) to dst. The range must
// lie within one held range.
func (b *outbuf) appendRange(dst []byte, from, to int64) []byte {
	if from >= to {
		return dst
	}
	if to <= int64(len(b.head)) {
		return append(dst, b.head[from:to]...)
	}
	tailStart := b.total - int64(b.tailLen())
	i, j := int(from-tailStart), int(to-tailStart)
	if !b.full {
		return append(dst, b.ring[i:j]...)
	}
	i, j = i+b.w, j+b.w
	if i >= b.tailCap {
		return append(dst, b.ring[i-b.tailCap:j-b.tailCap]...)
	}
	if j <= b.tailCap {
		return append(dst, b.ring[i:j]...)
	}
	dst = append(dst, b.ring[i:]...)
	return append(dst, b.ring[:j-b.tailCap]...)
}

// omissionLine is the line that stands for n dropped bytes in a Text.
func omissionLine(n int64) string {
	return "[... " + strconv.FormatInt(n, 10) + " bytes omitted ...]\n"
}

// rawView is a copy of what the buffer holds, taken under the job's lock
// so that admission can run outside it.
type rawView struct {
	head, tail []byte // the held ranges [0, headEnd) and [tailBegin, total)
	tailBegin  int64
	total      int64
	// tailLine reports that the tail begins at a line's start (held
	// found a '\n' to begin it after), when bytes were dropped.
	tailLine bool
}

func (b *outbuf) view() rawView {
	headEnd, tailBegin := b.held()
	v := rawView{tailBegin: tailBegin, total: b.total, tailLine: tailBegin > b.total-int64(b.tailLen())}
	v.head = b.appendRange(nil, 0, headEnd)
	if tailBegin > headEnd {
		v.tail = b.appendRange(nil, tailBegin, b.total)
	} else {
		// Contiguous: keep it as one piece in head.
		v.head = b.appendRange(v.head, max(headEnd, tailBegin), b.total)
		v.tailBegin = b.total
	}
	return v
}

// last returns the last n bytes the view holds, or fewer.
func (v rawView) last(n int) string {
	b := v.tail
	if len(b) == 0 {
		b = v.head
	}
	return string(b[max(len(b)-n, 0):])
}

func (v rawView) omitted() int64 { return v.tailBegin - int64(len(v.head)) }

// separator returns what stands between head and tail in a Text: nothing
// when no byte was dropped, else the omission line (on its own line).
func (v rawView) separator() string {
	n := v.omitted()
	if n == 0 {
		return ""
	}
	if len(v.head) > 0 && v.head[len(v.head)-1] != '\n' {
		return "\n" + omissionLine(n)
	}
	return omissionLine(n)
}

// strippedText is the text of a TTY job's view: the head and the tail
// stripped of terminal escape sequences (see stripper), the tail from
// its line's start, joined as in text.
func (v rawView) strippedText() string {
	head := stripText(v.head)
	if v.omitted() == 0 {
		return head
	}
	sep := omissionLine(v.omitted())
	if head != "" && !strings.HasSuffix(head, "\n") {
		sep = "\n" + sep
	}
	return head + sep + stripText(v.tail)
}

func (v rawView) text() string {
	var sb strings.Builder
	sep := v.separator()
	sb.Grow(len(v.head) + len(sep) + len(v.tail))
	sb.Write(v.head)
	sb.WriteString(sep)
	sb.Write(v.tail)
	return sb.String()
}

// segment maps a range of the raw stream to its admitted text, so Read
// can go on serving absolute raw offsets after the raw bytes are gone.
type segment struct {
	start, end int64 // the raw range
	lo, hi     int   // its admitted text: final.out.Text[lo:hi]
	// rawLines holds the raw line starts (relative to start) when the
	// admitted text's length differs from the raw range's; nil when the
	// two have the same length and map byte for byte.
	rawLines []int32
}

// final is a finished job's admitted output.
type final struct {
	out  Output
	segs []segment // nil when the text was withheld or is not mapped
	// tailLine reports that the tail segment begins at a line's start
	// (see rawView), for WaitFor's search of an ended job.
	tailLine bool
	// raw, for a TTY job, is its raw stream admitted, which Read serves,
	// while out.Text is the stream stripped of escape sequences.
	raw *final
}

// size is what the finished output holds, for retention.
func (f *final) size() int64 {
	n := int64(len(f.out.Text))
	if f.raw != nil {
		n += int64(len(f.raw.out.Text))
	}
	return n
}

// lineStarts returns the offsets of the starts of every line of p but
// the first (which starts at 0).
// The result is never nil, so that a segment can tell "one line" from "not
// mapped".
func lineStarts[S []byte | string](p S) []int32 {
	ls := []int32{}
	for i := 0; i < len(p); i++ {
		if p[i] == '\n' && i+1 < len(p) {
			ls = append(ls, int32(i+1))
		}
	}
	return ls
}

// rawPiece describes a held range of the raw stream for mapSegments.
type rawPiece struct {
	start, end int64
	lines      []int32 // its raw line starts, if known (not nil)
	bytes      []byte  // its raw bytes, if still at hand
}

// mapSegments lays raw pieces over the admitted text t, which holds them
// in order, split by sep when there are two. A piece whose admitted
// length differs from its raw length keeps its raw line starts so that
// Read can map offsets line by line; one whose raw lines are unknown is
// left unmapped. If t no longer holds sep, nothing is mapped.
func mapSegments(t, sep string, pieces []rawPiece) []segment {
	texts := []string{t}
	if len(pieces) == 2 {
		i := strings.Index(t, sep)
		if sep == "" || i < 0 {
			return nil
		}
		texts = []string{t[:i], t[i+len(sep):]}
	}
	segs := make([]segment, len(pieces))
	lo := 0
	for k, p := range pieces {
		s := segment{start: p.start, end: p.end, lo: lo, hi: lo + len(texts[k]), rawLines: p.lines}
		if s.rawLines == nil && int64(len(texts[k])) != p.end-p.start && p.bytes != nil {
			s.rawLines = lineStarts(p.bytes)
		}
		segs[k] = s
		lo = s.hi + len(sep)
	}
	return segs
}

// read serves Read for a finished job from its admitted segments. It
// fails, with an error wrapping ErrInvalidArgument, for an offset inside a
// line of a segment served line by line: only the raw line starts map to
// the admitted text there, and skipping to the next one would lose the
// rest of the line without a word (a reader that advanced by len(Data)
// instead of Next lands there).
func (f *final) read(offset int64, max int) (Chunk, error) {
	total := f.out.Total
	c := Chunk{Offset: offset, Next: offset, Done: true}
	if f.segs == nil {
		// Withheld or unmapped: there is nothing to serve by offset.
		c.Skipped, c.Offset, c.Next = total-offset, total, total
		if f.out.Text != "" && offset == 0 {
			c.Data, c.Skipped, c.Offset = f.out.Text, 0, 0
		}
		return c, nil
	}
	for _, s := range f.segs {
		if offset >= s.end {
			continue
		}
		if offset < s.start {
			c.Skipped += s.start - offset
			offset = s.start
		}
		text := f.out.Text[s.lo:s.hi]
		rel := offset - s.start
		switch {
		case int64(len(text)) == s.end-s.start && s.rawLines == nil:
			n := min(int64(max), s.end-offset)
			c.Data, c.Offset, c.Next = text[rel:rel+n], offset, offset+n
		default:
			adm := lineStarts(text)
			if s.rawLines == nil || len(adm) != len(s.rawLines) {
				// Not mappable line by line: serve the whole piece
				// from its start, or skip it.
				if rel == 0 {
					c.Data, c.Offset, c.Next = text, offset, s.end
				} else {
					c.Skipped += s.end - offset
					offset = s.end
					continue
				}
				break
			}
			// Serve whole lines: from the first raw line that starts
			// at or after rel, as many as fit in max (at least one).
			n := len(s.rawLines) + 1
			rawEnd := int32(s.end - s.start)
			k := 0
			for k < n && lineAt(s.rawLines, k) < int32(rel) {
				k++
			}
			if k == n || lineAt(s.rawLines, k) != int32(rel) {
				// Inside line k-1.
				from, to := s.start+int64(lineAt(s.rawLines, k-1)), s.start+int64(lineEnd(s.rawLines, k-1, rawEnd))
				return Chunk{}, fmt.Errorf("offset %d: inside a line (stream bytes %d to %d) of text that the Admitter rewrote, "+
					"which is served by whole lines: continue from Chunk.Next, never from Offset+len(Data): %w", offset, from, to, ErrInvalidArgument)
			}
			from := s.start + int64(lineAt(s.rawLines, k))
			e := k + 1
			for e < n && int64(lineEnd(s.rawLines, e, rawEnd)-lineAt(s.rawLines, k)) <= int64(max) {
				e++
			}
			to := s.start + int64(lineEnd(s.rawLines, e-1, rawEnd))
			alo, ahi := lineAt(adm, k), lineEnd(adm, e-1, int32(len(text)))
			c.Data, c.Offset, c.Next = text[alo:ahi], from, to
		}
		c.Done = c.Next == total
		return c, nil
	}
	c.Skipped += total - offset
	c.Offset, c.Next = total, total
	return c, nil
}

// lineEnd returns the end of line k (the start of line k+1, or end for
// the last line) given the starts of lines 1..n.
func lineEnd(starts []int32, k int, end int32) int32 {
	if k < len(starts) {
		return starts[k]
	}
	return end
}

// lineAt returns the start of line k given the starts of lines 1..n.
func lineAt(starts []int32, k int) int32 {
	if k == 0 {
		return 0
	}
	return starts[k-1]
}

// Read returns the job's output from the absolute stream offset, at most
// about max bytes of it. Read never consumes output: any offset may be
// read again, by any number of readers. Asking for bytes the registry no
// longer holds returns the next held byte with Chunk.Skipped set. Read
// never waits; [Registry.ReadWait] waits for output that is not there
// yet.
//
// The offset to read on from is the chunk's Next: never Offset+len(Data),
// which is wrong as soon as an Admitter changes the length of the text.
//
// Without an Admitter, Data is exactly the stream's bytes [Offset, Next).
// With one, Data is the admitted form of those bytes, so its length may
// differ from Next-Offset while the offsets stay those of the raw stream,
// and Read serves whole lines, so that no secret is split between two
// chunks: a chunk ends after a newline, running up to 4 KiB past max to
// finish a line, and a running job's incomplete last line waits until it
// is complete (only a line longer than max plus 4 KiB is cut). After the
// job ends, Data comes from the final admitted text: byte for byte where
// the Admitter kept the length of the head (or the tail), line for line
// where it kept its number of lines, and otherwise as the whole of the
// head or the tail, served only from its start (an offset inside it
// skips to its end, counted in Skipped). Served line for line, an offset
// must be a line's start: an offset inside a line fails with
// ErrInvalidArgument rather than skip the rest of the line.
//
// Read fails with ErrNotFound for an unknown ID and with
// ErrInvalidArgument for a negative offset, an offset past the end of
// the stream, an offset inside a line served whole (see above), or a max
// that is not positive.
func (r *Registry) Read(id ID, offset int64, max int) (Chunk, error) {
	return r.read(anySession, id, offset, max)
}

func (r *Registry) read(sc scope, id ID, offset int64, max int) (Chunk, error) {
	if err := readArgs("read", id, offset, max); err != nil {
		return Chunk{}, err
	}
	j, err := r.lookup(sc, "read", id)
	if err != nil {
		return Chunk{}, err
	}
	return r.readJob(j, "read", offset, max)
}

// readArgs checks Read's offset and max; op names the caller.
func readArgs(op string, id ID, offset int64, max int) error {
	if offset < 0 {
		return fmt.Errorf("bgjob: %s %s: offset %d: negative: %w", op, id, offset, ErrInvalidArgument)
	}
	if max <= 0 {
		return fmt.Errorf("bgjob: %s %s: max %d: not positive: %w", op, id, max, ErrInvalidArgument)
	}
	return nil
}

// readJob is Read of the job j, once found; op names the caller.
func (r *Registry) readJob(j *job, op string, offset int64, max int) (Chunk, error) {
	id := j.id
	j.mu.Lock()
	if f := j.fin; f != nil {
		j.mu.Unlock()
		if f.raw != nil {
			f = f.raw // a TTY job's raw stream
		}
		if offset > f.out.Total {
			return Chunk{}, pastEnd(op, id, offset, f.out.Total)
		}
		c, err := f.read(offset, max)
		if err != nil {
			return Chunk{}, fmt.Errorf("bgjob: %s %s: %w", op, id, err)
		}
		return c, nil
	}
	b := j.out
	if total := b.total; offset > total {
		j.mu.Unlock()
		return Chunk{}, pastEnd(op, id, offset, total)
	}
	headEnd, tailBegin := b.held()
	c := Chunk{Offset: offset}
	if offset >= headEnd && offset < tailBegin {
		c.Skipped, c.Offset = tailBegin-offset, tailBegin
	}
	end := b.total
	if c.Offset < headEnd {
		end = headEnd
	}
	to := c.Offset + min(int64(max), end-c.Offset) // max may be as large as MaxInt
	if r.cfg.Admitter == nil {
		c.Data, c.Next = string(b.appendRange(nil, c.Offset, to)), to
		j.mu.Unlock()
		return c, nil
	}
	// Whole lines only, so that the Admitter never sees half a secret: a
	// chunk ends after its last newline, or runs on to finish its only
	// line (up to lineSlack bytes past max).
	data := b.appendRange(nil, c.Offset, min(to+lineSlack, end))
	total := b.total
	j.mu.Unlock()
	n := int(to - c.Offset)
	if i := bytes.LastIndexByte(data[:n], '\n'); i >= 0 {
		data = data[:i+1]
	} else if i := bytes.IndexByte(data[n:], '\n'); i >= 0 {
		data = data[:n+i+1]
	} else if c.Offset+int64(len(data)) == total && len(data)-lineSlack < max {
		data = nil // a running job's incomplete last line: wait for the rest
	} else {
		data = data[:n] // a line too long to serve whole
	}
	c.Next = c.Offset + int64(len(data))
	if len(data) > 0 {
		a := r.admit(AdmitRequest{ID: j.id, Session: j.spec.Session, Command: j.spec.Command,
			Text: string(data), Partial: true, Omitted: total - int64(len(data))})
		c.Data = a.Text
	}
	return c, nil
}

func pastEnd(op string, id ID, offset, total int64) error {
	return fmt.Errorf("bgjob: %s %s: offset %d: past the end of the stream (%d): %w", op, id, offset, total, ErrInvalidArgument)
}
