package monolock

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"log/slog"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
	"unicode/utf8"
)

func TestNamesAreRawBytes(t *testing.T) {
	addr := startServer(t, &Server{})
	names := []string{"a", "A", "a ", " a", "nightly/import", "a\x00b", "Ä", "A\u0308"} // all distinct locks
	for _, name := range names {
		c := dialRaw(t, addr)
		c.send(acquire(name, time.Minute))
		c.expectAcquired()
	}
}

func TestIdleLocksLeaveNothingBehind(t *testing.T) {
	srv := &Server{}
	addr := startServer(t, srv)
	holder, waiter, _ := holderAndWaiter(t, addr, "x")
	holder.Close()
	waiter.expectAcquired()
	waiter.Close()
	waitFor(t, "an empty table after every client closed", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.locks) == 0 && len(srv.sessions) == 0
	})
}

func TestErrorCodes(t *testing.T) {
	addr := startServer(t, &Server{})
	long := strings.Repeat("é", 127) + "x" // 255 bytes, multi-byte characters
	acq := func(version byte, leaseMS uint32, nameLen int, name string) []byte {
		b := []byte{TypeAcquire, version, byte(leaseMS >> 24), byte(leaseMS >> 16), byte(leaseMS >> 8), byte(leaseMS),
			byte(nameLen >> 8), byte(nameLen)}
		return append(b, name...)
	}
	for _, tc := range []struct {
		name  string
		bytes []byte
		code  Code
	}{
		{"version 2", acq(2, 1000, 1, "a"), CodeUnsupportedVersion},
		{"version 0 with lease 0 and no name", acq(0, 0, 0, ""), CodeUnsupportedVersion},
		{"version 2 alone", []byte{TypeAcquire, 2}, CodeUnsupportedVersion},
		{"heartbeat first", []byte{TypeHeartbeat}, CodeAcquireFirst},
		{"unknown type first", []byte{0x7f}, CodeUnknownType},
		{"server's WAITING sent by a client", []byte{TypeWaiting}, CodeUnknownType},
		{"server's ACQUIRED sent by a client", []byte{TypeAcquired}, CodeUnknownType},
		{"server's ERROR sent by a client", []byte{TypeError}, CodeUnknownType},
		{"type zero", []byte{0}, CodeUnknownType},
		{"empty name", acq(1, 1000, 0, ""), CodeEmptyName},
		{"256-byte name", acq(1, 1000, 256, long+"y"), CodeNameTooLong},
		{"name_len 65535, no name sent", acq(1, 1000, 65535, ""), CodeNameTooLong},
		{"invalid UTF-8", acq(1, 1000, 2, "\xc3\x28"), CodeInvalidUTF8},
		{"lone continuation byte", acq(1, 1000, 1, "\x80"), CodeInvalidUTF8},
		{"surrogate half", acq(1, 1000, 3, "\xed\xa0\x80"), CodeInvalidUTF8},
		{"overlong encoding", acq(1, 1000, 2, "\xc0\xaf"), CodeInvalidUTF8},
		{"lease 0", acq(1, 0, 1, "a"), CodeInvalidLease},
		{"lease 0 before a bad name", acq(1, 0, 300, ""), CodeInvalidLease},
		{"empty before UTF-8", acq(1, 1000, 0, ""), CodeEmptyName},
		{"too long before UTF-8", acq(1, 1000, 256, strings.Repeat("\xff", 256)), CodeNameTooLong},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := dialRaw(t, addr)
			c.sendBytes(tc.bytes)
			f := c.expectError(tc.code)
			if tc.code == CodeUnknownType && f.Reason != "unknown message type: 0x"+hex2(tc.bytes[0]) {
				t.Errorf("reason %q lacks the type byte", f.Reason)
			}
		})
	}

	t.Run("255-byte name accepted", func(t *testing.T) {
		c := dialRaw(t, addr)
		c.sendBytes(acq(1, 1000, 255, long))
		c.expectAcquired()
	})
	t.Run("maximum lease accepted", func(t *testing.T) {
		c := dialRaw(t, addr)
		c.sendBytes(acq(1, 0xffffffff, 3, "max"))
		c.expectAcquired()
	})
}

func hex2(b byte) string { return string("0123456789abcdef"[b>>4]) + string("0123456789abcdef"[b&15]) }

