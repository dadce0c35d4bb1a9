package main

import (
	"bytes"
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// runProc is a `monolock run` in the background.
type runProc struct {
	cmd    *exec.Cmd
	stderr lockedBuffer
	done   chan struct{}
}

// lockedBuffer is what a process wrote, readable while it runs.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func startRun(t *testing.T, args ...string) *runProc {
	t.Helper()
	return startRunIn(t, "", args...)
}

// status waits for the exit status, for at most d.
func (p *runProc) status(t *testing.T, d time.Duration) int {
	t.Helper()
	select {
	case <-p.done:
		return p.cmd.ProcessState.ExitCode()
	case <-time.After(d):
		t.Fatalf("monolock run still running after %v; stderr:\n%s", d, p.stderr.String())
		return -1
	}
}

func runSync(t *testing.T, args ...string) (int, string) {
	t.Helper()
	p := startRun(t, args...)
	code := p.status(t, 30*time.Second)
	return code, p.stderr.String()
}

func waitForFile(t *testing.T, path, text string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(path)
		if strings.Contains(string(b), text) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never contained %q: %q", path, text, b)
		}
	}
}

func TestRunNeverOverlaps(t *testing.T) {
	s := start(t, nil)
	log := filepath.Join(t.TempDir(), "log")
	script := `echo "start $MONOLOCK_TOKEN $MONOLOCK_LOCK $MONOLOCK_ADDRESS" >> "$0"; sleep 0.1; echo "end $MONOLOCK_TOKEN" >> "$0"`
	var wg sync.WaitGroup
	for range 2 {
		wg.Go(func() {
			for range 3 {
				if code, stderr := runSync(t, "-addr", s.addr, "nightly", "--", "sh", "-c", script, log); code != 0 {
					t.Errorf("exit %d: %s", code, stderr)
				}
			}
		})
	}
	awaitFunc(t, "the end of six runs of 0.1s each", wg.Wait)
	b, _ := os.ReadFile(log)
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	if len(lines) != 12 {
		t.Fatalf("%d lines:\n%s", len(lines), b)
	}
	var last uint64
	for i := 0; i < len(lines); i += 2 {
		start, end := strings.Fields(lines[i]), strings.Fields(lines[i+1])
		if len(start) != 4 || start[0] != "start" || start[2] != "nightly" || start[3] != s.addr ||
			len(end) != 2 || end[0] != "end" || end[1] != start[1] {
			t.Fatalf("runs overlap or lack their environment:\n%s", b)
		}
		token, err := strconv.ParseUint(start[1], 10, 64)
		if err != nil || token <= last {
			t.Fatalf("token %s after %d:\n%s", start[1], last, b)
		}
		last = token
	}
}

func TestRunNonblockAndWait(t *testing.T) {
	s := start(t, nil)
	dial(t, s.addr, "busy") // held for the whole test
	begin := time.Now()
	if code, stderr := runSync(t, "-addr", s.addr, "-n", "busy", "--", "true"); code != exitBusy || !strings.Contains(stderr, "busy") {
		t.Fatalf("-n on a busy lock: exit %d, %q; want %d", code, stderr, exitBusy)
	}
	if code, _ := runSync(t, "-addr", s.addr, "-nonblock", "-E", "1", "busy", "--", "true"); code != 1 {
		t.Fatalf("-E 1: exit %d", code)
	}
	if d := time.Since(begin); d > 5*time.Second {
		t.Fatalf("-n took %v", d)
	}
	begin = time.Now()
	if code, _ := runSync(t, "-addr", s.addr, "-wait", "300ms", "busy", "--", "true"); code != exitTimeout {
		t.Fatalf("-wait: exit %d, want %d", code, exitTimeout)
	}
	if d := time.Since(begin); d < 300*time.Millisecond || d > 5*time.Second {
		t.Fatalf("-wait 300ms gave up after %v", d)
	}
	if code, _ := runSync(t, "-addr", s.addr, "-n", "free", "--", "true"); code != 0 {
		t.Fatalf("-n on a free lock: exit %d", code)
	}
}

func TestRunExitStatus(t *testing.T) {
	s := start(t, nil)
	for _, tc := range []struct {
		command []string
		want    int
	}{
		{[]string{"true"}, 0},
		{[]string{"sh", "-c", "exit 7"}, 7},
		{[]string{"sh", "-c", "kill -KILL $$"}, 128 + 9},
		{[]string{"/no/such/command"}, exitNotFound},
	} {
		args := append([]string{"-addr", s.addr, "status", "--"}, tc.command...)
		if code, stderr := runSync(t, args...); code != tc.want {
			t.Errorf("%v: exit %d, want %d; %s", tc.command, code, tc.want, stderr)
		}
	}
}

