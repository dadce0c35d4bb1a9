package monolock

import (
	"fmt"
	"math/rand/v2"
	"net"
	"slices"
	"strings"
	"testing"
	"time"
)

// The lock table checked against a reference model: random sequences of
// operations are played on the real server and on a map of FIFO slices,
// and after every step the two must agree on who holds each lock, the
// order of every queue, and the tokens the clients were given. A failing
// sequence is shrunk to a minimal one before it is reported.

// refModel is the reference: per lock, its sessions in order, holder first.
type refModel map[string][]int

func (m refModel) join(lock string, c int) (holder bool) {
	m[lock] = append(m[lock], c)
	return len(m[lock]) == 1
}

// leave removes c and returns whoever it promoted, or -1.
func (m refModel) leave(c int) (promoted int) {
	for lock, q := range m {
		if i := slices.Index(q, c); i >= 0 {
			m[lock] = slices.Delete(q, i, i+1)
			if len(m[lock]) == 0 {
				delete(m, lock)
			} else if i == 0 {
				return m[lock][0]
			}
		}
	}
	return -1
}

func (m refModel) lockOf(c int) string {
	for lock, q := range m {
		if slices.Contains(q, c) {
			return lock
		}
	}
	return ""
}

type opKind int

const (
	opAcquire opKind = iota
	opHeartbeat
	opClose
	opExpire // acquire with a short lease and stay silent until dropped
	opProtocolError
	opForceRelease
	opKick
)

type op struct {
	kind   opKind
	client int
	lock   string
}

func (o op) String() string {
	name := [...]string{"acquire", "heartbeat", "close", "acquire-and-go-silent", "protocol-error", "force-release", "kick"}[o.kind]
	if o.kind == opForceRelease {
		return fmt.Sprintf("%s(%s)", name, o.lock)
	}
	return fmt.Sprintf("%s(c%d, %s)", name, o.client, o.lock)
}

const modelClients = 5

func randomOps(r *rand.Rand, n int) []op {
	ops := make([]op, n)
	for i := range ops {
		ops[i] = op{kind: opKind(r.IntN(7)), client: r.IntN(modelClients), lock: []string{"a", "b"}[r.IntN(2)]}
		if ops[i].kind == opExpire && r.IntN(8) != 0 {
			ops[i].kind = opAcquire // expiries cost a lease of real time: keep them rare
		}
	}
	return ops
}

// playOps plays ops on srv and on the model and returns the first
// disagreement. Ops that make no sense in the current state (a heartbeat
// from a client with no connection) are skipped, on both sides alike.
func playOps(srv *Server, addr, prefix string, ops []op) (err error) {
	const short = 10 * time.Millisecond
	model := refModel{}
	conns := map[int]*raw{}
	ft := &failT{}
	defer func() {
		for _, c := range conns {
			c.Close()
		}
		if r := recover(); r != nil {
			if r != ft {
				panic(r)
			}
			err = ft.err
		}
	}()
	var lastToken uint64
	tokens := map[int]uint64{}
	expectGrant := func(c int) {
		token := conns[c].expectAcquired()
		if token <= lastToken {
			ft.Fatalf("c%d granted token %d after %d", c, token, lastToken)
		}
		lastToken, tokens[c] = token, token
	}
	leave := func(c int) {
		conns[c].Close()
		delete(conns, c)
		if next := model.leave(c); next >= 0 {
			expectGrant(next)
		}
	}
	for step, o := range ops {
		lock := prefix + o.lock
		c, connected := conns[o.client]
		switch o.kind {
		case opAcquire, opExpire:
			if connected {
				continue
			}
			conn, err := net.DialTimeout("tcp", addr, wait)
			if err != nil {
				return err
			}
			c = &raw{t: ft, Conn: conn, patience: time.Second}
			conns[o.client] = c
			lease := time.Minute
			if o.kind == opExpire {
				lease = short
			}
			c.send(acquire(lock, lease))
			if model.join(lock, o.client) {
				expectGrant(o.client)
			} else {
				c.expectWaiting()
			}
			if o.kind == opExpire {
				c.expectClosed(time.Second) // dropped, silent for longer than its lease
				delete(conns, o.client)
				if next := model.leave(o.client); next >= 0 {
					expectGrant(next)
				}
			}
		case opHeartbeat:
			if !connected {
				continue
			}
			c.send(heartbeat)
			if q := model[model.lockOf(o.client)]; q[0] == o.client {
				c.expect(Frame{Type: TypeAcquired, Token: tokens[o.client]})
			} else {
				c.expectWaiting()
			}
		case opClose:
			if !connected {
				continue
			}
			leave(o.client)
		case opProtocolError:
			if !connected {
				continue
			}
			c.sendBytes([]byte{0x7f})
			c.expectError(CodeUnknownType)
			leave(o.client)
		case opForceRelease:
			q := model[lock]
			if len(q) == 0 {
				if _, err := srv.ForceRelease(lock, 0); err == nil {
					ft.Fatalf("step %d: force-released %s, which the model says is idle", step, lock)
				}
				continue
			}
			if _, err := srv.ForceRelease(lock, 0); err != nil {
				ft.Fatalf("step %d: %v", step, err)
			}
			conns[q[0]].expectError(CodeClosedByAdmin)
			leave(q[0])
		case opKick:
			if !connected || model[lock] == nil || model[lock][0] == o.client || !slices.Contains(model[lock], o.client) {
				continue
			}
			if _, err := srv.KickWaiter(lock, c.LocalAddr().String()); err != nil {
				ft.Fatalf("step %d: %v", step, err)
			}
			c.expectError(CodeClosedByAdmin)
			leave(o.client)
		}
		if err := agree(srv, model, conns, tokens, prefix); err != nil {
			return fmt.Errorf("after step %d (%v): %w", step, o, err)
		}
	}
	return nil
}

