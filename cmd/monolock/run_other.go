//go:build !linux

package main

import (
	"os"
	"syscall"
)

var platformIgnoredSignals []os.Signal

// No parent-death signal here: if run is killed, COMMAND runs on.
func setParentDeathSignal(*syscall.SysProcAttr) {}

// Orphans go to init, which reaps them.
func becomeSubreaper() {}
