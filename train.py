"""EMPO² / GRPO training loop: accelerate + peft LoRA, 1..8 processes (paper Algorithm 1).

    accelerate launch train.py --config configs/scienceworld_empo2.yaml [--section.key=value ...]
    python train.py --config configs/quickstart.yaml --output_dir=runs/quick
    torchrun --nproc_per_node 2 train.py --config ...          (multi-process on CPU, gloo)

One iteration (empo2.md §2.2, §3.5):
 1. draw the mode once (identical on all ranks: seeded by seed and iteration);
 2. pick B task rows (seeded), shard them over ranks, roll out N episodes per row in lockstep (rollout.py);
 3. the policy writes a tip per episode; all ranks exchange the new tips so memory stays identical (memory.py);
 4. GRPO advantages per row-group of N episodes (returns include the novelty bonus), samples (one per episode with
    full history, one per step with a history window), old log-probs computed once;
 5. `train.epochs` passes of shuffled mini-batches: clipped objective (losses.py), gradient all-reduce, clipping,
    AdamW. A non-finite loss or gradient norm on any rank skips that optimiser step on every rank (logged).
The GRPO baseline is this loop with `memory.enabled: false`.

Multi-process design: the model is NOT wrapped in DDP. Ranks can hold different numbers of samples (episodes
truncate differently, window mode has one sample per step), so micro-batch counts differ between ranks and DDP's
per-backward hooks would deadlock; instead each rank accumulates its mini-batch gradient and the trainable
gradients are averaged with one `accelerator.reduce` per optimiser step, weighted by the ranks' sample counts.
For LoRA this is a few MB per step. Generation also runs on the plain module this way.

Outputs in `output_dir`: metrics.jsonl (one line per iteration), tb/ (TensorBoard), metrics.png, config.yaml,
checkpoints/iter_XXXXXX/ (adapter or weights, optimizer, memory, RNG states, iteration) and `--resume`.
"""
from __future__ import annotations

import json
import math
import os
import random
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch
import yaml

from config import Config, ConfigError, load_config, split_cli, to_dict
from envs import make_env
from losses import action_logprobs, clipped_policy_loss, group_advantages
from memory import TipMemory
from models import ModelLoadError, load_policy, load_trainable, save_model
from rollout import ChatStream, build_samples, draw_mode, episode_return, run_episodes, write_tips


# ----------------------------------------------------------------------------- forward passes


def forward_action_logprobs(model, seqs: list[list[int]], masks: list[list[int]], pad_id: int, device,
                            with_entropy: bool = False):
    """Log-probs of the action tokens of each sequence in ONE forward pass (right padding).

    Only positions that predict an action token go through the LM head (`logits_to_keep`), so a 4k-token
    episode with 30 x 32 action tokens costs a [B, ~1k, V] logit tensor, not [B, 4k, V].
    Returns (list of [n_actions_i] log-prob tensors, list of entropy tensors or None).
    """
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    action = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, (seq, mask) in enumerate(zip(seqs, masks)):
        ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
        action[row, : len(mask)] = torch.tensor(mask, dtype=torch.bool)
    # position t predicts token t+1
    positions = torch.nonzero(action[:, 1:].any(0)).squeeze(-1)
    ids, attention = ids.to(device), attention.to(device)
    logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=positions.to(device),
                   use_cache=False).logits
    targets = ids[:, positions + 1]
    logp, entropy = action_logprobs(logits, targets)
    valid = action[:, positions + 1].to(device)
    return [logp[r][valid[r]] for r in range(len(seqs))], [entropy[r][valid[r]] for r in range(len(seqs))]


def pad_rows(rows: list[torch.Tensor], device) -> torch.Tensor:
    return torch.nn.utils.rnn.pad_sequence([r.to(device) for r in rows], batch_first=True)


@torch.no_grad()
def compute_old_logprobs(model, samples, pad_id: int, device, micro_batch_size: int) -> None:
    model.eval()
    for start in range(0, len(samples), micro_batch_size):
        micro = samples[start : start + micro_batch_size]
        logps, _ = forward_action_logprobs(model, [s.old_ids for s in micro], [s.old_mask for s in micro], pad_id,
                                           device)
        for sample, logp in zip(micro, logps):
            sample.old_logp = logp.float().cpu().tolist()


