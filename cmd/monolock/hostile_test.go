package main

import (
	"bufio"
	"net"
	"os"
	"os/exec"
	"regexp"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// cpuTicks returns the user and system CPU a process has used, in ticks.
func cpuTicks(t *testing.T, pid int) int {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		t.Skip("no /proc")
	}
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	u, _ := strconv.Atoi(f[11])
	s, _ := strconv.Atoi(f[12])
	return u + s
}

// Under a low descriptor limit, accept fails with EMFILE: the server
// backs off instead of spinning or exiting, counts the errors, and serves
// again as soon as descriptors are free.
func TestDescriptorExhaustion(t *testing.T) {
	cmd := exec.Command("sh", "-c", `ulimit -n 32 && exec "$0" -listen 127.0.0.1:0 -ops-listen 127.0.0.1:0`, binary)
	pipe, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer cmd.Process.Kill()
	lines := bufio.NewScanner(pipe)
	var addr, ops string
	re := regexp.MustCompile(`msg="?(serving|serving ops HTTP)"? listen=(\S+)`)
	silent := killAfter(cmd)
	for addr == "" && lines.Scan() {
		if m := re.FindStringSubmatch(lines.Text()); m != nil {
			if m[1] == "serving" {
				addr = m[2]
			} else {
				ops = m[2]
			}
		}
	}
	silent.Stop()
	if addr == "" {
		t.Fatalf("the server did not say where it listens within %v", wait)
	}
	logged := make(chan string, 1000)
	go func() {
		for lines.Scan() {
			logged <- lines.Text()
		}
	}()

	// More clients than descriptors: the kernel completes their handshakes,
	// the server cannot accept them all.
	var conns []net.Conn
	var granted, stuck []net.Conn
	for i := range 40 {
		c, err := net.DialTimeout("tcp", addr, 10*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		b, _ := monolock.Frame{Type: monolock.TypeAcquire, LeaseMS: 60000, Name: "fd-" + strconv.Itoa(i)}.AppendBinary(nil)
		c.Write(b)
		conns = append(conns, c)
	}
	answered := time.Now().Add(500 * time.Millisecond) // for all of them at once
	for _, c := range conns {
		c.SetReadDeadline(answered)
		if f, err := monolock.ReadFrame(c); err == nil && f.Type == monolock.TypeAcquired {
			granted = append(granted, c)
		} else {
			stuck = append(stuck, c)
		}
	}
	if len(stuck) == 0 || len(granted) == 0 {
		t.Fatalf("%d granted, %d waiting to be accepted: the limit did not bite", len(granted), len(stuck))
	}
	select {
	case line := <-logged:
		if !strings.Contains(line, "accept failed") {
			t.Fatalf("logged %q", line)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("accept errors not logged")
	}

	// Backing off, not spinning: little CPU over a second of EMFILE.
	before := cpuTicks(t, cmd.Process.Pid)
	time.Sleep(time.Second)
	if used := cpuTicks(t, cmd.Process.Pid) - before; used > 30 {
		t.Fatalf("%d ticks of CPU in a second of EMFILE: spinning", used)
	}

	// Free descriptors: the waiting clients are accepted and granted.
	for _, c := range granted {
		c.Close()
	}
	for i, c := range stuck {
		c.SetReadDeadline(time.Now().Add(10 * time.Second))
		if f, err := monolock.ReadFrame(c); err != nil || f.Type != monolock.TypeAcquired {
			t.Fatalf("client %d after descriptors were freed: %+v, %v", i, f, err)
		}
		c.Close()
	}
	if cmd.ProcessState != nil {
		t.Fatal("the server exited")
	}
	code, body := httpGet(t, "http://"+ops+"/metrics")
	m := regexp.MustCompile(`(?m)^monolock_accept_errors_total (\d+)$`).FindStringSubmatch(body)
	if code != 200 || m == nil || m[1] == "0" {
		t.Fatalf("accept errors not counted: %d\n%s", code, body)
	}
	cmd.Process.Signal(syscall.SIGTERM)
	awaitFunc(t, "the server's exit after SIGTERM", func() { cmd.Wait() })
}
