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
  'next.push(token)' \
  '_ = token'
mutant reused-token server.go 'TestGrantWaitAndPushPromotion' . \
  'next.push(token)' \
  'next.push(s.token.Load()); _ = token'
mutant push-under-the-mutex server.go 'TestBlockedPromotionPushDelaysNobody' . \
  'next.push(token)' \
  'srv.mu.Lock(); next.push(token); srv.mu.Unlock()'
mutant lease-not-refreshed server.go 'TestHeartbeatsKeepAShortLeaseAlive' . \
  'deadline = seen.Add(lease)' \
  '_ = seen'
mutant token-plus-one-missing server.go 'TestTokensAboveTheClockGoOnByOne|TestTokenSequence' . \
  't := srv.lastToken + 1' \
  't := srv.lastToken'
mutant no-io-timeout-before-acquire server.go 'TestIOTimeout' . \
  's.run(0, time.Now().Add(s.srv.ioTimeout()))' \
  's.run(0, time.Now().Add(time.Hour))'
mutant promotion-during-shutdown server.go 'TestShutdownSendsShuttingDownToEverySession' . \
  'front != nil && !srv.closing.Load()' \
  'front != nil'
mutant duplicate-acquire-wrong-code server.go 'TestErrorsAfterTheGrant' . \
  's.fail(ErrDuplicateAcquire)' \
  's.fail(unknownType(typ))'
mutant kick-wakes-nobody server.go 'TestForceReleaseAndKickWaiter' . \
  's.conn.SetReadDeadline(time.Unix(1, 0))' \
  '_ = s'
mutant authorize-without-identity server.go 'TestMutualTLSIdentitiesAndRules' ./cmd/monolock \
  '!srv.Authorize(s.identity, f.Name)' \
  '!srv.Authorize("", f.Name)'

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
mutant client-timeout-from-reply-arrival client.go 'TestHolderStopsBeforeTheServerReleases' . \
  'confirmed = lastSend' \
  'confirmed = at'
mutant client-abandons-at-full-lease client.go 'TestHolderStopsBeforeTheServerReleases' . \
  'timeout := l.lease / 5 * 4' \
  'timeout := l.lease'
mutant push-taken-as-reply client.go 'TestPushAfterLostHeartbeatConfirmsNothing' . \
  'grant(f.Token) // the push' \
  'grant(f.Token); confirm(r.at) // the push'
mutant do-keeps-fn-running-after-loss client.go 'TestLossWhileFnRunsIsJoinedWithFnError|TestCutConnectionCancelsAtOnce|TestHolderStopsBeforeTheServerReleases' . \
  'fnCtx, cancel := context.WithCancelCause(l.ctx)' \
  'fnCtx, cancel := context.WithCancelCause(context.WithoutCancel(l.ctx))'
mutant retry-client-errors client.go 'TestDoRetry' . \
  'case isServerErr && se.Temporary(),' \
  'case isServerErr,'
mutant waiting-after-acquired-accepted client.go 'TestProtocolViolations' . \
  'case f.Type == TypeWaiting && st == holding:' \
  'case f.Type == TypeWaiting && st == holding && false:'

# --- The binary (cmd/monolock) ---
mutant no-sigkill-after-grace cmd/monolock/run.go 'TestRunLostLockStopsTheCommand' ./cmd/monolock \
  'syscall.Kill(group, syscall.SIGKILL)' \
  'kill = nil'
mutant audit-lines-out-of-order cmd/monolock/main.go 'TestAuditLog' ./cmd/monolock \
  'srv.OnEvent = audit.event' \
  'srv.OnEvent = func(ev monolock.Event) { go audit.event(ev) }'
mutant lost-command-status-passed-on cmd/monolock/run.go 'TestRunLostLockStopsTheCommand' ./cmd/monolock \
  'if l.Err() != nil { // lost' \
  'if false { // lost'

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
