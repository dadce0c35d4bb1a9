package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/monolock-dev/monolock"
)

func TestGlob(t *testing.T) {
	for _, tc := range []struct {
		pattern, s string
		want       bool
	}{
		{"spiffe://prod/worker/*", "spiffe://prod/worker/7", true},
		{"spiffe://prod/worker/*", "spiffe://prod/worker/7/extra", true},
		{"spiffe://prod/worker/*", "spiffe://prod/workers/7", false},
		{"shard-?", "shard-3", true},
		{"shard-?", "shard-31", false},
		{"shard-?", "shard-", false},
		{"nightly/*", "nightly/a/b", true},
		{"nightly/*", "nightly/", true},
		{"nightly/*", "nightly", false},
		{"?", "é", true},     // one code point, two bytes
		{"??", "é", false},   // not two bytes
		{"a?c", "a日c", true}, // three bytes
		{"*", "", true},
		{"", "", true},
		{"", "a", false},
		{"a", "A", false}, // case sensitive
		{"*a*b*c*", "xxaxxbxxcxx", true},
		{"*a*b*c*", "xxaxxcxxbxx", false},
		{"a*a*a*a*b", strings.Repeat("a", 60), false},
		{"[a]", "a", false}, // no classes: brackets are literal
		{"[a]", "[a]", true},
		{"\\*", "\\x", true}, // no escapes: a backslash is literal, * still a star
		{"?", "\xff", true},  // a byte that is not UTF-8 is one character
		{"\xff", "\xff", true},
	} {
		if got := glob(tc.pattern, tc.s); got != tc.want {
			t.Errorf("glob(%q, %q) = %v, want %v", tc.pattern, tc.s, got, tc.want)
		}
	}
}

// globRegexp is the reference: the glob language written as a regular
// expression over code points.
func globRegexp(pattern string) *regexp.Regexp {
	var b strings.Builder
	b.WriteString(`^(?s)`)
	for _, r := range pattern {
		switch r {
		case '*':
			b.WriteString(`.*`)
		case '?':
			b.WriteString(`.`)
		default:
			b.WriteString(regexp.QuoteMeta(string(r)))
		}
	}
	b.WriteString(`$`)
	return regexp.MustCompile(b.String())
}

func FuzzGlob(f *testing.F) {
	f.Add("spiffe://prod/worker/*", "spiffe://prod/worker/7")
	f.Add("shard-?", "shard-31")
	f.Add("*a*?b", "xaéb")
	f.Add("a?c", "a日c")
	f.Fuzz(func(t *testing.T, pattern, s string) {
		// The reference works on code points: compare on valid UTF-8.
		if !utf8.ValidString(pattern) || !utf8.ValidString(s) || len(pattern) > 64 || len(s) > 256 {
			return
		}
		if got, want := glob(pattern, s), globRegexp(pattern).MatchString(s); got != want {
			t.Fatalf("glob(%q, %q) = %v, the reference says %v", pattern, s, got, want)
		}
	})
}

func TestParseACL(t *testing.T) {
	good := `{"rules":[{"identity":"spiffe://prod/*","locks":["nightly/*","shard-?"]},{"identity":"ops","locks":["*"]}]}`
	a, err := parseACL(strings.NewReader(good))
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		identity, lock string
		want           bool
	}{
		{"spiffe://prod/a", "nightly/import", true},
		{"spiffe://prod/a", "shard-3", true},
		{"spiffe://prod/a", "shard-31", false},
		{"spiffe://dev/a", "nightly/import", false},
		{"ops", "anything", true},
		{"", "nightly/import", false}, // no identity matches no rule
	} {
		if got := a.allows(tc.identity, tc.lock); got != tc.want {
			t.Errorf("allows(%q, %q) = %v", tc.identity, tc.lock, got)
		}
	}
	for _, tc := range []struct{ file, want string }{
		{`{"rules":[{"identity":"","locks":["a"]}]}`, "rule 1: empty identity"},
		{`{"rules":[{"identity":"x","locks":["a"]},{"identity":"y","locks":[]}]}`, `rule 2 (identity "y"): no lock patterns`},
		{`{"rules":[{"identity":"y"}]}`, `rule 1 (identity "y"): no lock patterns`},
		{`{"rules":[{"identity":"y","locks":["a",""]}]}`, "lock pattern 2 is empty"},
		{`{"rules":[{"identity":"x","locks":["a"],"lock":["b"]}]}`, `unknown field "lock"`},
		{`{"rule":[]}`, `unknown field "rule"`},
		{`{}`, `no "rules" list`},
		{`{"rules":[]`, "not a valid rules file"},
		{`rules: []`, "not a valid rules file"},
		{`{"rules":[]} {}`, "more than one JSON value"},
		{`{"rules":[]}]`, "after the JSON object"},
		{`{"rules":[]}}`, "after the JSON object"},
		{`{"rules":[]} x`, "after the JSON object"},
		{``, "not a valid rules file"},
	} {
		_, err := parseACL(strings.NewReader(tc.file))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("parseACL(%s) = %v, want %q", tc.file, err, tc.want)
		}
	}
}

