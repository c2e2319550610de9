//go:build unix

package bgjob_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/bgjob/bgjob"
)

// Spec.Args runs an argv with no shell: what a shell would split, expand
// or interpret reaches the program as it is.
func TestArgs(t *testing.T) {
	r := newRegistry(t, bgjob.Config{})
	dir := t.TempDir()
	script := filepath.Join(dir, "show")
	if err := os.WriteFile(script, []byte("#!/bin/sh\nprintf '[%s]' \"$0\" \"$@\"\n"), 0o755); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name    string
		args    []string
		dir     string
		want    string
		command string // Snapshot.Command
	}{
		// The case of issue #20: a CLI forwarding its os.Args.
		{"spaces-and-semicolons-stay-arguments", []string{"printf", `%s|\n`, "a  b", "c;d"}, "", "a  b|\nc;d|\n", `printf '%s|\n' 'a  b' 'c;d'`},
		{"nothing-is-expanded", []string{"printf", `%s\n`, "$HOME", "*", "`id`", "$(id)", "~"}, "", "$HOME\n*\n`id`\n$(id)\n~\n", `printf '%s\n' '$HOME' '*' '` + "`id`" + `' '$(id)' '~'`},
		{"quotes-and-empty-arguments", []string{"printf", "<%s>", "it's", "", `"x"`}, "", `<it's><><"x">`, `printf '<%s>' 'it'\''s' '' '"x"'`},
		{"absolute-program", []string{script, "a"}, "", "[" + script + "][a]", script + " a"},
		{"relative-program-from-the-jobs-dir", []string{"./show", "b"}, dir, "[./show][b]", "./show b"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, err := r.Start(ctxT(t), bgjob.Spec{Args: tc.args, Dir: tc.dir})
			if err != nil {
				t.Fatal(err)
			}
			s = wait(t, r, s.ID)
			if s.State != bgjob.Exited || s.ExitCode != 0 || s.Output.Text != tc.want {
				t.Errorf("got %v %d %q (%s); want exited 0 %q", s.State, s.ExitCode, s.Output.Text, s.Reason, tc.want)
			}
			if s.Command != tc.command {
				t.Errorf("Command %s; want %s", s.Command, tc.command)
			}
			// Snapshot.Command, run by the shell, runs the same argv.
			if !strings.HasPrefix(tc.args[0], "./") {
				sh, err := r.RunForeground(ctxT(t), bgjob.Spec{Command: s.Command, Dir: tc.dir}, bgjob.Foreground{})
				if err != nil || sh.Output.Text != tc.want {
					t.Errorf("sh -c %s: %q, %v; want %q", s.Command, sh.Output.Text, err, tc.want)
				}
			}
		})
	}
	t.Run("program-is-looked-up-in-the-hosts-path", func(t *testing.T) {
		// Spec.Env's PATH is the job's, not where its program is found.
		s, err := r.Start(ctxT(t), bgjob.Spec{Args: []string{"sh", "-c", "echo $PATH"}, Env: map[string]string{"PATH": "/nowhere"}})
		if err != nil {
			t.Fatal(err)
		}
		if s = wait(t, r, s.ID); s.State != bgjob.Exited || s.Output.Text != "/nowhere\n" {
			t.Errorf("got %v %q (%s); want sh found, with the job's PATH", s.State, s.Output.Text, s.Reason)
		}
	})
	t.Run("args-join-like-commands", func(t *testing.T) {
		spec := bgjob.Spec{Args: []string{"sleep", "300"}}
		a, err := r.Start(ctxT(t), spec)
		if err != nil {
			t.Fatal(err)
		}
		b, err := r.Start(ctxT(t), spec)
		if err != nil || b.ID != a.ID || !b.Joined {
			t.Errorf("second Start: %s joined %v, %v; want a join of %s", b.ID, b.Joined, err, a.ID)
		}
		// The same words as a Command are another job.
		c, err := r.Start(ctxT(t), bgjob.Spec{Command: "sleep 300"})
		if err != nil || c.ID == a.ID {
			t.Errorf("Command %q: %s, %v; want an ID of its own", "sleep 300", c.ID, err)
		}
		r.Cancel(a.ID)
		r.Cancel(c.ID)
	})
	t.Run("caller-may-reuse-its-slice", func(t *testing.T) {
		args := []string{"echo", "kept"}
		s, err := r.Start(ctxT(t), bgjob.Spec{Args: args, Unique: true})
		if err != nil {
			t.Fatal(err)
		}
		args[1] = "changed"
		if s = wait(t, r, s.ID); s.Output.Text != "kept\n" {
			t.Errorf("output %q; want kept", s.Output.Text)
		}
	})
}

// A bad Args is refused before anything runs, with an error naming the
// field.
func TestArgsInvalid(t *testing.T) {
	tel := &telemetryRecorder{}
	r := newRegistry(t, bgjob.Config{Telemetry: tel})
	for _, tc := range []struct {
		name  string
		spec  bgjob.Spec
		field string
	}{
		{"both-command-and-args", bgjob.Spec{Command: "echo", Args: []string{"echo"}}, "Spec.Args"},
		{"blank-command-and-args", bgjob.Spec{Command: " ", Args: []string{"echo"}}, "Spec.Args"},
		{"neither", bgjob.Spec{}, "Spec.Command"},
		{"empty-program", bgjob.Spec{Args: []string{"", "x"}}, "Spec.Args"},
		{"nul-in-program", bgjob.Spec{Args: []string{"ec\x00ho"}}, "Spec.Args"},
		{"nul-in-argument", bgjob.Spec{Args: []string{"echo", "a\x00b"}}, "Spec.Args"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := r.Start(ctxT(t), tc.spec)
			mustErr(t, err, bgjob.ErrInvalidSpec)
			if !strings.Contains(err.Error(), tc.field) {
				t.Errorf("%v; want it to name %s", err, tc.field)
			}
		})
	}
	if started, finished := tel.counts(); started+finished != 0 {
		t.Errorf("%d started, %d finished; want nothing run", started, finished)
	}
}
