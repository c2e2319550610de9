package main

import (
	"errors"
	"net"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// shell_list shows a running job's processes and the port they listen on:
// a dev server that its shell started in the background, with leftovers:
// "wait" so that the job runs as long as the server. Cancelling it frees
// the port.
func TestListShowsProcessesAndPorts(t *testing.T) {
	srv := newTestServer(t, Options{})
	c := connect(t, srv)
	var out ShellOutput
	c.mustCall("shell", map[string]any{
		"command":    listenHelperEnv + "=1 '" + os.Args[0] + "' & echo started",
		"background": true,
		"leftovers":  "wait",
	}, &out)
	// Wait for the server to say its port: shell_status, blocking in
	// shell_wait (bounded) between reads.
	var port int
	re := regexp.MustCompile(`port (\d+)`)
	for end := time.Now().Add(testDeadline); port == 0; {
		var st StatusOutput
		c.mustCall("shell_status", map[string]any{"job_id": out.JobID}, &st)
		if m := re.FindStringSubmatch(st.Output); m != nil {
			port, _ = strconv.Atoi(m[1])
			break
		}
		if st.Done || time.Now().After(end) {
			t.Fatalf("no port in %+v", st)
		}
		c.mustCall("shell_wait", map[string]any{"job_id": out.JobID, "timeout_ms": 20}, nil)
	}
	var list ListOutput
	res := c.mustCall("shell_list", nil, &list)
	if len(list.Jobs) != 1 {
		t.Fatalf("shell_list: %+v; want one job", list.Jobs)
	}
	j := list.Jobs[0]
	if j.State != "running" || !slices.Contains(j.Ports, port) {
		t.Errorf("job %+v; want running, listening on %d", j, port)
	}
	if !slices.ContainsFunc(j.Processes, func(p ProcessInfo) bool { return strings.Contains(p.Command, os.Args[0]) }) {
		t.Errorf("processes %+v; want the server among them", j.Processes)
	}
	if txt := text(res); !strings.Contains(txt, "listening on port "+strconv.Itoa(port)) {
		t.Errorf("shell_list text %q; want the port", txt)
	}
	c.mustCall("shell_cancel", map[string]any{"job_id": out.JobID}, nil)
	if _, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port)); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Errorf("dial after cancel: %v; want connection refused", err)
	}
	if got := c.mustFail("shell", map[string]any{"command": "true", "leftovers": "sometimes"}); !strings.Contains(got, "leftovers") {
		t.Errorf("bad leftovers: %q", got)
	}
}
