package monolock

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"math/big"
	"net"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

// These tests pin the ways a session ends when two things happen at once.
// The race hunt (racehunt_test.go) looks for such moments at random; these
// make each of the known ones happen many times on real sockets.

// readStream reads what the server sends until it closes, bounded by wait.
func readStream(t *testing.T, c net.Conn) []byte {
	t.Helper()
	c.SetReadDeadline(time.Now().Add(wait))
	b, err := io.ReadAll(c)
	if err != nil && !isReset(err) {
		t.Fatalf("reading until the server closes: %v (after % x)", err, b)
	}
	return b
}

// frames parses a server's byte stream and checks that an ERROR, if any,
// is the last frame.
func frames(t *testing.T, b []byte) []Frame {
	t.Helper()
	var fs []Frame
	for r := bytes.NewReader(b); r.Len() > 0; {
		f, err := ReadFrame(r)
		if err != nil {
			t.Fatalf("not a frame in % x: %v", b, err)
		}
		if f.Type == TypeError && r.Len() > 0 {
			t.Fatalf("%d bytes after ERROR 0x%02x in % x", r.Len(), uint8(f.Code), b)
		}
		fs = append(fs, f)
	}
	return fs
}

// An ACQUIRE read as Shutdown begins gets one ERROR 0x01, not two.
func TestShutdownDuringAcquireSendsOneError(t *testing.T) {
	srv := &Server{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	conns := make([]net.Conn, 300)
	for i := range conns {
		if conns[i], err = net.DialTimeout("tcp", l.Addr().String(), wait); err != nil {
			t.Fatal(err)
		}
		defer conns[i].Close()
	}
	b, _ := acquire("shutdown-race", time.Minute).AppendBinary(nil)
	var wg sync.WaitGroup
	for i, c := range conns {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if i == len(conns)/2 {
				go srv.Shutdown(context.Background())
			}
			c.Write(b)
		}()
	}
	wg.Wait()
	for _, c := range conns {
		frames(t, readStream(t, c))
	}
}

// A waiter that ends, by its own bad frame or an administrator's kick, as
// the holder leaves is never promoted after its ERROR, and a kicked waiter
// is never promoted at all.
func TestWaiterEndingAsHolderLeaves(t *testing.T) {
	for _, kick := range []bool{false, true} {
		srv := &Server{}
		addr := startServer(t, srv)
		for trial := range 500 {
			name := fmt.Sprintf("leaving-%d", trial)
			holder, waiter, _ := holderAndWaiter(t, addr, name)
			var kicked error = ErrNotFound
			var wg sync.WaitGroup
			wg.Add(2)
			go func() { defer wg.Done(); holder.Close() }()
			go func() {
				defer wg.Done()
				if kick {
					_, kicked = srv.KickWaiter(name, waiter.LocalAddr().String())
				} else {
					waiter.sendBytes([]byte{0x7f})
				}
			}()
			wg.Wait()
			if kick && kicked != nil {
				waiter.Close() // promoted before the kick: it holds the lock, and nobody ends it
				continue
			}
			fs := frames(t, readStream(t, waiter.Conn))
			if kicked == nil && len(fs) != 1 {
				t.Fatalf("trial %d: a kicked waiter was sent %+v after its WAITING, want only ERROR 0x02", trial, fs)
			}
			if len(fs) == 0 || fs[len(fs)-1].Type != TypeError {
				t.Fatalf("trial %d (kick %v): the waiter's stream ends in %+v, want an ERROR", trial, kick, fs)
			}
		}
	}
}

// ForceRelease with a token ends only the holder of that grant: a holder
// promoted a moment ago is not ended by a request meant for its
// predecessor.
func TestForceReleaseByToken(t *testing.T) {
	srv := &Server{}
	addr := startServer(t, srv)
	holder, waiter, old := holderAndWaiter(t, addr, "by-token")
	holder.Close()
	token := waiter.expectAcquired()
	if _, err := srv.ForceRelease("by-token", old); !errors.Is(err, ErrStaleToken) {
		t.Fatalf("ForceRelease with the old holder's token = %v, want ErrStaleToken", err)
	}
	waiter.send(heartbeat)
	waiter.expect(Frame{Type: TypeAcquired, Token: token}) // still the holder
	info, err := srv.ForceRelease("by-token", token)
	if err != nil || info.Token != token || info.RemoteAddr != waiter.LocalAddr().String() {
		t.Fatalf("ForceRelease with the holder's token = %+v, %v", info, err)
	}
	waiter.expectError(CodeClosedByAdmin)
	if _, err := srv.ForceRelease("by-token", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("ForceRelease of a free lock = %v, want ErrNotFound", err)
	}
}

