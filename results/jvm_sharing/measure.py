"""Memory and speed of 16 ScienceWorld environments: one JVM each vs shared JVMs (`env.scienceworld.jvms`).

For each setting: build the pool the trainer builds (`envs.make_env_pool`), play one episode on every environment
in parallel threads as a rollout does (reset, then up to 10 gold actions of its own variation), then sum the RSS
of the Java processes. Writes summary.json next to this file. Usage, from the repository root:

    python results/jvm_sharing/measure.py [--envs 16] [--settings 0,4,2,1] [--task power-component]
"""
import argparse
import json
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the project's modules
from config import EnvConfig  # noqa: E402
from envs import make_env_pool  # noqa: E402
from envs.base import Task  # noqa: E402


def java_rss_mb() -> tuple[int, float]:
    """(number of java child processes, their summed RSS in MB)."""
    kids = [p for p in psutil.Process(os.getpid()).children(recursive=True) if "java" in p.name()]
    return len(kids), sum(p.memory_info().rss for p in kids) / 2**20


def measure(task: str, n_envs: int, jvms: int) -> dict:
    cfg = EnvConfig(name="scienceworld")
    cfg.scienceworld.tasks, cfg.scienceworld.num_demos, cfg.scienceworld.jvms = [task], 0, jvms
    t0 = time.perf_counter()
    envs = make_env_pool(cfg, n_envs)
    start_s = time.perf_counter() - t0
    variations = [t.variation for t in envs[0].tasks("train")]
    golds = [envs[0].gold_actions(Task(task, v))[:10] for v in variations]
    steps, t1 = 0, time.perf_counter()

    def play(i):
        env, gold = envs[i], golds[i % len(golds)]
        env.reset(Task(task, variations[i % len(variations)]))
        for action in gold:
            if env.step(action)[2]:
                break
        return len(gold)

    with ThreadPoolExecutor(n_envs) as pool:
        steps = sum(pool.map(play, range(n_envs)))
    play_s = time.perf_counter() - t1
    count, rss = java_rss_mb()
    for env in envs:
        env.close()
    return {"jvms_setting": jvms, "java_processes": count, "java_rss_mb": round(rss), "rss_per_env_mb": round(rss / n_envs),
            "pool_start_s": round(start_s, 1), "episode_round_s": round(play_s, 2), "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--envs", type=int, default=16)
    parser.add_argument("--settings", default="0,4,2,1")
    parser.add_argument("--task", default="power-component")
    args = parser.parse_args()
    rows = [measure(args.task, args.envs, int(j)) for j in args.settings.split(",")]
    for row in rows:
        print(row, flush=True)
    out = {"task": args.task, "envs": args.envs, "cpu_count": os.cpu_count(), "rows": rows}
    (Path(__file__).parent / "summary.json").write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
