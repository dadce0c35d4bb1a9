package main

import (
	"net"
	"strings"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// monolock locks against a server whose admin API is off says what it
// needs, not only "connection refused".
func TestLocksSaysItNeedsTheAdminAPI(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close() // nothing listens there now
	code, _, stderr := runBinary(t, nil, "locks", "-admin", addr)
	if code != 1 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "-admin-listen") || !strings.Contains(stderr, addr) {
		t.Fatalf("exit %d, stderr %q; want 1 and one line naming %s and -admin-listen", code, stderr, addr)
	}
}

// monolock run says, once, after a second, that it waits; not when the
// grant is quick, and not with -n.
func TestRunSaysItWaits(t *testing.T) {
	s := start(t, nil)
	if code, stderr := runSync(t, "-addr", s.addr, "free", "--", "true"); code != 0 || stderr != "" {
		t.Fatalf("a free lock: exit %d, stderr %q; want 0 and nothing", code, stderr)
	}
	holder, f := rawAcquire(t, s.addr, "busy", time.Minute)
	if f.Type != monolock.TypeAcquired {
		t.Fatalf("holder got %+v", f)
	}
	if code, stderr := runSync(t, "-addr", s.addr, "-n", "busy", "--", "true"); code != exitBusy || strings.Contains(stderr, "waiting") {
		t.Fatalf("-n on a busy lock: exit %d, stderr %q; want %d and no waiting line", code, stderr, exitBusy)
	}
	p := startRun(t, "-addr", s.addr, "busy", "--", "true")
	time.Sleep(500 * time.Millisecond)
	if out := p.stderr.String(); out != "" {
		t.Fatalf("run spoke before a second of waiting: %q", out)
	}
	time.Sleep(1500 * time.Millisecond)
	holder.Close()
	if code := p.status(t, 10*time.Second); code != 0 {
		t.Fatalf("exit %d after the holder left; stderr:\n%s", code, p.stderr.String())
	}
	out := p.stderr.String()
	if strings.Count(out, "\n") != 1 || !strings.Contains(out, `waiting for lock "busy" at `+s.addr) || !strings.Contains(out, "monolock locks") {
		t.Fatalf("stderr %q; want one line saying it waits for \"busy\" at %s, and how to see who holds it", out, s.addr)
	}
}
