#!/usr/bin/env bash
# The failover a client sees, measured: a primary and a standby behind
# haproxy.cfg on this machine's loopback, a DoRetry loop taking one lock
# again and again through HAProxy and checking that every fencing token is
# above the last one, the primary SIGKILLed 3 s in, and the time from the
# kill to the first grant by the standby. Fails if no grant came after the
# kill, if a token went backwards, or if the gap exceeded the lease (2 s)
# plus HAProxy's detection time (fall 3 x inter 1s) plus 1 s.
#
#   bash deploy/standby/failover.sh     (needs haproxy and go; about 15 s)
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v haproxy >/dev/null || { echo "failover: needs haproxy (apt-get install haproxy)"; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

go build -o "$work/monolock" ./cmd/monolock
go build -o "$work/failover" deploy/standby/failover.go

# Free loopback ports: front, primary, primary ops, standby, standby ops.
read -r front p1 o1 p2 o2 < <(python3 -c '
import socket
ss = [socket.socket() for _ in range(5)]
for s in ss: s.bind(("127.0.0.1", 0))
print(*[s.getsockname()[1] for s in ss])')

"$work/monolock" -listen 127.0.0.1:$p1 -ops-listen 127.0.0.1:$o1 2>"$work/primary.log" &
primary=$!; pids+=($primary)
"$work/monolock" -listen 127.0.0.1:$p2 -ops-listen 127.0.0.1:$o2 2>"$work/standby.log" &
pids+=($!)

# haproxy.cfg as shipped, its addresses moved to loopback ports.
sed -e "s/bind :7070/bind 127.0.0.1:$front/" \
    -e "s/check port 9090/check/" \
    -e "s/10\.0\.0\.11:7070/127.0.0.1:$p1 port $o1/" \
    -e "s/10\.0\.0\.12:7070/127.0.0.1:$p2 port $o2/" \
    deploy/standby/haproxy.cfg >"$work/haproxy.cfg"
haproxy -c -q -f "$work/haproxy.cfg"
haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
pids+=($!)

# Both servers answer /readyz before the client starts.
for port in $o1 $o2; do
  for i in $(seq 50); do
    if exec 3<>"/dev/tcp/127.0.0.1/$port" 2>/dev/null; then
      printf 'GET /readyz HTTP/1.0\r\n\r\n' >&3
      if head -1 <&3 | grep -q ' 200 '; then exec 3<&-; break; fi
      exec 3<&-
    fi
    [ "$i" = 50 ] && { echo "failover: a server did not become ready"; exit 1; }
    sleep 0.1
  done
done

# HAProxy listens before the client starts.
for i in $(seq 50); do
  if exec 3<>"/dev/tcp/127.0.0.1/$front" 2>/dev/null; then exec 3<&-; break; fi
  [ "$i" = 50 ] && { echo "failover: HAProxy did not listen"; exit 1; }
  sleep 0.1
done

status=0
"$work/failover" -addr "127.0.0.1:$front" -kill "$primary" -kill-after 3s -d 12s \
  -lease 2s -detection 3s -standby-ops "127.0.0.1:$o2" || status=$?
grep -E "^Server monolock/(primary|standby) is (DOWN|UP)" "$work/haproxy.log" || true
exit $status