// pki makes certificates for tests: a CA, and leaves it signs.
type pki struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
}

var serial int64 = 100

func newCA(t *testing.T, name string) *pki {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial++
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(serial),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	cert, _ := x509.ParseCertificate(der)
	return &pki{cert, key}
}

type leafOpts struct {
	cn       string
	dns      []string
	uris     []string
	server   bool
	notAfter time.Time
}

// leaf returns the PEM certificate and key of a leaf signed by ca.
func (ca *pki) leaf(t *testing.T, o leafOpts) (certPEM, keyPEM []byte) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(serial),
		Subject:      pkix.Name{CommonName: o.cn},
		DNSNames:     o.dns,
		NotBefore:    time.Now().Add(-2 * time.Hour),
		NotAfter:     o.notAfter,
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	if tmpl.NotAfter.IsZero() {
		tmpl.NotAfter = time.Now().Add(time.Hour)
	}
	if o.server {
		tmpl.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}
		tmpl.IPAddresses = []net.IP{net.ParseIP("127.0.0.1")}
	}
	for _, u := range o.uris {
		parsed, _ := url.Parse(u)
		tmpl.URIs = append(tmpl.URIs, parsed)
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	keyDER, _ := x509.MarshalECPrivateKey(key)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER})
}

func (ca *pki) pem() []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: ca.cert.Raw})
}

