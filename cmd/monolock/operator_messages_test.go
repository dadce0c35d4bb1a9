package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// monolock locks against a server whose admin API is off says what it
// needs, not only "connection refused".
func TestLocksSaysItNeedsTheAdminAPI(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	code, _, stderr := runBinary(t, nil, "locks", "-admin", addr)
	if code != 1 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "-admin-listen") || !strings.Contains(stderr, addr) {
		t.Fatalf("exit %d, stderr %q; want 1 and one line naming %s and -admin-listen", code, stderr, addr)
	}
}

// monolock run says, once, after a second, that it waits; not when the
// grant is quick, and not with -n.
func TestRunSaysItWaits(t *testing.T) {
	s := start(t, nil, "-admin-listen", "127.0.0.1:0")
	if code, stderr := runSync(t, "-addr", s.addr, "free", "--", "true"); code != 0 || stderr != "" {
		t.Fatalf("a free lock: exit %d, stderr %q; want 0 and nothing", code, stderr)
	}
	holder, _ := rawAcquire(t, s.addr, "busy", time.Minute)
	const hostile = "busy/x\x1b[2J\t" // a terminal escape, printed escaped
	other, f := rawAcquire(t, s.addr, hostile, time.Minute)
	if code, stderr := runSync(t, "-addr", s.addr, "-n", "busy", "--", "true"); code != exitBusy || strings.Contains(stderr, "waiting") {
		t.Fatalf("-n on a busy lock: exit %d, stderr %q; want %d and no waiting line", code, stderr, exitBusy)
	}
	// Two runs wait at once: without the admin API, and with it, where the
	// line says who holds the lock.
	p := startRun(t, "-addr", s.addr, "busy", "--", "true")
	q := startRun(t, "-addr", s.addr, "-admin", s.admin, hostile, "--", "true")
	time.Sleep(500 * time.Millisecond)
	if out := p.stderr.String() + q.stderr.String(); out != "" {
		t.Fatalf("run spoke before a second of waiting: %q", out)
	}
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(p.stderr.String(), "\n") || !strings.Contains(q.stderr.String(), "\n"); time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no waiting lines within 10s: %q, %q", p.stderr.String(), q.stderr.String())
		}
	}
	holder.Close()
	other.Close()
	for _, r := range []*runProc{p, q} {
		if code := r.status(t, 10*time.Second); code != 0 {
			t.Fatalf("exit %d after the holder left; stderr:\n%s", code, r.stderr.String())
		}
	}
	out := p.stderr.String()
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, `waiting for lock "busy" at `+s.addr+": not granted after 1s;") || !strings.Contains(out, "monolock locks") {
		t.Fatalf("stderr %q; want one line saying it waits for \"busy\" at %s, and how to see who holds it", out, s.addr)
	}
	want := regexp.MustCompile(`waiting for lock ` + regexp.QuoteMeta(`"busy/x\x1b[2J\t"`) + ` at ` + regexp.QuoteMeta(s.addr) + `: not granted after 1s; held by ` +
		regexp.QuoteMeta(other.LocalAddr().String()) + ` for [1-3]s under token ` + fmt.Sprint(f.Token) + `; 1 in its queue, this run among them\n$`)
	if out := q.stderr.String(); strings.Count(out, "\n") != 1 || !want.MatchString(out) {
		t.Fatalf("stderr %q; want one line matching %s", out, want)
	}
}

// monolock_connections_active counts connections, before their ACQUIRE
// too; the sessions are monolock_locks_held + monolock_waiters, as
// /api/info's sessions (README, Differences: why it stays so).
func TestConnectionsActiveCountsConnectionsAndSessionsAreHeldPlusWaiters(t *testing.T) {
	s := start(t, nil, "-ops-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0")
	expect := func(when string, connections, held, waiters float64) {
		t.Helper()
		var values map[string]float64
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			values, _ = metrics(t, s)
			if values["monolock_connections_active"] == connections && values["monolock_locks_held"] == held && values["monolock_waiters"] == waiters {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("%s: connections_active %v, locks_held %v, waiters %v; want %v, %v, %v", when,
					values["monolock_connections_active"], values["monolock_locks_held"], values["monolock_waiters"], connections, held, waiters)
			}
		}
		_, body := httpGet(t, "http://"+s.admin+"/api/info")
		info := decodeJSON(t, body)
		if info["connections"].(json.Number).String() != fmt.Sprint(connections) || info["sessions"].(json.Number).String() != fmt.Sprint(held+waiters) {
			t.Fatalf("%s: /api/info connections %v, sessions %v; want %v and %v", when, info["connections"], info["sessions"], connections, held+waiters)
		}
	}
	expect("idle", 0, 0, 0)
	silent, err := net.DialTimeout("tcp", s.addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	expect("one connection without ACQUIRE", 1, 0, 0)
	rawAcquire(t, s.addr, "c", time.Minute)
	expect("and a holder", 2, 1, 0)
	rawAcquire(t, s.addr, "c", time.Minute)
	expect("and a waiter", 3, 1, 1)
	silent.Close()
	expect("the silent connection closed", 2, 1, 1)
}

