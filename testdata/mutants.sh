#!/usr/bin/env bash
# Plants realistic bugs one at a time in a scratch copy of the working tree
# and runs the tests that should catch each. One line per mutant, then
# "N caught, M survived". Exit status 0 only when every mutant was caught
# by a failing assertion: a mutant that survives, is caught only by go
# test's timeout, no longer applies (its text is gone from the file) or no
# longer builds is a failure of the suite or of this list, to be fixed.
#
#   bash testdata/mutants.sh               # every mutant, one at a time
#   bash testdata/mutants.sh 'token|push'  # those whose name matches the regex
#   MUTANT_TIMEOUT=5m bash testdata/mutants.sh
#
# Not in CI: it takes tens of minutes. Run it before a release and after a
# change to the session lifecycle or to the client's timing. The real tree
# is never modified.
#
# A mutant is: name, file, the tests that should catch it (a go test -run
# regex), the package, the exact text to replace (once in the file) and its
# replacement. Keep the text small and precise, so that it survives
# unrelated edits; when an edit removes it, rewrite the mutant.
set -uo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
filter=${1:-}
timeout=${MUTANT_TIMEOUT:-2m}

names=() files=() regexes=() pkgs=() olds=() news=()
mutant() { # name file regex package old new
  names+=("$1") files+=("$2") regexes+=("$3") pkgs+=("$4") olds+=("$5") news+=("$6")
}

# --- The server (server.go) ---
# The session lifecycle of docs/sessions.md; the rule numbers are those of
# the block at the top of server.go.
mutant lifo-promotion server.go 'TestFIFOOrderAndLeavingFromTheMiddle|TestLockTableAgainstModel|TestRaceHunt$' . \
  'for front := l.waiters.Front(); front != nil && l.holder == nil; front = l.waiters.Front() {' \
  'for front := l.waiters.Back(); front != nil && l.holder == nil; front = l.waiters.Back() {'
# The promoter decides the push and starts no writer for it.
mutant missing-push server.go 'TestGrantWaitAndPushPromotion' . \
  $'\t\t\tsrv.grantLocked(l, next)\n\t\t\tsrv.wakeLocked(next)\n\t\t}' \
  $'\t\t\tsrv.grantLocked(l, next)\n\t\t}'
# The promoted waiter is pushed the leaving holder's token.
mutant reused-token server.go 'TestGrantWaitAndPushPromotion|TestTokensAboveTheClockGoOnByOne' . \
  $'\t\t\tsrv.promoteLocked(l)\n' \
  $'\t\t\tsrv.promoteLocked(l)\n\t\t\tif l.holder != nil {\n\t\t\t\tl.holder.token = s.token\n\t\t\t}\n'
# Rule 1: a write (a promotion's push among them) under the table's mutex.
mutant push-under-the-mutex server.go 'TestBlockedPromotionPushDelaysNobody' . \
  'n, err = s.conn.Write(b)' \
  'srv.mu.Lock(); n, err = s.conn.Write(b); srv.mu.Unlock()'
mutant lease-not-refreshed server.go 'TestHeartbeatsKeepAShortLeaseAlive' . \
  'deadline = s.leaseEndLocked()' \
  '_ = s'
mutant last-seen-not-refreshed server.go 'TestHeartbeatsKeepAShortLeaseAlive' . \
  $'s.seen = now\n\t\ts.owe(beats)' \
  's.owe(beats)'
mutant token-plus-one-missing server.go 'TestTokensAboveTheClockGoOnByOne|TestTokenSequence' . \
  't := srv.lastToken + 1' \
  't := srv.lastToken'
mutant no-io-timeout-before-acquire server.go 'TestIOTimeout$' . \
  $'s.conn.SetDeadline(time.Now().Add(srv.ioTimeout()))\n\tn, err := s.conn.Read(s.rbuf[:])' \
  $'s.conn.SetDeadline(time.Now().Add(time.Hour))\n\tn, err := s.conn.Read(s.rbuf[:])'
mutant no-io-timeout-inside-acquire server.go 'TestIOTimeout$|TestIOTimeoutBoundsTheWholeRestOfAFrame' . \
  's.conn.SetDeadline(time.Now().Add(s.srv.ioTimeout()))' \
  's.conn.SetDeadline(time.Now().Add(time.Hour))'
# acquire: the first frame's reads set no write deadline: over TLS, a
# KeyUpdate's answer meets the handshake's (found by the review of the
# eleventh review's TLS fixes).
mutant acquire-reads-leave-the-write-deadline server.go 'TestTLS13KeyUpdateBeforeTheAcquireKeepsTheSession' . \
  $'s.conn.SetDeadline(time.Now().Add(srv.ioTimeout()))\n\tn, err := s.conn.Read(s.rbuf[:])' \
  $'s.conn.SetReadDeadline(time.Now().Add(srv.ioTimeout()))\n\tn, err := s.conn.Read(s.rbuf[:])'
# Read: the rest of an ACQUIRE gets a fresh io-timeout at each read, so a
# dribbling client holds a frame open for many io-timeouts.
mutant acquire-deadline-renewed-per-read server.go 'TestIOTimeoutBoundsTheWholeRestOfAFrame' . \
  'if s.w != 0 {' \
  'if true {'
# Rule 4 (endLocked): it keeps promoting while the server is closing.
mutant promotion-during-shutdown server.go 'TestShutdownPromotesNobody|TestShutdownSendsShuttingDownToEverySession' . \
  $'if !srv.closing.Load() {\n\t\t\tsrv.promoteLocked(l)\n\t\t}' \
  'srv.promoteLocked(l)'
mutant duplicate-acquire-wrong-code server.go 'TestErrorsAfterTheGrant' . \
  'bad = ErrDuplicateAcquire' \
  'bad = unknownType(TypeAcquire)'
# Rule 8 (kick): the administrator decides the ERROR 0x02 and starts no
# writer for it.
mutant kick-wakes-nobody server.go 'TestForceReleaseAndKickWaiter|TestForceReleaseDoesNotWaitForNextWaiter|TestKickWaiterDoesNotWaitForSlowClient' . \
  $'srv.stopLocked(s, ErrClosedByAdmin)\n\tsrv.wakeLocked(s)' \
  'srv.stopLocked(s, ErrClosedByAdmin)'
mutant authorize-without-identity server.go 'TestMutualTLSIdentitiesAndRules' ./cmd/monolock \
  '!srv.Authorize(s.identity, f.Name)' \
  '!srv.Authorize("", f.Name)'
# Rule 4 (endLocked): a waiter ending with an ERROR owed stays queued, so a
# promotion can reach it after its final frame.
mutant push-after-final-frame server.go 'TestWaiterEndingAsHolderLeaves|TestPromotionSkipsEndingWaiter' . \
  $'} else {\n\t\tl.waiters.Remove(s.elem)' \
  $'} else if s.final == nil {\n\t\tl.waiters.Remove(s.elem)'
# drainLocked: after a failed write, what is still owed is written.
mutant write-after-failed-write server.go 'TestNothingIsWrittenAfterAFrameLeftUnfinished|TestNoWriteAfterFailedPush|TestNoPushAfterAFailedWaiting' . \
  $'srv.stopLocked(s, err)\n\t\t\ts.owedWaiting, s.owedAcquired, s.final = 0, 0, nil' \
  'srv.stopLocked(s, err)'
# Rule 4 (stopLocked): another party's end keeps what was owed (a push, a
# heartbeat's answer) and writes it before the final ERROR.
mutant push-after-force-release server.go 'TestForceReleaseDropsADecidedPush|TestNoPushAfterForceRelease|TestNoHeartbeatReplyAfterKickWaiter' . \
  $'srv.endLocked(s, why)\n\t\ts.dropLocked() // after endLocked' \
  $'srv.endLocked(s, why)\n\t\ts.stopped.Store(true) // after endLocked'
# Rule 2 (heartbeatLocked): a heartbeat read as an administrator ends the
# session is answered.
mutant heartbeat-reply-after-stop server.go 'TestForceReleaseDropsADecidedHeartbeatReply|TestNoHeartbeatReplyAfterForceRelease|TestNoHeartbeatReplyAfterKickWaiter' . \
  $'\tcase s.phase >= phaseEnding:\n\t\treturn errEnded\n' \
  ''
# Rule 6 (heartbeatLocked): heartbeats read together with a bad byte are
# left unanswered (over pipes each heartbeat is read alone; over TCP a
# burst and its bad byte arrive in one read).
mutant beats-before-a-bad-byte-unanswered server.go 'TestRaceHuntOverTCP$|TestAcquireAndBadByteInOneSegmentAreDecidedTogether|TestSplitAndCoalescedFrames' . \
  $'\tif beats > 0 {' \
  $'\tif beats > 0 && bad == nil {'
# Rule 4 (endLocked): an end without an ERROR (a lease, a read error, too
# many answers owed) keeps what was owed and writes it.
mutant end-without-error-keeps-owed server.go 'TestExpiredSessionGetsNothingMore|TestOwedAnswersAreBounded|TestBlockedWriteEndsAtTheLease' . \
  $'} else { // an end without a word: nothing more is written\n\t\ts.dropLocked()' \
  $'} else { // an end without a word: nothing more is written\n\t\ts.stopped.Store(true)'
# Rule 5 (endLocked): an end without a word does not stop a writer that has
# taken a push: it is written after the end, and after the next grant.
mutant own-end-not-stopped server.go 'TestPushTakenBeforeALeaseEndIsNeverWritten' . \
  $'} else { // an end without a word: nothing more is written\n\t\ts.dropLocked()' \
  $'} else { // an end without a word: nothing more is written\n\t\ts.owedWaiting, s.owedAcquired = 0, 0'
# Rule 5 (dropLocked): the cut is set after the critical section that
# decided the end, as before the seventh review: a write may begin between.
mutant cut-after-the-end server.go 'TestPushBegunAtALeaseEndIsCut|TestPushDuringALeaseEndsCriticalSectionIsCut' . \
  $'\t\ts.conn.SetWriteDeadline(time.Unix(1, 0))\n' \
  $'\t\tgo func() { time.Sleep(time.Millisecond); s.conn.SetWriteDeadline(time.Unix(1, 0)) }()\n'
# Rule 4 (endLocked): a kicked waiter stays queued. (Not TestRaceHunt: a
# promotion may then loop on that waiter, and the run end only by the timeout.)
mutant kick-leaves-waiter-queued server.go 'TestWaiterEndingAsHolderLeaves|TestForceReleaseAndKickWaiter' . \
  $'} else {\n\t\tl.waiters.Remove(s.elem)' \
  $'} else if !errors.Is(why, ErrClosedByAdmin) {\n\t\tl.waiters.Remove(s.elem)'
mutant force-release-ignores-token server.go 'TestForceReleaseByToken' . \
  'case token != 0 && h.token != token:' \
  'case false:'