func TestRunRefusedAndUnreachable(t *testing.T) {
	s := start(t, nil)
	if code, _ := runSync(t, "-addr", s.addr, strings.Repeat("n", 300), "--", "true"); code != exitRefused {
		t.Errorf("300-byte name: exit %d, want %d", code, exitRefused)
	}
	// A server that refuses with a client error code: one attempt, no retry.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var conns atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			c.SetDeadline(time.Now().Add(wait))
			monolock.ReadFrame(c)
			b, _ := monolock.Frame{Type: monolock.TypeError, Code: monolock.CodeNotAuthorized, Reason: "not authorized for lock"}.AppendBinary(nil)
			c.Write(b)
			c.Close()
		}
	}()
	if code, stderr := runSync(t, "-addr", l.Addr().String(), "x", "--", "true"); code != exitRefused || conns.Load() != 1 {
		t.Errorf("0x18: exit %d after %d connections, want %d after one; %s", code, conns.Load(), exitRefused, stderr)
	}
	if code, stderr := runSync(t, "x"); code != exitUsage || strings.Count(stderr, "\n") != 1 {
		t.Errorf("no command: exit %d, %q", code, stderr)
	}
	if code, _ := runSync(t, "x", "-n", "--", "true"); code != exitUsage {
		t.Errorf("flag after NAME: exit %d", code)
	}
}

// Until the grant, run retries what may mend, as DoRetry does, and says the
// first reason once; -n makes one attempt; -wait ends the retries with the
// last attempt's reason.
func TestRunRetriesUntilTheServerAnswers(t *testing.T) {
	nobody := refused(t)
	retryLine := regexp.MustCompile(`(?m)^monolock run: lock "x" at ` + regexp.QuoteMeta(nobody) +
		` not acquired yet: .*connection refused; retrying \(until granted or -wait 1s\)$`)
	t.Run("nobody listening, -n", func(t *testing.T) {
		code, stderr := runSync(t, "-addr", nobody, "-n", "x", "--", "true")
		if code != exitUnreachable || !strings.Contains(stderr, "connection refused") || strings.Contains(stderr, "retrying") {
			t.Errorf("exit %d, want %d after one attempt; %s", code, exitUnreachable, stderr)
		}
	})
	t.Run("nobody listening, -wait 1s", func(t *testing.T) {
		code, stderr := runSync(t, "-addr", nobody, "-wait", "1s", "x", "--", "true")
		if code != exitTimeout || len(retryLine.FindAllString(stderr, -1)) != 1 ||
			!regexp.MustCompile(`not acquired: .*-wait ran out; the last attempt: .*connection refused\n`).MatchString(stderr) ||
			strings.Contains(stderr, "not granted after") {
			t.Errorf("exit %d, want %d, one retry line and the last attempt's reason; %s", code, exitTimeout, stderr)
		}
	})
	t.Run("a listener that closes its first connections, then serves", func(t *testing.T) {
		// What a balancer in front of a standby that takes over looks like.
		addr, cl := serveClosing(t, 3)
		code, stderr := runSync(t, "-addr", addr, "x", "--", "sh", "-c", `test "$MONOLOCK_LOCK" = x`)
		if code != 0 || cl.left.Load() >= 0 || strings.Count(stderr, "\n") != 1 ||
			!regexp.MustCompile(`^monolock run: lock "x" at .* not acquired yet: .*before any reply: .*; retrying \(no -wait: until granted or a signal\)\n$`).MatchString(stderr) {
			t.Errorf("exit %d, %d closes left; want 0 and one retry line; %s", code, max(cl.left.Load(), 0), stderr)
		}
	})
}

// serveClosing serves a monolock.Server on a closingListener that closes
// the first n connections it accepts.
func serveClosing(t *testing.T, n int32) (string, *closingListener) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	cl := &closingListener{Listener: l}
	cl.left.Store(n)
	srv := &monolock.Server{}
	go srv.Serve(cl)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String(), cl
}

// closingListener closes the connections it accepts while left is positive.
type closingListener struct {
	net.Listener
	left atomic.Int32
}

