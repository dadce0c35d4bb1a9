# Sourced by the spin checks (lease-check.sh, session-check.sh), which
# define check NAME EXPECT ...: queue runs check two at a time, each in a
# directory of its own; finish waits for them all, prints their output in
# the order queued, and fails if any failed.
n=0 pids=()
queue() {
  n=$((n + 1))
  mkdir "$n"
  (cd "$n" && SECONDS=0 && check "$@" >out 2>&1; rc=$?; echo "        (${SECONDS}s)" >>out; exit $rc) &
  pids+=($!)
  while (( $(jobs -rp | wc -l) >= 2 )); do wait -n || true; done
}

finish() {
  local failed=0 i
  for i in "${!pids[@]}"; do
    wait "${pids[$i]}" || failed=1
    cat "$((i + 1))/out"
  done
  if (( failed )); then echo "spin: some checks FAILED"; exit 1; fi
  echo "spin: all checks passed"
}