// Text from the network reaches a terminal escaped: a lock name with a
// terminal escape and a tab, and a holder's identity and address, in
// monolock locks (run's waiting line: in TestRunSaysItWaits).
func TestNamesFromTheNetworkArePrintedEscaped(t *testing.T) {
	s := start(t, nil, "-admin-listen", "127.0.0.1:0")
	name := "evil\x1b[2J\tname"
	holder, f := rawAcquire(t, s.addr, name, time.Minute)
	if f.Type != monolock.TypeAcquired {
		t.Fatalf("got %+v", f)
	}
	code, stdout, stderr := runBinary(t, nil, "locks", "-admin", s.admin)
	if code != 0 || strings.ContainsAny(stdout, "\x1b") || !strings.Contains(stdout, `"evil\x1b[2J\tname"`) {
		t.Fatalf("monolock locks: exit %d, stdout %q, stderr %q; want the name quoted and escaped", code, stdout, stderr)
	}
	holder.Close()

	// The holder's identity and address come from the admin API as well:
	// what answers at -admin cannot write terminal escapes through them.
	fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, `{"locks":[{"name":"x","holder":{"identity":"id\u001b[2J","remote_addr":"10.0.0.1:1\u001b]0;title\u0007",`+
			`"since":"2026-01-01T00:00:00Z","lease_ms":1000,"token":1},"waiters":[]}]}`)
	}))
	defer fake.Close()
	code, stdout, stderr = runBinary(t, nil, "locks", "-admin", fake.Listener.Addr().String())
	if code != 0 || strings.ContainsAny(stdout, "\x1b\a") || !strings.Contains(stdout, `"id\x1b[2J (10.0.0.1:1\x1b]0;title\a)"`) {
		t.Fatalf("monolock locks: exit %d, stdout %q, stderr %q; want the holder quoted and escaped", code, stdout, stderr)
	}
}

// monolock locks takes the admin API's address from MONOLOCK_ADMIN_ADDRESS
// when -admin is not given (a flag beats it), and shows each holder as its
// certificate's identity with its address, as the README's table does.
func TestLocksTableNamesHoldersFromTheAdminAPIOfTheEnvironment(t *testing.T) {
	const identity = "spiffe://prod/importer"
	setup := newTLSSetup(t, `{"rules":[{"identity":"`+identity+`","locks":["nightly/*"]}]}`)
	s := start(t, nil, append(setup.flags(), "-admin-listen", "127.0.0.1:0")...)
	cfg := setup.clientConfig(t, setup.clientCA, leafOpts{cn: "importer", uris: []string{identity}})
	f, c, err := tlsAcquire(t, s.addr, cfg, "nightly/import")
	if err != nil || f.Type != monolock.TypeAcquired {
		t.Fatalf("got %+v, %v; want ACQUIRED", f, err)
	}
	holder := identity + " (" + c.LocalAddr().String() + ")"
	for _, tc := range []struct {
		env  []string
		args []string
	}{
		{[]string{"MONOLOCK_ADMIN_ADDRESS=" + s.admin}, nil},
		{[]string{"MONOLOCK_ADMIN_ADDRESS=127.0.0.1:1"}, []string{"-admin", s.admin}},
	} {
		code, stdout, stderr := runBinary(t, tc.env, append([]string{"locks"}, tc.args...)...)
		row := regexp.MustCompile(`(?m)^nightly/import +` + regexp.QuoteMeta(holder) + ` +\S+ +` + fmt.Sprint(f.Token) + ` +0$`)
		if code != 0 || !row.MatchString(stdout) {
			t.Errorf("env %v, args %v: exit %d, stdout %q, stderr %q; want a row matching %s", tc.env, tc.args, code, stdout, stderr, row)
		}
	}
}

// monolock locks -match shows only the locks its glob matches, and an
// answer that is not a 200 with a list of locks is an error (exit 1, with
// the status and the API's reason, escaped), never an empty table: an
// operator whose -admin names a host the API refuses, or another JSON
// service, must not read "no locks".
func TestLocksMatchesAndSaysWhatTheAdminAPIRefused(t *testing.T) {
	s := start(t, nil, "-admin-listen", "127.0.0.1:0")
	rawAcquire(t, s.addr, "nightly/import", time.Minute)
	rawAcquire(t, s.addr, "deploy", time.Minute)
	code, stdout, stderr := runBinary(t, nil, "locks", "-admin", s.admin, "-match", "nightly/*")
	if code != 0 || !strings.Contains(stdout, "nightly/import") || strings.Contains(stdout, "deploy") {
		t.Fatalf("locks -match 'nightly/*': exit %d, stdout %q, stderr %q; want nightly/import alone", code, stdout, stderr)
	}

	for _, tc := range []struct {
		status int
		body   string
		want   []string
	}{
		{http.StatusForbidden, `{"error":"forbidden: Host \"admin.example:7071\" is not this server's"}`, []string{"403 Forbidden", `forbidden: Host "admin.example:7071"`}},
		{http.StatusBadGateway, `<html>bad gateway</html>`, []string{"502 Bad Gateway", "not the admin API's JSON"}},
		{http.StatusOK, `{"status":"ok"}`, []string{"200 OK", "no list of locks"}},
		{http.StatusOK, `{"locks":null}`, []string{"200 OK", "no list of locks"}},
		// What answers at -admin chose this text: it reaches the terminal escaped.
		{http.StatusForbidden, `{"error":"\u001b]0;pwned\u0007\u001b[2Jreason"}`, []string{"403 Forbidden", `"\x1b]0;pwned\a\x1b[2Jreason"`}},
	} {
		fake := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			w.WriteHeader(tc.status)
			io.WriteString(w, tc.body)
		}))
		code, stdout, stderr := runBinary(t, nil, "locks", "-admin", fake.Listener.Addr().String())
		fake.Close()
		if code != 1 || stdout != "" || strings.Count(stderr, "\n") != 1 || strings.ContainsAny(stderr, "\x1b\a") {
			t.Errorf("admin API answering %d: exit %d, stdout %q, stderr %q; want exit 1, no table, one line", tc.status, code, stdout, stderr)
		}
		for _, w := range tc.want {
			if !strings.Contains(stderr, w) {
				t.Errorf("admin API answering %d: stderr %q does not say %q", tc.status, stderr, w)
			}
		}
	}
}