func (l *closingListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil || l.left.Add(-1) < 0 {
			return c, err
		}
		c.Close()
	}
}

func TestRunLostLockStopsTheCommand(t *testing.T) {
	for _, tc := range []struct {
		name   string
		script string
		grace  string
	}{
		{"SIGTERM", `trap 'echo TERM >> "$0"; exit 0' TERM; echo started >> "$0"; while :; do sleep 0.05; done`, "10s"},
		{"SIGKILL after the grace", `trap '' TERM; echo started >> "$0"; while :; do sleep 0.05; done`, "300ms"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := start(t, nil)
			log := filepath.Join(t.TempDir(), "log")
			p := startRun(t, "-addr", s.addr, "-lease", "1s", "-grace", tc.grace, "lost", "--", "sh", "-c", tc.script, log)
			waitForFile(t, log, "started")
			s.cmd.Process.Signal(syscall.SIGKILL) // the server dies
			if code := p.status(t, 30*time.Second); code != exitLost {
				t.Fatalf("exit %d, want %d; stderr: %s", code, exitLost, p.stderr.String())
			}
			if !strings.Contains(p.stderr.String(), "lost") {
				t.Errorf("stderr does not say the lock was lost: %q", p.stderr.String())
			}
			if tc.name == "SIGTERM" {
				waitForFile(t, log, "TERM")
			}
		})
	}
}

func TestRunForwardsSignals(t *testing.T) {
	s := start(t, nil)
	log := filepath.Join(t.TempDir(), "log")
	script := `trap 'echo INT >> "$0"; sleep 0.3; exit 3' INT; echo started >> "$0"; while :; do sleep 0.05; done`
	p := startRun(t, "-addr", s.addr, "fwd", "--", "sh", "-c", script, log)
	waitForFile(t, log, "started")
	p.cmd.Process.Signal(syscall.SIGINT)
	// The lock is held until the command exits: a waiter queues meanwhile.
	_, f := dial(t, s.addr, "fwd")
	if f.Type != monolock.TypeWaiting {
		t.Fatalf("waiter got %+v while the command winds down", f)
	}
	if code := p.status(t, 30*time.Second); code != 3 {
		t.Fatalf("exit %d, want the command's 3; stderr: %s", code, p.stderr.String())
	}
	waitForFile(t, log, "INT")
}

// Over TLS, run verifies the server with -tls-ca and presents -tls-cert;
// a server certificate that does not verify, or a server that refuses
// run's certificate, can never succeed: one attempt, exit 69, no retry.
func TestRunOverTLS(t *testing.T) {
	setup := newTLSSetup(t, identityRules)
	s := start(t, nil, setup.flags()...)
	serverCA := write(t, filepath.Join(setup.dir, "server-ca.pem"), setup.serverCA.pem())
	certPEM, keyPEM := setup.clientCA.leaf(t, leafOpts{cn: "cn-worker"})
	cert := write(t, filepath.Join(setup.dir, "worker.pem"), certPEM)
	key := write(t, filepath.Join(setup.dir, "worker-key.pem"), keyPEM)
	for _, tc := range []struct {
		name  string
		flags []string
		want  int
		says  string
	}{
		{"trusted both ways", []string{"-tls-ca", serverCA, "-tls-cert", cert, "-tls-key", key}, 0, ""},
		{"server certificate from another CA", []string{"-tls-ca", setup.caFile, "-tls-cert", cert, "-tls-key", key},
			exitUnreachable, "certificate signed by unknown authority"},
		{"no client certificate", []string{"-tls-ca", serverCA}, exitUnreachable, "certificate required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append(append([]string{"-addr", s.addr}, tc.flags...), "cn-job", "--", "sh", "-c", `test "$MONOLOCK_TOKEN" -gt 0`)
			code, stderr := runSync(t, args...)
			if code != tc.want || !strings.Contains(stderr, tc.says) || strings.Contains(stderr, "retrying") {
				t.Errorf("exit %d, want %d saying %q without a retry; %s", code, tc.want, tc.says, stderr)
			}
		})
	}
}

// scriptedServer answers the n-th connection (from 0) with answer(n): a
// close before any reply when it returns 0, else an ERROR with that code.
func scriptedServer(t *testing.T, answer func(n int32) monolock.Code) (string, *atomic.Int32) {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	var conns atomic.Int32
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			code := answer(conns.Add(1) - 1)
			c.SetDeadline(time.Now().Add(wait))
			monolock.ReadFrame(c)
			if code != 0 {
				b, _ := monolock.Frame{Type: monolock.TypeError, Code: code, Reason: "scripted"}.AppendBinary(nil)
				c.Write(b)
			}
			c.Close()
		}
	}()
	return l.Addr().String(), &conns
}

