#!/usr/bin/env bash
# Checks the deployment files with the tools that read them, where this
# machine has them: systemd-analyze verify on the unit, a YAML parse of
# the Kubernetes manifest, haproxy -c on the standby configuration. A tool
# that is missing is reported as skipped. And that each is safe by default:
# the unit's protocol port on loopback (or mutual TLS), the manifest's
# NetworkPolicy, the Dockerfile's example publishing on loopback. Quick,
# and offline.
#
#   bash deploy/check-files.sh
set -euo pipefail
cd "$(dirname "$0")/.."

failed=0
skip() { echo "skipped: $*"; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

if command -v systemd-analyze >/dev/null && [ -d /lib/systemd/system ]; then
  # verify wants ExecStart's binary where the unit says, so it runs in a
  # root of its own: the system's units, a stand-in binary, this unit.
  root=$work/root
  mkdir -p "$root/lib/systemd" "$root/usr/local/bin" "$root/bin" "$root/etc/systemd/system"
  cp -a /lib/systemd/system "$root/lib/systemd/"
  cp /bin/true "$root/usr/local/bin/monolock"
  cp /bin/kill "$root/bin/kill"
  cp deploy/systemd/monolock.service "$root/etc/systemd/system/"
  out=$(systemd-analyze verify --root="$root" monolock.service 2>&1) || failed=1
  if [ -n "$out" ]; then echo "$out"; failed=1; fi
  echo "systemd-analyze verify deploy/systemd/monolock.service: ${out:-clean}"
else
  skip "systemd-analyze"
fi

# Safe by default: the unit's protocol port is on loopback unless mutual
# TLS is on; the Dockerfile's example publishes it on the host's loopback.
unit=deploy/systemd/monolock.service
listen=$(sed -n 's/^Environment=MONOLOCK_LISTEN_ADDRESS=//p' "$unit")
if [[ $listen != 127.0.0.1:* ]] && ! grep -q '^Environment=MONOLOCK_TLS_CLIENT_CA=' "$unit"; then
  echo "$unit: the protocol port listens on '$listen' in plaintext, without mutual TLS"; failed=1
else
  echo "$unit: protocol port ${listen:-unset}, safe by default"
fi
if grep -E '^#[[:space:]]+docker run' Dockerfile | grep -qE -- '-p ([0-9]+:)?7070'; then
  echo "Dockerfile: the docker run example publishes 7070 on every interface of the host"; failed=1
else
  echo "Dockerfile: the docker run example publishes 7070 on loopback only"
fi

if python3 -c 'import yaml' 2>/dev/null; then
  python3 - deploy/kubernetes/monolock.yaml <<'PY' || failed=1
import sys, yaml
docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
kinds = {d["kind"]: d for d in docs}
dep = kinds["Deployment"]["spec"]
pod = dep["template"]["spec"]
c = pod["containers"][0]
env = {e["name"]: e["value"] for e in c["env"]}
problems = [p for p, ok in [
    ("replicas is not 1", dep["replicas"] == 1),
    ("strategy is not Recreate", dep["strategy"]["type"] == "Recreate"),
    ("readiness is not /readyz on the ops port", c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "ops"}),
    ("liveness is not /healthz on the ops port", c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "ops"}),
    ("the admin API is not on loopback", env.get("MONOLOCK_ADMIN_LISTEN_ADDRESS", "").startswith("127.0.0.1:")),
    ("no Service", "Service" in kinds),
    ("no NetworkPolicy: the plaintext lock port is open to every pod of the cluster", "NetworkPolicy" in kinds),
] if not ok]
if "NetworkPolicy" in kinds:
    np = kinds["NetworkPolicy"]["spec"]
    tmpl = kinds["Deployment"]["spec"]["template"]["metadata"]["labels"]
    if any(tmpl.get(k) != v for k, v in np["podSelector"].get("matchLabels", {}).items()) or not np["podSelector"].get("matchLabels"):
        problems.append("the NetworkPolicy does not select the monolock pod")
    for rule in np.get("ingress", []):
        if not rule.get("from"):
            problems.append("a NetworkPolicy ingress rule admits every source")
    if not any(p.get("port") == "locks" for r in np.get("ingress", []) for p in r.get("ports", [])):
        problems.append("the NetworkPolicy has no rule for the lock port")
for p in problems:
    print("deploy/kubernetes/monolock.yaml:", p)
print("YAML deploy/kubernetes/monolock.yaml:", ", ".join(d["kind"] for d in docs), "parsed" + ("" if not problems else ", with problems"))
sys.exit(1 if problems else 0)
PY
else
  skip "python3 with PyYAML"
fi

if command -v haproxy >/dev/null; then
  if haproxy -c -q -f deploy/standby/haproxy.cfg; then
    echo "haproxy -c deploy/standby/haproxy.cfg: valid"
  else
    echo "haproxy -c deploy/standby/haproxy.cfg: INVALID"; failed=1
  fi
else
  skip "haproxy"
fi

exit $failed
