"""Benchmark of one training iteration's parts; prints every ratio in one run (README, docs/performance.md).

    python -m tools.bench --config configs/quickstart.yaml [--repeats=2] [--long_turns=10] [--parts=abcde]
                    [--prefill_tokens=256] [--device=cuda|cpu] [--section.key=value ...]
    python -m tools.bench --smoke [--device=cuda|cpu] [--size=0.5b|tiny]     (= python -m tools.smoke: no model files needed)

On the configured environment and model (the quickstart: ScienceWorld find-living-thing, SmolLM2-135M on CPU):
  (a) rollout wall time and prefill positions per turn with `rollout.kv_reuse` on vs off, at the config's shape
      and at a `--long_turns`-turn shape (arms interleaved, same seed, median of repeats);
  (b) one batched `generate` per step vs one call per episode (same contexts, eos disabled: work for work);
  (c) the update on packed episodes (one sample per episode) vs one sample per step (same loss, checked), and
      the padding fraction of micro-batches in arrival order vs length-bucketed;
  (d) environment, tip-writing and memory time as shares of one iteration (rollout + tips + update);
  (e) prefill throughput (first turns cut to their last `--prefill_tokens` tokens) as a fraction of this
      machine's measured matmul ceiling, in fp32 and bf16;
  (f) one training iteration per mode (rollout, tips, old log-probs, update as train.py runs them, from the same
      weights and a memory filled by one no-memory iteration): seconds per part, each memory mode's ratio to the
      no-memory iteration, and the positions through the old-log-prob and the update forwards.
`--parts` picks a subset (e.g. --parts=f); the results in results/bench/ say which run printed what.
Prefill positions are counted by a forward hook: every position of a forward call with more than one input
token (padding included, since it costs the same compute). `--device` (default: cuda when there is one) runs the
model there; every timer synchronises first (`clock`). Ceilings: `matmul_ceiling` (prefill, update),
`copy_bandwidth` and `decode_floor_ms` = (weights + KV cache) / bandwidth (decode); tools/smoke.py prints them too.
"""
from __future__ import annotations

import dataclasses
import os
import platform
import random
import statistics
import sys
import time
from pathlib import Path

import torch

from advantages import counts_novelty, group_advantages, pay_novelty
from config import load_config, split_cli
from envs import make_env
from engine.generation import left_pad
from losses import compute_old_logprobs, length_buckets, padded_tokens, samples_loss
from memory import TipMemory
from infra.models import load_policy
from rollout import ChatStream, pair_up, run_episodes, write_tips
from samples import build_samples, per_step_samples


def clock() -> float:
    """Wall time once the GPU has finished its queued work: CUDA runs asynchronously, so a timer read without a
    synchronise would measure only the kernel launches."""
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
    return time.perf_counter()


def device_of(model) -> torch.device:
    return next(model.parameters()).device


class ForwardCounter:
    """Counts positions the model computes: prefill (calls with >1 input token) and decode (1 token)."""

    def __init__(self, model):
        self.prefill = self.decode = 0
        # The input embedding sees every forward, whether `generate` or a direct call runs it.
        model.get_input_embeddings().register_forward_pre_hook(self.hook)

    def hook(self, module, args):
        ids = args[0] if args else None
        if ids is not None and ids.dim() == 2:
            if ids.shape[1] > 1:
                self.prefill += ids.numel()
            else:
                self.decode += ids.numel()

    def reset(self):
        self.prefill = self.decode = 0


class Timed:
    """Wraps objects' methods to add up their wall time (environment steps, memory calls)."""

    def __init__(self, objects, names):
        self.seconds = 0.0
        for obj in objects:
            for name in names:
                setattr(obj, name, self.wrap(getattr(obj, name)))

    def wrap(self, fn):
        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start
        return timed


