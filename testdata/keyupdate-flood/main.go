// Command keyupdate-flood measures what a flood of TLS 1.3 KeyUpdates
// costs a monolock server (the binary, a child process) against what it
// costs the attacker, and what it does to a well-behaved client's
// acquire latency. Each flooder holds a lock of its own over TLS 1.3 and
// writes, in one write, -keyupdates KeyUpdate records (update_requested)
// then a record with one HEARTBEAT, as fast as the server takes them,
// discarding what comes back. -keyupdates 0 is the plain heartbeat flood
// over TLS, for comparison. With -reconnect each flooder instead connects,
// sends -keyupdates KeyUpdates with an ACQUIRE of the longest name in one
// write (16, then a byte of it), reads its ACQUIRED, closes and connects
// again: what the records free with a connection's handshake and ACQUIRE
// cost the server. With -reconnect -fragment each connection sends, after
// its handshake, a KeyUpdate that declares 65,535 bytes, a byte a record
// (each padded to -pad bytes), 1,100 units' worth, and reads until the
// server closes.
//
//	go build -o /tmp/monolock ./cmd/monolock   (in the repository)
//	go run ./testdata/keyupdate-flood -bin /tmp/monolock -n 10 -d 5s
package main

import (
	"bytes"
	"crypto/aes"
	"crypto/cipher"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/hkdf"
	"crypto/rand"
	"crypto/sha256"
	"crypto/sha512"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/binary"
	"encoding/hex"
	"encoding/pem"
	"flag"
	"fmt"
	"hash"
	"io"
	"math/big"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

type sender struct {
	newHash func() hash.Hash
	keyLen  int
	secret  []byte
	aead    cipher.AEAD
	iv      []byte
	seq     uint64
}

func (s *sender) expand(secret []byte, label string, n int) []byte {
	full := "tls13 " + label
	info := append([]byte{byte(n >> 8), byte(n), byte(len(full))}, full...)
	out, err := hkdf.Expand(s.newHash, secret, string(append(info, 0)), n)
	if err != nil {
		panic(err)
	}
	return out
}

func (s *sender) setSecret(secret []byte) {
	block, err := aes.NewCipher(s.expand(secret, "key", s.keyLen))
	if err != nil {
		panic(err)
	}
	s.secret, s.iv, s.seq = secret, s.expand(secret, "iv", 12), 0
	s.aead, _ = cipher.NewGCM(block)
}

func (s *sender) updateKeys() { s.setSecret(s.expand(s.secret, "traffic upd", s.newHash().Size())) }

func (s *sender) record(contentType byte, msg []byte) []byte { return s.padded(contentType, msg, 0) }

// padded seals msg padded with zeros to pad bytes, its type included.
func (s *sender) padded(contentType byte, msg []byte, pad int) []byte {
	nonce := bytes.Clone(s.iv)
	for i := range 8 {
		nonce[4+i] ^= byte(s.seq >> (56 - 8*i))
	}
	s.seq++
	hdr := []byte{0x17, 0x03, 0x03, 0, 0}
	inner := append(bytes.Clone(msg), contentType)
	inner = append(inner, make([]byte, max(pad-len(inner), 0))...)
	binary.BigEndian.PutUint16(hdr[3:], uint16(len(inner)+s.aead.Overhead()))
	return s.aead.Seal(hdr, nonce, inner, hdr)
}

func acquire(name string, leaseMS uint32) []byte {
	b := []byte{0x01, 1}
	b = binary.BigEndian.AppendUint32(b, leaseMS)
	b = binary.BigEndian.AppendUint16(b, uint16(len(name)))
	return append(b, name...)
}

func writeCert(dir string) (certFile, keyFile string) {
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		panic(err)
	}
	kder, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile = filepath.Join(dir, "cert.pem"), filepath.Join(dir, "key.pem")
	os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600)
	os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kder}), 0o600)
	return
}

func cpuOf(pid int) time.Duration { // utime+stime of a process, from /proc
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		panic(err)
	}
	f := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+2:]))
	u, _ := strconv.Atoi(f[11])
	s, _ := strconv.Atoi(f[12])
	return time.Duration(u+s) * 10 * time.Millisecond // USER_HZ 100
}

