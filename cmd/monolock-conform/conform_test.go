package main

import (
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

func listen(t *testing.T) net.Listener {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l
}

// within runs a whole conformance run, failing the test if it has not
// ended within d: the tool bounds each step, this bounds the sum.
func within(t *testing.T, d time.Duration, run func() int) int {
	t.Helper()
	code := make(chan int, 1)
	go func() { code <- run() }()
	select {
	case c := <-code:
		return c
	case <-time.After(d):
		t.Fatalf("the conformance run did not end within %v", d)
		return -1
	}
}

func TestServerModePassesMonolock(t *testing.T) {
	srv := &monolock.Server{IOTimeout: time.Second}
	l := listen(t)
	go srv.Serve(l)
	defer srv.Close()
	var out bytes.Buffer
	code := within(t, 2*time.Minute, func() int { return serverMain([]string{"-io-timeout", "1s", l.Addr().String()}, &out) })
	if code != 0 || !strings.Contains(out.String(), " passed, 0 failed") {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
	if strings.Count(out.String(), "\nok ") < 20 {
		t.Fatalf("too few checks:\n%s", out.String())
	}
}

func TestServerModeFailsALIFOServer(t *testing.T) {
	l := listen(t)
	go serveLIFO(l)
	var out bytes.Buffer
	code := within(t, 2*time.Minute, func() int { return serverMain([]string{"-io-timeout", "1s", l.Addr().String()}, &out) })
	if code != 1 || !strings.Contains(out.String(), "FAIL  waiters are promoted in FIFO order") {
		t.Fatalf("exit %d, want 1 with the FIFO check failed:\n%s", code, out.String())
	}
}

// serveLIFO is a deliberately wrong server: it promotes the newest waiter.
func serveLIFO(l net.Listener) {
	type sess struct {
		conn  net.Conn
		mu    sync.Mutex
		token uint64
	}
	var mu sync.Mutex
	holders := map[string]*sess{}
	waiters := map[string][]*sess{}
	var token uint64
	write := func(s *sess, f monolock.Frame) {
		b, _ := f.AppendBinary(nil)
		s.mu.Lock()
		s.conn.Write(b)
		s.mu.Unlock()
	}
	for {
		c, err := l.Accept()
		if err != nil {
			return
		}
		go func() {
			s := &sess{conn: c}
			defer c.Close()
			c.SetReadDeadline(time.Now().Add(time.Second))
			f, err := monolock.ReadFrame(c)
			if err != nil || f.Type != monolock.TypeAcquire {
				return
			}
			name := f.Name
			mu.Lock()
			if holders[name] == nil {
				token++
				s.token, holders[name] = token, s
				write(s, monolock.Frame{Type: monolock.TypeAcquired, Token: token})
			} else {
				waiters[name] = append(waiters[name], s)
				write(s, monolock.Frame{Type: monolock.TypeWaiting})
			}
			mu.Unlock()
			for {
				c.SetReadDeadline(time.Now().Add(time.Duration(f.LeaseMS) * time.Millisecond))
				b := make([]byte, 1)
				if _, err := c.Read(b); err != nil || b[0] != monolock.TypeHeartbeat {
					break
				}
				mu.Lock()
				if holders[name] == s {
					write(s, monolock.Frame{Type: monolock.TypeAcquired, Token: s.token})
				} else {
					write(s, monolock.Frame{Type: monolock.TypeWaiting})
				}
				mu.Unlock()
			}
			mu.Lock()
			defer mu.Unlock()
			if holders[name] == s {
				delete(holders, name)
				if q := waiters[name]; len(q) > 0 {
					next := q[len(q)-1] // LIFO: the bug
					waiters[name] = q[:len(q)-1]
					token++
					next.token, holders[name] = token, next
					write(next, monolock.Frame{Type: monolock.TypeAcquired, Token: token})
				}
			} else {
				for i, w := range waiters[name] {
					if w == s {
						waiters[name] = append(waiters[name][:i], waiters[name][i+1:]...)
						break
					}
				}
			}
		}()
	}
}

// runGoClient plays the client under test with monolock's Go client: it
// acquires "conform" with DoRetry again and again, holds until the lock
// is lost, and stops on a client-error code.
func runGoClient(ctx context.Context, addr string, lease time.Duration) {
	c := monolock.New(monolock.Config{Address: addr})
	for ctx.Err() == nil {
		err := c.DoRetry(ctx, "conform", lease, func(ctx context.Context, token uint64) error {
			<-ctx.Done()
			return nil
		})
		var se *monolock.ServerError
		if errors.As(err, &se) && !se.Temporary() {
			return
		}
	}
}

func TestClientModePassesTheGoClient(t *testing.T) {
	l := listen(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go runGoClient(ctx, l.Addr().String(), time.Second)
	var out bytes.Buffer
	if code := within(t, 2*time.Minute, func() int { return playClient(l, &out) }); code != 0 {
		t.Fatalf("exit %d:\n%s", code, out.String())
	}
	if strings.Count(out.String(), "ok ") != len(scenarios) {
		t.Fatalf("not every scenario passed:\n%s", out.String())
	}
}

func TestClientModeFailsAClientThatCountsThePushAsAReply(t *testing.T) {
	l := listen(t)
	stop := make(chan struct{})
	defer close(stop)
	go brokenClient(l.Addr().String(), 2*time.Second, stop)
	var out bytes.Buffer
	code := within(t, 2*time.Minute, func() int { return playClient(l, &out) })
	if code != 1 || !strings.Contains(out.String(), "FAIL  a promotion push while a heartbeat is in flight confirms nothing") {
		t.Fatalf("exit %d, want 1 with the push scenario failed:\n%s", code, out.String())
	}
}

// brokenClient follows the client rules but one: it takes the promotion
// push as the reply to the heartbeat in flight.
func brokenClient(addr string, lease time.Duration, stop chan struct{}) {
	for {
		select {
		case <-stop:
			return
		default:
		}
		conn, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			time.Sleep(100 * time.Millisecond)
			continue
		}
		b, _ := monolock.Frame{Type: monolock.TypeAcquire, LeaseMS: uint32(lease.Milliseconds()), Name: "conform"}.AppendBinary(nil)
		conn.Write(b)
		lastSend := time.Now()
		confirmed, inflight, queued := lastSend, true, false
		frames := make(chan monolock.Frame)
		go func() {
			defer close(frames)
			for {
				f, err := monolock.ReadFrame(conn)
				if err != nil {
					return
				}
				frames <- f
			}
		}()
		retry, again := true, time.Duration(0)
	session:
		for {
			wake := confirmed.Add(lease * 8 / 10)
			if next := lastSend.Add(lease / 4); !inflight && next.Before(wake) {
				wake = next
			}
			select {
			case <-stop:
				conn.Close()
				return
			case f, ok := <-frames:
				switch {
				case !ok:
					break session
				case f.Type == monolock.TypeError:
					retry = f.Code < 0x10
					if f.Code != monolock.CodeShuttingDown {
						again = 100 * time.Millisecond
					}
					break session
				case f.Type == monolock.TypeWaiting && inflight:
					inflight, confirmed, queued = false, lastSend, true
				case f.Type == monolock.TypeAcquired && queued:
					queued = false
					if inflight { // the bug: the push is no reply
						inflight, confirmed = false, lastSend
					}
				case f.Type == monolock.TypeAcquired && inflight:
					inflight, confirmed = false, lastSend
				default:
					break session
				}
			case <-time.After(time.Until(wake)):
				if !time.Now().Before(confirmed.Add(lease * 8 / 10)) {
					break session // no confirmation in time
				}
				if !inflight {
					conn.Write([]byte{monolock.TypeHeartbeat})
					lastSend, inflight = time.Now(), true
				}
			}
		}
		conn.Close()
		for range frames {
		}
		if !retry {
			return
		}
		time.Sleep(again)
	}
}