def play(model, chat, envs, tasks, cfg, kv_reuse: bool, seed: int, memory=None, mode="no_memory"):
    rollout = dataclasses.replace(cfg.rollout, kv_reuse=kv_reuse)
    torch.manual_seed(seed)
    start = clock()
    episodes = run_episodes(model, chat, pair_up(envs, tasks, [t.variation for t in tasks]), mode=mode,
                            memory=memory, cfg=rollout, keep_caches=memory is not None)
    return episodes, clock() - start


def rollout_ratio(model, chat, counter, envs, tasks, cfg, repeats: int, turns: int) -> dict:
    """(a): median rollout wall and prefill positions per turn, reuse on vs off, arms interleaved."""
    walls = {True: [], False: []}
    prefill = {True: 0, False: 0}
    turns_played = {True: 0, False: 0}
    for r in range(repeats):
        for reuse in (False, True):
            counter.reset()
            episodes, wall = play(model, chat, envs, tasks, cfg, reuse, seed=r)
            walls[reuse].append(wall)
            prefill[reuse] += counter.prefill
            turns_played[reuse] += sum(ep.num_actions for ep in episodes)
    off, on = statistics.median(walls[False]), statistics.median(walls[True])
    per_turn = {k: prefill[k] / max(turns_played[k], 1) for k in prefill}
    print(f"(a) rollout, {len(tasks)} episodes x up to {turns} turns ({sum(turns_played.values()) / repeats / 2:.0f} "
          f"turns played per arm)")
    print(f"    wall: re-encode {off:.1f} s, kv reuse {on:.1f} s -> {off / on:.2f}x less")
    print(f"    prefill positions per turn: re-encode {per_turn[False]:.0f}, kv reuse {per_turn[True]:.0f} -> "
          f"{per_turn[False] / max(per_turn[True], 1):.2f}x fewer")
    return {"wall_off": off, "wall_on": on, "prefill_per_turn_off": per_turn[False],
            "prefill_per_turn_on": per_turn[True]}


def timed_generate(model, chat, contexts, new_tokens, temperature):
    ids, mask = (t.to(device_of(model)) for t in left_pad(contexts, chat.pad_id))
    start = clock()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=True, temperature=temperature, top_k=0, pad_token_id=chat.pad_id)
    return clock() - start


def update_time(model, samples, pad_id, loss_cfg) -> tuple[float, float]:
    """Forward + backward of every sample (one per forward) as ONE mini-batch: (seconds, its loss: each step's token
    mean averaged over all steps, the same for packed and per-step samples)."""
    start, total, units = clock(), 0.0, sum(s.units for s in samples)
    model.train()
    for sample in samples:
        loss, _ = samples_loss(model, [sample], pad_id, device_of(model), loss_cfg, "none", units)
        loss.backward()
        total += loss.item()
    model.zero_grad(set_to_none=True)
    model.eval()
    return clock() - start, total


def median_seconds(fn, repeats: int = 5) -> float:
    fn()  # warm-up (kernel selection, allocator)
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def matmul_ceiling(dtype, device="cpu") -> float:
    """GFLOP/s of an n^3 matmul (n = 1024 on CPU, 8192 on a GPU; median of 5): the compute ceiling of prefill and
    update, whose work is mostly matmuls of the model's shapes."""
    n = 8192 if torch.device(device).type == "cuda" else 1024
    a, b = (torch.randn(n, n, dtype=dtype, device=device) for _ in range(2))
    return 2 * n**3 / median_seconds(lambda: a @ b) / 1e9


def copy_bandwidth(device="cpu") -> float:
    """GB/s of a device-to-device copy (bytes read + written; 1 GiB on a GPU, 256 MiB on CPU): the memory ceiling
    of decode, which reads every weight and the whole KV cache once per token step."""
    size = (1 << 30) if torch.device(device).type == "cuda" else (1 << 28)
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    return 2 * size / median_seconds(lambda: dst.copy_(src)) / 1e9


