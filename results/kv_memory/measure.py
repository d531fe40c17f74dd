"""Peak memory of the rollout's KV caches at turn boundaries, on CPU (issue: "KV memory at most ~1x").

Plays one rollout of 6 episodes (2 GRPO groups of 3, ~1,100-token first messages, 2-4 turns each, so episodes
finish at different turns) + their tips with SmolLM2-135M fp32 and `rollout.kv_reuse`, and records around every
`prefill` / `generate` call the peak resident memory (Linux VmHWM, reset before each call) against the memory
the model alone holds. glibc is told to serve every allocation >= 64 KiB by mmap (MALLOC_MMAP_THRESHOLD_), so
a freed tensor leaves the process at once and the resident size follows the live tensors.

    python results/kv_memory/measure.py [--code DIR] [--kv-cache dynamic|static]

--code: the checkout whose engine/generation.py / rollout.py to measure (default: this repository), e.g. an extracted
copy of the commit before the change. Per call it prints the KV held by the episodes going in and coming out, the
batch cache at the end of the call (rows x longest context, padding included), and the peak above the model.
"""
import argparse
import functools
import hashlib
import inspect
import os
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def status() -> dict[str, int]:
    """VmRSS and VmHWM (peak since the last reset) in bytes."""
    text = Path("/proc/self/status").read_text()
    return {key: int(re.search(key + r":\s+(\d+)", text).group(1)) * 1024 for key in ("VmRSS", "VmHWM")}


def reset_peak() -> None:
    Path("/proc/self/clear_refs").write_text("5")


