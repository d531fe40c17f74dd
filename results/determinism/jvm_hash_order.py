"""Does ScienceWorld print the same text on every run? 3 JVMs at once in threads (as a rollout runs them), each
replaying up to 25 gold actions of 4 tasks with the valid-action list after every step; twice per setting. With a
stock JVM (`start_jvm(..., fixed_hash_order=False)`) the listing order of a room's objects depends on which py4j
thread served a call; with `-XX:hashCode=2` (what the environments always use) every run is identical. Usage, from
the repository root:

    python results/determinism/jvm_hash_order.py        # ~5 min on 2 cores
"""
import hashlib
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the repository root: the project's modules
from envs.scienceworld.jvm import start_jvm  # noqa: E402

TASKS = [("find-living-thing", 0), ("chemistry-mix", 1), ("power-component", 2), ("use-thermometer", 0)]


def replay(server) -> tuple[str, float]:
    texts, t0 = [], time.perf_counter()
    for task, variation in TASKS:
        server.load(task, variation, "easy", True)
        gold = [str(a) for a in server.getGoldActionSequence()][:25]
        server.load(task, variation, "easy", False)
        texts.append(str(server.step("look around")))
        for action in gold:
            texts.append(str(server.step(action)))
            texts.append("|".join(str(a) for a in server.getValidActionObjectCombinations()))
        texts.append(str(server.getScore()))
    return hashlib.md5("\n".join(texts).encode()).hexdigest()[:8], time.perf_counter() - t0


def main() -> None:
    for fixed in (False, True):
        digests, seconds = [], []
        for _ in range(2):
            jvms = [start_jvm(512, 120, fixed_hash_order=fixed) for _ in range(3)]
            with ThreadPoolExecutor(3) as pool:
                results = list(pool.map(replay, [j.server for j in jvms]))
            for j in jvms:
                j.kill()
            digests += [d for d, _ in results]
            seconds += [round(s, 1) for _, s in results]
        print(f"fixed_hash_order={fixed}: {len(set(digests))} distinct outputs in {len(digests)} runs {digests}; "
              f"seconds per run {seconds}", flush=True)


if __name__ == "__main__":
    main()
