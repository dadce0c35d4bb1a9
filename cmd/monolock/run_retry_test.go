package main

import (
	"context"
	"net"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// scriptedServer answers the n-th connection (from 0) with answer(n): a
// close before any reply when it returns 0, else an ERROR with that code.
func scriptedServer(t *testing.T, answer func(n int32) monolock.Code) (string, *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var conns atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			code := answer(conns.Add(1) - 1)
			c.SetDeadline(time.Now().Add(wait))
			monolock.ReadFrame(c)
			if code != 0 {
				b, _ := monolock.Frame{Type: monolock.TypeError, Code: code, Reason: "scripted"}.AppendBinary(nil)
				c.Write(b)
			}
			c.Close()
		}
	}()
	return l.Addr().String(), &conns
}

// The final line gives the reason of the attempt that ended the retries,
// and only when -wait (or a signal) ended them does it add the last
// retried attempt's reason: a refusal after a retry is that refusal, not
// "the last attempt: <the retried one>".
func TestRunRefusalAfterARetrySaysOnlyTheRefusal(t *testing.T) {
	addr, conns := scriptedServer(t, func(n int32) monolock.Code {
		if n == 0 {
			return 0 // closed before any reply: retried
		}
		return monolock.CodeNotAuthorized
	})
	code, stderr := runSync(t, "-addr", addr, "x", "--", "true")
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	final := lines[len(lines)-1]
	if code != exitRefused || conns.Load() != 2 || !strings.Contains(final, "scripted") ||
		strings.Contains(final, "the last attempt") || strings.Contains(final, "before any reply") {
		t.Errorf("exit %d after %d connections, want %d after 2 with the refusal alone on the final line; stderr:\n%s",
			code, conns.Load(), exitRefused, stderr)
	}
}

// -wait that ends while run is queued behind a holder (the server came
// back after a first attempt closed before any reply) is not said to be
// the retried attempt's fault: the last attempt waited in the queue.
func TestRunWaitEndedInTheQueueAfterARetry(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &closingListener{Listener: l}
	cl.left.Store(1)
	srv := &monolock.Server{}
	go srv.Serve(cl)
	t.Cleanup(func() { srv.Close() })
	addr := l.Addr().String()
	cl.left.Store(0)
	holder, err := monolock.New(monolock.Config{Address: addr}).Acquire(context.Background(), "x", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	cl.left.Store(1) // run's first connection is closed before any reply
	code, stderr := runSync(t, "-addr", addr, "-wait", "1500ms", "x", "--", "true")
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	final := lines[len(lines)-1]
	if code != exitTimeout || cl.left.Load() >= 0 || strings.Contains(final, "before any reply") {
		t.Errorf("exit %d (want %d), %d closes left; the final line blames the retried attempt though run then waited in the queue:\n%s",
			code, exitTimeout, max(cl.left.Load(), 0), stderr)
	}
}

// An address that can never be dialled is bad input: run says so and
// ends, as it did before it retried, instead of retrying it until -wait
// (or forever without -wait). No port: net's "missing port in address".
// No host with -tls-ca and no -tls-server-name: crypto/tls's "either
// ServerName or InsecureSkipVerify must be specified", found before a
// byte is sent, on every attempt.
func TestRunAddressThatCanNeverBeDialledIsNotRetried(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { // accepts and holds, as a server would
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	setup := newTLSSetup(t, identityRules)
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"no port", []string{"-addr", "127.0.0.1"}},
		{"no host, TLS without -tls-server-name", []string{"-addr", ":" + port, "-tls-ca", setup.caFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, stderr := runSync(t, append(tc.flags, "-wait", "3s", "x", "--", "true")...)
			if code == exitTimeout || strings.Contains(stderr, "retrying") || time.Since(start) > 2*time.Second {
				t.Errorf("exit %d after %v; retried though it can never succeed:\n%s", code, time.Since(start).Round(time.Millisecond), stderr)
			}
		})
	}
}