# The flood's rate ignores a short lease: a read waits to a lease of 1 ms's end.
mutant pause-ignores-the-lease server.go 'TestShortLeaseHoldsOverTLS|TestFloodPauseOverTLS|TestFloodRateUnitIsAQuarterOfAShortLease' . \
  'unit := min(floodPause, s.lease/4)' \
  'unit := floodPause'
# A unit of half the lease: a flood with a short lease is answered faster.
mutant pause-half-the-lease server.go 'TestFloodPauseOverTLS|TestFloodRateUnitIsAQuarterOfAShortLease' . \
  'unit := min(floodPause, s.lease/4)' \
  'unit := min(floodPause, s.lease/2)'
# A pause after each read, not a rate: it adds to the server's own delays.
mutant pause-not-a-rate server.go 'TestShortLeaseHoldsOverTLS' . \
  'if wait := min(time.Until(r.due)-floodSlack*unit, time.Until(deadline)); wait > 0 {' \
  'if wait := min(cost, time.Until(deadline)); wait > 0 {'
# The rate's clock never catches up with a client that fell behind it.
mutant rate-keeps-old-debt server.go 'TestShortLeaseHoldsOverTLS|TestFloodPauseAfterAMultiByteRead' . \
  'r.due = later(r.due, now).Add(cost)' \
  'r.due = later(r.due, time.Time{}).Add(cost)'
# One-byte reads over TCP are counted against the rate too.
mutant tcp-single-byte-reads-counted server.go 'TestFloodPauseAfterAMultiByteRead' . \
  'case n > 1 || s.tls != nil:' \
  'case n > 0:'
# Over NewTLSListener the records read from the network are not counted, but their KiB.
mutant tls-records-not-counted server.go 'TestFloodPauseOverTLS' . \
  'c.units += 1 + c.body>>10' \
  'c.units += c.body >> 10'
# Over NewTLSListener a read costs its bytes, the first too, besides its record: a unit twice.
mutant tls-read-charged-twice server.go 'TestFloodPauseOverTLS' . \
  'case m != nil:' \
  'case false:'
# A record padded to 16 KiB costs what a byte's does.
mutant tls-record-kib-not-counted server.go 'TestKeyUpdateFloodIsHeldToTheRate' . \
  'c.units += 1 + c.body>>10' \
  'c.units++'
# A record's header is read as 4 bytes: every count after the first record is wrong.
mutant tls-record-header-4 server.go 'TestKeyUpdateFloodIsHeldToTheRate|TestFloodPauseOverTLS' . \
  'c.header == 5 {' \
  'c.header == 4 {'
# Records read together cost more than apart (a millisecond past a read's first): honest short leases end.
mutant tls-extra-records-at-a-millisecond server.go 'TestTLSRecordsReadTogetherCostWhatTheyWouldApart' . \
  'cost = time.Duration(n-1+m.take()) * unit' \
  'k := m.take(); cost = time.Duration(n-1+min(k, 1))*unit + time.Duration(max(k-1, 0))*floodPause'
# The handshake's units are charged, at a millisecond before the ACQUIRE's first read: an honest client with a large certificate chain or ClientHello, or one cut into small records, loses a short lease.
mutant tls-handshake-charged-in-the-acquire server.go 'TestLargeClientChainCostsAnHonestClientNothing|TestAHandshakeIsNotChargedToItsSession|TestShortLeaseHoldsOverTLS' . \
  'm.units = m.body >> 10                // the rest of a record begun is charged' \
  '// charged'
# The rest of a record whose header came with the Finished goes uncharged with the handshake: up to 16 KiB decrypted free.
mutant tls-record-begun-with-the-finished-free server.go 'TestARecordBegunWithTheFinishedIsCharged' . \
  'm.units = m.body >> 10                // the rest of a record begun is charged' \
  'm.units = 0'
# The handshake's units, not charged, are credit: a handshake leaves units free (32, as once).
mutant tls-handshake-leaves-units-free server.go 'TestAConnectionsFreeRecordsDoNotGrowWithItsAcquire|TestTLSBurstIsTheDocumentedOne|TestTLSBurstAtMost' . \
  'm.units = m.body >> 10                // the rest of a record begun is charged' \
  'm.units, m.free = 0, 32'
# No bound on the records the handshake takes in.
mutant tls-handshake-records-unbounded server.go 'TestAHandshakeOfManyRecordsEnds' . \
  'if c.units > maxHandshakeUnits {' \
  'if false {'
# The records after the handshake are read with no rate.
mutant tls-records-unpaced server.go 'TestKeyUpdatesInsideTheAcquireAreHeldToTheRate|TestAFragmentedHandshakeMessageIsHeldToTheRate|TestKeyUpdateFloodIsHeldToTheRate' . \
  'c.pace(time.Duration(c.take())*c.unit, c.unit, c.readBy, time.Now(), c.done)' \
  '_ = c.readBy'
# The ACQUIRE's records are read with no rate (but its rest's, as before): a handshake message in its first read goes uncharged.
mutant tls-acquire-unpaced server.go 'TestAFragmentedHandshakeMessageIsHeldToTheRate|TestKeyUpdatesInsideTheAcquireAreHeldToTheRate' . \
  'm.unit, m.done = floodPause, srv.done' \
  'm.unit, m.done = 0, srv.done'
# The records in run are charged only with each of its reads (as before): a handshake message in one read goes uncharged.
mutant tls-run-records-charged-a-read server.go 'TestAFragmentedHandshakeMessageIsHeldToTheRate' . \
  'acct, m.unit = &m.rate, unit' \
  'acct, m.unit = &m.rate, 0'
# Records and bytes are charged to two accounts, each with its slack.
mutant tls-two-accounts server.go 'TestARecordAndItsBytesShareOneRate' . \
  'acct, m.unit = &m.rate, unit' \
  'm.unit = unit'
# The rate's wait for the rest of an ACQUIRE outlasts its io-timeout.
mutant tls-acquire-wait-past-io-timeout server.go 'TestKeyUpdatesInsideTheAcquireMeetTheIOTimeout' . \
  $'c.readBy = t\n\treturn c.Conn.SetDeadline(t)' \
  $'c.readBy = t.Add(time.Hour)\n\treturn c.Conn.SetDeadline(t)'
# The records the ACQUIRE's bytes came in are charged: one sent a byte a record waits, or meets its io-timeout.
mutant tls-acquire-records-charged server.go 'TestAcquireARecordAByteIsAnsweredAtOnce' . \
  'if m := s.meter(); m != nil && n > 0 {' \
  'if m := s.meter(); m != nil && n < 0 {'
# A unit free for each byte of the ACQUIRE, not each read: a record of many bytes frees as many KeyUpdates.
mutant tls-acquire-free-a-byte server.go 'TestAConnectionsFreeRecordsDoNotGrowWithItsAcquire' . \
  $'if m := s.meter(); m != nil && n > 0 {\n\t\t\tm.free++' \
  $'if m := s.meter(); m != nil && n > 0 {\n\t\t\tm.free += n'
# The free units left after the ACQUIRE do not pay for what its reads took in ahead: an ACQUIRE's records, read together, are charged.
mutant tls-acquire-free-left-unused server.go 'TestAcquireARecordAByteWithABigBufferCostsNothing|TestAHandshakeIsNotChargedToItsSession|TestShortLeaseHoldsOverTLS' . \
  'm.units, m.free = max(m.units-m.free, 0), 0' \
  'm.free = 0'
# After Shutdown's start the records are read on, unpaced.
mutant tls-reads-on-after-shutdown server.go 'TestShutdownEndsTheReadsOfASessionItStopped' . \
  $'case <-c.done: // Shutdown has ended the session, and no longer paces it\n\t\t\treturn 0, net.ErrClosed' \
  $'case <-c.done: // Shutdown has ended the session, and no longer paces it'
# The records in run are paced at a millisecond whatever the lease.
mutant tls-run-unit-not-the-leases server.go 'TestShortLeaseHoldsOverTLS|TestAcquireARecordAByteWithABigBufferCostsNothing|TestShortLeaseFloodIsHeldToTheRate' . \
  'acct, m.unit = &m.rate, unit' \
  'acct, m.unit = &m.rate, floodPause'
# The free units left after the ACQUIRE are carried into run.
mutant tls-free-carried-into-run server.go 'TestFloodPauseOverTLS|TestAnAcquiresFreeUnitsEndWithIt' . \
  'm.units, m.free = max(m.units-m.free, 0), 0' \
  'm.units += 0'
# A read from the network under crypto/tls takes all there is: KeyUpdates read ahead in the ACQUIRE are answered before any charge.
mutant tls-read-ahead-unbounded server.go 'TestKeyUpdatesReadAheadInTheAcquireArePaced|TestKeyUpdatesBehindAPaddedRecordArePaidFor' . \
  'n, err := c.Conn.Read(b[:min(len(b), maxReadAhead)])' \
  'n, err := c.Conn.Read(b)'
# A failed handshake closes at once, the client's last records unread: the close is a reset, not the alert.
mutant tls-failed-handshake-not-drained server.go 'TestRefusedClientCertificateGetsTheAlertWhenItWritesLate' . \
  'if m := s.meter(); m != nil && failed {' \
  'if m := s.meter(); m != nil && false {'
# A failed handshake's drain runs 50 ms past the handshake's io-timeout.
mutant tls-drain-past-io-timeout server.go 'TestAStalledTLSHandshakeEndsAtItsIOTimeout' . \
  'discardInput(m.Conn, earlier(time.Now().Add(50*time.Millisecond), deadline))' \
  'discardInput(m.Conn, time.Now().Add(50*time.Millisecond))'
# The final ERROR's close does not linger: closed with input unread, it is a reset.
mutant no-linger-after-final-error server.go 'TestFinalErrorIsFollowedByAFinNotAReset' . \
  $'\t\t\tsent = true\n' \
  ''
# The linger waits without reading: its close is a reset all the same, and
# it waits out its bound after the client's close.
mutant linger-does-not-read server.go 'TestTheLingerAfterAFinalError' . \
  'n, err := c.Read(buf[:min(left, len(buf))])' \
  'n, err := 0, error(nil); _ = buf; time.Sleep(time.Until(end))'
# The linger has no backstop: the session's goroutine, out of the flood
# rate's wait, sets its lease's end as the read deadline, and the linger
# waits to it.
mutant linger-unbounded server.go 'TestTheLingerAfterAFinalError' . \
  't := time.AfterFunc(d, func() { c.Close() })' \
  't := time.AfterFunc(time.Hour, func() { c.Close() })'
# The linger reads by the deadline the session's goroutine left: past, after
# a slow Authorize, it reads nothing.
mutant linger-trusts-the-deadline server.go 'TestTheLingerAfterAFinalError' . \
  $'\t\tc.SetReadDeadline(end)\n' \
  ''
# The linger looks beneath tls.Conn alone, not beneath the meter: over
# NewTLSListener the close is a reset.
mutant linger-beneath-tls-only server.go 'TestFinalErrorIsFollowedByAFinNotAReset' . \
  $'\t\tc = w.beneath()\n' \
  $'\t\t_ = w\n\t\tbreak\n'
