// Command monolock serves named locks over TCP.
//
//	monolock [flags]
//
// Every flag has an environment variable; a flag beats its variable, which
// beats the default. SIGTERM or SIGINT shuts down gracefully (ERROR 0x01 to
// every session, exit 0); a second signal exits at once. SIGHUP re-reads the
// TLS files and the rules (a reload that fails keeps the previous ones) and
// reopens the audit log.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/monolock-dev/monolock"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 {
		switch args[0] {
		case "run":
			os.Exit(runMain(args[1:], os.Stdout, os.Stderr))
		case "locks":
			os.Exit(locksMain(args[1:], os.Stdout, os.Stderr))
		case "version":
			os.Exit(versionMain(args[1:], os.Stdout, os.Stderr))
		case "reload":
			os.Exit(reloadMain(args[1:], os.Stdout, os.Stderr))
		}
	}
	os.Exit(serve(args, os.Stdout, os.Stderr))
}

const serveUsage = `Usage: monolock [flags]            serve locks
       monolock run [flags] NAME -- COMMAND [ARGS...]
                                  hold a lock around a command (monolock run -h)
       monolock locks [flags]     who holds what, from the admin API (monolock locks -h)
       monolock version           the module version, VCS revision and Go version (also -version)
       monolock reload [-pid N]   SIGHUP to the server (process 1 by default), for images without kill

Flags (a flag beats its environment variable, which beats the default):
`