def kv_bytes(caches) -> int:
    """Bytes of the distinct tensors held by a list of PrefixCache (shared group caches counted once)."""
    seen = {}
    for cache in caches or []:
        for t in (cache.keys + cache.values) if cache is not None else []:
            if t is not None:
                seen[t.data_ptr()] = t.numel() * t.element_size()
    return sum(seen.values())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--code", default=str(ROOT))
    parser.add_argument("--kv-cache", default="")
    args = parser.parse_args()
    if os.environ.get("MALLOC_MMAP_THRESHOLD_") != "65536":  # glibc reads it at start-up: run again with it
        os.environ.update(MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1", HF_HUB_OFFLINE="1")
        os.execv(sys.executable, [sys.executable] + sys.argv)
    sys.path.insert(0, args.code)
    sys.path.insert(1, str(ROOT))
    import dataclasses

    import torch

    torch.set_num_threads(1)
    import rollout
    from config import ModelConfig, RolloutConfig
    from envs.base import Env, Task
    from memory import TipMemory
    if (Path(args.code) / "infra").is_dir():  # the layout since issue 42; an older checkout has models.py on top
        from infra.models import load_policy
    else:
        from models import load_policy

    class ReadingEnv(Env):
        """A long first message, short later observations, done after `steps` actions (its step limit)."""

        def __init__(self, steps: int):
            self.steps, self.t = steps, 0

        def tasks(self, split):
            return [Task("reading", v) for v in range(2)]

        def reset(self, task):
            self.t = 0
            facts = " ".join(f"Fact {i}: shelf {i % 7} holds {i * 3 % 11} red books and {i % 5} blue ones."
                             for i in range(60 + 5 * task.variation))
            return f"Read the inventory, then answer questions about it one at a time.\n{facts}\nFirst: which shelf?"

        def step(self, action):
            self.t += 1
            done = self.t >= self.steps
            obs = f"Noted '{action[:30]}'. Question {self.t + 1}: how many blue books are on shelf {self.t}?"
            return obs, 0.0, done, dict(score=0.0, success=False, truncated=done, env_error="")

        def step_limit(self, task):
            return self.steps

    model, tokenizer = load_policy(ModelConfig(lora=False))
    model.eval()
    chat = rollout.ChatStream(tokenizer)
    cfg = RolloutConfig(max_action_tokens=16, max_prompt_tokens=4096, tip_max_tokens=16, temperature=1.0)
    # Which cache layout runs. Checkouts with the key rollout.kv_cache: the key. Since its removal: "static", or
    # --kv-cache dynamic passed to the engine (generate's argument, later the kind generate gives feed_prefixes).
    # Before the static cache existed: "dynamic" only.
    if "kv_cache" in {f.name for f in dataclasses.fields(cfg)}:
        cfg = dataclasses.replace(cfg, kv_cache=args.kv_cache or cfg.kv_cache)
        kind = cfg.kv_cache
    elif "kv_cache" in inspect.signature(rollout.generate).parameters:  # generate(kv_cache=), until it was removed
        kind = args.kv_cache or "static"
        rollout.generate = functools.partial(rollout.generate, kv_cache=kind)
    elif (Path(args.code) / "engine").is_dir():  # since: the kind generate passes to feed_prefixes
        kind = args.kv_cache or "static"
        from engine import generation
        feed = generation.feed_prefixes
        generation.feed_prefixes = lambda *a, **k: feed(*a, **{**k, "kind": kind})
    else:
        kind = "dynamic (the only one)"
    rollout.generate(model, chat.pad_id, chat.eos_id, [chat.first_turn("Hi")], max_new_tokens=2, temperature=0.0)
    baseline = status()["VmRSS"]  # the model, warmed up

    calls, generated = [], []
    originals = {name: getattr(rollout, name) for name in ("generate", "prefill")}

    def instrumented(name):
        def call(model, *a, **kw):
            caches = kw.get("caches") if name == "generate" else None
            contexts = a[2] if name == "generate" else a[0]
            held = kv_bytes(caches)
            before = status()["VmRSS"]
            reset_peak()
            start = time.perf_counter()
            out = originals[name](model, *a, **kw)
            seconds = time.perf_counter() - start
            peak = status()["VmHWM"]
            after_caches = caches if name == "generate" else out
            per_token = 2 * model.config.num_hidden_layers * model.config.num_key_value_heads * (
                model.config.hidden_size // model.config.num_attention_heads) * 4
            longest = max(len(c) for c in contexts) + (kw.get("max_new_tokens", 0) if name == "generate" else 0)
            rows = len(contexts) if name == "generate" else len({tuple(c) for c in contexts})  # prefill: distinct
            calls.append(dict(call=name, rows=rows, held_in=held, held_out=kv_bytes(after_caches),
                              batch=rows * longest * per_token, other=before - baseline - held,
                              peak=peak - baseline, seconds=seconds))
            if name == "generate":
                generated.append(out)
            return out
        return call

    for name in originals:
        setattr(rollout, name, instrumented(name))
    envs = [ReadingEnv(s) for s in (2, 3, 4, 2, 3, 4)]
    tasks = [Task("reading", 0)] * 3 + [Task("reading", 1)] * 3
    memory = TipMemory(capacity=10, top_k=2)
    episodes = rollout.run_episodes(model, chat, rollout.pair_up(envs, tasks, [0, 0, 0, 1, 1, 1], list(range(6))),
                                    mode="no_memory", memory=memory, cfg=cfg, keep_caches=True)
    rollout.write_tips(model, chat, episodes, memory, cfg)

    mb = lambda b: f"{b / 2**20:7.1f}"  # noqa: E731
    print(f"code: {args.code}  kv_cache: {kind}")
    print(f"model alone (resident, warmed up): {baseline / 2**20:.0f} MiB; "
          f"episode streams at the end: {sorted(len(ep.ids) for ep in episodes)} tokens")
    print("MiB above the model. KV in / out: the call's rows' caches before / after it; batch: rows x (longest\n"
          "context + max_new_tokens) at 46 KiB a token; other: memory held before the call besides KV in (other\n"
          "episodes' caches, kept for their tips); ratio = peak / (other + batch): 1.0 = the batch is the only copy")
    print("call      rows    KV in   KV out    batch    other     peak   ratio  seconds")
    for c in calls:
        c["ratio"] = c["peak"] / (c["other"] + c["batch"])
        print(f"{c['call']:9} {c['rows']:4}  {mb(c['held_in'])}  {mb(c['held_out'])}  {mb(c['batch'])}  "
              f"{mb(c['other'])}  {mb(c['peak'])}  {c['ratio']:6.2f}  {c['seconds']:7.1f}")
    worst = max(calls, key=lambda c: c["ratio"])
    print(f"highest ratio: {worst['ratio']:.2f} ({worst['call']}, {worst['rows']} rows); "
          f"highest peak {max(c['peak'] for c in calls) / 2**20:.0f} MiB above the model")
    digest = hashlib.sha256(repr(generated).encode()).hexdigest()[:16]
    print(f"tokens generated: {sum(len(a) for out in generated for a in out)} (sha256 {digest}); "
          f"tips: {[ep.tip[:30] for ep in episodes]}")


if __name__ == "__main__":
    main()
