package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"os/exec"
	"os/signal"
	"slices"
	"strconv"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/monolock-dev/monolock"
)

// Exit statuses of monolock run when COMMAND did not decide it.
const (
	exitUsage       = 2
	exitRefused     = 65
	exitUnreachable = 69
	exitLost        = 70
	exitTimeout     = 73
	exitBusy        = 75
	exitCannotRun   = 126
	exitNotFound    = 127
)

const runUsage = `Usage: monolock run [flags] NAME -- COMMAND [ARGS...]

Waits for the lock NAME, runs COMMAND while holding it, and releases it when
COMMAND exits. COMMAND runs directly (no shell) in its own process group,
with MONOLOCK_LOCK, MONOLOCK_TOKEN and MONOLOCK_ADDRESS in its environment.
The lock is held until every process of that group has exited (a process
that leaves the group, with setsid for instance, is outside the lock).
SIGHUP, SIGINT, SIGQUIT, SIGTERM, SIGUSR1 and SIGUSR2 are forwarded to the
group (the first four followed by SIGCONT); SIGTSTP, SIGTTIN, SIGTTOU,
SIGPIPE, SIGABRT and the other signals that would end or stop monolock run
are ignored. If monolock run is killed, COMMAND's first process gets SIGKILL
(Linux). If the lock is lost while COMMAND runs, the group gets SIGTERM,
then SIGKILL after -grace; the connection stays open, with heartbeats,
until the group is gone, so that a server that still hears run keeps the
lock from the next holder meanwhile.

Until the grant, a failure that may mend (no server at -addr, a connection
closed before any reply, as through a balancer without a backend, a server
code below 0x10) is retried as the Go client's DoRetry does, 100ms doubling
to 5s, and the first one's reason is said on stderr; -n makes one attempt.

Exit status:
  COMMAND's own   it ran and the lock was held throughout (128+N if signal N killed it)
  2               bad flags or arguments
  65              the server refused the request (a client error code), or the
                  name or -lease is invalid; never retried
  69              could not connect, or the connection ended before the grant,
                  and a retry cannot help (the server's certificate does not
                  verify, or a protocol violation), or any such failure with -n
  70              the lock was lost while COMMAND ran
  73              -wait ran out before the grant
  75              -n and the lock is busy (set another with -E, as in flock)
  126, 127        COMMAND could not be run, or was not found
  128+N           signal N arrived before COMMAND started

Flags (a flag beats its environment variable, which beats the default):
`

func runMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("monolock run", flag.ContinueOnError)
	addr := fs.String("addr", "127.0.0.1:7070", "server `address`")
	lease := fs.Duration("lease", 10*time.Second, "lease: how fast the server detects that this process died")
	wait := fs.Duration("wait", 0, "give up if not granted within this `duration` (0: wait forever)")
	var nonblock bool
	fs.BoolVar(&nonblock, "n", false, "do not wait: give up at once if the lock is busy")
	fs.BoolVar(&nonblock, "nonblock", false, "same as -n")
	busyCode := fs.Int("E", exitBusy, "exit `status` when the lock is busy with -n")
	grace := fs.Duration("grace", 10*time.Second, "after a lost lock, SIGKILL this long after SIGTERM")
	tlsCA := fs.String("tls-ca", "", "PEM `file` of the CAs that sign the server's certificate (enables TLS)")
	tlsCert := fs.String("tls-cert", "", "PEM `file` of this client's certificate, for mutual TLS")
	tlsKey := fs.String("tls-key", "", "PEM `file` of the key of -tls-cert")
	tlsName := fs.String("tls-server-name", "", "`name` to verify the server's certificate against (default: the host of -addr)")
	admin := fs.String("admin", "", "`address` of the server's admin API, to say who holds the lock while run waits (default: none)")
	envs := map[string]string{"addr": "MONOLOCK_ADDRESS", "admin": "MONOLOCK_ADMIN_ADDRESS"}
	if code, ok := parse(fs, args, envs, runUsage, stdout, stderr); !ok {
		return code
	}
	usageErr := func(format string, a ...any) int {
		fmt.Fprintf(stderr, "monolock run: "+format+" (see monolock run -h)\n", a...)
		return exitUsage
	}
	rest := fs.Args()
	switch {
	case len(rest) > 1 && rest[1] == "--":
		rest = append(rest[:1], rest[2:]...)
	case len(rest) > 1 && len(rest[1]) > 1 && rest[1][0] == '-':
		return usageErr("flags go before NAME; after it comes -- COMMAND")
	}
	if len(rest) < 2 {
		return usageErr("want NAME -- COMMAND [ARGS...]")
	}
	name, command := rest[0], rest[1:]
	switch {
	case *busyCode < 0 || *busyCode > 255:
		return usageErr("-E must be an exit status from 0 to 255")
	case *wait < 0:
		return usageErr("-wait must not be negative")
	case *grace < 0:
		return usageErr("-grace must not be negative")
	case (*tlsCert == "") != (*tlsKey == ""):
		return usageErr("-tls-cert and -tls-key go together")
	}
	if err := monolock.ValidateLease(*lease); err != nil {
		// The protocol's invalid-lease error (0x17), found before the dial:
		// the same status as an invalid name, as the exit-status table says.
		// Said in run's words: the code's canonical text, "lease must be
		// positive", is wrong for a lease that is too long.
		why := "must be at least 1ms"
		switch {
		case *lease > monolock.MaxLease:
			why = fmt.Sprintf("is longer than the protocol's maximum, %v (2^32-1 ms, about 49.7 days)", monolock.MaxLease)
		case *lease >= time.Millisecond:
			why = "is not a whole number of milliseconds"
		}
		fmt.Fprintf(stderr, "monolock run: -lease %v %s\n", *lease, why)
		return exitRefused
	}
	dialer, err := runDialer(*tlsCA, *tlsCert, *tlsKey, *tlsName)
	if err != nil {
		return usageErr("%v", err)
	}
	// What no retry can mend is said at once.
	host, _, err := net.SplitHostPort(*addr)
	switch _, isTLS := dialer.(*tls.Dialer); {
	case err != nil:
		return usageErr("-addr: %v", err)
	case isTLS && host == "" && *tlsName == "":
		return usageErr("-addr %s names no host to verify the server's certificate against: give -tls-server-name", *addr)
	}

	sigs := make(chan os.Signal, 16)
	signal.Notify(sigs, append(append([]os.Signal{}, forwardedSignals...), ignoredSignals...)...)
	defer signal.Stop(sigs)

	// Waiting: until granted, -wait, or a signal.
	ctx, cancel := context.WithCancelCause(context.Background())
	defer cancel(nil)
	if *wait > 0 {
		var stop context.CancelFunc
		ctx, stop = context.WithTimeoutCause(ctx, *wait, errWaitTimeout)
		defer stop()
	}
	var sig os.Signal
	// The retries: an attempt begins with a dial and, when it fails, ends
	// with OnRetry; between the two, the failed one's reason says why run
	// waits, and the waiting line would not.
	held := &heldDialer{d: dialer}
	defer held.finish()
	var failed atomic.Int32
	betweenAttempts := func() bool { n := failed.Load(); return n > 0 && held.dials.Load() == n }
	waited := make(chan struct{})
	// One line after a second of waiting, so that a run that waits is not
	// taken for one that hangs. The protocol does not say who holds a lock;
	// the server's admin API does.
	var patience <-chan time.Time
	if !nonblock {
		t := time.NewTimer(waitNotice)
		defer t.Stop()
		patience = t.C
	}
	go func() {
		defer close(waited)
		for {
			select {
			case <-patience:
				if !betweenAttempts() { // else the retry's line said why
					go func() { fmt.Fprintln(stderr, waitingLine(name, *addr, *admin)) }()
				}
			case s := <-sigs:
				if endsWait(s) {
					sig = s
					cancel(errSignal)
					return
				}
			case <-ctx.Done():
				return
			}
		}
	}()
	var lastRetry error // of the last failed attempt
	client := monolock.New(monolock.Config{Address: *addr, Dialer: held, OnRetry: func(attempt int, err error, _ time.Duration) {
		lastRetry = err
		failed.Store(int32(attempt))
		if attempt == 1 {
			limit := "no -wait: until granted or a signal"
			if *wait > 0 {
				limit = fmt.Sprintf("until granted or -wait %v", *wait)
			}
			// Off this goroutine, as the waiting line: a stalled stderr
			// must not keep run from ending its wait.
			go fmt.Fprintf(stderr, "monolock run: lock %q at %s not acquired yet: %s; retrying (%s)\n", name, *addr, printable(err.Error()), limit)
		}
	}})
	acquire := client.AcquireRetry
	if nonblock { // -n does not wait, for the server no more than for the lock
		acquire = client.TryAcquire
	}
	l, err := acquire(ctx, name, *lease)
	cancel(nil)
	<-waited
	if err == nil && sig != nil { // granted as the signal came: do not start COMMAND
		l.Release()
		err = errSignal
	}
	if err != nil {
		last := ""
		if (errors.Is(err, errWaitTimeout) || errors.Is(err, errSignal)) && betweenAttempts() {
			last = "; the last attempt: " + lastRetry.Error()
		}
		fmt.Fprintf(stderr, "monolock run: %q not acquired: %s\n", name, printable(err.Error()+last))
		var se *monolock.ServerError
		switch {
		case errors.Is(err, errSignal):
			return 128 + int(sig.(syscall.Signal))
		case errors.Is(err, errWaitTimeout):
			return exitTimeout
		case errors.Is(err, monolock.ErrBusy):
			return *busyCode
		case errors.Is(err, monolock.ErrInvalidInput), errors.As(err, &se) && !se.Temporary():
			return exitRefused
		}
		return exitUnreachable
	}
	held.conn.hold()
	defer l.Release()
	return runLocked(l, held.conn, *lease, *addr, command, sigs, *grace, stderr)
}

