"""Pilot part (c) of issue 49, from two 10-iteration runs' own logs: GRPO and oracle EMPO² on the switch lab.

    python results/pilot_switch/pilot_c.py [RUN_DIR ...]     (default: results/pilot_switch/runs/*)

Per run and iteration, from metrics.jsonl and the run's episode logs (train.log_episodes=-1: every episode; plain or
gzipped): the mode, the seconds of the iteration (rollout + tips + update), the episodes' success rate, the share
of groups whose returns are all equal (no GRPO signal), and the update's clip and mask fractions (over all the
iteration's action tokens: the trainer does not log them per advantage sign). Writes pilot_c.json next to itself
and prints a markdown table.
"""
from __future__ import annotations

import gzip
import json
import sys
from pathlib import Path


def read_jsonl(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        return [json.loads(line) for line in f if line.strip()]


def run_rows(run: Path) -> list[dict]:
    rows = []
    for record in read_jsonl(run / "metrics.jsonl"):
        it = record["iteration"]
        files = sorted((run / "episodes").glob(f"iter_{it:06d}_rank*.jsonl*"))
        episodes = [e for f in files for e in read_jsonl(f)]
        groups: dict = {}
        for e in episodes:
            groups.setdefault(e["group"], []).append(e["extrinsic_return"])
        rows.append({"iteration": it, "mode": record["mode"],
                     "seconds": sum(v for k, v in record.items() if k.startswith("time_")),
                     "success_rate": record["success_rate"], "episodes": len(episodes),
                     "all_equal_groups": sum(len(set(r)) == 1 for r in groups.values()) / max(len(groups), 1),
                     "clip_frac": record.get("clip_frac", 0.0), "masked_frac": record.get("masked_frac", 0.0),
                     "optimizer_steps": record.get("optimizer_steps", 0.0)})
    return rows


def main() -> None:
    here = Path(__file__).resolve().parent
    runs = [Path(p) for p in sys.argv[1:]] or sorted(p for p in (here / "runs").iterdir() if p.is_dir())
    result = {run.name: run_rows(run) for run in runs}
    (here / "pilot_c.json").write_text(json.dumps(result, indent=1) + "\n")
    print("| run | iteration | mode | seconds | success | all-equal groups | clip frac | masked frac | optimiser steps |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name, rows in result.items():
        for r in rows:
            print(f"| {name} | {r['iteration']} | {r['mode']} | {r['seconds']:.0f} | {100 * r['success_rate']:.0f} % | "
                  f"{100 * r['all_equal_groups']:.0f} % | {r['clip_frac']:.3f} | {r['masked_frac']:.3f} | "
                  f"{r['optimizer_steps']:.0f} |")


if __name__ == "__main__":
    main()
