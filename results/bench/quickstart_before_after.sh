#!/usr/bin/env bash
# The quickstart's wall time before (commit f40a700, no KV reuse) and after (this commit), same machine, one
# after the other. Usage: bash results/bench/quickstart_before_after.sh OLD_CHECKOUT
# (OLD_CHECKOUT: e.g. `git worktree add /tmp/qs_old f40a700`, with the same virtual environment).
set -euo pipefail
OLD=${1:?old checkout}
NEW=$(cd "$(dirname "$0")/../.." && pwd)
OUT=$NEW/results/bench/quickstart
mkdir -p "$OUT"
for arm in before after; do
  dir=$([ $arm = before ] && echo "$OLD" || echo "$NEW")
  rm -rf "/tmp/quickstart_$arm"
  start=$(date +%s.%N)
  (cd "$dir" && python train.py --config configs/quickstart.yaml --output_dir=/tmp/quickstart_$arm \
     > "$OUT/$arm.log" 2>&1)
  end=$(date +%s.%N)
  echo "$arm $(echo "$end - $start" | bc)" >> "$OUT/wall_seconds.txt"
  cp /tmp/quickstart_$arm/metrics.jsonl "$OUT/$arm.metrics.jsonl"
done
cat "$OUT/wall_seconds.txt"
