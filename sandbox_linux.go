package bgjob

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// sandboxer is a registry's bubblewrap: found, and tried once, at the
// first sandboxed launch (or by New, with Config.Sandbox).
type sandboxer struct {
	once sync.Once
	path string
	err  error
}

// ready finds bwrap (configured, else "bwrap" in PATH) and checks, by
// running it once, that it can make its namespaces here. Its error wraps
// ErrUnsupported and says what is missing.
func (s *sandboxer) ready(configured string) error {
	s.once.Do(func() {
		name := configured
		if name == "" {
			name = "bwrap"
		}
		path, err := exec.LookPath(name)
		if err != nil {
			s.err = fmt.Errorf("sandbox: no bubblewrap (%s): install the bubblewrap package, or set Config.Bwrap: %w", name, ErrUnsupported)
			return
		}
		check := append(bwrapBase(&Sandbox{}), "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--", "/bin/sh", "-c", ":")
		out, err := exec.Command(path, check...).CombinedOutput()
		if err != nil {
			msg := strings.TrimSpace(string(out))
			if msg == "" {
				msg = err.Error()
			}
			s.err = fmt.Errorf("sandbox: %s cannot make its namespaces here (user namespaces off?): %s: %w", path, msg, ErrUnsupported)
			return
		}
		s.path = path
	})
	return s.err
}

// bwrapBase is the start of every sandbox's bwrap command line: its
// namespaces (all but the network's, with Network) and no capabilities.
func bwrapBase(sb *Sandbox) []string {
	a := []string{"--unshare-all", "--cap-drop", "ALL"}
	if sb.Network {
		a = append(a, "--share-net")
	}
	return a
}

// systemDirs are what a job whose reads are listed may read besides
// them: the system's programs, libraries and configuration.
var systemDirs = []string{"/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32", "/etc", "/opt"}

// wrap has the job of pl run by bwrap in sb: its argv follows bwrap's
// options after "--", so nothing of it is read as one of them; its
// TMPDIR is the sandbox's private /tmp.
func (s *sandboxer) wrap(pl *plan, sb *Sandbox) error {
	dir, err := filepath.EvalSymlinks(pl.dir)
	if err != nil {
		return fmt.Errorf("sandbox: Dir: %w", err)
	}
	a := append([]string{s.path}, bwrapBase(sb)...)
	if sb.Readable == nil {
		a = append(a, "--ro-bind", "/", "/")
	} else {
		for _, d := range systemDirs {
			if t, err := os.Readlink(d); err == nil {
				a = append(a, "--symlink", t, d) // /bin -> usr/bin where /usr is merged
				continue
			}
			a = append(a, "--ro-bind-try", d, d)
		}
	}
	// Its own /dev, /proc and /tmp, then the paths listed, read-only and
	// then writable: a listed path under the host's /tmp shows through
	// the private one, and a writable path inside a readable one is
	// writable.
	a = append(a, "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp")
	for _, p := range sb.Readable {
		a = append(a, "--ro-bind", p, p)
	}
	for _, p := range append([]string{dir}, sb.Writable...) {
		a = append(a, "--bind", p, p)
	}
	a = append(a, "--chdir", dir, "--")
	pl.argv = append(a, pl.argv...)
	pl.env = mergeEnv(pl.env, []string{"TMPDIR=/tmp"})
	return nil
}