def prefill_rate(model, contexts, pad_id) -> float:
    """Prefill tokens per second of one forward over `contexts` (left-padded, counted with padding)."""
    ids, mask = (t.to(device_of(model)) for t in left_pad(contexts, pad_id))
    with torch.no_grad():
        return ids.numel() / median_seconds(lambda: model(input_ids=ids, attention_mask=mask, logits_to_keep=1), 2)


def forward_flops(config, batch: int, length: int) -> float:
    """Matmul FLOPs of a forward over batch x length tokens: 2 per decoder weight per token, plus causal attention
    (QK^T and AV: 2 * length^2 * hidden per layer and sequence); the LM head is left out (it sees few positions)."""
    layer = (2 * config.hidden_size * (config.num_attention_heads + config.num_key_value_heads)
             * config.hidden_size // config.num_attention_heads + 3 * config.hidden_size * config.intermediate_size)
    tokens = batch * length
    return config.num_hidden_layers * (2 * layer * tokens + 2 * length * length * config.hidden_size * batch)


def decode_ms(model, batch: int, context: int, steps: int) -> float:
    """ms per token step of `generate` on `batch` rows whose KV cache already holds `context` positions (random
    keys/values: the cost depends on the shapes only); greedy, every row runs all `steps` steps."""
    from transformers import DynamicCache

    config, device = model.config, device_of(model)
    dtype = model.get_input_embeddings().weight.dtype
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    shape = (batch, config.num_key_value_heads, context, head_dim)

    def run():
        cache = DynamicCache(ddp_cache_data=[(torch.randn(shape, dtype=dtype, device=device),
                                              torch.randn(shape, dtype=dtype, device=device))
                                             for _ in range(config.num_hidden_layers)])
        ids = torch.randint(0, 1000, (batch, 1), device=device)
        mask = torch.ones((batch, context + 1), dtype=torch.long, device=device)
        with torch.no_grad():
            start = clock()
            model.generate(input_ids=ids, attention_mask=mask, cache=cache, max_new_tokens=steps,
                           min_new_tokens=steps, do_sample=False, pad_token_id=0)
            return clock() - start

    run()
    return 1000 * statistics.median(run() for _ in range(2)) / steps


def decode_floor_ms(model, batch: int, context: int, steps: int, bandwidth_gbs: float) -> float:
    """The memory-bandwidth floor of one decode step: (weights read + KV cache read) / bandwidth. Every weight is
    read once per step except the input embedding (only the rows looked up) unless it is also the LM head."""
    config = model.config
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    embedding, head = model.get_input_embeddings().weight, model.get_output_embeddings().weight
    if embedding is not head:
        weights -= embedding.numel() * embedding.element_size()
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    kv = (2 * config.num_hidden_layers * config.num_key_value_heads * head_dim * embedding.element_size()
          * batch * (context + steps / 2))
    return 1000 * (weights + kv) / (bandwidth_gbs * 1e9)


def update_rate(model, batch: int, length: int, pad_id: int) -> float:
    """Tokens per second of forward + backward over batch x length random tokens, the second half of each row
    scored as actions (as losses.samples_loss runs the update)."""
    from losses import sequence_action_logprobs

    seqs = torch.randint(0, 1000, (batch, length)).tolist()
    masks = [[0] * (length // 2) + [1] * (length - length // 2) for _ in range(batch)]
    model.train()

    def step():
        logps, _ = sequence_action_logprobs(model, seqs, masks, pad_id, device_of(model))
        torch.cat(logps).sum().backward()

    rate = batch * length / median_seconds(step, 2)
    model.zero_grad(set_to_none=True)
    model.eval()
    return rate


def peak_memory_gb(device, reset: bool = False) -> float:
    """Peak GPU memory allocated by torch (reset: start a new window), or this process's peak RSS on CPU."""
    if torch.device(device).type == "cuda":
        if reset:
            torch.cuda.reset_peak_memory_stats()
        return torch.cuda.max_memory_allocated() / 1e9
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # KiB on Linux


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    options = {"repeats": 2, "long_turns": 10, "parts": "abcdef", "prefill_tokens": 256,
               "device": "cuda" if torch.cuda.is_available() else "cpu", "smoke": False, "size": ""}
    rest = []
    for i, arg in enumerate(argv):  # `--device cuda` is read as `--device=cuda`
        if arg in ("--device", "--size") and i + 1 < len(argv):
            argv[i + 1] = f"{arg}={argv[i + 1]}"
            continue
        key, equals, value = arg[2:].partition("=")
        if key == "smoke" and not equals:
            options["smoke"] = True
        elif key in options and equals:
            options[key] = value if isinstance(options[key], str) else int(value)
        else:
            rest.append(arg)
    if options["smoke"]:  # tools/smoke.py in its own process (it imports this file's measurements)
        size = [f"--size={options['size']}"] if options["size"] else []
        root = str(Path(__file__).resolve().parents[1])  # `-m tools.smoke` resolves from the repository
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
        os.execve(sys.executable, [sys.executable, "-m", "tools.smoke", f"--device={options['device']}", *size], env)
    device = check_device(options["device"])
    cfg = load_config(*split_cli(rest))
    if cfg.train.torch_threads > 0:
        torch.set_num_threads(cfg.train.torch_threads)
    print(f"machine: {machine(device)}, torch threads {torch.get_num_threads()}, torch {torch.__version__}; model "
          f"{cfg.model.name_or_path} ({cfg.model.dtype})")
    model, tokenizer = load_policy(cfg.model, device=device)
    model.eval()
    chat = ChatStream(tokenizer)
    counter = ForwardCounter(model)
    n = cfg.rollout.tasks_per_iteration * cfg.rollout.group_size
    envs = [make_env(cfg.env) for _ in range(n)]
    train_tasks = envs[0].tasks("train")
    tasks = [train_tasks[i % len(train_tasks)] for i in range(cfg.rollout.tasks_per_iteration)
             for _ in range(cfg.rollout.group_size)]
    steps_key = cfg.env.name  # the env section holding max_steps
    parts = options["parts"]

    if "a" in parts:  # KV reuse, at the config's shape and at a long shape
        rollout_ratio(model, chat, counter, envs, tasks, cfg, options["repeats"],
                      getattr(cfg.env, steps_key).max_steps)
    for env in envs:
        env.close()
    long_cfg = load_config(*split_cli(rest + [f"--env.{steps_key}.max_steps={options['long_turns']}"]))
    envs = [make_env(long_cfg.env) for _ in range(n)]
    if "a" in parts:
        rollout_ratio(model, chat, counter, envs, tasks, long_cfg, options["repeats"], options["long_turns"])

    contexts = [chat.first_turn(env.reset(task)) for env, task in zip(envs, tasks)]
    if "b" in parts:  # batched generate vs one call per episode, on the episodes' first turns
        new = cfg.rollout.max_action_tokens
        timed_generate(model, chat, contexts[:1], 2, 1.0)
        batched = statistics.median(timed_generate(model, chat, contexts, new, 1.0)
                                    for _ in range(options["repeats"]))
        single = statistics.median(sum(timed_generate(model, chat, [c], new, 1.0) for c in contexts)
                                   for _ in range(options["repeats"]))
        print(f"(b) generate, {len(contexts)} first turns x {new} tokens: one batched call {batched:.2f} s, one "
              f"call per episode {single:.2f} s -> {single / batched:.2f}x")

    if "c" in parts or "d" in parts:  # one iteration in memory mode, timers on the environment and the memory
        iteration_parts(model, chat, envs, tasks, cfg, long_cfg)
    for env in envs:
        env.close()
    if "f" in parts:  # one iteration per mode at the config's shape
        envs = [make_env(cfg.env) for _ in range(n)]
        per_mode_iterations(model, chat, envs, tasks, cfg)
        for env in envs:
            env.close()

    if "e" in parts:  # prefill throughput against the matmul ceiling, fp32 and bf16
        params = sum(p.numel() for p in model.parameters())
        short = [c[-options["prefill_tokens"] :] for c in contexts]
        for dtype in (torch.float32, torch.bfloat16):
            ceiling = matmul_ceiling(dtype, device)
            rate = prefill_rate(model.to(dtype), short, chat.pad_id)
            achieved = rate * 2 * params / 1e9
            print(f"(e) {str(dtype).split('.')[-1]}: matmul ceiling {ceiling:.1f} GFLOP/s, prefill of "
                  f"{len(short)} x {len(short[0])} tokens {rate:.0f} tokens/s = {achieved:.0f} GFLOP/s "
                  f"({achieved / ceiling:.0%} of the ceiling)")
        model.to(torch.float32)


def iteration_parts(model, chat, envs, tasks, cfg, long_cfg) -> None:
    """(c) packed vs per-step update and padding, (d) time shares, on one memory-mode iteration."""
    memory = TipMemory.from_config(cfg.memory)
    env_timer = Timed(envs, ["reset", "step"])
    memory_timer = Timed([memory], ["retrieve", "stage", "sync", "visit", "visit_count"])
    episodes, rollout_wall = play(model, chat, envs, tasks, long_cfg, True, seed=0, memory=memory,
                                  mode="on_policy_tips")
    start = clock()
    write_tips(model, chat, episodes, memory, long_cfg.rollout)
    memory.sync()
    tips_wall = clock() - start
    returns = [ep.extrinsic_return for ep in episodes]
    advantages = group_advantages(returns, [ep.group for ep in episodes])
    advantages = [a if a else 1.0 for a in advantages]  # a non-zero loss even when every return is equal
    packed = build_samples(episodes, advantages)  # current-turn tips: one branch-packed sample per episode
    per_step = [piece for sample in build_samples(episodes, advantages, branch_packing=False)
                for piece in per_step_samples(sample)]  # one sample per step, each its own context
    random.Random(0).shuffle(per_step)
    for samples in (packed, per_step):
        compute_old_logprobs(model, samples, chat.pad_id, device_of(model), cfg.train.micro_batch_size)
    packed_wall, packed_loss = update_time(model, packed, chat.pad_id, cfg.loss)
    step_wall, step_loss = update_time(model, per_step, chat.pad_id, cfg.loss)
    print(f"(c) update (forward + backward): packed episodes ({len(packed)} samples) {packed_wall:.1f} s, one "
          f"sample per step ({len(per_step)} samples) {step_wall:.1f} s -> {step_wall / packed_wall:.2f}x; "
          f"step-weighted loss {packed_loss:.6f} vs {step_loss:.6f} (equal: {abs(packed_loss - step_loss) < 1e-4})")
    lengths = [len(s.ids) for s in per_step]
    size = max(cfg.train.micro_batch_size, 4)
    arrival = [list(range(i, min(i + size, len(lengths)))) for i in range(0, len(lengths), size)]
    before, after = padded_tokens(lengths, arrival), padded_tokens(lengths, length_buckets(lengths, size))
    print(f"    padding of {size}-sample micro-batches over the per-step samples: arrival order "
          f"{before[0] / before[1]:.1%}, length-bucketed {after[0] / after[1]:.1%}")
    iteration = rollout_wall + tips_wall + packed_wall
    print(f"(d) one iteration ({iteration:.1f} s: rollout {rollout_wall:.1f}, tips {tips_wall:.1f}, update "
          f"{packed_wall:.1f}): environment {env_timer.seconds / iteration:.1%}, tip writing "
          f"{tips_wall / iteration:.1%}, memory {memory_timer.seconds / iteration:.1%}")


def mode_iteration(model, chat, envs, tasks, cfg, mode, memory, optimizer, accelerator, seed) -> dict:
    """One iteration as train.py runs it: rollout, tips, advantages, samples, old log-probs, update (seconds each)."""
    from train import make_samples, update

    seeds = [seed * 1000 + j for j in range(len(tasks))]
    model.eval()
    t0 = clock()
    episodes = run_episodes(model, chat, pair_up(envs, tasks, [t.variation for t in tasks], seeds), mode=mode,
                            memory=memory, cfg=cfg.rollout, keep_caches=True)
    if counts_novelty(mode, memory, cfg.intrinsic):
        pay_novelty(episodes, memory)
    t1 = clock()
    write_tips(model, chat, episodes, memory, cfg.rollout)
    memory.sync()
    t2 = clock()
    advantages = group_advantages([ep.extrinsic_return for ep in episodes], [ep.group for ep in episodes])
    advantages = [a if a else 1.0 for a in advantages]  # a non-zero loss even when every return is equal
    samples = make_samples(episodes, advantages, cfg, model)
    recompute_tokens = sum(len(c.ids) for s in samples for c in s.old)  # what recomputing every old log-prob encodes
    _, old_tokens = compute_old_logprobs(model, samples, chat.pad_id, device_of(model), cfg.train.micro_batch_size)
    t3 = clock()
    metrics = update(model, optimizer, samples, cfg, accelerator, mode, chat.pad_id, random.Random(seed))
    t4 = clock()
    return {"rollout": t1 - t0, "tips": t2 - t1, "old_logp": t3 - t2, "update": t4 - t3, "total": t4 - t0,
            "old_tokens": old_tokens, "recompute_tokens": recompute_tokens, "update_tokens": sum(len(s.ids) for s in
            samples), "samples": len(samples), "steps": sum(s.steps for s in samples),
            "tips_shown": sum(map(sum, (ep.tips_retrieved for ep in episodes))), "loss": metrics["loss"]}


def per_mode_iterations(model, chat, envs, tasks, cfg) -> dict:
    """(f) one iteration per mode from the same weights and the same memory (filled by a no-memory iteration)."""
    from infra.runtime import make_accelerator

    accelerator = make_accelerator()
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.train.lr)
    start = [p.detach().clone() for p in params]
    memory = TipMemory.from_config(cfg.memory)
    mode_iteration(model, chat, envs, tasks, cfg, "no_memory", memory, optimizer, accelerator, seed=0)  # warm-up
    frozen = memory.state_dict()
    rows = {}
    for mode in ("no_memory", "off_policy", "on_policy_tips"):
        with torch.no_grad():  # every mode from the same weights and the same memory
            for p, p0 in zip(params, start):
                p.copy_(p0)
        optimizer = torch.optim.AdamW(params, lr=cfg.train.lr)
        memory.load_state_dict(frozen)
        rows[mode] = mode_iteration(model, chat, envs, tasks, cfg, mode, memory, optimizer, accelerator, seed=1)
    base = rows["no_memory"]["total"]
    print(f"(f) one iteration per mode, {len(tasks)} episodes, old log-probs recorded while sampling")
    print("    mode            rollout   tips  old-logp  update   total  x no-memory  old-logp tokens (recompute)  "
          "update tokens  samples  tips shown")
    for mode, r in rows.items():
        print(f"    {mode:<15} {r['rollout']:7.1f} {r['tips']:6.1f} {r['old_logp']:9.1f} {r['update']:7.1f} "
              f"{r['total']:7.1f} {r['total'] / base:11.2f}  {r['old_tokens']:>15} ({r['recompute_tokens']:>9})  "
              f"{r['update_tokens']:>13}  {r['samples']:>7}  {r['tips_shown']:>10}")
    return rows


def check_device(name: str) -> torch.device:
    try:
        device = torch.device(name)
    except RuntimeError:
        sys.exit(f"error: --device={name} is not a torch device (cpu, cuda, cuda:1, ...)")
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit(f"error: --device={name}, but torch {torch.__version__} sees no CUDA GPU")
    if device.type not in ("cpu", "cuda"):
        sys.exit(f"error: --device={name}: only cpu and cuda are supported")
    return device


def machine(device) -> str:
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}"
    return f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpus"


if __name__ == "__main__":
    sys.exit(main())
