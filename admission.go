package bgjob

import (
	"context"
	"fmt"
	"strings"
)

// Admitter is the output policy hook. Every text passes it before it
// leaves the registry or is retained: a job's final output once, when the
// job ends (before it is stored), and a running job's text on each
// Status, Read, List or RunForeground result that shows it.
//
// Admit may return the text as it is, rewrite it (redact), withhold it,
// or add a notice. An error withholds the text: the registry fails
// closed. Admit is never called under the registry's lock, may be called
// from several goroutines at once, and should return quickly: a job's end
// waits for the admission of its final output.
//
// An Admitter may also have a method Epoch() uint64 that reports the
// version of its policy. If the epoch moves while Admit runs, the
// result is withheld, since it may have been made under the old policy;
// call [Registry.Readmit] after a policy change to re-apply the new one
// to retained text.
type Admitter interface {
	Admit(ctx context.Context, req AdmitRequest) (Admitted, error)
}

// AdmitRequest is what an [Admitter] is asked to admit.
type AdmitRequest struct {
	ID      ID
	Session string
	Command string
	Text    string
	// Partial reports that the job is still running, or that Text is
	// only one piece of the stream (a Read chunk).
	Partial bool
	// Omitted is the number of bytes of the stream that Text does not
	// hold.
	Omitted int64
}

// Admitted is an [Admitter]'s verdict.
type Admitted struct {
	// Text replaces the request's text.
	Text string
	// Withhold drops the text altogether; Text is then ignored.
	Withhold bool
	// Notice, if set, is added to the output's notice. It must not hold
	// the command's output.
	Notice string
}

// AdmitterFunc adapts a function to the [Admitter] interface.
type AdmitterFunc func(ctx context.Context, req AdmitRequest) (Admitted, error)

// Admit calls f(ctx, req).
func (f AdmitterFunc) Admit(ctx context.Context, req AdmitRequest) (Admitted, error) {
	return f(ctx, req)
}

// epocher is implemented by Admitters whose policy has versions.
type epocher interface {
	Epoch() uint64
}

// Notices for withheld text. They say nothing of the text itself.
const (
	noticeAdmitError = "output withheld: the admitter failed"
	noticeEpoch      = "output withheld: the output policy changed during admission"
	noticeWithheld   = "output withheld by policy"
)

// admit runs the registry's Admitter over req. With no Admitter the text
// passes as it is. It never holds a lock and fails closed.
func (r *Registry) admit(req AdmitRequest) Admitted {
	a := r.cfg.Admitter
	if a == nil {
		return Admitted{Text: req.Text}
	}
	ep, hasEpoch := a.(epocher)
	var before uint64
	if hasEpoch {
		before = ep.Epoch()
	}
	res, err := a.Admit(r.ctx, req)
	switch {
	case err != nil:
		r.cfg.Logger.Warn("bgjob: admitter failed; output withheld", "id", req.ID, "err", err)
		return Admitted{Withhold: true, Notice: noticeAdmitError}
	case hasEpoch && ep.Epoch() != before:
		return Admitted{Withhold: true, Notice: noticeEpoch}
	case res.Withhold:
		res.Text = ""
		if res.Notice == "" {
			res.Notice = noticeWithheld
		}
	}
	return res
}

// admitFinalSafely is admitFinal that survives a panicking Admitter: the
// text is withheld, as when it fails, and the panic's value is returned
// for finish to raise again once the job is finished, so that a host that
// recovers from it (a RunForeground caller runs finish) is not left with
// a job that never ends.
func (r *Registry) admitFinalSafely(j *job, v rawView, notice string) (f *final, panicked any) {
	defer func() {
		if panicked = recover(); panicked != nil {
			f = &final{out: Output{Total: v.total, Omitted: v.total, Withheld: true,
				Notice: joinNotices(truncationNotice(v.omitted()), notice, noticeAdmitError)}}
		}
	}()
	return r.admitFinal(j, v, notice), nil
}

// admitFinal passes a finished job's output through the Admitter once and
// maps the admitted text back onto raw offsets for Read. A TTY job's
// Output.Text is its stream stripped of escape sequences, admitted as
// such (so that a secret cut by a colour code is whole when the Admitter
// sees it), and its raw stream is admitted too, for Read.
func (r *Registry) admitFinal(j *job, v rawView, notice string) *final {
	raw := r.admitRaw(j, v, notice)
	if j.scr == nil {
		return raw
	}
	a := r.admit(AdmitRequest{ID: j.id, Session: j.spec.Session, Command: j.spec.Command, Text: v.strippedText(), Omitted: v.omitted()})
	return &final{out: admittedOutput(v, a, notice), raw: raw}
}

// admittedOutput is the Output of a view's text admitted as a.
func admittedOutput(v rawView, a Admitted, notice string) Output {
	o := Output{Text: a.Text, Total: v.total, Omitted: v.omitted(), Withheld: a.Withhold,
		Notice: joinNotices(truncationNotice(v.omitted()), notice, a.Notice)}
	if a.Withhold {
		o.Text, o.Omitted = "", v.total
	}
	return o
}