// An OnEvent that never returns costs bounded memory and counted events,
// and Shutdown still returns when its context ends.
func TestStalledOnEventIsBounded(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		release := make(chan struct{})
		defer close(release)
		srv := &Server{OnEvent: func(Event) { <-release }}
		defer srv.Close() // on a failure, lets the bubble's goroutines end
		l := newPipeListener()
		go srv.Serve(l)
		b, _ := acquire("cycle", time.Minute).AppendBinary(nil)
		for i := range maxQueuedEvents/2 + 100 { // two events a cycle
			c := l.dial("cycler")
			if _, err := c.Write(b); err != nil {
				t.Fatalf("cycle %d: %v", i, err)
			}
			var reply [9]byte
			if _, err := io.ReadFull(c, reply[:]); err != nil || reply[0] != TypeAcquired {
				t.Fatalf("cycle %d: % x, %v", i, reply, err)
			}
			c.Close()
			synctest.Wait() // the session has ended and queued its release
		}
		srv.mu.Lock()
		queued := len(srv.events)
		srv.mu.Unlock()
		if st := srv.Stats(); queued > maxQueuedEvents || st.EventsDropped == 0 {
			t.Fatalf("%d events queued, %d dropped: want at most %d queued, the rest counted", queued, st.EventsDropped, maxQueuedEvents)
		}
		returned := make(chan error, 1)
		go func() {
			ctx, cancel := context.WithTimeout(context.Background(), time.Second)
			defer cancel()
			returned <- srv.Shutdown(ctx)
		}()
		select {
		case err := <-returned:
			if !errors.Is(err, context.DeadlineExceeded) {
				t.Errorf("Shutdown = %v, want the context's deadline", err)
			}
		case <-time.After(time.Minute):
			t.Errorf("Shutdown did not return a minute after its context ended")
		}
	})
}

// Shutdown ends within one io-timeout even when a TLS client does not read
// (crypto/tls's own Close would wait 5 s more to send close_notify).
func TestShutdownWithTLSClientsIsBounded(t *testing.T) {
	const ioTimeout = time.Second
	cert := selfSigned(t)
	srv := &Server{IOTimeout: ioTimeout}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	watched := &watchedListener{Listener: inner, writing: map[string]time.Time{}}
	go srv.Serve(tls.NewListener(watched, &tls.Config{Certificates: []tls.Certificate{cert}}))
	raw, err := net.DialTimeout("tcp", inner.Addr().String(), wait)
	if err != nil {
		t.Fatal(err)
	}
	defer raw.Close()
	raw.(*net.TCPConn).SetReadBuffer(1024)
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true})
	b, _ := acquire("tls-stuck", time.Minute).AppendBinary(nil)
	c.SetDeadline(time.Now().Add(wait))
	if _, err := c.Write(b); err != nil {
		t.Fatal(err)
	}
	go func() {
		flood := bytes.Repeat([]byte{TypeHeartbeat}, 1<<14)
		for c.SetWriteDeadline(time.Now().Add(time.Minute)) == nil {
			if _, err := c.Write(flood); err != nil {
				return
			}
		}
	}()
	client := raw.LocalAddr().String()
	waitFor(t, "a blocked write to a TLS client that never reads", func() bool {
		return watched.blockedFor(client) > 300*time.Millisecond
	})
	start := time.Now()
	shutdownWithin(t, srv, 2*ioTimeout)
	t.Logf("shut down in %v", time.Since(start))
}

// shutdownWithin fails the test unless Shutdown returns within d.
func shutdownWithin(t *testing.T, srv *Server, d time.Duration) {
	t.Helper()
	start := time.Now()
	returned := make(chan error, 1)
	go func() { returned <- srv.Shutdown(context.Background()) }()
	select {
	case err := <-returned:
		if err != nil {
			t.Fatalf("Shutdown: %v", err)
		}
		if took := time.Since(start); took > d {
			t.Fatalf("Shutdown took %v, want at most %v", took, d)
		}
	case <-time.After(d + wait):
		t.Fatalf("Shutdown did not return within %v", d+wait)
	}
}

// selfSigned returns a certificate for 127.0.0.1, made for the test.
func selfSigned(t *testing.T) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1),
		IPAddresses:  []net.IP{net.IPv4(127, 0, 0, 1)},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(time.Hour),
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// Shutdown grants nothing: a holder taken out of the table before its
// waiter does not hand the lock on, spending a token on a session that is
// about to be told 0x01.
func TestShutdownPromotesNobody(t *testing.T) {
	srv := &Server{}
	addr := startServer(t, srv)
	for i := range 20 { // the table is a map: its order varies, so many locks
		holderAndWaiter(t, addr, fmt.Sprintf("no-promotion-%d", i))
	}
	before := srv.Stats().Grants
	if err := srv.Shutdown(bounded(t)); err != nil {
		t.Fatal(err)
	}
	if after := srv.Stats().Grants; after != before {
		t.Fatalf("%d grants during shutdown", after-before)
	}
}