// serve runs the server until a signal and returns the exit status.
func serve(args []string, stdout, stderr io.Writer) int {
	// A SIGHUP during the start (a FIFO's reader awaited, a certificate
	// reloader that is quick) waits for the reload that serving begins
	// with, instead of ending the process by its default action.
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	fs := flag.NewFlagSet("monolock", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:7070", "protocol `address` to listen on")
	opsListen := fs.String("ops-listen", "", "`address` for /metrics, /healthz and /readyz (default off)")
	adminListen := fs.String("admin-listen", "", "`address` for the admin HTTP API, which has no authentication: bind it to loopback (default off)")
	ioTimeout := fs.Duration("io-timeout", monolock.DefaultIOTimeout,
		"bound on the first frame, the rest of a frame, and every write")
	level := levelFlag(slog.LevelInfo)
	fs.Var(&level, "log-level", "diagnostics `level`: debug, info (the default), warn or error")
	format := choiceFlag{value: "text", choices: []string{"text", "json"}}
	fs.Var(&format, "log-format", "diagnostics `format` on stderr: text or json")
	auditPath := fs.String("audit-log", "", "JSON-lines audit `file`, or - for stdout (default off)")
	showVersion := fs.Bool("version", false, "print the version, VCS revision and Go version, and exit")
	var sec security
	fs.StringVar(&sec.certFile, "tls-cert", "", "PEM `file` of the server's certificate: TLS on the protocol port")
	fs.StringVar(&sec.keyFile, "tls-key", "", "PEM `file` of the key of -tls-cert")
	fs.StringVar(&sec.clientCAFile, "tls-client-ca", "", "PEM `file` of the CAs of client certificates: mutual TLS")
	fs.StringVar(&sec.aclFile, "acl-file", "", "JSON `file` of authorization rules (needs -tls-client-ca)")
	envs := map[string]string{
		"listen":        "MONOLOCK_LISTEN_ADDRESS",
		"ops-listen":    "MONOLOCK_OPS_LISTEN_ADDRESS",
		"admin-listen":  "MONOLOCK_ADMIN_LISTEN_ADDRESS",
		"io-timeout":    "MONOLOCK_IO_TIMEOUT",
		"log-level":     "MONOLOCK_LOG_LEVEL",
		"log-format":    "MONOLOCK_LOG_FORMAT",
		"audit-log":     "MONOLOCK_AUDIT_LOG",
		"tls-cert":      "MONOLOCK_TLS_CERT",
		"tls-key":       "MONOLOCK_TLS_KEY",
		"tls-client-ca": "MONOLOCK_TLS_CLIENT_CA",
		"acl-file":      "MONOLOCK_ACL_FILE",
	}
	if code, ok := parse(fs, args, envs, serveUsage, stdout, stderr); !ok {
		return code
	}
	if *showVersion {
		return versionMain(nil, stdout, stderr)
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "monolock: "+format+"\n", a...)
		return code
	}
	if fs.NArg() > 0 {
		return fail(2, "unexpected argument %q (see monolock -h)", fs.Arg(0))
	}
	if *listen == "" {
		return fail(2, "-listen is empty (or MONOLOCK_LISTEN_ADDRESS is): give a host:port such as 127.0.0.1:7070")
	}
	switch {
	case *ioTimeout <= 0:
		return fail(2, "-io-timeout must be positive, got %v", *ioTimeout)
	case *ioTimeout < minIOTimeout:
		return fail(2, "-io-timeout %v is too short to read a frame: it must be at least %v", *ioTimeout, minIOTimeout)
	case *ioTimeout > maxIOTimeout:
		return fail(2, "-io-timeout %v is longer than %v: a client could hold a connection that long without a frame", *ioTimeout, maxIOTimeout)
	}
	if _, port, _ := net.SplitHostPort(*opsListen); *opsListen == *adminListen && port != "0" && port != "" {
		return fail(2, "-ops-listen and -admin-listen are both %s: give them different addresses", *opsListen)
	}
	if err := sec.checkCombination(); err != nil {
		return fail(2, "%v", err)
	}
	if err := sec.load(); err != nil {
		return fail(2, "%v", err)
	}

	opts := &slog.HandlerOptions{Level: slog.Level(level), ReplaceAttr: replaceAttr}
	diag := newDiagWriter(stderr)
	defer diag.flush(diagFlushBound)
	var handler slog.Handler = slog.NewTextHandler(diag, opts)
	if format.value == "json" {
		handler = slog.NewJSONHandler(diag, opts)
	}
	logger := slog.New(handler)

	srv := &monolock.Server{IOTimeout: *ioTimeout, Logger: logger}
	o := &ops{srv: srv, started: time.Now(), sec: &sec, config: map[string]any{
		"listen": *listen, "ops_listen": *opsListen, "admin_listen": *adminListen,
		"io_timeout_ms": ioTimeout.Milliseconds(), "log_level": level.String(), "log_format": format.value,
		"audit_log": *auditPath, "tls": sec.certFile != "", "mtls": sec.clientCAFile != "", "acl_file": sec.aclFile,
	}}
	if *auditPath != "" {
		audit, err := openAudit(*auditPath, logger)
		if err != nil {
			return fail(2, "%v", err)
		}
		o.audit = audit
	}
	// The histograms are served only on the ops port, and every event costs
	// a goroutine's wake-up (30 µs of CPU an acquire-release cycle): no
	// hook when nothing reads it.
	if *opsListen != "" || o.audit != nil {
		srv.OnEvent = o.event // the histograms, and the audit log if any
	}
	if sec.aclFile != "" {
		srv.Authorize = sec.authorize
	}

	// A listen address that cannot be used is a bad value: status 2.
	// No TCP keepalive: the lease finds a dead client, the io-timeout a
	// silent one, and keepalive costs four system calls a connection.
	l, err := (&net.ListenConfig{KeepAlive: -1}).Listen(context.Background(), "tcp", *listen)
	if err != nil {
		return fail(2, "-listen: %v", err)
	}
	if sec.certFile != "" {
		l = monolock.NewTLSListener(l, sec.listenerConfig())
	}
	// Every address is listened on before anything is served or said to
	// be: one that cannot be used stops the start with nothing served.
	type httpListener struct {
		addr, what string
		handler    http.Handler
		l          net.Listener
	}
	var listeners []httpListener
	for _, h := range []httpListener{{addr: *opsListen, what: "ops", handler: o.opsHandler()}, {addr: *adminListen, what: "admin", handler: o.adminHandler()}} {
		if h.addr == "" {
			continue
		}
		if h.l, err = net.Listen("tcp", h.addr); err != nil {
			for _, prev := range listeners {
				prev.l.Close()
			}
			return fail(2, "-%s-listen: %v", h.what, err)
		}
		listeners = append(listeners, h)
	}
	var httpServers []*http.Server
	for _, h := range listeners {
		if h.what == "admin" {
			h.handler = adminGuard(h.addr, h.l.Addr(), h.handler)
			// The address bound, not the one given: a host name that
			// resolves to loopback is loopback.
			if !isLoopback(h.l.Addr().String()) {
				logger.Warn("the admin API has no authentication and listens beyond this machine; bind it to loopback",
					"admin_listen", h.addr)
			}
		}
		hs := &http.Server{Handler: h.handler, ReadHeaderTimeout: httpReadHeaderTimeout, ReadTimeout: httpReadTimeout,
			WriteTimeout: httpWriteTimeout, IdleTimeout: httpIdleTimeout, ErrorLog: slog.NewLogLogger(handler, slog.LevelWarn)}
		httpServers = append(httpServers, hs)
		go hs.Serve(h.l)
		logger.Info("serving "+h.what+" HTTP", "listen", h.l.Addr().String())
	}

	// A reader of the audit log (or of the diagnostics) that goes away must
	// cost write errors, not the server: Go ends a program whose write to
	// stdout or stderr meets a closed pipe, unless SIGPIPE is ignored.
	signal.Ignore(syscall.SIGPIPE)
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	// Reloads run one at a time, apart from the signal loop: their log lines
	// block on a stalled stderr, and must not keep SIGTERM waiting. SIGHUPs
	// that come during a reload make one more.
	go func() {
		for range hups {
			reload(logger, &sec, o.audit)
		}
	}()
	logger.Info("serving", "listen", l.Addr().String(), "io_timeout", *ioTimeout,
		"tls", sec.certFile != "", "mtls", sec.clientCAFile != "", "acl", sec.aclFile != "")

	for {
		select {
		case err := <-served:
			logger.Error("listener failed", "err", err)
			return 1
		case sig := <-sigs:
			o.stopping.Store(true) // health turns 503 before any session is closed
			// The way out is in place before anything is logged: a log
			// line blocks for as long as stderr is stalled.
			go func() {
				sig := <-sigs
				attrs := []any{"signal", sig.String()}
				if o.audit != nil {
					attrs = append(attrs, "audit_lines_lost", o.audit.queued.Load())
				}
				logged := make(chan struct{})
				go func() {
					logger.Warn("second signal; exiting at once", attrs...)
					close(logged)
				}()
				select {
				case <-logged:
				case <-time.After(secondSignalLogBound):
				}
				diag.flush(secondSignalLogBound)
				os.Exit(1)
			}()
			logger.Info("shutting down", "signal", sig.String())
			if o.audit != nil {
				o.audit.beginClose(auditDrainBound)
			}
			srv.Shutdown(context.Background())
			status := 0
			if o.audit != nil && o.audit.close(srv.Stats().EventsDropped) > 0 {
				status = 1
			}
			// The HTTP servers stop after the protocol listener has finished.
			for _, hs := range httpServers {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				hs.Shutdown(ctx)
				cancel()
			}
			logger.Info("shut down")
			return status
		}
	}
}

