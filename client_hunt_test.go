package monolock

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"
)

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
	if err := srv.Shutdown(ctx); err != nil {
		return st, fmt.Sprintf("Shutdown: %v", err)
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
