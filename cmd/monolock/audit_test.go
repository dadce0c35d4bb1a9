package main

import (
	"bytes"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// rssKiB is a process's resident memory.
func rssKiB(t *testing.T, pid int) int {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if f := strings.Fields(line); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	t.Fatal("no VmRSS")
	return 0
}

// cycles acquires and releases fresh locks from 4 clients until stop says so.
func cycles(t *testing.T, addr string, stop func() bool) int {
	t.Helper()
	var n atomic.Int64
	var wg sync.WaitGroup
	deadline := time.Now().Add(60 * time.Second)
	for w := range 4 {
		wg.Go(func() {
			for i := 0; !stop() && time.Now().Before(deadline); i++ {
				frame, _ := monolock.Frame{Type: monolock.TypeAcquire, LeaseMS: 60000, Name: fmt.Sprintf("cycle-%d-%d", w, i)}.AppendBinary(nil)
				c, err := net.DialTimeout("tcp", addr, 10*time.Second)
				if err != nil {
					t.Error(err)
					return
				}
				c.SetDeadline(time.Now().Add(10 * time.Second))
				c.Write(frame)
				f, err := monolock.ReadFrame(c)
				c.Close()
				if err != nil || f.Type != monolock.TypeAcquired {
					t.Errorf("cycle: %+v, %v", f, err)
					return
				}
				n.Add(1)
			}
		})
	}
	wg.Wait()
	if time.Now().After(deadline) {
		t.Fatal("the cycles did not reach their goal in 60s")
	}
	return int(n.Load())
}

// Issue 14, item 7: an audit sink that stopped reading costs a bounded
// queue and counted, reported lines; never memory without bound, nor a
// shutdown that does not end.
func TestStalledAuditSinkCostsBoundedMemoryAndCountedLines(t *testing.T) {
	r, w, err := os.Pipe() // nobody reads r
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	s := startWithStdout(t, w, nil, "-audit-log", "-", "-ops-listen", "127.0.0.1:0")
	w.Close()
	dropped := func() float64 {
		values, _ := metrics(t, s)
		return values["monolock_audit_dropped_total"]
	}
	var checks atomic.Int64
	n := cycles(t, s.addr, func() bool { return checks.Add(1)%200 == 0 && dropped() > 0 })
	// Then as many again: the queue is full, and stays so.
	rssFull := rssKiB(t, s.cmd.Process.Pid)
	var more atomic.Int64
	cycles(t, s.addr, func() bool { return more.Add(1) > int64(n) })
	rss := rssKiB(t, s.cmd.Process.Pid)
	values, _ := metrics(t, s)
	t.Logf("%d cycles to a full queue, RSS %d KiB; after %d more, RSS %d KiB, %v lines dropped, %v queued",
		n, rssFull, n, rss, values["monolock_audit_dropped_total"], values["monolock_audit_queued_lines"])
	if q := values["monolock_audit_queued_lines"]; q > auditQueueLines+1 || q < auditQueueLines/2 { // +1: the line in the blocked write
		t.Fatalf("%v lines queued, want at most (and about) %d", q, auditQueueLines)
	}
	if values["monolock_audit_dropped_total"] < float64(n) {
		t.Fatalf("%v lines dropped after %d more cycles, want at least %d", values["monolock_audit_dropped_total"], n, n)
	}
	if rss-rssFull > 20*1024 {
		t.Fatalf("RSS grew from %d to %d KiB with a full queue", rssFull, rss)
	}
	waitForLog(t, s, "AUDIT LOG LINES DROPPED")
	if c := strings.Count(s.log(), "AUDIT LOG LINES DROPPED"); c > 2 {
		t.Fatalf("%d reports of dropped lines: not bounded", c+1)
	}

	begin := time.Now()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(auditDrainBound + 15*time.Second):
		t.Fatalf("no exit %v after SIGTERM with a stalled audit sink; stderr:\n%s", time.Since(begin), s.log())
	}
	if s.cmd.ProcessState.ExitCode() != 1 || !strings.Contains(s.log(), "AUDIT LOG LINES LOST AT EXIT") {
		t.Fatalf("exit %d; want 1 and the lost lines said; stderr:\n%s", s.cmd.ProcessState.ExitCode(), s.log())
	}
	t.Logf("shutdown took %v", time.Since(begin))
}