# The linger trusts a listener's wrapper's NetConn (c6da08d, helper-85's
# review): one that names itself spins the writer for good; a typed nil
# panics the server.
mutant linger-trusts-netconn server.go 'TestTheLingerAfterAFinalError' . \
  $'\t\tc = w.beneath()\n\t}\n' \
  $'\t\tc = w.beneath()\n\t}\n\tfor w, ok := c.(interface{ NetConn() net.Conn }); ok; w, ok = c.(interface{ NetConn() net.Conn }) {\n\t\tc = w.NetConn()\n\t}\n'
# The debug line of a session already ended gives what its read met after
# (the linger's deadline: "silent for longer than its lease") as the cause.
mutant end-logged-with-the-reads-error server.go 'TestTheLingerAfterAFinalError' . \
  $'\t\twhy = errEnded // not what the read met after' \
  $'\t\t_ = errEnded // not what the read met after'
# A session that Shutdown ended while its ACQUIRE was on its way has it
# authorized: the linger leaves the session's reads open.
mutant authorize-after-shutdown server.go 'TestAnACQUIREReadAfterShutdownIsNotAuthorized' . \
  'if srv.Authorize != nil && (s.ending() || !srv.Authorize(s.identity, f.Name)) {' \
  'if srv.Authorize != nil && !srv.Authorize(s.identity, f.Name) {'
# No half-close: the client sees the end only at the linger's bound.
mutant linger-without-fin server.go 'TestTheLingerAfterAFinalError' . \
  'if c.(interface{ CloseWrite() error }).CloseWrite() != nil {' \
  'if false {'
# The lingering session is no longer counted: Close, and so Shutdown at its
# io-timeout, cannot cut the linger.
mutant linger-uncounted server.go 'TestTheLingerAfterAFinalError' . \
  $'\t\t\tsrv.mu.Unlock()\n\t\t\ts.linger(' \
  $'\t\t\tdelete(srv.sessions, s)\n\t\t\tsrv.mu.Unlock()\n\t\t\ts.linger('
# The rate's wait is not woken by Shutdown, which waits for the session's goroutine.
mutant rate-wait-deaf-to-shutdown server.go 'TestShutdownDoesNotWaitForTheFloodRate' . \
  $'case <-t.C:\n\t\tcase <-done:' \
  $'case <-t.C:\n\t\tcase <-make(chan struct{}):'
mutant rate-no-slack server.go 'TestFloodPauseOverTLS|TestFloodPauseAfterAMultiByteRead' . \
  'floodSlack = 4 ' \
  'floodSlack = 0 '
mutant events-unbounded server.go 'TestStalledOnEventIsBounded' . \
  'if srv.untold.Load() >= maxQueuedEvents && !srv.closing.Load() {' \
  'if false {'
# Shutdown's releases are bounded like the rest: past 16384 holders some are dropped.
mutant shutdown-releases-bounded server.go 'TestShutdownReleasesAreToldToAnOnEventKeepingUp' . \
  'if srv.untold.Load() >= maxQueuedEvents && !srv.closing.Load() {' \
  'if srv.untold.Load() >= maxQueuedEvents {'
# Told events stay in their batch: a stalled OnEvent keeps them all.
mutant told-events-kept server.go 'TestToldEventsAreNotKept' . \
  'batch[i] = Event{} // a told event' \
  '_ = i // a told event'
# The bound counts only the queue, not the batch being told.
mutant events-bound-ignores-the-batch server.go 'TestEventsHeldForOnEventAreTheUntoldOnes|TestStalledOnEventIsBounded' . \
  'if srv.untold.Load() >= maxQueuedEvents && !srv.closing.Load() {' \
  'if len(srv.events) >= maxQueuedEvents && !srv.closing.Load() {'
# Told events keep counting until their whole batch is told.
mutant events-counted-down-per-batch server.go 'TestEventsHeldForOnEventAreTheUntoldOnes' . \
  $'\t\t\tsrv.OnEvent(ev)\n\t\t\tsrv.untold.Add(-1)\n\t\t}' \
  $'\t\t\tsrv.OnEvent(ev)\n\t\t}\n\t\tsrv.untold.Add(-int64(len(batch)))'
mutant shutdown-unbounded server.go 'TestShutdownOverTLSReturnsAtTheIOTimeout|TestShutdownFinalErrorIsBoundedByTheIOTimeout' . \
  'bound := time.AfterFunc(srv.ioTimeout(),' \
  'bound := time.AfterFunc(time.Hour,'
mutant tls-close-notify server.go 'TestShutdownOverTLSReturnsAtTheIOTimeout|TestCloseDoesNotWaitForTLSClients' . \
  'c = tc.NetConn()' \
  '_ = tc'
# A session leaves srv.sessions when its final ERROR is taken, before it is
# written: Close cannot close a connection whose final write is stuck.
mutant sessions-forgotten-before-final-frame server.go 'TestCloseCutsAFinalFrameStuckOnItsClient|TestShutdownReturnsWhenItsContextEnds|TestShutdownDeadlineClosesStuckSessions' . \
  $'b, _ = Frame{Type: TypeError, Code: code, Reason: reason}.AppendBinary(b)\n\t}' \
  $'b, _ = Frame{Type: TypeError, Code: code, Reason: reason}.AppendBinary(b)\n\t\tdelete(s.srv.sessions, s)\n\t}'
# drainLocked ends a session whose write failed as if by another party.
mutant push-timeout-released-graceful server.go 'TestPushTimeoutIsReleasedAsIOTimeout' . \
  'srv.stopLocked(s, err)' \
  'srv.stopLocked(s, errEnded)'
# Rule 7 (promoteLocked): a waiter whose lease has passed is granted.
mutant promotion-grants-expired-waiter server.go 'TestPromotionSkipsExpiredWaiter|TestRaceHunt' . \
  'if !srv.expireLocked(next) { // else out of the queue' \
  'if true || !srv.expireLocked(next) { // else out of the queue'
# drainLocked: no check of stopped after the write deadline is set, or the
# check made before it (a stop in between is not seen).
mutant drain-skips-stop-check server.go 'TestNoHeartbeatReplyAfterForceRelease|TestNoPushAfterForceRelease|TestNoHeartbeatReplyAfterKickWaiter' . \
  'late := s.stopped.Load() && !stopped' \
  'late := false && s.stopped.Load() && !stopped'
mutant drain-checks-stop-before-deadline server.go 'TestNoHeartbeatReplyAfterForceRelease|TestNoPushAfterForceRelease|TestNoHeartbeatReplyAfterKickWaiter' . \
  $'\t\tlate := s.stopped.Load() && !stopped // after the wait: when the write begins\n' \
  $'\t\tlate := s.stopped.Load() && !stopped // after the wait: when the write begins\n\t\ts.conn.SetWriteDeadline(due)\n'
# dropLocked: no past write deadline for a write already taken.
mutant drop-does-not-cut server.go 'TestForceReleaseJustBeforeAWritePlain|TestPushBegunAtALeaseEndIsCut|TestShutdownCutsABlockedReply' . \
  's.writing && (s.tls == nil || s.final == nil) {' \
  'false && s.writing && (s.tls == nil || s.final == nil) {'
# dropLocked: no cut over TLS even with no ERROR to follow: a push taken
# before a lease end is written after the next grant (the eleventh review).
mutant tls-lease-end-not-cut server.go 'TestPushBegunAtALeaseEndIsCutTLS' . \
  's.writing && (s.tls == nil || s.final == nil) {' \
  's.writing && s.tls == nil {'
# stopLocked drops before endLocked has decided the final ERROR: over TLS
# the cut then breaks the connection and the ERROR 0x02 or 0x01 is lost.
mutant tls-cut-before-the-final-error server.go 'TestForceReleaseJustBeforeAWriteTLS|TestShutdownOverTLSReturnsAtTheIOTimeout' . \
  $'\t\tsrv.endLocked(s, why)\n\t\ts.dropLocked()' \
  $'\t\ts.dropLocked()\n\t\tsrv.endLocked(s, why)'
# drainLocked: over TLS the write deadline stays the last write's, and a
# read that must answer a TLS 1.3 KeyUpdate fails on an idle holder.
mutant tls-read-meets-a-stale-write-deadline server.go 'TestTLS13KeyUpdateKeepsTheSession' . \
  's.conn.SetWriteDeadline(s.leaseEndLocked())' \
  '_ = s.seen'
# drainLocked: over TLS a write made inside the read has no deadline, and a
# client that provokes one and stops reading holds its lock for good.
mutant tls-read-path-write-unbounded server.go 'TestTLSReadPathWriteEndsAtTheLease' . \
  's.conn.SetWriteDeadline(s.leaseEndLocked())' \
  's.conn.SetWriteDeadline(time.Time{})'
# drainLocked: a write cut before its first byte loses the final ERROR it
# carried; or a write that timed out at its own deadline is taken for a cut
# (the session lives on).
mutant cut-write-loses-final-error server.go 'TestForceReleaseFinalErrorSurvivesTheCut|TestShutdownFinalErrorSurvivesTheCut|TestShutdownCutsABlockedReply' . \
  'case cut: // the stream is whole' \
  'case false && cut: // the stream is whole'
# drainLocked: a cut inside a frame is taken for a failed write: half a
# frame, then the end, and no final ERROR (the eighth review).
mutant cut-inside-a-frame-not-finished server.go 'TestCutInsideAFrameFinishesItBeforeTheFinalError' . \
  'cut && end > n && s.final != nil {' \
  'false && end > n && s.final != nil {'
# drainLocked: a cut frame is finished with no ERROR to follow: an end by
# the lease keeps writing, and the connection open, an io-timeout more
# (the twelfth review).
mutant cut-frame-finished-without-final-error server.go 'TestLeaseEndCutInsideAFrameClosesAtOnce' . \
  'cut && end > n && s.final != nil {' \
  'cut && end > n {'
mutant timeout-taken-for-a-cut server.go 'TestIOTimeoutBoundsAWrite|TestPushTimeoutIsReleasedAsIOTimeout|TestBlockedWriteEndsAtTheLease' . \
  'cut := err != nil && isTimeout(err) && s.stopped.Load() && !stopped' \
  'cut := err != nil && isTimeout(err)'
# drainLocked: a cut write that returns after the lease's end is taken for
# a real timeout, and the final ERROR is lost (the seventh review).
mutant cut-told-by-the-clock server.go 'TestCutWriteReturningAfterTheLeaseKeepsTheFinalError' . \
  'cut := err != nil && isTimeout(err) && s.stopped.Load() && !stopped' \
  'cut := err != nil && isTimeout(err) && time.Now().Before(due)'
