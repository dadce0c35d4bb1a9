package main

import (
	"fmt"
	"io"
	"net"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// BenchmarkScrape measures one scrape of /metrics, a GET over loopback as
// Prometheus makes it, from the binary serving 10,000 idle sessions: 1,000
// holders, each of its own lock, and 9,000 waiters, nine in each lock's
// queue. It reports the scrape's time (p50, p99, max) and the server's CPU
// time per scrape. The sessions are this process's connections: it raises its
// descriptor limit to the hard one, which must be above 10,000, and so
// must the server's, which inherits it.
//
//	go test -run '^$' -bench Scrape -benchtime 200x ./cmd/monolock
func BenchmarkScrape(b *testing.B) {
	const holders, waitersPerLock = 1000, 9
	sessions := holders * (1 + waitersPerLock)
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim)
	lim.Cur = lim.Max
	if err := syscall.Setrlimit(syscall.RLIMIT_NOFILE, &lim); err != nil || lim.Cur < uint64(sessions+200) {
		b.Skipf("the descriptor limit is %d (%v): want %d", lim.Cur, err, sessions+200)
	}
	s := start(b, nil, "-ops-listen", "127.0.0.1:0")
	var conns []net.Conn
	b.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for i := range sessions {
		c, err := net.DialTimeout("tcp", s.addr, wait)
		if err != nil {
			b.Fatalf("session %d: %v", i, err)
		}
		conns = append(conns, c)
		frame, _ := monolock.Frame{Type: monolock.TypeAcquire, LeaseMS: uint32(time.Hour.Milliseconds()),
			Name: fmt.Sprintf("lock-%d", i%holders)}.AppendBinary(nil)
		c.Write(frame)
		c.SetReadDeadline(time.Now().Add(wait))
		if _, err := monolock.ReadFrame(c); err != nil {
			b.Fatalf("session %d: %v", i, err)
		}
	}
	url := "http://" + s.ops + "/metrics"
	get := func() []byte {
		resp, err := httpClient.Get(url)
		if err != nil {
			b.Fatal(err)
		}
		body, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode != 200 {
			b.Fatalf("/metrics: %s, %v", resp.Status, err)
		}
		return body
	}
	body := string(get())
	for _, want := range []string{"\nmonolock_locks_held 1000\n", "\nmonolock_waiters 9000\n", "\nmonolock_connections_active 10000\n"} {
		if !strings.Contains(body, want) {
			b.Fatalf("the server does not serve the sessions: no %q in\n%s", want[1:len(want)-1], body)
		}
	}
	// The server settles (its goroutines' stacks, a GC) before the timing.
	time.Sleep(2 * time.Second)
	// Back to back, a scrape's garbage makes the next scrapes pay GC with
	// 10,000 goroutines' stacks to scan; one scrape every 50 ms is closer to
	// what Prometheus does (one every 15 s, often 1 s). With "leaves", the
	// longest waiter is promoted before each scrape (its lock's holder
	// closes), so every scrape looks at every held lock's queue: the worst
	// case. The waiters queued in order, the first of lock-0 first, then
	// the first of lock-1, and so on.
	next := 0
	for _, mode := range []struct {
		name   string
		gap    time.Duration
		leaves bool
	}{{"gap=0s", 0, false}, {"gap=50ms", 50 * time.Millisecond, false}, {"gap=50ms,leaves", 50 * time.Millisecond, true}} {
		gap := mode.gap
		b.Run(mode.name, func(b *testing.B) {
			var took []time.Duration
			cpu := func() float64 {
				_, after, _ := strings.Cut(string(get()), "\nprocess_cpu_seconds_total ")
				v, _ := strconv.ParseFloat(strings.Fields(after)[0], 64)
				return v
			}
			cpuBefore := cpu()
			for b.Loop() {
				if gap > 0 {
					b.StopTimer()
					if mode.leaves {
						if next == holders {
							b.Fatal("every first waiter has been promoted")
						}
						conns[next].Close()
						next++
					}
					time.Sleep(gap)
					b.StartTimer()
				}
				t0 := time.Now()
				get()
				took = append(took, time.Since(t0))
			}
			// The server is idle but for the scrapes (the sessions' lease is
			// an hour: no heartbeats), so its CPU time is theirs: a figure
			// that other load on the machine barely moves, unlike the times.
			cpuPerScrape := (cpu() - cpuBefore) / float64(len(took)+1)
			slices.Sort(took)
			ms := func(d time.Duration) float64 { return float64(d) / 1e6 }
			b.ReportMetric(ms(took[len(took)/2]), "p50-ms")
			b.ReportMetric(ms(took[len(took)*99/100]), "p99-ms")
			b.ReportMetric(ms(took[len(took)-1]), "max-ms")
			b.ReportMetric(cpuPerScrape*1000, "server-cpu-ms/scrape")
		})
	}
}
