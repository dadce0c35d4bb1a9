# Sourced by demo.sh and failover.sh: haproxy.cfg played on this machine's
# loopback. Builds monolock into $work, starts a primary and a standby on
# free ports, and HAProxy in front of them with haproxy.cfg as shipped, its
# addresses moved to those ports. Sets work, pids (killed at exit), front
# (HAProxy's port), primary (its pid), o1 and o2 (the ops ports).
command -v haproxy >/dev/null || { echo "$(basename "$0"): needs haproxy (apt-get install haproxy)"; exit 1; }

work=$(mktemp -d)
pids=()
cleanup() { # quiet: bash would say "Killed" of each job
  for p in "${pids[@]}"; do kill -CONT "$p" || true; kill -KILL "$p" || true; wait "$p" || true; done
  rm -rf "$work"
} 2>/dev/null
trap cleanup EXIT

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
