package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

func httpGet(t *testing.T, u string) (int, string) {
	t.Helper()
	resp, err := httpClient.Get(u)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

func httpDo(t *testing.T, method, u string) (int, string) {
	t.Helper()
	req, _ := http.NewRequest(method, u, nil)
	resp, err := httpClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, string(b)
}

// rawClient is a protocol client on a raw connection to the binary.
type rawClient struct {
	t *testing.T
	net.Conn
}

func rawAcquire(t *testing.T, addr, name string, lease time.Duration) (*rawClient, monolock.Frame) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 10*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rc := &rawClient{t, c}
	b, _ := monolock.Frame{Type: monolock.TypeAcquire, LeaseMS: uint32(lease.Milliseconds()), Name: name}.AppendBinary(nil)
	c.Write(b)
	return rc, rc.next()
}

func (c *rawClient) next() monolock.Frame {
	c.t.Helper()
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	f, err := monolock.ReadFrame(c)
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return f
}

func (c *rawClient) expect(typ byte, code monolock.Code) monolock.Frame {
	c.t.Helper()
	f := c.next()
	if f.Type != typ || (typ == monolock.TypeError && f.Code != code) {
		c.t.Fatalf("got %+v, want type 0x%02x code 0x%02x", f, typ, uint8(code))
	}
	return f
}

// metrics scrapes /metrics into name{labels} -> value.
func metrics(t *testing.T, s *server) (map[string]float64, string) {
	t.Helper()
	code, body := httpGet(t, "http://"+s.ops+"/metrics")
	if code != 200 {
		t.Fatalf("/metrics: %d %s", code, body)
	}
	values := map[string]float64{}
	for _, line := range strings.Split(body, "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		i := strings.LastIndexByte(line, ' ')
		v, _ := strconv.ParseFloat(line[i+1:], 64)
		values[line[:i]] = v
	}
	return values, body
}

