package monolock

import (
	"bytes"
	"cmp"
	"context"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"hash"
	"io"
	"math"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
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
	huntSeed  = flag.Int("seed", -1, "the one seed TestRaceHunt plays, and TestRaceHuntOverTCP's and TestRaceHuntOverTLS's script, when not -1")
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

// TestRaceHuntOverTCP plays TestRaceHunt's clients (huntClient.play) and
// administrator (huntAdmin) against a Server over real TCP on loopback,
// in real time, and holds what they saw to the same checks: each byte
// stream to the grammar (huntClient.check), the events to the table's
// rules (checkEvents), and the server's writes to "nothing but the final
// ERROR after an administrator's call returned" (writesAfterStop). What it
// adds to the hunt over pipes, where every write waits for its read and
// each heartbeat is read alone: heartbeats in bursts of up to 400 that the
// kernel coalesces, so that the server reads many in one read, with an
// ACQUIRE, or with the bad byte after them (the server must answer every
// one before its ERROR); connections reset by a close with unread bytes; 60 sessions at once (the script is calmer than
// over pipes, calm 4, so that they live long enough to flood); a third of
// the clients that read nothing until late, with the least buffers the
// kernel allows (2 KiB asked for the clients' receive side, before the
// connect; the least send buffer on the server's side); and the
// scheduler's real interleavings at real instants.
//
// What it cannot check in real time, and so does not: the lease's exact
// boundaries (checkGrants: the server takes lastSeenAt after its read
// returns, on a noisy machine any time later, so nothing the test
// observes bounds a grant by it); the number of answers a session was
// owed when another party ended it (see check: over TCP any number may be
// dropped); the tail of a stream that a reset or a failed write cut.
// Nor does it reliably reach a server write blocked on a client that does
// not read: a session's answers come at most a thousand a second (the
// server's flood pause), so a holder that does not read fills even the
// least buffers (about 5 KiB) only after some 0.6s of flooding, longer
// than the administrator, every 0 to 60ms, mostly lets it hold; the run
// logs how many writes timed out or returned part-way. The checks hold
// for any timing, so the verdict does not depend on it. A run is one
// script (its seed is logged; -seed replays the script, not the timing).
func TestRaceHuntOverTCP(t *testing.T) {
	huntOverNet(t, huntNet{salt: 0x746370})
}

// huntNet is how a real-time hunt (huntOverNet) connects its clients: over
// plain TCP (the zero value) or over TLS on it.
type huntNet struct {
	salt uint64      // of the run's generator, so that a seed plays another script on each
	tls  *tls.Config // the server's, or nil for plain TCP
	// client makes hc's end from its TCP connection raw, with what r draws
	// (the script of play is not drawn from r); background, if not nil,
	// runs beside play until over is closed. nil: raw itself.
	client func(hc *huntClient, raw net.Conn, r *rand.Rand, lease time.Duration, over <-chan struct{}) (conn net.Conn, background func(), err error)
	// plain returns the server's log as the checks read it: reads and
	// writes in the clients' plaintext, entry for entry (the
	// administrator's marks keep their places), and what it adds to the
	// run's line. nil: the log itself.
	plain func(log *probeLog, hunters []*huntClient) (*probeLog, string, error)
}

// huntOverNet is TestRaceHuntOverTCP's hunt over connections that hn makes.
func huntOverNet(t *testing.T, hn huntNet) {
	const (
		clients = 60
		steps   = 40
		lease   = 200 * time.Millisecond
	)
	seed := uint64(time.Now().UnixNano())
	if *huntSeed >= 0 {
		seed = uint64(*huntSeed)
	}
	rng := rand.New(rand.NewPCG(seed, hn.salt))
	var evMu sync.Mutex
	var events []Event
	srv := &Server{IOTimeout: 2 * lease, OnEvent: func(ev Event) {
		evMu.Lock()
		events = append(events, ev)
		evMu.Unlock()
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := &probeListener{Listener: ln, tls: hn.tls}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	watch := watchInvariants(srv, time.Millisecond, false)
	t.Cleanup(func() { srv.Close() }) // after a Fatal

	// The clients' receive buffers are set before the connect: set after
	// it (SetReadBuffer), one leaves the window the handshake advertised,
	// 64 KiB, which the kernel never retracts.
	dialer := net.Dialer{Timeout: wait, Control: func(_, _ string, rc syscall.RawConn) error {
		if setReceiveBuffer == nil {
			return nil
		}
		var err error
		rc.Control(func(fd uintptr) { err = setReceiveBuffer(fd, 2048) })
		return err
	}}
	over := make(chan struct{}) // the server has shut down
	hunters := make([]*huntClient, clients)
	var wg sync.WaitGroup
	lateReaders := 0
	for i := range hunters {
		c, err := dialer.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		hc := &huntClient{name: c.LocalAddr().String(), overTCP: true, burst: 400, calm: 4, over: over}
		c.SetWriteDeadline(time.Now().Add(wait))
		conn, background := c, (func())(nil)
		if hn.client != nil {
			conn, background, err = hn.client(hc, c, rand.New(rand.NewPCG(rng.Uint64(), uint64(i))), lease, over)
			if errors.Is(err, errHuntSuite) {
				t.Skip(err)
			} else if err != nil {
				t.Fatalf("seed %d: client %s: %v", seed, hc.name, err)
			}
		}
		hunters[i] = hc
		script := rand.New(rand.NewPCG(rng.Uint64(), uint64(i)))
		var readFrom time.Duration
		if rng.IntN(3) == 0 || hc.readsLate {
			readFrom = tick(rng, 6*lease)
			lateReaders++
		}
		wg.Add(2)
		go func() {
			defer wg.Done()
			select {
			case <-time.After(readFrom):
			case <-over:
			}
			conn.SetReadDeadline(time.Now().Add(wait))
			hc.readAll(conn)
		}()
		go func() { defer wg.Done(); hc.play(conn, script, steps, lease) }()
		if background != nil {
			wg.Go(background)
		}
	}

	admin := &huntAdmin{srv: srv, log: &l.log, r: rand.New(rand.NewPCG(rng.Uint64(), 99))}
	pause := func() time.Duration { return time.Duration(admin.r.IntN(60)) * time.Millisecond }
	if err := admin.run(math.MaxInt, pause, 6*lease, wait); err != nil {
		t.Fatalf("seed %d: %v", seed, err)
	}
	close(over)
	awaitFunc(t, "the clients' end after the shutdown", wg.Wait)
	if err := watch(); err != nil {
		t.Errorf("seed %d: the server's invariants: %v", seed, err)
	}
	select {
	case err := <-served:
		if err != ErrServerClosed {
			t.Fatalf("Serve returned %v", err)
		}
	case <-time.After(wait):
		t.Fatalf("Serve did not return within %v of Shutdown", wait)
	}

	log, more := &l.log, ""
	if hn.plain != nil {
		if log, more, err = hn.plain(log, hunters); err != nil {
			t.Fatalf("seed %d: %v", seed, err)
		}
	}
	// The requests each session read: the valid ones that end within the
	// bytes the server read from it.
	read := map[string]int{}
	wrote := map[string]int{}
	var writes, failed, partial, timeouts int
	log.mu.Lock()
	entries := log.entries
	log.mu.Unlock()
	for _, e := range entries {
		switch {
		case e.what == "read":
			read[e.conn] += len(e.b)
		case e.what == "write":
			writes++
			wrote[e.conn] += len(e.b)
		case strings.HasPrefix(e.what, "write failed"):
			if strings.Contains(e.what, "timeout") {
				timeouts++
			}
			failed++
			if e.sent > 0 { // else its "write" entry says "nothing sent"
				wrote[e.conn] -= len(e.b) - e.sent
			}
			if e.sent > 0 && e.sent < len(e.b) {
				partial++
			}
		}
	}
	var cut, lost, own int
	for _, hc := range hunters {
		if len(hc.received) < wrote[hc.name] && !hc.selfEnd {
			lost++
		}
		hc.valid = 0
		for _, end := range hc.ends {
			if end <= read[hc.name] {
				hc.valid++
			}
		}
		if isTimeoutErr(hc.readErr) {
			t.Errorf("seed %d: client %s: still connected %v after it began reading", seed, hc.name, wait)
		}
		for r := bytes.NewReader(hc.received); r.Len() > 0; {
			f, err := ReadFrame(r)
			if errors.Is(err, io.ErrUnexpectedEOF) {
				cut++
			} else if err == nil && f.Type == TypeError && !f.Code.Temporary() {
				own++
			}
			if err != nil {
				break
			}
		}
	}
	if err := checkClients(hunters, admin, log, hn.tls != nil); err != nil {
		t.Errorf("seed %d: %v", seed, err)
	}
	if hn.tls != nil {
		// Over TLS a cut breaks the connection for good: the server cuts
		// no write when an ERROR is to follow, as after an administrator's
		// call; nor can anything cut it later, once the session is ending.
		for _, st := range admin.stops {
			l.mu.Lock()
			c := l.conns[st.remote]
			l.mu.Unlock()
			if n := c.cuts.Load(); n > 0 {
				t.Errorf("seed %d: client %s: over TLS, %d writes cut on a session that %s ended (its ERROR 0x02 is lost); it received %s", seed, st.remote, n, st.call, byName(hunters, st.remote).frames())
			}
		}
	}
	evMu.Lock()
	defer evMu.Unlock()
	if err := checkEvents(events, admin.forced); err != nil {
		t.Errorf("seed %d: %v", seed, err)
	}
	t.Logf("seed %d: %d clients (%d read late%s); %d events, %d sessions ended by the administrator (%d force-releases); the server wrote %d times, %d blocked for 20ms or more, %d failed (%d timed out, %d part-way); %d streams lost bytes the server wrote (%d cut inside a frame); %d ended by the client's own ERROR",
		seed, clients, lateReaders, more, len(events), len(admin.stops), len(admin.forced), writes, l.blocked.Load(), failed, timeouts, partial, lost, cut, own)
}

// setReceiveBuffer sets a socket's SO_RCVBUF, where the platform has it
// (helpers_unix_test.go); nil elsewhere.
var setReceiveBuffer func(fd uintptr, n int) error

// probeListener hands the server probeConns over TCP, with the least send
// buffer the kernel allows; with tls set, each under a TLS server
// connection, so that the log sees the ciphertext, every other one
// through a recordConn as NewTLSListener's are (metered, and its writers
// waiting for its read's records to be handled).
type probeListener struct {
	net.Listener
	log      probeLog
	tls      *tls.Config
	blocked  atomic.Int64 // see timedConn
	mu       sync.Mutex
	conns    map[string]*timedConn // by name
	accepted int                   // every other TLS connection is metered
}

func (l *probeListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c.(*net.TCPConn).SetWriteBuffer(1)
	tc := &timedConn{Conn: c, blocked: &l.blocked}
	pc := &probeConn{Conn: tc, name: c.RemoteAddr().String(), log: &l.log}
	l.mu.Lock()
	if l.conns == nil {
		l.conns = map[string]*timedConn{}
	}
	l.conns[pc.name] = tc
	l.mu.Unlock()
	if l.tls != nil {
		var under net.Conn = pc
		if l.accepted++; l.accepted%2 == 0 {
			under = newRecordConn(pc) // as NewTLSListener's
		}
		return tls.Server(under, l.tls), nil
	}
	return pc, nil
}

// timedConn counts the writes that were blocked, on a client that does
// not read, for 20ms or more (in blocked, shared), and the cuts: write
// deadlines set long past (a deadline that has just passed is not one).
type timedConn struct {
	net.Conn
	blocked *atomic.Int64
	cuts    atomic.Int64
}

func (c *timedConn) beneath() net.Conn { return c.Conn } // for the server's linger

func (c *timedConn) SetWriteDeadline(t time.Time) error {
	if !t.IsZero() && t.Before(time.Now().Add(-time.Hour)) {
		c.cuts.Add(1)
	}
	return c.Conn.SetWriteDeadline(t)
}

func (c *timedConn) Write(b []byte) (int, error) {
	start := time.Now()
	defer func() {
		if time.Since(start) >= 20*time.Millisecond {
			c.blocked.Add(1)
		}
	}()
	return c.Conn.Write(b)
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
	readErr  error // what ended readAll

	seen []time.Time // when the server read each valid request: a write to a pipe returns at the (fake) instant of its read

	// Over TCP a write returns before the server reads it: the client
	// keeps where each valid request ends in its stream (ends, among the
	// sent bytes), and the test counts valid from the server's reads.
	overTCP bool
	burst   int             // over TCP: heartbeats a write sends, 1 to burst
	calm    int             // over TCP: the odds of a step other than heartbeats are divided by calm
	over    <-chan struct{} // over TCP: closed when sleeping is pointless (the server has shut down)
	broke   bool            // it sent a byte that ends the session: no later request counts
	sent    int
	ends    []int

	// Over TLS, records arrive whole or not at all, and the server writes
	// whole frames in a record: the stream cannot end inside a frame.
	tls       *huntTLSConn
	readsLate bool // made a late reader by huntNet.client (a flooder over TLS)
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
	watch := watchInvariants(srv, 10*time.Millisecond, true)
	start := time.Now()

	clients := make([]*huntClient, c.clients)
	var wg sync.WaitGroup
	for i := range clients {
		hc := &huntClient{name: fmt.Sprintf("c%d", i)}
		clients[i] = hc
		script := rand.New(rand.NewPCG(rng.Uint64(), uint64(i)))
		conn, pc := l.pair(hc.name)
		l.accept(pc)
		wg.Add(2)
		go func() { defer wg.Done(); hc.readAll(conn) }()
		go func() { defer wg.Done(); hc.play(conn, script, c.steps, lease) }()
	}

	chaos := rand.New(rand.NewPCG(rng.Uint64(), 99))
	admin := &huntAdmin{srv: srv, log: &l.log, r: chaos}
	shutdownAt := tick(chaos, 6*lease)
	var shutdown error
	wg.Add(1)
	go func() {
		defer wg.Done()
		shutdown = admin.run(c.chaos, func() time.Duration { return tick(chaos, lease) }, shutdownAt, time.Minute) // a fake minute: it hangs
	}()
	wg.Wait()
	if err := cmp.Or(watch(), shutdown); err != nil {
		return err
	}
	if err := <-served; err != ErrServerClosed {
		return fmt.Errorf("Serve returned %v", err)
	}
	if err := checkClients(clients, admin, &l.log, false); err != nil {
		return err
	}
	evMu.Lock()
	defer evMu.Unlock()
	if err := checkGrants(events, clients, lease, start); err != nil {
		return err
	}
	return checkEvents(events, admin.forced)
}

// checkClients holds each client's stream to the grammar (check), the
// server's writes to one writer at a time, and the server's writes to each
// session an administrator ended to "nothing but the final ERROR after the
// call returned" (overTLS: and one write of answers taken before it, see
// tlsWritesAfterStop).
func checkClients(clients []*huntClient, admin *huntAdmin, log *probeLog, overTLS bool) error {
	log.mu.Lock()
	for _, e := range log.entries {
		if e.what == overlappingWrite {
			log.mu.Unlock()
			return fmt.Errorf("client %s: two writes at once: %s", e.conn, e)
		}
	}
	log.mu.Unlock()
	for _, hc := range clients {
		if err := hc.check(); err != nil {
			return fmt.Errorf("client %s: %w (received % x)", hc.name, err, hc.received)
		}
	}
	for _, st := range admin.stops {
		// Its final ERROR is 0x02, or the code of the end it was already on.
		late := writesAfterStop(log, st.mark, st.remote, 0)
		if overTLS {
			late = tlsWritesAfterStop(log, st.mark, st.remote)
		}
		if len(late) > 0 {
			return fmt.Errorf("client %s: written to after %s returned: %v; it received %s", st.remote, st.call, late, byName(clients, st.remote).frames())
		}
	}
	return nil
}

// huntAdmin is a hunt's administrator.
type huntAdmin struct {
	srv    *Server
	log    *probeLog // of the server's connections, where it marks its calls' returns
	r      *rand.Rand
	forced []huntForce // what its ForceReleases released
	stops  []huntStop  // the sessions its calls ended
}

// run makes up to rounds calls, each after a pause, until shutdownAt from
// now: it kicks a random waiter of a random lock, or force-releases its
// holder (by its token, or by 0 a time in three). Then it shuts the server
// down, for no longer than bound.
func (a *huntAdmin) run(rounds int, pause func() time.Duration, shutdownAt, bound time.Duration) error {
	srv, start := a.srv, time.Now()
	for range rounds {
		time.Sleep(pause())
		if time.Since(start) > shutdownAt {
			break
		}
		locks := srv.Locks()
		if len(locks) == 0 {
			continue
		}
		li := locks[a.r.IntN(len(locks))]
		switch {
		case a.r.IntN(2) == 0 && len(li.Waiters) > 0:
			if info, err := srv.KickWaiter(li.Name, li.Waiters[a.r.IntN(len(li.Waiters))].RemoteAddr); err == nil {
				a.stops = append(a.stops, huntStop{info.RemoteAddr, "KickWaiter", a.log.mark("KickWaiter returned")})
			}
		case li.Holder != nil:
			token := li.Holder.Token
			if a.r.IntN(3) == 0 {
				token = 0
			}
			if info, err := srv.ForceRelease(li.Name, token); err == nil {
				a.stops = append(a.stops, huntStop{info.RemoteAddr, "ForceRelease", a.log.mark("ForceRelease returned")})
				a.forced = append(a.forced, huntForce{info.RemoteAddr, info.Token})
			}
		}
	}
	time.Sleep(max(0, shutdownAt-time.Since(start)))
	ctx, cancel := context.WithTimeout(context.Background(), bound)
	defer cancel()
	if err := srv.Shutdown(ctx); err != nil {
		return fmt.Errorf("Shutdown: %v", err)
	}
	return nil
}

func byName(clients []*huntClient, name string) *huntClient {
	for _, hc := range clients {
		if hc.name == name {
			return hc
		}
	}
	return &huntClient{name: name}
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
// And the grants of each lock are in the order their sessions joined (its
// grant's time less its wait), as strict FIFO promises; in fake time,
// where no clock moves inside a critical section, exactly.
func checkGrants(events []Event, clients []*huntClient, lease time.Duration, start time.Time) error {
	queued := map[string]time.Time{} // by lock: when the last one granted joined
	for i, ev := range events {
		if ev.Type != EventGranted {
			continue
		}
		if joined := ev.Time.Add(-ev.Wait); joined.Before(queued[ev.Lock]) {
			return fmt.Errorf("event %d: %s granted %q, queued at %v, after one queued at %v", i, ev.RemoteAddr, ev.Lock, joined.Sub(start), queued[ev.Lock].Sub(start))
		} else {
			queued[ev.Lock] = joined
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
	// write sends b, whose first valid bytes are valid requests (one
	// ACQUIRE, or as many heartbeats), the rest bytes that end the session.
	write := func(b []byte, valid int) bool {
		if hc.broke {
			valid = 0
		}
		var ends []int // in b
		for e := 1; e <= valid; e++ {
			if b[0] != TypeAcquire || e == valid {
				ends = append(ends, e)
			}
		}
		hc.broke = valid < len(b)
		n, err := conn.Write(b)
		for _, e := range ends {
			if e <= n {
				hc.ends = append(hc.ends, hc.sent+e)
			}
		}
		hc.sent += n
		if err != nil {
			return false
		}
		for range ends {
			hc.valid++
			hc.seen = append(hc.seen, time.Now())
		}
		return true
	}
	sleep := time.Sleep
	if hc.over != nil {
		sleep = func(d time.Duration) {
			select {
			case <-time.After(d):
			case <-hc.over:
			}
		}
	}
	// beats is how many heartbeats the next write sends: 1 to burst, few
	// more often than many.
	beats := func() int {
		if hc.burst > 1 {
			return 1 + r.IntN(1+r.IntN(hc.burst))
		}
		return 1
	}
	sleep(tick(r, []time.Duration{lease / 2, 6 * lease}[r.IntN(2)])) // some join late, as the shutdown comes
	name := []string{"a", "b"}[r.IntN(2)]
	ok := true
	switch r.IntN(20) {
	case 4:
		sleep(3 * lease) // past the io-timeout: the server closes first
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
	}
	for step := 0; ok && step < steps; step++ {
		switch k := r.IntN(20 * max(1, hc.calm)); {
		case k == 0:
			hc.selfEnd = true
			return
		case k == 1:
			ok = write([]byte{0x7f}, 0)
		case k == 2:
			b, _ := acquire(name, lease).AppendBinary(nil)
			ok = write(b, 0) // duplicate
		case k == 3:
			sleep(lease + lease/2) // silent past the lease
		case k == 4:
			write([]byte{TypeAcquire}, 0) // half a frame (a duplicate ACQUIRE's type byte), then silence
			sleep(lease)
			return
		case k == 5:
			sleep(tick(r, lease/2))
			ok = write([]byte{TypeHeartbeat, 0x7f}, 1) // read at once: answered, then the end
		default:
			sleep(tick(r, lease/2))
			n := beats()
			ok = write(bytes.Repeat([]byte{TypeHeartbeat}, n), n)
		}
	}
	if ok {
		hc.selfEnd = r.IntN(2) == 0
		if !hc.selfEnd {
			sleep(3 * lease) // until the server drops it
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
			hc.readErr = err
			conn.Close()
			return
		}
	}
}

// check holds a connection's byte stream to the grammar: one answer per
// valid request the server read (an ERROR may answer the last one), at most one pushed ACQUIRED and only to a
// waiter, never WAITING after ACQUIRED, one token, and at most one ERROR,
// last.
//
// Over TCP two of these cannot be held, and check says which (overTCP):
// the stream may end inside a frame (a write that failed part-way, or the
// close's reset discarding what the kernel had not delivered to a client
// that did not read; not over TLS, whose records hold whole frames and
// reach the client whole or not at all), and answers owed when another party ended the
// session (an administrator, the shutdown, a failed write) or it expired
// are dropped, any number of them, not just the one a script over a pipe
// can have in flight. Only an ERROR for the client's own mistake (a code
// of 0x10 or above: the session ended on its own, nothing was dropped)
// still says that every request read was answered.
func (hc *huntClient) check() error {
	var answers, waitings int
	var token uint64
	var code Code
	acquired, failed := false, false
	for r := bytes.NewReader(hc.received); r.Len() > 0; {
		f, err := ReadFrame(r)
		if hc.overTCP && hc.tls == nil && errors.Is(err, io.ErrUnexpectedEOF) {
			break // a tail the close lost; nothing can follow it
		}
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
			failed, code = true, f.Code
			if r.Len() > 0 {
				return fmt.Errorf("%d bytes after ERROR 0x%02x", r.Len(), uint8(f.Code))
			}
		default:
			return fmt.Errorf("frame type 0x%02x from the server", f.Type)
		}
	}
	pushes := answers - hc.valid
	if failed && pushes == -1 && !hc.overTCP {
		pushes = 0 // the ERROR answered the last request
	}
	if hc.overTCP && pushes < 0 && !(failed && !code.Temporary()) {
		pushes = 0 // dropped by another party's end, or the lease's
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

// TestClientRaceHunt drives Do clients against a real Server, in fake
// time, through in-memory connections that suffer faults (delays, lost
// server frames, lost client frames, both, cuts, a reply held until the
// claim's deadline) and a shutdown at a random moment, and checks the
// client's promises: fn never runs after the moment the server grants the
// lock to the next holder (fn's stop time against the next grant's, both
// in fake time), and fn is told of the loss by the claim's deadline, which
// the hunt computes by the specification's rule from what the connection
// carried (see deadlineConn). A run is a seed; the plan of faults and
// timings follows from it (the interleaving of goroutines at one instant
// is the runtime's). MONOLOCK_HUNT_SEEDS=N runs seeds 0 to N-1,
// MONOLOCK_HUNT_SEED=S only S.
func TestClientRaceHunt(t *testing.T) {
	t.Parallel() // fake time only: its CPU, not the clock, is shared
	first, n := doHuntSeeds(40)
	var total huntStats
	for seed := first; seed < first+n; seed++ {
		synctest.Test(t, func(t *testing.T) {
			st, bad := huntDoClients(seed, false)
			if bad != "" {
				t.Errorf("seed %d (rerun: MONOLOCK_HUNT_SEED=%d go test -run ClientRaceHunt): %s", seed, seed, bad)
			}
			total.add(st)
		})
	}
	t.Logf("%d seeds: %d grants, fn ran %d times, %d of them told of a loss; %d replies held until the deadline", n, total.grants, total.runs, total.losses, total.held)
	// A hunt that never loses a lock checks nothing.
	if n >= 10 && (total.runs < 10*int(n) || total.losses < int(n) || total.held < int(n)) {
		t.Fatalf("too little happened: %+v", total)
	}
}

// TestClientRaceHuntRealTime is the hunt in real time, on one processor,
// where a reply that the client reads just before the claim's deadline can
// reach the claim just after it: the held reply is read a moment before
// the deadline and then kept, busy on the only processor (too briefly for
// the runtime to preempt it), until a moment after. In fake time nothing
// runs late, so only this stage sees a client that lets such a reply
// confirm its claim. Its leases are long enough for a heartbeat interval
// (100ms at least) to exceed the slack given to a noisy machine.
func TestClientRaceHuntRealTime(t *testing.T) {
	if raceEnabled {
		t.Skip("its margins are for real time without the race detector")
	}
	defer runtime.GOMAXPROCS(runtime.GOMAXPROCS(1))
	first, n := doHuntSeeds(3)
	var total huntStats
	for seed := first; seed < first+n; seed++ {
		st, bad := huntDoClients(seed, true)
		if bad != "" {
			t.Errorf("seed %d (rerun: MONOLOCK_HUNT_SEED=%d go test -run ClientRaceHuntRealTime): %s", seed, seed, bad)
		}
		total.add(st)
	}
	t.Logf("%d seeds: %d grants, fn ran %d times, %d of them told of a loss; %d replies held across the deadline", n, total.grants, total.runs, total.losses, total.held)
	if total.held == 0 {
		t.Fatalf("no reply was held across a deadline: %+v", total)
	}
}

// doHuntSeeds reads the seeds to run from the environment, or runs 0 to n-1.
func doHuntSeeds(n uint64) (first, count uint64) {
	if s, err := strconv.ParseUint(os.Getenv("MONOLOCK_HUNT_SEEDS"), 10, 64); err == nil {
		n = s
	}
	if s, err := strconv.ParseUint(os.Getenv("MONOLOCK_HUNT_SEED"), 10, 64); err == nil {
		return s, 1
	}
	return 0, n
}

type huntStats struct{ runs, losses, grants, held int }

func (t *huntStats) add(s huntStats) {
	t.runs, t.losses, t.grants, t.held = t.runs+s.runs, t.losses+s.losses, t.grants+s.grants, t.held+s.held
}

// run is one execution of fn.
type run struct {
	client      int
	lock        string
	token       uint64
	start, stop time.Time
	told        time.Time // of the loss, or zero
	cutAt       time.Time // when the plan cuts the connection, or zero
	conn        *deadlineConn
	cause       error
}

// huntDoClients runs one seed, in fake time or real time, and returns
// what went wrong, or "".
func huntDoClients(seed uint64, realTime bool) (st huntStats, bad string) {
	rng := rand.New(rand.NewPCG(seed, 0x6d6f6e6f6c6f636b))
	length, leaseMin, leaseSpan := time.Duration(20+rng.IntN(40))*time.Second, 200, 2800
	slack := time.Duration(0) // in fake time, the claim ends at its deadline's instant
	locks, holdOneIn := []string{"a", "b"}[:1+rng.IntN(2)], 3
	if realTime { // seconds are real: more locks and more holds in fewer of them
		length, leaseMin, leaseSpan = time.Duration(2000+rng.IntN(2000))*time.Millisecond, 400, 800
		slack = 60 * time.Millisecond
		locks, holdOneIn = []string{"a", "b", "c", "d"}, 2
	}
	var mu sync.Mutex // guards grants, runs, plans
	var grants []Event
	var runs []run
	var plans []string
	srv := &Server{IOTimeout: time.Second, OnEvent: func(ev Event) {
		if ev.Type == EventGranted {
			mu.Lock()
			grants = append(grants, ev)
			mu.Unlock()
		}
	}}
	l := newFaultyListener()
	defer func() { // frees the relays that play a partition or a delay
		close(l.quit)
		l.relays.Wait()
	}()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	watch := watchInvariants(srv, 10*time.Millisecond, !realTime)

	start := time.Now()
	end := start.Add(length)
	var wg sync.WaitGroup
	for id := range 3 + rng.IntN(6) {
		crng := rand.New(rand.NewPCG(seed, uint64(id)))
		var conns int
		var cutAt time.Time  // of the last connection
		var dc *deadlineConn // likewise
		c := New(Config{Address: "pipe", Dialer: dialerFunc(func(ctx context.Context, _, _ string) (net.Conn, error) {
			conns++
			prng := rand.New(rand.NewPCG(seed, uint64(id)<<32|uint64(conns)))
			var client net.Conn
			var plan string
			client, plan, cutAt = faultyPipe(l, prng, start)
			dc = &deadlineConn{Conn: client, spin: realTime, closed: make(chan struct{})}
			if prng.IntN(holdOneIn) == 0 {
				dc.holdReply = 1 + prng.IntN(8)
				plan += fmt.Sprintf("; hold reply %d until the deadline", dc.holdReply)
			}
			mu.Lock()
			plans = append(plans, fmt.Sprintf("  client %d, connection %d: %s\n", id, conns, plan))
			mu.Unlock()
			return dc, nil
		})})
		wg.Go(func() {
			for time.Now().Before(end) {
				lease := time.Duration(leaseMin+crng.IntN(leaseSpan)) * time.Millisecond
				work := time.Duration(crng.Int64N(int64(3 * lease)))
				stopping := time.Duration(crng.Int64N(int64(lease / 10)))
				name := locks[crng.IntN(len(locks))]
				ctx, cancel := context.WithTimeout(context.Background(), time.Duration(1+crng.IntN(10))*time.Second)
				c.Do(ctx, name, lease, func(ctx context.Context, token uint64) error {
					r := run{client: id, lock: name, token: token, start: time.Now(), cutAt: cutAt, conn: dc}
					// A context, not time.After: channel timers in a bubble once
					// crashed the runtime here (go1.26.8, -race, SIGSEGV in
					// timer.maybeRunChan); timers that call a function did not.
					done, stop := context.WithTimeout(context.Background(), work)
					defer stop()
					select {
					case <-done.Done():
					case <-ctx.Done():
						r.cause, r.told = context.Cause(ctx), time.Now()
						// After a loss, work that takes a moment to stop; but not
						// after a cut, which the server hears at the same
						// instant, nor after Do's own ctx ended (a graceful
						// stop, after which a cut would not be told).
						if errors.Is(r.cause, ErrLockLost) && !errors.Is(r.cause, ErrConnectionClosed) {
							time.Sleep(stopping)
						}
					}
					r.stop = time.Now()
					mu.Lock()
					runs = append(runs, r)
					mu.Unlock()
					return nil
				})
				cancel()
				time.Sleep(time.Duration(crng.IntN(300)) * time.Millisecond)
			}
		})
	}
	if rng.IntN(3) == 0 { // a shutdown at a random moment
		time.Sleep(time.Duration(rng.Int64N(int64(end.Sub(start)))))
	} else {
		time.Sleep(end.Sub(start))
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	switch shutdown, invariants := srv.Shutdown(ctx), watch(); {
	case shutdown != nil:
		return st, fmt.Sprintf("Shutdown: %v", shutdown)
	case invariants != nil:
		return st, fmt.Sprintf("the server's invariants: %v", invariants)
	}
	wg.Wait()
	if err := <-served; !errors.Is(err, ErrServerClosed) {
		return st, fmt.Sprintf("Serve returned %v", err)
	}

	mu.Lock()
	defer mu.Unlock()
	at := func(tm time.Time) time.Duration { return tm.Sub(start) }
	st.runs, st.grants = len(runs), len(grants)
	for _, r := range runs {
		if r.cause != nil && errors.Is(r.cause, ErrLockLost) {
			st.losses++
		}
		if r.conn.held() {
			st.held++
		}
		ended := r.stop // when fn was told its claim ended, or returned untold
		if !r.told.IsZero() {
			ended = r.told
		}
		if deadline := r.conn.deadline(); ended.After(deadline.Add(slack)) {
			return st, fmt.Sprintf("client %d's fn (token %d of %q, from %v) ran on until %v (told: cause %v), but nothing confirmed its claim in time after its deadline at %v; the plans:\n%s",
				r.client, r.token, r.lock, at(r.start), at(ended), r.cause, at(deadline), strings.Join(plans, ""))
		}
		i := slices.IndexFunc(grants, func(g Event) bool { return g.Lock == r.lock && g.Token == r.token })
		if i < 0 {
			return st, fmt.Sprintf("client %d ran fn with token %d of %q, which the server never granted", r.client, r.token, r.lock)
		}
		for _, g := range grants[i+1:] {
			// A cut reaches both ends at once: work told of a loss by the
			// time the client could hear the cut may still be stopping when
			// the server, hearing the cut, has freed the lock. No client can
			// prevent that; the README states the limit.
			stopping := !r.cutAt.IsZero() && !ended.After(r.conn.heard(r.cutAt).Add(slack)) && !g.Time.Before(r.cutAt)
			if g.Lock == r.lock && g.Time.Before(r.stop) && !stopping {
				return st, fmt.Sprintf("client %d's fn (token %d of %q, from %v) stopped at %v (told at %v, cause %v, cut at %v), but the server granted token %d at %v; the plans:\n%s",
					r.client, r.token, r.lock, at(r.start), at(r.stop), at(r.told), r.cause, at(r.cutAt), g.Token, at(g.Time), strings.Join(plans, ""))
			}
		}
	}
	return st, ""
}

// faultyListener is a net.Listener of in-memory connections, each through
// a relay that injects faults (see faultyPipe).
type faultyListener struct {
	conns  chan net.Conn
	closed chan struct{}
	once   sync.Once
	quit   chan struct{} // closed at the end of the run
	relays sync.WaitGroup
}

func newFaultyListener() *faultyListener {
	return &faultyListener{conns: make(chan net.Conn), closed: make(chan struct{}), quit: make(chan struct{})}
}

func (l *faultyListener) Accept() (net.Conn, error) {
	select {
	case c := <-l.conns:
		return c, nil
	case <-l.closed:
		return nil, net.ErrClosed
	}
}

func (l *faultyListener) Close() error {
	l.once.Do(func() { close(l.closed) })
	return nil
}

func (l *faultyListener) Addr() net.Addr { return pipeAddr("pipe") }

// faultyPipe connects a client to l through a relay that follows a plan
// drawn from rng, and returns the client's end and the plan's wording. A
// plan is perhaps a split of every server frame after its first byte, the
// rest a while later; up to two changes of the delays in each direction;
// then perhaps one end: the loss of all bytes one way or both (for good,
// as in a partition: a stream that lost bytes cannot resume), or a cut.
func faultyPipe(l *faultyListener, rng *rand.Rand, start time.Time) (_ net.Conn, plan string, cutAt time.Time) {
	client, relayC := net.Pipe()
	relayS, server := net.Pipe()
	type phase struct {
		at    time.Time
		delay [2]time.Duration // by direction: up, down
	}
	var phases []phase
	var steps []string
	var split time.Duration
	if rng.IntN(4) == 0 {
		split = time.Duration(rng.Int64N(int64(500 * time.Millisecond)))
		steps = append(steps, fmt.Sprintf("each server frame's first byte %v before the rest", split))
	}
	at := time.Now()
	for range rng.IntN(3) {
		at = at.Add(time.Duration(rng.Int64N(int64(1500 * time.Millisecond))))
		var p phase
		p.at = at
		for dir := range 2 {
			if rng.IntN(2) == 0 {
				p.delay[dir] = time.Duration(rng.Int64N(int64(time.Second)))
			}
		}
		phases = append(phases, p)
		steps = append(steps, fmt.Sprintf("from %v delay up %v, down %v", at.Sub(start), p.delay[up], p.delay[down]))
	}
	at = at.Add(time.Duration(rng.Int64N(int64(1500 * time.Millisecond))))
	var mute [2]bool
	var cut bool
	switch rng.IntN(6) {
	case 1:
		mute[up] = true
		steps = append(steps, fmt.Sprintf("from %v drop client bytes", at.Sub(start)))
	case 2:
		mute[down] = true
		steps = append(steps, fmt.Sprintf("from %v drop server bytes", at.Sub(start)))
	case 3:
		mute = [2]bool{true, true}
		steps = append(steps, fmt.Sprintf("from %v drop all bytes", at.Sub(start)))
	case 4:
		cut = true
		steps = append(steps, fmt.Sprintf("cut at %v", at.Sub(start)))
	}
	delay := func(dir int, now time.Time) (d time.Duration) {
		for _, p := range phases {
			if !now.Before(p.at) {
				d = p.delay[dir]
			}
		}
		return d
	}
	var once sync.Once
	closeAll := func() {
		once.Do(func() {
			relayC.Close()
			relayS.Close()
		})
	}
	if cut {
		cutAt = at
		time.AfterFunc(time.Until(at), closeAll) // both ends hear it at the same instant
	}
	pump := func(src, dst net.Conn, dir int) {
		type chunk struct {
			b   []byte
			due time.Time
		}
		chunks := make(chan chunk, 1024)
		l.relays.Go(func() {
			for c := range chunks {
				select {
				case <-l.quit:
				default:
					time.Sleep(time.Until(c.due)) // see the note on channel timers above
				}
				if _, err := dst.Write(c.b); err != nil {
					break
				}
			}
			closeAll()
			for range chunks {
			}
		})
		buf := make([]byte, 512)
		for {
			n, err := src.Read(buf)
			now := time.Now()
			if mute[dir] && !now.Before(at) {
				if err != nil {
					// A partition loses the end of the stream too: the other
					// side hears nothing until its own timeouts.
					<-l.quit
					close(chunks)
					return
				}
				continue
			}
			if due := now.Add(delay(dir, now)); n > 1 && dir == down && split > 0 {
				chunks <- chunk{[]byte{buf[0]}, due}
				chunks <- chunk{append([]byte(nil), buf[1:n]...), due.Add(split)}
			} else if n > 0 {
				chunks <- chunk{append([]byte(nil), buf[:n]...), due}
			}
			if err != nil {
				close(chunks)
				return
			}
		}
	}
	l.relays.Go(func() { pump(relayC, relayS, up) })
	l.relays.Go(func() { pump(relayS, relayC, down) })
	select {
	case l.conns <- server:
	case <-l.closed:
		server.Close()
	}
	return client, strings.Join(steps, ", then "), cutAt
}

// deadlineConn is a client's end of a connection that keeps its own model
// of the claim's deadline, by the specification's rule: 0.8 of the lease
// from the send of the last confirmed request, where a reply read at or
// after the deadline confirms nothing (nor does anything after it), and a
// promotion push confirms nothing. It can hold one reply until about that
// deadline, as a network or a busy client can (see hold).
type deadlineConn struct {
	net.Conn
	holdReply int  // the reply to hold, counting from 1, or 0
	spin      bool // hold the reply across the deadline on the processor
	closed    chan struct{}
	closing   sync.Once
	mu        sync.Mutex    // guards what follows: Read and Write may overlap
	timeout   time.Duration // 0.8 lease, computed as the client does
	sends     []time.Time   // of the requests not yet answered
	confirmed time.Time     // the send of the last confirmed request
	queued    bool          // so the next ACQUIRED is the push
	replies   int           // read in time
	over      bool          // a late reply or an ERROR: nothing confirms the claim any more
	heldFrom  time.Time     // when the held reply was read, or zero
	heldUntil time.Time     // when it was delivered
	in        []byte        // the start of a server frame
	out       []byte        // the start of a client frame
}

// deadline is the claim's last deadline: after it, the claim is over.
func (c *deadlineConn) deadline() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.confirmed.Add(c.timeout)
}

func (c *deadlineConn) held() bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	return !c.heldFrom.IsZero()
}

// heard is when the client could hear a cut at cutAt: at once, unless it
// was then busy with a held reply.
func (c *deadlineConn) heard(cutAt time.Time) time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.heldFrom.IsZero() && !cutAt.Before(c.heldFrom) && cutAt.Before(c.heldUntil) {
		return c.heldUntil
	}
	return cutAt
}

// hold keeps a reply until its deadline, or until Close. In real time
// (spin) it wakes a moment before the deadline and keeps the processor,
// too briefly to be preempted, until a moment after: whatever the client
// has waiting for the deadline cannot run before the reply is delivered.
func (c *deadlineConn) hold(deadline time.Time) {
	wake := deadline
	if c.spin {
		wake = deadline.Add(-2 * time.Millisecond)
	}
	ctx, cancel := context.WithDeadline(context.Background(), wake) // not a channel timer: see huntDoClients
	defer cancel()
	select {
	case <-ctx.Done():
	case <-c.closed:
		return
	}
	for c.spin && time.Now().Before(deadline.Add(2*time.Millisecond)) {
	}
}

func (c *deadlineConn) Close() error {
	c.closing.Do(func() { close(c.closed) })
	return c.Conn.Close()
}

// Write counts a request as sent when its last byte is written: later
// than the client's count, so never a deadline earlier than the client's.
func (c *deadlineConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	for _, f := range completeFrames(&c.out, b) {
		if f.Type == TypeAcquire {
			c.timeout = time.Duration(f.LeaseMS) * time.Millisecond / 5 * 4
			c.confirmed = time.Now()
		}
		c.sends = append(c.sends, time.Now())
	}
	c.mu.Unlock()
	return c.Conn.Write(b)
}

// completeFrames appends b to a stream's incomplete frame, *part, and
// returns the frames that b completes.
func completeFrames(part *[]byte, b []byte) (fs []Frame) {
	*part = append(*part, b...)
	r, rest := bytes.NewReader(*part), len(*part)
	for f, err := ReadFrame(r); err == nil; f, err = ReadFrame(r) {
		fs, rest = append(fs, f), r.Len()
	}
	*part = (*part)[len(*part)-rest:]
	return fs
}

func (c *deadlineConn) Read(b []byte) (int, error) {
	n, err := c.Conn.Read(b)
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, f := range completeFrames(&c.in, b[:n]) {
		if c.over || f.Type == TypeError {
			c.over = true
			break
		}
		if f.Type == TypeAcquired && c.queued {
			c.queued = false // the push
			continue
		}
		if len(c.sends) == 0 {
			break // unsolicited: the client's own checks end the claim
		}
		deadline := c.confirmed.Add(c.timeout)
		if c.replies++; c.replies == c.holdReply && time.Now().Before(deadline) {
			c.heldFrom = time.Now()
			c.mu.Unlock()
			c.hold(deadline)
			c.mu.Lock()
			c.heldUntil = time.Now()
			select {
			case <-c.closed:
				return 0, net.ErrClosed
			default:
			}
		}
		if !time.Now().Before(deadline) {
			c.over = true
			break
		}
		c.confirmed, c.sends = c.sends[0], c.sends[1:]
		c.queued = f.Type == TypeWaiting
	}
	return n, err
}

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
	awaitFunc(t, "the delivery of the last events", srv.wg.Wait)
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

// TestRaceHuntOverTLS is TestRaceHuntOverTCP's hunt (huntOverNet) over
// TLS: the same scripts, administrator and checks, with a quarter of the
// clients on TLS 1.2 (AES-GCM) and the rest on TLS 1.3: plain; sending
// KeyUpdates of their own now and then; or flooding with them. Such a
// client seals its records itself (crypto/tls's client never sends a
// KeyUpdate) and sends its KeyUpdates, most asking for the server's,
// before its writes and, on a goroutine of their own, at random moments
// whatever the script is doing (silent, half-way through a frame, waiting
// for its drop). A third of the clients, and every flooder, read nothing
// until late, with 2 KiB receive buffers. Every other connection goes
// through a recordConn, as NewTLSListener's do: the flood rate charges its
// records, and another's writer waits for the records its read took in to
// be handled. On the rest the server answers a KeyUpdate from inside its
// read, with no flood pause, so that a flooder fills the buffers in a few
// hundred milliseconds where heartbeats, whose answers the server paces, do
// not within a run: its server's writes block, some until they time out
// (the run logs how many writes to the socket were blocked for 20ms or
// more, and how many timed out; over TCP none is blocked). Most are
// KeyUpdates' answers, with the server's read inside them, and the frames'
// writer waiting behind them on crypto/tls's lock (which the test cannot
// time); about one in ten is a write of frames blocked on the socket
// itself.
//
// The server's log (probeListener) sits under the TLS layer and sees
// ciphertext: the test decrypts it (tlsPlaintext) with the secrets of each
// client's key log, record by record, following the server's KeyUpdates,
// so that the checks read the plaintext of every server write at the place
// it began among the administrator's marks. What holds over TLS is checked
// as over TCP: each client's decrypted stream obeys the grammar
// (huntClient.check) and cannot end inside a frame (records arrive whole
// or not at all, and the server writes whole frames in one record, which
// is checked too, as is that each client decrypted a prefix of what the
// server's whole writes carried); the events obey the table's rules
// (checkEvents); the server's invariants hold (watchInvariants); the
// requests a session read are counted from the records the server read
// whole. And, over TLS only: a session an administrator ended never has a
// write cut (a cut breaks a TLS connection, and its ERROR 0x02 with it).
//
// What cannot be checked over TLS, and what is checked instead:
//   - "Nothing but the final ERROR begins after an administrator's call
//     returned" is not the server's promise over TLS (docs/protocol.md,
//     how a session ends: a TLS connection cannot be cut between two
//     frames without losing the ERROR too, so a write about to begin as
//     the end was decided may still begin). Checked: after the call
//     returned, at most one write of answers (WAITING and ACQUIRED only),
//     the first, and then the final ERROR begin (tlsWritesAfterStop). A
//     check on the client's side ("the client decrypts nothing but the
//     ERROR after the call returned") would be wrong: what the server
//     wrote before the call may wait in the kernel's buffers until a late
//     reader reads it.
//   - "One writer at a time" (rule 3): crypto/tls serializes the writes
//     it makes to the connection, so that two writers at once are
//     invisible under it; the grammar still catches frames written out of
//     order.
//   - A write cut part-way tears a record, which the client cannot
//     decrypt: the run counts such records (torn), as not delivered.
//
// And, as over TCP, not the lease's exact boundaries, nor the number of
// answers dropped when another party ended a session, nor (new over TLS)
// that a session whose server's read is stuck in a KeyUpdate's answer ends
// at its lease (TestTLSReadStuckBehindAPushEndsAtTheLease,
// TestKeyUpdateStuckInAReadEndsAtTheLease). It needs AES-GCM for TLS 1.3
// (the suite it decrypts and seals), else it skips. Its length is the
// administrator's, a shutdown at 1.2s, as over TCP: -short, which would
// only take clients away, changes nothing. A run is one script (its seed
// is logged; -seed replays the script, not the timing).
func TestRaceHuntOverTLS(t *testing.T) {
	huntOverNet(t, huntNet{
		salt:   0x746c73,
		tls:    &tls.Config{Certificates: []tls.Certificate{selfSigned(t)}},
		client: huntTLSClient,
		plain:  tlsPlaintext,
	})
}

// errHuntSuite is a TLS 1.3 suite the hunt cannot decrypt (the machine has
// no AES hardware, so crypto/tls prefers ChaCha20).
var errHuntSuite = errors.New("not an AES-GCM suite")

// huntTLSClient makes a hunt client's end over TLS on raw: TLS 1.2, TLS
// 1.3, TLS 1.3 with KeyUpdates now and then, or flooding with them, one
// in four each.
func huntTLSClient(hc *huntClient, raw net.Conn, r *rand.Rand, lease time.Duration, over <-chan struct{}) (net.Conn, func(), error) {
	cr := &countingConn{Conn: raw}
	keylog := &bytes.Buffer{}
	cfg := &tls.Config{InsecureSkipVerify: true, KeyLogWriter: keylog}
	kind := r.IntN(4) // TLS 1.2, TLS 1.3, and TLS 1.3 with KeyUpdates now and then, or flooding
	if kind == 0 {
		cfg.MaxVersion = tls.VersionTLS12
		cfg.CipherSuites = []uint16{[]uint16{tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256, tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384}[r.IntN(2)]}
	} else {
		cfg.MinVersion = tls.VersionTLS13
	}
	tc := tls.Client(cr, cfg)
	tc.SetReadDeadline(time.Now().Add(wait))
	if err := tc.Handshake(); err != nil {
		return nil, nil, err
	}
	tc.SetReadDeadline(time.Time{})
	c := &huntTLSConn{Conn: tc, raw: cr, keylog: keylog, state: tc.ConnectionState(), notify: r.IntN(2) == 0}
	hc.tls = c
	if c.state.Version == tls.VersionTLS12 {
		return c, nil, nil
	}
	s, err := newTLS13Sender(c.state.CipherSuite)
	if err != nil {
		return nil, nil, fmt.Errorf("%w: %v", errHuntSuite, err)
	}
	if kind == 1 {
		return c, nil, nil
	}
	secret, err := keyLogSecret(keylog.String(), "CLIENT_TRAFFIC_SECRET_0")
	if err != nil {
		return nil, nil, err
	}
	s.setSecret(secret) // nothing was sent with it yet: crypto/tls's client sends no record of its own after the handshake
	c.send, c.r = s, rand.New(rand.NewPCG(r.Uint64(), 1))
	c.odds, c.most, c.asks = 4, 3, -1
	if kind == 3 {
		// A flooder, whose server soon blocks if it reads late: the server
		// answers a KeyUpdate inside its read, without the flood's pause,
		// which a read of heartbeats gets (and a record of many heartbeats
		// holds up the KeyUpdates after it). Its answers fill 3 to 6 KiB,
		// about what the buffers hold, so that some block a read in a
		// KeyUpdate's answer, and some leave the buffers full for the
		// frames that follow.
		c.odds, c.most, c.asks = 1, maxUseless, (3<<10+r.IntN(3<<10))/27
		hc.burst, hc.readsLate = 32, true
	}
	return c, func() { c.chatter(r, lease, over) }, nil
}

// huntTLSConn is a hunt client's end over TLS. It reads through
// crypto/tls; it writes through it too, or, if send is set, seals its
// records itself, so that it can send KeyUpdates, which crypto/tls's
// client never does. It notes where the plaintext of each write ends in
// the bytes it sent (the server's log counts the latter).
type huntTLSConn struct {
	*tls.Conn
	raw    *countingConn
	keylog *bytes.Buffer
	state  tls.ConnectionState
	notify bool // Close sends a close_notify (only without send)

	mu                    sync.Mutex   // guards what follows: play and chatter write
	send                  *tls13Sender // nil: crypto/tls writes
	r                     *rand.Rand   // whether a write follows KeyUpdates, and how many
	odds, most            int          // a write follows 1 to most KeyUpdates, one in odds
	useless               int          // KeyUpdates sent since the last record of data
	asks                  int          // how many more may ask for the server's KeyUpdate; -1: any number
	broken                bool         // a record went out part-way: nothing can follow it
	plain                 int          // plaintext written
	ends                  [][2]int     // after each write: the bytes sent so far, and plain
	keyUpdates, requested int
}

func (c *huntTLSConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.send == nil {
		n, err := c.Conn.Write(b)
		c.wroteLocked(n)
		return n, err
	}
	if c.r.IntN(c.odds) == 0 {
		n := 1 + c.r.IntN(c.most)
		if c.odds == 1 {
			n = maxUseless // as many as the server's TLS layer allows
		}
		if c.r.IntN(50) == 0 {
			n = maxUseless + 1 // the server's TLS layer ends the session
		}
		if err := c.keyUpdatesLocked(n, c.r); err != nil {
			return 0, err
		}
	}
	if err := c.sendLocked(c.send.record(23, b)); err != nil {
		return 0, err
	}
	c.useless = 0
	c.wroteLocked(len(b))
	return len(b), nil
}

// maxUseless is crypto/tls's limit of records in a row that carry no
// data (maxUselessRecords): a KeyUpdate more ends the connection.
const maxUseless = 16

// keyUpdatesLocked sends up to n KeyUpdates, most asking for the
// server's (within asks), and fewer if they would make more than maxUseless in a row
// without data, unless n is more.
func (c *huntTLSConn) keyUpdatesLocked(n int, r *rand.Rand) error {
	if n <= maxUseless {
		n = min(n, maxUseless-c.useless)
	}
	for range n {
		ask := r.IntN(8) != 0 && c.asks != 0
		if ask && c.asks > 0 {
			c.asks--
		}
		if err := c.keyUpdateLocked(ask); err != nil {
			return err
		}
	}
	return nil
}

func (c *huntTLSConn) wroteLocked(n int) {
	if n > 0 {
		c.plain += n
		c.ends = append(c.ends, [2]int{int(c.raw.n.Load()), c.plain})
	}
}

func (c *huntTLSConn) sendLocked(rec []byte) error {
	if c.broken {
		return net.ErrClosed
	}
	n, err := c.raw.Write(rec)
	if n < len(rec) {
		c.broken = true
		return cmp.Or(err, io.ErrShortWrite)
	}
	return nil
}

// keyUpdateLocked sends a KeyUpdate (RFC 8446 §4.6.3), asking for the
// server's if requested.
func (c *huntTLSConn) keyUpdateLocked(requested bool) error {
	msg := []byte{24, 0, 0, 1, 0}
	if requested {
		msg[4] = 1
	}
	if err := c.sendLocked(c.send.record(22, msg)); err != nil {
		return err
	}
	c.send.updateKeys()
	c.keyUpdates++
	c.useless++
	if requested {
		c.requested++
	}
	return nil
}

// chatter sends KeyUpdates at random moments, whatever the script is
// doing, until the server has shut down or a write fails: up to 8 times
// one, or for a flooder up to 16 times up to maxUseless.
func (c *huntTLSConn) chatter(r *rand.Rand, lease time.Duration, over <-chan struct{}) {
	times, most := 1+r.IntN(8), 1
	if c.odds == 1 {
		times, most = 1+r.IntN(16), maxUseless
	}
	for range times {
		select {
		case <-time.After(tick(r, 2*lease)):
		case <-over:
			return
		}
		c.mu.Lock()
		err := c.keyUpdatesLocked(1+r.IntN(most), r)
		c.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// Close closes the TCP connection, with a close_notify first if notify
// (crypto/tls's Close: its keys are out of date once send has sealed).
func (c *huntTLSConn) Close() error {
	if c.notify && c.send == nil {
		return c.Conn.Close()
	}
	return c.raw.Close()
}

// plainUpTo is the plaintext of the records that end within the first
// raw bytes the client sent.
func (c *huntTLSConn) plainUpTo(raw int) (plain int) {
	for _, e := range c.ends {
		if e[0] <= raw {
			plain = e[1]
		}
	}
	return plain
}

// countingConn counts the bytes written to it.
type countingConn struct {
	net.Conn
	n atomic.Int64
}

func (c *countingConn) Write(b []byte) (int, error) {
	n, err := c.Conn.Write(b)
	c.n.Add(int64(n))
	return n, err
}

// tlsPlaintext returns the server's log of ciphertext as the plaintext it
// carried, entry for entry: a read, as the plaintext of the client's
// records it completed; a write, as the application data of the records
// it holds ("write", or "write, torn" if it failed part-way, which the
// client cannot decrypt), or else as "tls" and what it held (handshake
// messages, tickets, the server's KeyUpdates, alerts). It checks on the
// way that each write of application data is whole frames, and that each
// client decrypted a prefix of what the server's whole writes carried.
func tlsPlaintext(log *probeLog, hunters []*huntClient) (*probeLog, string, error) {
	type conn struct {
		hc              *huntClient
		d               *tlsServerStream
		rawRead, read   int
		lastWrite, size int // the entry of the last write, and its ciphertext's length
		delivered       []byte
	}
	conns := map[string]*conn{}
	var v12, v13, chatty, keyUpdates, requested int
	for _, hc := range hunters {
		d, err := newTLSServerStream(hc.tls)
		if err != nil {
			return nil, "", fmt.Errorf("client %s: %v", hc.name, err)
		}
		conns[hc.name] = &conn{hc: hc, d: d}
		if hc.tls.state.Version == tls.VersionTLS12 {
			v12++
		} else {
			v13++
		}
		if hc.tls.send != nil {
			chatty++
			keyUpdates += hc.tls.keyUpdates
			requested += hc.tls.requested
		}
	}
	var torn, answered, alerts int
	out := &probeLog{}
	log.mu.Lock()
	defer log.mu.Unlock()
	failed := map[int]bool{} // the writes that failed: crypto/tls does not move to the keys of a KeyUpdate it failed to send
	last := map[string]int{}
	for i, e := range log.entries {
		switch {
		case e.what == "write" || e.what == "write, nothing sent":
			last[e.conn] = i
		case strings.HasPrefix(e.what, "write failed"):
			failed[last[e.conn]] = true
		}
	}
	for i, e := range log.entries {
		c := conns[e.conn]
		if c == nil {
			out.entries = append(out.entries, e)
			continue
		}
		switch {
		case e.what == "read":
			c.rawRead += len(e.b)
			p := c.hc.tls.plainUpTo(c.rawRead)
			out.entries = append(out.entries, probeEntry{conn: e.conn, what: "read", b: make([]byte, p-c.read)})
			c.read = p
		case e.what == "write" || e.what == "write, nothing sent":
			plain, kinds, err := c.d.write(e.b, failed[i])
			if err != nil {
				return nil, "", fmt.Errorf("client %s: the server's write #%d (% x): %v", e.conn, i, e.b, err)
			}
			what := e.what
			switch {
			case len(plain) == 0:
				what, plain = "tls "+strings.Join(kinds, ", "), nil
			case len(kinds) > 0:
				return nil, "", fmt.Errorf("client %s: the server's write #%d holds application data and %v", e.conn, i, kinds)
			case !wholeFrames(plain):
				return nil, "", fmt.Errorf("client %s: the server's write #%d is not whole frames: % x", e.conn, i, plain)
			}
			for _, k := range kinds {
				switch k {
				case "key update":
					answered++
				case "alert":
					alerts++
				}
			}
			c.lastWrite, c.size = len(out.entries), len(e.b)
			out.entries = append(out.entries, probeEntry{conn: e.conn, what: what, b: plain})
		case strings.HasPrefix(e.what, "write failed"):
			w := &out.entries[c.lastWrite]
			sent := 0
			if e.sent == c.size {
				sent = len(w.b)
			} else if e.sent > 0 {
				torn++
				if w.what == "write" {
					w.what = "write, torn"
				}
			}
			out.entries = append(out.entries, probeEntry{conn: e.conn, what: e.what, b: w.b, sent: sent})
		default:
			out.entries = append(out.entries, e)
		}
	}
	for _, e := range out.entries {
		if c := conns[e.conn]; c != nil && e.what == "write" {
			c.delivered = append(c.delivered, e.b...)
		}
	}
	for _, c := range conns {
		if !bytes.HasPrefix(c.delivered, c.hc.received) {
			return nil, "", fmt.Errorf("client %s decrypted % x; the server's whole writes carried % x", c.hc.name, c.hc.received, c.delivered)
		}
	}
	return out, fmt.Sprintf("; %d over TLS 1.2, %d over 1.3, %d of which sent %d KeyUpdates, %d asking for one; the server answered %d, sent %d alerts and tore %d records",
		v12, v13, chatty, keyUpdates, requested, answered, alerts, torn), nil
}

// wholeFrames says whether b is server frames, whole.
func wholeFrames(b []byte) bool {
	for r := bytes.NewReader(b); r.Len() > 0; {
		if _, err := ReadFrame(r); err != nil {
			return false
		}
	}
	return true
}

// tlsWritesAfterStop is writesAfterStop over TLS, where docs/protocol.md
// lets a write about to begin as the end was decided still begin (the
// server cuts no TLS write when an ERROR is to follow): it returns the
// writes of frames to conn that began after log entry mark (whole or
// torn), other than the final ERROR and a first one of answers only, which
// the writer can have taken before the end.
func tlsWritesAfterStop(log *probeLog, mark int, conn string) []probeEntry {
	var writes []probeEntry
	log.mu.Lock()
	for _, e := range log.entries[mark+1:] {
		if e.conn == conn && (e.what == "write" || e.what == "write, torn") {
			writes = append(writes, e)
		}
	}
	log.mu.Unlock()
	if n := len(writes); n > 0 {
		w := writes[n-1].b
		if f, err := ReadFrame(bytes.NewReader(w)); err == nil && f.Type == TypeError && len(w) == 3+len(f.Reason) {
			writes = writes[:n-1]
		}
	}
	if len(writes) > 0 && answersOnly(writes[0].b) {
		writes = writes[1:]
	}
	return writes
}

// answersOnly says whether b is whole WAITING and ACQUIRED frames.
func answersOnly(b []byte) bool {
	for r := bytes.NewReader(b); r.Len() > 0; {
		if f, err := ReadFrame(r); err != nil || f.Type == TypeError {
			return false
		}
	}
	return true
}

// tlsServerStream decrypts what a TLS server wrote to one client, record by
// record, with the secrets of the client's key log: for TLS 1.3 the
// server's handshake and application traffic secrets (then each of the
// server's KeyUpdates), for TLS 1.2 the master secret and the randoms
// (the server's from its ServerHello).
type tlsServerStream struct {
	vers   uint16
	keylog string
	suite  uint16
	buf    []byte // the start of a record the writes so far have not completed

	hs, app *tls13Sender // TLS 1.3; hs nil once the server uses app

	encrypted bool // TLS 1.2: after the server's ChangeCipherSpec
	random    []byte
	tls12     *tls12Opener
}

func newTLSServerStream(c *huntTLSConn) (*tlsServerStream, error) {
	d := &tlsServerStream{vers: c.state.Version, keylog: c.keylog.String(), suite: c.state.CipherSuite}
	if d.vers == tls.VersionTLS12 {
		return d, nil
	}
	for _, s := range []struct {
		to    **tls13Sender
		label string
	}{{&d.hs, "SERVER_HANDSHAKE_TRAFFIC_SECRET"}, {&d.app, "SERVER_TRAFFIC_SECRET_0"}} {
		secret, err := keyLogSecret(d.keylog, s.label)
		if err != nil {
			return nil, err
		}
		if *s.to, err = newTLS13Sender(d.suite); err != nil {
			return nil, err
		}
		(*s.to).setSecret(secret)
	}
	return d, nil
}

// write takes the bytes of one write, which failed or not, and returns
// the application data of the records it completes, and the kinds of the
// others.
func (d *tlsServerStream) write(b []byte, failed bool) (plain []byte, kinds []string, err error) {
	d.buf = append(d.buf, b...)
	for len(d.buf) >= 5 {
		n := 5 + int(binary.BigEndian.Uint16(d.buf[3:5]))
		if len(d.buf) < n {
			break
		}
		rec := d.buf[:n:n]
		d.buf = d.buf[n:]
		typ, p, err := d.open(rec)
		if err != nil {
			return nil, nil, err
		}
		switch typ {
		case 23:
			plain = append(plain, p...)
		case 21:
			kinds = append(kinds, "alert")
		case 20:
			kinds = append(kinds, "change_cipher_spec")
		case 22:
			for len(p) >= 4 { // handshake messages
				m := 4 + (int(p[1])<<16 | int(p[2])<<8 | int(p[3]))
				switch {
				case d.vers == tls.VersionTLS13 && d.hs == nil && p[0] == 24: // the server's KeyUpdate
					kinds = append(kinds, "key update")
					if !failed { // else crypto/tls keeps its keys (handleKeyUpdate), for an alert
						d.app.updateKeys()
					}
				case d.hs == nil && p[0] == 4:
					kinds = append(kinds, "ticket")
				default:
					kinds = append(kinds, "handshake")
				}
				p = p[min(m, len(p)):]
			}
		default:
			return nil, nil, fmt.Errorf("a record of type %d", typ)
		}
	}
	return plain, kinds, nil
}

// open decrypts a record, if encrypted, and returns its content type and
// plaintext.
func (d *tlsServerStream) open(rec []byte) (byte, []byte, error) {
	if d.vers == tls.VersionTLS12 {
		if d.encrypted {
			return d.tls12.open(rec)
		}
		switch {
		case rec[0] == 22 && len(rec) >= 43 && rec[5] == 2: // ServerHello: type, length, version, random
			d.random = bytes.Clone(rec[11:43])
		case rec[0] == 20:
			var err error
			if d.tls12, err = newTLS12Opener(d.suite, d.keylog, d.random); err != nil {
				return 0, nil, err
			}
			d.encrypted = true
		}
		return rec[0], rec[5:], nil
	}
	if rec[0] != 23 {
		return rec[0], rec[5:], nil // ServerHello, the compatibility ChangeCipherSpec
	}
	if d.hs != nil {
		if typ, p, err := d.hs.open(rec); err == nil {
			return typ, p, nil
		}
		d.hs = nil // past the server's Finished
	}
	typ, p, err := d.app.open(rec)
	if err != nil {
		return 0, nil, fmt.Errorf("a record that does not open: %v", err)
	}
	if typ == 22 && (len(p) == 0 || p[0] != 4 && p[0] != 24) {
		return 0, nil, fmt.Errorf("a handshake message after the handshake: % x", p)
	}
	return typ, p, nil
}

// tls12Opener decrypts a TLS 1.2 server's AES-GCM records (RFC 5288).
type tls12Opener struct {
	aead cipher.AEAD
	salt []byte
	seq  uint64
}

// newTLS12Opener derives the server's write key and salt from the key
// log's master secret (RFC 5246 §6.3).
func newTLS12Opener(suite uint16, keylog string, serverRandom []byte) (*tls12Opener, error) {
	var newHash func() hash.Hash
	var keyLen int
	switch suite {
	case tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256:
		newHash, keyLen = sha256.New, 16
	case tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384:
		newHash, keyLen = sha512.New384, 32
	default:
		return nil, fmt.Errorf("cipher suite %s", tls.CipherSuiteName(suite))
	}
	if serverRandom == nil {
		return nil, errors.New("no ServerHello before the ChangeCipherSpec")
	}
	var clientRandom, master []byte
	for line := range strings.Lines(keylog) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "CLIENT_RANDOM" {
			var err error
			if clientRandom, err = hex.DecodeString(f[1]); err != nil {
				return nil, err
			}
			if master, err = hex.DecodeString(f[2]); err != nil {
				return nil, err
			}
		}
	}
	if master == nil {
		return nil, errors.New("no CLIENT_RANDOM in the key log")
	}
	kb := prf12(newHash, master, "key expansion", append(bytes.Clone(serverRandom), clientRandom...), 2*keyLen+8)
	block, err := aes.NewCipher(kb[keyLen : 2*keyLen]) // after the client's key
	if err != nil {
		return nil, err
	}
	aead, err := cipher.NewGCM(block)
	if err != nil {
		return nil, err
	}
	return &tls12Opener{aead: aead, salt: kb[2*keyLen+4:]}, nil // after the client's salt
}

func (o *tls12Opener) open(rec []byte) (byte, []byte, error) {
	payload := rec[5:]
	if len(payload) < 8+o.aead.Overhead() {
		return 0, nil, errors.New("a record too short for AES-GCM")
	}
	nonce := append(bytes.Clone(o.salt), payload[:8]...)
	ad := binary.BigEndian.AppendUint64(nil, o.seq)
	ad = append(ad, rec[:3]...)
	ad = binary.BigEndian.AppendUint16(ad, uint16(len(payload)-8-o.aead.Overhead()))
	plain, err := o.aead.Open(nil, nonce, payload[8:], ad)
	if err != nil {
		return 0, nil, fmt.Errorf("a record that does not open: %v", err)
	}
	o.seq++
	return rec[0], plain, nil
}

// prf12 is TLS 1.2's PRF, P_hash (RFC 5246 §5).
func prf12(newHash func() hash.Hash, secret []byte, label string, seed []byte, n int) []byte {
	seed = append([]byte(label), seed...)
	mac := func(parts ...[]byte) []byte {
		h := hmac.New(newHash, secret)
		for _, p := range parts {
			h.Write(p)
		}
		return h.Sum(nil)
	}
	var out []byte
	for a := mac(seed); len(out) < n; a = mac(a) {
		out = append(out, mac(a, seed)...)
	}
	return out[:n]
}