func TestErrorsAfterTheGrant(t *testing.T) {
	addr := startServer(t, &Server{})
	for _, tc := range []struct {
		name string
		next []byte
		code Code
	}{
		{"duplicate ACQUIRE", []byte{TypeAcquire}, CodeDuplicateAcquire},
		{"unknown type", []byte{0x42}, CodeUnknownType},
		{"ACQUIRED from a client", []byte{TypeAcquired}, CodeUnknownType},
	} {
		t.Run("holder "+tc.name, func(t *testing.T) {
			// The holder's error releases the lock to its waiter at once.
			holder, waiter, _ := holderAndWaiter(t, addr, "after-"+tc.name)
			holder.sendBytes(tc.next)
			holder.expectError(tc.code)
			waiter.expectAcquired()
		})
		t.Run("waiter "+tc.name, func(t *testing.T) {
			holder, waiter, token := holderAndWaiter(t, addr, "after-w-"+tc.name)
			waiter.sendBytes(tc.next)
			waiter.expectError(tc.code)
			holder.send(heartbeat)
			holder.expect(Frame{Type: TypeAcquired, Token: token})
		})
	}
	t.Run("duplicate ACQUIRE, whole frame coalesced", func(t *testing.T) {
		c := dialRaw(t, addr)
		c.send(acquire("dup", time.Minute), acquire("dup", time.Minute))
		c.expectAcquired()
		c.expectError(CodeDuplicateAcquire)
	})
}

func TestSplitAndCoalescedFrames(t *testing.T) {
	addr := startServer(t, &Server{})
	stream := func(name string) []byte {
		b, _ := acquire(name, time.Minute).AppendBinary(nil)
		return append(b, TypeHeartbeat, TypeHeartbeat)
	}
	t.Run("byte by byte", func(t *testing.T) {
		c := dialRaw(t, addr)
		if tcp, ok := c.Conn.(*net.TCPConn); ok {
			tcp.SetNoDelay(true)
		}
		for _, b := range stream("split") {
			c.sendBytes([]byte{b})
			time.Sleep(2 * time.Millisecond)
		}
		token := c.expectAcquired()
		c.expect(Frame{Type: TypeAcquired, Token: token})
		c.expect(Frame{Type: TypeAcquired, Token: token})
	})
	t.Run("coalesced", func(t *testing.T) {
		c := dialRaw(t, addr)
		c.sendBytes(stream("coalesced"))
		token := c.expectAcquired()
		c.expect(Frame{Type: TypeAcquired, Token: token})
		c.expect(Frame{Type: TypeAcquired, Token: token})
	})
}

func TestIOTimeout(t *testing.T) {
	const ioTimeout = 300 * time.Millisecond
	addr := startServer(t, &Server{IOTimeout: ioTimeout})
	for _, tc := range []struct {
		name string
		sent []byte
	}{
		{"silent connection", nil},
		{"half an ACQUIRE", []byte{TypeAcquire, 1, 0, 0}},
		{"ACQUIRE without its name", []byte{TypeAcquire, 1, 0, 0, 3, 0xe8, 0, 5, 'a', 'b'}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now() // before the dial: the server's clock starts at its accept
			c := dialRaw(t, addr)
			c.sendBytes(tc.sent)
			c.expectClosed(wait)
			if d := time.Since(start); d < ioTimeout {
				t.Fatalf("closed after %v, before the io-timeout of %v", d, ioTimeout)
			}
		})
	}
	t.Run("a session outlives the io-timeout on its lease", func(t *testing.T) {
		c := dialRaw(t, addr)
		c.send(acquire("long-lease", time.Minute))
		token := c.expectAcquired()
		time.Sleep(2 * ioTimeout)
		c.send(heartbeat)
		c.expect(Frame{Type: TypeAcquired, Token: token})
	})
}

// flakyListener fails Accept with EMFILE a number of times, counting calls.
type flakyListener struct {
	net.Listener
	failures atomic.Int64
	calls    atomic.Int64
}

type emfile struct{}

func (emfile) Error() string   { return "accept: too many open files" }
func (emfile) Timeout() bool   { return false }
func (emfile) Temporary() bool { return true }

func (l *flakyListener) Accept() (net.Conn, error) {
	l.calls.Add(1)
	if l.failures.Add(-1) >= 0 {
		return nil, emfile{}
	}
	return l.Listener.Accept()
}

