package bgjob

import (
	"encoding/json"
	"reflect"
	"testing"
	"time"
)

// FuzzRecord feeds arbitrary bytes to decodeRecord, the decoder of a run
// folder's record.json, which replay trusts. It must never panic; a
// record it accepts must pass its own checks, and must come back equal
// through the encoder (json.Marshal, as writeRecordLocked writes it) and
// the decoder again, with the same bytes on a second encoding.
//
// The seed corpus is testdata/fuzz/FuzzRecord/.
func FuzzRecord(f *testing.F) {
	started := time.Date(2026, 11, 29, 12, 0, 0, 123456789, time.UTC)
	valid := record{
		Version: recordVersion, ID: "job_0123456789abcdef", Gen: 7, Session: "s", Command: "echo hi",
		Dir: "/tmp", Timeout: time.Minute, IdleTimeout: time.Second, State: "exited", ExitCode: 3,
		PID: 4242, StartTime: 987654, BootID: "b0a1c2d3-e4f5-4a6b-8c7d-9e0f1a2b3c4d",
		Started: started, Ended: started.Add(time.Second), Reason: "", Notice: "n", Pollable: true,
	}
	b, err := json.Marshal(&valid)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	starting := valid
	starting.State, starting.ExitCode, starting.PID, starting.StartTime, starting.Ended = stateStarting, exitUnknown, 0, 0, time.Time{}
	b, _ = json.Marshal(&starting)
	f.Add(b)
	f.Add(b[:len(b)/2])
	withArgs := valid
	withArgs.Args = []rawText{"printf", "%s|\n", "a  b", "caf\xe9"}
	withArgs.Command = rawText(quoteArgs(strs(withArgs.Args)))
	b, _ = json.Marshal(&withArgs)
	f.Add(b)
	f.Add([]byte(`{"version":1,"id":"job_1","gen":1,"state":"exited","args":[],"started":"2026-01-02T03:04:05Z"}`))
	f.Add([]byte(`{"version":2,"id":"job_1","state":"exited","started":"2026-01-02T03:04:05Z"}`))
	f.Add([]byte(`{"version":1,"id":"job_1","gen":18446744073709551615,"exit_code":9223372036854775807,"pid":-1,"start_time":18446744073709551615,"timeout_ns":-9223372036854775808,"state":"running","started":"9999-12-31T23:59:59.999999999+23:59"}`))
	f.Add([]byte(`{"version":"1","id":7,"state":true,"gen":-1,"started":0}`))
	f.Add([]byte(`{"version":1,"id":"job_1","state":"exited","started":"2026-01-02T03:04:05Z","ended":"0001-01-01T01:00:00+01:00"}`))

	f.Fuzz(func(t *testing.T, data []byte) {
		rec, err := decodeRecord(data)
		if err != nil {
			if rec != nil {
				t.Fatalf("decodeRecord returned a record with error %v", err)
			}
			return
		}
		// It passed the checks replay relies on.
		if rec.Version != recordVersion || len(rec.ID) < 4 || rec.ID[:4] != "job_" ||
			(rec.State != stateStarting && parseState(rec.State) < 0) {
			t.Fatalf("accepted a record that fails the checks: %+v", rec)
		}
		enc, err := json.Marshal(rec)
		if err != nil {
			t.Fatalf("accepted record does not encode: %v: %+v", err, rec)
		}
		back, err := decodeRecord(enc)
		if err != nil {
			t.Fatalf("re-encoded record rejected: %v\ninput %q\nencoded %s", err, data, enc)
		}
		if !recordsEqual(rec, back) {
			t.Fatalf("round trip changed the record:\ninput   %q\nfirst   %+v\nencoded %s\nsecond  %+v", data, rec, enc, back)
		}
		enc2, err := json.Marshal(back)
		if err != nil || string(enc2) != string(enc) {
			t.Fatalf("second encoding differs: %v\n%s\n%s", err, enc, enc2)
		}
	})
}

// recordsEqual compares records field by field, times as instants with
// the same zone offset (a decoded time's *Location is not comparable).
func recordsEqual(a, b *record) bool {
	sameTime := func(x, y time.Time) bool {
		_, ox := x.Zone()
		_, oy := y.Zone()
		return x.Equal(y) && (ox == oy || x.IsZero())
	}
	if !sameTime(a.Started, b.Started) || !sameTime(a.Ended, b.Ended) {
		return false
	}
	x, y := *a, *b
	x.Started, x.Ended, y.Started, y.Ended = time.Time{}, time.Time{}, time.Time{}, time.Time{}
	return reflect.DeepEqual(x, y)
}

// A record keeps every string byte for byte, valid UTF-8 or not.
func TestRecordKeepsBytes(t *testing.T) {
	for _, s := range []string{"", "plain", "caf\xe9", "client-\xff", "\x00nul", "\xed\xa0\x80 surrogate", "ok é ∑ 🙂", `{"base64":"x"}`} {
		rec := record{Version: recordVersion, ID: "job_0123456789abcdef", Gen: 1, State: "exited",
			Session: rawText(s), Command: rawText("printf '" + s + "'"), Dir: rawText("/tmp/" + s), Reason: rawText(s)}
		b, err := json.Marshal(&rec)
		if err != nil {
			t.Fatalf("%q: %v", s, err)
		}
		back, err := decodeRecord(b)
		if err != nil {
			t.Fatalf("%q: %v\n%s", s, err, b)
		}
		if back.Session != rec.Session || back.Command != rec.Command || back.Dir != rec.Dir || back.Reason != rec.Reason {
			t.Errorf("%q came back as %q %q %q %q", s, back.Session, back.Command, back.Dir, back.Reason)
		}
	}
}
