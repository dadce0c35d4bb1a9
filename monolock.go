// Package monolock is a server and client for named locks over TCP.
//
// # Model
//
// A client opens a connection and sends one ACQUIRE naming a lock and
// choosing a lease. The connection is then a session: the holder,
// answered ACQUIRED with a fencing token, or a waiter at the back of the
// lock's strict FIFO queue, answered WAITING. Closing the connection
// releases, and the server at once pushes ACQUIRED to the next waiter. A
// session silent for longer than its own lease is dropped: the lease sets
// how fast a dead client is detected, never how long a lock may be held.
// There is no RELEASE message, no session id and no persistence.
//
// # Guarantees and limits
//
// At most one holder per lock at any instant, as the server sees it; waiters
// granted in the order they joined the queue, each once its ACQUIRE was read
// and authorized; fencing tokens from one sequence for all locks, strictly
// increasing and at least the grant's wall-clock time in Unix nanoseconds,
// so that a restart continues above its predecessor unless the clock stepped
// back. A client that follows the heartbeat rules gives up its claim (0.8 of
// its lease after the send of its last confirmed message) before the server
// can grant the lock to another. One server, in memory: when it stops every
// lock is released. Against a holder that stalls (a GC pause, a frozen VM)
// exclusion is only as good as its reaction to the loss: pass the token to
// the guarded resource and let it refuse a token lower than one it has seen.
//
// # Use
//
//	client := monolock.New(monolock.Config{Address: "127.0.0.1:7070"})
//	err := client.Do(ctx, "nightly-import", 10*time.Second,
//		func(ctx context.Context, token uint64) error {
//			return runImport(ctx, token) // stop when ctx is done; pass token on
//		})
//
// Acquire returns a *Lock for code that cannot live in a callback; DoRetry
// retries what may succeed later. A Server (zero value ready: Serve, then Shutdown) has hooks for
// operators: Authorize, OnEvent, Stats, Locks, ForceRelease, KickWaiter.
// docs/protocol.md in this module's repository is the wire format.
package monolock
