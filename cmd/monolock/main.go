// Command monolock serves named locks over TCP.
//
//	monolock [flags]
//
// Every flag has an environment variable; a flag beats its variable, which
// beats the default. SIGTERM or SIGINT shuts down gracefully (ERROR 0x01 to
// every session, exit 0); a second signal exits at once. SIGHUP re-reads the
// TLS files and the rules; a reload that fails keeps the previous ones.
package main

import (
	"context"
	"crypto/tls"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"monolock"
)

func main() {
	args := os.Args[1:]
	if len(args) > 0 && args[0] == "run" {
		os.Exit(runMain(args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(serve(args, os.Stdout, os.Stderr))
}

const serveUsage = `Usage: monolock [flags]            serve locks
       monolock run [flags] NAME -- COMMAND [ARGS...]
                                  hold a lock around a command (monolock run -h)

Flags (a flag beats its environment variable, which beats the default):
`

// serve runs the server until a signal and returns the exit status.
func serve(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("monolock", flag.ContinueOnError)
	listen := fs.String("listen", "127.0.0.1:7070", "protocol `address` to listen on")
	ioTimeout := fs.Duration("io-timeout", monolock.DefaultIOTimeout,
		"bound on the first frame, the rest of a frame, and every write")
	level := levelFlag(slog.LevelInfo)
	fs.Var(&level, "log-level", "diagnostics `level`: debug, info (the default), warn or error")
	format := choiceFlag{value: "text", choices: []string{"text", "json"}}
	fs.Var(&format, "log-format", "diagnostics `format` on stderr: text or json")
	var sec security
	fs.StringVar(&sec.certFile, "tls-cert", "", "PEM `file` of the server's certificate: TLS on the protocol port")
	fs.StringVar(&sec.keyFile, "tls-key", "", "PEM `file` of the key of -tls-cert")
	fs.StringVar(&sec.clientCAFile, "tls-client-ca", "", "PEM `file` of the CAs of client certificates: mutual TLS")
	fs.StringVar(&sec.aclFile, "acl-file", "", "JSON `file` of authorization rules (needs -tls-client-ca)")
	envs := map[string]string{
		"listen":        "MONOLOCK_LISTEN_ADDRESS",
		"io-timeout":    "MONOLOCK_IO_TIMEOUT",
		"log-level":     "MONOLOCK_LOG_LEVEL",
		"log-format":    "MONOLOCK_LOG_FORMAT",
		"tls-cert":      "MONOLOCK_TLS_CERT",
		"tls-key":       "MONOLOCK_TLS_KEY",
		"tls-client-ca": "MONOLOCK_TLS_CLIENT_CA",
		"acl-file":      "MONOLOCK_ACL_FILE",
	}
	if code, ok := parse(fs, args, envs, serveUsage, stdout, stderr); !ok {
		return code
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "monolock: unexpected argument %q (see monolock -h)\n", fs.Arg(0))
		return 2
	}
	if *ioTimeout <= 0 {
		fmt.Fprintf(stderr, "monolock: -io-timeout must be positive, got %v\n", *ioTimeout)
		return 2
	}
	if err := sec.checkCombination(); err != nil {
		fmt.Fprintf(stderr, "monolock: %v\n", err)
		return 2
	}
	if err := sec.load(); err != nil {
		fmt.Fprintf(stderr, "monolock: %v\n", err)
		return 2
	}

	opts := &slog.HandlerOptions{Level: slog.Level(level)}
	var handler slog.Handler = slog.NewTextHandler(stderr, opts)
	if format.value == "json" {
		handler = slog.NewJSONHandler(stderr, opts)
	}
	logger := slog.New(handler)

	l, err := net.Listen("tcp", *listen)
	if err != nil {
		logger.Error("cannot listen", "err", err)
		return 1
	}
	srv := &monolock.Server{IOTimeout: *ioTimeout, Logger: logger}
	if sec.certFile != "" {
		l = tls.NewListener(l, sec.listenerConfig())
	}
	if sec.aclFile != "" {
		srv.Authorize = sec.authorize
	}
	sigs := make(chan os.Signal, 2)
	signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)
	hups := make(chan os.Signal, 1)
	signal.Notify(hups, syscall.SIGHUP)
	served := make(chan error, 1)
	go func() { served <- srv.Serve(l) }()
	logger.Info("serving", "listen", l.Addr().String(), "io_timeout", *ioTimeout,
		"tls", sec.certFile != "", "mtls", sec.clientCAFile != "", "acl", sec.aclFile != "")

	for {
		select {
		case err := <-served:
			logger.Error("listener failed", "err", err)
			return 1
		case <-hups:
			// Open sessions keep their connections; new ones see the new files.
			if err := sec.load(); err != nil {
				logger.Error("reload failed; keeping the previous certificates and rules", "err", err)
			} else {
				logger.Info("reloaded certificates and rules")
			}
		case sig := <-sigs:
			logger.Info("shutting down", "signal", sig.String())
			go func() {
				sig := <-sigs
				logger.Warn("second signal; exiting at once", "signal", sig.String())
				os.Exit(1)
			}()
			srv.Shutdown(context.Background())
			logger.Info("shut down")
			return 0
		}
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