# acquire: a denial's log line after the session's retirement (wg.Done):
# Shutdown returns while a session goroutine is in the Logger.
mutant retired-before-the-denial-log server.go 'TestShutdownWaitsForTheDenialsLogLine' . \
  $'\t\tif denied {\n\t\t\tsrv.infoLimited(&srv.denialLog, "ACQUIRE not authorized", "identity", s.identity, "lock", f.Name, "remote", s.remote)\n\t\t}\n\t\tsrv.wg.Done()' \
  $'\t\tsrv.wg.Done()\n\t\tif denied {\n\t\t\tsrv.infoLimited(&srv.denialLog, "ACQUIRE not authorized", "identity", s.identity, "lock", f.Name, "remote", s.remote)\n\t\t}'
# acquire: the bytes read with the ACQUIRE are left to run, decided in a
# later critical section (a promotion may reach the waiter in between).
mutant acquire-leaves-coalesced-bytes server.go 'TestAcquireAndBadByteInOneSegmentAreDecidedTogether|TestSplitAndCoalescedFrames' . \
  'beats, bad := s.scan() // decided with the ACQUIRE' \
  'beats, bad := 0, error(nil) // decided with the ACQUIRE'
# run: a session's own end decided in a critical section after the one
# that decided its bad frame (a promotion may reach it in between).
mutant own-end-after-unlock server.go 'TestPromotionSkipsAWaiterEndingOnItsOwnFrame|TestPromotionSkipsEndingWaiter' . \
  's.endOwnLocked(why) // in the same critical section: no promotion between' \
  $'srv.mu.Unlock()\n\t\t\ts.end(why)'
# heartbeatLocked: a heartbeat read after the lease passed is answered.
mutant late-heartbeat-answered server.go 'TestHeartbeatAfterTheLeaseIsNotAnswered|TestRaceHunt' . \
  'case s.expiredLocked(now):' \
  'case false:'
# heartbeatLocked: a bad byte does not end the session.
mutant bad-byte-answered-as-alive server.go 'TestErrorCodes|TestErrorsAfterTheGrant|TestRandomInputKeepsTheGrammar' . \
  $'\t\tsrv.counts.Heartbeats += uint64(beats)\n\t}\n\treturn bad' \
  $'\t\tsrv.counts.Heartbeats += uint64(beats)\n\t}\n\treturn nil'
# heartbeatLocked: no bound on the answers owed while a writer is stuck.
mutant owed-unbounded server.go 'TestOwedAnswersAreBounded' . \
  'owed+beats > maxOwed {' \
  'false && owed+beats > maxOwed {'
# Not a mutant: "takeLocked writes ACQUIRED before WAITING" (the two loops
# swapped) is equivalent, so it is left out. The order of the two loops
# matters only if one take finds both owedWaiting and owedAcquired above
# zero, and none can: a WAITING is owed only by the session's own goroutine
# (joinLocked in acquire, heartbeatLocked while waiting), which in the same
# critical section calls drainOwnLocked; that finds the writer's role free,
# since every other taker of it (wakeLocked from Shutdown, kick and
# promoteLocked) first moves the session out of waiting for good, so the
# first take empties owedWaiting (at most 32, far below maxBatch) before
# srv.mu is released. An ACQUIRED owed later meets owedWaiting == 0.

# run: no pause after a read of more than one byte; caught in-process or
# through the binary.
mutant flood-pause-removed server.go 'TestFloodPauseAfterAMultiByteRead|TestFloodPauseOverTLS|TestHeartbeatFloodDelaysNobody' . \
  'floodPause = time.Millisecond' \
  'floodPause = 0'
mutant flood-pause-skipped server.go 'TestFloodPauseAfterAMultiByteRead|TestHeartbeatFloodDelaysNobody' . \
  'wait := min(time.Until(r.due)-floodSlack*unit, time.Until(deadline)); wait > 0 {' \
  'wait := min(time.Until(r.due)-floodSlack*unit, time.Until(deadline)); false {'
# run: the flood pause outlives a short lease, and with it the lock.
mutant flood-pause-outlives-lease server.go 'TestFloodPauseEndsAtTheLease' . \
  'wait := min(time.Until(r.due)-floodSlack*unit, time.Until(deadline))' \
  'wait := time.Until(r.due) - floodSlack*unit'
mutant flood-pause-removed-process server.go 'TestHeartbeatFloodStarvesNobody' ./cmd/monolock \
  'floodPause = time.Millisecond' \
  'floodPause = 0'
# Shutdown: after its ctx ends it waits for the goroutines anyway (before
# the io-timeout's bound, or after it).
mutant shutdown-waits-past-ctx server.go 'TestShutdownDoesNotWaitForAuthorize|TestStalledOnEventIsBounded|TestShutdownDeadlineClosesStuckSessions' . \
  $'case <-ctx.Done():\n\t\tsrv.Close()\n\t\treturn ctx.Err()' \
  $'case <-ctx.Done():\n\t\tsrv.Close()\n\t\t<-finished\n\t\treturn ctx.Err()'
# (shutdown-after-bound-ignores-ctx is gone: since the io-timeout bound is
# a timer that calls Close, Shutdown has one wait, and shutdown-waits-past-ctx
# is its mutant.)
# joinLocked: a session whose lease passed during Authorize is granted.
mutant join-ignores-lease server.go 'TestNoGrantWhenAuthorizeOutlastsTheLease|TestJoinAfterTheLeaseIsClosedWithNothing' . \
  'case s.expiredLocked(time.Now()): // Authorize, or a busy server, took the lease' \
  'case false:'
# takeLocked: a writer other than the session's own keeps to the lease taken
# at its start; or the session's own writer waits a full io-timeout on a
# client that neither reads nor sends.
mutant other-writer-keeps-to-the-lease server.go 'TestPushWriterKeepsToTheIOTimeout|TestPushUnreadByAClientThatHeartbeatsKeepsTheIOTimeout' . \
  'if own && s.live() {' \
  'if s.live() {'
mutant own-writer-ignores-the-lease server.go 'TestBlockedWriteEndsAtTheLease|TestClientThatNeverReadsDelaysNobody' . \
  'if own && s.live() {' \
  'if false && own && s.live() {'
# drainLocked, watchLeaseLocked: over TLS a push keeps the io-timeout while
# the read waits inside it (the twelfth review); or the watch ends a
# session that heartbeats; or it does not look again after a heartbeat.
mutant tls-push-unwatched server.go 'TestTLSReadStuckBehindAPushEndsAtTheLease|TestKeyUpdateStuckInAReadEndsAtTheLease' . \
  's.tls != nil && !own && s.live() {' \
  'false && s.tls != nil && !own && s.live() {'
mutant lease-watch-ends-the-living server.go 'TestPushUnreadByAClientThatHeartbeatsKeepsTheIOTimeout' . \
  $'case s.expiredLocked(time.Now()):\n\t\t\tsrv.stopLocked(s, errExpired)' \
  $'case true:\n\t\t\tsrv.stopLocked(s, errExpired)'
mutant lease-watch-looks-once server.go 'TestTLSReadStuckBehindAPushEndsAtTheLease|TestKeyUpdateStuckInAReadEndsAtTheLease' . \
  '			s.leaseWatch.Reset(time.Until(s.leaseEndLocked()))' \
  '			_ = 0'
# Rule 5 over TLS: another's writer looks at stopped without first waiting
# until crypto/tls cannot write from the read (the fresh review of
# 2026-12-03); or a Read's return with bytes does not mark the span busy
# (e7debad's gap: several KeyUpdates taken in at once), or the session's
# read from its call (records taken in by the read before); or the writer
# does not look at stopped after the wait.
mutant tls-writer-does-not-wait-for-the-read server.go 'TestAPushHeldBackByTLSPastTheEndIsNeverWritten|TestAPushBehindSeveralKeyUpdateAnswersIsNeverWritten' . \
  $'\t\t\tm.awaitIdle() // crypto/tls\'s write from the read, if any, ends by due' \
  $'\t\t\t_ = m'
mutant tls-read-never-busy server.go 'TestAPushHeldBackByTLSPastTheEndIsNeverWritten|TestAPushBehindSeveralKeyUpdateAnswersIsNeverWritten' . \
  $'\tc.setBusy(true) // back in crypto/tls\n' \
  $''
mutant tls-read-call-not-busy server.go 'TestAPushHeldBackByTLSPastTheEndIsNeverWritten' . \
  $'\tm.setBusy(true)\n\tdefer m.setBusy(false)\n\treturn s.conn.Read(p)' \
  $'\tdefer m.setBusy(false)\n\treturn s.conn.Read(p)'
# A read that never says it waits for the network: another's writer waits
# for the session's next frame.
mutant tls-read-stays-busy server.go 'TestPushBegunAtALeaseEndIsCutTLS' . \
  $'\tc.setBusy(false) // crypto/tls has handled all it took in, and waits\n' \
  $''
# The end of busy wakes no writer waiting for it: another's push waits
# for good once the session's read is back in crypto/tls.
mutant tls-idle-never-signalled server.go 'TestPushBegunAtALeaseEndIsCutTLS|TestAPushHeldBackByTLSPastTheEndIsNeverWritten' . \
  'c.idle.Broadcast()' \
  '_ = 0'
mutant tls-writer-does-not-look-after-the-wait server.go 'TestAPushHeldBackByTLSPastTheEndIsNeverWritten|TestAPushBehindAKeyUpdateAnswerTheClientReadsKeepsTheError' . \
  'late := s.stopped.Load() && !stopped // after the wait: when the write begins' \
  'late := stopped != stopped'
# Rule 9 (endLocked): the release is queued after the grant it allows.
mutant release-event-after-the-grant server.go 'TestForceReleaseAndKickWaiter|TestPromotionSkipsExpiredWaiter|TestRaceHunt' . \
  $'\t\tsrv.emitLocked(Event{Type: EventReleased, Token: s.token, Held: held, Reason: reason}, s)\n\t\tif !srv.closing.Load() {\n\t\t\tsrv.promoteLocked(l)\n\t\t}\n' \
  $'\t\tif !srv.closing.Load() {\n\t\t\tsrv.promoteLocked(l)\n\t\t}\n\t\tsrv.emitLocked(Event{Type: EventReleased, Token: s.token, Held: held, Reason: reason}, s)\n'
# Rule 3 (one writer at a time): a decider starts a second writer while one
# is at work; the session's goroutine writes beside a writer at work.
mutant second-writer server.go 'TestRaceHunt|TestForceReleaseDropsADecidedPush|TestLockTableAgainstModel' . \
  $'\tif !s.writing {\n\t\ts.writing = true\n\t\tsrv.wg.Add(1)' \
  $'\tif true {\n\t\ts.writing = true\n\t\tsrv.wg.Add(1)'
# (TestOwedAnswersAreBounded hangs under the second: fake time stands still
# while a goroutine waits for net.Pipe's write mutex.)
mutant reader-writes-beside-the-writer server.go 'TestSessionReadsOnWhileAnotherWriterIsStuck' . \
  $'\tif s.writing {\n\t\ts.srv.mu.Unlock()' \
  $'\tif false {\n\t\ts.srv.mu.Unlock()'
