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
# Not in CI: it takes several minutes. Run it before a release and after a
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
mutant lifo-promotion server.go 'TestFIFOOrderAndLeavingFromTheMiddle|TestLockTableAgainstModel' . \
  'l.waiters.Front(); front != nil' \
  'l.waiters.Back(); front != nil'
mutant missing-push server.go 'TestGrantWaitAndPushPromotion' . \
  $'next.push(token)\n\t}\n\ts.wmu.Lock()' \
  $'_ = token\n\t}\n\ts.wmu.Lock()'
mutant reused-token server.go 'TestGrantWaitAndPushPromotion' . \
  $'next.push(token)\n\t}\n\ts.wmu.Lock()' \
  $'next.push(s.token.Load()); _ = token\n\t}\n\ts.wmu.Lock()'
mutant push-under-the-mutex server.go 'TestBlockedPromotionPushDelaysNobody' . \
  $'next.push(token)\n\t}\n\ts.wmu.Lock()' \
  $'srv.mu.Lock(); next.push(token); srv.mu.Unlock()\n\t}\n\ts.wmu.Lock()'
mutant lease-not-refreshed server.go 'TestHeartbeatsKeepAShortLeaseAlive' . \
  'deadline = seen.Add(lease)' \
  '_ = seen'
mutant token-plus-one-missing server.go 'TestTokensAboveTheClockGoOnByOne|TestTokenSequence' . \
  't := srv.lastToken + 1' \
  't := srv.lastToken'
mutant no-io-timeout-before-acquire server.go 'TestIOTimeout' . \
  's.run(0, time.Now().Add(s.srv.ioTimeout()))' \
  's.run(0, time.Now().Add(time.Hour))'
mutant promotion-during-shutdown server.go 'TestShutdownPromotesNobody|TestShutdownSendsShuttingDownToEverySession' . \
  'front != nil && !srv.closing.Load()' \
  'front != nil'
mutant duplicate-acquire-wrong-code server.go 'TestErrorsAfterTheGrant' . \
  'return deadline, ErrDuplicateAcquire' \
  'return deadline, unknownType(typ)'
mutant kick-wakes-nobody server.go 'TestForceReleaseAndKickWaiter' . \
  $'s.conn.SetReadDeadline(time.Unix(1, 0)) // rule 6\n' \
  $'_ = s\n'
mutant authorize-without-identity server.go 'TestMutualTLSIdentitiesAndRules' ./cmd/monolock \
  '!srv.Authorize(s.identity, f.Name)' \
  '!srv.Authorize("", f.Name)'
# Issue 13: the races between behaviours.
mutant push-after-final-frame server.go 'TestInterleavingNoPushAfterAFailedWrite|TestWaiterEndingAsHolderLeaves' . \
  'if !s.final && s.stop.Load() == 0 && s.writeStateLocked(token) != nil {' \
  'if s.stop.Load() == 0 && s.writeStateLocked(token) != nil {'
mutant push-after-force-release server.go 'TestInterleavingPushAfterForceRelease' . \
  'if !s.final && s.stop.Load() == 0 && s.writeStateLocked(token) != nil {' \
  'if !s.final && s.writeStateLocked(token) != nil {'
mutant heartbeat-reply-after-stop server.go 'TestInterleavingHeartbeatReplyAfterForceRelease' . \
  $'if err := s.stopped(); err != nil { // rule 5\n\t\treturn err\n\t}' \
  ''
mutant kick-leaves-waiter-queued server.go 'TestWaiterEndingAsHolderLeaves|TestRaceHunt' . \
  'next, token := srv.stopLocked(s, CodeClosedByAdmin)' \
  's.stop.Store(uint32(CodeClosedByAdmin)); var next *session; var token uint64'
mutant force-release-ignores-token server.go 'TestForceReleaseByToken' . \
  'case token != 0 && h.token.Load() != token:' \
  'case false:'
mutant events-unbounded server.go 'TestStalledOnEventIsBounded' . \
  'if len(srv.events) >= maxQueuedEvents {' \
  'if false {'
mutant shutdown-unbounded server.go 'TestInterleavingShutdownExceedsIOTimeout|TestShutdownWithTLSClientsIsBounded' . \
  'bound := time.NewTimer(srv.ioTimeout())' \
  'bound := time.NewTimer(time.Hour)'
mutant tls-close-notify server.go 'TestShutdownWithTLSClientsIsBounded' . \
  'c = tc.NetConn()' \
  '_ = tc'
