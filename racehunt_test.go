package monolock

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// The race hunt drives a real Server through in-memory connections under
// fake time (testing/synctest), so that leases, io-timeouts and silences
// cost nothing, and every run of a seed is the same interleaving of
// goroutines up to the scheduler's choices. Each seed plays a random mix of
// clients (valid and invalid frames, heartbeats, silences past the lease,
// closes, half-sent frames) against kicks, force-releases and a shutdown at
// a random moment, then checks every byte stream against the protocol's
// grammar and the event stream against the table's rules; every grant
// against the state of its session at that moment (not past its lease, not
// ending on its own); and, through a log of the server's writes, that
// nothing but the final ERROR began on a connection after an administrator's
// call that ended its session returned.

var (
	huntSeeds = flag.Int("seeds", 300, "how many seeds TestRaceHunt plays")
	huntSeed  = flag.Int("seed", -1, "the one seed TestRaceHunt plays, when not -1")
)

func TestRaceHunt(t *testing.T) {
	seeds := *huntSeeds
	if testing.Short() {
		seeds = min(seeds, 50)
	}
	first := 0
	if *huntSeed >= 0 {
		first, seeds = *huntSeed, 1
	}
	for seed := first; seed < first+seeds; seed++ {
		cfg := huntConfig{seed: uint64(seed), clients: 8, steps: 8, chaos: 6}
		if err := cfg.play(t); err != nil {
			t.Errorf("seed %d: %v", seed, err)
			small := cfg.shrink(t)
			t.Fatalf("shrunk reproduction: %+v: %v\n(again: go test -run 'TestRaceHunt$' -seed %d)", small, small.play(t), seed)
		}
	}
}

type huntConfig struct {
	seed                  uint64
	clients, steps, chaos int
}

// shrink looks for a smaller configuration of the same seed that still fails.
func (c huntConfig) shrink(t *testing.T) huntConfig {
	for again := true; again; {
		again = false
		for _, smaller := range []huntConfig{
			{c.seed, c.clients - 1, c.steps, c.chaos},
			{c.seed, c.clients, c.steps - 1, c.chaos},
			{c.seed, c.clients, c.steps, c.chaos - 1},
		} {
			if smaller.clients > 0 && smaller.steps > 0 && smaller.chaos >= 0 && smaller.play(t) != nil {
				c, again = smaller, true
				break
			}
		}
	}
	return c
}

// huntClient is what one client did and saw.
type huntClient struct {
	name     string // its remote address, as the server sees it
	valid    int    // complete, valid requests the server read
	selfEnd  bool   // it closed the connection itself
	received []byte

	lock    string       // the lock it asks for
	seen    []time.Time  // when the server read each valid request: a write to a pipe returns at the (fake) instant of its read
	written int64        // bytes the server has read from it
	badAt   atomic.Int64 // the offset of the byte that ends its joined session, once sent; -1 before

	// The server read that byte while the session waited in its lock's
	// queue: from then on it is ending, and nothing may grant it the lock.
}

// play runs the configuration in a bubble of its own. It reports through
// its result rather than t, so that a failure can be shrunk.
func (c huntConfig) play(t *testing.T) (err error) {
	synctest.Test(t, func(*testing.T) { err = c.bubble() })
	return err
}

