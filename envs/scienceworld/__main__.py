"""Step-latency benchmark: ``python -m envs.scienceworld --bench [TASK [VARIATION]]`` (default power-component 0).

Replays the task's gold actions 3 times; before every gold step it sends a misspelled action ("look arund") that
needs the valid-action list, then times the same gold actions with the scienceworld package's own
``ScienceWorldEnv.step`` for comparison; also resets and the JVM's RSS (needs psutil). Our results:
docs/scienceworld.md.
"""
from __future__ import annotations

import statistics
import sys
import time

from envs.base import Task

from .config import ScienceWorldConfig
from .env import ScienceWorldEnv


def _fmt(xs: list[float]) -> str:
    xs = sorted(xs)
    p90 = xs[int(0.9 * (len(xs) - 1))]
    return f"median {1000 * statistics.median(xs):.1f} ms, p90 {1000 * p90:.1f} ms (n={len(xs)})"


def bench(task: str = "power-component", variation: int = 0, rounds: int = 3) -> None:
    """Print median (p90) step latencies of our env and of the package's env."""
    cfg = ScienceWorldConfig(tasks=[task], num_demos=0, max_steps=1000)
    t = time.perf_counter()
    env = ScienceWorldEnv(cfg, env_step_limit=10000)
    print(f"JVM start + split listing: {time.perf_counter() - t:.2f} s")
    from scienceworld import ScienceWorldEnv as PackageEnv

    pkg = PackageEnv("", envStepLimit=10000)
    try:
        gold = env.gold_actions(Task(task, variation))
        valid_t, corr_t, full_t = [], [], []
        for _ in range(rounds):
            env.reset(Task(task, variation))
            for a in gold:  # before every gold step, one misspelled action that needs the valid-action list
                t = time.perf_counter()
                _, _, _, info = env.step("look arund")
                corr_t.append(time.perf_counter() - t)
                assert info["corrected"] and info["action"] == "look around", info
                t = time.perf_counter()
                _, _, done, _ = env.step(a)
                valid_t.append(time.perf_counter() - t)
                if done:
                    break
            pkg.load(task, variation, cfg.simplification)
            pkg.reset()
            for a in gold:
                t = time.perf_counter()
                pkg.step(a)
                full_t.append(time.perf_counter() - t)

        print("valid action, no listing:   ", _fmt(valid_t))
        print("correction triggered:       ", _fmt(corr_t))
        print("package ScienceWorldEnv.step", _fmt(full_t))
        t = time.perf_counter()
        env.reset(Task(task, variation))
        print(f"reset (same task): {1000 * (time.perf_counter() - t):.0f} ms")
        t = time.perf_counter()
        env.reset(Task(task, variation + 1))
        print(f"reset (other variation, load): {1000 * (time.perf_counter() - t):.0f} ms")
        try:
            import psutil

            print(f"JVM RSS: {psutil.Process(env.jvm_pid).memory_info().rss / 2**20:.0f} MiB (-Xmx{cfg.java_heap_mb}m)")
        except Exception as err:
            print("JVM RSS: n/a", err)
    finally:
        env.close()
        pkg.close()
        pkg.close = lambda: None


def main(argv: list[str]) -> None:
    if "--bench" not in argv:
        print(__doc__.strip())
        return
    args = [a for a in argv if a != "--bench"]
    bench(args[0] if args else "power-component", int(args[1]) if len(args) > 1 else 0)


if __name__ == "__main__":  # pragma: no cover
    main(sys.argv[1:])
