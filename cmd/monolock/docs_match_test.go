package main

// The operator interfaces as the documentation publishes them: the admin
// API's JSON (names and JSON types), what each metric counts, and the
// diagnostics' timestamps. Each test drives the real binary with real
// clients and asserts the exact documented names.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// jsonKind names the JSON type of a value decoded with UseNumber, telling
// integers from other numbers.
func jsonKind(v any) string {
	switch v := v.(type) {
	case nil:
		return "null"
	case bool:
		return "bool"
	case string:
		return "string"
	case json.Number:
		if _, err := strconv.ParseInt(v.String(), 10, 64); err == nil {
			return "int"
		}
		if _, err := strconv.ParseUint(v.String(), 10, 64); err == nil {
			return "int"
		}
		return "number"
	case map[string]any:
		return "object"
	case []any:
		return "array"
	}
	return fmt.Sprintf("%T", v)
}

func decodeJSON(t *testing.T, body string) map[string]any {
	t.Helper()
	dec := json.NewDecoder(strings.NewReader(body))
	dec.UseNumber()
	var m map[string]any
	if err := dec.Decode(&m); err != nil {
		t.Fatalf("not a JSON object: %v\n%s", err, body)
	}
	return m
}

// checkFields checks that obj has every field of want, with its JSON type.
// Extra fields are allowed.
func checkFields(t *testing.T, what string, obj any, want map[string]string) map[string]any {
	t.Helper()
	m, ok := obj.(map[string]any)
	if !ok {
		t.Fatalf("%s is %s, want an object", what, jsonKind(obj))
	}
	for name, kind := range want {
		v, present := m[name]
		if !present {
			t.Errorf("%s has no field %q (fields: %v)", what, name, keys(m))
		} else if got := jsonKind(v); got != kind {
			t.Errorf("%s.%s is %s (%v), want %s", what, name, got, v, kind)
		}
	}
	return m
}

func keys(m map[string]any) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return sorted(out)
}

// utcTime parses an RFC 3339 timestamp that must be in UTC.
func utcTime(t *testing.T, what string, v any) time.Time {
	t.Helper()
	s, _ := v.(string)
	ts, err := time.Parse(time.RFC3339Nano, s)
	if err != nil || !strings.HasSuffix(s, "Z") {
		t.Fatalf("%s = %q, want an RFC 3339 time in UTC (err %v)", what, s, err)
	}
	return ts
}

func TestAdminInfoHasTheDocumentedFields(t *testing.T) {
	s := start(t, nil, "-admin-listen", "127.0.0.1:0", "-io-timeout", "3s")
	rawAcquire(t, s.addr, "x", time.Minute)
	if _, f := rawAcquire(t, s.addr, "x", time.Minute); f.Type != monolock.TypeWaiting {
		t.Fatalf("second client on x got %+v, want WAITING", f)
	}
	rawAcquire(t, s.addr, "y", time.Minute)
	time.Sleep(50 * time.Millisecond) // uptime_ms above 0 for sure

	code, body := httpGet(t, "http://"+s.admin+"/api/info")
	if code != 200 {
		t.Fatalf("/api/info: %d %s", code, body)
	}
	info := checkFields(t, "info", decodeJSON(t, body), map[string]string{
		"version": "string", "uptime_ms": "int", "config": "object", "locks": "int", "sessions": "int",
		"waiters": "int", "connections": "int"})
	config := checkFields(t, "info.config", info["config"], map[string]string{
		"listen": "string", "ops_listen": "string", "admin_listen": "string", "tls": "bool", "mtls": "bool",
		"acl_file": "string", "audit_log": "string", "io_timeout_ms": "int", "log_level": "string", "log_format": "string"})
	if t.Failed() {
		t.Fatalf("in\n%s", body)
	}
	for name, want := range map[string]string{"locks": "2", "sessions": "3", "waiters": "1", "connections": "3"} {
		if got := info[name].(json.Number).String(); got != want {
			t.Errorf("info.%s = %s, want %s (x held and waited for, y held)", name, got, want)
		}
	}
	if ms, _ := info["uptime_ms"].(json.Number).Int64(); ms < 50 || ms > 10*60*1000 {
		t.Errorf("uptime_ms = %d", ms)
	}
	// The configuration in effect; an unset address or file is "".
	for name, want := range map[string]any{
		"listen": "127.0.0.1:0", "ops_listen": "", "admin_listen": "127.0.0.1:0", "tls": false, "mtls": false,
		"acl_file": "", "audit_log": "", "io_timeout_ms": json.Number("3000"), "log_level": "info", "log_format": "text",
	} {
		if config[name] != want {
			t.Errorf("config.%s = %#v, want %#v", name, config[name], want)
		}
	}
}