var (
	metricName  = `[a-zA-Z_:][a-zA-Z0-9_:]*`
	helpLine    = regexp.MustCompile(`^# HELP (` + metricName + `) \S.*$`)
	typeLine    = regexp.MustCompile(`^# TYPE (` + metricName + `) (gauge|counter|summary|histogram)$`)
	sampleLine  = regexp.MustCompile(`^(` + metricName + `)(\{[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"(?:,[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*")*\})? (\S+)$`)
	labelPair   = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\\n]|\\["\\n])*)"`)
	wantMetrics = []string{"monolock_connections_active", "monolock_locks_held", "monolock_waiters",
		"monolock_acquires_total", "monolock_acl_denials_total", "monolock_releases_total",
		"monolock_protocol_errors_total", "monolock_connections_accepted_total", "monolock_accept_errors_total",
		"monolock_tls_handshake_errors_total", "monolock_heartbeats_total", "monolock_wait_seconds",
		"monolock_hold_seconds", "monolock_acquire_requests_total", "monolock_build_info", "go_goroutines", "go_heap_alloc_bytes", "go_gc_cycles_total",
		"monolock_wait_duration_seconds", "monolock_hold_duration_seconds", "monolock_events_dropped_total",
		"monolock_oldest_hold_seconds", "monolock_oldest_wait_seconds", "monolock_ready", "process_start_time_seconds"}
)

// sample is one parsed line of the exposition.
type sample struct {
	name   string
	labels map[string]string
	value  float64
}

// checkExposition validates the text format line by line: every sample
// belongs to a family announced by HELP then TYPE, counters end in
// _total, summaries have _sum and _count, histograms _bucket (cumulative,
// ending in +Inf, equal to _count), _sum and _count; labels are quoted and
// escaped, values are numbers. It returns the samples.
func checkExposition(t *testing.T, body string) []sample {
	t.Helper()
	if !strings.HasSuffix(body, "\n") {
		t.Fatal("exposition does not end with a newline")
	}
	types := map[string]string{}
	var help, family string
	var samples []sample
	// The histogram being read: its last bucket's bound and count.
	var lastLE, lastBucket float64
	var sawInf bool
	endHistogram := func(n int) {
		if types[family] == "histogram" && !sawInf {
			t.Fatalf("line %d: histogram %s has no +Inf bucket", n, family)
		}
	}
	for n, line := range strings.Split(strings.TrimSuffix(body, "\n"), "\n") {
		if m := helpLine.FindStringSubmatch(line); m != nil {
			if _, seen := types[m[1]]; seen {
				t.Fatalf("line %d: family %s announced twice", n+1, m[1])
			}
			endHistogram(n + 1)
			help = m[1]
			continue
		}
		if m := typeLine.FindStringSubmatch(line); m != nil {
			if m[1] != help {
				t.Fatalf("line %d: TYPE of %s without its HELP just before", n+1, m[1])
			}
			if m[2] == "counter" && !strings.HasSuffix(m[1], "_total") {
				t.Fatalf("line %d: counter %s does not end in _total", n+1, m[1])
			}
			family, types[m[1]] = m[1], m[2]
			lastLE, lastBucket, sawInf = math.Inf(-1), 0, false
			continue
		}
		m := sampleLine.FindStringSubmatch(line)
		if m == nil {
			t.Fatalf("line %d is not valid exposition text: %q", n+1, line)
		}
		s := sample{name: m[1], labels: map[string]string{}}
		for _, l := range labelPair.FindAllStringSubmatch(m[2], -1) {
			if _, dup := s.labels[l[1]]; dup {
				t.Fatalf("line %d: label %s twice", n+1, l[1])
			}
			s.labels[l[1]] = l[2]
		}
		v, err := strconv.ParseFloat(m[3], 64)
		if err != nil {
			t.Fatalf("line %d: value %q", n+1, m[3])
		}
		s.value = v
		name := s.name
		switch types[family] {
		case "summary":
			name = strings.TrimSuffix(strings.TrimSuffix(name, "_sum"), "_count")
			if name == s.name {
				t.Fatalf("line %d: summary sample %s is neither _sum nor _count", n+1, s.name)
			}
		case "histogram":
			switch {
			case name == family+"_bucket":
				le, err := strconv.ParseFloat(s.labels["le"], 64)
				switch {
				case err != nil:
					t.Fatalf("line %d: bucket bound le=%q", n+1, s.labels["le"])
				case sawInf || le <= lastLE:
					t.Fatalf("line %d: bucket le=%q after le=%v: bounds must rise, +Inf last", n+1, s.labels["le"], lastLE)
				case v < lastBucket:
					t.Fatalf("line %d: bucket %v below the one before (%v): buckets are cumulative", n+1, v, lastBucket)
				}
				lastLE, lastBucket, sawInf = le, v, math.IsInf(le, 1)
			case name == family+"_sum":
			case name == family+"_count":
				if !sawInf || v != lastBucket {
					t.Fatalf("line %d: %s = %v, want the +Inf bucket's %v after it", n+1, name, v, lastBucket)
				}
			default:
				t.Fatalf("line %d: histogram sample %s is not _bucket, _sum or _count", n+1, name)
			}
			name = family
		}
		if name != family {
			t.Fatalf("line %d: sample %s outside its family (%s)", n+1, s.name, family)
		}
		samples = append(samples, s)
	}
	endHistogram(-1)
	for _, name := range wantMetrics {
		if types[name] == "" {
			t.Errorf("metric %s missing", name)
		}
	}
	return samples
}

func TestMetricsAfterAScriptedScenario(t *testing.T) {
	s := start(t, nil, "-ops-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0")
	begin := time.Now()
	a, _ := rawAcquire(t, s.addr, "m1", time.Minute)
	b, f := rawAcquire(t, s.addr, "m1", time.Minute)
	if f.Type != monolock.TypeWaiting {
		t.Fatalf("b got %+v", f)
	}
	c, _ := rawAcquire(t, s.addr, "m2", 200*time.Millisecond) // expires
	for range 2 {
		a.Write([]byte{monolock.TypeHeartbeat})
		a.expect(monolock.TypeAcquired, 0)
	}
	d, err := net.DialTimeout("tcp", s.addr, wait)
	if err != nil {
		t.Fatal(err)
	}
	d.Write([]byte{0x7f}) // a protocol error
	(&rawClient{t, d}).expect(monolock.TypeError, monolock.CodeUnknownType)
	c.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.ReadAll(c) // until the server drops it
	a.Close()     // graceful; b is promoted
	b.expect(monolock.TypeAcquired, 0)
	if code, body := httpDo(t, "POST", "http://"+s.admin+"/api/locks/m1/release"); code != 200 {
		t.Fatalf("force-release: %d %s", code, body)
	}
	b.expect(monolock.TypeError, monolock.CodeClosedByAdmin)

	var values map[string]float64
	var body string
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		values, body = metrics(t, s)
		// The histograms are fed by the event hook, a moment after the
		// counters; with -ops-listen alone too (no audit log).
		if values["monolock_connections_active"] == 0 && values[`monolock_releases_total{reason="force"}`] == 1 &&
			values["monolock_wait_duration_seconds_count"] == 3 && values["monolock_hold_duration_seconds_count"] == 3 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("metrics never settled:\n%s", body)
		}
	}
	checkExposition(t, body)
	for name, want := range map[string]float64{
		"monolock_connections_active":                  0,
		"monolock_locks_held":                          0,
		"monolock_waiters":                             0,
		"monolock_acquires_total":                      3,
		"monolock_acl_denials_total":                   0,
		`monolock_releases_total{reason="graceful"}`:   1,
		`monolock_releases_total{reason="expired"}`:    1,
		`monolock_releases_total{reason="io_timeout"}`: 0,
		`monolock_releases_total{reason="force"}`:      1,
		`monolock_protocol_errors_total{code="0x13"}`:  1,
		`monolock_protocol_errors_total{code="0x12"}`:  0,
		"monolock_connections_accepted_total":          4,
		"monolock_accept_errors_total":                 0,
		"monolock_tls_handshake_errors_total":          0,
		"monolock_heartbeats_total":                    2,
		"monolock_wait_seconds_count":                  3,
		"monolock_hold_seconds_count":                  3,
	} {
		if got, ok := values[name]; !ok || got != want {
			t.Errorf("%s = %v (present: %v), want %v", name, got, ok, want)
		}
	}
	if values["go_goroutines"] < 1 || values["go_heap_alloc_bytes"] <= 0 {
		t.Errorf("implausible values:\n%s", body)
	}
	// The sums are in seconds: b waited, and a and c held, for at least
	// c's lease of 200 ms, and none of the three waits or holds lasted
	// longer than the test. The histograms' sums are the summaries'.
	elapsed := time.Since(begin).Seconds()
	for _, name := range []string{"monolock_wait_seconds_sum", "monolock_hold_seconds_sum"} {
		if v := values[name]; v < 0.2 || v > 3*elapsed {
			t.Errorf("%s = %v, want seconds: between 0.2 and %.3f", name, v, 3*elapsed)
		}
	}
	for histogram, summary := range map[string]string{"monolock_wait_duration_seconds_sum": "monolock_wait_seconds_sum",
		"monolock_hold_duration_seconds_sum": "monolock_hold_seconds_sum"} {
		if math.Abs(values[histogram]-values[summary]) > 1e-6 {
			t.Errorf("%s = %v, %s = %v: want the same", histogram, values[histogram], summary, values[summary])
		}
	}
}

// A bucket counts the observations up to its bound and the one equal to
// it (le: less than or equal): an immediate grant of exactly 1 ms is in
// the first, and an hour in le="3600".
func TestHistogramBucketsIncludeTheirBound(t *testing.T) {
	var h histogram
	for _, d := range []time.Duration{0, time.Millisecond, time.Millisecond + 1, time.Hour, time.Hour + time.Nanosecond} {
		h.observe(d)
	}
	samples := h.samples()
	for _, want := range []string{`_bucket{le="0.001"} 2`, `_bucket{le="0.0025"} 3`, `_bucket{le="1800"} 3`,
		`_bucket{le="3600"} 4`, `_bucket{le="+Inf"} 5`, "_count 5"} {
		if !slices.Contains(samples, want) {
			t.Errorf("no %s in %q", want, samples)
		}
	}
}

func TestExpositionEscapesLabels(t *testing.T) {
	if got := escapeLabel("a\"b\\c\nd"); got != `a\"b\\c\nd` {
		t.Fatalf("escapeLabel = %s", got)
	}
}

