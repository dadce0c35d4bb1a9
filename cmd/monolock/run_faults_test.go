package main

import (
	"errors"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// startRunIn is startRun with a working directory, so that a core dump of
// a process of COMMAND lands in a temporary directory.
func startRunIn(t *testing.T, dir string, args ...string) *runProc {
	t.Helper()
	p := &runProc{cmd: exec.Command(binary, append([]string{"run"}, args...)...), done: make(chan struct{})}
	p.cmd.Dir = dir
	p.cmd.Stderr = &p.stderr
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		p.cmd.Wait()
		close(p.done)
	}()
	t.Cleanup(func() { p.cmd.Process.Kill() })
	return p
}

func (p *runProc) running() bool {
	select {
	case <-p.done:
		return false
	default:
		return true
	}
}

// alive reports whether pid is a process that has not exited (a zombie has).
func alive(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] != "Z"
}

// pidFrom waits for path to hold a process id, and kills that process when
// the test ends.
func pidFrom(t *testing.T, path string) int {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(path)
		if pid, err := strconv.Atoi(strings.TrimSpace(string(b))); err == nil && strings.HasSuffix(string(b), "\n") {
			t.Cleanup(func() { syscall.Kill(pid, syscall.SIGKILL) })
			return pid
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s never held a process id: %q", path, b)
		}
	}
}

// busy checks that the lock is held by someone else: run -n gives up.
func busy(t *testing.T, addr, name, when string) {
	t.Helper()
	if code, stderr := runSync(t, "-addr", addr, "-n", name, "--", "true"); code != exitBusy {
		t.Fatalf("%s: run -n %s exited %d, want %d (busy): the lock was free; %s", when, name, code, exitBusy, stderr)
	}
}

// Issue 14, item 1: no signal that would end run lets it end while
// COMMAND runs on; the terminating ones reach COMMAND's group.
func TestRunSurvivesEverySignalWhileCommandRuns(t *testing.T) {
	s := start(t, nil)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	script := `for s in HUP QUIT USR1 USR2 INT; do trap "echo $s >> \"\$0\"" $s; done
trap 'echo TERM >> "$0"; exit 3' TERM
echo started >> "$0"; while :; do sleep 0.05; done`
	p := startRunIn(t, dir, "-addr", s.addr, "sig", "--", "sh", "-c", script, log)
	waitForFile(t, log, "started")
	for _, sig := range []syscall.Signal{syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2, syscall.SIGINT} {
		p.cmd.Process.Signal(sig)
		name := strings.TrimPrefix(strings.ToUpper(sigName(sig)), "SIG")
		waitForFile(t, log, name)
		if !p.running() {
			t.Fatalf("run ended on %v while COMMAND runs: exit %d; %s", sig, p.cmd.ProcessState.ExitCode(), p.stderr.String())
		}
		busy(t, s.addr, "sig", "after "+sig.String())
	}
	for _, sig := range append([]os.Signal{syscall.SIGPIPE, syscall.SIGABRT, syscall.SIGTRAP, syscall.SIGILL, syscall.SIGBUS,
		syscall.SIGFPE, syscall.SIGSEGV, syscall.SIGSYS, syscall.SIGALRM, syscall.SIGXCPU}, platformIgnoredSignals...) {
		p.cmd.Process.Signal(sig)
		time.Sleep(50 * time.Millisecond)
		if !p.running() {
			t.Fatalf("run ended on %v while COMMAND runs: exit %d; %s", sig, p.cmd.ProcessState.ExitCode(), p.stderr.String())
		}
	}
	busy(t, s.addr, "sig", "after the ignored signals")
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.status(t, 30*time.Second); code != 3 {
		t.Fatalf("exit %d after SIGTERM, want COMMAND's 3; %s", code, p.stderr.String())
	}
	b, _ := os.ReadFile(log)
	if strings.Contains(string(b), "PIPE") || !strings.Contains(string(b), "TERM") {
		t.Fatalf("COMMAND saw %q", b)
	}
}

func sigName(s syscall.Signal) string {
	return map[syscall.Signal]string{syscall.SIGHUP: "hup", syscall.SIGQUIT: "quit", syscall.SIGUSR1: "usr1",
		syscall.SIGUSR2: "usr2", syscall.SIGINT: "int"}[s]
}