# endLocked: an ERROR decided for a session still in its TLS handshake.
mutant frame-during-tls-handshake server.go 'TestShutdownClosesATLSHandshakeWithoutAFrame|TestTLSHandshakeIsBounded' . \
  'why = nil // a frame now would only start another handshake' \
  '_ = why'

# Rule 10 (kick): an administrator who finds a session past its lease sends
# it ERROR 0x02 and counts a "force" release (the sixteenth review).
mutant kick-ignores-the-lease server.go 'TestAdminFindingAnExpiredSessionEndsItAsExpired' . \
  $'if !srv.expireLocked(s) {\n\t\t\tbreak' \
  $'if true {\n\t\t\tbreak'
# kick: an expired holder is not ended first, and the administrator is told
# otherwise than had the holder's read come first (a stale token's refusal
# where nobody holds; a waiter kicked that the read would have promoted).
mutant kick-keeps-an-expired-holder server.go 'TestAdminOnAnExpiredHolderAnswersAsIfTheReadCameFirst' . \
  'if h := l.holder; h != nil && srv.expireLocked(h) {' \
  'if h := l.holder; false && h != nil && srv.expireLocked(h) {'
# beginCloseLocked: Shutdown sends ERROR 0x01 to a session past its lease
# and counts a holder's release as graceful (the seventeenth review).
mutant shutdown-ignores-the-lease server.go 'TestShutdownFindingAnExpiredSessionEndsItAsExpired' . \
  $'if !srv.expireLocked(s) {\n\t\t\tsrv.stopLocked(s, ErrShuttingDown)' \
  $'if true {\n\t\t\tsrv.stopLocked(s, ErrShuttingDown)'
# run: a HEARTBEAT is judged by its read's clock, not the one under srv.mu
# that kick and promoteLocked judge by: read in time, taken in late, it is
# answered.
mutant heartbeat-judged-at-its-read server.go 'TestHeartbeatTakenInAfterTheLeaseIsLate' . \
  $'\t\tbeats, bad := s.scan()\n\t\tsrv.mu.Lock()\n\t\tnow := time.Now()' \
  $'\t\tnow := time.Now()\n\t\tbeats, bad := s.scan()\n\t\tsrv.mu.Lock()\n\t\t_ = 0'
# Rule 10 at its boundary: a session at exactly lastSeenAt + lease is alive
# (a waiter is promoted; one whose Authorize took the lease joins). One
# mutation, listed once per test, so that each test is shown to catch it.
mutant lease-ends-after-its-end server.go 'TestPromotionSkipsAWaiterAtTheEndOfItsLease' . \
  'return !now.Before(s.leaseEndLocked())' \
  'return now.After(s.leaseEndLocked())'
mutant lease-ends-after-its-end-join server.go 'TestNoGrantWhenAuthorizeOutlastsTheLease' . \
  'return !now.Before(s.leaseEndLocked())' \
  'return now.After(s.leaseEndLocked())'
mutant lease-ends-after-its-end-heartbeat server.go 'TestHeartbeatAtTheEndOfTheLeaseIsLate' . \
  'return !now.Before(s.leaseEndLocked())' \
  'return now.After(s.leaseEndLocked())'
mutant shutdown-release-forced server.go 'TestStatsCountWhatHappened' . \
  'case errors.Is(why, ErrClosedByAdmin):' \
  'case errors.Is(why, ErrClosedByAdmin), errors.Is(why, ErrShuttingDown):'
# takeLocked: the reason cut at 255 bytes inside a character.
mutant reason-cut-inside-a-character server.go 'TestAuthorizeHook' . \
  'reason = strings.ToValidUTF8(reason[:min(len(reason), MaxReasonLen)], "") // a cut rune goes' \
  'reason = reason[:min(len(reason), MaxReasonLen)] // a cut rune goes'
mutant kick-waiter-ends-the-holder server.go 'TestForceReleaseAndKickWaiter' . \
  $'return srv.kick(name, EventKickWaiter, func(l *lock) (*session, error) {\n' \
  $'return srv.kick(name, EventKickWaiter, func(l *lock) (*session, error) {\n\t\tif h := l.holder; h != nil && h.remote == remoteAddr {\n\t\t\treturn h, nil\n\t\t}\n'
mutant snapshot-without-identity server.go 'TestSnapshotsNameEachIdentity' . \
  'return SessionInfo{Identity: s.identity,' \
  'return SessionInfo{Identity: "",'
mutant identity-last-uri server.go 'TestIdentityOrder' . \
  'return cert.URIs[0].String()' \
  'return cert.URIs[len(cert.URIs)-1].String()'
# Serve after Shutdown leaves its listener accepting for nobody.
mutant serve-after-shutdown-leaves-listener server.go 'TestServeAfterShutdownClosesItsListener' . \
  $'\t\tl.Close() // else the kernel accepts on it for nobody\n' \
  ''
mutant accept-backoff-uncapped server.go 'TestAcceptBackoffDoublesToOneSecond' . \
  'delay = min(max(2*delay, 5*time.Millisecond), time.Second)' \
  'delay = max(2*delay, 5*time.Millisecond)'
# --- The wire format (protocol.go) ---
mutant little-endian-lease protocol.go 'TestVectors|TestFrameBytes' . \
  'LeaseMS: binary.BigEndian.Uint32(b[:4])' \
  'LeaseMS: binary.LittleEndian.Uint32(b[:4])'
mutant name-length-off-by-one protocol.go 'TestValidationBeforeDial|TestErrorCodes|TestValidate' . \
  'case n > MaxNameLen:' \
  'case n > MaxNameLen+1:'
mutant empty-name-accepted protocol.go 'TestErrorCodes|TestValidate' . \
  'case n == 0:' \
  'case n < 0:'
mutant invalid-utf8-accepted protocol.go 'TestErrorCodes|TestValidate' . \
  'case !utf8.ValidString(name):' \
  'case false && !utf8.ValidString(name):'
mutant lease-zero-accepted protocol.go 'TestErrorCodes' . \
  'if f.LeaseMS == 0 {' \
  'if f.LeaseMS == 0 && false {'

# run: over TLS a read is one record, so a burst of one-byte records is
# never paused (the twentieth review).
mutant tls-burst-unpaused server.go 'TestFloodPauseOverTLS' . \
  'case n > 1 || s.tls != nil:' \
  'case n > 1:'
# Rule 10 (drainLocked): another goroutine's writer takes, and writes, an
# answer for a session whose lease has passed (the nineteenth review).
mutant writer-ignores-the-lease server.go 'TestWriterTakingAfterTheLeaseEndsTheSession' . \
  'srv.expireLocked(s) // its own writes have' \
  '_ = 0 // its own writes have'
# Rule 10 (endLocked): a close or a failed write decided after the lease's
# end counts a "graceful" release (the eighteenth review).
mutant end-ignores-the-lease server.go 'TestEndDecidedAfterTheLeaseIsExpired' . \
  '!coded && s.live() && s.expiredLocked(time.Now())' \
  '!coded && s.live() && false'

# --- The client (client.go) ---
mutant client-timeout-from-reply-arrival client.go 'TestHolderStopsBeforeTheServerReleases|TestTimeoutCountsFromTheConfirmedSend' . \
  'l.inflight, l.confirmed = false, l.lastSend' \
  'l.inflight, l.confirmed = false, at'
mutant client-abandons-at-full-lease client.go 'TestHolderStopsBeforeTheServerReleases' . \
  'timeout := l.lease / 5 * 4' \
  'timeout := l.lease'
mutant push-taken-as-reply client.go 'TestPushAfterLostHeartbeatConfirmsNothing|TestPushConfirmsNothing' . \
  'l.st, l.token = holding, f.Token // the push' \
  'l.st, l.token, l.inflight, l.confirmed = holding, f.Token, false, l.lastSend // the push'
mutant late-frame-confirms client.go 'TestFrameAfterTheDeadlineConfirmsNothing|TestFrameAtTheDeadlineConfirmsNothing' . \
  'case !now.Before(deadline):' \
  'case false:'
mutant late-frame-judged client.go 'TestClientRaceHunt|TestFrameAtTheDeadlineConfirmsNothing' . \
  'case !now.Before(deadline):' \
  'case !now.Before(deadline) && rerr != nil:'
mutant no-linger-after-loss client.go 'TestLostLockKeepsItsConnectionUntilRelease|TestHolderStopsBeforeTheServerReleases' . \
  'if lost {' \
  'if lost && false {'
mutant do-keeps-fn-running-after-loss client.go 'TestLossWhileFnRunsIsJoinedWithFnError|TestCutConnectionCancelsAtOnce|TestHolderStopsBeforeTheServerReleases' . \
  'l.cancel(cause)' \
  '_ = cause'
mutant retry-client-errors client.go 'TestDoRetry' . \
  'case isServerErr && se.Temporary(),' \
  'case isServerErr,'
mutant retry-wait-below-base client.go 'TestDoRetryBackoff' . \
  'wait := backoff + rand.N(backoff/2)' \
  'wait := backoff/2 + rand.N(backoff/2)'
# DoRetry: a connection closed before any reply (a balancer in front of a
# dead backend) is not retried.
mutant no-retry-closed-before-any-reply client.go 'TestDoRetry|TestEveryErrorItsMatchesAndItsRetry' . \
  'errors.Is(err, ErrHeartbeatTimeout), errors.Is(err, ErrConnectionClosed):' \
  'errors.Is(err, ErrHeartbeatTimeout):'
# DoRetry: a certificate that does not verify is retried for ever.
mutant retry-unverified-certificate client.go 'TestEveryErrorItsMatchesAndItsRetry' . \
  'case errors.As(err, new(*tls.CertificateVerificationError)), errors.As(err, &alert) && alert.Op == "remote error",' \
  'case false && errors.As(err, new(*tls.CertificateVerificationError)), errors.As(err, &alert) && alert.Op == "remote error",'
# DoRetry: a TLS alert from the server (our certificate refused) is retried.
mutant retry-refused-client-certificate client.go 'TestClientCertificateRefusedByTheServerIsNotRetried' . \
  'errors.As(err, &alert) && alert.Op == "remote error",' \
  'false && errors.As(err, &alert) && alert.Op == "remote error",'
# A refusal by a *tls.Dialer's own VerifyConnection is retried.
mutant retry-callback-refusal client.go 'TestEveryErrorItsMatchesAndItsRetry|TestCallbackRefusalNamesTheRefusedCertificate' . \
  'conn, err := finalRefusals(c.cfg.Dialer).DialContext' \
  'conn, err := c.cfg.Dialer.DialContext'
# An address that is not host:port is retried until ctx ends.
mutant retry-address-error client.go 'TestAcquireRetryAddressWithoutPortReturnsAtOnce' . \
  $'\t\t\terrors.As(err, new(*net.AddrError)):' \
  $'\t\t\tfalse:'
