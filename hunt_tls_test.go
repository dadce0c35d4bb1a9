package monolock

import (
	"bytes"
	"cmp"
	"crypto/aes"
	"crypto/cipher"
	"crypto/hmac"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash"
	"io"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// TestRaceHuntOverTLS is TestRaceHuntOverTCP's hunt (huntOverNet) over
// TLS: the same scripts, administrator and checks, with a quarter of the
// clients on TLS 1.2 (AES-GCM) and the rest on TLS 1.3: plain; sending
// KeyUpdates of their own now and then; or flooding with them. Such a
// client seals its records itself (crypto/tls's client never sends a
// KeyUpdate) and sends its KeyUpdates, most asking for the server's,
// before its writes and, on a goroutine of their own, at random moments
// whatever the script is doing (silent, half-way through a frame, waiting
// for its drop). A third of the clients, and every flooder, read nothing
// until late, with 2 KiB receive buffers. The server answers a KeyUpdate
// from inside its read, with no flood pause, so that a flooder fills the
// buffers in a few hundred milliseconds where heartbeats, whose answers
// the server paces, do not within a run: its server's writes block, some
// until they time out (the run logs how many writes to the socket were
// blocked for 20ms or more, and how many timed out; over TCP none is
// blocked). Most are KeyUpdates' answers, with the server's read inside
// them, and the frames' writer waiting behind them on crypto/tls's lock
// (which the test cannot time); about one in ten is a write of frames
// blocked on the socket itself.
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
// answers dropped when another party ended a session, nor (new over TLS
// 1.3) that a session whose server's read is stuck in a KeyUpdate's answer
// lasts at most an io-timeout past its lease. It needs AES-GCM for TLS 1.3
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