func TestAdminLocksHaveTheDocumentedFields(t *testing.T) {
	s := start(t, eastOfUTC(t), "-admin-listen", "127.0.0.1:0")
	before := time.Now()
	holder, granted := rawAcquire(t, s.addr, "docs/lock", time.Minute)
	waiter, f := rawAcquire(t, s.addr, "docs/lock", 30*time.Second)
	after := time.Now()
	if granted.Type != monolock.TypeAcquired || f.Type != monolock.TypeWaiting {
		t.Fatalf("got %+v and %+v, want ACQUIRED and WAITING", granted, f)
	}

	check := func(what string, lock any) {
		t.Helper()
		l := checkFields(t, what, lock, map[string]string{"name": "string", "holder": "object", "waiters": "array"})
		h := checkFields(t, what+".holder", l["holder"], map[string]string{
			"identity": "string", "remote_addr": "string", "since": "string", "lease_ms": "int", "token": "int", "token_string": "string"})
		waiters, _ := l["waiters"].([]any)
		if len(waiters) != 1 {
			t.Fatalf("%s.waiters = %v, want one", what, l["waiters"])
		}
		w := checkFields(t, what+".waiters[0]", waiters[0], map[string]string{
			"identity": "string", "remote_addr": "string", "queued_at": "string"})
		if t.Failed() {
			t.FailNow()
		}
		if _, old := w["since"]; old {
			t.Errorf("%s.waiters[0] still has since beside queued_at", what)
		}
		if h["remote_addr"] != holder.LocalAddr().String() || h["token"].(json.Number).String() != strconv.FormatUint(granted.Token, 10) ||
			h["token_string"] != strconv.FormatUint(granted.Token, 10) ||
			h["lease_ms"].(json.Number).String() != "60000" || w["remote_addr"] != waiter.LocalAddr().String() {
			t.Errorf("%s describes other sessions: holder %v, waiter %v", what, h, w)
		}
		for field, v := range map[string]any{"holder.since": h["since"], "waiters[0].queued_at": w["queued_at"]} {
			// The server's clock and ours: a second of slack either way.
			if ts := utcTime(t, what+"."+field, v); ts.Before(before.Add(-time.Second)) || ts.After(after.Add(time.Second)) {
				t.Errorf("%s.%s = %v, not between %v and %v", what, field, ts, before, after)
			}
		}
	}
	code, body := httpGet(t, "http://"+s.admin+"/api/locks")
	if code != 200 {
		t.Fatalf("/api/locks: %d %s", code, body)
	}
	locks, _ := decodeJSON(t, body)["locks"].([]any)
	if len(locks) != 1 {
		t.Fatalf("/api/locks: %s, want one lock", body)
	}
	check("/api/locks: locks[0]", locks[0])
	code, body = httpGet(t, "http://"+s.admin+"/api/locks/"+url.PathEscape("docs/lock"))
	if code != 200 {
		t.Fatalf("/api/locks/docs%%2Flock: %d %s", code, body)
	}
	check("/api/locks/{name}", decodeJSON(t, body))

	// A lock nobody waits for has an empty list of waiters, not null.
	rawAcquire(t, s.addr, "docs/alone", time.Minute)
	code, body = httpGet(t, "http://"+s.admin+"/api/locks/"+url.PathEscape("docs/alone"))
	if code != 200 {
		t.Fatalf("/api/locks/docs%%2Falone: %d %s", code, body)
	}
	l := checkFields(t, "/api/locks/docs%2Falone", decodeJSON(t, body), map[string]string{"holder": "object", "waiters": "array"})
	if waiters, _ := l["waiters"].([]any); len(waiters) != 0 {
		t.Errorf("/api/locks/docs%%2Falone: waiters %v, want none", l["waiters"])
	}
}

// protocolErrorCodes are the label values of
// monolock_protocol_errors_total: every code of the protocol.
var protocolErrorCodes = []string{"0x01", "0x02", "0x10", "0x11", "0x12", "0x13", "0x14", "0x15", "0x16", "0x17", "0x18"}

