package main

import (
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"
)

// The README's TLS walkthrough runs as written, from the root of the
// clone, and writes nothing there: keys in the package's directory would
// travel into a vendor/ copy of it. Its port is moved by the environment
// (its commands give no address), so that it does not meet a server on
// 7070.
func TestREADMETLSWalkthroughRunsInAScratchDirectory(t *testing.T) {
	if _, err := exec.LookPath("openssl"); err != nil {
		t.Skip("no openssl")
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	var script string
	for _, m := range regexp.MustCompile("(?s)```sh\n(.*?)```").FindAllStringSubmatch(string(readme), -1) {
		if strings.Contains(m[1], "openssl req -x509") {
			script = m[1]
		}
	}
	if script == "" {
		t.Fatal("no walkthrough with openssl in the README")
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	root, _ := filepath.Abs("../..")
	before := listDir(t, root)
	output := filepath.Join(t.TempDir(), "output")
	f, err := os.Create(output)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	cmd := exec.Command("bash", "-c", script)
	cmd.Dir = root
	cmd.Env = append(os.Environ(), "TMPDIR="+t.TempDir(), "MONOLOCK_LISTEN_ADDRESS="+addr, "MONOLOCK_ADDRESS="+addr)
	// A file, not a pipe, so that a server the script left running cannot
	// hold the wait; and a group of its own, killed at the end.
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err = <-done:
	case <-time.After(60 * time.Second):
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		err = <-done
	}
	out, _ := os.ReadFile(output)
	if err != nil {
		t.Fatalf("the walkthrough failed: %v\n%s", err, out)
	}
	for _, want := range []string{"holding nightly/import", `not authorized for lock "deploy"`, "exit 65"} {
		if !strings.Contains(string(out), want) {
			t.Errorf("the walkthrough did not print %q:\n%s", want, out)
		}
	}
	time.Sleep(100 * time.Millisecond) // the server's exit after kill %1
	if after := listDir(t, root); !slices.Equal(before, after) {
		t.Fatalf("the walkthrough wrote into the clone's root: before %v, after %v", before, after)
	}
}

func listDir(t *testing.T, dir string) []string {
	t.Helper()
	entries, err := os.ReadDir(dir)
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, e := range entries {
		names = append(names, e.Name())
	}
	return names
}
