package monolock

import (
	"bufio"
	"net"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"
)

// Each benchmark runs against monolock and against a floor: a TCP
// responder that does the same socket work with no lock table, so that
// the ratio of the two is the cost of monolock itself on this machine.
//
//	go test -run '^$' -bench . -count 5

// BenchmarkHandover measures the time from a holder closing its connection
// to its waiter reading the pushed ACQUIRED.
func BenchmarkHandover(b *testing.B) {
	b.Run("monolock", func(b *testing.B) { benchHandover(b, startServer(b, &Server{})) })
	b.Run("floor", func(b *testing.B) { benchHandover(b, startFloor(b, true)) })
}

func benchHandover(b *testing.B, addr string) {
	holder := dialRaw(b, addr)
	holder.send(acquire("handover", 60e9))
	holder.expectAcquired()
	for range b.N {
		b.StopTimer()
		waiter := dialRaw(b, addr)
		waiter.send(acquire("handover", 60e9))
		waiter.expectWaiting()
		time.Sleep(100 * time.Microsecond) // the server settles: only the handover is timed
		waiter.SetReadDeadline(time.Now().Add(wait))
		b.StartTimer()
		holder.Close()
		if f, err := ReadFrame(waiter); err != nil || f.Type != TypeAcquired {
			b.Fatalf("waiter read %+v, %v; want the pushed ACQUIRED within %v", f, err, wait)
		}
		holder = waiter
	}
}

// BenchmarkAcquireRelease measures dial, ACQUIRE, read ACQUIRED, close,
// by 1 and by 8 clients at once, each on locks of its own.
func BenchmarkAcquireRelease(b *testing.B) {
	for _, clients := range []int{1, 8} {
		name := "clients=" + strconv.Itoa(clients)
		b.Run(name+"/monolock", func(b *testing.B) { benchAcquireRelease(b, startServer(b, &Server{}), clients) })
		b.Run(name+"/floor", func(b *testing.B) { benchAcquireRelease(b, startFloor(b, false), clients) })
	}
}

func benchAcquireRelease(b *testing.B, addr string, clients int) {
	var wg sync.WaitGroup
	for c := range clients {
		n := b.N / clients
		if c < b.N%clients {
			n++
		}
		wg.Go(func() {
			prefix := "bench-" + strconv.Itoa(c) + "-"
			var buf []byte
			for i := range n {
				conn, err := net.DialTimeout("tcp", addr, wait)
				if err != nil {
					b.Error(err)
					return
				}
				conn.SetDeadline(time.Now().Add(wait))
				buf, _ = acquire(prefix+strconv.Itoa(i), 60e9).AppendBinary(buf[:0])
				conn.Write(buf)
				if f, err := ReadFrame(conn); err != nil || f.Type != TypeAcquired {
					b.Errorf("read %+v, %v; want ACQUIRED within %v", f, err, wait)
				}
				conn.Close()
			}
		})
	}
	awaitFunc(b, "the end of every client's cycles", wg.Wait)
}

// startFloor serves the floor: every ACQUIRE is granted at once, or, with
// oneLock, the first connection holds, the next one waits, and the
// holder's EOF is relayed as ACQUIRED to the waiter.
func startFloor(tb testing.TB, oneLock bool) string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { l.Close() })
	var mu sync.Mutex
	var holder, waiter net.Conn
	acquired := []byte{TypeAcquired, 0, 0, 0, 0, 0, 0, 0, 1}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				conn.SetReadDeadline(time.Now().Add(time.Minute)) // a floor client lives a benchmark at most
				r := bufio.NewReaderSize(conn, 64)
				if _, err := ReadFrame(r); err != nil {
					return
				}
				reply := acquired
				if oneLock {
					mu.Lock()
					if holder == nil {
						holder = conn
					} else {
						waiter, reply = conn, []byte{TypeWaiting}
					}
					mu.Unlock()
				}
				conn.Write(reply)
				r.ReadByte() // until EOF
				if oneLock {
					var next net.Conn
					mu.Lock()
					if holder == conn {
						next, holder, waiter = waiter, waiter, nil
					}
					mu.Unlock()
					if next != nil {
						next.Write(acquired)
					}
				}
			}()
		}
	}()
	return l.Addr().String()
}