// replaceAttr writes every time of the diagnostics in UTC, whatever TZ says,
// so that lines from machines in different zones sort and compare; and
// every duration as text ("5s"), which JSON would otherwise write as
// nanoseconds.
func replaceAttr(groups []string, a slog.Attr) slog.Attr {
	switch a.Value.Kind() {
	case slog.KindTime:
		a.Value = slog.TimeValue(a.Value.Time().UTC())
	case slog.KindDuration:
		a.Value = slog.StringValue(a.Value.Duration().String())
	}
	return a
}

// secondSignalLogBound is how long the second signal waits for its log
// line, which a stalled stderr would hold for ever.
const secondSignalLogBound = 500 * time.Millisecond

// diagFlushBound is how long an exit waits for the diagnostics still queued.
const diagFlushBound = time.Second

// minIOTimeout is the least -io-timeout: a frame must be readable in it.
const minIOTimeout = 10 * time.Millisecond

// maxIOTimeout is the most: the io-timeout is how long a connection that
// sends nothing may cost a descriptor, and a day is more than any network
// needs to carry a frame.
const maxIOTimeout = 24 * time.Hour

// The bounds of the ops and admin HTTP servers: their connections cost
// descriptors, like the protocol port's.
const (
	httpReadHeaderTimeout = 5 * time.Second
	httpReadTimeout       = 10 * time.Second
	httpWriteTimeout      = 10 * time.Second
	httpIdleTimeout       = 10 * time.Second
)

