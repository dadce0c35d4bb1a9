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
		{"identity":"worker.dns.example","locks":["dns-*"]}
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
		{"a host name DNS SAN", "dns-a", leafOpts{cn: "spiffe://x/y", dns: []string{"worker.dns.example"}}},
	} {
		f, _, err := tlsAcquire(t, s.addr, setup.clientConfig(t, setup.clientCA, tc.cert), tc.lock)
		if err != nil || f.Type != monolock.TypeAcquired {
			t.Errorf("%s: %+v, %v; want ACQUIRED", tc.what, f, err)
		}
	}
	waitForAuditLines(t, audit, 3)
	data, _ := os.ReadFile(audit)
	if strings.Contains(string(data), `"uri-a"`) {
		t.Fatalf("the audit log has a session with a refused certificate:\n%s", data)
	}
}
