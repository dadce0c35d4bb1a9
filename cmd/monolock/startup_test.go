package main

import (
	"net"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// Issue 14, items 11 and 12: listen addresses and the io-timeout are
// checked at start: one line, exit 2.
func TestStartupRefusesBadListenAndIOTimeout(t *testing.T) {
	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"-listen", ""}, "-listen"},
		{[]string{"MONOLOCK_LISTEN_ADDRESS="}, nil, "MONOLOCK_LISTEN_ADDRESS"},
		{nil, []string{"-listen", "127.0.0.1:99999"}, "-listen"},
		{nil, []string{"-listen", "nonsense"}, "-listen"},
		{nil, []string{"-listen", "127.0.0.1:0", "-ops-listen", "nonsense"}, "-ops-listen"},
		{nil, []string{"-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:99999"}, "-admin-listen"},
		{nil, []string{"-listen", "127.0.0.1:0", "-io-timeout", "1ns"}, "-io-timeout"},
		{nil, []string{"-listen", "127.0.0.1:0", "-io-timeout", "9ms"}, "-io-timeout"},
		{nil, []string{"-listen", "127.0.0.1:0", "-io-timeout", "24h0m1s"}, "longer than 24h"},
		{nil, []string{"-listen", "127.0.0.1:0", "-ops-listen", "127.0.0.1:7079", "-admin-listen", "127.0.0.1:7079"}, "both 127.0.0.1:7079"},
	} {
		code, _, stderr := runBinary(t, tc.env, tc.args...)
		if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("env %q args %q: exit %d, %q; want 2 and one line naming %s", tc.env, tc.args, code, stderr, tc.want)
		}
	}
	s := start(t, nil, "-io-timeout", "10ms")
	s.cmd.Process.Signal(syscall.SIGTERM)
	if code := s.exitCode(t); code != 0 {
		t.Fatalf("-io-timeout 10ms: exit %d; %s", code, s.log())
	}
	s = start(t, nil, "-io-timeout", "24h")
	s.cmd.Process.Signal(syscall.SIGTERM)
	if code := s.exitCode(t); code != 0 {
		t.Fatalf("-io-timeout 24h: exit %d; %s", code, s.log())
	}
}

// An address that cannot be used stops the start before anything is
// served or said to be: the admin API's port taken (here by the ops
// server's address, spelt another way) must not follow "serving ops HTTP".
func TestStartupListensEverywhereBeforeServing(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	_, port, _ := net.SplitHostPort(addr)
	code, _, stderr := runBinary(t, nil, "-listen", "127.0.0.1:0", "-ops-listen", addr, "-admin-listen", "LOCALHOST:"+port)
	if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "-admin-listen") {
		t.Fatalf("exit %d, stderr %q; want 2 and one line naming -admin-listen, nothing served before", code, stderr)
	}
}

// A host name that resolves to loopback is loopback: no warning that the
// admin API listens beyond this machine.
func TestAdminOnAHostNameOfLoopbackDoesNotWarn(t *testing.T) {
	s := start(t, nil, "-admin-listen", "LOCALHOST:0")
	if s.admin == "" || strings.Contains(s.log(), "beyond this machine") {
		t.Fatalf("admin on %q; stderr:\n%s", s.admin, s.log())
	}
}

// A failed reopen is logged after the reopen it ends, not before.
func TestFailedReopenIsLoggedAfterTheReopen(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "logs")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	s := start(t, nil, "-audit-log", filepath.Join(dir, "audit.log"))
	if err := os.RemoveAll(dir); err != nil { // the reopen's O_CREATE fails: ENOENT
		t.Fatal(err)
	}
	s.cmd.Process.Signal(syscall.SIGHUP)
	var log string
	for deadline := time.Now().Add(10 * time.Second); !strings.Contains(log, "reopen failed"); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("no reopen failure logged within 10s:\n%s", log)
		}
		log = s.log()
	}
	if i := strings.Index(log, "reopening the audit log"); i < 0 || i > strings.Index(log, "reopen failed") {
		t.Fatalf("the reopen's failure is logged before the reopen, or the reopen not at all:\n%s", log)
	}
}

// Issue 14, item 13: the rules file's keys are the documented ones, exactly.
func TestRulesFileKeysAreExact(t *testing.T) {
	for _, tc := range []struct{ file, want string }{
		{`{"RULES":[{"identity":"x","locks":["a"]}]}`, `unknown field "RULES"`},
		{`{"Rules":[{"identity":"x","locks":["a"]}]}`, `unknown field "Rules"`},
		{`{"rules":[{"IDENTITY":"x","locks":["a"]}]}`, `rule 1: unknown field "IDENTITY"`},
		{`{"rules":[{"identity":"x","locks":["a"],"Locks":["*"]}]}`, `rule 1: unknown field "Locks"`},
		{`{"rules":[{"identity":"x","locks":["a"],"locks":["*"]}]}`, `rule 1: field "locks" appears twice`},
		{`{"rules":[],"rules":[{"identity":"x","locks":["*"]}]}`, `field "rules" appears twice`},
		{`{"rules":[{"identity":"x","locks":["a"]},{"identity":"y","locks":["b"],"note":""}]}`, `rule 2: unknown field "note"`},
		{`{"rules":{"identity":"x"}}`, `"rules" is not a list`},
		{`{"rules":["x"]}`, "rule 1: not a JSON object"},
		{`{"rules":[{"identity":1,"locks":["a"]}]}`, `"identity" is not a string`},
		{`{"rules":[{"identity":"x","locks":"a"}]}`, `"locks" is not a list of strings`},
		{`[]`, "not a JSON object"},
	} {
		_, err := parseACL(strings.NewReader(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseACL(%s) = %v, want %q", tc.file, err, tc.want)
		}
	}
	if a, err := parseACL(strings.NewReader(`{"rules":[{"locks":["a*"],"identity":"x"}]}`)); err != nil || !a.allows("x", "ab") {
		t.Fatalf("keys in another order: %v", err)
	}

	// The binary refuses such a file at start.
	setup := newTLSSetup(t, identityRules)
	upper := write(t, filepath.Join(setup.dir, "upper.json"), []byte(`{"RULES":[{"IDENTITY":"x","LOCKS":["*"]}]}`))
	args := []string{"-listen", "127.0.0.1:0", "-tls-cert", setup.cert, "-tls-key", setup.key, "-tls-client-ca", setup.caFile, "-acl-file", upper}
	if code, _, stderr := runBinary(t, nil, args...); code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, `unknown field "RULES"`) {
		t.Fatalf("upper-case rules file: exit %d, %q; want 2 and one line", code, stderr)
	}
}