func write(t *testing.T, path string, data []byte) string {
	t.Helper()
	if err := os.WriteFile(path, data, 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}

// tlsSetup writes a server certificate, a client CA and rules into a
// folder, and returns the flags that use them.
type tlsSetup struct {
	dir                    string
	serverCA, clientCA     *pki
	cert, key, caFile, acl string
}

func newTLSSetup(t *testing.T, rules string) *tlsSetup {
	s := &tlsSetup{dir: t.TempDir(), serverCA: newCA(t, "server CA"), clientCA: newCA(t, "client CA")}
	certPEM, keyPEM := s.serverCA.leaf(t, leafOpts{cn: "server-a", server: true})
	s.cert = write(t, filepath.Join(s.dir, "server.pem"), certPEM)
	s.key = write(t, filepath.Join(s.dir, "server-key.pem"), keyPEM)
	s.caFile = write(t, filepath.Join(s.dir, "client-ca.pem"), s.clientCA.pem())
	s.acl = write(t, filepath.Join(s.dir, "acl.json"), []byte(rules))
	return s
}

func (s *tlsSetup) flags() []string {
	return []string{"-tls-cert", s.cert, "-tls-key", s.key, "-tls-client-ca", s.caFile, "-acl-file", s.acl}
}

// clientConfig is a TLS client configuration that trusts the server CA and
// presents a certificate from ca (none if ca is nil).
func (s *tlsSetup) clientConfig(t *testing.T, ca *pki, o leafOpts) *tls.Config {
	cfg := &tls.Config{RootCAs: x509.NewCertPool()}
	cfg.RootCAs.AddCert(s.serverCA.cert)
	if ca != nil {
		certPEM, keyPEM := ca.leaf(t, o)
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg
}

// tlsAcquire sends an ACQUIRE over TLS and returns the first answer, or
// the error that ended the connection instead.
func tlsAcquire(t *testing.T, addr string, cfg *tls.Config, name string) (monolock.Frame, *tls.Conn, error) {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 10 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return monolock.Frame{}, nil, err
	}
	t.Cleanup(func() { conn.Close() })
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	b, _ := monolock.Frame{Type: monolock.TypeAcquire, LeaseMS: 60000, Name: name}.AppendBinary(nil)
	if _, err := conn.Write(b); err != nil {
		return monolock.Frame{}, conn, err
	}
	f, err := monolock.ReadFrame(conn)
	return f, conn, err
}

const identityRules = `{"rules":[
	{"identity":"spiffe://prod/worker/*","locks":["uri-*"]},
	{"identity":"worker.dns.example","locks":["dns-*"]},
	{"identity":"cn-worker","locks":["cn-*"]}
]}`

func TestMutualTLSIdentitiesAndRules(t *testing.T) {
	setup := newTLSSetup(t, identityRules)
	s := start(t, nil, setup.flags()...)
	all := leafOpts{cn: "cn-worker", dns: []string{"worker.dns.example"}, uris: []string{"spiffe://prod/worker/7"}}
	dnsCN := leafOpts{cn: "cn-worker", dns: []string{"worker.dns.example"}}
	cnOnly := leafOpts{cn: "cn-worker"}
	for _, tc := range []struct {
		name    string
		cert    leafOpts
		allowed string
		denied  []string
	}{
		{"URI first", all, "uri-a", []string{"dns-a", "cn-a", "other"}},
		{"then DNS", dnsCN, "dns-a", []string{"uri-a", "cn-a"}},
		{"then CN", cnOnly, "cn-a", []string{"uri-a", "dns-a"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := setup.clientConfig(t, setup.clientCA, tc.cert)
			if f, _, err := tlsAcquire(t, s.addr, cfg, tc.allowed); err != nil || f.Type != monolock.TypeAcquired {
				t.Fatalf("%s: %+v, %v; want ACQUIRED", tc.allowed, f, err)
			}
			for _, name := range tc.denied {
				f, conn, err := tlsAcquire(t, s.addr, cfg, name)
				if err != nil || f.Type != monolock.TypeError || f.Code != monolock.CodeNotAuthorized {
					t.Fatalf("%s: %+v, %v; want ERROR 0x18", name, f, err)
				}
				if _, err := monolock.ReadFrame(conn); err == nil {
					t.Fatalf("%s: connection still open after 0x18", name)
				}
			}
		})
	}

	t.Run("the Go client over mutual TLS", func(t *testing.T) {
		c := monolock.New(monolock.Config{Address: s.addr, Dialer: &tls.Dialer{Config: setup.clientConfig(t, setup.clientCA, all)}})
		err := c.Do(bounded(t), "uri-go", time.Second, func(ctx context.Context, token uint64) error { return nil })
		if err != nil {
			t.Fatal(err)
		}
		err = c.Do(bounded(t), "dns-go", time.Second, func(ctx context.Context, token uint64) error { return nil })
		if !errors.Is(err, monolock.ErrNotAuthorized) {
			t.Fatalf("Do on a denied lock = %v", err)
		}
	})

	for _, tc := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"no client certificate", setup.clientConfig(t, nil, leafOpts{})},
		{"certificate from another CA", setup.clientConfig(t, newCA(t, "rogue CA"), all)},
		{"expired certificate", setup.clientConfig(t, setup.clientCA, leafOpts{cn: "cn-worker", notAfter: time.Now().Add(-time.Hour)})},
		{"TLS 1.1", func() *tls.Config { // TLS 1.2 at least
			cfg := setup.clientConfig(t, setup.clientCA, all)
			cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS10, tls.VersionTLS11
			return cfg
		}()},
	} {
		t.Run("refused: "+tc.name, func(t *testing.T) {
			// With TLS 1.3 the client may finish its side of the handshake
			// before the server refuses; either way no frame ever comes back.
			f, _, err := tlsAcquire(t, s.addr, tc.cfg, "cn-a")
			if err == nil {
				t.Fatalf("got %+v, want the handshake refused", f)
			}
		})
	}

	t.Run("plaintext client against TLS", func(t *testing.T) {
		c, err := net.DialTimeout("tcp", s.addr, wait)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		b, _ := monolock.Frame{Type: monolock.TypeAcquire, LeaseMS: 60000, Name: "cn-a"}.AppendBinary(nil)
		c.Write(b)
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		f, err := monolock.ReadFrame(c)
		if err == nil && f.Type == monolock.TypeAcquired || isTimeoutErr(err) {
			t.Fatalf("plaintext client got %+v, %v; want a refusal", f, err)
		}
	})
}

