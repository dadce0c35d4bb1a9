package main

import (
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// monolock reload is SIGHUP for images that have no kill command (FROM
// scratch): it signals the server, and nothing that is not monolock.
func TestReloadSubcommandSignalsOnlyTheServer(t *testing.T) {
	s := start(t, nil)
	code, stdout, stderr := runBinary(t, nil, "reload", "-pid", strconv.Itoa(s.cmd.Process.Pid))
	if code != 0 || !strings.Contains(stdout, "sent SIGHUP") || stderr != "" {
		t.Fatalf("reload of the server: exit %d, stdout %q, stderr %q", code, stdout, stderr)
	}
	waitForLog(t, s, "nothing to reload")

	other := exec.Command("sleep", "30") // SIGHUP would end it
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { other.Process.Kill(); other.Wait() })
	for _, pid := range []int{other.Process.Pid, 1} {
		code, _, stderr := runBinary(t, nil, "reload", "-pid", strconv.Itoa(pid))
		if code != 1 || !strings.Contains(stderr, "not signalling process "+strconv.Itoa(pid)) {
			t.Errorf("reload -pid %d (not monolock): exit %d, stderr %q; want 1 and a refusal", pid, code, stderr)
		}
	}
	time.Sleep(100 * time.Millisecond)
	if !alive(other.Process.Pid) {
		t.Fatal("reload signalled a process that is not monolock")
	}
	// Without -pid: process 1, the server of a FROM scratch image (here
	// not monolock, so not signalled).
	if code, _, stderr := runBinary(t, nil, "reload"); code != 1 || !strings.Contains(stderr, "not signalling process 1:") {
		t.Errorf("reload without -pid: exit %d, stderr %q; want 1 and a refusal to signal process 1", code, stderr)
	}
	if code, _, stderr := runBinary(t, nil, "reload", "-pid", "0"); code != 2 || !strings.Contains(stderr, "-pid") {
		t.Errorf("reload -pid 0: exit %d, stderr %q; want 2", code, stderr)
	}
}

// A server whose executable was replaced on disk since it started (an
// in-place upgrade) is not signalled, and the refusal says why, instead
// of sending the operator to look for another process.
func TestReloadSaysWhenTheServersExecutableWasReplaced(t *testing.T) {
	exe := filepath.Join(t.TempDir(), "monolock")
	b, err := os.ReadFile(binary)
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(exe, b, 0o755); err != nil {
		t.Fatal(err)
	}
	s := startExe(t, exe, nil, nil)
	if err := os.Remove(exe); err != nil {
		t.Fatal(err)
	}
	code, _, stderr := runBinary(t, nil, "reload", "-pid", strconv.Itoa(s.cmd.Process.Pid))
	if code != 1 || !strings.Contains(stderr, "was replaced or removed since it started") {
		t.Errorf("reload of a server whose executable was removed: exit %d, stderr %q; want 1 and the reason", code, stderr)
	}
}
