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
source deploy/standby/loopback.sh
fail() { echo "demo: FAIL: $*"; exit 1; }
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