func (c huntConfig) bubble() error {
	const lease = time.Second
	rng := rand.New(rand.NewPCG(c.seed, 0x6d6f6e6f))
	var evMu sync.Mutex
	var events []Event
	srv := &Server{IOTimeout: 2 * time.Second, OnEvent: func(ev Event) {
		evMu.Lock()
		events = append(events, ev)
		evMu.Unlock()
	}}
	l := newProbeNet(nil)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	start := time.Now()

	clients := make([]*huntClient, c.clients)
	var wg sync.WaitGroup
	for i := range clients {
		hc := &huntClient{name: fmt.Sprintf("c%d", i)}
		hc.badAt.Store(-1)
		clients[i] = hc
		script := rand.New(rand.NewPCG(rng.Uint64(), uint64(i)))
		conn, pc := l.pair(hc.name)
		l.accept(pc)
		wg.Add(2)
		go func() { defer wg.Done(); hc.readAll(conn) }()
		go func() { defer wg.Done(); hc.play(conn, script, c.steps, lease) }()
	}

	var forced []huntForce
	var stops []huntStop
	chaos := rand.New(rand.NewPCG(rng.Uint64(), 99))
	shutdownAt := tick(chaos, 6*lease)
	wg.Add(1)
	go func() {
		defer wg.Done()
		start := time.Now()
		for range c.chaos {
			time.Sleep(tick(chaos, lease))
			if time.Since(start) > shutdownAt {
				break
			}
			locks := srv.Locks()
			if len(locks) == 0 {
				continue
			}
			li := locks[chaos.IntN(len(locks))]
			switch {
			case chaos.IntN(2) == 0 && len(li.Waiters) > 0:
				if info, err := srv.KickWaiter(li.Name, li.Waiters[chaos.IntN(len(li.Waiters))].RemoteAddr); err == nil {
					stops = append(stops, huntStop{info.RemoteAddr, "KickWaiter", l.log.mark("KickWaiter returned")})
				}
			case li.Holder != nil:
				token := li.Holder.Token
				if chaos.IntN(3) == 0 {
					token = 0
				}
				if info, err := srv.ForceRelease(li.Name, token); err == nil {
					stops = append(stops, huntStop{info.RemoteAddr, "ForceRelease", l.log.mark("ForceRelease returned")})
					forced = append(forced, huntForce{info.RemoteAddr, info.Token})
				}
			}
		}
		time.Sleep(max(0, shutdownAt-time.Since(start)))
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		if err := srv.Shutdown(ctx); err != nil {
			panic(fmt.Sprintf("shutdown: %v", err)) // a fake minute: it hangs
		}
	}()
	wg.Wait()
	if err := <-served; err != ErrServerClosed {
		return fmt.Errorf("Serve returned %v", err)
	}
	for _, hc := range clients {
		if err := hc.check(); err != nil {
			return fmt.Errorf("client %s: %w (received % x)", hc.name, err, hc.received)
		}
	}
	for _, st := range stops {
		// Its final ERROR is 0x02, or the code of the end it was already on.
		if late := writesAfterStop(&l.log, st.mark, st.remote, 0); len(late) > 0 {
			return fmt.Errorf("client %s: written to after %s returned: %v; it received %s", st.remote, st.call, late, byName(clients, st.remote).frames())
		}
	}
	evMu.Lock()
	defer evMu.Unlock()
	if err := checkGrants(events, clients, lease, start); err != nil {
		return err
	}
	return checkEvents(events, forced)
}

func byName(clients []*huntClient, name string) *huntClient {
	for _, hc := range clients {
		if hc.name == name {
			return hc
		}
	}
	return &huntClient{name: name}
}

// waiting says whether remote is in the queue of lock.
func waiting(srv *Server, lock, remote string) bool {
	li, _ := srv.Lock(lock)
	return slices.ContainsFunc(li.Waiters, func(w SessionInfo) bool { return w.RemoteAddr == remote })
}

// huntStop is an administrator's call that ended remote's session; mark is
// the server log's entry made when it returned.
type huntStop struct {
	remote, call string
	mark         int
}

// checkGrants holds every grant to the state of its session at that
// moment: a session whose lease had passed (by the deadline the server
// itself set, lastSeen + lease) must not be granted the lock. (A session
// ending on its own is out of the table from the moment the server
// decides its bad byte, which is not observable here, only through the
// stream's grammar: TestPromotionSkipsEndingWaiter holds that moment.)
func checkGrants(events []Event, clients []*huntClient, lease time.Duration, start time.Time) error {
	for i, ev := range events {
		if ev.Type != EventGranted {
			continue
		}
		hc := byName(clients, ev.RemoteAddr)
		var seen time.Time // the last valid request read at or before the grant
		for _, at := range hc.seen {
			if !at.After(ev.Time) {
				seen = at
			}
		}
		if !seen.IsZero() && !ev.Time.Before(seen.Add(lease)) {
			return fmt.Errorf("event %d: %s granted %q (token %d) at %v; its lease had passed at %v (last request read at %v); it received %s",
				i, hc.name, ev.Lock, ev.Token, ev.Time.Sub(start), seen.Add(lease).Sub(start), seen.Sub(start), hc.frames())
		}
	}
	return nil
}

