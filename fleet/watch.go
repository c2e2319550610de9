package fleet

import (
	"context"
	"errors"
	"fmt"
	"regexp"
	"strings"
	"time"

	"github.com/bgjob/bgjob"
)

// Watches live in the worker's Registry, like the input: Watch and
// WaitFor are requests to the job's worker.

// Watch adds a watch to the running job id at its worker, as
// [bgjob.Registry.Watch]. Its matches, like those of Spec.Watches, are
// found by the worker's Registry and carried to the fleet by the
// worker's MatchFeed (see [MatchFeed]): Matches and NextMatch take them.
// It fails with ErrInvalidArgument for a nil Pattern (before anything is
// sent), ErrNotFound for an unknown ID, and an error wrapping
// ErrJobEnded for a job that has ended.
func (c *Client) Watch(id bgjob.ID, w bgjob.Watch) error {
	if w.Pattern == nil {
		return fmt.Errorf("bgjob/fleet: watch %s: no Pattern: %w", id, bgjob.ErrInvalidArgument)
	}
	ctx, cancel := c.opCtx()
	defer cancel()
	_, err := c.call(ctx, "watch", id, func(record) error { return bgjob.ErrJobEnded },
		rpcRequest{Op: "watch", Name: w.Name, Pattern: w.Pattern.String(), Every: w.Every})
	return err
}

// WaitFor waits for a line of the job's output from offset from on that
// matches re, as [bgjob.Registry.WaitFor]: at the job's worker while it
// runs (lines printed before included), woken by the line, not by
// polling; a job that has ended is searched in the output its worker
// published (its admitted text: a line the Admitter rewrote is matched
// as rewritten, and output the fleet no longer holds is passed over).
// It returns the first matching line, its text admitted on the worker,
// or an *EndedError wrapping ErrJobEnded when the job ends without one.
// ctx bounds the wait. It fails with ErrInvalidArgument for a nil re or
// a negative from, and ErrNotFound for an unknown ID.
func (c *Client) WaitFor(ctx context.Context, id bgjob.ID, re *regexp.Regexp, from int64) (bgjob.Match, error) {
	switch {
	case re == nil:
		return bgjob.Match{}, fmt.Errorf("bgjob/fleet: wait for %s: no pattern: %w", id, bgjob.ErrInvalidArgument)
	case from < 0:
		return bgjob.Match{}, fmt.Errorf("bgjob/fleet: wait for %s: offset %d: negative: %w", id, from, bgjob.ErrInvalidArgument)
	}
	errEnded := errors.New("ended")
	for {
		var ended record
		r, err := c.call(ctx, "wait for", id, func(rec record) error { ended = rec; return errEnded },
			rpcRequest{Op: "waitfor", Pattern: re.String(), Offset: from})
		switch {
		case errors.Is(err, errEnded):
			return c.searchStored(ctx, ended, re, from)
		case err != nil && r.Snap != nil && errors.Is(err, bgjob.ErrJobEnded):
			return bgjob.Match{}, &bgjob.EndedError{Snapshot: *r.Snap}
		case err != nil:
			return bgjob.Match{}, err
		case r.Match == nil:
			continue // the worker's wait (30s at most) ended: ask again
		}
		return *r.Match, nil
	}
}

// searchStored is WaitFor of an ended job, over its published output.
func (c *Client) searchStored(ctx context.Context, rec record, re *regexp.Regexp, from int64) (bgjob.Match, error) {
	key := recordKey(SessionToken(rec.Snap.Session), string(rec.Snap.ID))
	var line strings.Builder
	lineAt, next := from, from
	for {
		ch, err := c.readStored(ctx, key, rec, next, readMax)
		if err != nil {
			return bgjob.Match{}, err
		}
		if ch.Skipped > 0 {
			line.Reset() // a gap: the line in progress is not held whole
			lineAt = ch.Offset
		}
		data := ch.Data
		at := ch.Offset
		for data != "" || ch.Done {
			i := strings.IndexByte(data, '\n')
			if i < 0 && !ch.Done {
				line.WriteString(data)
				break
			}
			if i < 0 {
				i = len(data) // the last line, with no "\n"
			}
			line.WriteString(data[:i])
			text := strings.TrimSuffix(line.String(), "\r")
			if (text != "" || i < len(data)) && re.MatchString(text) {
				return bgjob.Match{ID: rec.Snap.ID, Session: rec.Snap.Session, Offset: lineAt, Line: text, At: time.Now()}, nil
			}
			line.Reset()
			if i == len(data) {
				break
			}
			at += int64(i + 1)
			lineAt = at
			data = data[i+1:]
		}
		if ch.Done {
			return bgjob.Match{}, &bgjob.EndedError{Snapshot: rec.Snap}
		}
		next = ch.Next
	}
}
