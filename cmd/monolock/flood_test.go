package main

import (
	"bytes"
	"fmt"
	"io"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// The flood: floodConns sessions, each holding a lock of its own, each
// writing floodBurst HEARTBEAT bytes at once every floodEvery and reading
// its replies. On this project's 2-core machine, with a server that read
// and answered heartbeats one by one, the test failed 15 runs of 15 (10
// plain, 5 under -race): monolock run lost its lock (exit 70) or never got
// it (69) every time, and the client's acquire-releases took a median of
// 0.85 to 1.77 s per run. One run with 200 flooders passed (median 0.58 s,
// max 0.76 s, the lease kept): too few to fail reliably on two cores.
const (
	floodConns = 400
	floodBurst = 2048
	floodEvery = 100 * time.Millisecond
	// floodBound is what one acquire-release of the well-behaved client may
	// take: generous, so that a noisy machine does not fail it, and still
	// far below what the flood did before.
	floodBound = time.Second
	// floodMedian bounds the median acquire-release during the flood, a
	// steadier measure than the max: with the pause after a multi-byte read
	// it was 1 to 9 ms in 19 runs (plain, -race, beside a busy loop, beside
	// other tests); without the pause, 228 to 642 ms in 9 runs of 9, while
	// the max stayed under floodBound in 3 of them.
	floodMedian = 50 * time.Millisecond
)

// A heartbeat flood costs its senders, not the other sessions: meanwhile a
// well-behaved client acquires and releases its lock, each time within
// floodBound and with a median within floodMedian, and monolock run with a
// 2 s lease keeps its lock through a 4 s command.
func TestHeartbeatFloodStarvesNobody(t *testing.T) {
	if testing.Short() {
		t.Skip("floods the server for several seconds")
	}
	s := start(t, nil)

	conns := make([]net.Conn, 0, floodConns)
	for i := range floodConns {
		c, f := dial(t, s.addr, fmt.Sprintf("flood-%d", i)) // a 60 s lease
		if f.Type != monolock.TypeAcquired {
			t.Fatalf("flooder %d got %+v", i, f)
		}
		c.SetReadDeadline(time.Time{})
		conns = append(conns, c)
	}
	var flooders sync.WaitGroup
	stop := make(chan struct{})
	defer func() {
		close(stop)
		for _, c := range conns {
			c.Close() // ends a write the server does not take, and the reader
		}
		flooders.Wait()
	}()
	burst := bytes.Repeat([]byte{monolock.TypeHeartbeat}, floodBurst)
	begin := time.Now()
	for i, c := range conns {
		flooders.Go(func() { io.Copy(io.Discard, c) })
		flooders.Go(func() {
			// Spread evenly over floodEvery; a late burst does not make up
			// for the ones it missed. A server may close a flooder: it stops.
			next := begin.Add(floodEvery * time.Duration(i) / floodConns)
			for {
				select {
				case <-stop:
					return
				case <-time.After(time.Until(next)):
				}
				if _, err := c.Write(burst); err != nil {
					return
				}
				if next = next.Add(floodEvery); next.Before(time.Now()) {
					next = time.Now()
				}
			}
		})
	}

	// The job: granted, then 4 s of work while heartbeating every 0.5 s or
	// less, giving the lock up at 1.6 s without a confirmed reply.
	job := startRun(t, "-addr", s.addr, "-lease", "2s", "flood-job", "--", "sleep", "4")

	// The well-behaved client, on one lock, until the job ends: each turn
	// from the dial to ACQUIRED (a WAITING first if its last close is not
	// yet seen), then the close that releases it.
	var took []time.Duration
	for i := 0; (job.running() || i < 5) && time.Since(begin) < 20*time.Second; i++ {
		start := time.Now()
		if err := acquireRelease(s.addr, "flood-client", start.Add(wait)); err != nil {
			t.Fatalf("acquire %d: %v after %v", i+1, err, time.Since(start))
		}
		took = append(took, time.Since(start))
		time.Sleep(20 * time.Millisecond)
	}

	code := job.status(t, wait)
	sorted := slices.Sorted(slices.Values(took))
	slow := 0
	for _, d := range took {
		if d >= floodBound {
			slow++
		}
	}
	summary := fmt.Sprintf("%d flooders; %d acquire-releases, median %v, max %v, %d of them %v or longer",
		floodConns, len(took), sorted[len(sorted)/2].Round(time.Millisecond), sorted[len(sorted)-1].Round(time.Millisecond), slow, floodBound)
	t.Log(summary)
	if code != 0 {
		t.Errorf("monolock run -lease 2s ... sleep 4 exited %d, want 0 (granted, and the lock kept throughout); its stderr:\n%s", code, job.stderr.String())
	}
	if slow > 0 {
		t.Errorf("%s: want none", summary)
	}
	if median := sorted[len(sorted)/2]; median >= floodMedian {
		t.Errorf("%s: want a median under %v", summary, floodMedian)
	}
}

// acquireRelease dials addr, ACQUIREs name, reads up to ACQUIRED, and closes,
// all by deadline.
func acquireRelease(addr, name string, deadline time.Time) error {
	c, err := net.DialTimeout("tcp", addr, time.Until(deadline))
	if err != nil {
		return err
	}
	defer c.Close()
	c.SetDeadline(deadline)
	b, _ := monolock.Frame{Type: monolock.TypeAcquire, LeaseMS: 10000, Name: name}.AppendBinary(nil)
	if _, err := c.Write(b); err != nil {
		return err
	}
	for {
		f, err := monolock.ReadFrame(c)
		switch {
		case err != nil:
			return err
		case f.Type == monolock.TypeAcquired:
			return nil
		case f.Type != monolock.TypeWaiting:
			return fmt.Errorf("got %+v", f)
		}
	}
}
