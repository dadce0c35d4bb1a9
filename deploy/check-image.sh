#!/usr/bin/env bash
# Checks what the Dockerfile promises, without Docker: its exact build
# command (the RUN line with "go build", read from the Dockerfile) makes a
# static binary, and that binary serves as the image's unprivileged user
# (its USER line) with nothing in its environment but the image's ENV.
# One difference from the image: the addresses move from 0.0.0.0 to
# 127.0.0.1 on free ports, since this machine is not a container.
#
#   bash deploy/check-image.sh      (as root, for setpriv; needs file and ldd)
set -euo pipefail
cd "$(dirname "$0")/.."

fail() { echo "check-image: FAIL: $*" >&2; exit 1; }
[ "$(id -u)" = 0 ] || fail "run as root: the server is started as the image's user with setpriv"

work=$(mktemp -d)
pid=
cleanup() {
  if [ -n "$pid" ]; then kill -KILL "$pid" 2>/dev/null || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
chmod 755 "$work" # the image's user must reach the binary

# 1. The Dockerfile's build command, as it is, with /out/ moved to $work/.
build=$(sed -n 's/^RUN \(CGO_ENABLED=0 go build .*\)$/\1/p' Dockerfile)
[ -n "$build" ] || fail "no 'RUN CGO_ENABLED=0 go build' line in the Dockerfile"
build=${build//\/out\//$work\/}
export VERSION=v0.0.0-check-image
REVISION=$(git rev-parse HEAD 2>/dev/null || echo unknown)
export REVISION
echo "build: $build"
eval "$build"
bin=$work/monolock
[ -x "$bin" ] || fail "the build made no $bin"

# 2. Static: no interpreter, no shared libraries.
desc=$(file -b "$bin")
echo "file: $desc"
case $desc in
  *"statically linked"*) ;;
  *) fail "not a statically linked executable" ;;
esac
if ldd "$bin" >/dev/null 2>&1; then fail "ldd lists shared libraries: $(ldd "$bin")"; fi
echo "ldd: $(ldd "$bin" 2>&1 || true)"

version=$("$bin" -version)
echo "version: $version"
case $version in
  "monolock $VERSION, revision $REVISION, "*) ;;
  *) fail "-version does not carry the build arguments VERSION and REVISION" ;;
esac

# 3. The image's user and environment.
user=$(sed -n 's/^USER \([0-9][0-9]*\):\([0-9][0-9]*\)$/\1 \2/p' Dockerfile)
[ -n "$user" ] || fail "no numeric USER uid:gid line in the Dockerfile"
read -r uid gid <<<"$user"
[ "$uid" != 0 ] || fail "USER is root"
mapfile -t envs < <(grep -v '^[[:space:]]*#' Dockerfile | grep -o 'MONOLOCK_[A-Z_]*=[^[:space:]\\]*')
[ "${#envs[@]}" -gt 0 ] || fail "no MONOLOCK_ variables in the Dockerfile's ENV"
printf 'image env: %s\n' "${envs[*]}"
case " ${envs[*]} " in
  *" MONOLOCK_LISTEN_ADDRESS=0.0.0.0:7070 "*) ;;
  *) fail "the image does not listen on 0.0.0.0:7070" ;;
esac
envs=("${envs[@]//0.0.0.0:[0-9]*/127.0.0.1:0}")

# The log exists before the loop below reads it: the background shell
# creates it only when it runs, and a read of a missing file ends this
# script (set -e).
: >"$work/log"
(cd / && exec env -i "${envs[@]}" setpriv --reuid="$uid" --regid="$gid" --clear-groups --no-new-privs \
  "$bin") 2>"$work/log" &
pid=$!
addr= ops=
for _ in $(seq 100); do
  addr=$(sed -n 's/.*msg=serving listen=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/log")
  ops=$(sed -n 's/.*msg="serving ops HTTP" listen=127\.0\.0\.1:\([0-9]*\).*/\1/p' "$work/log")
  [ -n "$addr" ] && [ -n "$ops" ] && break
  sleep 0.1
done
[ -n "$addr" ] && [ -n "$ops" ] || fail "the server did not say where it serves within 10 s: $(cat "$work/log")"
echo "serving: protocol on 127.0.0.1:$addr, ops on 127.0.0.1:$ops, as uid $uid"
grep -q "^Uid:[[:space:]]*$uid[[:space:]]" "/proc/$pid/status" || fail "the server does not run as uid $uid"

# One ACQUIRE of "check" with a 60 s lease: the answer must be ACQUIRED (0x12).
exec 3<>"/dev/tcp/127.0.0.1/$addr"
printf '\001\001\000\000\352\140\000\005check' >&3
answer=$(timeout 10 head -c 9 <&3 | od -An -tx1 | tr -d ' \n')
exec 3>&-
echo "ACQUIRE check: answered $answer"
case $answer in 12????????????????) ;; *) fail "want ACQUIRED (12 and a token), got '$answer'" ;; esac

exec 4<>"/dev/tcp/127.0.0.1/$ops"
printf 'GET /readyz HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n' >&4
status=$(timeout 10 head -n 1 <&4 | tr -d '\r')
exec 4>&-
echo "GET /readyz: $status"
case $status in *" 200 OK") ;; *) fail "readyz answered '$status'" ;; esac

# The image has no kill: monolock reload is its SIGHUP, run as the image's
# user as kubectl exec would.
setpriv --reuid="$uid" --regid="$gid" --clear-groups --no-new-privs "$bin" reload -pid "$pid" ||
  fail "monolock reload -pid $pid as uid $uid failed"
for _ in $(seq 100); do grep -q 'SIGHUP: nothing to reload' "$work/log" && break; sleep 0.1; done
grep -q 'SIGHUP: nothing to reload' "$work/log" || fail "the server did not log the reload: $(cat "$work/log")"
echo "monolock reload: the server reloaded"

kill -TERM "$pid"
for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then fail "the server did not stop within 10 s of SIGTERM"; fi
code=0
wait "$pid" || code=$?
pid=
[ "$code" = 0 ] || fail "exit status $code after SIGTERM, want 0: $(cat "$work/log")"
echo "check-image: ok (static binary, serves as uid $uid with the image's environment, reloads with monolock reload, exits 0 on SIGTERM)"
