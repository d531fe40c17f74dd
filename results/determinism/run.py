"""Exact reruns and exact resume on the ScienceWorld quickstart (SmolLM2-135M, real JVMs, 2 CPU threads).

Three runs of the same 3-iteration config (`COMMAND`): two uninterrupted, and one SIGKILLed in the middle of
iteration 2 and continued with --resume=latest. Writes summary.json and prints whether metrics.jsonl (timing fields
aside) and the weight/memory hashes (ranks.json) are identical. Usage, from the repository root:

    python results/determinism/run.py [--out /tmp/determinism]      # ~20 min on 2 cores
"""
import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
COMMAND = [sys.executable, "train.py", "--config", "configs/quickstart.yaml", "--train.iterations=3",
           "--train.save_every=1", "--train.eval_every=2"]


def metrics(out: Path) -> list[dict]:
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [{k: v for k, v in row.items() if not k.startswith("time")} for row in rows]


def run(out: Path, kill_in_iteration: int | None = None) -> dict:
    t0 = time.time()
    cmd = COMMAND + [f"--output_dir={out}"]
    with open(out.with_suffix(".log"), "w") as log:
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        killed_after = None
        if kill_in_iteration is not None:  # SIGKILL once the previous iteration is logged and checkpointed + 20 s
            done = kill_in_iteration - 1
            ckpt = out / "checkpoints" / f"iter_{done:06d}"
            while proc.poll() is None and not ((ckpt / "state.json").exists() and len(metrics(out)) >= done
                                                if (out / "metrics.jsonl").exists() else False):
                time.sleep(1)
            time.sleep(20)
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed_after = len(metrics(out))
            proc = subprocess.Popen(cmd + ["--resume=latest"], cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
        assert proc.wait() == 0, f"run failed: see {out.with_suffix('.log')}"
    return {"metrics": metrics(out), "ranks": json.loads((out / "ranks.json").read_text()),
            "rows_logged_when_killed": killed_after, "wall_s": round(time.time() - t0, 1)}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default="/tmp/determinism")
    args = parser.parse_args()
    base = Path(args.out)
    base.mkdir(parents=True, exist_ok=True)
    runs = {"first": run(base / "first"), "second": run(base / "second"),
            "killed_in_2_resumed": run(base / "killed", kill_in_iteration=2)}
    ref = runs["first"]
    summary = {"command": " ".join(COMMAND[1:]), "runs": {}}
    for name, r in runs.items():
        summary["runs"][name] = {
            "wall_s": r["wall_s"], "rows_logged_when_killed": r["rows_logged_when_killed"],
            "metrics_identical_to_first": r["metrics"] == ref["metrics"],
            "weights_identical_to_first": r["ranks"]["weights_sha256"] == ref["ranks"]["weights_sha256"],
            "memory_identical_to_first": r["ranks"]["memory_sha256"] == ref["ranks"]["memory_sha256"],
            "iterations": [row["iteration"] for row in r["metrics"]],
        }
    summary["weights_sha256"] = ref["ranks"]["weights_sha256"]
    summary["first_run_metrics"] = ref["metrics"]
    (Path(__file__).parent / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary["runs"], indent=1))


if __name__ == "__main__":
    main()