func TestMetricsCountGrantsAndEveryErrorCode(t *testing.T) {
	s := start(t, nil, "-ops-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0")
	// Three ACQUIREs on one lock, two grants: the first client is
	// force-released by its token, the third is kicked from the queue
	// before its turn, and the second is promoted.
	a, granted := rawAcquire(t, s.addr, "g", time.Minute)
	b, _ := rawAcquire(t, s.addr, "g", time.Minute)
	c, f := rawAcquire(t, s.addr, "g", time.Minute)
	if f.Type != monolock.TypeWaiting {
		t.Fatalf("third client got %+v, want WAITING", f)
	}
	if code, body := httpDo(t, "DELETE", "http://"+s.admin+"/api/locks/g/waiters/"+c.LocalAddr().String()); code != 200 {
		t.Fatalf("kick: %d %s", code, body)
	}
	c.expect(monolock.TypeError, monolock.CodeClosedByAdmin)
	if code, body := httpDo(t, "POST", fmt.Sprintf("http://%s/api/locks/g/release?token=%d", s.admin, granted.Token)); code != 200 {
		t.Fatalf("force-release: %d %s", code, body)
	}
	a.expect(monolock.TypeError, monolock.CodeClosedByAdmin)
	b.expect(monolock.TypeAcquired, 0)
	for _, bad := range [][]byte{{0x7f}, {monolock.TypeHeartbeat}} {
		d, err := net.Dial("tcp", s.addr)
		if err != nil {
			t.Fatal(err)
		}
		defer d.Close()
		d.Write(bad)
		(&rawClient{t, d}).next() // the ERROR; its code is counted below
	}

	var values map[string]float64
	var body string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		values, body = metrics(t, s)
		if values["monolock_connections_active"] == 1 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the ended connections never left:\n%s", body)
		}
	}
	checkExposition(t, body)
	for _, family := range []string{"monolock_acquires_total", "monolock_acquire_requests_total", "monolock_protocol_errors_total"} {
		if !strings.Contains(body, "\n# TYPE "+family+" counter\n") {
			t.Errorf("%s is not announced as a counter", family)
		}
	}
	want := map[string]float64{
		"monolock_acquires_total":         2, // issued fencing tokens
		"monolock_acquire_requests_total": 3,
		"monolock_wait_seconds_count":     2,
	}
	for _, code := range protocolErrorCodes {
		want[`monolock_protocol_errors_total{code="`+code+`"}`] = 0
	}
	want[`monolock_protocol_errors_total{code="0x02"}`] = 2 // the kick and the force-release
	want[`monolock_protocol_errors_total{code="0x11"}`] = 1
	want[`monolock_protocol_errors_total{code="0x13"}`] = 1
	for name, v := range want {
		if got, ok := values[name]; !ok || got != v {
			t.Errorf("%s = %v (present: %v), want %v", name, got, ok, v)
		}
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", body)
	}
}

// The ops server stops with the protocol server, so the ERROR 0x01 frames
// of a shutdown are checked on the server in this process, through the
// binary's own exposition code.
func TestMetricsCountShutdownErrors(t *testing.T) {
	srv := &monolock.Server{IOTimeout: 5 * time.Second, Logger: slog.New(slog.DiscardHandler)}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	t.Cleanup(func() { srv.Close() })
	o := &ops{srv: srv, started: time.Now()}
	addr := l.Addr().String()
	expect := func(when string, want map[string]string) {
		t.Helper()
		var exposition strings.Builder
		o.writeMetrics(&exposition)
		for name, v := range want {
			if !strings.Contains(exposition.String(), "\n"+name+" "+v+"\n") {
				t.Errorf("%s: want %s %s in\n%s", when, name, v, exposition.String())
			}
		}
	}
	// Every code is there from the start, so that rate() works at once.
	expect("at start", map[string]string{
		`monolock_protocol_errors_total{code="0x01"}`: "0",
		`monolock_protocol_errors_total{code="0x02"}`: "0",
	})

	a, granted := rawAcquire(t, addr, "s", time.Minute)
	b, _ := rawAcquire(t, addr, "s", time.Minute)
	c, _ := rawAcquire(t, addr, "t", time.Minute)
	if _, err := srv.ForceRelease("s", granted.Token); err != nil {
		t.Fatal(err)
	}
	a.expect(monolock.TypeError, monolock.CodeClosedByAdmin)
	b.expect(monolock.TypeAcquired, 0)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	b.expect(monolock.TypeError, monolock.CodeShuttingDown)
	c.expect(monolock.TypeError, monolock.CodeShuttingDown)
	select {
	case <-served:
	case <-time.After(10 * time.Second):
		t.Fatal("Serve did not return after Shutdown")
	}

	expect("after the shutdown", map[string]string{
		`monolock_protocol_errors_total{code="0x01"}`: "2",
		`monolock_protocol_errors_total{code="0x02"}`: "1",
		`monolock_protocol_errors_total{code="0x13"}`: "0",
	})
}

