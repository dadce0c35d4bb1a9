package monolock

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"errors"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
	"unicode/utf8"
)

func TestGrantWaitAndPushPromotion(t *testing.T) {
	addr := startServer(t, &Server{})
	holder, waiter, token := holderAndWaiter(t, addr, "nightly-import")

	// Heartbeats are answered with the session's state and its own token.
	holder.send(heartbeat)
	holder.expect(Frame{Type: TypeAcquired, Token: token})
	waiter.send(heartbeat)
	waiter.expectWaiting()

	// Closing the holder pushes ACQUIRED to the waiter without any heartbeat.
	holder.Close()
	next := waiter.expectAcquired()
	if next <= token {
		t.Fatalf("promotion token %d not above %d", next, token)
	}
	waiter.send(heartbeat)
	waiter.expect(Frame{Type: TypeAcquired, Token: next})
	waiter.expectSilence(100 * time.Millisecond) // exactly one push
}

func TestFIFOOrderAndLeavingFromTheMiddle(t *testing.T) {
	addr := startServer(t, &Server{})
	holder, waiters, _ := queue(t, addr, "q", 5)
	waiters[2].Close() // leaves from the middle
	order := []int{0, 1, 3, 4}
	prev := holder
	for _, i := range order {
		prev.Close()
		waiters[i].expectAcquired()
		for _, j := range order {
			if j > i {
				waiters[j].send(heartbeat)
				waiters[j].expectWaiting()
			}
		}
		prev = waiters[i]
	}
}

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

func TestExpiryOfSilentHolderAndWaiter(t *testing.T) {
	srv := &Server{}
	addr := startServer(t, srv)
	const lease = 300 * time.Millisecond
	holder := dialRaw(t, addr)
	sent := time.Now()
	holder.send(acquire("e", lease))
	holder.expectAcquired()
	waiter := dialRaw(t, addr) // heartbeats, so it outlives the holder
	waiter.send(acquire("e", time.Minute))
	waiter.expectWaiting()
	silent := dialRaw(t, addr) // a silent waiter behind it
	silentSent := time.Now()
	silent.send(acquire("e", lease))
	silent.expectWaiting()

	waiter.expectAcquired() // pushed when the silent holder expires
	if held := time.Since(sent); held < lease {
		t.Fatalf("holder dropped after %v, before its lease of %v", held, lease)
	}
	holder.expectClosed(wait) // no ERROR is owed
	silent.expectClosed(wait)
	if d := time.Since(silentSent); d < lease {
		t.Fatalf("waiter dropped after %v, before its lease of %v", d, lease)
	}
	waitFor(t, "the expired waiter to leave the queue", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return srv.locks["e"].waiters.Len() == 0
	})
}

func TestHeartbeatsKeepAShortLeaseAlive(t *testing.T) {
	addr := startServer(t, &Server{})
	const lease = 200 * time.Millisecond
	holder := dialRaw(t, addr)
	holder.send(acquire("hb", lease))
	token := holder.expectAcquired()
	waiter := dialRaw(t, addr)
	waiter.send(acquire("hb", time.Minute))
	waiter.expectWaiting()
	for end := time.Now().Add(10 * lease); time.Now().Before(end); {
		time.Sleep(lease / 8)
		holder.send(heartbeat)
		holder.expect(Frame{Type: TypeAcquired, Token: token})
	}
	waiter.expectSilence(0) // still waiting: the holder never expired
	holder.Close()
	waiter.expectAcquired()
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

// A holder that never reads fills its buffers; the server's writes to it
// block, and nobody else may notice.
func TestClientThatNeverReadsDelaysNobody(t *testing.T) {
	l := startServerWatched(t, &Server{IOTimeout: time.Minute})
	stuckHolder(t, l, "stuck")
	addr := l.Addr().String()

	// The stuck session's goroutine is blocked writing. Others are served
	// at once, on another lock and on its own.
	start := time.Now()
	other := dialRaw(t, addr)
	other.send(acquire("other", time.Minute))
	token := other.expectAcquired()
	for range 10 {
		other.send(heartbeat)
		other.expect(Frame{Type: TypeAcquired, Token: token})
	}
	queued := dialRaw(t, addr)
	queued.send(acquire("stuck", time.Minute))
	queued.expectWaiting()
	if d := time.Since(start); d > 5*time.Second {
		t.Fatalf("other sessions took %v while one client did not read", d)
	}
}

func TestShutdownSendsShuttingDownToEverySession(t *testing.T) {
	srv := &Server{}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	addr := l.Addr().String()
	holder, waiter, _ := holderAndWaiter(t, addr, "s")
	waiter2 := dialRaw(t, addr)
	waiter2.send(acquire("s", time.Minute))
	waiter2.expectWaiting()
	fresh := dialRaw(t, addr) // connected, nothing sent yet
	waitFor(t, "the server to accept the fresh connection", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.sessions) == 4
	})

	if err := srv.Shutdown(bounded(t)); err != nil {
		t.Fatalf("Shutdown did not finish within %v: %v", wait, err)
	}
	// No waiter is promoted during shutdown: everyone reads 0x01 first.
	for _, c := range []*raw{holder, waiter, waiter2, fresh} {
		c.expectError(CodeShuttingDown)
	}
	if err := await(t, served, "Serve's return after Shutdown"); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve returned %v", err)
	}
	if _, err := net.DialTimeout("tcp", addr, wait); err == nil {
		t.Fatal("still accepting after Shutdown")
	}
	if err := srv.Serve(l); !errors.Is(err, ErrServerClosed) {
		t.Fatalf("Serve after Shutdown returned %v", err)
	}
}

