#!/usr/bin/env bash
# GRPO vs EMPO² on WebShop at CPU size (configs/webshop_cpu_*.yaml: SmolLM2-135M + LoRA, the short prompt with
# the "<action>" prefix, score reward), 1 seed each, on 2 CPU cores. Resumable: a finished run is skipped, an
# interrupted one continues from its newest checkpoint (stop one with SIGTERM: train.py finishes the iteration,
# checkpoints and exits 0, which does not count as finished). Each sitting's seconds are appended to sittings.txt;
# wall_seconds.txt, their sum, is written when the run has reached its last iteration. Arguments are passed to
# train.py (e.g. --train.torch_threads=1 when the cores are shared). Run from the repository root:
#   bash results/webshop_cpu/run.sh && python -m tools.plots --runs EMPO2=results/webshop_cpu/runs/empo2 \
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
  echo $(( $(date +%s) - start )) >> "$run/sittings.txt"
  python - "$run" <<'PY'
import sys, yaml
from pathlib import Path
run = Path(sys.argv[1])
last = max((int(p.name[5:]) for p in (run / "checkpoints").glob("iter_*")), default=0)
if last >= yaml.safe_load((run / "config.yaml").read_text())["train"]["iterations"]:
    (run / "wall_seconds.txt").write_text(f"{sum(int(x) for x in (run / 'sittings.txt').read_text().split())}\n")
PY
  [ -f "$run/wall_seconds.txt" ] || { echo "$run stopped before its last iteration; run this script again to resume"; exit 1; }
done