// The final line gives the reason of the attempt that ended the retries,
// and only when -wait (or a signal) ended them does it add the last
// retried attempt's reason: a refusal after a retry is that refusal, not
// "the last attempt: <the retried one>".
func TestRunRefusalAfterARetrySaysOnlyTheRefusal(t *testing.T) {
	addr, conns := scriptedServer(t, func(n int32) monolock.Code {
		if n == 0 {
			return 0 // closed before any reply: retried
		}
		return monolock.CodeNotAuthorized
	})
	code, stderr := runSync(t, "-addr", addr, "x", "--", "true")
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	final := lines[len(lines)-1]
	if code != exitRefused || conns.Load() != 2 || !strings.Contains(final, "scripted") ||
		strings.Contains(final, "the last attempt") || strings.Contains(final, "before any reply") {
		t.Errorf("exit %d after %d connections, want %d after 2 with the refusal alone on the final line; stderr:\n%s",
			code, conns.Load(), exitRefused, stderr)
	}
}

// -wait that ends while run is queued behind a holder (the server came
// back after a first attempt closed before any reply) is not said to be
// the retried attempt's fault: the last attempt waited in the queue.
func TestRunWaitEndedInTheQueueAfterARetry(t *testing.T) {
	addr, cl := serveClosing(t, 0)
	holder, err := monolock.New(monolock.Config{Address: addr}).Acquire(context.Background(), "x", time.Minute)
	if err != nil {
		t.Fatal(err)
	}
	defer holder.Release()
	cl.left.Store(1) // run's first connection is closed before any reply
	code, stderr := runSync(t, "-addr", addr, "-wait", "1500ms", "x", "--", "true")
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	final := lines[len(lines)-1]
	if code != exitTimeout || cl.left.Load() >= 0 || strings.Contains(final, "before any reply") ||
		!strings.Contains(stderr, "not granted after 1s") {
		t.Errorf("exit %d (want %d), %d closes left; want the final line not to blame the retried attempt, since run then waited in the queue, and the waiting line:\n%s",
			code, exitTimeout, max(cl.left.Load(), 0), stderr)
	}
}

// With -n, a server condition (a code below 0x10) is no refusal: run's one
// attempt could not get the lock, exit 69 as for a connection that ended
// before the grant, not 65.
func TestRunOneAttemptEndedByAServerConditionIsUnreachable(t *testing.T) {
	for _, code := range []monolock.Code{monolock.CodeShuttingDown, monolock.CodeClosedByAdmin} {
		addr, conns := scriptedServer(t, func(int32) monolock.Code { return code })
		if got, stderr := runSync(t, "-addr", addr, "-n", "x", "--", "true"); got != exitUnreachable || conns.Load() != 1 {
			t.Errorf("-n and ERROR 0x%02x: exit %d after %d connections, want %d after one; stderr:\n%s",
				uint8(code), got, conns.Load(), exitUnreachable, stderr)
		}
	}
}

// An address that can never be dialled is bad input: run says so and
// ends, as it did before it retried, instead of retrying it until -wait
// (or forever without -wait). No port: net's "missing port in address".
// No host with -tls-ca and no -tls-server-name: crypto/tls's "either
// ServerName or InsecureSkipVerify must be specified", found before a
// byte is sent, on every attempt.
func TestRunAddressThatCanNeverBeDialledIsNotRetried(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	go func() { // accepts and holds, as a server would
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			defer c.Close()
		}
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	setup := newTLSSetup(t, identityRules)
	for _, tc := range []struct {
		name  string
		flags []string
	}{
		{"no port", []string{"-addr", "127.0.0.1"}},
		{"no host, TLS without -tls-server-name", []string{"-addr", ":" + port, "-tls-ca", setup.caFile}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			code, stderr := runSync(t, append(tc.flags, "-wait", "3s", "x", "--", "true")...)
			if code != exitUsage || strings.Contains(stderr, "retrying") || time.Since(start) > 2*time.Second {
				t.Errorf("exit %d after %v; retried though it can never succeed:\n%s", code, time.Since(start).Round(time.Millisecond), stderr)
			}
		})
	}
}
