#!/usr/bin/env bash
# One sanity iteration per mode at the shape of the committed comparison (results/sanity), old commit vs this one,
# one after the other on the same idle machine. Usage: bash results/sanity_cost/run.sh OLD_CHECKOUT OUT_DIR
# Each run plays 2 iterations with the mode forced (iteration 1 fills the memory; iteration 2 is the measured
# one, validation included: 4 test variations x 4 episodes, no memory). Two training variations, so that iteration
# 2 plays the rows iteration 1 wrote tips for (memory modes then show tips, as they do once rows recur).
set -euo pipefail
old=$1; out=$2
shape="--env.sanity.num_stages=2 --env.sanity.max_steps=3 --env.sanity.test_variations=4 --rollout.group_size=4
 --rollout.tip_max_tokens=24 --train.eval_episodes_per_task=4 --train.iterations=2 --train.eval_every=2
 --train.save_every=100 --env.sanity.train_variations=2"
declare -A probs=(
  [no_memory]="--memory.p_no_memory=1 --memory.p_on_policy_tips=0 --memory.p_off_policy=0"
  [off_policy]="--memory.p_no_memory=0 --memory.p_on_policy_tips=0 --memory.p_off_policy=1"
  [on_policy_tips]="--memory.p_no_memory=0 --memory.p_on_policy_tips=1 --memory.p_off_policy=0")
for which in old new; do
  dir=$([ "$which" = old ] && echo "$old" || pwd)
  for mode in no_memory off_policy on_policy_tips; do
    run="$out/$which/$mode"
    [ -f "$run/metrics.jsonl" ] && [ "$(wc -l < "$run/metrics.jsonl")" -ge 2 ] && continue
    rm -rf "$run"; mkdir -p "$run"
    (cd "$dir" && /usr/bin/time -f "wall %e s" python train.py --config configs/sanity_empo2.yaml $shape ${probs[$mode]} \
       --output_dir="$run") > "$run.log" 2>&1
    echo "$which $mode $(tail -1 "$run.log")"
  done
done