def micro_batch_loss(model, micro, pad_id, device, cfg: Config, lowprob_mask: str):
    """Loss (mean over the micro-batch's samples) and metrics for a list of Samples."""
    logps, entropies = forward_action_logprobs(model, [s.ids for s in micro], [s.mask for s in micro], pad_id, device)
    logp = pad_rows(logps, device)
    old = pad_rows([torch.tensor(s.old_logp) for s in micro], device)
    adv = pad_rows([torch.tensor(s.advantages) for s in micro], device)
    mask = pad_rows([torch.ones(len(s.advantages)) for s in micro], device)
    return clipped_policy_loss(
        logp, old, adv, mask, clip_low=cfg.loss.clip_low, clip_high=cfg.loss.clip_high,
        dual_clip=cfg.loss.dual_clip, lowprob_mask=lowprob_mask,
        lowprob_logp_threshold=cfg.loss.lowprob_logp_threshold, entropy=pad_rows(entropies, device).detach(),
    )


# ----------------------------------------------------------------------------- the update


def update(model, optimizer, samples, cfg: Config, accelerator, mode: str, pad_id: int, rng: random.Random) -> dict:
    """`train.epochs` passes of `train.minibatches` optimiser steps over this rank's samples."""
    params = [p for p in model.parameters() if p.requires_grad]
    lowprob = cfg.loss.lowprob_mask if mode in cfg.loss.lowprob_mask_modes else "none"
    sums: dict[str, float] = {}
    weight, ratio_max, steps, skipped, grad_norms = 0.0, 0.0, 0, 0, []
    model.train()
    for _ in range(cfg.train.epochs):
        order = list(range(len(samples)))
        rng.shuffle(order)
        for chunk in np.array_split(np.array(order, dtype=int), cfg.train.minibatches):
            chunk = [samples[i] for i in chunk]
            optimizer.zero_grad(set_to_none=False)
            finite = True
            for start in range(0, len(chunk), cfg.train.micro_batch_size):
                micro = chunk[start : start + cfg.train.micro_batch_size]
                loss, metrics = micro_batch_loss(model, micro, pad_id, accelerator.device, cfg, lowprob)
                if not torch.isfinite(loss):
                    finite = False
                    break
                (loss * len(micro) / len(chunk)).backward()
                for key, value in metrics.items():
                    sums[key] = sums.get(key, 0.0) + value * len(micro)
                sums["loss"] = sums.get("loss", 0.0) + loss.item() * len(micro)
                ratio_max = max(ratio_max, metrics["ratio_max"])
                weight += len(micro)
            finite, global_count = all_reduce_gradients(params, len(chunk), finite, accelerator)
            if global_count == 0:  # no rank had a sample for this mini-batch: nothing to learn, no step
                continue
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.train.max_grad_norm) if finite else None
            if not finite or not torch.isfinite(grad_norm):
                optimizer.zero_grad(set_to_none=False)  # never let NaN/inf reach the weights
                skipped += 1
                continue
            optimizer.step()
            steps += 1
            grad_norms.append(grad_norm.item())
    out = {key: value / max(weight, 1.0) for key, value in sums.items()}
    out.update(ratio_max=ratio_max, optimizer_steps=float(steps), skipped_updates=float(skipped),
               grad_norm=float(np.mean(grad_norms)) if grad_norms else 0.0, samples=float(len(samples)),
               action_tokens=sums.get("action_tokens", 0.0))
    return out