# DoRetry: the end of ctx just after a failed attempt returns that
# attempt's error.
mutant retry-returns-attempt-error-at-ctx-end client.go 'TestContextEndJustAfterAFailedAttemptIsCtxsError' . \
  $'case ctx.Err() != nil:\n\t\t\treturn nil, ctxErr(ctx)' \
  $'case ctx.Err() != nil:\n\t\t\treturn nil, err'
# The end of ctx during the dial or the claim is reported as the dial's or
# the claim's error.
mutant dial-error-at-ctx-deadline client.go 'TestContextEndAtEveryPointOfAClaim|TestContextEndAtRandomPointsOfAClaim' . \
  'case err != nil && ended(ctx):' \
  'case err != nil && ctx.Err() != nil:'
mutant claim-error-at-ctx-deadline client.go 'TestContextEndAtEveryPointOfAClaim' . \
  'case stopped && !ended(ctx):' \
  'case stopped:'
# Do: a loss that fn returned itself is joined to it again.
mutant loss-joined-twice client.go 'TestEveryErrorItsMatchesAndItsRetry' . \
  ' && !errors.Is(err, lost) {' \
  ' {'
mutant unsolicited-frame-waited-for client.go 'TestUnsolicitedFrameIsAViolationAtItsTypeByte' . \
  'case err == nil && typ[0] != TypeError && !l.inflight && l.st != queued:' \
  'case false:'
mutant token-zero-accepted client.go 'TestTokenZeroIsRefused' . \
  'case f.Type == TypeAcquired && f.Token == 0:' \
  'case false:'
mutant waiting-after-acquired-accepted client.go 'TestProtocolViolations' . \
  'case f.Type == TypeWaiting && l.st == holding:' \
  'case f.Type == TypeWaiting && l.st == holding && false:'

mutant srtt-alpha-a-quarter client.go 'TestSmoothedRoundTripIsTheSpecsEWMA' . \
  'l.srtt += (rtt - l.srtt) / 5' \
  'l.srtt += (rtt - l.srtt) / 4'
mutant srtt-first-sample-dropped client.go 'TestSmoothedRoundTripIsTheSpecsEWMA' . \
  'l.srtt = cmp.Or(l.srtt, rtt)' \
  '_ = cmp.Or(l.srtt, rtt)'
mutant shutting-down-always-at-once client.go 'TestShuttingDownIsRetriedAtOnceOnlyOnceInARow' . \
  'se.Code == CodeShuttingDown && !again:' \
  'se.Code == CodeShuttingDown && (!again || true):'
# A waiter whose claim ends lingers as a lost holder does.
mutant waiter-lingers client.go 'TestWaiterWhoseClaimEndsClosesAtOnce' . \
  'lost := !l.ended && l.st == holding' \
  'lost := !l.ended && l.st != connecting'
# --- The binary (cmd/monolock) ---
# run -n: a server condition (below 0x10) taken for a refusal (65, not 69).
mutant run-n-server-condition-refused cmd/monolock/run.go 'TestRunOneAttemptEndedByAServerConditionIsUnreachable' ./cmd/monolock \
  'errors.As(err, &se) && !se.Temporary():' \
  'errors.As(err, &se):'
mutant lost-lock-no-sigcont cmd/monolock/run.go 'TestRunLostLockEndsAStoppedGroupBeforeTheGrace' ./cmd/monolock \
  $'syscall.Kill(group, syscall.SIGTERM)\n\t\t\tcontinueGroup(group)\n' \
  $'syscall.Kill(group, syscall.SIGTERM)\n'
mutant no-sigkill-after-grace cmd/monolock/run.go 'TestRunLostLockStopsTheCommand|TestRunKillsTheGroupAfterGraceWhenTheFirstProcessExited' ./cmd/monolock \
  'syscall.Kill(group, syscall.SIGKILL)' \
  'kill = nil'
mutant lock-released-before-the-group-is-gone cmd/monolock/run.go 'TestRunHoldsTheLockUntilTheGroupIsGone' ./cmd/monolock \
  'if err := syscall.Kill(group, 0); err == syscall.ESRCH {' \
  'if err := syscall.Kill(group, 0); true || err == syscall.ESRCH {'
mutant audit-lines-out-of-order cmd/monolock/main.go 'TestAuditLog' ./cmd/monolock \
  'srv.OnEvent = o.event' \
  'srv.OnEvent = func(ev monolock.Event) { go o.event(ev) }'
mutant lost-command-status-passed-on cmd/monolock/run.go 'TestRunLostLockStopsTheCommand' ./cmd/monolock \
  'if l.Err() != nil { // lost' \
  'if false { // lost'
mutant admin-accepts-cross-origin cmd/monolock/admin_guard.go 'TestAdminRefusesCrossOriginAndForeignHosts' ./cmd/monolock \
  'inner := cop.Handler(h)' \
  'inner := h; _ = cop'
mutant no-parent-death-signal cmd/monolock/run_linux.go 'TestRunKilledTakesCommandWithIt' ./cmd/monolock \
  'a.Pdeathsig = syscall.SIGKILL' \
  '_ = a'
# run makes one attempt, as before issue 25.
mutant run-does-not-retry cmd/monolock/run.go 'TestRunRetriesUntilTheServerAnswers' ./cmd/monolock \
  'acquire := client.AcquireRetry' \
  'acquire := client.Acquire'
# run adds the last retried attempt's reason to any failure after a retry.
mutant run-blames-a-retried-attempt cmd/monolock/run.go 'TestRunRefusalAfterARetrySaysOnlyTheRefusal|TestRunWaitEndedInTheQueueAfterARetry' ./cmd/monolock \
  'if (errors.Is(err, errWaitTimeout) || errors.Is(err, errSignal)) && betweenAttempts() {' \
  'if lastRetry != nil {'
# Operator surfaces (audit.go, ops.go, metrics.go, admin_guard.go,
# locks.go): what README.md and the spec publish, field by field.
# The audit line's time is written in local time (TZ), not UTC.
# The exit status leaves out the events the server dropped.
mutant audit-exit-ignores-server-drops cmd/monolock/audit.go 'TestEventsDroppedByTheServerAreLostLines' ./cmd/monolock \
  'int64(dropped) + int64(eventsDropped)' \
  'int64(dropped)'
mutant audit-time-not-utc cmd/monolock/audit.go 'TestAuditLinesFieldByField' ./cmd/monolock \
  'line := auditLine{Time: ev.Time.UTC().Format(time.RFC3339Nano)' \
  'line := auditLine{Time: ev.Time.Format(time.RFC3339Nano)'
# The audit queue's 8 MiB bound is not enforced: long lines queue without end.
mutant audit-byte-bound-not-enforced cmd/monolock/audit.go 'TestStalledAuditSinkQueuesAtMost8MiB' ./cmd/monolock \
  'if a.queuedBytes.Add(int64(len(line))) > auditQueueBytes {' \
  'if a.queuedBytes.Add(int64(len(line))) > auditQueueBytes<<10 {'
# A line dropped from a full queue (here by the 8 MiB bound) is not counted in monolock_audit_dropped_total.
mutant audit-drop-not-counted cmd/monolock/audit.go 'TestStalledAuditSinkQueuesAtMost8MiB' ./cmd/monolock \
  $'if closing == nil {\n\t\t\ta.dropped.Add(1)\n\t\t\treturn' \
  $'if closing == nil {\n\t\t\treturn'
# Shutdown's burst of releases is dropped from a full queue, as while serving.
mutant audit-shutdown-burst-dropped cmd/monolock/audit.go 'TestShutdownBurstWaitsForRoomInTheAuditQueue' ./cmd/monolock \
  'if closing == nil {' \
  'if closing == nil || true {'
# The wait for room at shutdown outlasts its bound.
mutant audit-shutdown-wait-unbounded cmd/monolock/audit.go 'TestShutdownWaitForAStalledAuditSinkIsBounded' ./cmd/monolock \
  'bound = time.NewTimer(time.Until(closing.by))' \
  'bound = time.NewTimer(time.Until(closing.by) + time.Hour)'
# The drain gets a bound of its own after the wait for room: a stalled sink costs the shutdown two.
mutant audit-drain-own-bound cmd/monolock/audit.go 'TestShutdownAuditTimeIsOneBound' ./cmd/monolock \
  'timer := time.NewTimer(time.Until(closing.by))' \
  'timer := time.NewTimer(closing.bound)'
# The bound's end is kept by the wall clock alone.
mutant audit-bound-wall-clock cmd/monolock/audit.go 'TestShutdownAuditBoundIsMonotonic' ./cmd/monolock \
  '&closeTime{time.Now().Add(bound), bound}' \
  '&closeTime{time.Now().Round(0).Add(bound), bound}'
# The writer never says it took a line: an event waiting for room waits out the bound, then drops.
mutant audit-room-not-signalled cmd/monolock/audit.go 'TestShutdownBurstWaitsForRoomInTheAuditQueue|TestShutdownOfManyHoldersLosesNoAuditLine' ./cmd/monolock \
  'case a.room <- struct{}{}:' \
  'case (chan struct{})(nil) <- struct{}{}:'
# The binary's shutdown does not make the audit log wait for room.
mutant audit-shutdown-not-begun cmd/monolock/main.go 'TestShutdownOfManyHoldersLosesNoAuditLine' ./cmd/monolock \
  $'\t\t\t\to.audit.beginClose(auditDrainBound)\n' \
  ''
# Failed writes are reported at every tick, not at most once every 10 s.
mutant audit-write-failures-reported-every-tick cmd/monolock/audit.go 'TestAuditReportsAreBoundedAndSayAStall' ./cmd/monolock \
  'if n := a.errors.Load(); n > r.errors && now.Sub(r.errorsAt) >= auditReportEvery {' \
  'if n := a.errors.Load(); n > r.errors {'
# A write blocked for 5 s is never reported as AUDIT LOG STALLED (sign error).
mutant audit-stall-never-reported cmd/monolock/audit.go 'TestAuditReportsAreBoundedAndSayAStall' ./cmd/monolock \
  'began != 0 && now.Sub(time.Unix(0, began)) >= auditStallAfter' \
  'began != 0 && time.Unix(0, began).Sub(now) >= auditStallAfter'
# Lines still queued at the end of the shutdown's bound do not make the exit status 1.
mutant audit-lines-queued-at-exit-not-lost cmd/monolock/audit.go 'TestAuditLinesStillQueuedAtTheBoundAreLost' ./cmd/monolock \
  'lost = atExit + int64(failed) + int64(dropped)' \
  'lost = int64(failed) + int64(dropped)'
# monolock_ready stays 1 while /readyz answers 503.
mutant ready-gauge-stays-1 cmd/monolock/ops.go 'TestHealthTurns503WhenShutdownBegins' ./cmd/monolock \
  $'if o.stopping.Load() {\n\t\tready = 0' \
  $'if o.stopping.Load() {\n\t\tready = 1'
