// Package monolock is a server and client for named locks over TCP.
//
// # Model
//
// A client opens a connection and sends one ACQUIRE that names a lock and
// chooses a lease. The connection is then a session: either the lock's
// holder, answered with ACQUIRED and a fencing token, or a waiter at the
// back of the lock's strict FIFO queue, answered with WAITING. The session
// lives exactly as long as the connection: closing it releases the lock or
// gives up the place in the queue, and the server at once pushes ACQUIRED
// to the next waiter. A session silent for longer than its own lease is
// dropped; the lease sets only how fast a dead client is detected, never
// how long a lock may be held. There is no RELEASE message, no session id
// and no persistence.
//
// # Guarantees
//
//   - At most one holder per lock at any instant, as the server sees it.
//   - Waiters are granted in the order their ACQUIRE was read.
//   - Every grant carries a fencing token from one sequence shared by all
//     locks, strictly increasing for the life of the process, and at least
//     the wall-clock time of the grant in nanoseconds since the Unix epoch.
//     A restarted server therefore continues above its predecessor unless
//     the wall clock stepped back between the predecessor's last grant and
//     the new server's first.
//   - A client that follows the heartbeat rules gives up its claim (at 0.8
//     of its lease, measured from the send of the last confirmed message)
//     before the server can drop it and grant the lock to someone else.
//
// # Limits
//
// One server, in memory, no replication: when it stops, every lock is
// released and every client is told (ERROR 0x01) or loses its connection.
// Mutual exclusion between a holder that stalls (a long GC pause, a frozen
// VM) and its successor is only as good as the holder's reaction to losing
// its claim; pass the fencing token to the guarded resource and let it
// refuse a token lower than one it has seen.
//
// # Holding a lock
//
//	client := monolock.New(monolock.Config{Address: "127.0.0.1:7070"})
//	err := client.Do(ctx, "nightly-import", 10*time.Second,
//		func(ctx context.Context, token uint64) error {
//			return runImport(ctx, token) // stop when ctx is done; pass token on
//		})
//
// Do waits in the queue, heartbeats while fn runs and releases when fn
// returns. When fn's context is cancelled the lock is no longer confirmed
// and fn must stop touching the resource. Acquire returns a *Lock for code
// that cannot live inside a callback; DoRetry retries what may succeed later.
//
// # Serving
//
//	l, err := net.Listen("tcp", "127.0.0.1:7070")
//	if err != nil { ... }
//	srv := &monolock.Server{}
//	go srv.Serve(l)
//	...
//	srv.Shutdown(ctx) // ERROR 0x01 to every session, then close
//
// For operators, a Server has small hooks: Authorize (with the identity
// of a verified TLS client certificate, see Identity), OnEvent (grants and
// releases in table order), Stats, Locks, ForceRelease and KickWaiter. The
// monolock command builds TLS, rules, metrics, the audit log and the admin
// API on them.
//
// The wire format is in protocol.go and, normatively, in docs/protocol.md
// in this module's repository.
package monolock
