#!/usr/bin/env bash
# GRPO vs EMPO² on WebShop at CPU size (configs/webshop_cpu_*.yaml: SmolLM2-135M + LoRA, the short prompt with
# the "<action>" prefix, score reward), 1 seed each, on 2 CPU cores. Resumable: a finished run is skipped, an
# interrupted one continues from its newest checkpoint. Arguments are passed to train.py (e.g.
# --train.torch_threads=1 when the cores are shared). Run from the repository root:
#   bash results/webshop_cpu/run.sh && python plots.py --runs EMPO2=results/webshop_cpu/runs/empo2 \
#        GRPO=results/webshop_cpu/runs/grpo --out results/webshop_cpu
set -euo pipefail
OUT=results/webshop_cpu/runs
for algo in grpo empo2; do
  run=$OUT/$algo
  [ -f "$run/wall_seconds.txt" ] && continue
  mkdir -p "$run"
  resume=(); ls -d "$run"/checkpoints/iter_* >/dev/null 2>&1 && resume=(--resume=latest)
  start=$(date +%s)
  python train.py --config "configs/webshop_cpu_$algo.yaml" --train.seed=0 --output_dir="$run" "$@" "${resume[@]}" \
    >> "$run/log.txt" 2>&1
  echo $(( $(date +%s) - start )) > "$run/wall_seconds.txt"
done