// Issue 14, item 2: after a loss, SIGKILL comes after -grace even when
// COMMAND's first process has already gone.
func TestRunKillsTheGroupAfterGraceWhenTheFirstProcessExited(t *testing.T) {
	s := start(t, nil)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	script := `sh -c 'trap "" TERM; echo $$ > "$0.stubborn"; while :; do sleep 0.05; done' "$0" >/dev/null 2>&1 </dev/null &
trap 'exit 0' TERM; echo started >> "$0"; while :; do sleep 0.05; done`
	p := startRunIn(t, dir, "-addr", s.addr, "-lease", "1s", "-grace", "1s", "lost", "--", "sh", "-c", script, log)
	waitForFile(t, log, "started")
	stubborn := pidFrom(t, log+".stubborn")
	begin := time.Now()
	s.cmd.Process.Signal(syscall.SIGKILL) // the server dies: the lock is lost
	if code := p.status(t, 30*time.Second); code != exitLost {
		t.Fatalf("exit %d, want %d; %s", code, exitLost, p.stderr.String())
	}
	if alive(stubborn) {
		t.Fatalf("run exited %v after the loss while the process that ignores SIGTERM still runs: no SIGKILL after -grace 1s", time.Since(begin))
	}
	if d := time.Since(begin); d < 900*time.Millisecond {
		t.Fatalf("run exited %v after the loss, before -grace 1s", d)
	}
}

// Issue 14, item 3: the lock is held until every process of COMMAND's
// group has exited; a process that leaves the group with setsid is outside.
func TestRunHoldsTheLockUntilTheGroupIsGone(t *testing.T) {
	s := start(t, nil)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	script := `(sleep 1.5; echo done >> "$0") >/dev/null 2>&1 </dev/null & echo started >> "$0"; exit 0`
	p := startRunIn(t, dir, "-addr", s.addr, "bg", "--", "sh", "-c", script, log)
	waitForFile(t, log, "started")
	time.Sleep(300 * time.Millisecond) // sh has exited; its background job runs
	busy(t, s.addr, "bg", "while a background job of COMMAND runs")
	if code := p.status(t, 30*time.Second); code != 0 {
		t.Fatalf("exit %d, want 0; %s", code, p.stderr.String())
	}
	if b, _ := os.ReadFile(log); !strings.Contains(string(b), "done") {
		t.Fatalf("run exited before the background job ended: %q", b)
	}

	// The way out: setsid leaves the group, and the lock.
	script = `setsid sh -c 'echo $$ > "$0.escaped"; exec sleep 30' "$0" >/dev/null 2>&1 </dev/null & echo started >> "$0"; exit 0`
	log = filepath.Join(dir, "log2")
	p = startRunIn(t, dir, "-addr", s.addr, "bg", "--", "sh", "-c", script, log)
	escaped := pidFrom(t, log+".escaped")
	if code := p.status(t, 10*time.Second); code != 0 {
		t.Fatalf("exit %d, want 0; %s", code, p.stderr.String())
	}
	if !alive(escaped) {
		t.Fatal("the process that left the group is gone: the test proves nothing")
	}
}

// Issue 14, item 4: when run is killed, COMMAND dies with it (Linux).
func TestRunKilledTakesCommandWithIt(t *testing.T) {
	s := start(t, nil)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	p := startRunIn(t, dir, "-addr", s.addr, "orphan", "--", "sh", "-c", `echo $$ > "$0.pid"; while :; do sleep 0.05; done`, log)
	pid := pidFrom(t, log+".pid")
	p.cmd.Process.Signal(syscall.SIGKILL)
	for deadline := time.Now().Add(10 * time.Second); alive(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("COMMAND still runs 10s after run was killed, without the lock")
		}
	}
}

// fakeServer answers every ACQUIRE with frames.
func fakeServer(t *testing.T, frames ...monolock.Frame) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			t.Cleanup(func() { c.Close() })
			go func() {
				monolock.ReadFrame(c)
				for _, f := range frames {
					b, _ := f.AppendBinary(nil)
					c.Write(b)
				}
			}()
		}
	}()
	return l.Addr().String()
}

