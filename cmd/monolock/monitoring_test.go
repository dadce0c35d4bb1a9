package main

// The alert rules in deploy/prometheus and the dashboard in deploy/grafana
// against what the binary serves: every metric and label they query is
// served, and moves as a scripted drive of the server says it should.

import (
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/monolock-dev/monolock"
)

// ruleExprs returns the expr of every rule in a Prometheus rules file,
// one-line or a block scalar (| or >), without a YAML library.
func ruleExprs(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	exprLine := regexp.MustCompile(`^(\s*)(?:- )?expr:\s*(.*)$`)
	lines := strings.Split(string(data), "\n")
	var exprs []string
	for i := 0; i < len(lines); i++ {
		m := exprLine.FindStringSubmatch(lines[i])
		if m == nil {
			continue
		}
		expr := strings.TrimSpace(m[2])
		if strings.HasPrefix(expr, "|") || strings.HasPrefix(expr, ">") {
			var block []string
			for i+1 < len(lines) && (strings.TrimSpace(lines[i+1]) == "" || len(lines[i+1])-len(strings.TrimLeft(lines[i+1], " ")) > len(m[1])) {
				i++
				block = append(block, strings.TrimSpace(lines[i]))
			}
			expr = strings.Join(block, " ")
		} else if len(expr) > 1 && (expr[0] == '"' || expr[0] == '\'') && expr[len(expr)-1] == expr[0] {
			expr = expr[1 : len(expr)-1]
		}
		exprs = append(exprs, expr)
	}
	return exprs
}

// dashboardExprs returns every query of a Grafana dashboard: the panels'
// targets and the template variables' queries.
func dashboardExprs(t *testing.T, path string) []string {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
		Templating struct {
			List []struct {
				Name       string `json:"name"`
				Type       string `json:"type"`
				Definition string `json:"definition"`
			} `json:"list"`
		} `json:"templating"`
	}
	if err := json.Unmarshal(data, &dash); err != nil {
		t.Fatalf("%s is not a dashboard's JSON: %v", path, err)
	}
	var exprs []string
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			if target.Expr == "" {
				t.Errorf("%s: panel %q has a target without a query", path, p.Title)
			}
			exprs = append(exprs, target.Expr)
		}
	}
	for _, v := range dash.Templating.List {
		if v.Type == "query" {
			// label_values(SELECTOR, LABEL): the selector is a query.
			selector, label, _ := strings.Cut(strings.TrimSuffix(strings.TrimPrefix(v.Definition, "label_values("), ")"), ",")
			exprs = append(exprs, fmt.Sprintf("sum by (%s) (%s)", strings.TrimSpace(label), selector))
		}
	}
	return exprs
}

// query is what one PromQL expression uses: metric names, the label
// matchers on each, and the labels of by, without, on and ignoring.
type query struct {
	metrics  []string
	matchers []matcher
	grouping []string
}

type matcher struct{ metric, label, op, value string }

var (
	grafanaVar   = regexp.MustCompile(`\$\{?\w+\}?`)
	rangeSel     = regexp.MustCompile(`\[[^\]]*\]`)
	selectorRE   = regexp.MustCompile(`([a-zA-Z_:][a-zA-Z0-9_:]*)\s*\{([^}]*)\}`)
	matcherRE    = regexp.MustCompile(`([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"((?:[^"\\]|\\.)*)"`)
	groupingRE   = regexp.MustCompile(`\b(?:by|without|on|ignoring|group_left|group_right)\s*\(([^)]*)\)`)
	identifierRE = regexp.MustCompile(`[a-zA-Z_:][a-zA-Z0-9_:]*`)
	promqlWords  = []string{"and", "or", "unless", "bool", "offset", "by", "without", "on", "ignoring", "group_left", "group_right", "inf", "nan"}
)

