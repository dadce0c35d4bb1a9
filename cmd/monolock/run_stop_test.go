package main

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// stopped reports whether pid is a stopped process.
func stopped(pid int) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	s := string(b)
	fields := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	return len(fields) > 0 && fields[0] == "T"
}

// A stopped run sends no heartbeat: the lease would lapse and the lock go
// to another while COMMAND, in its own group, runs on.
func TestRunIgnoresTerminalStopSignals(t *testing.T) {
	s := start(t, nil)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	p := startRunIn(t, dir, "-addr", s.addr, "-lease", "1s", "tstp", "--", "sh", "-c", `echo started >> "$0"; sleep 30`, log)
	waitForFile(t, log, "started")
	for _, sig := range []syscall.Signal{syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU} {
		p.cmd.Process.Signal(sig)
	}
	time.Sleep(3 * time.Second) // three leases
	busy(t, s.addr, "tstp", "3s (three leases) after SIGTSTP, SIGTTIN and SIGTTOU to run")
	if stopped(p.cmd.Process.Pid) {
		t.Fatal("run was stopped by SIGTSTP, SIGTTIN or SIGTTOU")
	}
}

// A group that is stopped (by SIGTTIN when it reads the terminal, say)
// would keep a forwarded signal pending, and the lock, for ever.
func TestRunContinuesAStoppedGroupAfterForwardingASignal(t *testing.T) {
	s := start(t, nil)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	p := startRunIn(t, dir, "-addr", s.addr, "stopped", "--", "sh", "-c", `echo $$ > "$0.pid"; kill -STOP $$; sleep 30`, log)
	pid := pidFrom(t, log+".pid")
	for deadline := time.Now().Add(10 * time.Second); !stopped(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("COMMAND did not stop itself within 10s")
		}
	}
	p.cmd.Process.Signal(syscall.SIGTERM)
	if code := p.status(t, 10*time.Second); code != 128+int(syscall.SIGTERM) {
		t.Fatalf("exit %d after SIGTERM, want %d; %s", code, 128+int(syscall.SIGTERM), p.stderr.String())
	}
	if code, stderr := runSync(t, "-addr", s.addr, "-n", "stopped", "--", "true"); code != 0 {
		t.Fatalf("run -n exited %d after the first run ended: the lock is not free; %s", code, stderr)
	}
}

// A lost lock ends a stopped group too: its SIGTERM comes with a SIGCONT,
// so that the group does not sit stopped, the SIGTERM pending, until the
// SIGKILL at -grace (20s here).
func TestRunLostLockEndsAStoppedGroupBeforeTheGrace(t *testing.T) {
	s := start(t, nil)
	dir := t.TempDir()
	log := filepath.Join(dir, "log")
	p := startRunIn(t, dir, "-addr", s.addr, "-lease", "1s", "-grace", "20s", "lost-stopped", "--",
		"sh", "-c", `echo $$ > "$0.pid"; kill -STOP $$; sleep 30`, log)
	pid := pidFrom(t, log+".pid")
	for deadline := time.Now().Add(10 * time.Second); !stopped(pid); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("COMMAND did not stop itself within 10s")
		}
	}
	died := time.Now()
	s.cmd.Process.Signal(syscall.SIGKILL) // the server dies: the lock is lost
	if code := p.status(t, 40*time.Second); code != exitLost {
		t.Fatalf("exit %d, want %d; stderr: %s", code, exitLost, p.stderr.String())
	}
	if d := time.Since(died); d > 10*time.Second {
		t.Errorf("run ended %v after the server died, want well before the 20s grace: the stopped group was not continued", d.Round(time.Millisecond))
	}
}