// BenchmarkAdminBesideAStuckClient measures, in real time, an
// administrator's ForceRelease and KickWaiter beside a client that never
// reads (in-memory connections, so that its writes block at once): the
// time to the call's return, and to the ended session reading its ERROR
// 0x02. The ms-max metrics are the slowest of the run; issue 23 asks for
// both under 50 ms whatever the stuck client does.
//
//	go test -run '^$' -bench AdminBesideAStuckClient -benchtime 200x
func BenchmarkAdminBesideAStuckClient(b *testing.B) {
	b.Run("ForceRelease/next-waiter-stuck", func(b *testing.B) {
		benchAdmin(b, func(b *testing.B, l *pipeListener, name string) (func() error, net.Conn) {
			h := dialPipe(b, l, name+"-h", name, true)
			dialPipe(b, l, name+"-w", name, false) // never reads: its WAITING blocks
			return func() error { _, err := l.srv.ForceRelease(name, 0); return err }, h
		})
	})
	b.Run("KickWaiter/holder-and-next-stuck", func(b *testing.B) {
		benchAdmin(b, func(b *testing.B, l *pipeListener, name string) (func() error, net.Conn) {
			dialPipe(b, l, name+"-h", name, false) // never reads: its ACQUIRED blocks
			k := dialPipe(b, l, name+"-k", name, true)
			dialPipe(b, l, name+"-n", name, false)
			return func() error { _, err := l.srv.KickWaiter(name, name+"-k"); return err }, k
		})
	})
}

func benchAdmin(b *testing.B, setup func(*testing.B, *pipeListener, string) (func() error, net.Conn)) {
	l := newPipeListener()
	l.srv = &Server{IOTimeout: time.Minute}
	go l.srv.Serve(l)
	b.Cleanup(func() { l.srv.Close(); l.Close() })
	var returned, told time.Duration
	b.ResetTimer()
	for i := range b.N {
		b.StopTimer()
		call, ended := setup(b, l, "admin-"+strconv.Itoa(i))
		b.StartTimer()
		start := time.Now()
		if err := call(); err != nil {
			b.Fatal(err)
		}
		returned = max(returned, time.Since(start))
		ended.SetReadDeadline(time.Now().Add(wait))
		if f, err := ReadFrame(ended); err != nil || f.Type != TypeError || f.Code != CodeClosedByAdmin {
			b.Fatalf("the ended session read %+v, %v; want ERROR 0x02 within %v", f, err, wait)
		}
		told = max(told, time.Since(start))
	}
	b.ReportMetric(float64(returned)/1e6, "ms-max-return")
	b.ReportMetric(float64(told)/1e6, "ms-max-error02")
}

// dialPipe joins name over an in-memory connection and, when reads is set,
// reads its answer; otherwise it waits until the server has it in the table.
func dialPipe(b *testing.B, l *pipeListener, remote, name string, reads bool) net.Conn {
	c := l.dial(remote)
	b.Cleanup(func() { c.Close() })
	go func() {
		buf, _ := acquire(name, time.Minute).AppendBinary(nil)
		c.Write(buf)
	}()
	if reads {
		c.SetReadDeadline(time.Now().Add(wait))
		if _, err := ReadFrame(c); err != nil {
			b.Fatalf("%s: %v", remote, err)
		}
		return c
	}
	waitFor(b, remote+" in the table", func() bool {
		info, _ := l.srv.Lock(name)
		if info.Holder != nil && info.Holder.RemoteAddr == remote {
			return true
		}
		return slices.ContainsFunc(info.Waiters, func(w SessionInfo) bool { return w.RemoteAddr == remote })
	})
	return c
}

// BenchmarkSnapshotsHoldTheTable measures how long Locks and Stats, an
// administrator's and a scrape's snapshot of 100,000 held locks, keep
// srv.mu from everyone else: the longest wait for it beside them
// (ms-max-table-held), which every session's decisions then wait too.
//
//	go test -run '^$' -bench SnapshotsHoldTheTable -benchtime 10x
func BenchmarkSnapshotsHoldTheTable(b *testing.B) {
	srv := &Server{}
	srv.mu.Lock()
	srv.initLocked()
	for i := range 100_000 {
		s := &session{name: "lock-" + strconv.Itoa(i*7919%100_000), remote: "r", lease: time.Second}
		srv.locks[s.name] = &lock{holder: s}
	}
	srv.mu.Unlock()
	for name, snapshot := range map[string]func(){"Locks": func() { srv.Locks() }, "Stats": func() { srv.Stats() }} {
		b.Run(name, func(b *testing.B) {
			var held time.Duration
			for range b.N {
				stop, done := make(chan struct{}), make(chan struct{})
				go func() { // waits for srv.mu as a session would, each 50µs
					defer close(done)
					for {
						select {
						case <-stop:
							return
						case <-time.After(50 * time.Microsecond):
						}
						start := time.Now()
						srv.mu.Lock()
						held = max(held, time.Since(start))
						srv.mu.Unlock()
					}
				}()
				time.Sleep(time.Millisecond)
				snapshot()
				close(stop)
				<-done
			}
			b.ReportMetric(float64(held)/1e6, "ms-max-table-held")
		})
	}
}