def all_reduce_gradients(params, n_local: int, finite: bool, accelerator) -> tuple[bool, int]:
    """Sample-weighted mean of the gradients over ranks.

    Returns (every rank's loss was finite, total number of samples in this mini-batch over all ranks)."""
    for p in params:  # a rank without samples has no gradient yet; it still takes part in the reduce
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if accelerator.num_processes == 1:
        return finite, n_local
    flat = torch.cat([p.grad.reshape(-1).float() for p in params]) * n_local
    header = torch.tensor([float(n_local), 0.0 if finite else 1.0], device=flat.device)
    total = accelerator.reduce(torch.cat([header, flat]), reduction="sum")
    count, bad = int(total[0].item()), total[1].item()
    if bad > 0 or count == 0:
        return bad == 0, count
    flat = total[2:] / count
    offset = 0
    for p in params:
        n = p.grad.numel()
        p.grad.copy_(flat[offset : offset + n].view_as(p.grad).to(p.grad.dtype))
        offset += n
    return True, count


# ----------------------------------------------------------------------------- helpers


def iteration_tasks(train_tasks: list, count: int, seed: int, iteration: int) -> list:
    """`count` task rows for this iteration: balanced over the task list, shuffled, the same on all ranks."""
    rng = random.Random(seed * 7_919 + iteration)
    rows = []
    while len(rows) < count:
        block = list(train_tasks)
        rng.shuffle(block)
        rows += block
    return rows[:count]


def gather_objects(accelerator, obj) -> list:
    if accelerator.num_processes == 1:
        return [obj]
    import torch.distributed as dist

    out = [None] * accelerator.num_processes
    dist.all_gather_object(out, obj)
    return out


def episode_metrics(episodes, memory: TipMemory | None) -> dict:
    returns = [ep.ret for ep in episodes]
    n = max(len(episodes), 1)
    out = {
        "return_mean": float(np.mean(returns)) if returns else 0.0,
        "return_std": float(np.std(returns)) if returns else 0.0,
        "success_rate": sum(ep.success for ep in episodes) / n,
        "episode_length": float(np.mean([ep.num_actions for ep in episodes])) if episodes else 0.0,
        "truncation_rate": sum(bool(ep.truncated) for ep in episodes) / n,
        "episodes": float(len(episodes)),
    }
    for reason in ("steps", "context", "env_error"):
        out[f"truncated_{reason}"] = sum(ep.truncated == reason for ep in episodes) / n
    steps = [k for ep in episodes for k in ep.tips_retrieved]
    out["tips_retrieved"] = float(np.mean(steps)) if steps else 0.0
    bonus = [b for ep in episodes for b in ep.intrinsic]
    out["intrinsic_mean"] = float(np.mean(bonus)) if bonus else 0.0
    if memory is not None:
        out["memory_size"] = float(memory.size())
    return out


class EpisodeView:
    """The fields episode_metrics needs, picklable, for gathering across ranks."""

    def __init__(self, ep):
        self.ret, self.success, self.num_actions, self.truncated = ep.ret, ep.success, ep.num_actions, ep.truncated
        self.tips_retrieved, self.intrinsic = list(ep.tips_retrieved), list(ep.intrinsic)


def write_rank_fingerprints(out_dir: Path, model, memory, accelerator) -> None:
    """ranks.json: a hash of every rank's trainable weights and memory. They must all be equal; a mismatch
    means the ranks drifted apart (e.g. a skipped gradient reduce)."""
    import hashlib

    weights = hashlib.sha256()
    for name, param in sorted((n, p) for n, p in model.named_parameters() if p.requires_grad):
        weights.update(name.encode())
        weights.update(param.detach().float().cpu().numpy().tobytes())
    mem = hashlib.sha256(json.dumps(memory.state_dict() if memory else {}, sort_keys=True).encode())
    everyone = gather_objects(accelerator, (weights.hexdigest(), mem.hexdigest()))
    if accelerator.is_main_process:
        (out_dir / "ranks.json").write_text(json.dumps({
            "world_size": accelerator.num_processes, "weights_sha256": [w for w, _ in everyone],
            "memory_sha256": [m for _, m in everyone]}, indent=1))


# ----------------------------------------------------------------------------- checkpoints


