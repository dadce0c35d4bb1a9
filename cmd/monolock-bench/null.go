package main

import (
	"bufio"
	"encoding/binary"
	"fmt"
	"net"
	"os"
	"sync/atomic"
	"time"

	"github.com/monolock-dev/monolock"
)

// serveNull is the null server the benchmarks compare monolock with: the
// same socket work and nothing else. One goroutine per connection reads the
// ACQUIRE, grants it with the next token, answers every HEARTBEAT with
// ACQUIRED and closes at EOF or after a silent lease. There is no lock
// table, no queue, no io-timeout on writes: what monolock adds to this is
// the cost of being a lock server.
func serveNull(addr string) {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	fmt.Printf("null server on %s (pid %d)\n", l.Addr(), os.Getpid())
	var tokens atomic.Uint64
	for {
		conn, err := l.Accept()
		if err != nil {
			time.Sleep(5 * time.Millisecond)
			continue
		}
		go func() {
			defer conn.Close()
			r := bufio.NewReaderSize(conn, 64)
			conn.SetReadDeadline(time.Now().Add(5 * time.Second))
			f, err := monolock.ReadFrame(r)
			if err != nil || f.Type != monolock.TypeAcquire {
				return
			}
			lease := time.Duration(f.LeaseMS) * time.Millisecond
			reply := binary.BigEndian.AppendUint64([]byte{monolock.TypeAcquired}, tokens.Add(1))
			for {
				if _, err := conn.Write(reply); err != nil {
					return
				}
				conn.SetReadDeadline(time.Now().Add(lease))
				if b, err := r.ReadByte(); err != nil || b != monolock.TypeHeartbeat {
					return
				}
			}
		}()
	}
}
