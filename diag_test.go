package monolock

import (
	"bytes"
	"crypto/tls"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"
	"time"
)

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
