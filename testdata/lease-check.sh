#!/usr/bin/env bash
# Model-checks testdata/lease.pml with spin, exhaustively, and checks that
# each known-wrong client rule is refuted by a counterexample trail.
# Needs spin and a C compiler; about 40 s on two cores (two searches at a
# time) and at most 4 GiB of memory.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
model=$here/lease.pml
source "$here/spin-queue.sh"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
cd "$work"

# check NAME EXPECT(pass|fail) PROPERTY SPIN_DEFINES [PAN_FLAGS] [CC_FLAGS]
check() {
  local name=$1 expect=$2 property=$3 defines=$4 panflags=${5:-} ccflags=${6:-}
  cp "$model" .
  spin $defines -a lease.pml >/dev/null
  gcc -O2 $ccflags -o pan pan.c 2>/dev/null
  local out errors
  out=$(./pan -N "$property" -m200000 $panflags 2>&1)
  errors=$(sed -n 's/.*errors: \([0-9]*\).*/\1/p' <<<"$out")
  local states
  states=$(sed -n 's/^ *\([0-9]*\) states, stored.*/\1/p' <<<"$out")
  if [[ $expect == pass && $errors == 0 ]]; then
    echo "ok    $name: $property holds ($states states, exhaustive)"
  elif [[ $expect == fail && ${errors:-0} -gt 0 ]]; then
    echo "ok    $name: $property refuted, as it must be; the trail:"
    spin $defines -t -p -g lease.pml 2>/dev/null | grep -v 'clock:1' | grep -E 'now = |holds\[|holder = |proc .*(c2s|s2c)' | sed 's/^/        /' | tail -25
  else
    echo "FAIL  $name: expected $property to ${expect}, pan says errors=${errors:-?}"
    echo "$out" | tail -20
    return 1
  fi
}

queue "the client's rules" pass safety ""
queue "the client's rules, ratios near 0.8 and 0.2" pass safety "-DLEASE=5 -DTIMEOUT=4 -DINTERVAL=1 -DMAXT=8"
queue "a delivered waiter is granted" pass live "-DNOLOSS -DDELIVER1" "-a -f"
queue "wrong rule: timeout from the reply's arrival" fail safety "-DMUTANT_ARRIVAL"
queue "wrong rule: the push counts as a heartbeat reply" fail safety "-DMUTANT_PUSH"
queue "a waiter whose messages are lost" fail live "-DDELIVER1" "-a -f" "-DNFAIR=3"
finish
