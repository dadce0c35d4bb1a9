package main

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"testing"
	"time"
	"unsafe"

	"github.com/monolock-dev/monolock"
)

// pipeHolds is how many bytes wait in the pipe of r.
func pipeHolds(r *os.File) int {
	var n int32
	syscall.Syscall(syscall.SYS_IOCTL, r.Fd(), syscall.TIOCINQ, uintptr(unsafe.Pointer(&n)))
	return int(n)
}

// smallPipe is a pipe that holds 4 KiB, for a stderr nobody reads.
func smallPipe(t *testing.T) (r, w *os.File) {
	t.Helper()
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { r.Close() })
	const fSetPipeSz = 1031
	if _, _, e := syscall.Syscall(syscall.SYS_FCNTL, w.Fd(), fSetPipeSz, 4096); e != 0 {
		t.Fatalf("F_SETPIPE_SZ: %v", e)
	}
	return r, w
}

// stalledStderrServer starts the server with a stderr that nobody reads
// and fills it, with SIGHUPs that each log a line, until a write would
// block.
func stalledStderrServer(t *testing.T) (*exec.Cmd, chan error) {
	t.Helper()
	r, w := smallPipe(t)
	cmd := exec.Command(binary, "-listen", "127.0.0.1:0")
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { cmd.Process.Kill() })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()

	// "serving" comes after the signal handlers are in place.
	for deadline := time.Now().Add(10 * time.Second); pipeHolds(r) == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("the server wrote nothing on stderr for 10s")
		}
	}
	time.Sleep(100 * time.Millisecond)
	b := make([]byte, pipeHolds(r))
	if n, _ := r.Read(b); !strings.Contains(string(b[:n]), "msg=serving") {
		t.Fatalf("the server's first lines are not serving: %q", b[:n])
	}

	// Each SIGHUP logs a line (nothing to reload) until the pipe is full
	// and a write blocks.
	for deadline := time.Now().Add(20 * time.Second); pipeHolds(r) < 4096-200; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("stderr's pipe holds only %d bytes after 20s of SIGHUPs", pipeHolds(r))
		}
		cmd.Process.Signal(syscall.SIGHUP)
	}
	for range 5 { // the line that does not fit
		cmd.Process.Signal(syscall.SIGHUP)
		time.Sleep(20 * time.Millisecond)
	}

	return cmd, done
}

// A stderr nobody reads must not keep a signal from ending the server: the
// diagnostics queue and are dropped, counted, when stderr does not keep up.
func TestSignalsEndTheServerWhenStderrIsStalled(t *testing.T) {
	t.Run("one SIGTERM shuts down", func(t *testing.T) {
		cmd, done := stalledStderrServer(t)
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if code := cmd.ProcessState.ExitCode(); code != 0 {
				t.Fatalf("exit status %d (%v) after SIGTERM with a stalled stderr, want 0", code, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the server still runs 10s after SIGTERM, its stderr stalled")
		}
	})
	t.Run("a second SIGTERM exits at once", func(t *testing.T) {
		cmd, done := stalledStderrServer(t)
		cmd.Process.Signal(syscall.SIGTERM)
		time.Sleep(500 * time.Millisecond) // two at once may arrive as one
		cmd.Process.Signal(syscall.SIGTERM)
		select {
		case err := <-done:
			if code := cmd.ProcessState.ExitCode(); code != 1 && code != 0 {
				t.Fatalf("exit status %d (%v) after two SIGTERMs with a stalled stderr, want 1 (or 0 if the first won)", code, err)
			}
		case <-time.After(10 * time.Second):
			t.Fatal("the server still runs 10s after a second SIGTERM, its stderr stalled")
		}
	})
}

// A diagnostic line that finds the queue full (1,024 lines behind a
// stalled stderr) is dropped, and the next line written says how many
// were: here the debug lines of many sessions that end while nobody reads
// stderr.
func TestDroppedDiagnosticLinesAreCounted(t *testing.T) {
	r, w := smallPipe(t)
	cmd := exec.Command(binary, "-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0", "-log-level", "debug")
	cmd.Stderr = w
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { cmd.Process.Kill(); cmd.Wait() })
	silent := killAfter(cmd)

	// Read up to the "serving" line, for the addresses; then nobody reads.
	lines := bufio.NewReader(r)
	var s server
	for s.addr == "" {
		line, err := lines.ReadString('\n')
		if err != nil {
			t.Fatalf("the server never said where it listens: %v", err)
		}
		s.noteAddress(line)
	}
	addr, admin := s.addr, s.admin
	silent.Stop()
	sessions := 1500 // each logs "session ended" as it ends: more than the queue and the pipe hold
	for i := range sessions {
		c, f := dial(t, addr, fmt.Sprintf("line-%d", i))
		if f.Type != monolock.TypeAcquired {
			t.Fatalf("session %d got %+v", i, f)
		}
		c.Close()
	}
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		_, body := httpGet(t, "http://"+admin+"/api/info")
		if fmt.Sprint(decodeJSON(t, body)["connections"]) == "0" {
			break // every session has ended, and tried its line
		}
		if time.Now().After(deadline) {
			t.Fatalf("sessions still open 10s after the last was closed: %s", body)
		}
	}

	found := make(chan string, 1)
	go func() {
		for {
			line, err := lines.ReadString('\n')
			if strings.Contains(line, "diagnostic lines dropped") || err != nil {
				found <- line
				return
			}
		}
	}()
	select {
	case line := <-found:
		// Of the 1,500 lines, 1,024 queue and one is being written; the
		// 4 KiB pipe holds a few dozen: about 440 are dropped.
		var n int
		if _, err := fmt.Sscanf(line, "monolock: %d diagnostic lines dropped", &n); err != nil || n < 300 || n > sessions-1024 {
			t.Fatalf("stderr says %q; want how many lines were dropped, between 300 and %d", line, sessions-1024)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no line on stderr says how many were dropped, 10s after it was read again")
	}
	// The count starts again: one more session's line comes alone.
	c, _ := dial(t, addr, "after")
	c.Close()
	r.SetReadDeadline(time.Now().Add(10 * time.Second))
	for {
		line, err := lines.ReadString('\n')
		if strings.Contains(line, "diagnostic lines dropped") {
			t.Fatalf("a second count of dropped lines, with nothing dropped since: %q", line)
		}
		if strings.Contains(line, "lock=after") {
			break
		}
		if err != nil {
			t.Fatalf("no line for the session after the drops within 10s (%v)", err)
		}
	}
}