func TestHealthTurns503WhenShutdownBegins(t *testing.T) {
	flags, stall := stalledAudit(t)
	s := start(t, nil, append(flags, "-ops-listen", "127.0.0.1:0")...)
	if code, body := httpGet(t, "http://"+s.ops+"/healthz"); code != 200 || body != "ok\n" {
		t.Fatalf("/healthz: %d %q", code, body)
	}
	if code, _ := httpGet(t, "http://"+s.ops+"/readyz"); code != 200 {
		t.Fatalf("/readyz: %d", code)
	}
	if values, _ := metrics(t, s); values["monolock_ready"] != 1 {
		t.Fatalf("monolock_ready = %v while /readyz answers 200, want 1", values["monolock_ready"])
	}
	stall(s) // the shutdown cannot finish
	s.cmd.Process.Signal(syscall.SIGTERM)
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		resp, err := httpClient.Get("http://" + s.ops + "/healthz")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 503 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatal("/healthz never turned 503")
		}
	}
	if code, _ := httpGet(t, "http://"+s.ops+"/readyz"); code != 503 {
		t.Fatalf("/readyz: %d during shutdown", code)
	}
	if values, _ := metrics(t, s); values["monolock_ready"] != 0 {
		t.Fatalf("monolock_ready = %v during shutdown, want 0", values["monolock_ready"])
	}
	select {
	case <-s.done:
		t.Fatal("the server exited: the test proves nothing")
	default: // still closing sessions, and already unhealthy
	}
}

