#!/usr/bin/env bash
# The passive standby of haproxy.cfg, played on this machine's loopback:
# two monolock servers behind HAProxy, a holder on the primary, the primary
# frozen (SIGSTOP), the failover with its fencing, and the failback.
#
#   bash deploy/standby/demo.sh     (needs haproxy and go; about 15 s)
#
# The configuration is haproxy.cfg with its addresses moved to loopback
# ports; everything else is the file as it is.
set -euo pipefail
cd "$(dirname "$0")/../.."
command -v haproxy >/dev/null || { echo "demo: needs haproxy (apt-get install haproxy)"; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null || true; kill -KILL "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "demo: FAIL: $*"; exit 1; }

go build -o "$work/monolock" ./cmd/monolock

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

sed -e "s/bind :7070/bind 127.0.0.1:$front/" \
    -e "s/check port 9090/check/" \
    -e "s/10\.0\.0\.11:7070/127.0.0.1:$p1 port $o1/" \
    -e "s/10\.0\.0\.12:7070/127.0.0.1:$p2 port $o2/" \
    deploy/standby/haproxy.cfg >"$work/haproxy.cfg"
haproxy -c -q -f "$work/haproxy.cfg"
haproxy -db -f "$work/haproxy.cfg" >"$work/haproxy.log" 2>&1 &
pids+=($!)
sleep 3 # both servers start, and HAProxy's first checks pass

# acquire FD NAME: ACQUIRE NAME with a 60 s lease on FD, a connection to
# the front opened by the caller; prints the answer's hex.
acquire() {
  local len
  len=$(printf '\\%03o' "${#2}")
  printf "\001\001\000\000\352\140\000$len%s" "$2" >&"$1"
  timeout 5 head -c 9 <&"$1" | od -An -tx1 | tr -d ' \n'
}
token() { printf '%d' "0x${1#12}"; }

exec 5<>"/dev/tcp/127.0.0.1/$front"
a=$(acquire 5 demo)
[[ $a == 12* ]] || fail "first holder: want ACQUIRED, got '$a'"
echo "1. holder A, through the front: ACQUIRED, token $(token "$a") (primary)"

kill -STOP "$primary"
echo "2. primary frozen (SIGSTOP): its /readyz stops answering"
if rest=$(timeout 15 cat <&5 | od -An -tx1 | tr -d ' \n'); then
  echo "3. A's connection ended (${rest:-no bytes}): HAProxy marked primary down and cut its sessions"
else
  fail "A's connection to the frozen primary stayed open for 15 s: no fencing"
fi
exec 5<&-

exec 6<>"/dev/tcp/127.0.0.1/$front"
b=$(acquire 6 demo)
[[ $b == 12* ]] || fail "holder after the failover: want ACQUIRED, got '$b'"
echo "4. holder B, through the front: ACQUIRED, token $(token "$b") (standby)"
[ "$(token "$b")" -gt "$(token "$a")" ] || fail "standby's token is not above primary's"

kill -CONT "$primary"
echo "5. primary resumes"
if rest=$(timeout 15 cat <&6 | od -An -tx1 | tr -d ' \n'); then
  echo "6. B's connection ended (${rest:-no bytes}): primary is up again, HAProxy cut the standby's sessions"
else
  fail "B's connection to the standby stayed open for 15 s after the primary came back"
fi
exec 6<&-

exec 7<>"/dev/tcp/127.0.0.1/$front"
c=$(acquire 7 demo)
[[ $c == 12* ]] || fail "holder after the failback: want ACQUIRED, got '$c'"
echo "7. holder C, through the front: ACQUIRED, token $(token "$c") (primary again)"
[ "$(token "$c")" -gt "$(token "$b")" ] || fail "primary's token after the failback is not above standby's"
exec 7<&-
echo "demo: ok: never two servers serving at once, tokens rising across both switches"
grep -E "primary|standby" "$work/haproxy.log" | grep -iE "is (DOWN|UP)" || true
