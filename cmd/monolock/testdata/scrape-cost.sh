#!/usr/bin/env bash
# What a 1/s scrape of /metrics costs the acquire-release cycle, measured
# in one run against one server: 10,000 idle sessions (1,000 holders and
# 9,000 waiters, from monolock-bench hold with a 60 s lease, so a heartbeat
# each every 15 s), then ROUNDS rounds of monolock-bench cycle (-n 8, -d D)
# without a scrape and with curl scraping /metrics once a second. Prints
# each cycle result, then the scrapes' times as curl measured them.
#
#   bash cmd/monolock/testdata/scrape-cost.sh          # ROUNDS=3 D=10s
#
# The server and the bench need more than 10,000 descriptors each: it
# raises its soft limit to the hard one.
set -euo pipefail
cd "$(dirname "$0")/../../.."
: "${ROUNDS:=3}" "${D:=10s}"
ulimit -n "$(ulimit -Hn)"
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  rm -rf "$work"
}
trap cleanup EXIT
go build -o "$work/monolock" ./cmd/monolock
go build -o "$work/bench" ./cmd/monolock-bench

"$work/monolock" -listen 127.0.0.1:0 -ops-listen 127.0.0.1:0 2>"$work/log" &
pids+=($!)
for _ in $(seq 100); do
  addr=$(sed -n 's/.*msg=serving listen=\([0-9.:]*\).*/\1/p' "$work/log")
  ops=$(sed -n 's/.*msg="serving ops HTTP" listen=\([0-9.:]*\).*/\1/p' "$work/log")
  [ -n "$addr" ] && [ -n "$ops" ] && break
  sleep 0.1
done
echo "server $addr, ops $ops, descriptor limit $(ulimit -n)"

"$work/bench" -addr "$addr" -sessions 10000 -locks 1000 -lease 60s -d 30m hold >"$work/hold" 2>&1 &
pids+=($!)
for _ in $(seq 120); do
  if curl -s "http://$ops/metrics" | grep -q '^monolock_waiters 9000$'; then break; fi
  sleep 1
done
curl -s "http://$ops/metrics" | grep -E '^monolock_(connections_active|locks_held|waiters) '

for round in $(seq "$ROUNDS"); do
  echo "== round $round: no scrape"
  "$work/bench" -addr "$addr" -n 8 -d "$D" cycle | tail -2
  echo "== round $round: a scrape a second"
  (while :; do curl -s -o /dev/null -w '%{time_total}\n' "http://$ops/metrics" >>"$work/scrapes"; sleep 1; done) &
  scraper=$!
  "$work/bench" -addr "$addr" -n 8 -d "$D" cycle | tail -2
  kill "$scraper"; wait "$scraper" 2>/dev/null || true
done
sort -n "$work/scrapes" | awk '{t[NR]=$1} END {printf "scrapes during the cycles (curl time_total): %d, p50 %.2f ms, p90 %.2f ms, max %.2f ms\n", NR, t[int(NR*0.5)+1]*1000, t[int(NR*0.9)+1]*1000, t[NR]*1000}'
