"""Where the tip call's time goes: one sanity-config rollout (16 episodes), then write_tips under cProfile.

    python results/memory_cost/profile_tips.py [--config configs/sanity_empo2.yaml] > results/memory_cost/profile_tips.txt
"""
import cProfile
import pstats
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from config import load_config, split_cli  # noqa: E402
from envs import make_env  # noqa: E402
from memory import TipMemory  # noqa: E402
from infra.models import load_policy  # noqa: E402
from rollout import ChatStream, pair_up, run_episodes, write_tips  # noqa: E402


def main(argv):
    cfg = load_config(*split_cli(argv or ["--config", "configs/sanity_empo2.yaml"]))
    torch.set_num_threads(max(1, cfg.train.torch_threads))
    model, tokenizer = load_policy(cfg.model)
    model.eval()
    chat = ChatStream(tokenizer)
    chat.first_line_stop()  # built once per run (~1 s): not part of a tip call
    n = cfg.rollout.tasks_per_iteration * cfg.rollout.group_size
    envs = [make_env(cfg.env) for _ in range(n)]
    tasks = envs[0].tasks("train")[: cfg.rollout.tasks_per_iteration]
    tasks = [t for t in tasks for _ in range(cfg.rollout.group_size)]
    start = time.perf_counter()
    episodes = run_episodes(model, chat, pair_up(envs, tasks, list(range(n)), list(range(n))), mode="no_memory",
                            memory=None, cfg=cfg.rollout, keep_caches=True)
    rollout = time.perf_counter() - start
    memory = TipMemory()
    calls = []  # (input shape, cached length, seconds) per forward of the decoder

    def before(module, args, kwargs):
        calls.append([tuple(kwargs["input_ids"].shape) if kwargs.get("input_ids") is not None else None,
                      kwargs["attention_mask"].shape[-1] if kwargs.get("attention_mask") is not None else 0,
                      time.perf_counter()])

    def after(module, args, kwargs, output):
        calls[-1][2] = time.perf_counter() - calls[-1][2]

    model.get_base_model().model.register_forward_pre_hook(before, with_kwargs=True)
    model.get_base_model().model.register_forward_hook(after, with_kwargs=True)
    profiler = cProfile.Profile()
    start = time.perf_counter()
    profiler.enable()
    stats = write_tips(model, chat, episodes, memory, cfg.rollout)
    profiler.disable()
    tips = time.perf_counter() - start
    tokens = [len(chat.encode(ep.tip)) for ep in episodes]
    print(f"{n} episodes, rollout {rollout:.1f} s; tips {tips:.1f} s ({stats}); tip tokens {tokens}; contexts "
          f"{[len(ep.kv_cache.tokens) if ep.kv_cache else 0 for ep in episodes][:1]} (caches dropped)")
    print(f"first forward: input {calls[0][0]}, mask width {calls[0][1]}, {calls[0][2]:.2f} s; then {len(calls) - 1} "
          f"decode forwards of {calls[1][0] if len(calls) > 1 else None}: {sum(c[2] for c in calls[1:]):.2f} s "
          f"({sum(c[2] for c in calls[1:]) / max(len(calls) - 1, 1) * 1000:.0f} ms each, mask width up to "
          f"{max(c[1] for c in calls)})")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("tottime").print_stats(18)


if __name__ == "__main__":
    main(sys.argv[1:])
