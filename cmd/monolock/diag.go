package main

import (
	"bytes"
	"fmt"
	"io"
	"sync/atomic"
	"time"
)

// diagWriter is stderr for the diagnostics, which the server never waits
// for: a signal must not wait behind a log line that a stalled stderr
// holds, nor a session's goroutine, which Shutdown waits for. Lines queue,
// up to a bound, for one goroutine that writes them; a line that finds the
// queue full is dropped, and the next line written says how many were.
type diagWriter struct {
	lines   chan []byte
	pending atomic.Int64 // queued or being written
	dropped atomic.Uint64
}

func newDiagWriter(w io.Writer) *diagWriter {
	d := &diagWriter{lines: make(chan []byte, 1024)}
	go func() {
		for b := range d.lines {
			if n := d.dropped.Swap(0); n > 0 {
				fmt.Fprintf(w, "monolock: %d diagnostic lines dropped: stderr did not keep up\n", n)
			}
			w.Write(b)
			d.pending.Add(-1)
		}
	}()
	return d
}

// Write queues one line (a slog handler writes a record in one call).
func (d *diagWriter) Write(p []byte) (int, error) {
	d.pending.Add(1)
	select {
	case d.lines <- bytes.Clone(p):
	default:
		d.pending.Add(-1)
		d.dropped.Add(1)
	}
	return len(p), nil
}

// flush waits, at most bound, for the queued lines to be written.
func (d *diagWriter) flush(bound time.Duration) {
	for deadline := time.Now().Add(bound); d.pending.Load() > 0 && time.Now().Before(deadline); {
		time.Sleep(5 * time.Millisecond)
	}
}
