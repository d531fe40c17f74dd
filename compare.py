"""EMPO² vs GRPO in miniature: the paper's claim on the sanity environment, on CPU.

    python compare.py run  [--out results/sanity] [--seeds 0,1,2] [--section.key=value ...]
    python compare.py plot [--out results/sanity]

`run` trains configs/sanity_empo2.yaml and configs/sanity_grpo.yaml (the same recipe with memory off) for every
seed, each as its own `python train.py` process, at equal iterations; the trainer's periodic validation is the
no-memory return on the held-out test variations. The untrained model is evaluated too (iteration 0). Then the
out-of-distribution check: every final model plays the second task family (`ood_family`), first without memory,
then `--memory_rounds` rounds with the tips it writes itself and no parameter updates (eval.py --ood).
Runs that already finished are skipped, so an interrupted comparison continues where it stopped.

Everything lands in `--out`: runs/<algo>_s<seed>/ (metrics.jsonl, checkpoints, ood/eval.json), summary.json,
summary.md (tables, wall times, the exact commands) and, from `plot`, compare.png.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent
ALGOS = ("empo2", "grpo")


def run_command(cmd: list[str], log: Path) -> float:
    """Run one training/evaluation process (its output to `log`); returns its wall time. Stops on failure."""
    start = time.perf_counter()
    with open(log, "w") as f:
        proc = subprocess.run(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if proc.returncode != 0:
        sys.exit(f"failed ({proc.returncode}): {' '.join(cmd)}\nsee {log}")
    return time.perf_counter() - start


def read_metrics(run: Path) -> list[dict]:
    path = run / "metrics.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()] if path.exists() else []


def run_all(out: Path, seeds: list[int], overrides: list[str], ood_family: str, memory_rounds: int,
            ood_episodes: int) -> None:
    out.mkdir(parents=True, exist_ok=True)
    commands, walls = [], {}
    for seed in seeds:
        common = [f"--train.seed={seed}", *overrides]
        base = out / "runs" / f"base_s{seed}"
        cmd = [sys.executable, "eval.py", "--config", "configs/sanity_empo2.yaml", *common, f"--output={base}"]
        commands.append(" ".join(cmd[1:]))
        if not (base / "eval.json").exists():
            base.mkdir(parents=True, exist_ok=True)
            print("untrained model, seed", seed, flush=True)
            run_command(cmd, base / "log.txt")
        for algo in ALGOS:
            config = f"configs/sanity_{algo}.yaml"
            run = out / "runs" / f"{algo}_s{seed}"
            run.mkdir(parents=True, exist_ok=True)
            cmd = [sys.executable, "train.py", "--config", config, *common, f"--output_dir={run}"]
            commands.append(" ".join(cmd[1:]))
            wall_file = run / "wall_seconds.json"
            if not wall_file.exists():
                print(f"training {algo} seed {seed}", flush=True)
                wall_file.write_text(json.dumps(run_command(cmd, run / "log.txt")))
            walls[f"{algo}_s{seed}"] = json.loads(wall_file.read_text())
            final = sorted((run / "checkpoints").glob("iter_*"))[-1]
            ood = run / "ood"
            cmd = [sys.executable, "eval.py", "--config", config, *common, f"--checkpoint={final}",
                   f"--env.sanity.families=[{ood_family}]", f"--ood={memory_rounds}",
                   f"--episodes_per_task={ood_episodes}", f"--output={ood}"]
            commands.append(" ".join(cmd[1:]))
            if not (ood / "eval.json").exists():
                print(f"OOD check {algo} seed {seed}", flush=True)
                run_command(cmd, run / "ood_log.txt")
    write_summary(out, seeds, commands, walls, overrides, ood_family)


def write_summary(out: Path, seeds: list[int], commands: list[str], walls: dict, overrides: list[str],
                  ood_family: str) -> None:
    summary = summarise(out, seeds)
    summary.update(commands=commands, wall_seconds=walls, overrides=overrides, ood_family=ood_family)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(summary_markdown(summary))
    print((out / "summary.md").read_text())


def mean_std(values: list[float]) -> tuple[float, float]:
    return float(np.mean(values)), float(np.std(values))


def summarise(out: Path, seeds: list[int]) -> dict:
    """Validation curves (iteration 0 = the untrained model) and OOD numbers, per algorithm over seeds."""
    base = [json.loads((out / "runs" / f"base_s{s}" / "eval.json").read_text()) for s in seeds]
    result = {"seeds": seeds, "algorithms": {}}
    for algo in ALGOS:
        curves = {}
        for seed, untrained in zip(seeds, base):
            points = {0: untrained["return_mean"]}
            points.update({r["iteration"]: r["val_return_mean"] for r in read_metrics(out / "runs" / f"{algo}_s{seed}")
                           if "val_return_mean" in r})
            curves[seed] = points
        iterations = sorted(set.intersection(*(set(c) for c in curves.values())))
        ood = [json.loads((out / "runs" / f"{algo}_s{s}" / "ood" / "eval.json").read_text()) for s in seeds]
        rounds = np.array([o["memory_rounds"] if "memory_rounds" in o else [s["return_mean"] for s in o["ood"]["steps"]]
                           for o in ood])  # [seeds, rounds + 1] (older eval.json: "memory_rounds")
        result["algorithms"][algo] = {
            "iterations": iterations,
            "val_return": {str(i): [curves[s][i] for s in seeds] for i in iterations},
            "final_val_return": mean_std([curves[s][iterations[-1]] for s in seeds]),
            "ood_no_memory": mean_std([o["return_mean"] for o in ood]),
            "ood_memory_rounds_mean": rounds.mean(0).tolist(),
            "ood_memory_rounds_std": rounds.std(0).tolist(),
            "ood_best_memory_round_gain": mean_std((rounds[:, 1:].max(1) - rounds[:, 0]).tolist()),
        }
    return result


def summary_markdown(summary: dict) -> str:
    seeds = summary["seeds"]
    lines = ["# EMPO² vs GRPO on the sanity environment", "",
             f"Seeds {seeds}; mean ± std over seeds. Validation = no-memory return on the held-out test variations "
             "(iteration 0 = the untrained model).", "",
             "| algorithm | final validation return | OOD, no memory | OOD, best gain from memory rounds | "
             "wall time per run (s) |", "|---|---|---|---|---|"]
    for algo, row in summary["algorithms"].items():
        walls = [summary["wall_seconds"][f"{algo}_s{s}"] for s in seeds]
        lines.append(f"| {algo} | {row['final_val_return'][0]:.1f} ± {row['final_val_return'][1]:.1f} | "
                     f"{row['ood_no_memory'][0]:.1f} ± {row['ood_no_memory'][1]:.1f} | "
                     f"{row['ood_best_memory_round_gain'][0]:+.1f} ± {row['ood_best_memory_round_gain'][1]:.1f} | "
                     f"{np.mean(walls):.0f} |")
    lines += ["", "Validation return per iteration:", "", "| iteration | " + " | ".join(summary["algorithms"]) + " |",
              "|---|" + "---|" * len(summary["algorithms"])]
    first = next(iter(summary["algorithms"].values()))
    for it in first["iterations"]:
        cells = [f"{np.mean(row['val_return'][str(it)]):.1f} ± {np.std(row['val_return'][str(it)]):.1f}"
                 for row in summary["algorithms"].values()]
        lines.append(f"| {it} | " + " | ".join(cells) + " |")
    lines += ["", f"OOD ({summary['ood_family']} family) mean return per memory round (0 = no memory):", ""]
    for algo, row in summary["algorithms"].items():
        lines.append(f"* {algo}: " + ", ".join(f"{m:.1f}" for m in row["ood_memory_rounds_mean"]))
    lines += ["", "Commands (from the repository root):", "", "```"] + summary["commands"] + ["```", ""]
    return "\n".join(lines)


def plot(out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = json.loads((out / "summary.json").read_text())
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    for (algo, row), colour in zip(summary["algorithms"].items(), ("tab:orange", "tab:blue")):
        its = row["iterations"]
        mean = np.array([np.mean(row["val_return"][str(i)]) for i in its])
        std = np.array([np.std(row["val_return"][str(i)]) for i in its])
        left.plot(its, mean, "-o", ms=3, c=colour, label=algo.upper().replace("EMPO2", "EMPO²"))
        left.fill_between(its, mean - std, mean + std, color=colour, alpha=0.2)
        rounds = np.array(row["ood_memory_rounds_mean"])
        rstd = np.array(row["ood_memory_rounds_std"])
        right.errorbar(np.arange(len(rounds)), rounds, yerr=rstd, fmt="-o", ms=3, c=colour, capsize=3,
                       label=algo.upper().replace("EMPO2", "EMPO²"))
    left.set(xlabel="training iteration", ylabel="validation return (no memory)",
             title=f"sanity env, mean ± std over {len(summary['seeds'])} seeds")
    right.set(xlabel="memory round (0 = no memory, frozen weights)", ylabel="return",
              title=f"OOD: {summary['ood_family']} family")
    left.legend()
    right.legend()
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=110)
    print(f"wrote {out / 'compare.png'}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["run", "plot"])
    parser.add_argument("--out", default="results/sanity")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--ood_family", default="garden")
    parser.add_argument("--memory_rounds", type=int, default=2)
    parser.add_argument("--ood_episodes", type=int, default=2, help="OOD episodes per test task and round")
    args, overrides = parser.parse_known_args(argv)
    out = Path(args.out)
    if args.command == "run":
        run_all(out, [int(s) for s in args.seeds.split(",")], overrides, args.ood_family, args.memory_rounds,
                args.ood_episodes)
    plot(out)


if __name__ == "__main__":
    main()
