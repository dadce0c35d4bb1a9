package monolock

import (
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"testing"
	"time"
)

// TestStress runs a few hundred clients that connect, heartbeat, go silent,
// break the protocol and close at random on a handful of locks, then checks
// what they saw against the server's promises:
//   - one holder at a time: each grant of a lock is seen only after the
//     previous holder closed, or, if it went silent, after its lease ran
//     out counted from its last send;
//   - tokens unique, and increasing in the order a lock changes hands;
//   - on every connection, WAITING never after ACQUIRED, one token, one
//     reply per request plus at most one push;
//   - a heartbeating session is never dropped, and once the churn stops
//     every waiter is granted.
func TestStress(t *testing.T) {
	if testing.Short() {
		t.Skip("stress test")
	}
	const (
		clients  = 200
		locks    = 5
		lease    = 2 * time.Second
		interval = 100 * time.Millisecond
		churn    = 3 * time.Second
	)
	var (
		evMu   sync.Mutex
		events []Event
	)
	srv := &Server{IOTimeout: 5 * time.Second, OnEvent: func(ev Event) {
		evMu.Lock()
		events = append(events, ev)
		evMu.Unlock()
	}}
	addr := startServer(t, srv)
	stop := make(chan struct{})
	var (
		mu     sync.Mutex
		grants []*grant
		failed []string
	)
	var wg sync.WaitGroup
	for i := range clients {
		wg.Go(func() {
			c := &stressClient{addr: addr, lease: lease, interval: interval, stop: stop,
				rng: rand.New(rand.NewPCG(uint64(i), 42)), name: func(r *rand.Rand) string {
					return fmt.Sprintf("lock-%d", r.IntN(locks))
				}}
			c.run()
			mu.Lock()
			grants = append(grants, c.grants...)
			failed = append(failed, c.failures...)
			mu.Unlock()
		})
	}
	time.Sleep(churn)
	close(stop)
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	select {
	case <-finished:
	case <-time.After(time.Minute):
		t.Fatal("clients still waiting a minute after the churn stopped")
	}
	for _, f := range failed {
		t.Error(f)
	}

	byLock := map[string][]*grant{}
	tokens := map[uint64]bool{}
	for _, g := range grants {
		if tokens[g.token] {
			t.Errorf("token %d granted twice", g.token)
		}
		tokens[g.token] = true
		byLock[g.lock] = append(byLock[g.lock], g)
	}
	for name, gs := range byLock {
		slices.SortFunc(gs, func(a, b *grant) int { return cmpUint(a.token, b.token) })
		for i := 1; i < len(gs); i++ {
			prev, next := gs[i-1], gs[i]
			if !next.seen.After(prev.endBound) {
				t.Errorf("%s: token %d seen %v before the end of token %d's ownership (%s)",
					name, next.token, prev.endBound.Sub(next.seen), prev.token, prev.how)
			}
		}
	}
	if len(grants) < clients {
		t.Errorf("only %d grants for %d clients", len(grants), clients)
	}
	t.Logf("%d grants on %d locks", len(grants), len(byLock))

	// The events alone tell the same story: per lock, grant and release
	// alternate with the same token, tokens rise, and every grant the
	// clients saw is there.
	waitFor(t, "every session to end", func() bool {
		srv.mu.Lock()
		defer srv.mu.Unlock()
		return len(srv.sessions) == 0
	})
	awaitFunc(t, "the delivery of the last events", srv.eventWG.Wait)
	evMu.Lock()
	defer evMu.Unlock()
	holder := map[string]uint64{}
	var last uint64
	granted := map[uint64]bool{}
	for _, ev := range events {
		switch ev.Type {
		case EventGranted:
			if holder[ev.Lock] != 0 {
				t.Fatalf("%s granted to %d while %d holds it", ev.Lock, ev.Token, holder[ev.Lock])
			}
			if ev.Token <= last {
				t.Fatalf("token %d granted after %d", ev.Token, last)
			}
			holder[ev.Lock], last, granted[ev.Token] = ev.Token, ev.Token, true
		case EventReleased:
			if holder[ev.Lock] != ev.Token {
				t.Fatalf("%s released by %d while %d holds it", ev.Lock, ev.Token, holder[ev.Lock])
			}
			holder[ev.Lock] = 0
		}
	}
	for name, token := range holder {
		if token != 0 {
			t.Errorf("%s: grant of %d never released", name, token)
		}
	}
	for _, g := range grants {
		if !granted[g.token] {
			t.Errorf("no granted event for token %d", g.token)
		}
	}
}