func TestAcceptErrorsBackOffAndRecover(t *testing.T) {
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &flakyListener{Listener: inner}
	l.failures.Store(8) // backoff 5, 10, 20, ... 640ms: about 1.3s in all
	srv := &Server{}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	defer srv.Close()

	time.Sleep(300 * time.Millisecond)
	if n := l.calls.Load(); n > 20 {
		t.Fatalf("%d accept calls in 300ms: spinning instead of backing off", n)
	}
	select {
	case err := <-served:
		t.Fatalf("Serve returned %v on a temporary accept error", err)
	default:
	}
	c := dialRaw(t, inner.Addr().String()) // served once the errors stop
	c.send(acquire("after-emfile", time.Minute))
	c.expectAcquired()
}

// FuzzServerSession feeds any client byte stream to a real server session
// and checks what comes back: whole server frames only, WAITING never after
// ACQUIRED, one token, an ERROR only last and only with a known code and a
// canonical UTF-8 reason.
func FuzzServerSession(f *testing.F) {
	seeds := [][]byte{{}, {TypeHeartbeat}, {0x7f}, {TypeAcquire, 2}}
	for _, frames := range [][]Frame{
		{acquire("fz", time.Minute), heartbeat, heartbeat},
		{acquire("fz", time.Minute), acquire("fz", time.Minute)},
		{acquire("", time.Minute)},
		{acquire("fz", time.Millisecond), heartbeat},
		{acquire("fz", time.Minute), heartbeat, {Type: TypeWaiting}},
	} {
		var b []byte
		for _, fr := range frames {
			b, _ = fr.AppendBinary(b)
		}
		seeds = append(seeds, b)
	}
	for _, v := range loadVectors(f) {
		if v.dir == "client" {
			seeds = append(seeds, v.bytes())
		}
	}
	for _, s := range seeds {
		f.Add(s)
	}
	addr := startServer(f, &Server{IOTimeout: time.Second})
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := net.DialTimeout("tcp", addr, wait)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(wait))
		c.Write(data) // may fail once the server has refused the stream
		c.(*net.TCPConn).CloseWrite()
		out, err := io.ReadAll(c)
		if err != nil && !isReset(err) {
			t.Fatalf("reading the server's answer: %v", err)
		}
		checkServerStream(t, out)
	})
}

func checkServerStream(t *testing.T, out []byte) {
	r := bytes.NewReader(out)
	var token uint64
	for r.Len() > 0 {
		f, err := ReadFrame(r)
		if err != nil {
			t.Fatalf("server wrote %x: %v", out, err)
		}
		switch f.Type {
		case TypeWaiting:
			if token != 0 {
				t.Fatalf("WAITING after ACQUIRED in %x", out)
			}
		case TypeAcquired:
			if f.Token == 0 || (token != 0 && f.Token != token) {
				t.Fatalf("tokens %d then %d in %x", token, f.Token, out)
			}
			token = f.Token
		case TypeError:
			if f.Code.Err() == nil || !utf8.ValidString(f.Reason) || !strings.HasPrefix(f.Reason, f.Code.String()) {
				t.Fatalf("bad ERROR %+v in %x", f, out)
			}
			if r.Len() > 0 {
				t.Fatalf("bytes after an ERROR in %x", out)
			}
		default:
			t.Fatalf("server wrote a client frame %+v in %x", f, out)
		}
	}
}

func TestIdentityOrder(t *testing.T) {
	uri, _ := url.Parse("spiffe://prod/worker/7")
	for _, tc := range []struct {
		cert *x509.Certificate
		want string
	}{
		{&x509.Certificate{URIs: []*url.URL{uri}, DNSNames: []string{"w.example"}, Subject: pkix.Name{CommonName: "cn"}}, "spiffe://prod/worker/7"},
		{&x509.Certificate{DNSNames: []string{"w.example", "x.example"}, Subject: pkix.Name{CommonName: "cn"}}, "w.example"},
		{&x509.Certificate{Subject: pkix.Name{CommonName: "cn"}}, "cn"},
		{&x509.Certificate{}, ""},
	} {
		verified := tls.ConnectionState{PeerCertificates: []*x509.Certificate{tc.cert}, VerifiedChains: [][]*x509.Certificate{{tc.cert}}}
		if got := Identity(verified); got != tc.want {
			t.Errorf("Identity = %q, want %q", got, tc.want)
		}
		// A certificate that was not verified names nobody.
		if got := Identity(tls.ConnectionState{PeerCertificates: []*x509.Certificate{tc.cert}}); got != "" {
			t.Errorf("unverified Identity = %q", got)
		}
	}
}

