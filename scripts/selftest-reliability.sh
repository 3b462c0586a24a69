#!/usr/bin/env bash
# Measures how reliably `chaos selftest` catches each variant: runs it N
# times with different seeds and counts, per variant, the runs caught on the
# first attempt and the runs caught at all (within 3 attempts). Also runs
# the no-false-alarm check with 20 seeds of the correct pipeline.
#
#   scripts/selftest-reliability.sh [N]          # embedded
#   DATABASE_URL=… KAFKA_BROKERS=… scripts/selftest-reliability.sh [N]
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
n="${1:-5}"
cargo build --release --locked -q
out="$(mktemp -d)"
for i in $(seq 1 "$n"); do
  seed=$((i * 100))
  ./target/release/chaos selftest --seed "$seed" --clean-seeds 0 --json --reports-dir "$out/reports" > "$out/run-$i.json" 2>/dev/null || true
  echo "selftest run $i (seed $seed) done" >&2
done
python3 - "$out" "$n" <<'PY'
import json, sys, glob, collections
out, n = sys.argv[1], int(sys.argv[2])
first, caught = collections.Counter(), collections.Counter()
for f in sorted(glob.glob(f"{out}/run-*.json")):
    for r in json.load(open(f))["rows"]:
        if r["ok"]:
            caught[r["variant"]] += 1
            if r["runs"] == 1:
                first[r["variant"]] += 1
print(f"{'variant':<24}{'caught on 1st run':>20}{'caught':>10}")
for v in caught.keys() | first.keys():
    print(f"{v:<24}{first[v]:>15}/{n}{caught[v]:>8}/{n}")
PY
echo "no-false-alarm check: chaos selftest --no-variants --clean-seeds 20" >&2
./target/release/chaos selftest --no-variants --seed 5000 --clean-seeds 20 --reports-dir "$out/reports" 2>/dev/null | tail -4