func cmpUint(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

type grant struct {
	lock     string
	token    uint64
	seen     time.Time // when the client read its ACQUIRED
	endBound time.Time // the server cannot have ended the ownership before this
	how      string
}

type stressClient struct {
	addr            string
	lease, interval time.Duration
	stop            chan struct{}
	rng             *rand.Rand
	name            func(*rand.Rand) string
	grants          []*grant
	failures        []string
}

func (c *stressClient) failf(format string, args ...any) {
	c.failures = append(c.failures, fmt.Sprintf(format, args...))
}

func (c *stressClient) stopped() bool {
	select {
	case <-c.stop:
		return true
	default:
		return false
	}
}

func (c *stressClient) run() {
	for !c.stopped() && len(c.failures) == 0 {
		c.session()
	}
}

type readResult struct {
	f   Frame
	err error
	at  time.Time
}

// session plays one connection with a randomly chosen behaviour.
func (c *stressClient) session() {
	const (
		normal  = iota // heartbeats; closes a little after the grant
		quitter        // heartbeats; gives up while waiting
		silent         // stops sending at some point
		breaker        // sends an unknown type byte at some point
	)
	behaviour := []int{normal, normal, normal, normal, normal, normal, quitter, quitter, silent, breaker}[c.rng.IntN(10)]
	after := time.Duration(c.rng.Int64N(int64(150 * time.Millisecond)))
	name := c.name(c.rng)

	conn, err := net.DialTimeout("tcp", c.addr, wait)
	if err != nil {
		c.failf("dial: %v", err)
		return
	}
	defer conn.Close()
	frames := make(chan readResult, 4)
	go func() {
		for {
			f, err := ReadFrame(conn)
			frames <- readResult{f, err, time.Now()}
			if err != nil {
				return
			}
		}
	}()

	var (
		requests, replies int // replies counts frames that are not the push
		waited, pushed    bool
		token             uint64
		g                 *grant
		lastSend          time.Time
	)
	send := func(f Frame) bool {
		b, _ := f.AppendBinary(nil)
		lastSend = time.Now()
		conn.SetWriteDeadline(time.Now().Add(wait))
		if _, err := conn.Write(b); err != nil {
			c.failf("%s: write: %v", name, err)
			return false
		}
		requests++
		return true
	}
	end := func(how string, bound time.Time) {
		if g != nil {
			g.endBound, g.how = bound, how
		}
	}
	// awaitDrop reads until the server ends the connection.
	awaitDrop := func(how string, earliest time.Time) {
		conn.SetReadDeadline(earliest.Add(wait))
		for r := range frames {
			if r.err == nil {
				if r.f.Type == TypeAcquired && token == 0 && waited && !pushed {
					pushed, token = true, r.f.Token
					g = &grant{lock: name, token: token, seen: r.at}
					c.grants = append(c.grants, g)
				}
				continue
			}
			if isTimeoutErr(r.err) {
				c.failf("%s: %s session not dropped within %v of the end of its lease", name, how, wait)
				return
			}
			if r.at.Before(earliest) {
				c.failf("%s: %s session dropped %v early", name, how, earliest.Sub(r.at))
			}
			end(how, earliest)
			return
		}
	}

	if !send(acquire(name, c.lease)) {
		return
	}
	start := time.Now()
	tick := time.NewTicker(c.interval)
	defer tick.Stop()
	for {
		select {
		case r := <-frames:
			if r.err != nil {
				c.failf("%s: healthy session ended: %v", name, r.err)
				end("dropped", r.at)
				return
			}
			switch f := r.f; {
			case f.Type == TypeWaiting && token != 0:
				c.failf("%s: WAITING after ACQUIRED", name)
				return
			case f.Type == TypeWaiting:
				waited = true
				replies++
			case f.Type == TypeAcquired && token != 0 && f.Token != token:
				c.failf("%s: token %d then %d on one connection", name, token, f.Token)
				return
			case f.Type == TypeAcquired && token == 0 && waited:
				pushed, token = true, f.Token // the first ACQUIRED after WAITING counts as the push
				g = &grant{lock: name, token: token, seen: r.at}
				c.grants = append(c.grants, g)
				start = time.Now()
			case f.Type == TypeAcquired && token == 0:
				replies++
				token = f.Token
				g = &grant{lock: name, token: token, seen: r.at}
				c.grants = append(c.grants, g)
				start = time.Now()
			case f.Type == TypeAcquired:
				replies++
			default:
				c.failf("%s: unexpected %+v", name, f)
				return
			}
			if replies > requests {
				c.failf("%s: %d replies to %d requests (pushed: %v)", name, replies, requests, pushed)
				return
			}
		case <-tick.C:
			stopping := c.stopped()
			due := !stopping && time.Since(start) > after
			switch {
			case behaviour == silent && due:
				awaitDrop("silent", lastSend.Add(c.lease))
				return
			case behaviour == breaker && due:
				if !send(Frame{Type: TypeHeartbeat}) { // keeps the count honest; then the bad byte
					return
				}
				bound := time.Now()
				conn.Write([]byte{0x7f})
				awaitDrop("broke the protocol", bound)
				return
			case behaviour == quitter && token == 0 && due,
				token != 0 && (due || stopping) && requests == replies:
				end("closed", time.Now())
				return // the deferred Close releases
			case requests == replies: // one heartbeat in flight at most
				if !send(heartbeat) {
					return
				}
			}
		}
	}
}
