#!/usr/bin/env bash
# EMPO² vs GRPO on real ScienceWorld at its smallest: lifespan-longest-lived (4 gold steps, one demo in the first
# message), SmolLM2-135M + LoRA on 2 CPU cores, 1 seed each, training return on the 5 train variations.
# Run from the repository root:  bash results/scienceworld_lifespan/run.sh
set -euo pipefail
OUT=results/scienceworld_lifespan/runs
COMMON=(--config configs/quickstart.yaml --env.scienceworld.tasks=[lifespan-longest-lived]
        --env.scienceworld.train_variations=5 --env.scienceworld.max_steps=6 --env.scienceworld.demo_max_steps=4
        --rollout.tasks_per_iteration=2 --rollout.group_size=4 --train.iterations=6 --train.lr=3e-4
        --train.seed=0 --train.eval_every=0 --train.save_every=0 --train.tensorboard=false)
for algo in empo2 grpo; do
  [ -f "$OUT/$algo/wall_seconds.txt" ] && continue
  extra=(); [ "$algo" = grpo ] && extra=(--memory.enabled=false --intrinsic.coef=0)
  mkdir -p "$OUT/$algo"
  start=$(date +%s)
  python train.py "${COMMON[@]}" "${extra[@]}" --output_dir="$OUT/$algo" > "$OUT/$algo/log.txt" 2>&1
  echo $(( $(date +%s) - start )) > "$OUT/$algo/wall_seconds.txt"
done