func selfCPU() time.Duration {
	var ru syscall.Rusage
	syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

var received atomic.Int64 // bytes the server wrote to the flooders

type counter struct{}

func (counter) Write(b []byte) (int, error) { received.Add(int64(len(b))); return len(b), nil }

// dial connects over TLS 1.3 and returns the client, its raw connection
// and a sender of records under the client's traffic secret.
func dial(addr string) (*tls.Conn, net.Conn, *sender, error) {
	raw, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, nil, nil, err
	}
	var keylog bytes.Buffer
	c := tls.Client(raw, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS13, KeyLogWriter: &keylog})
	if err := c.Handshake(); err != nil {
		raw.Close()
		return nil, nil, nil, err
	}
	s := &sender{newHash: sha256.New, keyLen: 16}
	switch c.ConnectionState().CipherSuite {
	case tls.TLS_AES_128_GCM_SHA256:
	case tls.TLS_AES_256_GCM_SHA384:
		s = &sender{newHash: sha512.New384, keyLen: 32}
	default:
		raw.Close()
		return nil, nil, nil, fmt.Errorf("suite %x", c.ConnectionState().CipherSuite)
	}
	var secret []byte
	for line := range strings.Lines(keylog.String()) {
		if f := strings.Fields(line); len(f) == 3 && f[0] == "CLIENT_TRAFFIC_SECRET_0" {
			secret, _ = hex.DecodeString(f[2])
		}
	}
	s.setSecret(secret)
	return c, raw, s, nil
}

// reconnect is the -reconnect flooder; batches counts its connections.
func reconnect(addr string, i int, keyUpdates, fragment int, stop <-chan struct{}, batches *atomic.Int64) error {
	for k := 0; ; k++ {
		name := fmt.Sprintf("flood%d-%d-", i, k) // the last one's close may not be read yet
		name += strings.Repeat("n", 255-len(name))
		select {
		case <-stop:
			return nil
		default:
		}
		c, raw, s, err := dial(addr)
		if err != nil {
			return err
		}
		if fragment >= 0 {
			batch := s.padded(22, []byte{24, 0, 0xff, 0xff}, fragment)
			for range 1100 / (1 + fragment>>10) {
				batch = append(batch, s.padded(22, []byte{0}, fragment)...)
			}
			// The server closes past 1,024 units, or at its io-timeout:
			// the write may fail, the read may be reset.
			raw.SetDeadline(time.Now().Add(30 * time.Second))
			raw.Write(batch)
			raw.(*net.TCPConn).CloseWrite()
			io.Copy(counter{}, raw)
			raw.Close()
			batches.Add(1)
			continue
		}
		// crypto/tls takes 16 KeyUpdates at most before a record of data:
		// a byte of the ACQUIRE after each 16.
		var batch []byte
		acq := acquire(name, 60000)
		for k := 0; k < keyUpdates; k++ {
			batch = append(batch, s.record(22, []byte{24, 0, 0, 1, 1})...)
			s.updateKeys()
			if k%16 == 15 {
				batch, acq = append(batch, s.record(23, acq[:1])...), acq[1:]
			}
		}
		batch = append(batch, s.record(23, acq)...)
		// Then EOF: the server reads it all, answers, and closes. (crypto/tls
		// would not read the answers: 16 KeyUpdates in a row at most.)
		raw.SetDeadline(time.Now().Add(30 * time.Second))
		if _, err = raw.Write(batch); err == nil {
			raw.(*net.TCPConn).CloseWrite()
			var n int64
			n, err = io.Copy(counter{}, raw)
			if err == nil && n < int64(keyUpdates)*22 {
				err = fmt.Errorf("%d bytes back for %d KeyUpdates", n, keyUpdates)
			}
		}
		raw.Close()
		_ = c
		if err != nil {
			return err
		}
		batches.Add(1)
	}
}

func flood(addr string, i int, keyUpdates int, leaseMS uint32, stop <-chan struct{}, batches *atomic.Int64) error {
	_, raw, s, err := dial(addr)
	if err != nil {
		return err
	}
	defer raw.Close()
	go io.Copy(counter{}, raw)
	if _, err := raw.Write(s.record(23, acquire(fmt.Sprint("flood", i), leaseMS))); err != nil {
		return err
	}
	var batch []byte
	for {
		select {
		case <-stop:
			return nil
		default:
		}
		batch = batch[:0]
		for range keyUpdates {
			batch = append(batch, s.record(22, []byte{24, 0, 0, 1, 1})...)
			s.updateKeys()
		}
		batch = append(batch, s.record(23, []byte{0x02})...)
		if _, err := raw.Write(batch); err != nil {
			return err
		}
		batches.Add(1)
	}
}

func probe(addr string, stop <-chan struct{}) []time.Duration {
	var lat []time.Duration
	for {
		select {
		case <-stop:
			return lat
		default:
		}
		begin := time.Now()
		c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
		if err != nil {
			fmt.Println("probe:", err)
			time.Sleep(10 * time.Millisecond)
			continue
		}
		c.Write(acquire("probe", 10000))
		var b [9]byte
		c.SetReadDeadline(time.Now().Add(30 * time.Second))
		_, err = io.ReadFull(c, b[:])
		d := time.Since(begin)
		c.Close()
		if err != nil || b[0] != 0x12 {
			fmt.Println("probe failed:", err, b[0])
		}
		lat = append(lat, d)
		if d < 10*time.Millisecond {
			time.Sleep(10*time.Millisecond - d)
		}
	}
}

