package main

import (
	"io"
	"net"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// muteProxy forwards TCP to addr both ways until mute, after which it
// drops what the server sends: the client hears nothing, while the server
// still hears the client.
func muteProxy(t *testing.T, addr string) (string, *atomic.Bool) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var mute atomic.Bool
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			s, err := net.Dial("tcp", addr)
			if err != nil {
				c.Close()
				continue
			}
			t.Cleanup(func() { c.Close(); s.Close() })
			go func() { io.Copy(s, c); s.Close() }()
			go func() {
				buf := make([]byte, 512)
				for {
					n, err := s.Read(buf)
					if n > 0 && !mute.Load() {
						c.Write(buf[:n])
					}
					if err != nil {
						c.Close()
						return
					}
				}
			}()
		}
	}()
	return l.Addr().String(), &mute
}

// A loss that only monolock run saw (its answers were lost; the server
// still hears it) must not become a release while COMMAND's group runs,
// however long -grace is beside -lease: run keeps the connection, with
// heartbeats, until the group is gone.
func TestRunKeepsTheLockFromOthersUntilTheGroupIsGone(t *testing.T) {
	s := start(t, nil)
	proxy, mute := muteProxy(t, s.addr)
	log := filepath.Join(t.TempDir(), "log")
	p := startRun(t, "-addr", proxy, "-lease", "1s", "-grace", "2500ms", "kept", "--",
		"sh", "-c", `trap '' TERM; echo started >> "$0"; sleep 60`, log)
	waitForFile(t, log, "started")
	next, f := rawAcquire(t, s.addr, "kept", time.Minute)
	if f.Type != monolock.TypeWaiting {
		t.Fatalf("the next client got %+v, want WAITING", f)
	}
	mute.Store(true) // run stops hearing the server: a loss at 0.8 s, SIGKILL 2.5 s later
	next.SetReadDeadline(time.Now().Add(30 * time.Second))
	f, err := monolock.ReadFrame(next)
	if err != nil || f.Type != monolock.TypeAcquired {
		t.Fatalf("the next client got %+v, %v; want ACQUIRED once the group is gone", f, err)
	}
	select {
	case <-p.done:
	case <-time.After(time.Second):
		t.Fatalf("the next client was granted while run still ran (no exit within 1s of the grant), with COMMAND's group; run's stderr:\n%s",
			p.stderr.String())
	}
	if code := p.cmd.ProcessState.ExitCode(); code != exitLost {
		t.Fatalf("run exited %d, want %d; stderr:\n%s", code, exitLost, p.stderr.String())
	}
}