func parseQuery(expr string) query {
	var q query
	expr = rangeSel.ReplaceAllString(grafanaVar.ReplaceAllString(expr, "x"), "")
	for _, m := range groupingRE.FindAllStringSubmatch(expr, -1) {
		for _, l := range strings.Split(m[1], ",") {
			if l = strings.TrimSpace(l); l != "" {
				q.grouping = append(q.grouping, l)
			}
		}
	}
	expr = groupingRE.ReplaceAllString(expr, " ")
	for _, m := range selectorRE.FindAllStringSubmatch(expr, -1) {
		for _, mm := range matcherRE.FindAllStringSubmatch(m[2], -1) {
			q.matchers = append(q.matchers, matcher{m[1], mm[1], mm[2], mm[3]})
		}
	}
	expr = regexp.MustCompile(`\{[^}]*\}`).ReplaceAllString(expr, " ")
	expr = regexp.MustCompile(`"(?:[^"\\]|\\.)*"`).ReplaceAllString(expr, " ")
	for _, loc := range identifierRE.FindAllStringIndex(expr, -1) {
		word, before, after := expr[loc[0]:loc[1]], byte(' '), strings.TrimLeft(expr[loc[1]:], " ")
		if loc[0] > 0 {
			before = expr[loc[0]-1]
		}
		switch {
		case before >= '0' && before <= '9' || before == '.':
			continue // a number: 1e3, 0.5
		case strings.HasPrefix(after, "("), slices.Contains(promqlWords, strings.ToLower(word)):
			continue // a function, or a keyword
		}
		if !slices.Contains(q.metrics, word) {
			q.metrics = append(q.metrics, word)
		}
	}
	return q
}

// TestParseQuery keeps the extraction above honest on the shapes the rules
// and the dashboard use.
func TestParseQuery(t *testing.T) {
	q := parseQuery(`sum without (reason) (rate(monolock_releases_total{reason=~"expired|io_timeout",job=~"$job"}[$__rate_interval])) > 0.05 * histogram_quantile(0.99, sum by (instance, le) (rate(b_bucket[5m]))) and on (job, instance) monolock_build_info offset 5m`)
	if want := []string{"monolock_releases_total", "b_bucket", "monolock_build_info"}; !slices.Equal(q.metrics, want) {
		t.Errorf("metrics %v, want %v", q.metrics, want)
	}
	if want := []string{"reason", "instance", "le", "job", "instance"}; !slices.Equal(q.grouping, want) {
		t.Errorf("grouping %v, want %v", q.grouping, want)
	}
	if want := []matcher{{"monolock_releases_total", "reason", "=~", "expired|io_timeout"}, {"monolock_releases_total", "job", "=~", "x"}}; !slices.Equal(q.matchers, want) {
		t.Errorf("matchers %v, want %v", q.matchers, want)
	}
	for expr, want := range map[string][]string{
		`rate(a_total[5m]) > 3 * rate(a_total[1h] offset 5m)`:                              {"a_total"},
		`sum by (job) (b_info)`:                                                            {"b_info"},
		`(c_seconds - time()) / 86400 < 1e3 and changes(d_seconds[1h]) >= 3`:               {"c_seconds", "d_seconds"},
		`absent(up{job="monolock"})`:                                                       {"up"},
		`histogram_quantile(0.5, sum by (le) (rate(e_bucket{x=~"$x"}[$__rate_interval])))`: {"e_bucket"},
	} {
		if got := parseQuery(expr).metrics; !slices.Equal(got, want) {
			t.Errorf("%s: metrics %v, want %v", expr, got, want)
		}
	}
}

// tlsAcquireLease is tlsAcquire with a lease of the caller's.
func tlsAcquireLease(t *testing.T, addr string, cfg *tls.Config, name string, lease time.Duration) (*rawClient, monolock.Frame) {
	t.Helper()
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: wait}, "tcp", addr, cfg)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	t.Cleanup(func() { conn.Close() })
	b, _ := monolock.Frame{Type: monolock.TypeAcquire, LeaseMS: uint32(lease.Milliseconds()), Name: name}.AppendBinary(nil)
	conn.SetWriteDeadline(time.Now().Add(wait))
	if _, err := conn.Write(b); err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	c := &rawClient{t, conn}
	return c, c.next()
}