# monolock_wait_seconds_sum in milliseconds.
mutant wait-sum-in-milliseconds cmd/monolock/ops.go 'TestMetricsAfterAScriptedScenario' ./cmd/monolock \
  '"_sum"+value(st.WaitTotal.Seconds())' \
  '"_sum"+value(float64(st.WaitTotal.Milliseconds()))'
# monolock_hold_seconds_sum in milliseconds.
mutant hold-sum-in-milliseconds cmd/monolock/ops.go 'TestMetricsAfterAScriptedScenario' ./cmd/monolock \
  '"_sum"+value(st.HoldTotal.Seconds())' \
  '"_sum"+value(float64(st.HoldTotal.Milliseconds()))'
# The event hook (the histograms) only with -audit-log: with -ops-listen alone they stay at 0.
mutant histograms-only-with-audit cmd/monolock/main.go 'TestMetricsAfterAScriptedScenario' ./cmd/monolock \
  'if *opsListen != "" || o.audit != nil {' \
  'if o.audit != nil {'
# A histogram bucket leaves out an observation equal to its bound (le is "less or equal").
mutant histogram-le-exclusive cmd/monolock/metrics.go 'TestHistogramBucketsIncludeTheirBound' ./cmd/monolock \
  's > durationBuckets[i]' \
  's >= durationBuckets[i]'
# monolock_audit_lines_lost_total: queue_full and write_error swapped.
mutant audit-lost-reasons-swapped cmd/monolock/ops.go 'TestAuditLogToStdoutAndWriteFailures' ./cmd/monolock \
  'label("reason", "queue_full")+uvalue(dropped), label("reason", "write_error")+uvalue(errs)' \
  'label("reason", "queue_full")+uvalue(errs), label("reason", "write_error")+uvalue(dropped)'
# /api/info's waiters counts the held locks.
mutant info-waiters-is-locks-held cmd/monolock/ops.go 'TestAdminInfoHasTheDocumentedFields' ./cmd/monolock \
  '"waiters":     st.Waiters,' \
  '"waiters":     st.LocksHeld,'
# /api/info's config: ops_listen and admin_listen swapped.
mutant info-config-ops-admin-swapped cmd/monolock/main.go 'TestAdminInfoHasTheDocumentedFields' ./cmd/monolock \
  '"ops_listen": *opsListen, "admin_listen": *adminListen,' \
  '"ops_listen": *adminListen, "admin_listen": *opsListen,'
# The admin API's holder.since in local time (TZ), not UTC.
mutant admin-times-not-utc cmd/monolock/ops.go 'TestAdminLocksHaveTheDocumentedFields' ./cmd/monolock \
  'RemoteAddr: s.RemoteAddr, Since: s.Since.UTC(),' \
  'RemoteAddr: s.RemoteAddr, Since: s.Since,'
# A lock without waiters has "waiters": null, not a list.
mutant lock-without-waiters-null cmd/monolock/ops.go 'TestAdminLocksHaveTheDocumentedFields' ./cmd/monolock \
  'out := lockJSON{Name: l.Name, Waiters: []waiterJSON{}}' \
  'out := lockJSON{Name: l.Name}'
# The kick's answer names the waiter "waiter", not "kicked".
mutant kick-answer-misnamed cmd/monolock/ops.go 'TestAdminAPI$' ./cmd/monolock \
  '"kicked": toWaiterJSON(waiter)' \
  '"waiter": toWaiterJSON(waiter)'
# The release's answer has no "name".
mutant release-answer-without-name cmd/monolock/ops.go 'TestAdminAPI$' ./cmd/monolock \
  'map[string]any{"name": name, "released": toHolderJSON(holder)}' \
  'map[string]any{"released": toHolderJSON(holder)}'
# A cross-origin refusal is Go's plain-text 403, not a JSON error.
mutant cross-origin-refusal-not-json cmd/monolock/admin_guard.go 'TestAdminRefusesCrossOriginAndForeignHosts' ./cmd/monolock \
  'cop.SetDenyHandler(' \
  '_ = ('
# A 200 with no list of locks (another JSON service) printed as an empty table.
mutant locks-no-list-as-empty-table cmd/monolock/locks.go 'TestLocksMatchesAndSaysWhatTheAdminAPIRefused' ./cmd/monolock \
  'if body.Locks == nil {' \
  'if false {'
# The admin API's reason printed raw to the terminal.
mutant locks-reason-not-escaped cmd/monolock/locks.go 'TestLocksMatchesAndSaysWhatTheAdminAPIRefused' ./cmd/monolock \
  'printable(resp.Status), printable(body.Error))' \
  'printable(resp.Status), body.Error)'
# monolock locks -match ignored: every lock is listed.
mutant locks-match-ignored cmd/monolock/locks.go 'TestLocksMatchesAndSaysWhatTheAdminAPIRefused' ./cmd/monolock \
  'if *match != "" {' \
  'if false {'
# An error from the admin API printed as an empty table, exit 0.
mutant locks-non-200-exit-0 cmd/monolock/locks.go 'TestLocksMatchesAndSaysWhatTheAdminAPIRefused' ./cmd/monolock \
  'if resp.StatusCode != http.StatusOK {' \
  'if false {'
# A reply that is not JSON printed as an empty table, exit 0.
mutant locks-non-json-exit-0 cmd/monolock/locks.go 'TestLocksMatchesAndSaysWhatTheAdminAPIRefused' ./cmd/monolock \
  'if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {' \
  'if err := json.NewDecoder(resp.Body).Decode(&body); err != nil && false {'
# monolock locks ignores MONOLOCK_ADMIN_ADDRESS (a misspelt variable).
mutant locks-env-ignored cmd/monolock/locks.go 'TestLocksTableNamesHoldersFromTheAdminAPIOfTheEnvironment' ./cmd/monolock \
  'map[string]string{"admin": "MONOLOCK_ADMIN_ADDRESS"}' \
  'map[string]string{"admin": "MONOLOCK_ADMIN_ADDR"}'
# monolock locks shows a holder's address without its identity.
mutant locks-table-drops-identity cmd/monolock/locks.go 'TestLocksTableNamesHoldersFromTheAdminAPIOfTheEnvironment' ./cmd/monolock \
  'holder = h.Identity + " (" + h.RemoteAddr + ")"' \
  'holder = h.RemoteAddr'
# monolock locks prints a holder's identity and address unescaped.
mutant locks-holder-not-escaped cmd/monolock/locks.go 'TestNamesFromTheNetworkArePrintedEscaped' ./cmd/monolock \
  'printable(l.Name), printable(holder)' \
  'printable(l.Name), holder'

# Configuration and security
# parse: the environment is applied after the command line, so it beats a flag.
mutant env-beats-flag cmd/monolock/main.go 'TestFlagsAndEnvironment' ./cmd/monolock \
  $'\treturn 0, true\n}' \
  $'\tfor name, env := range envs {\n\t\tif v, ok := os.LookupEnv(env); ok {\n\t\t\tfs.Set(name, v)\n\t\t}\n\t}\n\treturn 0, true\n}'
# -tls-client-ca's variable misnamed (as run's -tls-ca might be).
mutant env-var-misnamed cmd/monolock/main.go 'TestEachVariableIsBetweenItsFlagAndTheDefault' ./cmd/monolock \
  '"tls-client-ca": "MONOLOCK_TLS_CLIENT_CA",' \
  '"tls-client-ca": "MONOLOCK_TLS_CA",'
# -log-level's default is info.
mutant default-log-level-debug cmd/monolock/main.go 'TestEachVariableIsBetweenItsFlagAndTheDefault' ./cmd/monolock \
  'level := levelFlag(slog.LevelInfo)' \
  'level := levelFlag(slog.LevelDebug)'
# -log-level parsed but not given to the handler.
mutant log-level-ignored cmd/monolock/main.go 'TestEachVariableIsBetweenItsFlagAndTheDefault' ./cmd/monolock \
  'opts := &slog.HandlerOptions{Level: slog.Level(level),' \
  'opts := &slog.HandlerOptions{Level: slog.LevelInfo,'
# -io-timeout 10ms is allowed (at least 10 ms).
mutant io-timeout-minimum-excluded cmd/monolock/main.go 'TestStartupRefusesBadListenAndIOTimeout' ./cmd/monolock \
  'case *ioTimeout < minIOTimeout:' \
  'case *ioTimeout <= minIOTimeout:'
# An invalid combination exits 2, not 1.
mutant bad-combination-exit-1 cmd/monolock/main.go 'TestStartupSecurityErrors' ./cmd/monolock \
  $'if err := sec.checkCombination(); err != nil {\n\t\treturn fail(2,' \
  $'if err := sec.checkCombination(); err != nil {\n\t\treturn fail(1,'
# /api/info's config.mtls says whether there are rules, not client certificates.
mutant info-mtls-is-acl cmd/monolock/main.go 'TestEachVariableIsBetweenItsFlagAndTheDefault' ./cmd/monolock \
  '"mtls": sec.clientCAFile != "", "acl_file"' \
  '"mtls": sec.aclFile != "", "acl_file"'
# The ops server stops before the audit drain: no /readyz 503 while a stalled sink holds the exit.
mutant ops-stops-before-audit-drain cmd/monolock/main.go 'TestHealthTurns503WhenShutdownBegins' ./cmd/monolock \
  $'\t\t\tstatus := 0\n\t\t\tif o.audit != nil && o.audit.close(srv.Stats().EventsDropped) > 0 {\n\t\t\t\tstatus = 1\n\t\t\t}\n\t\t\t// The HTTP servers stop after the protocol listener has finished.\n\t\t\tfor _, hs := range httpServers {\n\t\t\t\tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)\n\t\t\t\ths.Shutdown(ctx)\n\t\t\t\tcancel()\n\t\t\t}\n' \
  $'\t\t\tfor _, hs := range httpServers {\n\t\t\t\tctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)\n\t\t\t\ths.Shutdown(ctx)\n\t\t\t\tcancel()\n\t\t\t}\n\t\t\tstatus := 0\n\t\t\tif o.audit != nil && o.audit.close(srv.Stats().EventsDropped) > 0 {\n\t\t\t\tstatus = 1\n\t\t\t}\n'
# The ops server stops before the protocol listener.
mutant ops-stops-before-protocol cmd/monolock/main.go 'TestHealthTurns503WhenShutdownBegins' ./cmd/monolock \
  $'\t\t\tsrv.Shutdown(context.Background())\n' \
  $'\t\t\tfor _, hs := range httpServers {\n\t\t\t\ths.Close()\n\t\t\t}\n\t\t\tsrv.Shutdown(context.Background())\n'
# SIGINT is not a graceful stop.
mutant sigint-not-graceful cmd/monolock/main.go 'TestSecondSignalExitsAtOnce' ./cmd/monolock \
  'signal.Notify(sigs, syscall.SIGINT, syscall.SIGTERM)' \
  'signal.Notify(sigs, syscall.SIGTERM)'
# -audit-log without -ops-listen gets no events.
mutant audit-without-ops-unhooked cmd/monolock/main.go 'TestURILookingNameIsNoIdentity|TestAuditLog$' ./cmd/monolock \
  'if *opsListen != "" || o.audit != nil {' \
  'if *opsListen != "" {'
