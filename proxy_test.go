package monolock

import (
	"io"
	"net"
	"sync"
	"testing"
	"time"
)

// faultProxy forwards TCP connections to a target and injects faults into
// either direction of all of them: pass, delay, or blackhole (bytes and the
// end of the stream are dropped, as in a partition); cut closes them all.
type faultProxy struct {
	addr   string
	target string

	mu    sync.Mutex
	modes [2]fault // up (client to server), down (server to client)
	conns []net.Conn
}

type fault struct {
	drop  bool
	delay time.Duration
}

const (
	up   = 0
	down = 1
)

func startProxy(t testing.TB, target string) *faultProxy {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := &faultProxy{addr: l.Addr().String(), target: target}
	t.Cleanup(func() {
		l.Close()
		p.cut()
	})
	go func() {
		for {
			client, err := l.Accept()
			if err != nil {
				return
			}
			server, err := net.Dial("tcp", target)
			if err != nil {
				client.Close()
				continue
			}
			p.mu.Lock()
			p.conns = append(p.conns, client, server)
			p.mu.Unlock()
			go p.pump(client, server, up)
			go p.pump(server, client, down)
		}
	}()
	return p
}

func (p *faultProxy) set(dir int, f fault) {
	p.mu.Lock()
	p.modes[dir] = f
	p.mu.Unlock()
}

func (p *faultProxy) mode(dir int) fault {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.modes[dir]
}

// cut closes every connection through the proxy.
func (p *faultProxy) cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, c := range p.conns {
		c.Close()
	}
	p.conns = nil
}

type chunk struct {
	b   []byte
	due time.Time
}

// pump copies src to dst under the direction's fault at the moment each
// chunk is read. Delayed chunks keep their order.
func (p *faultProxy) pump(src, dst net.Conn, dir int) {
	chunks := make(chan chunk, 1024)
	go func() {
		defer dst.Close()
		for c := range chunks {
			time.Sleep(time.Until(c.due))
			if _, err := dst.Write(c.b); err != nil {
				return
			}
		}
	}()
	defer close(chunks)
	buf := make([]byte, 4096)
	for {
		n, err := src.Read(buf)
		if n > 0 {
			f := p.mode(dir)
			if !f.drop {
				chunks <- chunk{append([]byte(nil), buf[:n]...), time.Now().Add(f.delay)}
			}
		}
		if err != nil {
			f := p.mode(dir)
			if f.drop {
				// A partition loses the FIN too: dst hears nothing, ever.
				select {}
			}
			if err != io.EOF {
				src.Close()
			}
			time.Sleep(f.delay) // the end of the stream is delayed like its bytes
			return
		}
	}
}
