package main

import (
	"context"
	"net/http"
	"os/exec"
	"testing"
	"time"
)

// wait bounds what should happen at once; generous, for a noisy machine.
const wait = 10 * time.Second

// httpClient gives up on an ops or admin request after wait.
var httpClient = &http.Client{Timeout: wait}

// await returns what ch delivers, failing the test if nothing comes within
// wait: what says what did not happen.
func await[T any](t testing.TB, ch <-chan T, what string) T {
	t.Helper()
	select {
	case v := <-ch:
		return v
	case <-time.After(wait):
		t.Fatalf("%s did not happen within %v", what, wait)
		panic("unreachable")
	}
}

// awaitFunc runs f on a goroutine of its own and waits for it as await does.
func awaitFunc(t testing.TB, what string, f func()) {
	t.Helper()
	done := make(chan struct{})
	go func() {
		defer close(done)
		f()
	}()
	await(t, done, what)
}

// bounded is a context that ends after wait, for calls that take one.
func bounded(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	t.Cleanup(cancel)
	return ctx
}

// killAfter kills cmd if it is still running after wait, so that a test
// reading its output until a line comes is bounded too: the kill ends the
// output. Stop the returned timer once the line came.
func killAfter(cmd *exec.Cmd) *time.Timer {
	return time.AfterFunc(wait, func() { cmd.Process.Kill() })
}