func pct(lat []time.Duration, p float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func main() {
	bin := flag.String("bin", "/tmp/monolock", "the monolock binary")
	n := flag.Int("n", 100, "flooding connections")
	keyUpdates := flag.Int("keyupdates", 16, "KeyUpdate records before each HEARTBEAT record")
	leaseMS := flag.Uint("lease", 60000, "the flooders' lease, ms")
	d := flag.Duration("d", 10*time.Second, "each phase")
	warm := flag.Duration("warm", 5*time.Second, "flooding before the flooded phase's measures")
	reconnecting := flag.Bool("reconnect", false, "a connection each batch, its KeyUpdates sent with its ACQUIRE")
	fragment := flag.Bool("fragment", false, "with -reconnect: a KeyUpdate of 65,535 bytes a byte a record instead")
	pad := flag.Int("pad", 0, "with -fragment: the bytes each record is padded to")
	flag.Parse()
	dir, _ := os.MkdirTemp("", "ku")
	defer os.RemoveAll(dir)
	cert, key := writeCert(dir)
	l, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := l.Addr().String()
	l.Close()
	srv := exec.Command(*bin, "-listen", addr, "-tls-cert", cert, "-tls-key", key, "-log-level", "error")
	srv.Stderr = os.Stderr
	if err := srv.Start(); err != nil {
		panic(err)
	}
	defer srv.Process.Kill()
	for range 100 {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	stop := make(chan struct{})
	time.AfterFunc(*d, func() { close(stop) })
	base := probe(addr, stop)

	var batches atomic.Int64
	stopFlood := make(chan struct{})
	var wg sync.WaitGroup
	var failed atomic.Int64
	for i := range *n {
		wg.Go(func() {
			f := func() error { return flood(addr, i, *keyUpdates, uint32(*leaseMS), stopFlood, &batches) }
			if *reconnecting {
				frag := -1
				if *fragment {
					frag = *pad
				}
				f = func() error { return reconnect(addr, i, *keyUpdates, frag, stopFlood, &batches) }
			}
			if err := f(); err != nil {
				if failed.Add(1) <= 3 {
					fmt.Println("flooder:", err)
				}
			}
		})
	}
	time.Sleep(*warm) // the socket buffers fill
	srvCPU0, selfCPU0, batches0, recv0, t0 := cpuOf(srv.Process.Pid), selfCPU(), batches.Load(), received.Load(), time.Now()
	stop2 := make(chan struct{})
	time.AfterFunc(*d, func() { close(stop2) })
	flooded := probe(addr, stop2)
	el := time.Since(t0)
	srvCPU, atkCPU, nb, recv := cpuOf(srv.Process.Pid)-srvCPU0, selfCPU()-selfCPU0, batches.Load()-batches0, received.Load()-recv0
	close(stopFlood)
	what := fmt.Sprintf("%d KeyUpdates a HEARTBEAT record, lease %dms", *keyUpdates, *leaseMS)
	if *reconnecting {
		what = fmt.Sprintf("reconnecting, %d KeyUpdates with each ACQUIRE (a batch: a connection)", *keyUpdates)
		if *fragment {
			what = fmt.Sprintf("reconnecting, a KeyUpdate of 65,535 bytes a byte a record, records padded to %d bytes (a batch: a connection)", *pad)
		}
	}
	fmt.Printf("flooders %d, %s, %v a phase; %d flooders failed\n", *n, what, *d, failed.Load())
	fmt.Printf("probe (TLS dial+ACQUIRE+ACQUIRED) without flood: %d probes, p50 %v, p99 %v\n", len(base), pct(base, .5).Round(10*time.Microsecond), pct(base, .99).Round(10*time.Microsecond))
	fmt.Printf("probe with flood:                                %d probes, p50 %v, p99 %v\n", len(flooded), pct(flooded, .5).Round(10*time.Microsecond), pct(flooded, .99).Round(10*time.Microsecond))
	fmt.Printf("during the flood (%v): batches written into the socket %.0f/s, server wrote %.0f KiB/s to the flooders, server CPU %v (%.2f cores), attacker+prober CPU %v (%.2f cores)\n",
		el.Round(time.Millisecond), float64(nb)/el.Seconds(), float64(recv)/1024/el.Seconds(), srvCPU, srvCPU.Seconds()/el.Seconds(), atkCPU, atkCPU.Seconds()/el.Seconds())
	wg.Wait()
}