def save_checkpoint(out_dir: Path, iteration: int, model, tokenizer, optimizer, memory, accelerator, keep: int):
    folder = out_dir / "checkpoints" / f"iter_{iteration:06d}"
    tmp = out_dir / "checkpoints" / f".tmp_iter_{iteration:06d}"
    if accelerator.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_model(model, tokenizer, str(tmp / "model"))
        torch.save(optimizer.state_dict(), tmp / "optimizer.pt")
        if memory is not None:
            memory.save(str(tmp / "memory.json"))
        (tmp / "state.json").write_text(json.dumps({"iteration": iteration, "world_size": accelerator.num_processes}))
    accelerator.wait_for_everyone()
    rng_state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        rng_state["cuda"] = torch.cuda.get_rng_state_all()
    torch.save(rng_state, tmp / f"rng_rank{accelerator.process_index}.pt")
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)  # a checkpoint folder is complete or absent
        old = sorted((out_dir / "checkpoints").glob("iter_*"))
        for stale in old[: max(0, len(old) - keep)]:
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    return folder


def find_checkpoint(out_dir: Path, resume: str) -> Path | None:
    if not resume:
        return None
    if resume == "latest":
        found = sorted((out_dir / "checkpoints").glob("iter_*"))
        if not found:
            raise FileNotFoundError(f"--resume=latest: no checkpoint in {out_dir / 'checkpoints'}")
        return found[-1]
    path = Path(resume)
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"--resume={resume}: not a checkpoint folder (no state.json)")
    return path


def load_checkpoint(folder: Path, model, optimizer, memory, accelerator) -> int:
    load_trainable(model, str(folder / "model"))
    optimizer.load_state_dict(torch.load(folder / "optimizer.pt", map_location=accelerator.device))
    if memory is not None and (folder / "memory.json").is_file():
        memory.load(str(folder / "memory.json"))
    rng_file = folder / f"rng_rank{accelerator.process_index}.pt"
    if rng_file.is_file():
        state = torch.load(rng_file, weights_only=False)
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
    return json.loads((folder / "state.json").read_text())["iteration"]


# ----------------------------------------------------------------------------- logging


class MetricsLogger:
    """metrics.jsonl + TensorBoard (+ optional wandb) on the main process."""

    def __init__(self, out_dir: Path, cfg: Config, enabled: bool):
        self.enabled, self.path, self.tb, self.wandb = enabled, out_dir / "metrics.jsonl", None, None
        if not enabled:
            return
        if cfg.train.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(out_dir / "tb"))
        if cfg.train.wandb_project:
            import wandb  # optional dependency

            self.wandb = wandb.init(project=cfg.train.wandb_project, config=to_dict(cfg), dir=str(out_dir))

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        step = record["iteration"]
        for key, value in record.items():
            if isinstance(value, (int, float)) and key != "iteration" and math.isfinite(value):
                if self.tb:
                    self.tb.add_scalar(key, value, step)
        if self.tb and "mode" in record:
            self.tb.add_scalar(f"by_mode/{record['mode']}/return_mean", record.get("return_mean", 0.0), step)
            self.tb.flush()
        if self.wandb:
            self.wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=step)

    def close(self):
        if self.tb:
            self.tb.close()


