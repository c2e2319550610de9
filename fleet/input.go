package fleet

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/bgjob/bgjob"
)

// An interactive job's input and terminal live on its worker: Write,
// CloseInput, Resize and Screen are requests to it, like Cancel.

// writeMax is the most one write request carries, well within NATS's
// default payload limit of 1 MiB.
const writeMax = 256 << 10

// Write writes p to the standard input of the interactive job id (see
// Spec.Interactive and Spec.TTY), as [bgjob.Registry.Write], at the job's
// worker; p travels in requests of at most 256 KiB, each written whole
// before the next is sent, so concurrent Writes of one job through one
// or several clients may interleave between those pieces (locally they
// never do). A job still queued is waited for until it runs. ctx bounds
// the whole call: if it ends first, Write returns what the worker wrote
// and an error wrapping ctx.Err().
//
// Write fails with ErrNotFound for an unknown ID, ErrNotInteractive for
// a job launched without Spec.Interactive, ErrInputClosed once the input
// is closed (by CloseInput or the job's end), and ErrUnavailable when
// neither the worker nor NATS answers.
func (c *Client) Write(ctx context.Context, id bgjob.ID, p []byte) (int, error) {
	n := 0
	for {
		part := p[:min(len(p), writeMax)]
		r, err := c.call(ctx, "write", id, func(rec record) error {
			if !rec.Interactive {
				return bgjob.ErrNotInteractive
			}
			return bgjob.ErrInputClosed
		}, rpcRequest{Op: "write", Data: part})
		if r.N > 0 {
			n += r.N
		}
		if err != nil {
			return n, err
		}
		p = p[len(part):]
		if len(p) == 0 {
			return n, nil
		}
	}
}

// CloseInput ends the input of the interactive job id at its worker, as
// [bgjob.Registry.CloseInput]; a queued job is waited for until it runs,
// for a few request timeouts at most. It fails as Write does, and with
// ErrInputClosed if the input was closed already.
func (c *Client) CloseInput(id bgjob.ID) error {
	ctx, cancel := c.opCtx()
	defer cancel()
	_, err := c.call(ctx, "close input", id, func(rec record) error {
		if !rec.Interactive {
			return bgjob.ErrNotInteractive
		}
		return bgjob.ErrInputClosed
	}, rpcRequest{Op: "closeinput"})
	return err
}

// Resize sets the size of the TTY job id's terminal, as
// [bgjob.Registry.Resize], at its worker. rows and cols must be
// positive (ErrInvalidArgument, before anything is sent). It fails with
// ErrNotFound, ErrNotInteractive for a job without Spec.TTY, and
// ErrInputClosed once the job has ended.
func (c *Client) Resize(id bgjob.ID, rows, cols uint16) error {
	if rows == 0 || cols == 0 {
		return fmt.Errorf("bgjob/fleet: resize %s: rows %d, cols %d: want both positive: %w", id, rows, cols, bgjob.ErrInvalidArgument)
	}
	ctx, cancel := c.opCtx()
	defer cancel()
	_, err := c.call(ctx, "resize", id, func(rec record) error {
		if !rec.TTY {
			return bgjob.ErrNotInteractive
		}
		return bgjob.ErrInputClosed
	}, rpcRequest{Op: "resize", Rows: rows, Cols: cols})
	return err
}

// Screen renders the TTY job id's terminal, as [bgjob.Registry.Screen],
// at its worker (the text passes the worker's Admitter there). The
// emulator lives in the worker's Registry, which the fleet lets go of at
// the job's end: Screen of an ended TTY job fails with an error wrapping
// ErrUnsupported (its output stays readable with Read). It fails with
// ErrNotFound for an unknown ID and ErrNotInteractive for a job without
// Spec.TTY.
func (c *Client) Screen(id bgjob.ID) (bgjob.Screen, error) {
	ctx, cancel := c.opCtx()
	defer cancel()
	r, err := c.call(ctx, "screen", id, func(rec record) error {
		if !rec.TTY {
			return bgjob.ErrNotInteractive
		}
		return fmt.Errorf("the screen of an ended job is not kept in the fleet: %w", bgjob.ErrUnsupported)
	}, rpcRequest{Op: "screen"})
	if err != nil {
		return bgjob.Screen{}, err
	}
	if r.Screen == nil {
		return bgjob.Screen{}, fmt.Errorf("bgjob/fleet: screen %s: the worker sent no screen: %w", id, ErrUnavailable)
	}
	return *r.Screen, nil
}

// call sends req to the worker of the running job id and returns its
// answer. A queued or claimed job is waited for until it runs (ctx
// bounds that); for an ended one (or one that ends meanwhile), ended
// gives the error, from the record. A worker that does not answer while
// its heartbeat is gone has its run recorded lost, and ended decides
// too; one that does not answer while alive is ErrUnavailable.
func (c *Client) call(ctx context.Context, op string, id bgjob.ID, ended func(record) error, req rpcRequest) (reply, error) {
	fctx, fcancel := context.WithTimeout(ctx, 6*c.cfg.RequestTimeout)
	key, rec, rev, err := c.find(fctx, op, id)
	fcancel()
	if err != nil {
		return reply{}, err
	}
	for {
		switch rec.Phase {
		case phaseEnded:
			return reply{}, fmt.Errorf("bgjob/fleet: %s %s: %w", op, id, ended(rec))
		case phaseQueued, phaseClaimed:
			if rec, rev, err = c.await(ctx, key, rec.Run, func(r record) bool { return r.Phase == phaseRunning || r.Phase == phaseEnded }); err != nil {
				return reply{}, fmt.Errorf("bgjob/fleet: %s %s: %w", op, id, err)
			}
			continue
		}
		req.Wait = maxWait
		if dl, ok := ctx.Deadline(); ok {
			req.Wait = min(time.Until(dl), maxWait)
		}
		rctx, rcancel := context.WithTimeout(ctx, req.Wait+c.cfg.RequestTimeout)
		r, err := c.ask(rctx, key, rec, req)
		rcancel()
		if err == nil {
			rerr := r.err()
			if rerr == nil {
				return r, nil
			}
			if !errors.Is(rerr, bgjob.ErrNotFound) {
				return r, fmt.Errorf("bgjob/fleet: %s %s: %w", op, id, rerr)
			}
			// The worker has let go of the run: it ended, and the
			// record tells how once the worker has written it.
			cur, curRev, err := c.await(ctx, key, rec.Run, func(r record) bool { return r.Phase == phaseEnded })
			if errors.Is(err, bgjob.ErrNotFound) {
				return reply{}, fmt.Errorf("bgjob/fleet: %s %s: %w", op, id, bgjob.ErrNotFound)
			}
			if err != nil {
				return reply{}, fmt.Errorf("bgjob/fleet: %s %s: %w", op, id, err)
			}
			rec, rev = cur, curRev
			continue
		}
		if ctx.Err() != nil {
			return reply{}, fmt.Errorf("bgjob/fleet: %s %s: %w", op, id, ctx.Err())
		}
		if next, lost := c.gone(ctx, key, rec, rev); lost {
			rec = next
			continue
		}
		return reply{}, fmt.Errorf("bgjob/fleet: %s %s: worker %s did not answer: %w: %w", op, id, rec.Worker, ErrUnavailable, err)
	}
}