// reload is SIGHUP: it re-reads the TLS files and the rules, starts
// reopening the audit log, and says which of them it did. Nothing here
// waits for the audit sink.
func reload(logger *slog.Logger, sec *security, audit *auditLog) {
	var files []string
	if sec.certFile != "" {
		files = append(files, "TLS certificate and key")
	}
	if sec.clientCAFile != "" {
		files = append(files, "client CA")
	}
	if sec.aclFile != "" {
		files = append(files, "rules")
	}
	if len(files) > 0 {
		// Open sessions keep their connections; new ones see the new files.
		if err := sec.load(); err != nil {
			logger.Error("reload failed; keeping the previous "+strings.Join(files, ", "), "err", err)
		} else {
			logger.Info("reloaded " + strings.Join(files, ", "))
		}
	}
	switch {
	case audit == nil:
		if len(files) == 0 {
			logger.Info("SIGHUP: nothing to reload (no TLS files, no rules, no audit log file)")
		}
	case audit.path == "-":
		logger.Info("SIGHUP: the audit log is stdout: nothing to reopen")
	case audit.reopen(): // it logs "reopening the audit log" before it starts
	default:
		logger.Warn("the previous audit log reopen has not reached the writer yet (is the sink stalled?); not starting another", "path", audit.path)
	}
}

// parse applies the environment, then the command line, to fs. It returns
// ok, or the exit status: 0 after -h (usage and the flags on stdout), 2
// after a one-line error.
func parse(fs *flag.FlagSet, args []string, envs map[string]string, usage string, stdout, stderr io.Writer) (int, bool) {
	fs.SetOutput(io.Discard) // errors are reported in one line below
	fs.Usage = func() {}
	for name, env := range envs {
		f := fs.Lookup(name)
		f.Usage += fmt.Sprintf(" (env %s)", env)
		if v, ok := os.LookupEnv(env); ok {
			if err := fs.Set(name, v); err != nil {
				fmt.Fprintf(stderr, "%s: invalid value %q for %s: %v\n", fs.Name(), v, env, err)
				return 2, false
			}
		}
	}
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fmt.Fprint(stdout, usage)
			fs.SetOutput(stdout)
			fs.PrintDefaults()
			return 0, false
		}
		fmt.Fprintf(stderr, "%s: %v (see %s -h)\n", fs.Name(), err, fs.Name())
		return 2, false
	}
	return 0, true
}

type levelFlag slog.Level

func (l *levelFlag) String() string { return strings.ToLower(slog.Level(*l).String()) }
func (l *levelFlag) Set(s string) error {
	switch s {
	case "debug", "info", "warn", "error":
		return (*slog.Level)(l).UnmarshalText([]byte(s))
	}
	return fmt.Errorf("want debug, info, warn or error")
}

type choiceFlag struct {
	value   string
	choices []string
}

func (c *choiceFlag) String() string { return c.value }
func (c *choiceFlag) Set(s string) error {
	for _, choice := range c.choices {
		if s == choice {
			c.value = s
			return nil
		}
	}
	return fmt.Errorf("want %s", strings.Join(c.choices, " or "))
}