func TestAdminForceReleaseByToken(t *testing.T) {
	s := start(t, nil, "-admin-listen", "127.0.0.1:0")
	release := func(query string) (int, map[string]any) {
		t.Helper()
		code, body := httpDo(t, "POST", "http://"+s.admin+"/api/locks/f/release"+query)
		return code, decodeJSON(t, body)
	}
	a, first := rawAcquire(t, s.addr, "f", time.Minute)
	b, _ := rawAcquire(t, s.addr, "f", time.Minute)
	a.Close() // b is promoted: first's holder is gone
	second := b.expect(monolock.TypeAcquired, 0)

	// The operator meant the first holder: nobody is ended.
	code, resp := release(fmt.Sprintf("?token=%d", first.Token))
	if msg, _ := resp["error"].(string); code != 409 || !strings.Contains(msg, "another token") {
		t.Fatalf("stale token: %d %v, want 409 saying the lock is held under another token", code, resp)
	}
	b.Write([]byte{monolock.TypeHeartbeat})
	if f := b.expect(monolock.TypeAcquired, 0); f.Token != second.Token {
		t.Fatalf("the holder's heartbeat got token %d, want %d", f.Token, second.Token)
	}

	for _, bad := range []string{"?token=", "?token=0", "?token=abc", "?token=-1", "?token=18446744073709551616", "?token=1&token=2"} {
		if code, resp := release(bad); code != 400 || resp["error"] == nil {
			t.Errorf("%s: %d %v, want 400 with a JSON error", bad, code, resp)
		}
	}

	code, resp = release(fmt.Sprintf("?token=%d", second.Token))
	released, _ := resp["released"].(map[string]any)
	if code != 200 || released == nil || released["token"].(json.Number).String() != strconv.FormatUint(second.Token, 10) {
		t.Fatalf("current token: %d %v", code, resp)
	}
	b.expect(monolock.TypeError, monolock.CodeClosedByAdmin)
	if code, _ := release(fmt.Sprintf("?token=%d", second.Token)); code != 404 {
		t.Fatalf("token on an idle lock: %d, want 404", code)
	}
}

// eastOfUTC is the environment of a server in a zone east of UTC: on a
// machine whose own zone is UTC, a time written in local time would still
// end in Z. Without zone data TZ falls back to UTC, and the test says so.
func eastOfUTC(t *testing.T) []string {
	if _, err := time.LoadLocation("Asia/Tokyo"); err != nil {
		t.Log("no time zone data: the server runs in UTC, and the checks that times are UTC prove nothing here")
	}
	return []string{"TZ=Asia/Tokyo"}
}

func TestDiagnosticsAreUTC(t *testing.T) {
	if _, err := time.LoadLocation("Asia/Tokyo"); err != nil {
		t.Skip("no time zone data: TZ would fall back to UTC and prove nothing")
	}
	timeRE := map[string]*regexp.Regexp{
		"text": regexp.MustCompile(`^time=(\S+) `),
		"json": regexp.MustCompile(`^\{"time":"([^"]+)"`),
	}
	for format, re := range timeRE {
		s := start(t, []string{"TZ=Asia/Tokyo"}, "-log-format", format)
		line, _, _ := strings.Cut(s.log(), "\n")
		m := re.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("%s: no time in %q", format, line)
		}
		if ts := utcTime(t, format+" time", m[1]); time.Since(ts).Abs() > time.Minute {
			t.Errorf("%s: time %v is not now", format, ts)
		}
		if format == "json" && !strings.Contains(line, `"io_timeout":"5s"`) {
			t.Errorf("json: durations should read as text: %s", line)
		}
	}
}

func TestBuildInfoAgreesWithAPIInfo(t *testing.T) {
	s := start(t, nil, "-ops-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0")
	code, body := httpGet(t, "http://"+s.admin+"/api/info")
	if code != 200 {
		t.Fatalf("/api/info: %d %s", code, body)
	}
	info := checkFields(t, "info", decodeJSON(t, body), map[string]string{"version": "string", "revision": "string", "go_version": "string"})
	if t.Failed() {
		t.FailNow()
	}
	values, exposition := metrics(t, s)
	checkExposition(t, exposition)
	if !strings.Contains(exposition, "\n# TYPE monolock_build_info gauge\n") {
		t.Fatalf("no monolock_build_info gauge in\n%s", exposition)
	}
	want := fmt.Sprintf(`monolock_build_info{version=%q,revision=%q,goversion=%q}`, info["version"], info["revision"], info["go_version"])
	if got, ok := values[want]; !ok || got != 1 {
		t.Fatalf("want %s 1 in\n%s", want, exposition)
	}
}
