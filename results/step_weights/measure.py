"""What does one environment step weigh in the update, next to the reference's fixed 128-step mini-batches?

    python results/step_weights/measure.py [--iterations 400] [--minibatch_steps 128] [--seed 0]

Per layout (ranks x episodes per rank) and length distribution, `--iterations` seeded iterations: every episode is
one packed sample of its steps; every rank shuffles its own samples and cuts them into the global number of chunks
with the trainer's `samples.split_by_steps`; mini-batch k is the union of the ranks' k-th chunks. Each step's weight
in its optimiser step ("step" aggregation: its units are its steps) is divided by the reference's 1/128:
  before: each mini-batch divided by its own units (this project until issue 40);
  after:  every mini-batch divided by `samples.minibatch_normaliser` (one normaliser per iteration).
Lengths: bimodal = half the episodes 2-5 steps (fatal), half 30 (the step limit); uniform = 1-30 steps.
Reported: the mean relative weight of the steps of short (<= 5 steps) and long (> 5) episodes, and the min-max
over all steps; and the range of steps per optimiser step (the same before and after). Writes results/step_weights/summary.json and prints a markdown table (README.md holds it).
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from samples import minibatch_normaliser, split_by_steps  # noqa: E402

LAYOUTS = [(1, 128), (8, 16), (8, 4)]
LENGTHS = {
    "bimodal (2-5 or 30)": lambda rng: rng.randint(2, 5) if rng.random() < 0.5 else 30,
    "uniform (1-30)": lambda rng: rng.randint(1, 30),
}


def relative_weights(ranks: list[list[int]], minibatch_steps: int, rng: random.Random) -> dict:
    """One iteration: {"before"/"after": [(episode length, the relative weight of each of its steps)], "sizes":
    the steps of each mini-batch}."""
    total = sum(map(sum, ranks))
    count = max(1, round(total / minibatch_steps))
    normaliser = minibatch_normaliser(total, total, minibatch_steps)  # "step" aggregation: units = steps
    chunks = []
    for lengths in ranks:
        order = list(range(len(lengths)))
        rng.shuffle(order)
        chunks.append(split_by_steps(order, lengths, count))
    out = {"before": [], "after": [], "sizes": []}
    for k in range(count):
        members = [ranks[r][i] for r in range(len(ranks)) for i in chunks[r][k]]
        out["sizes"].append(sum(members))
        for n in members:
            out["before"].append((n, minibatch_steps / sum(members)))
            out["after"].append((n, minibatch_steps / normaliser))
    return out


def measure(n_ranks: int, per_rank: int, draw, iterations: int, minibatch_steps: int, seed: int) -> dict:
    rng = random.Random(seed)
    pooled = {"before": [], "after": [], "sizes": []}
    for _ in range(iterations):
        ranks = [[draw(rng) for _ in range(per_rank)] for _ in range(n_ranks)]
        for key, rows in relative_weights(ranks, minibatch_steps, rng).items():
            pooled[key] += rows
    summary = {"minibatch_steps_min": min(pooled["sizes"]), "minibatch_steps_max": max(pooled["sizes"])}
    for key in ("before", "after"):
        rows = pooled[key]
        short = [(n, w) for n, w in rows if n <= 5]
        long_ = [(n, w) for n, w in rows if n > 5]
        summary[key] = {  # per step: an episode of n steps contributes n steps of weight w
            "short_mean": sum(n * w for n, w in short) / sum(n for n, _ in short),
            "long_mean": sum(n * w for n, w in long_) / sum(n for n, _ in long_),
            "min": min(w for _, w in rows), "max": max(w for _, w in rows)}
    return summary


def parse_args() -> argparse.Namespace:
    """The arguments this script and results/update_plan/measure.py share."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=400)
    parser.add_argument("--minibatch_steps", type=int, default=128)
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    results = []
    print("| ranks x episodes | lengths | before: short | before: long | before: min-max "
          "| after: short | after: long | after: min-max | steps per optimiser step |")
    print("|---|---|---|---|---|---|---|---|---|")
    for n_ranks, per_rank in LAYOUTS:
        for name, draw in LENGTHS.items():
            s = measure(n_ranks, per_rank, draw, args.iterations, args.minibatch_steps, args.seed)
            results.append({"ranks": n_ranks, "episodes_per_rank": per_rank, "lengths": name, **s})
            b, a = s["before"], s["after"]
            print(f"| {n_ranks} x {per_rank} | {name} | {b['short_mean']:.2f} | {b['long_mean']:.2f} "
                  f"| {b['min']:.2f}-{b['max']:.2f} | {a['short_mean']:.2f} | {a['long_mean']:.2f} "
                  f"| {a['min']:.2f}-{a['max']:.2f} | {s['minibatch_steps_min']}-{s['minibatch_steps_max']} |")
    out = Path(__file__).with_name("summary.json")
    out.write_text(json.dumps({"args": vars(args), "results": results}, indent=1) + "\n")


if __name__ == "__main__":
    main()