// Issue 14, item 8: SIGHUP with a stalled audit FIFO does not block the
// signal loop: SIGTERM still ends the server, within the drain bound.
func TestReopenOfAStalledAuditSinkBlocksNoSignal(t *testing.T) {
	flags, stall := stalledAudit(t)
	s := start(t, nil, flags...)
	stall(s)
	s.cmd.Process.Signal(syscall.SIGHUP) // logrotate's postrotate
	time.Sleep(500 * time.Millisecond)
	s.cmd.Process.Signal(syscall.SIGHUP)
	time.Sleep(500 * time.Millisecond)
	begin := time.Now()
	s.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-s.done:
	case <-time.After(auditDrainBound + 15*time.Second):
		t.Fatalf("no exit %v after SIGTERM; stderr:\n%s", time.Since(begin), s.log())
	}
	if d := time.Since(begin); d < auditDrainBound-time.Second {
		t.Fatalf("exit %v after SIGTERM: the stalled sink did not stall, the test proves nothing", d)
	}
	for _, want := range []string{"reopening the audit log", "not starting another", "shutting down", "AUDIT LOG LINES LOST AT EXIT"} {
		if !strings.Contains(s.log(), want) {
			t.Fatalf("the server never said %q; stderr:\n%s", want, s.log())
		}
	}
}

// Issue 14, item 15: SIGHUP says what it reloaded.
func TestSIGHUPSaysWhatItReloaded(t *testing.T) {
	s := start(t, nil)
	s.cmd.Process.Signal(syscall.SIGHUP)
	waitForLog(t, s, "nothing to reload")
	path := t.TempDir() + "/audit.log"
	s2 := start(t, nil, "-audit-log", path)
	s2.cmd.Process.Signal(syscall.SIGHUP)
	waitForLog(t, s2, "reopening the audit log")
	waitForLog(t, s2, "audit log reopened")
	for _, s := range []*server{s, s2} {
		if strings.Contains(s.log(), "certificates") || strings.Contains(s.log(), "rules") {
			t.Fatalf("SIGHUP claims what was not reloaded:\n%s", s.log())
		}
	}
	setup := newTLSSetup(t, identityRules)
	s3 := start(t, nil, append(setup.flags(), "-audit-log", t.TempDir()+"/audit.log")...)
	s3.cmd.Process.Signal(syscall.SIGHUP)
	waitForLog(t, s3, "reloaded TLS certificate and key, client CA, rules")
	waitForLog(t, s3, "audit log reopened") // the TLS files and rules, and the audit log too
}

// A reader of -audit-log - that goes away costs write errors, not the server.
func TestAuditReaderThatGoesAwayCostsWriteErrors(t *testing.T) {
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	s := startWithStdout(t, w, nil, "-audit-log", "-", "-ops-listen", "127.0.0.1:0")
	w.Close()
	r.Close() // the reader is gone: writes meet EPIPE
	c, _ := rawAcquire(t, s.addr, "nobody-reads", time.Minute)
	c.Close()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(20 * time.Millisecond) {
		select {
		case err := <-s.done:
			t.Fatalf("the server died when the audit reader went away: %v; stderr:\n%s", err, s.log())
		default:
		}
		values, _ := metrics(t, s)
		if values["monolock_audit_write_errors_total"] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit write errors = %v, want 2", values["monolock_audit_write_errors_total"])
		}
	}
	waitForLog(t, s, "AUDIT LOG WRITE FAILED")
}

