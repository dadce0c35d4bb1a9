#!/usr/bin/env bash
# Model-checks testdata/session.pml (the session writer / cut / stop
# protocol of server.go) with spin, exhaustively, scenario by scenario, and
# checks that each known-wrong server is refuted by a counterexample trail.
# Needs spin and a C compiler; about a minute on two cores (two searches
# at a time) and at most 2 GiB of memory (about 0.5 GiB each).
#
# Properties (see session.pml): P1 1, P2 2, P3 4, P4 8, P5 16, P6 32, as
# PROPS bits. Write semantics: by default Go's (a write that has begun goes
# on while the socket has room, whatever the deadline); IDEAL: a past
# deadline stops a write at its next byte, as docs/sessions.md assumes.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
model=$here/session.pml
source "$here/spin-queue.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

names() { # the names of the properties in a PROPS mask
  local m=$1 out="" k
  local all=(P1 P2 P3 P4 P5 P6 P2w P1w)
  for k in "${!all[@]}"; do
    if (( m & (1 << k) )); then out+="${out:+,}${all[$k]}"; fi
  done
  echo "$out"
}

# check NAME EXPECT(pass|fail) PROPS SPIN_DEFINES, in a directory of its own
check() {
  local name=$1 expect=$2 props=$3
  local defines="$4 -DPROPS=$props"
  cp "$model" .
  spin $defines -a session.pml >/dev/null
  gcc -O0 -DSAFETY -DCOLLAPSE -DMEMLIM=2048 -o pan pan.c 2>/dev/null  # -O2 costs more to compile than it saves
  local out errors states
  out=$(./pan -m1000000 2>&1)
  errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' <<<"$out")
  states=$(sed -n 's/^ *\([0-9]*\) states, stored.*/\1/p' <<<"$out")
  if [[ $expect == pass ]] && grep -q 'Search not completed\|max search depth too small\|out of memory' <<<"$out"; then
    echo "FAIL  $name: the search was not exhaustive"
    echo "$out" | tail -20
    return 1
  elif [[ $expect == pass && $errors == 0 ]]; then
    echo "ok    $name: $(names "$props") hold ($states states, exhaustive)"
  elif [[ $expect == fail && ${errors:-0} -gt 0 ]]; then
    echo "ok    $name: refuted, as it must be ($(grep -o 'assertion violated.*\|invalid end state' <<<"$out" | head -1)); the trail:"
    spin $defines -t session.pml 2>/dev/null | sed -n 's/^ *MSC: /        /p' | tail -25
  else
    echo "FAIL  $name: expected $(names "$props") to ${expect}, pan says errors=${errors:-?}"
    echo "$out" | tail -20
    return 1
  fi
}

# server.go as written, Go's write semantics. Scenarios: who stops
# sessions, how many HEARTBEATs the holder (S0) and the waiter (S1) send,
# how many writes really fail (a reset, the io-timeout). Properties 1 and 2
# (bits 1, 2) speak of frames reaching the client, 64 and 128 of the
# writes that begin: with Go's writes only the latter hold (below).
queue "no stop, both heartbeat, a write may fail" pass 252 "-DNOADMIN -DNOSHUTDOWN"
queue "an administrator, the holder heartbeats" pass 252 "-DNOSHUTDOWN -DHB1=0 -DFAILS=0"
queue "Shutdown, the holder heartbeats, a write may fail" pass 252 "-DNOADMIN -DHB1=0"
queue "Shutdown then Close" pass 252 "-DNOADMIN -DHB0=0 -DHB1=0 -DCLOSE"
queue "an administrator and Shutdown" pass 252 "-DHB0=0 -DHB1=0 -DFAILS=0"
# The documented window (docs/protocol.md section 4): a Go write looks at
# its deadline before it begins and while it waits for room, not between
# the bytes it has room for (net.Pipe picks at random between a ready
# reader and a passed deadline), so a write that passed that look just
# before the cut writes on: frames decided before a stop may reach the
# client after ForceRelease returned. No write begins after it (P2w).
queue "the window: with Go's writes, a frame of a write under way arrives after ForceRelease returned" fail 2 "-DNOSHUTDOWN -DHB1=0 -DFAILS=0"
queue "IDEAL writes (a past deadline stops a write at its next byte), an administrator" pass 63 "-DIDEAL -DNOSHUTDOWN -DHB1=0 -DFAILS=0"
queue "IDEAL writes, Shutdown" pass 63 "-DIDEAL -DNOADMIN -DHB1=0 -DFAILS=0"

# Known-wrong servers, under the IDEAL writes (where the right one passes
# every property), each refuted by the property named.
m="-DIDEAL -DNOSHUTDOWN -DHB1=0 -DFAILS=0"
queue "wrong: the cut set after unlocking (before the seventh review)" fail 1 "$m -DMUT_CUT_AFTER_UNLOCK"
queue "wrong: the writer gives its role back without looking again" fail 8 "$m -DMUT_NO_RECHECK"
queue "wrong: stopLocked drops nothing" fail 2 "$m -DMUT_NO_DROP"
queue "wrong: stopped loaded before the write's deadline is set" fail 2 "$m -DMUT_CHECK_FIRST"
queue "wrong: a cut inside a frame taken for a failed write (before the eighth review)" fail 32 "$m -DMUT_CUT_IS_FAILURE"
queue "wrong: drainOwnLocked ignores the writer at work" fail 4 "$m -DMUT_TWO_WRITERS"
queue "wrong: an ending waiter left in the queue" fail 16 "$m -DMUT_KEEP_IN_QUEUE"
queue "wrong: the write made holding srv.mu" fail 2 "$m -DMUT_WRITE_UNDER_MU"
# And under Go's writes, by the properties of the writes that begin.
g="-DNOSHUTDOWN -DHB1=0 -DFAILS=0"
queue "wrong, Go's writes: stopLocked drops nothing" fail 64 "$g -DMUT_NO_DROP"
queue "wrong, Go's writes: stopped loaded before the write's deadline is set" fail 64 "$g -DMUT_CHECK_FIRST"
queue "wrong, Go's writes: a cut frame finished with no ERROR to follow (before the twelfth review)" fail 128 "$g -DMUT_FINISH_ALONE"
finish
