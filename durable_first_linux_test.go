package bgjob_test

import (
	"io"
	"slices"
	"testing"

	"github.com/bgjob/bgjob"
)

// A durable job of Spec.Args: the wrapper runs the argv with no shell of
// its own, the record keeps every argument byte for byte, and an adopted
// job is followed to its end by the next Registry.
func TestDurableArgs(t *testing.T) {
	cfg := durable(t)
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	gate := t.TempDir() + "/gate"
	args := []string{"sh", "-c", `printf '[%s]' "$@"; while [ ! -e "$0" ]; do sleep 0.01; done; echo end`, gate, "a  b", "c;d", "\xff"}
	s, err := r1.Start(ctxT(t), bgjob.Spec{Args: args})
	if err != nil {
		t.Fatal(err)
	}
	want := "[a  b][c;d][\xff]"
	waitOutput(t, r1, s.ID, want, 1)
	runs := runFolders(t, cfg.StateDir)
	if len(runs) != 1 {
		t.Fatalf("%d run folders; want 1", len(runs))
	}
	rec := readRec(t, runs[0])
	got, _ := rec["args"].([]any)
	if len(got) != len(args) || got[0] != "sh" || got[4] != "a  b" {
		t.Errorf("record's args %v; want %q", rec["args"], args)
	} else if m, ok := got[6].(map[string]any); !ok || m["base64"] != "/w==" {
		t.Errorf("record's args[6] %v; want the byte 0xff kept (base64)", got[6])
	}
	if err := r1.Detach(); err != nil {
		t.Fatal(err)
	}
	r2 := newRegistry(t, cfg)
	f := r2.Follow(ctxT(t), s.ID, 0)
	touch(t, gate)
	out, err := io.ReadAll(f)
	if err != nil || string(out) != want+"end\n" {
		t.Errorf("followed %q, %v; want %q", out, err, want+"end\n")
	}
	final := wait(t, r2, s.ID)
	if final.State != bgjob.Exited || final.Command != s.Command {
		t.Errorf("adopted: %v %q; want exited, command %q", final.State, final.Command, s.Command)
	}
	if !slices.Equal(args, []string{"sh", "-c", args[2], gate, "a  b", "c;d", "\xff"}) {
		t.Errorf("the caller's args changed: %q", args)
	}
}

// In durable mode a completion that NextCompletion returned is recorded as
// delivered: the next Registry on the same StateDir does not queue it
// again, and one never delivered comes back once.
func TestDurableNextCompletionDelivers(t *testing.T) {
	cfg := durable(t)
	r1, err := bgjob.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	jobs := r1.Session("s")
	a, err := jobs.Start(ctxT(t), bgjob.Spec{Command: "exit 1"})
	if err != nil {
		t.Fatal(err)
	}
	c, err := jobs.NextCompletion(ctxT(t))
	if err != nil || c.ID != a.ID || c.ExitCode != 1 {
		t.Fatalf("NextCompletion = %+v, %v; want %s's", c, err, a.ID)
	}
	b, err := jobs.Start(ctxT(t), bgjob.Spec{Command: "exit 2"})
	if err != nil {
		t.Fatal(err)
	}
	wait(t, r1, b.ID)
	if err := r1.Close(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	r2 := newRegistry(t, cfg)
	c, err = r2.Session("s").NextCompletion(ctxT(t))
	if err != nil || c.ID != b.ID || c.ExitCode != 2 {
		t.Errorf("after a restart: %+v, %v; want only %s's, never delivered", c, err, b.ID)
	}
	if cs := r2.Completions("s"); len(cs) != 0 {
		t.Errorf("Completions after a restart: %v; want none left", cs)
	}
}