type auditRecord struct {
	Time       string  `json:"time"`
	Event      string  `json:"event"`
	Lock       string  `json:"lock"`
	Identity   *string `json:"identity"`
	RemoteAddr string  `json:"remote_addr"`
	Token      uint64  `json:"token"`
	WaitMS     *int64  `json:"wait_ms"`
	HeldMS     *int64  `json:"held_ms"`
	Reason     string  `json:"reason"`
}

func readAudit(t *testing.T, r io.Reader) []auditRecord {
	t.Helper()
	var out []auditRecord
	lines := bufio.NewScanner(r)
	for lines.Scan() {
		var rec auditRecord
		dec := json.NewDecoder(strings.NewReader(lines.Text()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			t.Fatalf("audit line %q: %v", lines.Text(), err)
		}
		ts, err := time.Parse(time.RFC3339Nano, rec.Time)
		if err != nil || ts.Location() != time.UTC || rec.Identity == nil || rec.RemoteAddr == "" || rec.Lock == "" {
			t.Fatalf("audit line %q lacks a field", lines.Text())
		}
		switch rec.Event {
		case "granted":
			if rec.Token == 0 || rec.WaitMS == nil {
				t.Fatalf("granted line %q", lines.Text())
			}
		case "released":
			if rec.Token == 0 || rec.HeldMS == nil || rec.Reason == "" {
				t.Fatalf("released line %q", lines.Text())
			}
		case "force_release", "kick_waiter", "denied":
		default:
			t.Fatalf("unknown event in %q", lines.Text())
		}
		out = append(out, rec)
	}
	return out
}

// checkOwnership checks, from the audit records alone, that ownerships of
// a lock never overlap and every grant is released exactly once.
func checkOwnership(t *testing.T, recs []auditRecord) {
	t.Helper()
	holder := map[string]uint64{}
	for _, r := range recs {
		switch r.Event {
		case "granted":
			if holder[r.Lock] != 0 {
				t.Fatalf("%s granted (%d) while %d holds it", r.Lock, r.Token, holder[r.Lock])
			}
			holder[r.Lock] = r.Token
		case "released":
			if holder[r.Lock] != r.Token {
				t.Fatalf("%s released by %d while %d holds it", r.Lock, r.Token, holder[r.Lock])
			}
			holder[r.Lock] = 0
		}
	}
	for name, token := range holder {
		if token != 0 {
			t.Fatalf("%s: grant %d never released", name, token)
		}
	}
}

func TestAuditLog(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	s := start(t, nil, "-audit-log", path, "-admin-listen", "127.0.0.1:0", "-ops-listen", "127.0.0.1:0")
	// Contention on a few locks, an expiry, a kick and a force-release.
	var clients []*rawClient
	for i := range 6 {
		c, _ := rawAcquire(t, s.addr, fmt.Sprintf("lock-%d", i%2), time.Minute)
		clients = append(clients, c)
	}
	short, _ := rawAcquire(t, s.addr, "short", 100*time.Millisecond)
	short.SetReadDeadline(time.Now().Add(10 * time.Second))
	io.ReadAll(short)
	if code, body := httpDo(t, "DELETE", "http://"+s.admin+"/api/locks/lock-0/waiters/"+clients[2].LocalAddr().String()); code != 200 {
		t.Fatalf("kick: %d %s", code, body)
	}
	if code, body := httpDo(t, "POST", "http://"+s.admin+"/api/locks/lock-1/release"); code != 200 {
		t.Fatalf("force: %d %s", code, body)
	}

	// Log rotation: move the file away, SIGHUP, and the next lines go to a new file.
	waitForAuditLines(t, path, 6) // 3 grants, expiry release, kick, force_release
	rotated := filepath.Join(dir, "audit.log.1")
	os.Rename(path, rotated)
	s.cmd.Process.Signal(syscall.SIGHUP)
	waitForLog(t, s, "audit log reopened")
	for _, c := range clients {
		c.Close()
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.exitCode(t)

	old, _ := os.Open(rotated)
	defer old.Close()
	fresh, err := os.Open(path)
	if err != nil {
		t.Fatalf("no new file after the reopen: %v", err)
	}
	defer fresh.Close()
	before, after := readAudit(t, old), readAudit(t, fresh)
	if len(before) == 0 || len(after) == 0 {
		t.Fatalf("%d lines before the rotation, %d after", len(before), len(after))
	}
	all := append(before, after...)
	checkOwnership(t, all)
	counts := map[string]int{}
	for _, r := range all {
		counts[r.Event+" "+r.Reason]++
	}
	if counts["kick_waiter "] != 1 || counts["force_release "] != 1 || counts["released force"] != 1 || counts["released expired"] != 1 {
		t.Fatalf("events %v", counts)
	}
}

func waitForAuditLines(t *testing.T, path string, n int) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
		b, _ := os.ReadFile(path)
		if bytes.Count(b, []byte("\n")) >= n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("audit log has %q, want %d lines", b, n)
		}
	}
}