// waitNotice is how long run waits for a grant before it says so.
const waitNotice = time.Second

// waitingLine says that run waits, and who holds the lock when the admin
// API at admin (if any) answers within a second. The protocol itself does
// not say who holds a lock.
func waitingLine(name, addr, admin string) string {
	line := fmt.Sprintf("monolock run: waiting for lock %q at %s: not granted after %v", name, addr, waitNotice)
	if admin == "" {
		return line + "; another client holds it, or the server has not answered yet (-admin, or monolock locks on the server, says who holds it)"
	}
	u := url.URL{Scheme: "http", Host: admin, Path: "/api/locks/" + name, RawPath: "/api/locks/" + url.PathEscape(name)}
	resp, err := (&http.Client{Timeout: time.Second}).Get(u.String())
	if err != nil {
		return line + fmt.Sprintf("; the admin API at %s did not say who holds it: %s", admin, printable(err.Error()))
	}
	defer resp.Body.Close()
	var l lockJSON
	if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&l) != nil || l.Holder == nil {
		return line + fmt.Sprintf("; the admin API at %s knows no holder (%s)", admin, resp.Status)
	}
	h := l.Holder
	who := h.RemoteAddr
	if h.Identity != "" {
		who = h.Identity + " (" + h.RemoteAddr + ")"
	}
	return line + fmt.Sprintf("; held by %s for %v under token %d; %d in its queue, this run among them", printable(who),
		roundDuration(time.Since(h.Since)), h.Token, len(l.Waiters))
}

var (
	errWaitTimeout = errors.New("-wait ran out")
	errSignal      = errors.New("signal")
)

// The signals of monolock run. Those that end a program by default either
// go on to COMMAND's group or are ignored, so that run never ends while
// the group it holds the lock for lives on. Before COMMAND starts, those
// of endsWait end the wait instead. Signals 32 and 34 cannot be caught by
// a Go program on Linux; they end run like SIGKILL does.
var (
	forwardedSignals = []os.Signal{syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM, syscall.SIGUSR1, syscall.SIGUSR2}
	// SIGPIPE: a closed stderr must not end run. SIGTSTP, SIGTTIN, SIGTTOU:
	// a stopped run sends no heartbeat, so the lease would lapse and the
	// lock go to another while COMMAND, in its own group, runs on. The
	// others end a Go program with a stack dump; sent with kill(2), they
	// are ignored.
	ignoredSignals = append([]os.Signal{syscall.SIGPIPE, syscall.SIGTSTP, syscall.SIGTTIN, syscall.SIGTTOU,
		syscall.SIGABRT, syscall.SIGTRAP, syscall.SIGILL, syscall.SIGBUS, syscall.SIGFPE, syscall.SIGSEGV,
		syscall.SIGSYS}, platformIgnoredSignals...)
)

func endsWait(s os.Signal) bool {
	switch s {
	case syscall.SIGHUP, syscall.SIGINT, syscall.SIGQUIT, syscall.SIGTERM:
		return true
	}
	return false
}

// groupPoll is how often run checks, once COMMAND's first process has
// exited, whether any process of its group is left.
const groupPoll = 20 * time.Millisecond

