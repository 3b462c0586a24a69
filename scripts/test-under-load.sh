#!/usr/bin/env bash
# The test suite on a busy machine: the project's test command
# (scripts/test.sh) run beside one busy loop per core, as when another
# build or run shares the machine with CI. Prints each run's time and
# result; exits non-zero if any run failed.
#
#   scripts/test-under-load.sh                  # once, in this checkout
#   scripts/test-under-load.sh --runs 3         # three times in a row
#   scripts/test-under-load.sh --fresh --runs 3 # in a fresh clone of HEAD (what CI sees)
#   scripts/test-under-load.sh -- <filter>      # arguments after -- go to scripts/test.sh
#
# The busy loops run at the suite's own priority and die with this script.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

log() { printf 'test-under-load: %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 2; }

runs=1
fresh=0
while [ $# -gt 0 ]; do
  case "$1" in
    --runs) [ $# -ge 2 ] && [[ "$2" =~ ^[1-9][0-9]*$ ]] || die "--runs takes a count of 1 or more, e.g. --runs 3"; runs=$2; shift 2 ;;
    --fresh) fresh=1; shift ;;
    --) shift; break ;;
    -h|--help) sed -n '2,12p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (use --runs N, --fresh, or -- before the test filter)" ;;
  esac
done

if [ "$fresh" = 1 ]; then
  dir=$(mktemp -d "${TMPDIR:-/tmp}/chaos-under-load.XXXXXX")
  log "cloning HEAD ($(git rev-parse --short HEAD)) into $dir"
  git clone -q . "$dir"
  cd "$dir"
fi

cores=$(nproc 2>/dev/null || echo 2)
loops=()
stop_loops() { [ ${#loops[@]} -gt 0 ] && kill "${loops[@]}" 2>/dev/null; wait 2>/dev/null || true; }
trap stop_loops EXIT INT TERM
for _ in $(seq "$cores"); do
  # A loop of the shell itself: all CPU, no I/O, nothing to install.
  ( while :; do :; done ) &
  loops+=($!)
done
log "$cores busy loops running (pids ${loops[*]})"

failed=0
for run in $(seq "$runs"); do
  start=$(date +%s)
  if bash scripts/test.sh "$@"; then result=passed; else result="failed (exit $?)"; failed=1; fi
  took=$(( $(date +%s) - start ))
  log "run $run of $runs: $result in $((took / 60)) min $((took % 60)) s beside $cores busy loops"
done
exit $failed
