package bgjob

import (
	"context"
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