func TestAuditLogToStdoutAndWriteFailures(t *testing.T) {
	t.Run("stdout", func(t *testing.T) {
		cmd := exec.Command(binary, "-listen", "127.0.0.1:0", "-audit-log", "-", "-log-format", "json")
		var stdout bytes.Buffer
		cmd.Stdout = &stdout
		pipe, err := cmd.StderrPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		defer cmd.Process.Kill()
		lines := bufio.NewScanner(pipe)
		var addr string
		silent := killAfter(cmd)
		for addr == "" && lines.Scan() {
			if m := regexp.MustCompile(`"msg":"serving","listen":"([^"]+)"`).FindStringSubmatch(lines.Text()); m != nil {
				addr = m[1]
			}
		}
		silent.Stop()
		if addr == "" {
			t.Fatalf("the server did not say where it listens within %v", wait)
		}
		var stderr bytes.Buffer
		copied := make(chan struct{})
		go func() { io.Copy(&stderr, pipe); close(copied) }()
		c, _ := rawAcquire(t, addr, "out", time.Minute)
		c.Close()
		time.Sleep(200 * time.Millisecond)
		cmd.Process.Signal(syscall.SIGTERM)
		await(t, copied, "the end of stderr after SIGTERM")
		awaitFunc(t, "the server's exit after SIGTERM", func() { cmd.Wait() })
		recs := readAudit(t, &stdout)
		if len(recs) != 2 || recs[0].Event != "granted" || recs[1].Event != "released" {
			t.Fatalf("stdout: %q", stdout.String())
		}
		if !strings.Contains(stderr.String(), `"msg":"shut down"`) || strings.Contains(stdout.String(), `"msg"`) {
			t.Fatalf("diagnostics not on stderr alone: stderr %q, stdout %q", stderr.String(), stdout.String())
		}
	})
	t.Run("a line that cannot be written is loud and counted", func(t *testing.T) {
		if _, err := os.Stat("/dev/full"); err != nil {
			t.Skip("no /dev/full")
		}
		s := start(t, nil, "-audit-log", "/dev/full", "-ops-listen", "127.0.0.1:0")
		c, _ := rawAcquire(t, s.addr, "full", time.Minute)
		c.Close()
		waitForLog(t, s, "AUDIT LOG WRITE FAILED")
		for deadline := time.Now().Add(10 * time.Second); ; time.Sleep(10 * time.Millisecond) {
			values, _ := metrics(t, s)
			if values["monolock_audit_write_errors_total"] == 2 {
				// And as lost lines, by reason: both failed writes, none
				// dropped from the queue.
				for reason, want := range map[string]float64{"write_error": 2, "queue_full": 0, "event_dropped": 0} {
					if got := values[`monolock_audit_lines_lost_total{reason="`+reason+`"}`]; got != want {
						t.Errorf("monolock_audit_lines_lost_total{reason=%q} = %v, want %v", reason, got, want)
					}
				}
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("audit write errors = %v, want 2", values["monolock_audit_write_errors_total"])
			}
		}
	})
	t.Run("an audit file that cannot be opened stops the start", func(t *testing.T) {
		code, _, stderr := runBinary(t, nil, "-listen", "127.0.0.1:0", "-audit-log", filepath.Join(t.TempDir(), "no", "such", "dir"))
		if code != 2 || strings.Count(stderr, "\n") != 1 || !strings.Contains(stderr, "-audit-log") {
			t.Fatalf("exit %d, %q", code, stderr)
		}
	})
}

