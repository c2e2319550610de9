package bgjob

import (
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"
)

// launch holds the fields of a launch that make its ID.
type launch struct {
	session, command, dir string
	timeout, idle         int64
	stdin                 string
	env                   map[string]string
}

func (l launch) id(key *[32]byte, unique bool) ID {
	spec := Spec{Session: l.session, Command: l.command, Dir: l.dir, Stdin: l.stdin,
		Timeout: time.Duration(l.timeout), IdleTimeout: time.Duration(l.idle), Env: l.env, Unique: unique}
	return freshID(key, &spec, l.dir, time.Duration(l.timeout))
}

func (l launch) equal(m launch) bool {
	return l.session == m.session && l.command == m.command && l.dir == m.dir &&
		l.timeout == m.timeout && l.idle == m.idle && l.stdin == m.stdin && maps.Equal(l.env, m.env)
}

// parseEnv reads "k=v" lines into a map; "" is no environment at all.
func parseEnv(s string) map[string]string {
	if s == "" {
		return nil
	}
	env := map[string]string{}
	for _, kv := range strings.Split(s, "\n") {
		k, v, _ := strings.Cut(kv, "=")
		env[k] = v
	}
	return env
}

// neighbours returns launches that differ from l by as little as an
// encoding without field boundaries could confuse: one byte moved across
// each boundary between string fields or between an env key and its
// value, an env entry dropped or added, a timeout moved by one or the two
// timeouts swapped.
func (l launch) neighbours() []launch {
	var out []launch
	fields := []*string{&l.session, &l.command, &l.dir, &l.stdin}
	for i := 0; i+1 < len(fields); i++ {
		if a := *fields[i]; a != "" {
			m := l
			mf := []*string{&m.session, &m.command, &m.dir, &m.stdin}
			*mf[i], *mf[i+1] = a[:len(a)-1], a[len(a)-1:]+*mf[i+1]
			out = append(out, m)
		}
		if b := *fields[i+1]; b != "" {
			m := l
			mf := []*string{&m.session, &m.command, &m.dir, &m.stdin}
			*mf[i], *mf[i+1] = *mf[i]+b[:1], b[1:]
			out = append(out, m)
		}
	}
	for k, v := range l.env {
		with := func(nk, nv string) launch {
			m := l
			m.env = maps.Clone(l.env)
			delete(m.env, k)
			m.env[nk] = nv
			return m
		}
		if k != "" {
			out = append(out, with(k[:len(k)-1], k[len(k)-1:]+v))
		}
		if v != "" {
			out = append(out, with(k+v[:1], v[1:]))
		}
		m := l
		m.env = maps.Clone(l.env)
		delete(m.env, k)
		out = append(out, m)
	}
	m := l
	m.env = maps.Clone(l.env)
	if m.env == nil {
		m.env = map[string]string{}
	}
	m.env[l.stdin+"\x00extra"] = ""
	out = append(out, m)
	for _, d := range []int64{-1, 1} {
		m := l
		m.timeout += d
		out = append(out, m)
		m = l
		m.idle += d
		out = append(out, m)
	}
	m = l
	m.timeout, m.idle = l.idle, l.timeout
	out = append(out, m)
	return out
}

// reordered returns l's environment built by other insertion orders: the
// keys sorted backwards into a map sized otherwise, and a copy.
func (l launch) reordered() []launch {
	if l.env == nil {
		return nil
	}
	keys := slices.Sorted(maps.Keys(l.env))
	slices.Reverse(keys)
	back := make(map[string]string, 1)
	for _, k := range keys {
		back[k] = l.env[k]
	}
	a, b := l, l
	a.env, b.env = back, maps.Clone(l.env)
	return []launch{a, b}
}

var idForm = regexp.MustCompile(`^job_[0-9a-f]{16}$`)

// FuzzJobID checks that two launches get the same ID exactly when every
// field that makes the ID is the same, whatever the env's map order; that
// no near neighbour of a launch collides with it; that the key and
// Unique change the ID; and the ID's form.
func FuzzJobID(f *testing.F) {
	f.Add("", "echo hi", "/tmp", int64(0), int64(0), "", "A=1\nB=2", "", "echo hi", "/tmp", int64(0), int64(0), "", "B=2\nA=1")
	f.Add("s", "ab", "c", int64(1), int64(2), "x", "k=v", "sa", "b", "c", int64(1), int64(2), "x", "k=v")
	f.Add("", "a", "", int64(5), int64(0), "", "ab=c", "", "a", "", int64(0), int64(5), "", "a=bc")
	f.Add("sess", "make", "/src", int64(time.Minute), int64(time.Second), "in\x00put", "=\n=x\nK=", "sess", "make", "/src", int64(time.Minute), int64(time.Second), "in\x00put", "=x\nK=")
	f.Fuzz(func(t *testing.T,
		s1, c1, d1 string, t1, i1 int64, in1, e1 string,
		s2, c2, d2 string, t2, i2 int64, in2, e2 string) {
		var key, other [32]byte
		copy(key[:], "bgjob fuzz key: 32 bytes long...")
		copy(other[:], "bgjob fuzz key, another one.....")
		a := launch{s1, c1, d1, t1, i1, in1, parseEnv(e1)}
		b := launch{s2, c2, d2, t2, i2, in2, parseEnv(e2)}
		idA := a.id(&key, false)
		if !idForm.MatchString(string(idA)) {
			t.Fatalf("ID %q; want job_ and 16 hex digits", idA)
		}
		same := func(what string, m launch) {
			t.Helper()
			if id := m.id(&key, false); id != idA {
				t.Errorf("%s: ID %s; want %s for the same launch %+v", what, id, idA, a)
			}
		}
		apart := func(what string, m launch) {
			t.Helper()
			if m.equal(a) {
				same(what, m)
				return
			}
			if id := m.id(&key, false); id == idA {
				t.Errorf("%s: %+v and %+v differ but share ID %s", what, a, m, id)
			}
		}
		same("again", a)
		for _, m := range a.reordered() {
			same("env in another order", m)
		}
		apart("the other launch", b)
		for _, m := range a.neighbours() {
			apart("a neighbour", m)
		}
		if a.id(&other, false) == idA {
			t.Errorf("another key gave the same ID %s", idA)
		}
		u1, u2 := a.id(&key, true), a.id(&key, true)
		if u1 == u2 || u1 == idA || !idForm.MatchString(string(u1)) {
			t.Errorf("Unique IDs %s, %s (plain %s); want two new ones", u1, u2, idA)
		}
	})
}