# reload: after the TLS files and rules, the audit log is not reopened.
mutant reload-skips-audit-after-tls cmd/monolock/main.go 'TestSIGHUPSaysWhatItReloaded' ./cmd/monolock \
  'logger.Info("reloaded " + strings.Join(files, ", "))' \
  $'logger.Info("reloaded " + strings.Join(files, ", "))\n\t\t\treturn'
# reload: a failed reload is logged below error level.
mutant reload-failure-not-an-error cmd/monolock/main.go 'TestReloadKeepsLocksAndRejectsBrokenFiles' ./cmd/monolock \
  'logger.Error("reload failed;' \
  'logger.Warn("reload failed;'
# monolock reload: the default -pid is not process 1.
mutant reload-pid-default-not-1 cmd/monolock/reload.go 'TestReloadSubcommandSignalsOnlyTheServer' ./cmd/monolock \
  'pid := fs.Int("pid", 1,' \
  'pid := fs.Int("pid", 0,'
# TLS below 1.2 accepted.
mutant tls-below-1.2 cmd/monolock/security.go 'TestMutualTLSIdentitiesAndRules' ./cmd/monolock \
  'cfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}' \
  'cfg = &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS10}'
# A reload adds the new client CA to the old ones instead of replacing them.
mutant reload-keeps-old-client-ca cmd/monolock/security.go 'TestReloadReplacesTheClientCA' ./cmd/monolock \
  'cfg.ClientCAs = x509.NewCertPool()' \
  $'cfg.ClientCAs = x509.NewCertPool()\n\t\t\tif prev := s.tls.Load(); prev != nil && prev.ClientCAs != nil {\n\t\t\t\tcfg.ClientCAs = prev.ClientCAs.Clone()\n\t\t\t}'
# A reload with good TLS files and bad rules installs the TLS files.
mutant reload-half-applied cmd/monolock/security.go 'TestReloadKeepsLocksAndRejectsBrokenFiles' ./cmd/monolock \
  $'\tvar rules *acl\n\tif s.aclFile != "" {' \
  $'\ts.tls.Store(cfg)\n\tvar rules *acl\n\tif s.aclFile != "" {'
# A DNS SAN identity with '_' is refused.
mutant host-name-refuses-underscore cmd/monolock/security.go 'TestURILookingNameIsNoIdentity' ./cmd/monolock \
  'strings.ContainsRune("-_.", r)' \
  'strings.ContainsRune("-.", r)'
# A CN identity may hold '#', '%' and '\'.
mutant cn-allows-hash-percent-backslash cmd/monolock/security.go 'TestURILookingNameIsNoIdentity' ./cmd/monolock \
  '!strings.ContainsRune(`:/?#%\`, r)' \
  '!strings.ContainsRune(`:/?`, r)'
# The DNS SAN check passes when any DNS SAN is a host name, not the first.
mutant dns-identity-any-san-checked cmd/monolock/security.go 'TestURILookingNameIsNoIdentity' ./cmd/monolock \
  'if !isHostName(cert.DNSNames[0]) {' \
  'if !slices.ContainsFunc(cert.DNSNames, isHostName) {'
# The first rule whose identity matches decides.
mutant acl-first-identity-match-decides cmd/monolock/security.go 'TestRulesWhenSeveralMatch|TestParseACL' ./cmd/monolock \
  $'\t\t\tif glob(pattern, lock) {\n\t\t\t\treturn true\n\t\t\t}\n\t\t}\n' \
  $'\t\t\tif glob(pattern, lock) {\n\t\t\t\treturn true\n\t\t\t}\n\t\t}\n\t\treturn false\n'
# glob: * does not cross /.
mutant glob-star-stops-at-slash cmd/monolock/security.go 'TestGlob|TestRulesWhenSeveralMatch' ./cmd/monolock \
  $'\t\t_, sw := utf8.DecodeRuneInString(s[starI:])\n\t\tstarI += sw' \
  $'\t\tif s[starI] == \'/\' {\n\t\t\treturn false\n\t\t}\n\t\t_, sw := utf8.DecodeRuneInString(s[starI:])\n\t\tstarI += sw'
# -version: the VCS revision is not read.
mutant version-without-revision cmd/monolock/version.go 'TestBuildInfoFromTheGoCommandsStamps' ./cmd/monolock \
  'b.revision = s.Value' \
  '_ = s.Value'
# -version: no " (modified)" for a build with uncommitted changes.
mutant version-modified-unmarked cmd/monolock/version.go 'TestBuildInfoFromTheGoCommandsStamps' ./cmd/monolock \
  'revision += " (modified)"' \
  'revision += ""'
# -ldflags -X main.stampRevision is ignored.
mutant stamped-revision-ignored cmd/monolock/version.go 'TestVersionStampedByTheLinker' ./cmd/monolock \
  'b.revision, b.modified = stampRevision, false' \
  'b.modified = false'
# diagnostics: a dropped line is not counted, so never reported.
mutant diag-drops-uncounted cmd/monolock/diag.go 'TestDroppedDiagnosticLinesAreCounted' ./cmd/monolock \
  $'d.pending.Add(-1)\n\t\td.dropped.Add(1)' \
  'd.pending.Add(-1)'
# diagnostics: the count of dropped lines never starts again.
mutant diag-drop-count-not-reset cmd/monolock/diag.go 'TestDroppedDiagnosticLinesAreCounted' ./cmd/monolock \
  'if n := d.dropped.Swap(0); n > 0 {' \
  'if n := d.dropped.Load(); n > 0 {'
# diagnostics: the count says 1 however many were dropped.
mutant diag-drop-count-always-one cmd/monolock/diag.go 'TestDroppedDiagnosticLinesAreCounted' ./cmd/monolock \
  $'d.pending.Add(-1)\n\t\td.dropped.Add(1)' \
  $'d.pending.Add(-1)\n\t\td.dropped.Store(1)'
# audit: write failures reported by the clock of the drops' reports.
mutant audit-failures-on-the-drops-clock cmd/monolock/audit.go 'TestAuditReportsAreBoundedAndSayAStall' ./cmd/monolock \
  'n > r.errors && now.Sub(r.errorsAt) >= auditReportEvery' \
  'n > r.errors && now.Sub(r.droppedAt) >= auditReportEvery'
# audit: drops reported by the clock of the failures' reports.
mutant audit-drops-on-the-failures-clock cmd/monolock/audit.go 'TestAuditReportsAreBoundedAndSayAStall' ./cmd/monolock \
  'n > r.dropped && now.Sub(r.droppedAt) >= auditReportEvery' \
  'n > r.dropped && now.Sub(r.errorsAt) >= auditReportEvery'
# diagnostics: an exit does not wait for the queued lines.
mutant diag-exit-without-flush cmd/monolock/main.go 'TestAuditLogToStdoutAndWriteFailures|TestEveryLostAuditLineMakesTheExitStatus1' ./cmd/monolock \
  'defer diag.flush(diagFlushBound)' \
  'defer diag.flush(0)'
# run: the held connection's heartbeats come once a lease, not four times.
mutant run-held-heartbeat-once-a-lease cmd/monolock/run_hold.go 'TestRunKeepsTheLockFromOthersUntilTheGroupIsGone' ./cmd/monolock \
  't := time.NewTicker(lease / 4)' \
  't := time.NewTicker(lease)'
# run exits at once after a loss, before the line that tells it (written
# off its loop) has reached a slow stderr.
mutant run-exits-before-telling-the-loss cmd/monolock/run.go 'TestRunTellsALossThroughASlowStderr' ./cmd/monolock \
  'case <-said:' \
  'default:'
# run: a Close before the grant (a -wait that ran out) is put off too.
mutant run-close-put-off-before-grant cmd/monolock/run_hold.go 'TestRun' ./cmd/monolock \
  'if !c.holding || c.finished {' \
  'if c.finished {'

scratch=$(mktemp -d "${TMPDIR:-/tmp}/monolock-mutants.XXXXXX")
trap 'rm -rf "$scratch"' EXIT
tar -C "$root" --exclude=./.git -cf - . | tar -C "$scratch" -xf -

caught=0 failed=0
for i in "${!names[@]}"; do
  name=${names[$i]} file=${files[$i]} old=${olds[$i]} new=${news[$i]}
  if [ -n "$filter" ] && ! [[ $name =~ $filter ]]; then continue; fi
  content=$(cat "$root/$file"; printf x) # the x keeps trailing newlines
  content=${content%x}
  rest=${content#*"$old"}
  if [ "$rest" = "$content" ]; then
    printf '%-36s NOT APPLICABLE (pattern missing in %s)\n' "$name" "$file"
    failed=$((failed + 1)); continue
  fi
  if [[ $rest == *"$old"* ]]; then
    printf '%-36s NOT APPLICABLE (pattern not unique in %s)\n' "$name" "$file"
    failed=$((failed + 1)); continue
  fi
  printf '%s' "${content/"$old"/"$new"}" >"$scratch/$file"
  out=$(cd "$scratch" && go test -count=1 -timeout "$timeout" -run "${regexes[$i]}" "${pkgs[$i]}" 2>&1 | tr -d '\0')
  status=$? # pipefail: go test's status
  cp "$root/$file" "$scratch/$file"

  first=$(grep -m1 -oE -- '--- FAIL: [^ ]+' <<<"$out" | sed 's/--- FAIL: //')
  if grep -q 'panic: test timed out after' <<<"$out"; then
    running=$(grep -A1 -m1 'running tests:' <<<"$out" | tail -1 | awk '{print $1}')
    if [ -n "$first" ]; then
      printf '%-36s caught by %s (then timed out in %s)\n' "$name" "$first" "$running"
      caught=$((caught + 1))
    else
      printf '%-36s caught only by timeout (%s still running after %s)\n' "$name" "$running" "$timeout"
      failed=$((failed + 1))
    fi
  elif [ -n "$first" ]; then
    printf '%-36s caught by %s\n' "$name" "$first"
    caught=$((caught + 1))
  elif [ "$status" -eq 0 ] && grep -q 'no tests to run' <<<"$out"; then
    printf '%-36s SURVIVED (no test matches %s)\n' "$name" "${regexes[$i]}"
    failed=$((failed + 1))
  elif [ "$status" -eq 0 ]; then
    printf '%-36s SURVIVED\n' "$name"
    failed=$((failed + 1))
  elif grep -qE '\[build failed\]|\[setup failed\]' <<<"$out"; then
    printf '%-36s DOES NOT BUILD: %s\n' "$name" "$(grep -m1 -E '\.go:[0-9]+' <<<"$out")"
    failed=$((failed + 1))
  else
    printf '%-36s caught (go test failed: %s)\n' "$name" "$(tail -1 <<<"$out")"
    caught=$((caught + 1))
  fi
done

echo "$caught caught, $failed survived"
[ "$failed" -eq 0 ]
