// Package monolock is a server and client for named locks over TCP.
//
// # Model
//
// A client opens a connection and sends one ACQUIRE that names a lock and
// chooses a lease. The connection is then a session: the lock's holder,
// answered with ACQUIRED and a fencing token, or a waiter at the back of
// the lock's strict FIFO queue, answered with WAITING. Closing the
// connection releases the lock or the place in the queue, and the server
// at once pushes ACQUIRED to the next waiter. A session silent for longer
// than its own lease is dropped; the lease sets only how fast a dead
// client is detected, never how long a lock may be held. There is no
// RELEASE message, no session id and no persistence.
//
// # Guarantees
//
//   - At most one holder per lock at any instant, as the server sees it.
//   - Waiters are granted in the order their ACQUIRE was read.
//   - Fencing tokens come from one sequence shared by all locks, strictly
//     increasing for the life of the process and at least the wall-clock
//     time of the grant in Unix nanoseconds, so a restarted server
//     continues above its predecessor unless the clock stepped back in
//     between.
//   - A client that follows the heartbeat rules gives up its claim (at 0.8
//     of its lease, from the send of the last confirmed message) before
//     the server can drop it and grant the lock to someone else.
//
// # Limits
//
// One server, in memory, no replication: when it stops, every lock is
// released and every client is told (ERROR 0x01) or loses its connection.
// Against a holder that stalls (a GC pause, a frozen VM), exclusion is
// only as good as its reaction to the loss: pass the fencing token to the
// guarded resource and let it refuse a token lower than one it has seen.
//
// # Use
//
//	client := monolock.New(monolock.Config{Address: "127.0.0.1:7070"})
//	err := client.Do(ctx, "nightly-import", 10*time.Second,
//		func(ctx context.Context, token uint64) error {
//			return runImport(ctx, token) // stop when ctx is done; pass token on
//		})
//
// Do waits in the queue, heartbeats while fn runs and releases when fn
// returns; when fn's context is cancelled, fn must stop touching the
// resource. Acquire returns a *Lock for code that cannot live inside a
// callback; DoRetry retries what may succeed later. A Server (zero value
// ready; Serve, then Shutdown) has hooks for operators: Authorize, OnEvent,
// Stats, Locks, ForceRelease and KickWaiter. The README covers both sides;
// docs/protocol.md in this module's repository is the normative wire format.
package monolock
