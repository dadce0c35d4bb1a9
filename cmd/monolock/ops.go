package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/monolock-dev/monolock"
)

// ops is the operator surface of the binary: health, metrics, the admin
// API and the audit log, all built on the server's hooks.
type ops struct {
	srv      *monolock.Server
	started  time.Time
	stopping atomic.Bool // from the moment shutdown begins
	audit    *auditLog   // nil without -audit-log
	sec      *security   // for the certificate's expiry; nil in tests that need none
	config   map[string]any

	waitHist, holdHist histogram // fed by event
}

// opsHandler serves /healthz, /readyz and /metrics.
func (o *ops) opsHandler() http.Handler {
	mux := http.NewServeMux()
	health := func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if o.stopping.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			io.WriteString(w, "shutting down\n")
			return
		}
		io.WriteString(w, "ok\n")
	}
	mux.HandleFunc("GET /healthz", health)
	mux.HandleFunc("GET /readyz", health)
	mux.HandleFunc("GET /metrics", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
		o.writeMetrics(w)
	})
	return mux
}

// writeMetrics writes the Prometheus text exposition format by hand.
func (o *ops) writeMetrics(w io.Writer) {
	st := o.srv.Stats()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	var b strings.Builder
	b.Grow(16 << 10) // the whole exposition, at once
	family := func(name, typ, help string, samples ...string) {
		fmt.Fprintf(&b, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, typ)
		for _, s := range samples {
			b.WriteString(name + s + "\n")
		}
	}
	value := func(v float64) string { return " " + strconv.FormatFloat(v, 'g', -1, 64) }
	uvalue := func(v uint64) string { return " " + strconv.FormatUint(v, 10) }
	label := func(name, val string) string { return "{" + name + `="` + escapeLabel(val) + `"}` }

	family("monolock_connections_active", "gauge", "Open connections, with or without a lock.", value(float64(st.Connections)))
	family("monolock_locks_held", "gauge", "Locks that have a holder.", value(float64(st.LocksHeld)))
	family("monolock_waiters", "gauge", "Sessions waiting in a lock's queue.", value(float64(st.Waiters)))
	family("monolock_acquires_total", "counter", "Granted ownerships, at once or by promotion: issued fencing tokens.", uvalue(st.Grants))
	family("monolock_acquire_requests_total", "counter", "Valid, authorized ACQUIREs, granted at once or queued.", uvalue(st.Acquires))
	family("monolock_acl_denials_total", "counter", "ACQUIREs refused by the authorization rules.", uvalue(st.Denials))
	var releases []string
	for _, reason := range []string{monolock.ReasonGraceful, monolock.ReasonExpired, monolock.ReasonIOTimeout, monolock.ReasonForce} {
		releases = append(releases, label("reason", reason)+uvalue(st.Releases[reason]))
	}
	family("monolock_releases_total", "counter", "Releases of held locks, by reason.", releases...)
	// Every defined code is listed, at 0 too, so that a rate() over a code
	// works from the first scrape.
	codes := []monolock.Code{0x01, 0x02, 0x10, 0x11, 0x12, 0x13, 0x14, 0x15, 0x16, 0x17, 0x18}
	for code := range st.Errors {
		if !slices.Contains(codes, code) {
			codes = append(codes, code)
		}
	}
	slices.Sort(codes)
	var protocol []string
	for _, code := range codes {
		protocol = append(protocol, label("code", fmt.Sprintf("0x%02x", uint8(code)))+uvalue(st.Errors[code]))
	}
	family("monolock_protocol_errors_total", "counter", "ERROR frames sent, by wire code: server conditions (0x01, 0x02) and client errors.", protocol...)
	family("monolock_connections_accepted_total", "counter", "Connections accepted.", uvalue(st.ConnectionsAccepted))
	family("monolock_accept_errors_total", "counter", "Failed accepts (EMFILE, ENFILE, ...), each retried after a backoff.", uvalue(st.AcceptErrors))
	family("monolock_tls_handshake_errors_total", "counter", "TLS handshakes that failed or timed out.", uvalue(st.TLSHandshakeErrors))
	family("monolock_heartbeats_total", "counter", "HEARTBEAT frames answered.", uvalue(st.Heartbeats))
	family("monolock_wait_seconds", "summary", "Time from ACQUIRE to grant, over every grant.",
		"_sum"+value(st.WaitTotal.Seconds()), "_count"+uvalue(st.Grants))
	var held uint64
	for _, n := range st.Releases {
		held += n
	}
	family("monolock_hold_seconds", "summary", "Time from grant to release, over every release.",
		"_sum"+value(st.HoldTotal.Seconds()), "_count"+uvalue(held))
	// The histograms count what OnEvent was told: all of it, unless events
	// were dropped (monolock_events_dropped_total).
	family("monolock_wait_duration_seconds", "histogram", "Time from ACQUIRE to grant, over every grant.", o.waitHist.samples()...)
	family("monolock_hold_duration_seconds", "histogram", "Time from grant to release, over every release.", o.holdHist.samples()...)
	family("monolock_events_dropped_total", "counter", "Server events never delivered (the queue to the event hook was full): missing from the histograms and the audit log.", uvalue(st.EventsDropped))
	oldestHold, oldestWait := ages(time.Now(), st)
	family("monolock_oldest_hold_seconds", "gauge", "How long the longest current holder has held its lock; 0 when no lock is held.", value(oldestHold.Seconds()))
	family("monolock_oldest_wait_seconds", "gauge", "How long the longest current waiter has waited; 0 when nobody waits.", value(oldestWait.Seconds()))
	if o.audit != nil {
		errs, dropped := o.audit.errors.Load(), o.audit.dropped.Load()
		family("monolock_audit_write_errors_total", "counter", "Audit log lines that could not be written.", uvalue(errs))
		family("monolock_audit_dropped_total", "counter", "Audit log lines dropped because the queue to a slow or stalled sink was full.", uvalue(dropped))
		family("monolock_audit_lines_lost_total", "counter", "Audit log lines lost, by reason: the queue to the sink was full, the write failed, or the server dropped the event before the audit log saw it.",
			label("reason", "queue_full")+uvalue(dropped), label("reason", "write_error")+uvalue(errs), label("reason", "event_dropped")+uvalue(st.EventsDropped))
		family("monolock_audit_queued_lines", "gauge", "Audit log lines waiting to be written.", value(float64(o.audit.queued.Load())))
	}
	if notAfter, ok := o.certificateExpiry(); ok {
		family("monolock_tls_certificate_expiry_timestamp_seconds", "gauge", "When the certificate the protocol port serves expires (after the last reload), in Unix seconds.", value(float64(notAfter.Unix())))
	}
	ready := 1.0
	if o.stopping.Load() {
		ready = 0
	}
	family("monolock_ready", "gauge", "1 while /readyz answers 200, 0 from the moment shutdown begins.", value(ready))
	family("monolock_build_info", "gauge", "Always 1; the labels say which build serves, as /api/info does.", readBuildInfo().metricLabels()+" 1")
	family("go_goroutines", "gauge", "Goroutines that currently exist.", value(float64(runtime.NumGoroutine())))
	family("go_heap_alloc_bytes", "gauge", "Bytes of allocated heap objects.", uvalue(ms.HeapAlloc))
	family("go_gc_cycles_total", "counter", "Completed garbage collection cycles.", uvalue(uint64(ms.NumGC)))
	family("process_start_time_seconds", "gauge", "When the server started, in Unix seconds.", value(float64(o.started.UnixMilli())/1000))
	p := readProcessStats()
	if p.hasOpen {
		family("process_open_fds", "gauge", "Open file descriptors.", uvalue(p.openFDs))
	}
	if p.hasMax {
		family("process_max_fds", "gauge", "The limit on open file descriptors (RLIMIT_NOFILE, soft).", uvalue(p.maxFDs))
	}
	if p.hasCPU {
		family("process_cpu_seconds_total", "counter", "User and system CPU time spent, in seconds.", value(p.cpu))
	}
	if p.hasRSS {
		family("process_resident_memory_bytes", "gauge", "Resident memory, in bytes.", uvalue(p.rss))
	}
	io.WriteString(w, b.String())
}

