package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/monolock-dev/monolock"
)

// A CN or DNS SAN is an identity only when it can be a host name or a
// plain name: a CN "spiffe://prod/importer" must not pass for the URI SAN
// of that text, which rules like spiffe://prod/* are written for, nor be
// audited as it.
func TestURILookingNameIsNoIdentity(t *testing.T) {
	setup := newTLSSetup(t, `{"rules":[
		{"identity":"spiffe://prod/*","locks":["uri-*"]},
		{"identity":"importer","locks":["cn-*"]},
		{"identity":"Doe, Jane","locks":["cn-*"]},
		{"identity":"worker.dns.example","locks":["dns-*"]},
		{"identity":"worker_7.dns.example","locks":["dns-*"]}
	]}`)
	audit := filepath.Join(setup.dir, "audit.log")
	s := start(t, nil, append(setup.flags(), "-audit-log", audit)...)
	for _, tc := range []struct {
		what string
		cert leafOpts
	}{
		{"a CN that looks like a URI", leafOpts{cn: "spiffe://prod/importer"}},
		{"a DNS SAN that looks like a URI", leafOpts{cn: "importer", dns: []string{"spiffe://prod/importer"}}},
		{"a DNS SAN with a colon", leafOpts{dns: []string{"spiffe:prod"}}},
		{"a CN with a slash", leafOpts{cn: "prod/importer"}},
		{"a CN with a question mark", leafOpts{cn: "importer?x"}},
		{"a CN with a hash", leafOpts{cn: "importer#1"}},
		{"a CN with a percent sign", leafOpts{cn: "importer%2F"}},
		{"a CN with a backslash", leafOpts{cn: `prod\importer`}},
		{"a first DNS SAN that is no host name, then one that is", leafOpts{dns: []string{"spiffe:prod", "worker.dns.example"}}},
	} {
		f, _, err := tlsAcquire(t, s.addr, setup.clientConfig(t, setup.clientCA, tc.cert), "uri-a")
		if err == nil {
			t.Errorf("%s: got %+v, want the handshake refused", tc.what, f)
		}
	}
	waitForLog(t, s, "not an identity")

	for _, tc := range []struct {
		what, lock string
		cert       leafOpts
	}{
		{"a URI SAN beside a CN that looks like one", "uri-b", leafOpts{cn: "spiffe://prod/other", uris: []string{"spiffe://prod/importer"}}},
		{"a plain CN", "cn-a", leafOpts{cn: "importer"}},
		{"a CN with a comma", "cn-b", leafOpts{cn: "Doe, Jane"}},
		{"a host name DNS SAN", "dns-a", leafOpts{cn: "spiffe://x/y", dns: []string{"worker.dns.example"}}},
		{"a host name DNS SAN with an underscore", "dns-b", leafOpts{dns: []string{"worker_7.dns.example"}}},
	} {
		f, _, err := tlsAcquire(t, s.addr, setup.clientConfig(t, setup.clientCA, tc.cert), tc.lock)
		if err != nil || f.Type != monolock.TypeAcquired {
			t.Errorf("%s: %+v, %v; want ACQUIRED", tc.what, f, err)
		}
	}
	waitForAuditLines(t, audit, 5)
	data, _ := os.ReadFile(audit)
	if strings.Contains(string(data), `"uri-a"`) {
		t.Fatalf("the audit log has a session with a refused certificate:\n%s", data)
	}
}

// The rules' documented semantics, when several rules match an identity:
// a lock is allowed when any rule whose identity matches has a lock
// pattern that matches; a matching rule that does not allow the lock
// denies nothing for the others; nothing else is allowed.
func TestRulesWhenSeveralMatch(t *testing.T) {
	rules, err := parseACL(strings.NewReader(`{"rules":[
		{"identity":"spiffe://prod/*","locks":["nightly/*"]},
		{"identity":"spiffe://prod/importer","locks":["import-?"]},
		{"identity":"*","locks":["public"]},
		{"identity":"spiffe://prod/import?r","locks":["shard-*-a"]}
	]}`))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		identity, lock string
		want           bool
	}{
		{"spiffe://prod/importer", "nightly/x", true},   // first rule
		{"spiffe://prod/importer", "import-1", true},    // second, though the first matched the identity and not the lock
		{"spiffe://prod/importer", "import-12", false},  // ? is one character
		{"spiffe://prod/importer", "public", true},      // third: * matches every identity
		{"spiffe://prod/importer", "shard-7-a", true},   // fourth: ? in the identity
		{"spiffe://prod/importer", "shard-7-b", false},  // no rule's lock pattern matches
		{"spiffe://prod/other", "import-1", false},      // the second rule is not its
		{"spiffe://prod/other", "nightly/a/b", true},    // * crosses /
		{"spiffe://staging/x", "nightly/x", false},      // only the rule "*" matches its identity, and it allows only public
		{"spiffe://staging/x", "public", true},          //
		{"", "public", true},                            // the empty identity (no mutual TLS) matches *
		{"", "nightly/x", false},                        //
		{"SPIFFE://prod/importer", "nightly/x", false},  // case sensitive
		{"spiffe://prod/importer", "Nightly/x", false},  //
		{"spiffe://prod/importer", "nightly/", true},    // * may be empty
		{"spiffe://prod/importer/x", "import-1", false}, // the whole identity must match
	} {
		if got := rules.allows(tc.identity, tc.lock); got != tc.want {
			t.Errorf("allows(%q, %q) = %v, want %v", tc.identity, tc.lock, got, tc.want)
		}
	}
}