// tick returns a random multiple of 50ms below d: on a coarse grid, many
// goroutines wake at the same fake instant and race for real.
func tick(r *rand.Rand, d time.Duration) time.Duration {
	const grid = 50 * time.Millisecond
	return time.Duration(r.Int64N(int64(d/grid))) * grid
}

type huntForce struct {
	remote string
	token  uint64
}

// play sends a random script; it stops at the first failed write, which
// means the server has closed the connection.
func (hc *huntClient) play(conn net.Conn, r *rand.Rand, steps int, lease time.Duration) {
	defer func() {
		if hc.selfEnd {
			conn.Close()
		}
	}()
	joined := false // it sent a valid ACQUIRE
	// write sends b, whose first valid bytes are one valid request (if
	// valid is not 0), the rest a byte that ends the session.
	write := func(b []byte, valid int) bool {
		if joined && valid < len(b) && hc.badAt.Load() < 0 {
			hc.badAt.Store(hc.written + int64(valid)) // its session ends on this byte
		}
		n, err := conn.Write(b)
		hc.written += int64(n)
		if err != nil {
			return false
		}
		if valid > 0 {
			hc.valid++
			hc.seen = append(hc.seen, time.Now())
		}
		return true
	}
	time.Sleep(tick(r, []time.Duration{lease / 2, 6 * lease}[r.IntN(2)])) // some join late, as the shutdown comes
	name := []string{"a", "b"}[r.IntN(2)]
	hc.lock = name
	ok := true
	switch r.IntN(20) {
	case 4:
		time.Sleep(3 * lease) // past the io-timeout: the server closes first
		ok = false
	case 0:
		ok = write([]byte{TypeHeartbeat}, 0)
	case 1:
		ok = write([]byte{TypeAcquire, 1, 0, 0, 0, 0, 0, 1, 'a'}, 0) // lease 0
	case 2:
		ok = write([]byte{TypeAcquire, 9}, 0) // version
	case 3:
		write([]byte{TypeAcquire, 1, 0, 0}, 0) // half a frame, then silence
		return
	default:
		b, _ := acquire(name, lease).AppendBinary(nil)
		ok = write(b, len(b))
		joined = ok
	}
	for step := 0; ok && step < steps; step++ {
		switch k := r.IntN(20); {
		case k == 0:
			hc.selfEnd = true
			return
		case k == 1:
			ok = write([]byte{0x7f}, 0)
		case k == 2:
			b, _ := acquire(name, lease).AppendBinary(nil)
			ok = write(b, 0) // duplicate
		case k == 3:
			time.Sleep(lease + lease/2) // silent past the lease
		case k == 4:
			write([]byte{TypeAcquire}, 0) // half a frame (a duplicate ACQUIRE's type byte), then silence
			time.Sleep(lease)
			return
		case k == 5:
			time.Sleep(tick(r, lease/2))
			ok = write([]byte{TypeHeartbeat, 0x7f}, 1) // read at once: answered, then the end
		default:
			time.Sleep(tick(r, lease/2))
			ok = write([]byte{TypeHeartbeat}, 1)
		}
	}
	if ok {
		hc.selfEnd = r.IntN(2) == 0
		if !hc.selfEnd {
			time.Sleep(3 * lease) // until the server drops it
		}
	}
}

// frames shows what the client received, as far as it parses.
func (hc *huntClient) frames() string {
	var fs []Frame
	for r := bytes.NewReader(hc.received); r.Len() > 0; {
		f, err := ReadFrame(r)
		if err != nil {
			break
		}
		fs = append(fs, f)
	}
	return showFrames(fs)
}

func (hc *huntClient) readAll(conn net.Conn) {
	buf := make([]byte, 64)
	for {
		n, err := conn.Read(buf)
		hc.received = append(hc.received, buf[:n]...)
		if err != nil {
			conn.Close()
			return
		}
	}
}