// The queue's other bound: 8 MiB of lines, whatever their number (plus the
// line being written). Long lines fill it long before 10,000 do, and each
// line that finds it full is dropped and counted.
func TestStalledAuditSinkQueuesAtMost8MiB(t *testing.T) {
	fifo, reader := fifoWithReader(t) // reads nothing yet
	a, err := openAudit(fifo, slog.New(slog.DiscardHandler))
	if err != nil {
		t.Fatal(err)
	}
	// Lines of a little more than 1 MiB: the first blocks in its write (a
	// pipe holds 64 KiB), the others queue.
	const n, line = 20, 1 << 20
	ev := monolock.Event{Type: monolock.EventGranted, Lock: strings.Repeat("x", line), Time: time.Now(), Token: 1}
	for range n {
		a.event(ev)
	}
	queued, dropped, bytes := a.queued.Load(), a.dropped.Load(), a.queuedBytes.Load()
	if bytes > auditQueueBytes+line+1024 || dropped == 0 || queued+int64(dropped) != n {
		t.Fatalf("after %d lines of 1 MiB: %d queued (%d bytes), %d dropped; want at most 8 MiB and a line queued, every other line dropped and counted",
			n, queued, bytes, dropped)
	}
	go io.Copy(io.Discard, reader) // the sink recovers
	a.beginClose(10 * time.Second)
	if lost := a.close(0); lost != int64(dropped) {
		t.Fatalf("close = %d lost, want the %d dropped", lost, dropped)
	}
}

// The reports of lost lines and of a stalled write, against the test's
// clock (the monitor reports once a second): the first loss of each kind
// is said at the next report, later ones at most once every 10 s, and a
// write blocked for 5 s is said, as often.
func TestAuditReportsAreBoundedAndSayAStall(t *testing.T) {
	var log bytes.Buffer
	a := &auditLog{path: "audit.log", logger: slog.New(slog.NewTextHandler(&log, nil))}
	var r auditReporter
	const failed, dropped, stalled = "AUDIT LOG WRITE FAILED", "AUDIT LOG LINES DROPPED", "AUDIT LOG STALLED"
	t0 := time.Now()
	at := func(d time.Duration, want ...string) {
		t.Helper()
		log.Reset()
		a.report(&r, t0.Add(d))
		for _, kind := range []string{failed, dropped, stalled} {
			lines := 0
			if slices.Contains(want, kind) {
				lines = 1
			}
			if said := strings.Count(log.String(), kind); said != lines {
				t.Errorf("at +%v: %d lines %q, want %d; log:\n%s", d, said, kind, lines, log.String())
			}
		}
	}
	at(0) // nothing lost, nothing blocked
	a.errors.Add(1)
	a.dropped.Add(1)
	at(time.Second, failed, dropped)
	for s := 2; s <= 10; s++ { // more of both, within 10 s of the reports
		a.errors.Add(1)
		a.dropped.Add(1)
		at(time.Duration(s) * time.Second)
	}
	at(11*time.Second, failed, dropped)
	at(25 * time.Second) // nothing new since
	a.writeBegan.Store(t0.Add(30 * time.Second).UnixNano())
	at(34 * time.Second)
	at(35*time.Second, stalled)
	for s := 36; s <= 44; s++ {
		at(time.Duration(s) * time.Second)
	}
	at(45*time.Second, stalled)
	a.writeBegan.Store(0) // the write returned
	at(60 * time.Second)
	// Each kind keeps a 10 s of its own: failures alone, a drop 3 s
	// later, then a failure every second, said again 10 s after the first.
	a.errors.Add(1)
	at(61*time.Second, failed)
	a.dropped.Add(1)
	at(64*time.Second, dropped)
	for s := 65; s <= 70; s++ {
		a.errors.Add(1)
		at(time.Duration(s) * time.Second)
	}
	at(71*time.Second, failed)
}