mutant sessions-forgotten-before-final-frame server.go 'TestInterleavingShutdownIgnoresContext' . \
  $'\tsrv.mu.Lock()\n\tnext, token := srv.leaveLocked(s, why)' \
  $'\tsrv.mu.Lock()\n\tdelete(srv.sessions, s)\n\tnext, token := srv.leaveLocked(s, why)'
mutant push-timeout-released-graceful server.go 'TestInterleavingPushTimeoutReleaseReason' . \
  's.wtimeout.Store(isTimeout(err))' \
  '_ = err'

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

# --- The client (client.go) ---
mutant client-timeout-from-reply-arrival client.go 'TestHolderStopsBeforeTheServerReleases|TestSyncTimeoutCountsFromTheConfirmedSend' . \
  'l.inflight, l.confirmed = false, l.lastSend' \
  'l.inflight, l.confirmed = false, at'
mutant client-abandons-at-full-lease client.go 'TestHolderStopsBeforeTheServerReleases' . \
  'timeout := l.lease / 5 * 4' \
  'timeout := l.lease'
mutant push-taken-as-reply client.go 'TestPushAfterLostHeartbeatConfirmsNothing|TestSyncPushConfirmsNothing' . \
  'l.st, l.token = holding, f.Token // the push' \
  'l.st, l.token, l.inflight, l.confirmed = holding, f.Token, false, l.lastSend // the push'
mutant late-frame-confirms client.go 'TestFrameAfterTheDeadlineConfirmsNothing|TestSyncLateFrameConfirmsNothing' . \
  'case !now.Before(deadline):' \
  'case false:'
mutant late-frame-judged client.go 'TestClientRaceHunt|TestSyncLateFrameConfirmsNothing' . \
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
mutant retry-wait-below-base client.go 'TestSyncDoRetryBackoff' . \
  'time.NewTimer(backoff + rand.N(backoff/2))' \
  'time.NewTimer(backoff/2 + rand.N(backoff/2))'
mutant retry-closed-before-any-reply client.go 'TestClientReviewDoRetryClosedBeforeAnyReply' . \
  '&& !errors.Is(err, errNoReply):' \
  ':'
mutant unsolicited-frame-waited-for client.go 'TestClientReviewUnsolicitedDripDetectedLate' . \
  'case err == nil && typ[0] != TypeError && !l.inflight && l.st != queued:' \
  'case false:'
mutant token-zero-accepted client.go 'TestClientReviewTokenZero' . \
  'case f.Type == TypeAcquired && f.Token == 0:' \
  'case false:'
mutant waiting-after-acquired-accepted client.go 'TestProtocolViolations' . \
  'case f.Type == TypeWaiting && l.st == holding:' \
  'case f.Type == TypeWaiting && l.st == holding && false:'

# --- The binary (cmd/monolock) ---
mutant no-sigkill-after-grace cmd/monolock/run.go 'TestRunLostLockStopsTheCommand|TestRunKillsTheGroupAfterGraceWhenTheFirstProcessExited' ./cmd/monolock \
  'syscall.Kill(group, syscall.SIGKILL)' \
  'kill = nil'
mutant lock-released-before-the-group-is-gone cmd/monolock/run.go 'TestRunHoldsTheLockUntilTheGroupIsGone' ./cmd/monolock \
  'if err := syscall.Kill(group, 0); err == syscall.ESRCH {' \
  'if err := syscall.Kill(group, 0); true || err == syscall.ESRCH {'
mutant audit-lines-out-of-order cmd/monolock/main.go 'TestAuditLog' ./cmd/monolock \
  'srv.OnEvent = audit.event' \
  'srv.OnEvent = func(ev monolock.Event) { go audit.event(ev) }'
mutant lost-command-status-passed-on cmd/monolock/run.go 'TestRunLostLockStopsTheCommand' ./cmd/monolock \
  'if l.Err() != nil { // lost' \
  'if false { // lost'
mutant admin-accepts-cross-origin cmd/monolock/admin_guard.go 'TestAdminRefusesCrossOriginAndForeignHosts' ./cmd/monolock \
  'inner := cop.Handler(h)' \
  'inner := h; _ = cop'
mutant no-parent-death-signal cmd/monolock/run_linux.go 'TestRunKilledTakesCommandWithIt' ./cmd/monolock \
  'a.Pdeathsig = syscall.SIGKILL' \
  '_ = a'

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
