package bgjob

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
)

// sandboxer is a registry's sandbox-exec, found once.
type sandboxer struct {
	once sync.Once
	path string
	err  error
}

// ready finds sandbox-exec. The configured path (Config.Bwrap) is for
// Linux's bubblewrap and means nothing here.
func (s *sandboxer) ready(string) error {
	s.once.Do(func() {
		s.path, s.err = exec.LookPath("/usr/bin/sandbox-exec")
		if s.err != nil {
			s.err = fmt.Errorf("sandbox: no /usr/bin/sandbox-exec: %w", ErrUnsupported)
		}
	})
	return s.err
}

// wrap has the job of pl run by sandbox-exec under a profile with the
// meaning of sb, with a private temporary directory of its own (its
// TMPDIR), which the process removes at the job's end. macOS has no
// network namespaces: without Network the job may not use the network
// at all, loopback included.
func (s *sandboxer) wrap(pl *plan, sb *Sandbox) error {
	dir, err := filepath.EvalSymlinks(pl.dir)
	if err != nil {
		return fmt.Errorf("sandbox: Dir: %w", err)
	}
	tmp, err := os.MkdirTemp("", "bgjob-sandbox-")
	if err != nil {
		return fmt.Errorf("sandbox: temp dir: %w", err)
	}
	if tmp, err = filepath.EvalSymlinks(tmp); err != nil { // /var -> /private/var
		return fmt.Errorf("sandbox: temp dir: %w", err)
	}
	pl.scratch = tmp
	pl.argv = append([]string{s.path, "-p", sandboxProfile(sb, dir, tmp)}, pl.argv...)
	pl.env = mergeEnv(pl.env, []string{"TMPDIR=" + tmp})
	return nil
}

// sandboxProfile writes the sandbox-exec profile (SBPL) of sb for a job
// in dir with the private temporary directory tmp.
func sandboxProfile(sb *Sandbox, dir, tmp string) string {
	var b strings.Builder
	b.WriteString("(version 1)\n(deny default)\n")
	for _, op := range []string{"process-fork", "process-exec", "sysctl-read", "mach-lookup", "ipc-posix-shm", "iokit-open", "pseudo-tty", "file-ioctl", "file-read-metadata"} {
		fmt.Fprintf(&b, "(allow %s)\n", op)
	}
	b.WriteString("(allow signal (target same-sandbox))\n")
	if sb.Readable == nil {
		b.WriteString("(allow file-read*)\n")
	} else {
		b.WriteString("(allow file-read*")
		for _, p := range append(append([]string{"/usr", "/bin", "/sbin", "/System", "/Library", "/private/etc", "/opt", "/dev", dir, tmp}, sb.Readable...), sb.Writable...) {
			fmt.Fprintf(&b, " (subpath %s)", sbplString(p))
		}
		b.WriteString(")\n")
	}
	b.WriteString("(allow file-write*")
	for _, p := range append([]string{dir, tmp}, sb.Writable...) {
		fmt.Fprintf(&b, " (subpath %s)", sbplString(p))
	}
	b.WriteString(` (literal "/dev/null") (literal "/dev/zero") (regex #"^/dev/fd/") (regex #"^/dev/tty"))` + "\n")
	if sb.Network {
		b.WriteString("(allow network*)\n")
	}
	return b.String()
}

// sbplString quotes s as an SBPL string.
func sbplString(s string) string {
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`
}
