"""Plot and summarise results/scienceworld_lifespan/runs/{empo2,grpo}/metrics.jsonl (training return per iteration).

    python results/scienceworld_lifespan/plot.py
"""
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

HERE = Path(__file__).resolve().parent


def main():
    rows = {}
    for algo in ("empo2", "grpo", "grpo_with_novelty"):
        path = HERE / "runs" / algo / "metrics.jsonl"
        if path.exists():
            rows[algo] = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    fig, ax = plt.subplots(figsize=(6, 3.5))
    lines = ["# EMPO² vs GRPO on ScienceWorld lifespan-longest-lived (SmolLM2-135M, LoRA, CPU, seed 0)", "",
             "Training return (mean over the iteration's 8 episodes: 2 of the 5 train variations x 4) per iteration;",
             "EMPO²'s mode of each iteration in brackets. Command: `bash results/scienceworld_lifespan/run.sh`.", "",
             "| iteration | " + " | ".join(rows) + " |", "|---|" + "---|" * len(rows)]
    for algo, rs in rows.items():
        ax.plot([r["iteration"] for r in rs], [r["return_mean"] for r in rs], marker="o", label=algo)
    for i in range(max(len(rs) for rs in rows.values())):
        cells = []
        for algo, rs in rows.items():
            if i < len(rs):
                mode = f" ({rs[i]['mode']})" if algo == "empo2" else ""
                cells.append(f"{rs[i]['return_mean']:.1f}{mode}")
            else:
                cells.append("")
        lines.append(f"| {i + 1} | " + " | ".join(cells) + " |")
    lines.append("")
    for algo, rs in rows.items():
        first, last = rs[: len(rs) // 2], rs[len(rs) // 2 :]
        mean = lambda xs: sum(r["return_mean"] for r in xs) / max(len(xs), 1)  # noqa: E731
        seconds = sorted(r["time_rollout"] + r["time_tips"] + r["time_update"] for r in last)
        lines.append(f"* {algo}: first half mean {mean(first):.1f}, second half mean {mean(last):.1f}, success rate "
                     f"{max(r['success_rate'] for r in rs):.2f} at best; median iteration of the second half "
                     f"{seconds[len(seconds) // 2]:.0f} s (rollout + tips + update; EMPO²'s first three iterations "
                     "were paused while benchmarks ran)")
    ax.set_xlabel("iteration")
    ax.set_ylabel("training return (mean)")
    ax.set_title("lifespan-longest-lived, SmolLM2-135M (CPU)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(HERE / "compare.png", dpi=120)
    (HERE / "summary.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