func TestRulesAndDashboardUseServedMetrics(t *testing.T) {
	rules := ruleExprs(t, "../../deploy/prometheus/monolock-rules.yml")
	dashboard := dashboardExprs(t, "../../deploy/grafana/monolock-dashboard.json")
	if len(rules) < 10 || len(dashboard) < 20 {
		t.Fatalf("found %d rule and %d dashboard queries: is the parsing broken?", len(rules), len(dashboard))
	}

	// A server with everything on: mutual TLS with rules, the audit log,
	// the ops and admin ports; its certificate expires at a known second.
	dir := t.TempDir()
	serverCA, clientCA := newCA(t, "server CA"), newCA(t, "client CA")
	notAfter := time.Now().Add(10 * 24 * time.Hour).Truncate(time.Second)
	certPEM, keyPEM := serverCA.leaf(t, leafOpts{cn: "server", server: true, notAfter: notAfter})
	flags := []string{
		"-tls-cert", write(t, filepath.Join(dir, "cert.pem"), certPEM),
		"-tls-key", write(t, filepath.Join(dir, "key.pem"), keyPEM),
		"-tls-client-ca", write(t, filepath.Join(dir, "client-ca.pem"), clientCA.pem()),
		"-acl-file", write(t, filepath.Join(dir, "acl.json"), []byte(`{"rules":[{"identity":"spiffe://test/worker","locks":["m/*"]}]}`)),
		"-audit-log", filepath.Join(dir, "audit.log"),
		"-ops-listen", "127.0.0.1:0", "-admin-listen", "127.0.0.1:0",
	}
	clientConfig := func(identity string) *tls.Config {
		cfg := &tls.Config{RootCAs: x509.NewCertPool()}
		cfg.RootCAs.AddCert(serverCA.cert)
		cp, kp := clientCA.leaf(t, leafOpts{cn: "client", uris: []string{identity}})
		cert, err := tls.X509KeyPair(cp, kp)
		if err != nil {
			t.Fatal(err)
		}
		cfg.Certificates = []tls.Certificate{cert}
		return cfg
	}
	worker, intruder := clientConfig("spiffe://test/worker"), clientConfig("spiffe://test/intruder")

	startedAfter := time.Now()
	s := start(t, nil, flags...)
	startedBefore := time.Now()
	beforeValues, beforeBody := metrics(t, s)
	checkExposition(t, beforeBody)

	// The drive: a grant, a queue, a lease that expires, a denial, a force
	// release that promotes the first waiter, and a second waiter left
	// queued. Waits: 0, 0 and at least 150 ms; holds: at least 150 ms
	// (the force-released one) and the 300 ms lease.
	a, granted := tlsAcquireLease(t, s.addr, worker, "m/a", time.Minute)
	b, queued := tlsAcquireLease(t, s.addr, worker, "m/a", time.Minute)
	_, expiring := tlsAcquireLease(t, s.addr, worker, "m/b", 300*time.Millisecond)
	_, denied := tlsAcquireLease(t, s.addr, intruder, "m/c", time.Minute)
	if granted.Type != monolock.TypeAcquired || queued.Type != monolock.TypeWaiting || expiring.Type != monolock.TypeAcquired ||
		denied.Type != monolock.TypeError || denied.Code != monolock.CodeNotAuthorized {
		t.Fatalf("got %+v, %+v, %+v, %+v; want ACQUIRED, WAITING, ACQUIRED, ERROR 0x18", granted, queued, expiring, denied)
	}
	time.Sleep(150 * time.Millisecond)
	eSent := time.Now()
	_, eQueued := tlsAcquireLease(t, s.addr, worker, "m/a", time.Minute)
	eWaiting := time.Now()
	if eQueued.Type != monolock.TypeWaiting {
		t.Fatalf("the second waiter got %+v, want WAITING", eQueued)
	}
	if code, body := httpDo(t, "POST", fmt.Sprintf("http://%s/api/locks/m%%2Fa/release?token=%d", s.admin, granted.Token)); code != 200 {
		t.Fatalf("force-release: %d %s", code, body)
	}
	a.expect(monolock.TypeError, monolock.CodeClosedByAdmin)
	b.expect(monolock.TypeAcquired, 0)
	promoted := time.Now()

	// Until the lease has expired and the ended sessions are gone.
	var values map[string]float64
	var body string
	var scrapeBegan, scrapeEnded time.Time
	for deadline := time.Now().Add(wait); ; time.Sleep(20 * time.Millisecond) {
		scrapeBegan = time.Now()
		values, body = metrics(t, s)
		scrapeEnded = time.Now()
		if values[`monolock_releases_total{reason="expired"}`] == 1 && values["monolock_connections_active"] == 2 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the lease never expired, or the ended sessions never left:\n%s", body)
		}
	}
	samples := checkExposition(t, body)
	delta := func(name string) float64 { return values[name] - beforeValues[name] }
	var lim syscall.Rlimit
	syscall.Getrlimit(syscall.RLIMIT_NOFILE, &lim) // the server inherits it
	seconds := func(d time.Duration) float64 { return d.Seconds() }
	type check struct {
		ok   bool
		want string
	}
	// What the drive moves, for every metric the rules and the dashboard
	// query. A metric they query without an entry here fails the test.
	expect := map[string]func() check{
		"monolock_acquires_total": func() check { return check{delta("monolock_acquires_total") == 3, "+3: two at once, one by promotion"} },
		"monolock_acquire_requests_total": func() check {
			return check{delta("monolock_acquire_requests_total") == 4, "+4: the denied one is not counted"}
		},
		"monolock_locks_held":                 func() check { return check{values["monolock_locks_held"] == 1, "1: the promoted holder"} },
		"monolock_waiters":                    func() check { return check{values["monolock_waiters"] == 1, "1: the second waiter"} },
		"monolock_connections_active":         func() check { return check{values["monolock_connections_active"] == 2, "2: holder and waiter"} },
		"monolock_connections_accepted_total": func() check { return check{delta("monolock_connections_accepted_total") == 5, "+5"} },
		"monolock_accept_errors_total":        func() check { return check{delta("monolock_accept_errors_total") == 0, "+0"} },
		"monolock_tls_handshake_errors_total": func() check {
			return check{delta("monolock_tls_handshake_errors_total") == 0, "+0: every client had a good certificate"}
		},
		"monolock_acl_denials_total": func() check { return check{delta("monolock_acl_denials_total") == 1, "+1"} },
		"monolock_releases_total": func() check {
			return check{delta(`monolock_releases_total{reason="expired"}`) == 1 && delta(`monolock_releases_total{reason="force"}`) == 1 &&
				delta(`monolock_releases_total{reason="graceful"}`) == 0 && delta(`monolock_releases_total{reason="io_timeout"}`) == 0,
				"expired +1, force +1, graceful and io_timeout +0"}
		},
		"monolock_protocol_errors_total": func() check {
			return check{delta(`monolock_protocol_errors_total{code="0x18"}`) == 1 && delta(`monolock_protocol_errors_total{code="0x02"}`) == 1,
				"0x18 +1 (the denial), 0x02 +1 (the force release)"}
		},
		"monolock_wait_duration_seconds_bucket": func() check {
			return check{delta(`monolock_wait_duration_seconds_bucket{le="0.1"}`) == 2 && delta(`monolock_wait_duration_seconds_bucket{le="+Inf"}`) == 3 &&
				delta("monolock_wait_duration_seconds_sum") >= 0.15, "le=0.1 +2, +Inf +3, sum +0.15 s or more"}
		},
		"monolock_hold_duration_seconds_bucket": func() check {
			return check{delta(`monolock_hold_duration_seconds_bucket{le="0.1"}`) == 0 && delta(`monolock_hold_duration_seconds_bucket{le="+Inf"}`) == 2 &&
				delta("monolock_hold_duration_seconds_sum") >= 0.45, "le=0.1 +0, +Inf +2, sum +0.45 s or more"}
		},
		"monolock_oldest_hold_seconds": func() check {
			v := values["monolock_oldest_hold_seconds"]
			return check{v > 0 && v <= seconds(scrapeEnded.Sub(promoted))+0.5, fmt.Sprintf("the promoted holder's, up to %.3f s", seconds(scrapeEnded.Sub(promoted)))}
		},
		"monolock_oldest_wait_seconds": func() check {
			v := values["monolock_oldest_wait_seconds"]
			lo, hi := seconds(scrapeBegan.Sub(eWaiting)), seconds(scrapeEnded.Sub(eSent))
			return check{v >= lo-0.001 && v <= hi+0.001, fmt.Sprintf("the second waiter's: %.3f to %.3f s", lo, hi)}
		},
		"monolock_audit_lines_lost_total": func() check {
			return check{values[`monolock_audit_lines_lost_total{reason="queue_full"}`] == 0 && values[`monolock_audit_lines_lost_total{reason="write_error"}`] == 0 &&
				values[`monolock_audit_lines_lost_total{reason="event_dropped"}`] == 0, "0 for each reason: nothing was lost"}
		},
		"monolock_audit_queued_lines": func() check { return check{values["monolock_audit_queued_lines"] >= 0, "0 or more"} },
		"monolock_tls_certificate_expiry_timestamp_seconds": func() check {
			return check{values["monolock_tls_certificate_expiry_timestamp_seconds"] == float64(notAfter.Unix()), fmt.Sprintf("%d, the certificate's NotAfter", notAfter.Unix())}
		},
		"monolock_ready": func() check { return check{values["monolock_ready"] == 1, "1"} },
		"monolock_build_info": func() check {
			for k, v := range values {
				if strings.HasPrefix(k, "monolock_build_info{version=") && v == 1 {
					return check{true, ""}
				}
			}
			return check{false, "1, with a version label"}
		},
		"process_open_fds": func() check {
			return check{delta("process_open_fds") >= 2 && values["process_open_fds"] < values["process_max_fds"], "+2 or more (two sessions), under the limit"}
		},
		"process_max_fds": func() check {
			return check{values["process_max_fds"] == float64(lim.Cur), fmt.Sprintf("%d, the limit the server inherited", lim.Cur)}
		},
		"process_start_time_seconds": func() check {
			v := values["process_start_time_seconds"]
			return check{v >= float64(startedAfter.UnixMilli())/1000-0.001 && v <= float64(startedBefore.UnixMilli())/1000+0.001, "between the start of the binary and its first log line"}
		},
	}
	// Served by Prometheus itself, not by the target.
	fromPrometheus := []string{"up"}
	targetLabels := []string{"job", "instance"}

	byName := map[string][]sample{}
	for _, s := range samples {
		byName[s.name] = append(byName[s.name], s)
	}
	checked := map[string]bool{}
	for _, src := range []struct {
		file  string
		exprs []string
	}{{"deploy/prometheus/monolock-rules.yml", rules}, {"deploy/grafana/monolock-dashboard.json", dashboard}} {
		for _, expr := range src.exprs {
			q := parseQuery(expr)
			if len(q.metrics) == 0 {
				t.Errorf("%s: no metric found in %q", src.file, expr)
			}
			for _, name := range q.metrics {
				if slices.Contains(fromPrometheus, name) {
					continue
				}
				if len(byName[name]) == 0 {
					t.Errorf("%s: %s is not served (in %q)", src.file, name, expr)
					continue
				}
				if checked[name] {
					continue
				}
				checked[name] = true
				f := expect[name]
				if f == nil {
					t.Errorf("%s: %s has no expectation in this test: add what the drive does to it", src.file, name)
				} else if c := f(); !c.ok {
					t.Errorf("%s: %s did not move as the drive says: want %s", src.file, name, c.want)
				}
			}
			for _, m := range q.matchers {
				if slices.Contains(targetLabels, m.label) || slices.Contains(fromPrometheus, m.metric) {
					continue
				}
				served := map[string]bool{}
				for _, s := range byName[m.metric] {
					if v, ok := s.labels[m.label]; ok {
						served[v] = true
					}
				}
				if len(served) == 0 {
					t.Errorf("%s: %s has no label %s (in %q)", src.file, m.metric, m.label, expr)
					continue
				}
				values := []string{m.value}
				if m.op == "=~" || m.op == "!~" {
					values = strings.Split(m.value, "|")
				}
				for _, v := range values {
					if !served[v] {
						t.Errorf("%s: %s{%s} never has the value %q (in %q)", src.file, m.metric, m.label, v, expr)
					}
				}
			}
			for _, l := range q.grouping {
				if slices.Contains(targetLabels, l) {
					continue
				}
				found := false
				for _, name := range q.metrics {
					for _, s := range byName[name] {
						_, has := s.labels[l]
						found = found || has
					}
				}
				if !found {
					t.Errorf("%s: no metric of %q has the label %s", src.file, expr, l)
				}
			}
		}
	}
	// Every family served is in the README's metrics table, and every one
	// there is served (this server has every option that adds one).
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, table, _ := strings.Cut(string(readme), "\n| metric | type | what it counts |\n")
	table, _, _ = strings.Cut(table, "\n\n")
	documented := map[string]bool{}
	for _, row := range strings.Split(table, "\n") {
		cell, _, _ := strings.Cut(strings.TrimPrefix(row, "| "), " |")
		for _, m := range regexp.MustCompile("`([a-z_:]+)[{`]").FindAllStringSubmatch(cell, -1) {
			documented[m[1]] = true
		}
	}
	served := map[string]bool{}
	for _, m := range regexp.MustCompile(`(?m)^# TYPE (\S+) `).FindAllStringSubmatch(body, -1) {
		served[m[1]] = true
		if !documented[m[1]] {
			t.Errorf("%s is served but not in the README's metrics table", m[1])
		}
	}
	for name := range documented {
		if !served[name] {
			t.Errorf("the README's metrics table has %s, which is not served", name)
		}
	}
	if len(checked) < 15 {
		t.Errorf("only %d metrics checked: is the parsing broken?", len(checked))
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", body)
	}
}