func TestAdminAPI(t *testing.T) {
	s := start(t, nil, "-admin-listen", "127.0.0.1:0")
	base := "http://" + s.admin
	name := "nightly/impört ✓" // a slash and non-ASCII characters
	escaped := url.PathEscape(name)
	holder, _ := rawAcquire(t, s.addr, name, time.Minute)
	var waiters []*rawClient
	for range 3 {
		w, f := rawAcquire(t, s.addr, name, time.Minute)
		if f.Type != monolock.TypeWaiting {
			t.Fatalf("waiter got %+v", f)
		}
		waiters = append(waiters, w)
	}

	getLock := func() lockJSON {
		t.Helper()
		code, body := httpGet(t, base+"/api/locks/"+escaped)
		var l lockJSON
		if code != 200 || json.Unmarshal([]byte(body), &l) != nil {
			t.Fatalf("GET lock: %d %s", code, body)
		}
		return l
	}
	l := getLock()
	if l.Name != name || l.Holder == nil || l.Holder.RemoteAddr != holder.LocalAddr().String() || l.Holder.Token == 0 ||
		l.Holder.LeaseMS != 60000 || len(l.Waiters) != 3 {
		t.Fatalf("lock %+v", l)
	}
	for i, w := range l.Waiters {
		if w.RemoteAddr != waiters[i].LocalAddr().String() {
			t.Fatalf("waiters out of FIFO order: %+v", l.Waiters)
		}
	}

	// Kick the middle waiter: exactly it goes, the others keep their order.
	// The answer is {"name", "kicked": waiter}.
	code, body := httpDo(t, "DELETE", base+"/api/locks/"+escaped+"/waiters/"+url.PathEscape(waiters[1].LocalAddr().String()))
	if code != 200 {
		t.Fatalf("kick: %d %s", code, body)
	}
	answer := decodeJSON(t, body)
	kicked := checkFields(t, "the kick's answer: kicked", answer["kicked"], map[string]string{
		"identity": "string", "remote_addr": "string", "queued_at": "string", "lease_ms": "int"})
	if answer["name"] != name || kicked["remote_addr"] != waiters[1].LocalAddr().String() {
		t.Fatalf("kick answered %s; want the lock's name and the kicked waiter %s", body, waiters[1].LocalAddr())
	}
	waiters[1].expect(monolock.TypeError, monolock.CodeClosedByAdmin)
	for deadline := time.Now().Add(10 * time.Second); len(getLock().Waiters) != 2; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("kicked waiter still queued")
		}
	}
	if l := getLock(); l.Waiters[0].RemoteAddr != waiters[0].LocalAddr().String() || l.Waiters[1].RemoteAddr != waiters[2].LocalAddr().String() {
		t.Fatalf("queue after the kick: %+v", l.Waiters)
	}

	// Force-release: the holder gets 0x02, the next waiter the lock. The
	// answer is {"name", "released": holder}.
	code, body = httpDo(t, "POST", base+"/api/locks/"+escaped+"/release")
	if code != 200 {
		t.Fatalf("release: %d %s", code, body)
	}
	answer = decodeJSON(t, body)
	released := checkFields(t, "the release's answer: released", answer["released"], map[string]string{
		"identity": "string", "remote_addr": "string", "since": "string", "lease_ms": "int", "token": "int", "token_string": "string"})
	if answer["name"] != name || released["remote_addr"] != holder.LocalAddr().String() || released["token_string"] != fmt.Sprint(l.Holder.Token) {
		t.Fatalf("release answered %s; want the lock's name and the holder %s with token %d", body, holder.LocalAddr(), l.Holder.Token)
	}
	holder.expect(monolock.TypeError, monolock.CodeClosedByAdmin)
	waiters[0].expect(monolock.TypeAcquired, 0)

	// The table view, from `monolock locks`.
	code, out, stderr := runBinary(t, nil, "locks", "-admin", s.admin)
	if code != 0 || !strings.Contains(out, "NAME") || !strings.Contains(out, name) || !strings.Contains(out, waiters[0].LocalAddr().String()) {
		t.Fatalf("monolock locks: %d\n%s%s", code, out, stderr)
	}

	// Errors are JSON with a clear message.
	for _, tc := range []struct {
		method, path string
		code         int
	}{
		{"GET", "/api/locks/idle", 404},
		{"POST", "/api/locks/idle/release", 404},
		{"DELETE", "/api/locks/" + escaped + "/waiters/127.0.0.1:1", 404},
		{"GET", "/api/locks/" + escaped + "/release", 405},
		{"POST", "/api/locks", 405},
		{"GET", "/api/nothing", 404},
	} {
		code, body := httpDo(t, tc.method, base+tc.path)
		var e map[string]string
		if code != tc.code || json.Unmarshal([]byte(body), &e) != nil || e["error"] == "" {
			t.Errorf("%s %s: %d %s; want %d with a JSON error", tc.method, tc.path, code, body, tc.code)
		}
	}

	code, body = httpGet(t, base+"/api/info")
	var info map[string]any
	if code != 200 || json.Unmarshal([]byte(body), &info) != nil || info["version"] == nil || info["config"] == nil || info["locks"] == nil {
		t.Fatalf("/api/info: %d %s", code, body)
	}
}

