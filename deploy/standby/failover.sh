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
source deploy/standby/loopback.sh
go build -o "$work/failover" deploy/standby/failover.go

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
