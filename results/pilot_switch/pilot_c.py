"""Pilot part (c) of issue 49, from two 10-iteration runs' own logs: GRPO and oracle EMPO² on the switch lab.

    python results/pilot_switch/pilot_c.py [RUN_DIR ...]     (default: results/pilot_switch/runs/*)

Per run and iteration, from metrics.jsonl and the run's episode logs (train.log_episodes=-1: every episode; plain or
gzipped): the mode, the seconds of the iteration (rollout + tips + update), the episodes' success rate, the share
of groups whose returns are all equal (no GRPO signal), the share of steps shown a tip, the update's clip and mask
fractions over all the iteration's action tokens and (runs from af91ea7 on) over its positive-advantage tokens, and,
where the run folder holds probe_switch.py's switch_logp.json, the tip-free log-prob of "flip the main switch" at
its state after the iteration and its move. Writes pilot_c.json next to itself and prints a markdown table.
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
    probe = run / "switch_logp.json"
    switch = {r["iteration"]: r for r in json.loads(probe.read_text())} if probe.exists() else {}
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
                     "optimizer_steps": record.get("optimizer_steps", 0.0),
                     "tip_steps": record.get("tip_hit_rate", 0.0),
                     "pos_adv_clip_frac": record.get("pos_adv_clip_frac"),
                     "pos_adv_masked_frac": record.get("pos_adv_masked_frac"),
                     "switch_logp": switch.get(it, {}).get("switch_logp"), "switch_move": switch.get(it, {}).get("move")})
    return rows


def main() -> None:
    here = Path(__file__).resolve().parent
    runs = [Path(p) for p in sys.argv[1:]] or sorted(p for p in (here / "runs").iterdir() if p.is_dir())
    result = {run.name: run_rows(run) for run in runs}
    (here / "pilot_c.json").write_text(json.dumps(result, indent=1) + "\n")
    print("| run | iteration | mode | seconds | success | all-equal groups | tip steps | clip frac | masked frac | "
          "A > 0: clip / masked | optimiser steps | switch log-prob (move) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    num = lambda v, f="{:.3f}": "-" if v is None else f.format(v)  # noqa: E731
    for name, rows in result.items():
        for r in rows:
            print(f"| {name} | {r['iteration']} | {r['mode']} | {r['seconds']:.0f} | {100 * r['success_rate']:.0f} % | "
                  f"{100 * r['all_equal_groups']:.0f} % | {100 * r['tip_steps']:.0f} % | {r['clip_frac']:.3f} | "
                  f"{r['masked_frac']:.3f} | {num(r['pos_adv_clip_frac'])} / {num(r['pos_adv_masked_frac'])} | "
                  f"{r['optimizer_steps']:.0f} | {num(r['switch_logp'], '{:.2f}')} ({num(r['switch_move'], '{:+.2f}')}) |")


if __name__ == "__main__":
    main()
