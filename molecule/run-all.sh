#!/usr/bin/env bash
# Run every Molecule scenario: each role's molecule/default (in install order), then the
# replicated store (molecule/store: etcd + Patroni + PostgreSQL on three containers), then
# the whole-cluster scenario molecule/cluster. Prints each scenario's wall time and a summary;
# exits non-zero if any failed. Every scenario's containers are destroyed, pass or fail.
#
#   molecule/run-all.sh                          all scenarios
#   LLMGW_MOLECULE_ONLY="common tls" molecule/run-all.sh   only these (role short names,
#                                                          or "store", "cluster")
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ORDER=(common tls engines control router agent monitoring)
ONLY="${LLMGW_MOLECULE_ONLY:-}"

wanted() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }

command -v molecule >/dev/null || { echo "molecule is not on PATH (make ansible-deps; PATH=.venv/bin:\$PATH)" >&2; exit 2; }
"$ROOT/molecule/build-image.sh" || { echo "building the Molecule image failed" >&2; exit 2; }

declare -a NAMES=() RESULTS=() TIMES=()
failed=0

# run NAME DIR ARGS...: molecule test in DIR; always destroy afterwards.
run() {
  local name="$1" dir="$2"; shift 2
  local start end rc
  echo "=== $name: molecule test $* (in ${dir#"$ROOT"/})"
  CURRENT=("$dir" "$@")
  start=$(date +%s)
  (cd "$dir" && molecule test "$@")
  rc=$?
  # `molecule test` destroys on success and on failure; this also covers an interrupted run.
  (cd "$dir" && molecule destroy "$@" >/dev/null 2>&1)
  CURRENT=()
  end=$(date +%s)
  NAMES+=("$name"); TIMES+=("$((end - start))")
  if [ "$rc" -eq 0 ]; then RESULTS+=(passed); else RESULTS+=("FAILED (rc $rc)"); failed=1; fi
  echo "=== $name: ${RESULTS[-1]} in $((end - start)) s"
}

CURRENT=()
on_signal() {
  echo "interrupted: destroying the running scenario's containers" >&2
  if [ "${#CURRENT[@]}" -gt 0 ]; then
    (cd "${CURRENT[0]}" && molecule destroy "${CURRENT[@]:1}" >/dev/null 2>&1)
  fi
  exit 130
}
trap on_signal INT TERM

for short in "${ORDER[@]}"; do
  dir="$ROOT/roles/llmgw_$short"
  [ -f "$dir/molecule/default/molecule.yml" ] || continue
  wanted "$short" || continue
  run "$short" "$dir"
done

if [ -f "$ROOT/molecule/store/molecule.yml" ] && wanted store; then
  run store "$ROOT" -s store
fi

if [ -f "$ROOT/molecule/cluster/molecule.yml" ] && wanted cluster; then
  run cluster "$ROOT" -s cluster
fi

echo
echo "Molecule summary"
if [ "${#NAMES[@]}" -eq 0 ]; then
  echo "  no scenario ran (LLMGW_MOLECULE_ONLY=\"$ONLY\")"
  exit 1
fi
total=0
for i in "${!NAMES[@]}"; do
  printf '  %-10s %-16s %4d s\n' "${NAMES[$i]}" "${RESULTS[$i]}" "${TIMES[$i]}"
  total=$((total + TIMES[i]))
done
printf '  %-10s %-16s %4d s\n' total "" "$total"
exit "$failed"
