#!/usr/bin/env bash
# Run every Molecule scenario: each role's molecule/default, the replicated store
# (molecule/store: etcd + Patroni + PostgreSQL on three containers) and the whole-cluster
# scenario molecule/cluster. Prints each scenario's output and wall time and a summary;
# exits non-zero if any failed. Every scenario's containers are destroyed, pass or fail.
#
# The scenarios run in two lanes at once (most of a scenario's time is waiting on
# `podman exec`, so two share the machine's cores well), balanced by their usual times:
#   lane 1: cluster tls engines                     (~1,500 s on 2 cores, the other lane running)
#   lane 2: common control router agent store monitoring   (~1,500 s)
# Scenarios on both lanes install llmgw from the one source archive in this checkout's
# build/sdist, which roles/llmgw_common/files/source_archive.py writes atomically (and only
# when the source changed), so two lanes never read half an archive. Each scenario has its
# own containers, network and ephemeral directory. A scenario's output is printed whole
# when it ends, so the two lanes' lines never mix.
#
#   molecule/run-all.sh                          all scenarios
#   LLMGW_MOLECULE_ONLY="common tls" molecule/run-all.sh   only these (role short names,
#                                                          or "store", "cluster")
#   LLMGW_MOLECULE_JOBS=1 molecule/run-all.sh    one scenario at a time, in install order
set -uo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
ORDER=(common tls engines control router agent monitoring store cluster)
LANE1=(cluster tls engines)
LANE2=(common control router agent store monitoring)
ONLY="${LLMGW_MOLECULE_ONLY:-}"
JOBS="${LLMGW_MOLECULE_JOBS:-2}"

wanted() { [ -z "$ONLY" ] || [[ " $ONLY " == *" $1 "* ]]; }

command -v molecule >/dev/null || { echo "molecule is not on PATH (make ansible-deps; PATH=.venv/bin:\$PATH)" >&2; exit 2; }
case "$JOBS" in 1|2) ;; *) echo "LLMGW_MOLECULE_JOBS must be 1 or 2, not '$JOBS'" >&2; exit 2 ;; esac
"$ROOT/molecule/build-image.sh" || { echo "building the Molecule image failed" >&2; exit 2; }

WORK="$(mktemp -d /tmp/llmgw-molecule.XXXXXX)"
RESULTS_FILE="$WORK/results"   # one line a scenario: NAME<TAB>RESULT<TAB>SECONDS
: > "$RESULTS_FILE"

# where NAME: the scenario's directory and `molecule` arguments; nothing for an absent one.
where() {
  case "$1" in
    store|cluster) [ -f "$ROOT/molecule/$1/molecule.yml" ] && echo "$ROOT -s $1" ;;
    *) [ -f "$ROOT/roles/llmgw_$1/molecule/default/molecule.yml" ] && echo "$ROOT/roles/llmgw_$1" ;;
  esac
}

# scenario NAME DIR ARGS...: molecule test in DIR; always destroy afterwards.
scenario() {
  local name="$1" dir="$2" rc
  shift 2
  echo "=== $name: molecule test $* (in ${dir#"$ROOT"/})"
  (cd "$dir" && molecule test "$@")
  rc=$?
  # `molecule test` destroys on success and on failure; this also covers an interrupted run.
  (cd "$dir" && molecule destroy "$@" >/dev/null 2>&1)
  return "$rc"
}

# run NAME live|quiet: the scenario, its output also in $WORK/NAME.log; live: printed as it
# comes, quiet: printed whole at the end (under a lock: the other lane may be printing).
# Records the result and the wall time.
run() {
  local name="$1" mode="$2" dir args_line start end rc result
  local -a args=()
  read -r dir args_line <<< "$(where "$name")"
  read -r -a args <<< "$args_line"
  start=$(date +%s)
  if [ "$mode" = live ]; then
    scenario "$name" "$dir" "${args[@]}" 2>&1 | tee "$WORK/$name.log"
    rc=${PIPESTATUS[0]}
  else
    scenario "$name" "$dir" "${args[@]}" > "$WORK/$name.log" 2>&1
    rc=$?
  fi
  end=$(date +%s)
  if [ "$rc" -eq 0 ]; then result=passed; else result="FAILED (rc $rc)"; fi
  {
    flock 9
    [ "$mode" = live ] || cat "$WORK/$name.log"
    echo "=== $name: $result in $((end - start)) s"
    printf '%s\t%s\t%s\n' "$name" "$result" "$((end - start))" >> "$RESULTS_FILE"
  } 9> "$WORK/print.lock"
}

# lane live|quiet NAME...: the wanted, present scenarios among NAMEs, one after another.
lane() {
  local mode="$1" name
  shift
  for name in "$@"; do
    if wanted "$name" && [ -n "$(where "$name")" ]; then run "$name" "$mode"; fi
  done
  return 0
}

# kill_tree PID: the process and everything it started (a lane: molecule, ansible-playbook).
kill_tree() {
  local child
  for child in $(ps -o pid= --ppid "$1" 2>/dev/null); do kill_tree "$child"; done
  kill "$1" 2>/dev/null
}

PIDS=()
on_signal() {
  echo "interrupted: destroying the scenarios' containers" >&2
  local pid name spec dir args_line
  for pid in "${PIDS[@]}"; do kill_tree "$pid"; done
  for name in "${ORDER[@]}"; do
    spec="$(where "$name")" || continue
    read -r dir args_line <<< "$spec"
    # shellcheck disable=SC2086  # args_line is "-s NAME" or empty
    (cd "$dir" && molecule destroy $args_line >/dev/null 2>&1)
  done
  rm -rf "$WORK"
  exit 130
}
trap on_signal INT TERM

wall_start=$(date +%s)
if [ "$JOBS" -eq 1 ]; then
  lane live "${ORDER[@]}"
else
  lane quiet "${LANE1[@]}" & PIDS+=("$!")
  lane quiet "${LANE2[@]}" & PIDS+=("$!")
  wait "${PIDS[@]}"
  PIDS=()
fi
wall=$(( $(date +%s) - wall_start ))

echo
echo "Molecule summary"
if [ ! -s "$RESULTS_FILE" ]; then
  echo "  no scenario ran (LLMGW_MOLECULE_ONLY=\"$ONLY\")"
  rm -rf "$WORK"
  exit 1
fi
failed=0
total=0
while IFS=$'\t' read -r name result seconds; do
  printf '  %-10s %-16s %4d s\n' "$name" "$result" "$seconds"
  total=$((total + seconds))
  [ "$result" = passed ] || failed=1
done < "$RESULTS_FILE"
printf '  %-10s %-16s %4d s\n' "sum" "" "$total"
printf '  %-10s %-16s %4d s (%s lane(s))\n' "wall" "" "$wall" "$JOBS"
# What failed, again at the very end: a CI log often keeps only its last lines, and a
# failed task's message is hundreds of lines above the summary.
while IFS=$'\t' read -r name result seconds; do
  [ "$result" = passed ] && continue
  echo
  echo "Why $name failed (its failed tasks and messages; the whole output is above):"
  sed 's/\x1b\[[0-9;]*m//g' "$WORK/$name.log" \
    | grep -n -B2 -A30 -E 'fatal: |FAILED! =>|failed: \[|Idempotence test failed' \
    | head -n 150
done < "$RESULTS_FILE"
rm -rf "$WORK"
exit "$failed"
