"""How even are the optimiser steps, per-rank cut (before issue 50) vs one plan over every rank's samples (after)?

    python results/update_plan/measure.py [--iterations 400] [--minibatch_steps 128] [--seed 0]

Per layout (ranks x episodes per rank) and length distribution, `--iterations` seeded iterations of packed episodes
(one sample each, 600 + 150 x steps tokens: a ScienceWorld first message, then a turn per step):
  before: every rank shuffles its own samples and cuts them into the global number of chunks (`samples.split_by_steps`);
          mini-batch k is the union of the ranks' k-th chunks, and a rank computes its own chunk;
  after:  `samples.plan_update`: one shuffle of all the samples, equal-step mini-batches of the global list, each
          handed to the ranks balanced by tokens (`samples.hand_out`).
Reported per optimiser step: the steps it holds (5th / 50th / 95th percentile), and the slowest rank's tokens over
the mean rank's (mean and 95th percentile; the step waits for the slowest rank), and what no hand-out of whole
samples can beat (the longest sample, or the mean). Lengths as results/step_weights:
bimodal = half 2-5 steps, half 30; uniform = 1-30. Writes summary.json next to this file and prints a table.
"""
from __future__ import annotations

import importlib.util
import json
import random
import sys
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from samples import plan_update, split_by_steps  # noqa: E402

# The step-weights measurement's lengths and arguments (a script, not a package: loaded from its file).
_spec = importlib.util.spec_from_file_location(
    "step_weights_measure", Path(__file__).resolve().parents[1] / "step_weights" / "measure.py")
step_weights = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(step_weights)
LENGTHS = step_weights.LENGTHS
LAYOUTS = [(8, 16), (8, 4), (2, 64)]


def episode(steps: int) -> SimpleNamespace:
    """What the plan reads of a sample: its steps, its length (ids) and its units (step aggregation: its steps)."""
    return SimpleNamespace(steps=steps, ids=range(600 + 150 * steps), units=float(steps))


def before(ranks: list[list], minibatch_steps: int, rng: random.Random) -> list[list[list]]:
    """[mini-batch][rank] -> that rank's samples: every rank cuts its own shuffled samples."""
    count = max(1, round(sum(s.steps for r in ranks for s in r) / minibatch_steps))
    cut = []
    for samples in ranks:
        order = list(range(len(samples)))
        rng.shuffle(order)
        cut.append([[samples[i] for i in chunk] for chunk in split_by_steps(order, [s.steps for s in samples], count)])
    return [[cut[r][k] for r in range(len(ranks))] for k in range(count)]


def after(ranks: list[list], minibatch_steps: int, rng: random.Random) -> list[list[list]]:
    everyone = [s for r in ranks for s in r]
    (epoch,) = plan_update(everyone, minibatch_steps, 1, rng, len(ranks)).epochs
    return [[[everyone[i] for i in share] for share in shares] for shares in epoch]


def percentile(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def measure(n_ranks: int, per_rank: int, draw, iterations: int, minibatch_steps: int, seed: int) -> dict:
    out = {}
    for name, plan in (("before", before), ("after", after)):
        rng, sizes, slowest, bound = random.Random(seed), [], [], []  # the same episodes for both
        for _ in range(iterations):
            ranks = [[episode(draw(rng)) for _ in range(per_rank)] for _ in range(n_ranks)]
            for shares in plan(ranks, minibatch_steps, random.Random(rng.random())):
                if not any(shares):
                    continue  # an empty mini-batch: the trainer takes no step
                sizes.append(sum(s.steps for share in shares for s in share))
                work = [sum(len(s.ids) for s in share) for share in shares]
                slowest.append(max(work) / (sum(work) / n_ranks))
                # No hand-out beats the longest sample (a packed episode is never split) or the mean.
                longest = max(len(s.ids) for share in shares for s in share)
                bound.append(max(longest, sum(work) / n_ranks) / (sum(work) / n_ranks))
        out[name] = {"steps_p05": percentile(sizes, 0.05), "steps_p50": percentile(sizes, 0.5),
                     "steps_p95": percentile(sizes, 0.95), "slowest_over_mean": sum(slowest) / len(slowest),
                     "slowest_over_mean_p95": percentile(slowest, 0.95), "optimiser_steps": len(sizes),
                     "lower_bound": sum(bound) / len(bound)}
    return out


def main() -> None:
    args = step_weights.parse_args()
    rows = []
    print("| ranks x episodes | lengths | | steps per optimiser step (5th / 50th / 95th pct) | slowest rank / mean "
          "(mean, 95th pct) | no hand-out does better than |\n|---|---|---|---|---|---|")
    for n_ranks, per_rank in LAYOUTS:
        for label, draw in LENGTHS.items():
            result = measure(n_ranks, per_rank, draw, args.iterations, args.minibatch_steps, args.seed)
            rows.append({"ranks": n_ranks, "episodes_per_rank": per_rank, "lengths": label, **result})
            for name in ("before", "after"):
                r = result[name]
                print(f"| {n_ranks} x {per_rank} | {label} | {name} | {r['steps_p05']} / {r['steps_p50']} / "
                      f"{r['steps_p95']} | {r['slowest_over_mean']:.2f}, {r['slowest_over_mean_p95']:.2f} | "
                      f"{r['lower_bound']:.2f} |")
    (Path(__file__).parent / "summary.json").write_text(json.dumps({"args": vars(args), "rows": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