func TestAuthorizeHook(t *testing.T) {
	var asked []string
	var mu sync.Mutex
	srv := &Server{Authorize: func(identity, lock string) bool {
		mu.Lock()
		defer mu.Unlock()
		asked = append(asked, identity+"|"+lock)
		return strings.HasPrefix(lock, "ok")
	}}
	addr := startServer(t, srv)
	c := dialRaw(t, addr)
	c.send(acquire("ok-1", time.Minute))
	c.expectAcquired()

	c = dialRaw(t, addr)
	c.send(acquire("no", time.Minute))
	c.expectError(CodeNotAuthorized)

	// Checked last: a bad name is 0x16 whatever the rules say.
	c = dialRaw(t, addr)
	c.sendBytes([]byte{TypeAcquire, 1, 0, 0, 1, 0, 0, 1, 0xff})
	c.expectError(CodeInvalidUTF8)

	// A long multi-byte name in the reason is cut on a character boundary.
	long := strings.Repeat("é", 127)
	c = dialRaw(t, addr)
	c.send(acquire(long, time.Minute))
	f := c.expectError(CodeNotAuthorized)
	if len(f.Reason) > MaxReasonLen || !utf8.ValidString(f.Reason) {
		t.Fatalf("reason of %d bytes, valid UTF-8: %v", len(f.Reason), utf8.ValidString(f.Reason))
	}
	mu.Lock()
	defer mu.Unlock()
	if len(asked) != 3 || asked[0] != "|ok-1" {
		t.Fatalf("Authorize asked %q", asked)
	}
}

// A TLS client that never finishes its handshake is cut at the io-timeout,
// and counted.
func TestTLSHandshakeIsBounded(t *testing.T) {
	const ioTimeout = 300 * time.Millisecond
	srv := &Server{IOTimeout: ioTimeout}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := serveOn(t, srv, tls.NewListener(l, &tls.Config{}))
	// The server's clock starts once it has accepted the connection, which
	// is after the dial began: starting ours before the dial keeps it from
	// starting later than the server's.
	start := time.Now()
	c := dialRaw(t, addr)
	c.expectClosed(wait)
	if d := time.Since(start); d < ioTimeout {
		t.Fatalf("cut after %v, before the io-timeout", d)
	}
	waitFor(t, "the handshake failure to be counted", func() bool { return srv.Stats().TLSHandshakeErrors == 1 })
}

