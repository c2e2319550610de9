package bgjob

import (
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"math"
	"slices"
	"time"

	"github.com/zeebo/blake3"
)

// idKeyContext separates bgjob's ID keys from any other use of the same
// key material.
const idKeyContext = "github.com/bgjob/bgjob 2026-11 job ID key"

// newIDKey returns the 32-byte key of the ID hash: derived from the
// configured key, or random.
func newIDKey(configured []byte) ([32]byte, error) {
	var k [32]byte
	if configured != nil {
		blake3.DeriveKey(idKeyContext, configured, k[:])
		return k, nil
	}
	_, err := rand.Read(k[:])
	return k, err
}

// jobID derives the ID of a launch from everything that makes two launches
// the same job: session, command or argument vector, resolved directory,
// effective timeouts, stdin and the environment (see hashID). It reuses keyed hashers: one
// holds 8 KiB of buffers, too much to make per launch.
func (r *Registry) jobID(spec *Spec, dir string, timeout time.Duration) ID {
	h, _ := r.hashers.Get().(*blake3.Hasher)
	if h == nil {
		h, _ = blake3.NewKeyed(r.key[:]) // the key is 32 bytes: never fails
	} else {
		h.Reset()
	}
	defer r.hashers.Put(h)
	return hashID(h, spec, dir, timeout)
}

// hashID writes the launch into the keyed hasher h, which must be fresh
// or reset, and makes the ID. Each field is length-prefixed so no two
// different launches hash the same bytes; the environment is sorted, so
// map order never matters. A launch with Args adds them last, after a
// count, so that the IDs of Command launches are those they always were
// and no Args launch (whose Command is empty) shares one with a Command
// launch (whose Command is not). A Unique launch mixes in a fresh nonce.
func hashID(h *blake3.Hasher, spec *Spec, dir string, timeout time.Duration) ID {
	var n [8]byte
	field := func(s string) {
		binary.LittleEndian.PutUint64(n[:], uint64(len(s)))
		h.Write(n[:])
		h.WriteString(s)
	}
	number := func(v int64) {
		binary.LittleEndian.PutUint64(n[:], uint64(v))
		h.Write(n[:])
	}
	field(spec.Session)
	field(spec.Command)
	field(dir)
	number(int64(timeout))
	number(int64(spec.IdleTimeout))
	field(spec.Stdin)
	keys := make([]string, 0, len(spec.Env))
	for k := range spec.Env {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	number(int64(len(keys)))
	for _, k := range keys {
		field(k)
		field(spec.Env[k])
	}
	if len(spec.Args) > 0 {
		number(int64(len(spec.Args)))
		for _, a := range spec.Args {
			field(a)
		}
	}
	if l := spec.Limits; !l.IsZero() {
		// Launches that differ only in their limits are different jobs;
		// those without limits keep the IDs they always had.
		field("limits")
		number(l.Memory)
		number(int64(l.Processes))
		number(int64(math.Float64bits(l.CPU)))
		number(int64(l.CPUTime))
		number(l.FileSize)
		number(int64(l.OpenFiles))
	}
	if sb := spec.Sandbox; sb != nil {
		// The sandbox as resolved (its own or the Config's): launches
		// with different sandboxes are different jobs.
		field("sandbox")
		number(int64(len(sb.Writable)))
		for _, p := range sb.Writable {
			field(p)
		}
		number(int64(len(sb.Readable)))
		if sb.Readable == nil {
			number(-1)
		}
		for _, p := range sb.Readable {
			field(p)
		}
		if sb.Network {
			number(1)
		} else {
			number(0)
		}
	}
	if spec.Leftovers != LeftoversStop {
		// A job that waits for its leftovers is another job than one
		// that stops them; the others keep the IDs they always had.
		field("leftovers")
		number(int64(spec.Leftovers))
	}
	if len(spec.Watches) > 0 {
		// So do launches that differ in their watches; those without
		// keep their IDs.
		field("watches")
		number(int64(len(spec.Watches)))
		for _, w := range spec.Watches {
			field(w.Name)
			field(w.Pattern.String())
			if w.Every {
				number(1)
			} else {
				number(0)
			}
		}
	}
	if spec.Unique {
		var nonce [16]byte
		rand.Read(nonce[:]) // never fails (crypto/rand panics instead)
		h.Write(nonce[:])
	}
	var sum [32]byte
	h.Sum(sum[:0])
	return ID("job_" + hex.EncodeToString(sum[:8]))
}

// joinLocked decides whether a launch joins old, the current run of its ID,
// instead of starting a new one, and records the joiner if so. A launch
// joins a running job; a RunForeground launch also joins a finished job
// whose result an earlier RunForeground caller has not yet read, so the
// callers of one burst of identical calls all share one run. A Start
// joining a job makes it pollable.
func (r *Registry) joinLocked(old *job, fg bool) bool {
	switch {
	case !old.finished:
	case fg && old.holders > 0:
	default:
		return false
	}
	if fg {
		old.holders++
	} else {
		old.pollable = true
	}
	return true
}
