package main

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

var binary string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "monolock-bin")
	if err != nil {
		panic(err)
	}
	binary = filepath.Join(dir, "monolock")
	if out, err := exec.Command("go", "build", "-o", binary, ".").CombinedOutput(); err != nil {
		os.Stderr.Write(out)
		panic(err)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// server is the binary running in the background.
type server struct {
	cmd        *exec.Cmd
	addr       string // protocol
	ops, admin string // HTTP, when asked for
	done       chan error

	mu     sync.Mutex
	stderr bytes.Buffer // what it said on stderr
}

func (s *server) log() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.stderr.String()
}

// takeLog reports whether the log has text, and drops the log up to the
// end of the line with the text, so that the next call sees only news.
func (s *server) takeLog(text string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	log := s.stderr.String()
	i := strings.Index(log, text)
	if i < 0 {
		return false
	}
	if nl := strings.IndexByte(log[i:], '\n'); nl >= 0 {
		i += nl + 1
	} else {
		i = len(log)
	}
	s.stderr.Next(i)
	return true
}

// servingRE matches the text and the JSON forms of the "serving" lines.
var servingRE = regexp.MustCompile(`msg"?[=:]"?(serving|"serving (ops|admin) HTTP")"?,? ?"?listen"?[=:]"?([0-9.:]+)`)

// noteAddress keeps the address a "serving" line of the server gives.
func (s *server) noteAddress(line string) {
	switch m := servingRE.FindStringSubmatch(line); {
	case m == nil:
	case m[2] == "ops":
		s.ops = m[3]
	case m[2] == "admin":
		s.admin = m[3]
	default:
		s.addr = m[3]
	}
}

func start(t testing.TB, env []string, args ...string) *server {
	t.Helper()
	return startWithStdout(t, nil, env, args...)
}

// startWithStdout is start with the server's stdout on a file of the test.
func startWithStdout(t testing.TB, stdout *os.File, env []string, args ...string) *server {
	t.Helper()
	return startExe(t, binary, stdout, env, args...)
}

// startExe is startWithStdout with exe, which must exec the binary, in its
// place: a shell script that sets a limit first.
func startExe(t testing.TB, exe string, stdout *os.File, env []string, args ...string) *server {
	t.Helper()
	cmd := exec.Command(exe, append([]string{"-listen", "127.0.0.1:0"}, args...)...)
	cmd.Env = append(os.Environ(), env...)
	if stdout != nil {
		cmd.Stdout = stdout
	}
	pipe, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	s := &server{cmd: cmd, done: make(chan error, 1)}
	lines := bufio.NewScanner(pipe)
	silent := killAfter(cmd)
	defer silent.Stop()
	for s.addr == "" && lines.Scan() {
		s.stderr.WriteString(lines.Text() + "\n")
		s.noteAddress(lines.Text())
	}
	if s.addr == "" {
		cmd.Process.Kill()
		t.Fatalf("the server never said where it listens (killed after %v):\n%s", wait, s.stderr.String())
	}
	go func() {
		for lines.Scan() {
			s.mu.Lock()
			s.stderr.WriteString(lines.Text() + "\n")
			s.mu.Unlock()
		}
		s.done <- cmd.Wait()
	}()
	t.Cleanup(func() { cmd.Process.Kill() })
	return s
}

func (s *server) exitCode(t *testing.T) int {
	t.Helper()
	select {
	case err := <-s.done:
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return ee.ExitCode()
		}
		if err != nil {
			t.Fatal(err)
		}
		return 0
	case <-time.After(10 * time.Second):
		t.Fatal("the server did not exit")
		return -1
	}
}

func dial(t *testing.T, addr, name string) (net.Conn, monolock.Frame) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	b, _ := monolock.Frame{Type: monolock.TypeAcquire, LeaseMS: 60000, Name: name}.AppendBinary(nil)
	c.Write(b)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := monolock.ReadFrame(c)
	if err != nil {
		t.Fatal(err)
	}
	return c, f
}