func TestAdminMatchAgreesWithTheACLGlob(t *testing.T) {
	s := start(t, nil, "-admin-listen", "127.0.0.1:0")
	names := []string{"nightly/a", "nightly/a/b", "shard-3", "shard-31", "é", "ab"}
	for _, n := range names {
		rawAcquire(t, s.addr, n, time.Minute)
	}
	for _, pattern := range []string{"*", "nightly/*", "shard-?", "?", "a*", "*b", "nothing"} {
		code, body := httpGet(t, "http://"+s.admin+"/api/locks?match="+url.QueryEscape(pattern))
		var resp struct{ Locks []lockJSON }
		if code != 200 || json.Unmarshal([]byte(body), &resp) != nil {
			t.Fatalf("match %q: %d %s", pattern, code, body)
		}
		var got, want []string
		for _, l := range resp.Locks {
			got = append(got, l.Name)
		}
		for _, n := range names {
			if glob(pattern, n) {
				want = append(want, n)
			}
		}
		if strings.Join(got, "|") != strings.Join(sorted(want), "|") {
			t.Errorf("match %q: %q, the ACL glob says %q", pattern, got, want)
		}
	}
}

func sorted(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func TestAdminWarnsWhenNotOnLoopback(t *testing.T) {
	for _, tc := range []struct {
		addr string
		want bool
	}{
		{"127.0.0.1:7071", true}, {"[::1]:7071", true}, {"localhost:7071", true},
		{"0.0.0.0:7071", false}, {":7071", false}, {"10.0.0.1:7071", false},
	} {
		if got := isLoopback(tc.addr); got != tc.want {
			t.Errorf("isLoopback(%q) = %v", tc.addr, got)
		}
	}
	s := start(t, nil, "-admin-listen", "0.0.0.0:0")
	if !strings.Contains(s.log(), "the admin API has no authentication") {
		t.Fatalf("no warning for an admin API on 0.0.0.0:\n%s", s.log())
	}
	s = start(t, nil, "-admin-listen", "127.0.0.1:0")
	if strings.Contains(s.log(), "no authentication") {
		t.Fatalf("warning for an admin API on loopback:\n%s", s.log())
	}
}

// The stress scenario, through the binary with its audit log on: clients
// that close, go silent (and expire), or break the protocol, at random, on
// a few locks. Afterwards the log alone must show ownerships that never
// overlap and every grant released exactly once.
func TestAuditLogUnderStress(t *testing.T) {
	if testing.Short() {
		t.Skip("stress test")
	}
	path := filepath.Join(t.TempDir(), "audit.log")
	s := start(t, nil, "-audit-log", path)
	stop := time.Now().Add(2 * time.Second)
	done := make(chan struct{})
	for w := range 40 {
		go func() {
			defer func() { done <- struct{}{} }()
			for i := 0; time.Now().Before(stop); i++ {
				conn, err := net.DialTimeout("tcp", s.addr, wait)
				if err != nil {
					return
				}
				b, _ := monolock.Frame{Type: monolock.TypeAcquire, LeaseMS: 300, Name: fmt.Sprintf("lock-%d", (w+i)%3)}.AppendBinary(nil)
				conn.Write(b)
				conn.SetReadDeadline(time.Now().Add(5 * time.Second))
				monolock.ReadFrame(conn)
				switch (w*7 + i) % 4 {
				case 0: // silent: the server drops it after its lease
					io.ReadAll(conn)
				case 1: // breaks the protocol
					conn.Write([]byte{0x7f})
					io.ReadAll(conn)
				default: // holds or waits a moment, then closes
					time.Sleep(time.Duration((w+i)%20) * time.Millisecond)
				}
				conn.Close()
			}
		}()
	}
	for i := range 40 {
		await(t, done, fmt.Sprintf("the end of client %d of 40", i+1))
	}
	s.cmd.Process.Signal(syscall.SIGTERM)
	s.exitCode(t)
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs := readAudit(t, f)
	checkOwnership(t, recs)
	grants := 0
	for _, r := range recs {
		if r.Event == "granted" {
			grants++
		}
	}
	if grants < 20 {
		t.Fatalf("only %d grants in the log", grants)
	}
	t.Logf("%d audit lines, %d grants", len(recs), grants)
}