// escapeLabel escapes a label value as the text format requires. The
// replacer is built once: building one allocates about 6 KiB, which every
// label of every scrape paid.
func escapeLabel(s string) string { return labelEscaper.Replace(s) }

var labelEscaper = strings.NewReplacer(`\`, `\\`, `"`, `\"`, "\n", `\n`)

// The admin API's JSON. A holder and a waiter are described with the
// documented names: a waiter's time is queued_at, a holder's since.
type holderJSON struct {
	Identity   string    `json:"identity"`
	RemoteAddr string    `json:"remote_addr"`
	Since      time.Time `json:"since"`
	LeaseMS    int64     `json:"lease_ms"`
	Token      uint64    `json:"token"`
	// The token again, as a string: tools that read numbers as doubles
	// (jq before 1.7, JavaScript) round tokens, which are above 2^53.
	TokenString string `json:"token_string"`
}

type waiterJSON struct {
	Identity   string    `json:"identity"`
	RemoteAddr string    `json:"remote_addr"`
	QueuedAt   time.Time `json:"queued_at"`
	LeaseMS    int64     `json:"lease_ms"`
}

type lockJSON struct {
	Name    string       `json:"name"`
	Holder  *holderJSON  `json:"holder"`
	Waiters []waiterJSON `json:"waiters"`
}

func toHolderJSON(s monolock.SessionInfo) holderJSON {
	return holderJSON{Identity: s.Identity, RemoteAddr: s.RemoteAddr, Since: s.Since.UTC(), LeaseMS: s.Lease.Milliseconds(), Token: s.Token,
		TokenString: strconv.FormatUint(s.Token, 10)}
}

func toWaiterJSON(s monolock.SessionInfo) waiterJSON {
	return waiterJSON{Identity: s.Identity, RemoteAddr: s.RemoteAddr, QueuedAt: s.Since.UTC(), LeaseMS: s.Lease.Milliseconds()}
}

func toLockJSON(l monolock.LockInfo) lockJSON {
	out := lockJSON{Name: l.Name, Waiters: []waiterJSON{}}
	if l.Holder != nil {
		h := toHolderJSON(*l.Holder)
		out.Holder = &h
	}
	for _, w := range l.Waiters {
		out.Waiters = append(out.Waiters, toWaiterJSON(w))
	}
	return out
}

// adminHandler serves the admin API. It has no authentication of its own:
// bind it to loopback.
func (o *ops) adminHandler() http.Handler {
	mux := http.NewServeMux()
	only := func(method string, h http.HandlerFunc) http.HandlerFunc {
		return func(w http.ResponseWriter, r *http.Request) {
			if r.Method != method {
				w.Header().Set("Allow", method)
				writeJSON(w, http.StatusMethodNotAllowed, map[string]string{"error": "method " + r.Method + " not allowed; use " + method})
				return
			}
			query, err := strictQuery(r.URL.RawQuery, adminQueryKeys[r.Pattern])
			if err != nil {
				writeJSON(w, http.StatusBadRequest, map[string]string{"error": err.Error()})
				return
			}
			r.URL.RawQuery = query.Encode() // what the handler reads is what was checked
			// Nor does it read a body: curl -d token=T must not release
			// whoever holds the lock for want of the ?token= it ignored.
			if r.ContentLength != 0 { // declared, even if it never comes
				writeJSON(w, http.StatusBadRequest, map[string]string{
					"error": "the admin API reads no request body: give the token in the URL, as ?token=T"})
				return
			}
			h(w, r)
		}
	}
	mux.HandleFunc("/api/info", only("GET", func(w http.ResponseWriter, r *http.Request) {
		st := o.srv.Stats()
		// Every lock that exists has a holder, except for a moment during a
		// shutdown: locks counts the held ones, like monolock_locks_held.
		build := readBuildInfo()
		writeJSON(w, http.StatusOK, map[string]any{
			"version":     build.version,
			"revision":    build.revision,
			"go_version":  build.goVersion,
			"uptime_ms":   time.Since(o.started).Milliseconds(),
			"config":      o.config,
			"locks":       st.LocksHeld,
			"sessions":    st.LocksHeld + st.Waiters,
			"waiters":     st.Waiters,
			"connections": st.Connections,
		})
	}))
	mux.HandleFunc("/api/locks", only("GET", func(w http.ResponseWriter, r *http.Request) {
		match, filter := r.URL.Query()["match"]
		locks := []lockJSON{}
		for _, l := range o.srv.Locks() {
			if !filter || glob(match[0], l.Name) {
				locks = append(locks, toLockJSON(l))
			}
		}
		writeJSON(w, http.StatusOK, map[string]any{"locks": locks})
	}))
	mux.HandleFunc("/api/locks/{name}", only("GET", func(w http.ResponseWriter, r *http.Request) {
		l, ok := o.srv.Lock(r.PathValue("name"))
		if !ok {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "lock is idle: nobody holds or waits for it", "name": r.PathValue("name")})
			return
		}
		writeJSON(w, http.StatusOK, toLockJSON(l))
	}))
	mux.HandleFunc("/api/locks/{name}/release", only("POST", func(w http.ResponseWriter, r *http.Request) {
		name := r.PathValue("name")
		// Without ?token= it ends whoever holds the lock now, which may be a
		// waiter promoted a moment ago; with it, only the holder meant.
		var token uint64
		if values, ok := r.URL.Query()["token"]; ok {
			var err error
			token, err = strconv.ParseUint(values[0], 10, 64)
			if err != nil || token == 0 || len(values) > 1 {
				writeJSON(w, http.StatusBadRequest, map[string]string{
					"error": "token must be one fencing token, a positive decimal integer", "name": name})
				return
			}
		}
		holder, err := o.srv.ForceRelease(name, token)
		switch {
		case errors.Is(err, monolock.ErrNotFound):
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "nobody holds the lock", "name": name})
		case errors.Is(err, monolock.ErrStaleToken):
			resp := map[string]any{"name": name, "token": token, "token_string": strconv.FormatUint(token, 10),
				"error": fmt.Sprintf("token %d is not the token of the lock's holder: nothing was released. "+
					"Either that holder is gone and the lock is now held under another token, "+
					"or the token was rounded by a tool that reads numbers as doubles (jq before 1.7, JavaScript): "+
					"copy token_string instead", token)}
			if l, ok := o.srv.Lock(name); ok && l.Holder != nil { // as it is now, after the refusal
				resp["holder"] = toHolderJSON(*l.Holder)
			}
			writeJSON(w, http.StatusConflict, resp)
		case err != nil:
			writeJSON(w, http.StatusInternalServerError, map[string]string{"error": err.Error(), "name": name})
		default:
			writeJSON(w, http.StatusOK, map[string]any{"name": name, "released": toHolderJSON(holder)})
		}
	}))
	mux.HandleFunc("/api/locks/{name}/waiters/{remote_addr}", only("DELETE", func(w http.ResponseWriter, r *http.Request) {
		name, addr := r.PathValue("name"), r.PathValue("remote_addr")
		waiter, err := o.srv.KickWaiter(name, addr)
		if errors.Is(err, monolock.ErrNotFound) {
			writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such waiter in the lock's queue", "name": name, "remote_addr": addr})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"name": name, "kicked": toWaiterJSON(waiter)})
	}))
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		writeJSON(w, http.StatusNotFound, map[string]string{"error": "no such endpoint: " + r.URL.Path})
	})
	return mux
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// isLoopback reports whether a listen address can only be reached from
// this machine.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