// admitRaw admits a finished job's raw text, mapped onto raw offsets.
func (r *Registry) admitRaw(j *job, v rawView, notice string) *final {
	text := v.text()
	a := r.admit(AdmitRequest{ID: j.id, Session: j.spec.Session, Command: j.spec.Command, Text: text, Omitted: v.omitted()})
	f := &final{out: Output{Total: v.total, Omitted: v.omitted()}, tailLine: v.tailLine}
	if a.Withhold {
		f.out.Withheld, f.out.Omitted = true, v.total
	} else {
		f.out.Text = a.Text
		pieces := []rawPiece{{start: 0, end: int64(len(v.head)), bytes: v.head}}
		if v.omitted() > 0 {
			pieces = append(pieces, rawPiece{start: v.tailBegin, end: v.total, bytes: v.tail})
		}
		f.segs = mapSegments(a.Text, v.separator(), pieces)
	}
	f.out.Notice = joinNotices(truncationNotice(v.omitted()), notice, a.Notice)
	return f
}

func truncationNotice(omitted int64) string {
	if omitted == 0 {
		return ""
	}
	return fmt.Sprintf("output truncated: %d bytes omitted between head and tail", omitted)
}

func joinNotices(ns ...string) string {
	var b strings.Builder
	for _, n := range ns {
		if n == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteString("; ")
		}
		b.WriteString(n)
	}
	return b.String()
}

// withOutput fills in a running job's admitted output from its raw view.
func (r *Registry) withOutput(j *job, s Snapshot, v *rawView) Snapshot {
	if v == nil {
		return s
	}
	text := v.text()
	if j.scr != nil {
		text = v.strippedText() // a TTY job's: see admitFinal
	}
	a := r.admit(AdmitRequest{ID: j.id, Session: j.spec.Session, Command: j.spec.Command, Text: text, Partial: true, Omitted: v.omitted()})
	s.Output = admittedOutput(*v, a, "")
	return s
}

// Readmit runs the current Admitter again over the text of every finished
// job the registry holds, for example after the output policy changed.
// A job whose text changed meanwhile (a newer run, or another Readmit)
// is left alone. A withholding verdict clears the text. ctx bounds the
// whole pass; Readmit returns ctx.Err() wrapped if it ends early, or
// ErrClosed after Close.
func (r *Registry) Readmit(ctx context.Context) error {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return fmt.Errorf("bgjob: readmit: %w", ErrClosed)
	}
	var js []*job
	for _, j := range r.jobs {
		if j.finished {
			js = append(js, j)
		}
	}
	r.mu.Unlock()
	for _, j := range js {
		if err := ctx.Err(); err != nil {
			return fmt.Errorf("bgjob: readmit: %w", err)
		}
		j.mu.Lock()
		f, gen := j.fin, j.finGen
		j.mu.Unlock()
		if f.out.Withheld {
			continue
		}
		a := r.admit(AdmitRequest{ID: j.id, Session: j.spec.Session, Command: j.spec.Command, Text: f.out.Text, Omitted: f.out.Omitted})
		nf := f.readmitted(a)
		if f.raw != nil {
			nf.raw = f.raw
			if !f.raw.out.Withheld {
				nf.raw = f.raw.readmitted(r.admit(AdmitRequest{ID: j.id, Session: j.spec.Session, Command: j.spec.Command, Text: f.raw.out.Text, Omitted: f.raw.out.Omitted}))
			}
		}
		r.mu.Lock()
		j.mu.Lock()
		if j.finGen == gen {
			j.fin = nf
			j.finGen++
			r.resizeLocked(j, nf.size())
		}
		j.mu.Unlock()
		r.mu.Unlock()
	}
	return nil
}

// readmitted returns f with its text replaced by the verdict a.
func (f *final) readmitted(a Admitted) *final {
	nf := &final{out: f.out, tailLine: f.tailLine}
	nf.out.Notice = joinNotices(f.out.Notice, a.Notice)
	if a.Withhold {
		nf.out.Text, nf.out.Withheld, nf.out.Omitted = "", true, f.out.Total
		return nf
	}
	nf.out.Text = a.Text
	if f.segs == nil {
		return nf
	}
	pieces := make([]rawPiece, len(f.segs))
	for k, sg := range f.segs {
		pieces[k] = rawPiece{start: sg.start, end: sg.end, lines: sg.rawLines}
		if old := f.out.Text[sg.lo:sg.hi]; sg.rawLines == nil && int64(len(old)) == sg.end-sg.start {
			// The old text stood byte for byte for the raw range, so
			// its lines are the raw lines.
			pieces[k].bytes = []byte(old)
		}
	}
	sep := ""
	if len(f.segs) == 2 {
		sep = f.out.Text[f.segs[0].hi:f.segs[1].lo]
	}
	nf.segs = mapSegments(a.Text, sep, pieces)
	return nf
}
