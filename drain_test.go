package monolock

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// A failed handshake's drain stays within the handshake's io-timeout: a
// TLS connection that sends nothing, half a ClientHello, or garbage just
// before its io-timeout is closed at that io-timeout, as over TCP, not 50
// ms after (150 ms for an io-timeout of 100 ms, 20 ms for 10 ms, 5.05 s
// for 5 s on bd72561, through NewTLSListener; the docs: "held up to the
// io-timeout", "its handshake bounded by the io-timeout").
func TestAStalledTLSHandshakeEndsAtItsIOTimeout(t *testing.T) {
	for _, metered := range []bool{false, true} {
		for _, stall := range []string{"silent", "half a ClientHello", "garbage 1ms before the io-timeout"} {
			for _, io := range []time.Duration{10 * time.Millisecond, 100 * time.Millisecond, 5 * time.Second} {
				t.Run(fmt.Sprintf("metered %v/%s/io %v", metered, stall, io), func(t *testing.T) {
					synctest.Test(t, func(t *testing.T) {
						srv := &Server{IOTimeout: io}
						l := serveFake(t, srv)
						raw, server := net.Pipe()
						if metered {
							l.acceptTLS(t, server)
						} else {
							l.acceptTLSUnmetered(t, server)
						}
						start := time.Now()
						switch stall {
						case "half a ClientHello":
							raw.Write([]byte{0x16, 0x03, 0x01, 0x01, 0x00, 0x01, 0x00})
						case "garbage 1ms before the io-timeout":
							time.Sleep(io - time.Millisecond)
							raw.Write([]byte("GET / HTTP/1.0\r\n\r\n"))
						}
						raw.Read(make([]byte, 1))
						if took := time.Since(start); took > io {
							t.Errorf("closed %v after its start (fake time), past its io-timeout of %v", took, io)
						}
						if n := srv.Stats().TLSHandshakeErrors; n != 1 {
							t.Errorf("TLSHandshakeErrors %d, want 1", n)
						}
					})
				})
			}
		}
	}
}

// countingHandler counts the lines of each message.
type countingHandler struct {
	mu    sync.Mutex
	lines map[string]int
}

func (h *countingHandler) Enabled(context.Context, slog.Level) bool { return true }
func (h *countingHandler) Handle(_ context.Context, r slog.Record) error {
	h.mu.Lock()
	if h.lines == nil {
		h.lines = map[string]int{}
	}
	h.lines[r.Message]++
	h.mu.Unlock()
	return nil
}
func (h *countingHandler) WithAttrs([]slog.Attr) slog.Handler { return h }
func (h *countingHandler) WithGroup(string) slog.Handler      { return h }
func (h *countingHandler) count(msg string) int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.lines[msg]
}

// Shutdown during a refused client's drain (the client reads, and does
// not close) closes it at once; the failure was counted and logged once.
func TestShutdownEndsAFailedHandshakesDrainAtOnce(t *testing.T) {
	serverCA := issueTestCert(t, nil, newTestKey(t, "ec"), "server CA", true, nil, 0)
	serverLeaf := issueTestCert(t, serverCA, newTestKey(t, "ec"), "server", false, []net.IP{net.IPv4(127, 0, 0, 1)}, x509.ExtKeyUsageServerAuth)
	clientCA := issueTestCert(t, nil, newTestKey(t, "ec"), "client CA", true, nil, 0)
	otherCA := issueTestCert(t, nil, newTestKey(t, "ec"), "other CA", true, nil, 0)
	cfg := &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{serverLeaf.cert.Raw}, PrivateKey: serverLeaf.key, Leaf: serverLeaf.cert}},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    x509.NewCertPool(),
	}
	cfg.ClientCAs.AddCert(clientCA.cert)
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	log := &countingHandler{}
	srv := &Server{IOTimeout: 5 * time.Second, Logger: slog.New(log)}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(NewTLSListener(l, cfg)) }()
	leaf := issueTestCert(t, otherCA, newTestKey(t, "ec"), "refused", false, nil, x509.ExtKeyUsageClientAuth)
	ccfg := &tls.Config{RootCAs: x509.NewCertPool(), GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
		return &tls.Certificate{Certificate: [][]byte{leaf.cert.Raw}, PrivateKey: leaf.key}, nil
	}}
	ccfg.RootCAs.AddCert(serverCA.cert)
	conn, err := tls.Dial("tcp", l.Addr().String(), ccfg)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	waitFor(t, "the failure counted", func() bool { return srv.Stats().TLSHandshakeErrors == 1 })
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), soon)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 40*time.Millisecond { // the drain would end at 50 ms
		t.Errorf("Shutdown took %v", took)
	}
	<-served
	if n, lines := srv.Stats().TLSHandshakeErrors, log.count("TLS handshake failed"); n != 1 || lines != 1 {
		t.Errorf("TLSHandshakeErrors %d, log lines %d; want 1 and 1", n, lines)
	}
}

// Shutdown while a handshake stalls: closed at once, neither counted nor
// logged as a failed handshake.
func TestShutdownDuringAHandshakeIsNoFailedHandshake(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		log := &countingHandler{}
		srv := &Server{IOTimeout: time.Second, Logger: slog.New(log)}
		l := serveFake(t, srv)
		raw := l.dialTLS(t)
		raw.Write([]byte{0x16, 0x03, 0x01, 0x01, 0x00, 0x01, 0x00})
		time.Sleep(10 * time.Millisecond)
		start := time.Now()
		if err := srv.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		if took := time.Since(start); took != 0 {
			t.Errorf("Shutdown took %v (fake time)", took)
		}
		if n, lines := srv.Stats().TLSHandshakeErrors, log.count("TLS handshake failed"); n != 0 || lines != 0 {
			t.Errorf("TLSHandshakeErrors %d, log lines %d; want none", n, lines)
		}
	})
}