// runLocked runs command while l is held and returns monolock run's status
// once every process of command's process group has exited.
func runLocked(l *monolock.Lock, conn *heldConn, lease time.Duration, addr string, command []string, sigs <-chan os.Signal, grace time.Duration, stderr io.Writer) int {
	// Orphans of the group become run's children (Linux), so that run reaps
	// them even where nothing else does, and their zombies never hold the
	// group, and the lock, forever.
	becomeSubreaper()
	children := make(chan os.Signal, 1)
	signal.Notify(children, syscall.SIGCHLD)
	defer signal.Stop(children)

	cmd := exec.Command(command[0], command[1:]...)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(),
		"MONOLOCK_LOCK="+l.Name(),
		"MONOLOCK_TOKEN="+strconv.FormatUint(l.Token(), 10),
		"MONOLOCK_ADDRESS="+addr)
	// Its own process group, so that signals and a lost lock reach its
	// children too; and, where the platform has one, a parent-death signal,
	// so that it does not outlive a run that was killed.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	setParentDeathSignal(cmd.SysProcAttr)
	if err := cmd.Start(); err != nil {
		fmt.Fprintf(stderr, "monolock run: %v\n", err)
		if errors.Is(err, exec.ErrNotFound) || errors.Is(err, os.ErrNotExist) {
			return exitNotFound
		}
		return exitCannotRun
	}
	// run reaps its children itself (cmd.Wait would only reap the first):
	// the group ID stays reserved until the group is empty, and the first
	// process's status is kept for the exit status.
	pid := cmd.Process.Pid
	group := -pid
	status, exited := 0, false
	reap := func() {
		for {
			var ws syscall.WaitStatus
			wpid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if err != nil || wpid <= 0 {
				return
			}
			if wpid == pid {
				status, exited = waitStatus(ws), true
			}
		}
	}

	lost := l.Done()
	var said chan struct{} // closed once the loss is told
	tell := func(format string, args ...any) {
		said = make(chan struct{})
		line := fmt.Sprintf("monolock run: lock %q lost ", l.Name()) + fmt.Sprintf(format, args...)
		// Off this loop: a stalled stderr (a full pipe, a terminal stopped
		// with Ctrl-S) must not hold back the group's end, nor its SIGKILL.
		go func() {
			fmt.Fprintln(stderr, line)
			close(said)
		}()
	}
	var kill, poll <-chan time.Time
	for {
		select {
		case <-children:
			reap()
		case <-poll:
			reap()
		case s := <-sigs:
			if slices.Contains(forwardedSignals, s) {
				syscall.Kill(group, s.(syscall.Signal))
				if endsWait(s) {
					continueGroup(group)
				}
			}
		case <-lost:
			lost = nil
			// Heartbeats go on until the group is gone: a server that still
			// hears them keeps the lock from the next holder meanwhile.
			stop := make(chan struct{})
			defer close(stop)
			go conn.heartbeat(lease, stop)
			syscall.Kill(group, syscall.SIGTERM)
			continueGroup(group)
			kill = time.After(grace)
			tell("while %s ran: %s; sent SIGTERM to its process group, SIGKILL in %v", // after the signal
				command[0], printable(l.Err().Error()), grace)
		case <-kill:
			syscall.Kill(group, syscall.SIGKILL)
		}
		if !exited {
			continue
		}
		// Only ESRCH means nobody is left: EPERM is a process that is
		// still there but no longer ours to signal (setuid).
		if err := syscall.Kill(group, 0); err == syscall.ESRCH {
			break
		}
		if poll == nil {
			t := time.NewTicker(groupPoll)
			defer t.Stop()
			poll = t.C
		}
	}
	if l.Err() != nil { // lost: COMMAND's status says nothing of the lock
		if said == nil { // lost as the group ended, before this loop saw it
			tell("as %s ended: %s", command[0], printable(l.Err().Error()))
		}
		select { // said before the exit, unless stderr is stalled
		case <-said:
		case <-time.After(time.Second):
		}
		return exitLost
	}
	return status
}

// continueGroup sends SIGCONT after a terminating signal, as a shell's
// kill %job does: COMMAND's group is in the background, and a process of
// it that read the terminal is stopped by SIGTTIN; a signal to a stopped
// process stays pending, and the lock held, until it is continued.
func continueGroup(group int) { syscall.Kill(group, syscall.SIGCONT) }

// waitStatus is the status a shell would report for the command.
func waitStatus(ws syscall.WaitStatus) int {
	if ws.Signaled() {
		return 128 + int(ws.Signal())
	}
	return ws.ExitStatus()
}

// runDialer returns a plain dialer, or a TLS one when any TLS file is given.
func runDialer(caFile, certFile, keyFile, serverName string) (monolock.Dialer, error) {
	if caFile == "" && certFile == "" && serverName == "" {
		return &net.Dialer{}, nil
	}
	cfg := &tls.Config{ServerName: serverName, MinVersion: tls.VersionTLS12}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("-tls-ca: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("-tls-ca: no PEM certificate in %s", caFile)
		}
	}
	if certFile != "" {
		cert, err := tls.LoadX509KeyPair(certFile, keyFile)
		if err != nil {
			return nil, fmt.Errorf("-tls-cert, -tls-key: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return &tls.Dialer{Config: cfg}, nil
}