def plot_metrics(metrics_path: Path, png_path: Path) -> None:
    """Return per iteration (coloured by mode) and validation return, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    if not rows:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    colours = {"no_memory": "tab:blue", "on_policy_tips": "tab:green", "off_policy": "tab:orange"}
    for mode, colour in colours.items():
        pts = [(r["iteration"], r["return_mean"]) for r in rows if r.get("mode") == mode]
        if pts:
            axes[0].scatter(*zip(*pts), s=12, c=colour, label=mode)
    axes[0].plot([r["iteration"] for r in rows], [r["return_mean"] for r in rows], c="grey", lw=0.6)
    val = [(r["iteration"], r["val_return_mean"]) for r in rows if "val_return_mean" in r]
    if val:
        axes[0].plot(*zip(*val), "k-o", ms=3, label="validation (no memory)")
    axes[0].set(xlabel="iteration", ylabel="return", title="training return")
    axes[0].legend(fontsize=7)
    for key in ("clip_frac", "masked_frac", "approx_kl"):
        axes[1].plot([r["iteration"] for r in rows], [r.get(key, 0.0) for r in rows], label=key)
    axes[1].set(xlabel="iteration", title="update statistics")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(png_path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def make_accelerator():
    from accelerate import Accelerator

    # Under torchrun on a machine without a GPU, a plain Accelerator() silently gives independent single-process
    # runs; cpu=True gives a real gloo process group (environment-facts.md §4).
    return Accelerator(cpu=not torch.cuda.is_available())


def make_env_pool(cfg: Config, size: int) -> list:
    with ThreadPoolExecutor(max_workers=min(size, 8)) as pool:
        return list(pool.map(lambda _: make_env(cfg.env), range(size)))


def train(cfg: Config) -> dict:
    from tqdm.auto import tqdm

    from eval import evaluate

    accelerator = make_accelerator()
    rank, world = accelerator.process_index, accelerator.num_processes
    if cfg.rollout.tasks_per_iteration % world:
        raise ConfigError(f"rollout.tasks_per_iteration={cfg.rollout.tasks_per_iteration} must be a multiple of "
                          f"the number of processes ({world})")
    if cfg.train.torch_threads > 0:
        torch.set_num_threads(cfg.train.torch_threads)
    out_dir = Path(cfg.output_dir)
    if accelerator.is_main_process:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))
    random.seed(cfg.train.seed + rank)
    np.random.seed(cfg.train.seed + rank)
    torch.manual_seed(cfg.train.seed)  # same init (LoRA) on every rank

    with accelerator.main_process_first():  # rank 0 converts/downloads the model once
        model, tokenizer = load_policy(cfg.model, device=accelerator.device)
    chat = ChatStream(tokenizer)
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=cfg.train.lr, weight_decay=cfg.train.weight_decay)
    memory = (TipMemory(cfg.memory.capacity, cfg.memory.top_k, cfg.memory.similarity, cfg.memory.similarity_threshold)
              if cfg.memory.enabled or cfg.intrinsic.coef > 0 else None)

    start = 1
    checkpoint = find_checkpoint(out_dir, cfg.resume)
    if checkpoint is not None:
        start = load_checkpoint(checkpoint, model, optimizer, memory, accelerator) + 1
        accelerator.print(f"resumed from {checkpoint}; continuing at iteration {start}")
    elif accelerator.is_main_process and (out_dir / "metrics.jsonl").exists():
        (out_dir / "metrics.jsonl").unlink()  # a fresh run starts a fresh log

    rows_per_rank = cfg.rollout.tasks_per_iteration // world
    pool_size = rows_per_rank * cfg.rollout.group_size
    envs = make_env_pool(cfg, pool_size)
    threads = ThreadPoolExecutor(max_workers=pool_size)
    train_tasks = envs[0].tasks("train")
    test_tasks = envs[0].tasks("test")
    if cfg.train.eval_tasks > 0:
        test_tasks = test_tasks[: cfg.train.eval_tasks]
    logger = MetricsLogger(out_dir, cfg, accelerator.is_main_process)
    update_rng = random.Random(cfg.train.seed * 31 + rank)
    last: dict = {}

    bar = tqdm(range(start, cfg.train.iterations + 1), disable=not accelerator.is_main_process, desc="train",
               initial=start - 1, total=cfg.train.iterations)
    for iteration in bar:
        update_rng.seed(cfg.train.seed * 1_000_003 + iteration * 31 + rank)  # resume-exact shuffling
        mode = draw_mode(cfg.memory.p_no_memory, cfg.memory.p_memory_on_policy, cfg.train.seed, iteration,
                         enabled=cfg.memory.enabled)
        rows = iteration_tasks(train_tasks, cfg.rollout.tasks_per_iteration, cfg.train.seed, iteration)
        my_rows = list(range(rank, len(rows), world))
        tasks = [rows[r] for r in my_rows for _ in range(cfg.rollout.group_size)]
        groups = [r for r in my_rows for _ in range(cfg.rollout.group_size)]

        t0 = time.perf_counter()
        model.eval()
        episodes = run_episodes(
            model, chat, envs, tasks, groups, mode=mode, memory=memory, max_action_tokens=cfg.rollout.max_action_tokens,
            max_prompt_tokens=cfg.rollout.max_prompt_tokens, temperature=cfg.rollout.temperature,
            top_p=cfg.rollout.top_p, history_window=cfg.env.history_window, intrinsic_coef=cfg.intrinsic.coef,
            intrinsic_memory_modes_only=cfg.intrinsic.memory_modes_only,
            generation_batch_size=cfg.rollout.generation_batch_size, pool=threads, progress=bar,
        )
        t1 = time.perf_counter()
        tip_stats = {"tips_written": 0.0, "tips_empty": 0.0}
        if cfg.memory.enabled:
            tip_stats = write_tips(model, chat, episodes, memory, max_new_tokens=cfg.rollout.tip_max_tokens,
                                   temperature=cfg.rollout.tip_temperature,
                                   generation_batch_size=cfg.rollout.generation_batch_size)
        if memory is not None:
            memory.sync(lambda obj: gather_objects(accelerator, obj), rank)
        t2 = time.perf_counter()

        # Groups never straddle ranks (a row's N episodes run on one rank), so advantages are local.
        returns = [episode_return(ep, cfg.intrinsic.coef) for ep in episodes]
        advantages = group_advantages(returns, [ep.group for ep in episodes], cfg.loss.advantage_eps)
        samples = build_samples(episodes, advantages, off_policy_old_logp=cfg.loss.off_policy_old_logp)
        compute_old_logprobs(model, samples, chat.pad_id, accelerator.device, cfg.train.micro_batch_size)
        update_metrics = update(model, optimizer, samples, cfg, accelerator, mode, chat.pad_id, update_rng)
        t3 = time.perf_counter()

        # One exchange per iteration: every rank's episodes, update statistics and tip counts.
        parts = gather_objects(accelerator, ([EpisodeView(ep) for ep in episodes], update_metrics, tip_stats))
        record = {"iteration": iteration, "mode": mode,
                  **episode_metrics([v for views, _, _ in parts for v in views], memory)}
        for key in update_metrics:
            values = [stats[key] for _, stats, _ in parts]
            if key in ("samples", "action_tokens"):  # per-rank counts
                record[key] = float(sum(values))
            elif key in ("ratio_max", "optimizer_steps", "skipped_updates"):  # steps are global: equal on all ranks
                record[key] = float(max(values))
            else:
                record[key] = float(np.mean(values))
        record.update({k: sum(tips[k] for _, _, tips in parts) for k in tip_stats})
        record.update(time_rollout=t1 - t0, time_tips=t2 - t1, time_update=t3 - t2)

        if cfg.train.eval_every and (iteration % cfg.train.eval_every == 0 or iteration == cfg.train.iterations):
            t4 = time.perf_counter()
            val = evaluate(model, chat, envs, test_tasks, cfg, accelerator=accelerator, pool=threads)
            record.update(val_return_mean=val["return_mean"], val_success_rate=val["success_rate"],
                          time_eval=time.perf_counter() - t4)
        logger.log(record)
        last = record
        bar.set_postfix(mode=mode, ret=f"{record['return_mean']:.1f}", mem=int(record.get("memory_size", 0)))

        if (cfg.train.save_every and iteration % cfg.train.save_every == 0) or iteration == cfg.train.iterations:
            save_checkpoint(out_dir, iteration, model, tokenizer, optimizer, memory, accelerator,
                            cfg.train.keep_checkpoints)

    logger.close()
    write_rank_fingerprints(out_dir, model, memory, accelerator)
    if accelerator.is_main_process and (out_dir / "metrics.jsonl").exists():
        plot_metrics(out_dir / "metrics.jsonl", out_dir / "metrics.png")
    for env in envs:
        env.close()
    threads.shutdown()
    accelerator.wait_for_everyone()
    return last


def main(argv: list[str] | None = None) -> None:
    try:
        cfg = load_config(*split_cli(sys.argv[1:] if argv is None else argv))
    except ConfigError as err:
        sys.exit(f"config error: {err}")
    try:
        train(cfg)
    except (ConfigError, ModelLoadError, FileNotFoundError) as err:  # bad input: one clear line, no traceback
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