func isTimeoutErr(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func TestSilentTLSClientIsCutAndBlocksNobody(t *testing.T) {
	setup := newTLSSetup(t, identityRules)
	s := start(t, nil, append(setup.flags(), "-io-timeout", "500ms")...)
	silent, err := net.DialTimeout("tcp", s.addr, wait) // starts no handshake
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	begin := time.Now()
	cfg := setup.clientConfig(t, setup.clientCA, leafOpts{cn: "cn-worker"})
	if f, _, err := tlsAcquire(t, s.addr, cfg, "cn-next"); err != nil || f.Type != monolock.TypeAcquired {
		t.Fatalf("next client: %+v, %v", f, err)
	}
	if d := time.Since(begin); d > 400*time.Millisecond {
		// Served after the silent one's io-timeout: the accept loop waited on it.
		t.Fatalf("next client served after %v", d)
	}
	silent.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := silent.Read(make([]byte, 1)); err == nil || isTimeoutErr(err) {
		t.Fatalf("silent TLS client not cut: %v", err)
	}
}

func TestStartupSecurityErrors(t *testing.T) {
	setup := newTLSSetup(t, identityRules)
	garbage := write(t, filepath.Join(setup.dir, "garbage.pem"), []byte("not PEM"))
	badRules := write(t, filepath.Join(setup.dir, "bad.json"), []byte(`{"rules":[{"identity":"x","locks":[]}]}`))
	otherKey := func() string {
		_, keyPEM := setup.serverCA.leaf(t, leafOpts{cn: "other", server: true})
		return write(t, filepath.Join(setup.dir, "other-key.pem"), keyPEM)
	}()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"-tls-key", setup.key}, "-tls-key needs -tls-cert"},
		{[]string{"-tls-cert", setup.cert}, "-tls-cert needs -tls-key"},
		{[]string{"-tls-client-ca", setup.caFile}, "-tls-client-ca needs -tls-cert"},
		{[]string{"-tls-cert", setup.cert, "-tls-key", setup.key, "-acl-file", setup.acl}, "-acl-file needs -tls-client-ca"},
		{[]string{"-tls-cert", garbage, "-tls-key", setup.key}, "-tls-cert"},
		{[]string{"-tls-cert", setup.cert, "-tls-key", otherKey}, "private key does not match"},
		{[]string{"-tls-cert", filepath.Join(setup.dir, "missing.pem"), "-tls-key", setup.key}, "no such file"},
		{[]string{"-tls-cert", setup.cert, "-tls-key", setup.key, "-tls-client-ca", garbage}, "no PEM certificate"},
		{[]string{"-tls-cert", setup.cert, "-tls-key", setup.key, "-tls-client-ca", setup.caFile, "-acl-file", badRules}, "rule 1"},
	} {
		code, _, stderr := runBinary(t, nil, append([]string{"-listen", "127.0.0.1:0"}, tc.args...)...)
		if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("%v: exit %d, %q; want 2 and one line with %q", tc.args, code, stderr, tc.want)
		}
	}
}

