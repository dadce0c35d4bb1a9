package main

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// Issue 14, item 9: what a web page can make a browser send to the admin
// API is refused: a cross-origin state change, and a foreign Host (DNS
// rebinding).
func TestAdminRefusesCrossOriginAndForeignHosts(t *testing.T) {
	s := start(t, nil, "-admin-listen", "127.0.0.1:0")
	_, f := rawAcquire(t, s.addr, "prod", time.Minute)
	if f.Type != monolock.TypeAcquired {
		t.Fatalf("holder got %+v", f)
	}
	_, port, _ := net.SplitHostPort(s.admin)
	do := func(method, path, host string, header ...string) (int, string) {
		t.Helper()
		var body io.Reader
		if slices.Contains(header, "Content-Type") { // what a browser's form would send
			body = strings.NewReader("x=1")
		}
		req, _ := http.NewRequest(method, "http://"+s.admin+path, body)
		for i := 0; i+1 < len(header); i += 2 {
			req.Header.Set(header[i], header[i+1])
		}
		if host != "" {
			req.Host = host
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b)
	}
	held := func(when string) {
		t.Helper()
		code, body := do("GET", "/api/locks/prod", "")
		if code != 200 || !strings.Contains(body, fmt.Sprint(f.Token)) {
			t.Fatalf("%s: the lock is no longer held by %d: %d %s", when, f.Token, code, body)
		}
	}
	// Every refusal is a JSON error, as every error of the API is.
	jsonError := func(what, body string) {
		t.Helper()
		var e map[string]any
		if err := json.Unmarshal([]byte(body), &e); err != nil || e["error"] == nil || e["error"] == "" {
			t.Errorf("%s: the refusal is not a JSON error: %q", what, body)
		}
	}
	form := []string{"Content-Type", "application/x-www-form-urlencoded"}
	for _, tc := range []struct {
		what   string
		header []string
	}{
		{"a cross-site form", append([]string{"Origin", "http://evil.example", "Sec-Fetch-Site", "cross-site"}, form...)},
		{"a same-site page of another origin", append([]string{"Origin", "http://127.0.0.1:8080", "Sec-Fetch-Site", "same-site"}, form...)},
		{"a browser that sends only Origin", append([]string{"Origin", "http://evil.example"}, form...)},
	} {
		code, body := do("POST", "/api/locks/prod/release", "", tc.header...)
		if code != http.StatusForbidden || !strings.Contains(body, "cross-origin") {
			t.Errorf("%s: POST release answered %d %s, want 403", tc.what, code, body)
		}
		jsonError(tc.what, body)
		held("after " + tc.what)
	}
	for _, host := range []string{"evil.example:" + port, "evil.example", "localhost.evil.example:" + port, "127.0.0.1.nip.io:" + port} {
		code, body := do("GET", "/api/locks", host)
		if code != http.StatusForbidden || strings.Contains(body, "prod") {
			t.Errorf("Host %s: GET /api/locks answered %d %s, want 403", host, code, body)
		}
		jsonError("Host "+host, body)
		if code, _ := do("POST", "/api/locks/prod/release", host); code != http.StatusForbidden {
			t.Errorf("Host %s: POST release answered %d, want 403", host, code)
		}
		held("after Host " + host)
	}
	// An IP address or localhost with any port: what ssh -L and kubectl
	// port-forward to another local port send. DNS rebinding needs a name.
	for _, host := range []string{"127.0.0.1:" + port, "localhost:" + port, "LOCALHOST:" + port, "[::1]:" + port,
		"localhost:8080", "127.0.0.1:18080", "localhost", "127.0.0.1", "[::1]:1"} {
		if code, body := do("GET", "/api/locks", host); code != 200 || !strings.Contains(body, "prod") {
			t.Errorf("Host %s: GET /api/locks answered %d %s, want 200", host, code, body)
		}
	}
	// The API's own origin, and a client that is not a browser, may change state.
	if code, body := do("POST", "/api/locks/prod/release", "", "Origin", "http://"+s.admin, "Sec-Fetch-Site", "same-origin"); code != 200 {
		t.Fatalf("same-origin release: %d %s", code, body)
	}
	_, f = rawAcquire(t, s.addr, "prod", time.Minute)
	if code, body := do("POST", "/api/locks/prod/release", ""); code != 200 {
		t.Fatalf("release without Origin (curl): %d %s", code, body)
	}
}

func TestAdminHostAllowed(t *testing.T) {
	for _, tc := range []struct {
		host, configured string
		want             bool
	}{
		{"127.0.0.1:7071", "127.0.0.1", true},
		{"10.1.2.3:7071", "0.0.0.0", true},
		{"[::1]:7071", "", true},
		{"localhost:7071", "127.0.0.1", true},
		{"admin.internal:7071", "admin.internal", true},
		{"ADMIN.internal:7071", "admin.internal", true},
		{"admin.internal:7071", "127.0.0.1", false},
		{"evil.example:7071", "", false},
		{"127.0.0.1:7072", "127.0.0.1", true},
		{"localhost:8080", "127.0.0.1", true},
		{"127.0.0.1", "127.0.0.1", true},
		{"admin.internal:7072", "admin.internal", false},
		{"admin.internal", "admin.internal", false},
		{":7071", "", false},
		{"", "", false},
	} {
		if got := adminHostAllowed(tc.host, tc.configured, "7071"); got != tc.want {
			t.Errorf("adminHostAllowed(%q, %q, 7071) = %v", tc.host, tc.configured, got)
		}
	}
	if !adminHostAllowed("127.0.0.1", "", "80") {
		t.Error("a Host without a port is port 80")
	}
}

// Issue 14, item 10: the ops and admin servers close idle keep-alive
// connections and connections that never finish their headers.
func TestHTTPServersBoundTheirConnections(t *testing.T) {
	s := start(t, nil, "-ops-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0")
	var wg sync.WaitGroup
	errs := make(chan error, 4)
	closedWithin := func(c net.Conn, r *bufio.Reader, bound time.Duration) error {
		begin := time.Now()
		c.SetReadDeadline(begin.Add(bound + 15*time.Second))
		_, err := r.ReadByte()
		if errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("still open %v later", time.Since(begin).Round(time.Second))
		}
		if d := time.Since(begin); d > bound+10*time.Second {
			return fmt.Errorf("closed only %v later", d)
		}
		return nil
	}
	for _, target := range []struct{ addr, path string }{{s.ops, "/healthz"}, {s.admin, "/api/info"}} {
		wg.Go(func() {
			c, err := net.Dial("tcp", target.addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n\r\n", target.path, target.addr)
			r := bufio.NewReader(c)
			c.SetReadDeadline(time.Now().Add(10 * time.Second))
			resp, err := http.ReadResponse(r, nil)
			if err != nil {
				errs <- err
				return
			}
			io.Copy(io.Discard, resp.Body)
			if err := closedWithin(c, r, httpIdleTimeout); err != nil {
				errs <- fmt.Errorf("%s: idle keep-alive connection %v", target.addr, err)
			}
		})
		wg.Go(func() {
			c, err := net.Dial("tcp", target.addr)
			if err != nil {
				errs <- err
				return
			}
			defer c.Close()
			fmt.Fprintf(c, "GET %s HTTP/1.1\r\nHost: %s\r\n", target.path, target.addr) // never ends its headers
			if err := closedWithin(c, bufio.NewReader(c), httpReadHeaderTimeout); err != nil {
				errs <- fmt.Errorf("%s: connection with unfinished headers %v", target.addr, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
}