func TestServeHandoverAndGracefulShutdown(t *testing.T) {
	s := start(t, nil)
	holder, f := dial(t, s.addr, "deploy")
	if f.Type != monolock.TypeAcquired {
		t.Fatalf("holder got %+v", f)
	}
	waiter, f := dial(t, s.addr, "deploy")
	if f.Type != monolock.TypeWaiting {
		t.Fatalf("waiter got %+v", f)
	}
	holder.Close()
	waiter.SetReadDeadline(time.Now().Add(wait))
	if f, err := monolock.ReadFrame(waiter); err != nil || f.Type != monolock.TypeAcquired {
		t.Fatalf("waiter got %+v, %v after the holder closed; want the pushed ACQUIRED", f, err)
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	waiter.SetReadDeadline(time.Now().Add(wait))
	f, err := monolock.ReadFrame(waiter)
	if err != nil || f.Type != monolock.TypeError || f.Code != monolock.CodeShuttingDown {
		t.Fatalf("holder got %+v, %v at shutdown", f, err)
	}
	if code := s.exitCode(t); code != 0 {
		t.Fatalf("exit status %d after SIGTERM, want 0; stderr:\n%s", code, s.log())
	}
}

func TestSecondSignalExitsAtOnce(t *testing.T) {
	flags, stall := stalledAudit(t)
	s := start(t, nil, flags...)
	stall(s)
	s.cmd.Process.Signal(syscall.SIGTERM)
	time.Sleep(200 * time.Millisecond)
	s.cmd.Process.Signal(syscall.SIGINT)
	if code := s.exitCode(t); code != 1 {
		t.Fatalf("exit status %d after a second signal, want 1", code)
	}
}

// runBinary runs the binary to its end and returns its status and output.
func runBinary(t *testing.T, env []string, args ...string) (int, string, string) {
	t.Helper()
	cmd := exec.Command(binary, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	done := make(chan error, 1)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { done <- cmd.Wait() }()
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		cmd.Process.Kill()
		t.Fatalf("monolock %v did not exit", args)
	}
	return cmd.ProcessState.ExitCode(), stdout.String(), stderr.String()
}

func TestFlagsAndEnvironment(t *testing.T) {
	run := func(env []string, args ...string) (int, string, string) { return runBinary(t, env, args...) }

	code, out, _ := run(nil, "-h")
	if code != 0 {
		t.Errorf("-h exited %d", code)
	}
	for _, want := range []string{"-listen", "MONOLOCK_LISTEN_ADDRESS", "127.0.0.1:7070", "-io-timeout",
		"MONOLOCK_IO_TIMEOUT", "5s", "-log-level", "MONOLOCK_LOG_LEVEL", "-log-format", "MONOLOCK_LOG_FORMAT"} {
		if !strings.Contains(out, want) {
			t.Errorf("-h does not mention %s:\n%s", want, out)
		}
	}

	for _, tc := range []struct {
		env  []string
		args []string
		want string
	}{
		{nil, []string{"-io-timeout", "soon"}, "-io-timeout"},
		{nil, []string{"-io-timeout", "0s"}, "-io-timeout must be positive"},
		{nil, []string{"-log-level", "loud"}, "-log-level"},
		{nil, []string{"-log-format", "xml"}, "-log-format"},
		{nil, []string{"-no-such-flag"}, "no-such-flag"},
		{nil, []string{"stray"}, "stray"},
		{[]string{"MONOLOCK_IO_TIMEOUT=soon"}, nil, "MONOLOCK_IO_TIMEOUT"},
		{[]string{"MONOLOCK_LOG_FORMAT=xml"}, nil, "MONOLOCK_LOG_FORMAT"},
	} {
		code, _, stderr := run(tc.env, tc.args...)
		if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, tc.want) {
			t.Errorf("env %v args %v: exit %d, stderr %q; want 2 and one line naming %s", tc.env, tc.args, code, stderr, tc.want)
		}
	}

	// A flag beats its variable, which beats the default.
	s := start(t, []string{"MONOLOCK_LOG_FORMAT=json", "MONOLOCK_IO_TIMEOUT=250ms"})
	c, err := net.DialTimeout("tcp", s.addr, wait)
	if err != nil {
		t.Fatal(err)
	}
	begin := time.Now()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadAll(c); err != nil || time.Since(begin) > 4*time.Second {
		t.Errorf("silent connection closed after %v (%v), want the 250ms io-timeout from the environment", time.Since(begin), err)
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.exitCode(t)
	if !strings.HasPrefix(s.log(), "{") {
		t.Errorf("MONOLOCK_LOG_FORMAT=json gave %q", s.log())
	}
	s = start(t, []string{"MONOLOCK_LOG_FORMAT=json", "MONOLOCK_LISTEN_ADDRESS=256.0.0.1:1"}, "-log-format", "text")
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.exitCode(t)
	if !strings.HasPrefix(s.log(), "time=") {
		t.Errorf("-log-format text did not beat the environment: %q", s.log())
	}
}

// stalledAudit returns the flags that make the server's audit log a FIFO
// that nobody reads, and a function that writes more audit lines than the
// pipe holds. After it, a graceful shutdown takes the whole bound it gives
// the audit writer (auditDrainBound), and then reports lost lines. (A client that never reads is no
// such proof here: on loopback, TCP can stall a flood of heartbeats with
// the server idle in a read, and then the shutdown finishes at once.)
func stalledAudit(t *testing.T) (flags []string, stall func(*server)) {
	t.Helper()
	// The reader opens first, so that the server's open does not wait.
	fifo, reader := fifoWithReader(t)
	const getPipeSize = 1032 // F_GETPIPE_SZ
	capacity, _, errno := syscall.Syscall(syscall.SYS_FCNTL, reader.Fd(), getPipeSize, 0)
	if errno != 0 {
		t.Fatal(errno)
	}
	return []string{"-audit-log", fifo}, func(s *server) {
		// A granted line is longer than 100 bytes, and it is queued before
		// the client is told ACQUIRED.
		for i := 0; i <= int(capacity)/100; i++ {
			c, f := dial(t, s.addr, fmt.Sprintf("audit-filler-%d", i))
			if f.Type != monolock.TypeAcquired {
				t.Fatalf("filler %d got %+v", i, f)
			}
			c.Close()
		}
	}
}

// Each variable of the flags table sets what its flag would, each flag
// beats its variable, and without either the default holds: /api/info's
// config is the configuration in effect, and the server behaves by it.
// (-listen and its variable: TestFlagsAndEnvironment, the walkthrough.)
func TestEachVariableIsBetweenItsFlagAndTheDefault(t *testing.T) {
	setup := newTLSSetup(t, `{"rules":[{"identity":"cn-worker","locks":["env-*"]}]}`)
	client := setup.clientConfig(t, setup.clientCA, leafOpts{cn: "cn-worker"})
	auditEnv, auditFlag := filepath.Join(setup.dir, "audit-env.log"), filepath.Join(setup.dir, "audit-flag.log")
	env := []string{
		"MONOLOCK_OPS_LISTEN_ADDRESS=127.0.0.1:0", "MONOLOCK_ADMIN_LISTEN_ADDRESS=127.0.0.1:0",
		"MONOLOCK_IO_TIMEOUT=3s", "MONOLOCK_LOG_LEVEL=debug", "MONOLOCK_LOG_FORMAT=json",
		"MONOLOCK_AUDIT_LOG=" + auditEnv, "MONOLOCK_TLS_CERT=" + setup.cert, "MONOLOCK_TLS_KEY=" + setup.key,
		"MONOLOCK_TLS_CLIENT_CA=" + setup.caFile, "MONOLOCK_ACL_FILE=" + setup.acl,
	}
	checkConfig := func(what string, s *server, want map[string]any) {
		t.Helper()
		if s.admin == "" {
			t.Fatalf("%s: no admin API; stderr:\n%s", what, s.log())
		}
		code, body := httpGet(t, "http://"+s.admin+"/api/info")
		if code != 200 {
			t.Fatalf("%s: /api/info: %d %s", what, code, body)
		}
		config, _ := decodeJSON(t, body)["config"].(map[string]any)
		for name, v := range want {
			if got := fmt.Sprint(config[name]); got != fmt.Sprint(v) {
				t.Errorf("%s: config.%s = %s, want %v", what, name, got, v)
			}
		}
	}
	acquire := func(what string, s *server, name string, want byte) {
		t.Helper()
		f, conn, err := tlsAcquire(t, s.addr, client, name)
		if err != nil || f.Type != want {
			t.Fatalf("%s: ACQUIRE %s over mutual TLS: %+v, %v; want type 0x%02x", what, name, f, err, want)
		}
		conn.Close()
	}

	s := start(t, env)
	if s.ops == "" {
		t.Errorf("the variables alone: no ops server; stderr:\n%s", s.log())
	}
	checkConfig("the variables alone", s, map[string]any{
		"ops_listen": "127.0.0.1:0", "admin_listen": "127.0.0.1:0", "io_timeout_ms": 3000,
		"log_level": "debug", "log_format": "json", "audit_log": auditEnv,
		"tls": true, "mtls": true, "acl_file": setup.acl})
	acquire("the variables alone", s, "env-a", monolock.TypeAcquired) // TLS, client CA and rules in effect
	acquire("the variables alone", s, "other", monolock.TypeError)
	waitForAuditLines(t, auditEnv, 1)
	waitForLog(t, s, `"level":"DEBUG","msg":"session ended"`)

	s = start(t, env, "-ops-listen=", "-io-timeout", "4s", "-log-level", "info", "-log-format", "text",
		"-audit-log", auditFlag, "-acl-file=")
	if s.ops != "" {
		t.Errorf("-ops-listen= did not beat MONOLOCK_OPS_LISTEN_ADDRESS: ops on %s", s.ops)
	}
	checkConfig("flags beside the variables", s, map[string]any{
		"ops_listen": "", "admin_listen": "127.0.0.1:0", "io_timeout_ms": 4000,
		"log_level": "info", "log_format": "text", "audit_log": auditFlag,
		"tls": true, "mtls": true, "acl_file": ""})
	acquire("flags beside the variables", s, "other", monolock.TypeAcquired) // no rules
	waitForAuditLines(t, auditFlag, 1)
	if !strings.HasPrefix(s.log(), "time=") {
		t.Errorf("-log-format text did not beat MONOLOCK_LOG_FORMAT=json:\n%s", s.log())
	}

	s = start(t, nil, "-admin-listen", "127.0.0.1:0")
	checkConfig("the defaults", s, map[string]any{
		"ops_listen": "", "io_timeout_ms": 5000, "log_level": "info", "log_format": "text",
		"audit_log": "", "tls": false, "mtls": false, "acl_file": ""})
}

// refused returns an address that refuses connections: a socket bound and
// never listening. A closed listener's port would be free for the next
// listener of a test running beside this one, which would then answer.
func refused(t *testing.T) string {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, 0)
	if err != nil {
		t.Fatal(err)
	}
	syscall.CloseOnExec(fd)
	t.Cleanup(func() { syscall.Close(fd) })
	if err := syscall.Bind(fd, &syscall.SockaddrInet4{Addr: [4]byte{127, 0, 0, 1}}); err != nil {
		t.Fatal(err)
	}
	sa, err := syscall.Getsockname(fd)
	if err != nil {
		t.Fatal(err)
	}
	return fmt.Sprintf("127.0.0.1:%d", sa.(*syscall.SockaddrInet4).Port)
}