func TestReloadKeepsLocksAndRejectsBrokenFiles(t *testing.T) {
	setup := newTLSSetup(t, `{"rules":[{"identity":"cn-worker","locks":["a*"]}]}`)
	s := start(t, nil, setup.flags()...)
	cfg := setup.clientConfig(t, setup.clientCA, leafOpts{cn: "cn-worker"})
	serverName := func() string {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: wait}, "tcp", s.addr, cfg)
		if err != nil {
			t.Fatal(err)
		}
		defer conn.Close()
		return conn.ConnectionState().PeerCertificates[0].Subject.CommonName
	}
	f, held, err := tlsAcquire(t, s.addr, cfg, "a-held")
	if err != nil || f.Type != monolock.TypeAcquired {
		t.Fatalf("%+v, %v", f, err)
	}
	token := f.Token
	reload := func(want string) {
		t.Helper()
		s.cmd.Process.Signal(syscall.SIGHUP)
		waitForLog(t, s, want)
	}

	// Rotate to a new certificate and new rules.
	certPEM, keyPEM := setup.serverCA.leaf(t, leafOpts{cn: "server-b", server: true})
	write(t, setup.cert, certPEM)
	write(t, setup.key, keyPEM)
	write(t, setup.acl, []byte(`{"rules":[{"identity":"cn-worker","locks":["b*"]}]}`))
	reload("reloaded")
	if got := serverName(); got != "server-b" {
		t.Fatalf("new connections see %q after the reload", got)
	}
	held.SetDeadline(time.Now().Add(wait))
	held.Write([]byte{monolock.TypeHeartbeat}) // the old session lives on
	if f, err := monolock.ReadFrame(held); err != nil || f.Type != monolock.TypeAcquired || f.Token != token {
		t.Fatalf("held lock after reload: %+v, %v", f, err)
	}
	if f, _, err := tlsAcquire(t, s.addr, cfg, "b-new"); err != nil || f.Type != monolock.TypeAcquired {
		t.Fatalf("new rules not applied: %+v, %v", f, err)
	}
	if f, _, _ := tlsAcquire(t, s.addr, cfg, "a-new"); f.Type != monolock.TypeError {
		t.Fatalf("old rules still applied: %+v", f)
	}

	// A broken file keeps everything as it was, and says why at error
	// level: here good new rules with a broken certificate, then a good
	// certificate with broken rules.
	write(t, setup.acl, []byte(`{"rules":[{"identity":"cn-worker","locks":["c*"]}]}`))
	write(t, setup.cert, []byte("-----BEGIN CERTIFICATE-----\nbroken\n-----END CERTIFICATE-----\n"))
	reload(`level=ERROR msg="reload failed`)
	certPEM, keyPEM = setup.serverCA.leaf(t, leafOpts{cn: "server-c", server: true})
	write(t, setup.cert, certPEM)
	write(t, setup.key, keyPEM)
	write(t, setup.acl, []byte(`{"rules":[{"identity":"cn-worker","locks":["c*"]}],"extra":1}`))
	reload(`level=ERROR msg="reload failed`)
	if got := serverName(); got != "server-b" {
		t.Fatalf("after failed reloads, new connections see %q, want server-b", got)
	}
	if f, _, err := tlsAcquire(t, s.addr, cfg, "b-still"); err != nil || f.Type != monolock.TypeAcquired {
		t.Fatalf("previous rules lost after a failed reload: %+v, %v", f, err)
	}
	if f, _, _ := tlsAcquire(t, s.addr, cfg, "c-new"); f.Type != monolock.TypeError {
		t.Fatalf("rules of a failed reload applied: %+v", f)
	}
}

// SIGHUP re-reads the client CA: after a rotation to a new CA, new
// connections must present a certificate of the new one, and one of the
// old CA no longer verifies.
func TestReloadReplacesTheClientCA(t *testing.T) {
	setup := newTLSSetup(t, `{"rules":[{"identity":"cn-worker","locks":["*"]}]}`)
	s := start(t, nil, setup.flags()...)
	oldCert := setup.clientConfig(t, setup.clientCA, leafOpts{cn: "cn-worker"})
	if f, _, err := tlsAcquire(t, s.addr, oldCert, "before"); err != nil || f.Type != monolock.TypeAcquired {
		t.Fatalf("before the rotation: %+v, %v", f, err)
	}
	rotated := newCA(t, "client CA 2")
	write(t, setup.caFile, rotated.pem())
	s.cmd.Process.Signal(syscall.SIGHUP)
	waitForLog(t, s, "reloaded TLS certificate and key, client CA, rules")
	if f, _, err := tlsAcquire(t, s.addr, setup.clientConfig(t, rotated, leafOpts{cn: "cn-worker"}), "new-ca"); err != nil || f.Type != monolock.TypeAcquired {
		t.Fatalf("a certificate of the new client CA: %+v, %v; want ACQUIRED", f, err)
	}
	if f, _, err := tlsAcquire(t, s.addr, oldCert, "old-ca"); err == nil {
		t.Fatalf("a certificate of the replaced client CA got %+v, want the handshake refused", f)
	}
}

// waitForLog waits until the server's stderr has a line with text, and
// consumes what it read.
func waitForLog(t *testing.T, s *server, text string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		if s.takeLog(text) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("the server never logged %q", text)
		}
	}
}
