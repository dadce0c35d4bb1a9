package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// Every field of every kind of audit line, against what happened: the
// keys each kind has and no other, the identity from the certificate, the
// client's address, the tokens the clients were given, the reasons, and
// times and durations within what the test measured.
func TestAuditLinesFieldByField(t *testing.T) {
	setup := newTLSSetup(t, `{"rules":[{"identity":"spiffe://prod/a","locks":["audit-*"]}]}`)
	audit := filepath.Join(setup.dir, "audit.log")
	s := start(t, eastOfUTC(t), append(setup.flags(), "-audit-log", audit, "-admin-listen", "127.0.0.1:0")...)
	const identity = "spiffe://prod/a"
	cfg := setup.clientConfig(t, setup.clientCA, leafOpts{cn: "a", uris: []string{identity}})
	begin := time.Now()

	fa, a, err := tlsAcquire(t, s.addr, cfg, "audit-x")
	if err != nil || fa.Type != monolock.TypeAcquired {
		t.Fatalf("a: %+v %v", fa, err)
	}
	fb, b, err := tlsAcquire(t, s.addr, cfg, "audit-x")
	if err != nil || fb.Type != monolock.TypeWaiting {
		t.Fatalf("b: %+v %v", fb, err)
	}
	fc, c, err := tlsAcquire(t, s.addr, cfg, "forbidden")
	if err != nil || fc.Code != monolock.CodeNotAuthorized {
		t.Fatalf("c: %+v %v", fc, err)
	}
	time.Sleep(200 * time.Millisecond) // a holds for 200 ms, b waits as long
	aHeld := time.Since(begin)
	a.Close()
	b.SetReadDeadline(time.Now().Add(10 * time.Second))
	fb, err = monolock.ReadFrame(b)
	if err != nil || fb.Type != monolock.TypeAcquired {
		t.Fatalf("b after a: %+v %v", fb, err)
	}
	bWaited := time.Since(begin)
	if code, body := httpDo(t, "POST", fmt.Sprintf("http://%s/api/locks/audit-x/release?token=%d", s.admin, fb.Token)); code != 200 {
		t.Fatalf("force release: %d %s", code, body)
	}
	fe, e, err := tlsAcquire(t, s.addr, cfg, "audit-y")
	if err != nil || fe.Type != monolock.TypeAcquired {
		t.Fatalf("e: %+v %v", fe, err)
	}
	ff, f, err := tlsAcquire(t, s.addr, cfg, "audit-y")
	if err != nil || ff.Type != monolock.TypeWaiting {
		t.Fatalf("f: %+v %v", ff, err)
	}
	if code, body := httpDo(t, "DELETE", fmt.Sprintf("http://%s/api/locks/audit-y/waiters/%s", s.admin, f.LocalAddr())); code != 200 {
		t.Fatalf("kick: %d %s", code, body)
	}
	e.Close()
	waitForAuditLines(t, audit, 9)
	end := time.Now()

	type line = map[string]any
	tok := func(v uint64) json.Number { return json.Number(strconv.FormatUint(v, 10)) }
	want := []line{
		{"event": "granted", "lock": "audit-x", "remote_addr": a.LocalAddr().String(), "token": tok(fa.Token), "wait_ms": "~0"},
		{"event": "denied", "lock": "forbidden", "remote_addr": c.LocalAddr().String()},
		{"event": "released", "lock": "audit-x", "remote_addr": a.LocalAddr().String(), "token": tok(fa.Token), "held_ms": fmt.Sprintf("~%d", aHeld.Milliseconds()), "reason": "graceful"},
		{"event": "granted", "lock": "audit-x", "remote_addr": b.LocalAddr().String(), "token": tok(fb.Token), "wait_ms": fmt.Sprintf("~%d", bWaited.Milliseconds())},
		{"event": "force_release", "lock": "audit-x", "remote_addr": b.LocalAddr().String(), "token": tok(fb.Token)},
		{"event": "released", "lock": "audit-x", "remote_addr": b.LocalAddr().String(), "token": tok(fb.Token), "held_ms": "~0", "reason": "force"},
		{"event": "granted", "lock": "audit-y", "remote_addr": e.LocalAddr().String(), "token": tok(fe.Token), "wait_ms": "~0"},
		{"event": "kick_waiter", "lock": "audit-y", "remote_addr": f.LocalAddr().String()},
		{"event": "released", "lock": "audit-y", "remote_addr": e.LocalAddr().String(), "token": tok(fe.Token), "held_ms": "~0", "reason": "graceful"},
	}
	data, _ := os.ReadFile(audit)
	var got []line
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		dec := json.NewDecoder(strings.NewReader(sc.Text()))
		dec.UseNumber()
		var l line
		if err := dec.Decode(&l); err != nil {
			t.Fatalf("audit line %q: %v", sc.Text(), err)
		}
		got = append(got, l)
	}
	if len(got) != len(want) {
		t.Fatalf("%d audit lines, want %d:\n%s", len(got), len(want), data)
	}
	wantKeys := map[string][]string{
		"granted":       {"event", "identity", "lock", "remote_addr", "time", "token", "wait_ms"},
		"released":      {"event", "held_ms", "identity", "lock", "reason", "remote_addr", "time", "token"},
		"force_release": {"event", "identity", "lock", "remote_addr", "time", "token"},
		"denied":        {"event", "identity", "lock", "remote_addr", "time"},
		"kick_waiter":   {"event", "identity", "lock", "remote_addr", "time"},
	}
	var last time.Time
	for i, g := range got {
		w := want[i]
		var keys []string
		for k := range g {
			keys = append(keys, k)
		}
		slices.Sort(keys)
		if !slices.Equal(keys, wantKeys[fmt.Sprint(w["event"])]) {
			t.Errorf("line %d (%v): keys %v, want %v", i+1, w["event"], keys, wantKeys[fmt.Sprint(w["event"])])
		}
		ts, err := time.Parse(time.RFC3339Nano, fmt.Sprint(g["time"]))
		if err != nil || !strings.HasSuffix(fmt.Sprint(g["time"]), "Z") || ts.Before(begin.Add(-time.Second)) || ts.After(end.Add(time.Second)) || ts.Before(last) {
			t.Errorf("line %d: time %v (%v): not UTC RFC 3339, not between %v and %v, or before the line above", i+1, g["time"], err, begin, end)
		}
		last = ts
		if g["identity"] != identity {
			t.Errorf("line %d: identity %v, want %s", i+1, g["identity"], identity)
		}
		for k, v := range w {
			switch s := fmt.Sprint(v); {
			case strings.HasPrefix(s, "~"): // a duration in ms, within 150 ms of the test's measure (which comes later)
				want, _ := strconv.Atoi(s[1:])
				n, err := strconv.Atoi(fmt.Sprint(g[k]))
				if err != nil || n < 0 || n > want+150 || n < want-150 {
					t.Errorf("line %d: %s = %v, want about %d", i+1, k, g[k], want)
				}
			default:
				if fmt.Sprint(g[k]) != s {
					t.Errorf("line %d: %s = %v, want %v", i+1, k, g[k], s)
				}
			}
		}
	}
}
