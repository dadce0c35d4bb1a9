package main

import (
	"os"
	"syscall"
)

var platformIgnoredSignals = []os.Signal{syscall.SIGSTKFLT}

// setParentDeathSignal kills COMMAND's first process when run dies, even
// by SIGKILL. The kernel ties it to the thread that started the process;
// Go ends no thread of its own while the program runs (only a goroutine
// that exits while locked to its thread would, and run has none).
func setParentDeathSignal(a *syscall.SysProcAttr) { a.Pdeathsig = syscall.SIGKILL }

// becomeSubreaper makes run the parent of COMMAND's orphans, so that it
// reaps them: with a PID 1 that reaps nothing (some containers), a zombie
// of the group would otherwise hold the lock for ever.
func becomeSubreaper() {
	const prSetChildSubreaper = 36
	syscall.RawSyscall(syscall.SYS_PRCTL, prSetChildSubreaper, 1, 0)
}
