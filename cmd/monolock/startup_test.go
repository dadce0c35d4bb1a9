package main

import (
	"path/filepath"
	"strings"
	"syscall"
	"testing"
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
