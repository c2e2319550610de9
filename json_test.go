package bgjob_test

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/bgjob/bgjob"
)

// The public types marshal to JSON with snake_case names (those of the
// MCP example's tools), states and categories by name and times in RFC
// 3339, and come back as they were.
func TestJSONRoundTrip(t *testing.T) {
	started := time.Date(2026, 11, 29, 10, 0, 0, 123456789, time.UTC)
	ended := started.Add(1500 * time.Millisecond)
	out := bgjob.Output{Text: "head\n[... 7 bytes omitted ...]\ntail\n", Total: 17, Omitted: 7, Notice: "output truncated"}
	snap := bgjob.Snapshot{
		ID: "job_0123456789abcdef", Session: "s1", Command: "make test", Dir: "/src",
		State: bgjob.TimedOut, ExitCode: 124, PID: 4242, Started: started, Ended: ended,
		Joined: true, Output: out, Containment: bgjob.ContainCgroup, Reason: "timed out after 1s",
		Usage: bgjob.Usage{UserCPU: 1500 * time.Millisecond, SystemCPU: 2 * time.Millisecond, PeakMemory: 3 << 20},
	}
	for _, tc := range []struct {
		name string
		v    any
		want string // the exact JSON
	}{
		{"snapshot", snap, `{"job_id":"job_0123456789abcdef","session":"s1","command":"make test","cwd":"/src",` +
			`"state":"timed_out","exit_code":124,"pid":4242,"started":"2026-11-29T10:00:00.123456789Z",` +
			`"ended":"2026-11-29T10:00:01.623456789Z","joined":true,"output":{"text":"head\n[... 7 bytes omitted ...]\ntail\n",` +
			`"total_bytes":17,"omitted_bytes":7,"notice":"output truncated"},"containment":"cgroup","reason":"timed out after 1s",` +
			`"usage":{"user_cpu_ns":1500000000,"system_cpu_ns":2000000,"peak_memory_bytes":3145728}}`},
		{"limits", bgjob.Limits{Memory: 1 << 30, Processes: 64, CPU: 1.5, CPUTime: time.Minute, FileSize: 1 << 20, OpenFiles: 256},
			`{"memory_bytes":1073741824,"processes":64,"cpu":1.5,"cpu_time_ns":60000000000,"file_size_bytes":1048576,"open_files":256}`},
		{"running-snapshot-has-no-end", bgjob.Snapshot{ID: "job_1", State: bgjob.Running, ExitCode: -1, Started: started},
			`{"job_id":"job_1","session":"","command":"","cwd":"","state":"running","exit_code":-1,"pid":0,` +
				`"started":"2026-11-29T10:00:00.123456789Z","output":{"text":"","total_bytes":0,"omitted_bytes":0},"containment":"session"}`},
		{"output-withheld", bgjob.Output{Total: 5, Omitted: 5, Withheld: true, Notice: "output withheld by policy"},
			`{"text":"","total_bytes":5,"omitted_bytes":5,"withheld":true,"notice":"output withheld by policy"}`},
		{"chunk", bgjob.Chunk{Data: "b\n", Offset: 10, Next: 12, Skipped: 3, Done: true},
			`{"data":"b\n","offset":10,"next_offset":12,"skipped":3,"done":true}`},
		{"completion", bgjob.Completion{ID: "job_2", Session: "s", Command: "exit 3", State: bgjob.Exited, ExitCode: 3, Ended: ended},
			`{"job_id":"job_2","session":"s","command":"exit 3","state":"exited","exit_code":3,"ended":"2026-11-29T10:00:01.623456789Z"}`},
		{"queued-snapshot", bgjob.Snapshot{ID: "job_4", State: bgjob.Queued, ExitCode: -1, Started: started, QueuePosition: 3},
			`{"job_id":"job_4","session":"","command":"","cwd":"","state":"queued","exit_code":-1,"pid":0,` +
				`"started":"2026-11-29T10:00:00.123456789Z","output":{"text":"","total_bytes":0,"omitted_bytes":0},"containment":"session","queue_position":3}`},
		{"dev-server-snapshot", bgjob.Snapshot{ID: "job_5", State: bgjob.Running, ExitCode: -1, PID: 10, Started: started,
			Processes: []bgjob.Process{{PID: 11, PPID: 1, Command: "node server.js"}}, Ports: []int{3000}},
			`{"job_id":"job_5","session":"","command":"","cwd":"","state":"running","exit_code":-1,"pid":10,` +
				`"started":"2026-11-29T10:00:00.123456789Z","output":{"text":"","total_bytes":0,"omitted_bytes":0},"containment":"session",` +
				`"processes":[{"pid":11,"ppid":1,"command":"node server.js"}],"ports":[3000]}`},
		{"spec-leftovers", struct{ L bgjob.Leftovers }{bgjob.LeftoversWait}, `{"L":"wait"}`},
		{"result", bgjob.Result{Snapshot: bgjob.Snapshot{ID: "job_3", State: bgjob.Running, Started: started}, Detached: true},
			`{"job_id":"job_3","session":"","command":"","cwd":"","state":"running","exit_code":0,"pid":0,` +
				`"started":"2026-11-29T10:00:00.123456789Z","output":{"text":"","total_bytes":0,"omitted_bytes":0},"containment":"session","detached":true}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := json.Marshal(tc.v)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tc.want {
				t.Errorf("got  %s\nwant %s", b, tc.want)
			}
			back := reflect.New(reflect.TypeOf(tc.v))
			if err := json.Unmarshal(b, back.Interface()); err != nil {
				t.Fatal(err)
			}
			if got := back.Elem().Interface(); !reflect.DeepEqual(got, tc.v) {
				t.Errorf("round trip: got %+v; want %+v", got, tc.v)
			}
		})
	}
}

// State, Category, Containment and Leftovers marshal as their String
// names, and unmarshal from nothing else. The states keep their numbers:
// Queued came last.
func TestEnumsAsText(t *testing.T) {
	type pair struct {
		v    interface{ MarshalText() ([]byte, error) }
		name string
	}
	var cases []pair
	for _, s := range []bgjob.State{bgjob.Running, bgjob.Exited, bgjob.Cancelled, bgjob.TimedOut, bgjob.Failed, bgjob.Queued} {
		cases = append(cases, pair{s, s.String()})
	}
	for _, l := range []bgjob.Leftovers{bgjob.LeftoversStop, bgjob.LeftoversWait} {
		cases = append(cases, pair{l, l.String()})
	}
	for _, c := range []bgjob.Category{bgjob.CategoryNone, bgjob.CategoryCommand, bgjob.CategoryTimeout, bgjob.CategoryCancelled, bgjob.CategorySpawn} {
		cases = append(cases, pair{c, c.String()})
	}
	for _, c := range []bgjob.Containment{bgjob.ContainSession, bgjob.ContainCgroup, bgjob.ContainJobObject} {
		cases = append(cases, pair{c, c.String()})
	}
	for _, tc := range cases {
		b, err := tc.v.MarshalText()
		if err != nil || string(b) != tc.name {
			t.Errorf("%T %v: MarshalText = %q, %v; want %q", tc.v, tc.v, b, err, tc.name)
		}
		back := reflect.New(reflect.TypeOf(tc.v))
		u := back.Interface().(interface{ UnmarshalText([]byte) error })
		if err := u.UnmarshalText(b); err != nil || back.Elem().Interface() != tc.v {
			t.Errorf("%T %q: UnmarshalText gave %v, %v", tc.v, b, back.Elem().Interface(), err)
		}
	}
	for i, want := range []string{"running", "exited", "cancelled", "timed_out", "failed", "queued"} {
		if got := bgjob.State(i).String(); got != want {
			t.Errorf("State(%d) = %q; want %q", i, got, want)
		}
	}
	for _, s := range []bgjob.State{bgjob.Running, bgjob.Queued} {
		if s.Done() {
			t.Errorf("%v.Done() = true; want false", s)
		}
	}
	var s bgjob.State
	for _, bad := range []string{"", "Running", "done", "1", "unknown"} {
		if err := s.UnmarshalText([]byte(bad)); err == nil || !strings.Contains(err.Error(), "want one of") {
			t.Errorf("State.UnmarshalText(%q) = %v; want an error listing the names", bad, err)
		}
	}
	var c bgjob.Category
	if err := json.Unmarshal([]byte(`"timed_out"`), &c); err == nil {
		t.Errorf("Category from a state's name: no error")
	}
	if _, err := json.Marshal(bgjob.State(9)); err == nil {
		t.Errorf("Marshal(State(9)): no error; want one")
	}
}