// check holds a connection's byte stream to the grammar: one answer per
// valid request the server read (an ERROR may answer the last one), at most one pushed ACQUIRED and only to a
// waiter, never WAITING after ACQUIRED, one token, and at most one ERROR,
// last.
func (hc *huntClient) check() error {
	var answers, waitings int
	var token uint64
	acquired, failed := false, false
	for r := bytes.NewReader(hc.received); r.Len() > 0; {
		f, err := ReadFrame(r)
		if err != nil {
			return fmt.Errorf("not a frame: %v", err)
		}
		switch f.Type {
		case TypeWaiting:
			if acquired {
				return fmt.Errorf("WAITING after ACQUIRED")
			}
			answers++
			waitings++
		case TypeAcquired:
			if acquired && f.Token != token {
				return fmt.Errorf("token %d after %d", f.Token, token)
			}
			acquired, token = true, f.Token
			answers++
		case TypeError:
			failed = true
			if r.Len() > 0 {
				return fmt.Errorf("%d bytes after ERROR 0x%02x", r.Len(), uint8(f.Code))
			}
		default:
			return fmt.Errorf("frame type 0x%02x from the server", f.Type)
		}
	}
	pushes := answers - hc.valid
	if failed && pushes == -1 {
		pushes = 0 // the ERROR answered the last request
	}
	switch {
	case pushes < 0 && !hc.selfEnd:
		return fmt.Errorf("%d answers to %d requests", answers, hc.valid)
	case pushes > 1:
		return fmt.Errorf("%d answers to %d requests: more than one push", answers, hc.valid)
	case pushes == 1 && waitings == 0:
		return fmt.Errorf("a push to a session that never waited")
	}
	return nil
}

// checkEvents holds the events to the table's rules: for each lock, grants
// and releases alternate with the same token; tokens strictly increase;
// nobody is granted after an administrator ended it; a forced holder's
// release says force.
func checkEvents(events []Event, forced []huntForce) error {
	holder := map[string]Event{} // by lock: the open grant
	ended := map[string]bool{}   // remotes an administrator ended
	var last uint64
	for i, ev := range events {
		switch ev.Type {
		case EventGranted:
			if h, ok := holder[ev.Lock]; ok {
				return fmt.Errorf("event %d: %s granted %q while %s holds it", i, ev.RemoteAddr, ev.Lock, h.RemoteAddr)
			}
			if ev.Token <= last {
				return fmt.Errorf("event %d: token %d after %d", i, ev.Token, last)
			}
			if ended[ev.RemoteAddr] {
				return fmt.Errorf("event %d: %s granted %q after an administrator ended it", i, ev.RemoteAddr, ev.Lock)
			}
			last = ev.Token
			holder[ev.Lock] = ev
		case EventReleased:
			h, ok := holder[ev.Lock]
			if !ok || h.Token != ev.Token || h.RemoteAddr != ev.RemoteAddr {
				return fmt.Errorf("event %d: %s released %q (token %d) that it does not hold", i, ev.RemoteAddr, ev.Lock, ev.Token)
			}
			delete(holder, ev.Lock)
			if slices.Contains(forced, huntForce{ev.RemoteAddr, ev.Token}) != (ev.Reason == ReasonForce) {
				return fmt.Errorf("event %d: release of token %d by %s has reason %s; force-released: %v", i, ev.Token, ev.RemoteAddr, ev.Reason, forced)
			}
		case EventForceRelease, EventKickWaiter:
			ended[ev.RemoteAddr] = true
		}
	}
	return nil
}

// pipeListener is a net.Listener of in-memory connections, which block
// durably inside a synctest bubble.
type pipeListener struct {
	conns chan net.Conn
	done  chan struct{}
	once  sync.Once
}

func newPipeListener() *pipeListener {
	return &pipeListener{conns: make(chan net.Conn), done: make(chan struct{})}
}

// dial returns the client's end; the server sees remote as its address.
func (l *pipeListener) dial(remote string) net.Conn {
	client, server := net.Pipe()
	go func() {
		select {
		case l.conns <- namedConn{server, pipeAddr(remote)}:
		case <-l.done:
			server.Close()
		}
	}()
	return client
}

func (l *pipeListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *pipeListener) Close() error   { l.once.Do(func() { close(l.done) }); return nil }
func (l *pipeListener) Addr() net.Addr { return pipeAddr("listener") }

type pipeAddr string

func (a pipeAddr) Network() string { return "pipe" }
func (a pipeAddr) String() string  { return string(a) }

type namedConn struct {
	net.Conn
	remote pipeAddr
}

func (c namedConn) RemoteAddr() net.Addr { return c.remote }
