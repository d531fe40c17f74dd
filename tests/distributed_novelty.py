"""The novelty bonus of one iteration's episodes, paid in 1 process or in 2 (gloo), as train.play pays it; run by
tests/test_distributed.py::test_novelty_is_the_same_on_one_and_two_processes.

    python tests/distributed_novelty.py OUT.json                              (all 8 episodes in one process)
    torchrun --nproc_per_node 2 tests/distributed_novelty.py OUT.json         (episodes 0-3 on rank 0, 4-7 on rank 1)

Two tasks; states recur within a rank, across ranks and from earlier iterations (`PRIOR`), one step crashed (None).
Writes {"intrinsic": per episode in episode order, "visits": each rank's counts} (rank 0 writes; every rank
contributes through one gather). Each rank of a 2-process run leaves with os._exit(0) after writing
OUT.rank<R>.done (`distributed_update.leave`: gloo's teardown at interpreter exit has aborted in CI).
"""
import faulthandler
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from distributed_update import leave  # noqa: E402
from envs.base import Task  # noqa: E402
from infra.runtime import gather_objects, make_accelerator  # noqa: E402
from advantages import pay_novelty  # noqa: E402
from memory import TipMemory  # noqa: E402
from rollout import Episode  # noqa: E402

# (task variation, states: the first observation, then one per step)
EPISODES = [
    (0, ["start", "hall", "kitchen", "garden"]),
    (0, ["start", "hall", "Hall "]),  # "Hall " is the state "hall" (memory.state_key)
    (0, ["start", "cellar", None]),  # the environment crashed on the second step
    (1, ["door", "room", "room"]),
    (0, ["start", "kitchen", "attic"]),  # rank 1 from here: "kitchen" was reached on rank 0 too
    (0, ["start", "garden", "hall"]),
    (1, ["door", "room", "window"]),
    (1, ["door", "window", "roof"]),
]
PRIOR = [(0, "hall"), (1, "room"), (1, "door")]  # visits of earlier iterations, identical on every rank


def episodes_of(rank: int, world: int) -> list[Episode]:
    """The episodes rank `rank` of `world` plays: a contiguous share of EPISODES (groups never span ranks)."""
    share = len(EPISODES) // world
    return [Episode(Task("rooms", EPISODES[i][0]), group=i // 2, mode="off_policy", states=list(EPISODES[i][1]))
            for i in range(rank * share, (rank + 1) * share)]


def memory_before() -> TipMemory:
    memory = TipMemory()
    for variation, state in PRIOR:
        memory.visit(Task("rooms", variation).key, state)
    return memory


def main(out_file: str) -> None:
    accelerator = make_accelerator()
    rank, world = accelerator.process_index, accelerator.num_processes
    memory, episodes = memory_before(), episodes_of(rank, world)
    pay_novelty(episodes, memory, lambda obj: gather_objects(accelerator, obj))  # as train.play pays it
    intrinsic = [x for part in gather_objects(accelerator, [ep.intrinsic for ep in episodes]) for x in part]
    visits = gather_objects(accelerator, {key: dict(counts) for key, counts in memory.visits.items()})
    if accelerator.is_main_process:
        Path(out_file).write_text(json.dumps({"intrinsic": intrinsic, "visits": visits}))
    leave(accelerator, out_file)


if __name__ == "__main__":
    faulthandler.enable()
    main(sys.argv[1])
