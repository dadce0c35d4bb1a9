//go:build unix

package monolock

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"
	"testing"
)

func init() {
	setReceiveBuffer = func(fd uintptr, n int) error {
		return syscall.SetsockoptInt(int(fd), syscall.SOL_SOCKET, syscall.SO_RCVBUF, n)
	}
	// A socket bound and not listening refuses every connection and keeps
	// its port: bound without SO_REUSEADDR, no listener of another test
	// can take it, and no outgoing connection is given it as its own.
	refusing = func(t *testing.T) (string, func() (net.Listener, error)) {
		fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
		if err != nil {
			t.Fatal(err)
		}
		syscall.CloseOnExec(fd)
		f := os.NewFile(uintptr(fd), "refusing")
		t.Cleanup(func() { f.Close() })
		if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
			t.Fatal(err)
		}
		sa, err := syscall.Getsockname(fd)
		if err != nil {
			t.Fatal(err)
		}
		addr := fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
		return addr, func() (net.Listener, error) {
			if err := syscall.Listen(fd, 128); err != nil {
				return nil, err
			}
			return net.FileListener(f) // its own copy of fd
		}
	}
}

// The tests of a refused dial depend on it: until listen, no listener can
// take the port and a dial is refused; then the listener answers there.
func TestRefusingKeepsItsPort(t *testing.T) {
	addr, listen := refusing(t)
	if l, err := net.Listen("tcp", addr); err == nil {
		l.Close()
		t.Fatalf("another listener took %s", addr)
	}
	if c, err := net.Dial("tcp", addr); !errors.Is(err, syscall.ECONNREFUSED) {
		t.Fatalf("dial %s = %v, %v; want refused", addr, c, err)
	}
	l, err := listen()
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() {
		if c, err := l.Accept(); err == nil {
			c.Close()
		}
	}()
	c, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatalf("dial after listen: %v", err)
	}
	c.Close()
}