func TestTokensIncreaseAcrossRestart(t *testing.T) {
	var last uint64
	addr := ""
	for range 3 {
		srv := &Server{}
		l, err := net.Listen("tcp", orDefault(addr, "127.0.0.1:0"))
		if err != nil {
			t.Fatal(err)
		}
		addr = l.Addr().String()
		go srv.Serve(l)
		for _, name := range []string{"a", "b", "c"} {
			c := dialRaw(t, addr)
			c.send(acquire(name, time.Minute))
			token := c.expectAcquired()
			if token <= last {
				t.Fatalf("token %d after %d", token, last)
			}
			last = token
			c.Close()
		}
		if err := srv.Shutdown(bounded(t)); err != nil {
			t.Fatalf("Shutdown did not finish within %v: %v", wait, err)
		}
	}
}

func orDefault(s, def string) string {
	if s == "" {
		return def
	}
	return s
}

func TestTokenSequence(t *testing.T) {
	srv := &Server{}
	srv.lastToken = 1 << 62 // far above the wall clock: the sequence goes on from here
	a, b := srv.nextTokenLocked(time.Now()), srv.nextTokenLocked(time.Now())
	if a != 1<<62+1 || b != a+1 {
		t.Fatalf("tokens %d, %d after %d", a, b, uint64(1<<62))
	}
	srv.lastToken = 0
	before := uint64(time.Now().UnixNano())
	if got := srv.nextTokenLocked(time.Now()); got < before {
		t.Fatalf("token %d below the wall clock %d", got, before)
	}
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

func TestShutdownDeadlineClosesStuckSessions(t *testing.T) {
	srv := &Server{IOTimeout: time.Minute}
	stuckHolder(t, startServerWatched(t, srv), "stuck")
	ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
	defer cancel()
	if err := srv.Shutdown(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Shutdown returned %v, want the context's deadline", err)
	}
	srv.mu.Lock()
	defer srv.mu.Unlock()
	if n := len(srv.sessions); n != 0 {
		t.Fatalf("%d sessions left after a forced shutdown", n)
	}
}

// stuckHolder makes a holder of name that floods heartbeats and never
// reads, and returns once the server's write to it has been under way for
// half a second: blocked, as it stays until the io-timeout, since the
// client never reads.
func stuckHolder(t *testing.T, l *watchedListener, name string) *raw {
	t.Helper()
	c := dialRaw(t, l.Addr().String())
	c.Conn.(*net.TCPConn).SetReadBuffer(1024)
	c.send(acquire(name, time.Minute))
	go func() {
		flood := bytes.Repeat([]byte{TypeHeartbeat}, 1<<16)
		for {
			if _, err := c.Conn.Write(flood); err != nil {
				return // closed by dialRaw's cleanup
			}
		}
	}()
	client := c.LocalAddr().String()
	waitFor(t, "a blocked write to a client that never reads", func() bool {
		return l.blockedFor(client) > 500*time.Millisecond
	})
	return c
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