// The age gauges are Stats' OldestHold and OldestWait: they agree with
// every holder and waiter of the lock table, whatever the order of grants
// and queues. (The first version kept a table of holds from the events and
// cached the longest waiter: a review found it stale after a late event,
// and copying a whole queue under the server's lock on every scrape.)
func TestAgesAreTheLockTables(t *testing.T) {
	srv := &monolock.Server{Logger: slog.New(slog.DiscardHandler)}
	o := &ops{srv: srv, started: time.Now()}
	srv.OnEvent = o.event
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	addr := l.Addr().String()
	settled := func(held int) {
		t.Helper()
		for deadline := time.Now().Add(wait); srv.Stats().LocksHeld != held; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("%d locks held, want %d", srv.Stats().LocksHeld, held)
			}
		}
	}
	compare := func(when string, wantHold, wantWait bool) {
		t.Helper()
		st, locks, now := srv.Stats(), srv.Locks(), time.Now()
		hold, wait := ages(now, st)
		var tableHold, tableWait time.Duration // from every lock, holder and waiter
		for _, l := range locks {
			if l.Holder != nil {
				tableHold = max(tableHold, now.Sub(l.Holder.Since))
			}
			for _, w := range l.Waiters {
				tableWait = max(tableWait, now.Sub(w.Since))
			}
		}
		if (hold > 0) != wantHold || (wait > 0) != wantWait || hold != tableHold || wait != tableWait {
			t.Errorf("%s: from Stats hold %v wait %v, from the lock table hold %v wait %v; want a hold: %v, a wait: %v",
				when, hold, wait, tableHold, tableWait, wantHold, wantWait)
		}
	}
	compare("idle", false, false)
	a, _ := rawAcquire(t, addr, "x", time.Minute)
	time.Sleep(30 * time.Millisecond)
	b, _ := rawAcquire(t, addr, "y", time.Minute)
	c, f := rawAcquire(t, addr, "y", time.Minute)
	if f.Type != monolock.TypeWaiting {
		t.Fatalf("got %+v, want WAITING", f)
	}
	time.Sleep(20 * time.Millisecond)
	d, _ := rawAcquire(t, addr, "x", time.Minute) // queued after y's waiter: not the longest wait
	e, _ := rawAcquire(t, addr, "y", time.Minute) // second in y's queue
	settled(2)
	compare("two held, three waiting", true, true)
	a.Close() // x's waiter is promoted
	for deadline := time.Now().Add(wait); srv.Stats().Waiters != 2; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("x's waiter was never promoted")
		}
	}
	settled(2)
	compare("x handed over", true, true) // the longest waiter is still y's first
	b.Close()                            // and now it is promoted: the next look finds e
	for deadline := time.Now().Add(wait); srv.Stats().Waiters != 1; time.Sleep(5 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatal("y's waiter was never promoted")
		}
	}
	settled(2)
	compare("y handed over", true, true)
	for _, c := range []*rawClient{c, d, e} {
		c.Close()
	}
	settled(0)
	compare("all released", false, false)
}
