// Command monolock-conform checks an implementation of the monolock
// protocol, in any language, against the rules of docs/protocol.md; the
// client's rules, each with the check here that catches its breach, are in
// docs/clients.md.
//
//	monolock-conform server [-io-timeout 5s] ADDR
//	    black-box checks of the server at ADDR: every frame and error code,
//	    FIFO, push promotion, lease expiry, io-timeout, names as raw bytes,
//	    tokens. One line per check, then "N passed, M failed"; exit 1 on
//	    any failure.
//
//	monolock-conform client [-listen 127.0.0.1:7075] [-lease 2s]
//	    listens, and plays scripted server behaviours to the client under
//	    test, one per connection it makes, then reports what it did against
//	    the client rules. Point a client that acquires the lock "conform"
//	    with the given lease, and retries as DoRetry does, at the address.
package main

import (
	"fmt"
	"io"
	"os"
)

func main() {
	if len(os.Args) < 2 {
		usage()
	}
	switch os.Args[1] {
	case "server":
		os.Exit(serverMain(os.Args[2:], os.Stdout))
	case "client":
		os.Exit(clientMain(os.Args[2:], os.Stdout))
	}
	usage()
}

func usage() {
	fmt.Fprintln(os.Stderr, "usage: monolock-conform server [-io-timeout D] ADDR\n       monolock-conform client [-listen ADDR] [-lease D]")
	os.Exit(2)
}

// report prints one line per check and the tally.
type report struct {
	w              io.Writer
	passed, failed int
}

func (r *report) check(name string, err error) {
	if err != nil {
		r.failed++
		fmt.Fprintf(r.w, "FAIL  %s: %v\n", name, err)
		return
	}
	r.passed++
	fmt.Fprintf(r.w, "ok    %s\n", name)
}

func (r *report) done() int {
	fmt.Fprintf(r.w, "%d passed, %d failed\n", r.passed, r.failed)
	if r.failed > 0 {
		return 1
	}
	return 0
}
