package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
)

const reloadUsage = `Usage: monolock reload [flags]

Sends SIGHUP to a running monolock server, which re-reads its TLS files and
rules and reopens its audit log (its log says which, and whether it
worked). For images without a kill command, such as the FROM scratch
image, where the server is process 1:

    kubectl exec deploy/monolock -- /monolock reload
    docker exec CONTAINER /monolock reload

It signals only a process that runs this same monolock executable as the
server (not monolock run, which would pass the signal on to its command).

Flags:
`

func reloadMain(args []string, stdout, stderr io.Writer) int {
	fs := flag.NewFlagSet("monolock reload", flag.ContinueOnError)
	pid := fs.Int("pid", 1, "process `id` of the server (1: the server is the container's first process)")
	if code, ok := parse(fs, args, nil, reloadUsage, stdout, stderr); !ok {
		return code
	}
	fail := func(code int, format string, a ...any) int {
		fmt.Fprintf(stderr, "monolock reload: "+format+"\n", a...)
		return code
	}
	if fs.NArg() > 0 {
		return fail(2, "unexpected argument %q (see monolock reload -h)", fs.Arg(0))
	}
	if *pid <= 0 {
		return fail(2, "-pid must be a process id, got %d", *pid)
	}
	// A SIGHUP to the wrong process 1 (an init system) reloads or ends it:
	// only a process that runs this very executable is signalled.
	if err := sameExecutable(*pid); err != nil {
		return fail(1, "not signalling process %d: %v", *pid, err)
	}
	if err := syscall.Kill(*pid, syscall.SIGHUP); err != nil {
		return fail(1, "SIGHUP to process %d: %v", *pid, err)
	}
	fmt.Fprintf(stdout, "sent SIGHUP to monolock (process %d); its log says what it reloaded\n", *pid)
	return 0
}

// sameExecutable checks, through /proc, that pid runs the file this
// process runs.
func sameExecutable(pid int) error {
	self, err := os.Stat("/proc/self/exe")
	if err != nil {
		return fmt.Errorf("cannot read /proc/self/exe: %w", err)
	}
	other, err := os.Stat("/proc/" + strconv.Itoa(pid) + "/exe")
	if err != nil {
		return fmt.Errorf("cannot tell what it runs: %w", err)
	}
	if !os.SameFile(self, other) {
		if target, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe"); strings.HasSuffix(target, " (deleted)") {
			return fmt.Errorf("its executable %s was replaced or removed since it started (an upgrade?): restart it, or send SIGHUP with kill", target)
		}
		return fmt.Errorf("it does not run this monolock executable (give the server's process id with -pid)")
	}
	// monolock run, locks and reload are this executable too, and run
	// passes a SIGHUP on to its command: only the server is signalled.
	cmdline, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return fmt.Errorf("cannot tell what it runs: %w", err)
	}
	if args := strings.Split(string(cmdline), "\x00"); len(args) > 1 && slices.Contains([]string{"run", "locks", "reload", "version"}, args[1]) {
		return fmt.Errorf("it runs monolock %s, not the server (give the server's process id with -pid)", args[1])
	}
	return nil
}
