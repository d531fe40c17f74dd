"""Retrieval ablation on the sanity environment: memory.similarity none vs jaccard vs embedding.

    python results/retrieval/run.py [--seeds 0,1] [--rounds 3]

The frozen, untrained SmolLM2-135M plays the held-out "lab" variations (eval.adapt_with_memory): round 0 without
memory, then `--rounds` rounds with the tips it wrote itself, retrieved by each similarity filter (top_k 3,
threshold 0.5). No parameter changes, so the only difference between arms is which tips reach the prompt.
Writes runs/<similarity>_s<seed>/eval.json and summary.md next to this file; finished arms are skipped.
"""
import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
ARMS = ("none", "jaccard", "embedding")
ENV = ["--env.sanity.num_stages=2", "--env.sanity.max_steps=3", "--env.sanity.test_variations=8",
       "--rollout.tip_max_tokens=24", "--memory.top_k=3", "--memory.similarity_threshold=0.5"]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seeds", default="0")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--episodes_per_task", type=int, default=2)
    args = parser.parse_args()
    seeds = [int(s) for s in args.seeds.split(",")]
    commands, rows = [], {}
    for seed in seeds:
        for arm in ARMS:
            out = HERE / "runs" / f"{arm}_s{seed}"
            cmd = [sys.executable, "eval.py", "--config", "configs/sanity_empo2.yaml", *ENV, f"--train.seed={seed}",
                   f"--memory.similarity={arm}", f"--ood={args.rounds}",
                   f"--episodes_per_task={args.episodes_per_task}", f"--output={out.relative_to(ROOT)}"]
            commands.append(" ".join(cmd[1:]))
            if not (out / "eval.json").exists():
                out.mkdir(parents=True, exist_ok=True)
                print(arm, "seed", seed, flush=True)
                start = time.perf_counter()
                with open(out / "log.txt", "w") as log:
                    subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT, check=True)
                (out / "wall_seconds.json").write_text(json.dumps(round(time.perf_counter() - start, 1)))
            result = json.loads((out / "eval.json").read_text())  # older eval.json files: "memory_rounds"
            rows.setdefault(arm, []).append(result["memory_rounds"] if "memory_rounds" in result
                                            else [step["return_mean"] for step in result["ood"]["steps"]])
    lines = ["# Retrieval ablation (sanity env, lab family, untrained SmolLM2-135M, frozen)", "",
             f"Seeds {seeds}; mean return over 8 held-out variations x {args.episodes_per_task} episodes per round "
             "(round 0 = no memory), mean ± std over seeds.", "",
             "| similarity | " + " | ".join(f"round {r}" for r in range(args.rounds + 1)) + " | best gain over round 0 |",
             "|---|" + "---|" * (args.rounds + 2)]
    summary = {}
    for arm, runs in rows.items():
        runs = np.array(runs)
        gains = runs[:, 1:].max(1) - runs[:, 0]
        summary[arm] = {"rounds_mean": runs.mean(0).round(2).tolist(), "rounds_std": runs.std(0).round(2).tolist(),
                        "best_gain_mean": round(float(gains.mean()), 2), "best_gain_std": round(float(gains.std()), 2)}
        cells = [f"{m:.1f} ± {s:.1f}" for m, s in zip(runs.mean(0), runs.std(0))]
        lines.append(f"| {arm} | " + " | ".join(cells) + f" | {gains.mean():+.1f} ± {gains.std():.1f} |")
    lines += ["", "Commands (from the repository root):", "", "```", *commands, "```", ""]
    (HERE / "summary.md").write_text("\n".join(lines))
    (HERE / "summary.json").write_text(json.dumps({"seeds": seeds, "arms": summary, "commands": commands}, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