// agree waits until the server's table matches the model: the server
// applies a close or a kick on its own goroutines, a moment later.
func agree(srv *Server, model refModel, conns map[int]*raw, tokens map[int]uint64, prefix string) error {
	want := map[string][]string{}
	for lock, q := range model {
		for i, c := range q {
			session := conns[c].LocalAddr().String()
			if i == 0 {
				session += fmt.Sprintf("#%d", tokens[c])
			}
			want[lock] = append(want[lock], session)
		}
	}
	var got map[string][]string
	for deadline := time.Now().Add(time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Microsecond) {
		got = map[string][]string{}
		for _, l := range srv.Locks() {
			if !strings.HasPrefix(l.Name, prefix) {
				continue
			}
			if l.Holder != nil {
				got[l.Name] = append(got[l.Name], fmt.Sprintf("%s#%d", l.Holder.RemoteAddr, l.Holder.Token))
			}
			for _, w := range l.Waiters {
				got[l.Name] = append(got[l.Name], w.RemoteAddr)
			}
		}
		if fmt.Sprint(got) == fmt.Sprint(want) {
			return nil
		}
	}
	return fmt.Errorf("server has %v, the model %v", got, want)
}

// failT turns the raw client's fatal checks into a recoverable error.
type failT struct {
	testing.TB
	err error
}

func (f *failT) Helper() {}
func (f *failT) Fatalf(format string, args ...any) {
	f.err = fmt.Errorf(format, args...)
	panic(f)
}
func (f *failT) Fatal(args ...any) { f.Fatalf("%s", fmt.Sprint(args...)) }
func (f *failT) Errorf(format string, args ...any) {
	f.Fatalf(format, args...)
}

// shrink removes operations one at a time for as long as the sequence
// still fails, and returns the shortest failing sequence it found.
func shrink(fails func([]op) bool, ops []op) []op {
	for changed := true; changed; {
		changed = false
		for i := 0; i < len(ops); i++ {
			candidate := slices.Delete(slices.Clone(ops), i, i+1)
			if fails(candidate) {
				ops, changed = candidate, true
				i--
			}
		}
	}
	return ops
}

func TestLockTableAgainstModel(t *testing.T) {
	sequences, length := 1000, 25
	if testing.Short() {
		sequences = 200
	}
	srv := &Server{}
	addr := startServer(t, srv)
	r := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 7))
	run := 0
	fails := func(ops []op) bool {
		run++
		return playOps(srv, addr, fmt.Sprintf("m%d-", run), ops) != nil
	}
	for range sequences {
		ops := randomOps(r, length)
		run++
		if err := playOps(srv, addr, fmt.Sprintf("m%d-", run), ops); err != nil {
			minimal := shrink(fails, ops)
			run++
			err := playOps(srv, addr, fmt.Sprintf("m%d-", run), minimal)
			t.Fatalf("the server disagrees with the model: %v\nminimal sequence (%d of %d steps): %v", err, len(minimal), len(ops), minimal)
		}
	}
}

func TestModelShrinksToTheCause(t *testing.T) {
	// A made-up failure: any sequence with a kick after a force-release.
	fails := func(ops []op) bool {
		forced := false
		for _, o := range ops {
			forced = forced || o.kind == opForceRelease
			if forced && o.kind == opKick {
				return true
			}
		}
		return false
	}
	ops := randomOps(rand.New(rand.NewPCG(1, 2)), 40)
	ops = append(ops, op{kind: opForceRelease, lock: "a"}, op{kind: opKick, client: 1, lock: "a"})
	if got := shrink(fails, ops); len(got) != 2 {
		t.Fatalf("shrunk to %v, want the two steps that matter", got)
	}
}
