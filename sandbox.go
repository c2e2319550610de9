package bgjob

import (
	"bytes"
	"fmt"
	"path/filepath"
	"slices"
)

// Sandbox says what a job may write, read and reach. Config.Sandbox is
// the default of every job; Spec.Sandbox, if set, replaces it (a job
// cannot opt out of the Config's sandbox, only choose another).
//
// The job may write its Dir, a private temporary directory (on Linux a
// fresh, empty /tmp that only it sees, in place of the host's; its
// TMPDIR) and the paths in Writable. It may read the whole filesystem
// (but the host's /tmp) if Readable is nil, else only: the paths in
// Readable and Writable, its Dir, the system's program and library
// folders (/usr, /bin, /sbin, /lib*, /etc, /opt), /dev's usual devices
// and its own /proc. Paths under the host's /tmp show through the private
// one when they are listed (so Readable: []string{"/", "/tmp/x"} is the
// whole filesystem and /tmp/x). Without Network it has its own network
// namespace, with nothing but a loopback interface of its own: nothing
// on the host's network, the host's loopback included, can be reached.
// It runs in its own PID namespace, so it cannot see or signal the host's
// processes, with no capabilities.
//
// Linux enforces it with bubblewrap (bwrap, found in PATH or at
// Config.Bwrap) in user namespaces, so an unprivileged host can use it.
// Where bwrap is missing or cannot make its namespaces, a sandboxed launch
// fails with ErrUnsupported, saying what is missing: it never runs
// unsandboxed. macOS enforces it with a sandbox-exec profile of the same
// meaning. Windows has no sandbox yet (ErrUnsupported); a later version
// would use an AppContainer with capabilities for network access.
//
// The job keeps its containment, limits, input and terminal inside the
// sandbox. Paths must be absolute and exist when the job is launched;
// symbolic links in them are resolved.
type Sandbox struct {
	Writable []string // paths the job may write; Dir and a private temp dir are added
	Readable []string // nil: the whole filesystem is readable
	Network  bool     // false: no network beyond its own loopback
}

// sandboxPaths resolves and checks the paths of sb: absolute, clean,
// existing, symbolic links resolved. owner names sb's field for errors
// ("Spec.Sandbox" or "Config.Sandbox").
func sandboxPaths(sb *Sandbox, owner string) (*Sandbox, error) {
	out := &Sandbox{Network: sb.Network}
	for _, l := range []struct {
		name string
		in   []string
		out  *[]string
	}{{"Writable", sb.Writable, &out.Writable}, {"Readable", sb.Readable, &out.Readable}} {
		if l.in != nil {
			*l.out = make([]string, 0, len(l.in))
		}
		for i, p := range l.in {
			field := fmt.Sprintf("%s.%s[%d]", owner, l.name, i)
			switch {
			case p == "":
				return nil, fmt.Errorf("%s: empty path", field)
			case hasNUL(p):
				return nil, fmt.Errorf("%s: holds a NUL byte", field)
			case !filepath.IsAbs(p):
				return nil, fmt.Errorf("%s: %q is not absolute", field, p)
			}
			real, err := filepath.EvalSymlinks(p)
			if err != nil {
				return nil, fmt.Errorf("%s: %w", field, err)
			}
			if !slices.Contains(*l.out, real) {
				*l.out = append(*l.out, real)
			}
		}
	}
	return out, nil
}

// sandboxOf returns the sandbox of a launch of spec: its own, else the
// registry's default, with its paths checked; nil for none.
func (r *Registry) sandboxOf(spec *Spec) (*Sandbox, error) {
	switch {
	case spec.Sandbox != nil:
		sb, err := sandboxPaths(spec.Sandbox, "Sandbox")
		if err != nil {
			return nil, fmt.Errorf("Spec.%w: %w", err, ErrInvalidSpec)
		}
		return sb, nil
	case r.cfg.Sandbox != nil:
		return r.defaultSandbox, nil
	}
	return nil, nil
}

// sandboxFailure reports whether a sandboxed job that exited with code
// never ran its command because the sandbox could not be set up, from
// the start of its output: bubblewrap then exits 1 and says why on its
// first line, which it returns.
func sandboxFailure(code int, head []byte) (string, bool) {
	if code != 1 || !bytes.HasPrefix(head, []byte("bwrap: ")) {
		return "", false
	}
	line, _, _ := bytes.Cut(head, []byte{'\n'})
	return string(line[:min(len(line), 200)]), true
}