func TestForceReleaseAndKickWaiter(t *testing.T) {
	var log eventLog
	srv := &Server{OnEvent: log.add}
	addr := startServer(t, srv)
	holder, waiters, _ := queue(t, addr, "stuck", 4)
	info, ok := srv.Lock("stuck")
	if !ok || info.Holder == nil || len(info.Waiters) != 4 || info.Holder.RemoteAddr != holder.LocalAddr().String() {
		t.Fatalf("snapshot %+v", info)
	}
	for i, w := range info.Waiters {
		if w.RemoteAddr != waiters[i].LocalAddr().String() || w.Lease != time.Minute {
			t.Fatalf("waiter %d in the snapshot is %+v", i, w)
		}
	}

	// Kick the second waiter: it alone goes, with 0x02.
	if _, err := srv.KickWaiter("stuck", waiters[1].LocalAddr().String()); err != nil {
		t.Fatal(err)
	}
	waiters[1].expectError(CodeClosedByAdmin)
	if _, err := srv.KickWaiter("stuck", "127.0.0.1:1"); !errors.Is(err, ErrNotFound) {
		t.Fatalf("kick of an unknown waiter: %v", err)
	}

	// Force-release the holder: 0x02 to it, the lock to the first waiter.
	got, err := srv.ForceRelease("stuck", 0)
	if err != nil || got.Token == 0 {
		t.Fatalf("ForceRelease = %+v, %v", got, err)
	}
	holder.expectError(CodeClosedByAdmin)
	waiters[0].expectAcquired()
	waiters[2].send(heartbeat)
	waiters[2].expectWaiting()
	waitFor(t, "the queue to shrink", func() bool {
		info, _ := srv.Lock("stuck")
		return len(info.Waiters) == 2
	})
	info, _ = srv.Lock("stuck")
	if info.Waiters[0].RemoteAddr != waiters[2].LocalAddr().String() || info.Waiters[1].RemoteAddr != waiters[3].LocalAddr().String() {
		t.Fatalf("queue after the kicks: %+v", info.Waiters)
	}
	if _, err := srv.ForceRelease("idle", 0); !errors.Is(err, ErrNotFound) {
		t.Fatalf("ForceRelease of an idle lock: %v", err)
	}

	want := []string{"granted stuck", "kick_waiter stuck", "force_release stuck", "released stuck", "granted stuck"}
	waitFor(t, "the events", func() bool { return len(log.types()) == len(want) })
	for i, got := range log.types() {
		if got != want[i] {
			t.Fatalf("events %q, want %q", log.types(), want)
		}
	}
	log.mu.Lock()
	released := log.events[3]
	log.mu.Unlock()
	if released.Reason != ReasonForce || released.Token != got.Token || released.RemoteAddr != holder.LocalAddr().String() {
		t.Fatalf("release %+v", released)
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

func TestStatsCountWhatHappened(t *testing.T) {
	srv := &Server{}
	addr := startServer(t, srv)
	a := dialRaw(t, addr)
	a.send(acquire("a", time.Minute))
	a.expectAcquired()
	b := dialRaw(t, addr)
	b.send(acquire("a", time.Minute))
	b.expectWaiting()
	short := dialRaw(t, addr)
	short.send(acquire("short", 100*time.Millisecond))
	short.expectAcquired()
	for range 3 {
		a.send(heartbeat)
		a.expectAcquired()
	}
	bad := dialRaw(t, addr)
	bad.sendBytes([]byte{0x7f})
	bad.expectError(CodeUnknownType)
	short.expectClosed(wait) // expired
	a.Close()                // graceful; b is promoted
	b.expectAcquired()
	waitFor(t, "the counters", func() bool {
		st := srv.Stats()
		return st.Releases[ReasonGraceful] == 1 && st.Connections == 1
	})
	st := srv.Stats()
	if st.ConnectionsAccepted != 4 || st.Acquires != 3 || st.Grants != 3 || st.Heartbeats != 3 ||
		st.LocksHeld != 1 || st.Waiters != 0 || st.Releases[ReasonExpired] != 1 ||
		st.Errors[CodeUnknownType] != 1 || len(st.Errors) != 1 || st.WaitTotal <= 0 || st.HoldTotal <= 0 {
		t.Fatalf("stats %+v", st)
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

// syncBuffer is a log sink that the server's goroutines may share.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}

// A refused ACQUIRE and a failed TLS handshake are what a new user needs to
// see at info level, with who and from where; a flood of them writes one
// line a second, with the count of those left out.
func TestDenialsAndFailedHandshakesAreLogged(t *testing.T) {
	var logs syncBuffer
	srv := &Server{
		Logger:    slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})),
		Authorize: func(identity, lock string) bool { return false },
	}
	inner, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := serveOn(t, srv, tls.NewListener(inner, &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}}))

	for i := range 20 {
		raw, err := net.DialTimeout("tcp", addr, wait)
		if err != nil {
			t.Fatal(err)
		}
		c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true})
		c.SetDeadline(time.Now().Add(wait))
		b, _ := acquire("secret", time.Minute).AppendBinary(nil)
		if _, err := c.Write(b); err != nil {
			t.Fatal(err)
		}
		f, err := ReadFrame(c)
		if err != nil || f.Type != TypeError || f.Code != CodeNotAuthorized {
			t.Fatalf("denial %d: got %+v, %v", i, f, err)
		}
		c.Close()

		plain := dialRaw(t, addr) // a client that speaks the protocol without TLS
		plain.send(acquire("secret", time.Minute))
		plain.expectClosed(wait)
	}
	waitFor(t, "a log line for the failed handshakes", func() bool {
		return strings.Contains(logs.String(), "TLS handshake failed")
	})
	out := logs.String()
	for _, want := range []string{"level=INFO", `msg="ACQUIRE not authorized"`, "lock=secret", "remote=127.0.0.1:", `msg="TLS handshake failed"`} {
		if !strings.Contains(out, want) {
			t.Errorf("the log lacks %q:\n%s", want, out)
		}
	}
	if n := strings.Count(out, "\n"); n > 6 {
		t.Errorf("%d lines for 20 denials and 20 failed handshakes in well under 3 s: want one a second of each kind\n%s", n, out)
	}
}
