package monolock

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"sync/atomic"
	"testing"
	"time"
)

// A refusal by a *tls.Dialer's own VerifyConnection or VerifyPeerCertificate
// is a *tls.CertificateVerificationError, as one from crypto/tls is: it
// names the certificates it refused, which code that reports a refusal
// (UnverifiedCertificates[0].Subject) reads.
func TestCallbackRefusalNamesTheRefusedCertificate(t *testing.T) {
	tl, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}})
	if err != nil {
		t.Fatal(err)
	}
	addr := serveOn(t, &Server{}, tl)
	errPinned := errors.New("not the pinned certificate")
	for _, tc := range []struct {
		name string
		cfg  *tls.Config
	}{
		{"VerifyConnection", &tls.Config{InsecureSkipVerify: true,
			VerifyConnection: func(tls.ConnectionState) error { return errPinned }}},
		{"VerifyPeerCertificate", &tls.Config{InsecureSkipVerify: true,
			VerifyPeerCertificate: func([][]byte, [][]*x509.Certificate) error { return errPinned }}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := New(Config{Address: addr, Dialer: &tls.Dialer{Config: tc.cfg}}).AcquireRetry(bounded(t), "x", time.Second)
			var ve *tls.CertificateVerificationError
			if !errors.As(err, &ve) || !errors.Is(err, errPinned) {
				t.Fatalf("AcquireRetry = %v, want a *tls.CertificateVerificationError wrapping the callback's error", err)
			}
			if len(ve.UnverifiedCertificates) == 0 {
				t.Errorf("the CertificateVerificationError names no certificate (UnverifiedCertificates empty): %v", err)
			}
		})
	}
}

// An address that can never be dialled (no port: net's AddrError) is
// invalid input, returned at once, not retried until ctx ends.
func TestAcquireRetryAddressWithoutPortReturnsAtOnce(t *testing.T) {
	var retries atomic.Int32
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	start := time.Now()
	_, err := New(Config{Address: "127.0.0.1", OnRetry: func(int, error, time.Duration) { retries.Add(1) }}).
		AcquireRetry(ctx, "x", time.Second)
	if retries.Load() != 0 || errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("AcquireRetry = %v after %v and %d retries; want the address error at once", err,
			time.Since(start).Round(time.Millisecond), retries.Load())
	}
}