// Issue 14, item 5: an ERROR reason reaches the terminal escaped.
func TestRunEscapesServerText(t *testing.T) {
	hostile := "\x1b]0;owned\x07\x1b[2J\r\nmonolock run: all is well\u202e"
	check := func(what, stderr string) {
		t.Helper()
		if strings.Count(stderr, "\n") != 1 || strings.ContainsAny(strings.TrimSuffix(stderr, "\n"), "\x1b\x07\r\n\u202e") {
			t.Fatalf("%s: stderr carries the server's raw bytes: %q", what, stderr)
		}
		if !strings.Contains(stderr, `\x1b]0;owned`) {
			t.Fatalf("%s: the reason is not shown escaped: %q", what, stderr)
		}
	}
	addr := fakeServer(t, monolock.Frame{Type: monolock.TypeError, Code: monolock.CodeNotAuthorized, Reason: hostile})
	code, stderr := runSync(t, "-addr", addr, "x", "--", "true")
	if code != exitRefused {
		t.Fatalf("refused: exit %d, want %d; %q", code, exitRefused, stderr)
	}
	check("refused", stderr)

	addr = fakeServer(t, monolock.Frame{Type: monolock.TypeAcquired, Token: 7},
		monolock.Frame{Type: monolock.TypeError, Code: 0x02, Reason: hostile})
	code, stderr = runSync(t, "-addr", addr, "-grace", "100ms", "x", "--", "sleep", "30")
	if code != exitLost {
		t.Fatalf("lost: exit %d, want %d; %q", code, exitLost, stderr)
	}
	check("lost", stderr)
}

// Issue 14, item 6: an invalid lease exits 65, as the table says.
func TestRunInvalidLeaseExitStatus(t *testing.T) {
	for _, tc := range []struct{ lease, want string }{
		{"0", "at least 1ms"},
		{"-1s", "at least 1ms"},
		{"2000h", "longer than the protocol's maximum"},
		{"50000h", "longer than the protocol's maximum"},
		{"1500us", "whole number of milliseconds"},
	} {
		code, stderr := runSync(t, "-addr", "127.0.0.1:1", "-lease", tc.lease, "x", "--", "true")
		if code != exitRefused || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "-lease") ||
			!strings.Contains(stderr, tc.want) || tc.want != "at least 1ms" && strings.Contains(stderr, "positive") {
			t.Errorf("-lease %s: exit %d, %q; want %d and one line naming -lease and saying %q", tc.lease, code, stderr, exitRefused, tc.want)
		}
	}
}

// A loss is told before run exits, even when stderr is slow: the line is
// written off run's loop (a stalled stderr must not hold back the group's
// SIGKILL), and run waits for it, a second at most, before it exits. Here
// stderr is a pipe the test has filled, and drains only 300ms after the
// start, well after the group has ended. (The line used to be lost when
// run exited first: seen in CI as TestRunEscapesServerText's empty stderr.)
func TestRunTellsALossThroughASlowStderr(t *testing.T) {
	addr := fakeServer(t, monolock.Frame{Type: monolock.TypeAcquired, Token: 7},
		monolock.Frame{Type: monolock.TypeError, Code: 0x02, Reason: "closed by administrator"})
	r, w, err := os.Pipe()
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	w.SetWriteDeadline(time.Now().Add(100 * time.Millisecond))
	filled, _ := w.Write(make([]byte, 1<<20)) // until the pipe is full
	cmd := exec.Command(binary, "run", "-addr", addr, "-grace", "100ms", "x", "--", "sleep", "30")
	cmd.Stderr = w
	start := time.Now()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	w.Close()
	t.Cleanup(func() { cmd.Process.Kill() })
	time.Sleep(300 * time.Millisecond)
	rest := make(chan []byte, 1)
	go func() { b, _ := io.ReadAll(r); rest <- b }()
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	var exit *exec.ExitError
	if err := await(t, exited, "monolock run's exit after its loss"); !errors.As(err, &exit) || exit.ExitCode() != exitLost {
		t.Fatalf("exit %v after %v, want status %d", err, time.Since(start), exitLost)
	}
	b := await(t, rest, "the end of run's stderr")
	if told := string(b[min(filled, len(b)):]); !strings.Contains(told, `monolock run: lock "x" lost while sleep ran: `) {
		t.Errorf("stderr after the %d bytes that filled the pipe: %q; want the loss told", filled, told)
	}
}
