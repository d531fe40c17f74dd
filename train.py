"""EMPO² / GRPO training loop: accelerate + peft LoRA or full fine-tuning (FSDP), 1..8 GPUs (paper Algorithm 1).

    accelerate launch train.py --config configs/scienceworld_empo2.yaml [--section.key=value ...]
    accelerate launch --config_file configs/accelerate/fsdp_8gpu.yaml train.py --config ... --model.lora=false
    python train.py --config configs/quickstart.yaml --output_dir=runs/quick
    torchrun --nproc_per_node 2 train.py --config ...          (multi-process on CPU, gloo)

One iteration (paper Algorithm 1; docs/algorithm.md §7), one line per step in `train()`:
 1. draw the mode (rollout.draw_mode: seeded by seed and iteration, identical on all ranks);
 2. pick B task rows (seeded), shard them over ranks: a rank plays its rows' groups of N episodes;
 3. roll out in lockstep (rollout.run_episodes); an episode an environment crash cut is counted, not learned from;
    the novelty bonus is paid once every rank's visits of the iteration are counted (advantages.pay_novelty);
 4. in memory modes the policy writes a tip per episode (rollout.write_tips);
 5. all ranks apply every rank's new tips in rank order, so the memory stays identical (memory.py);
 6. advantages: GRPO per row-group of N episodes (or GiGPO's per step), + the novelty tie-breaker (advantages.py);
 7. samples (samples.build_samples): the context each mode learns in (Table 3), every action token weighted per step;
 8. old log-probs, once (and the KL reference's with `loss.kl_coef`);
 9. `train.epochs` passes of mini-batches of ~`train.minibatch_steps` environment steps, cut from every rank's
    samples shuffled together: clipped objective (losses.py), every step weighing 1 / minibatch_steps (one
    normaliser for the iteration), gradient all-reduce, clipping, AdamW. A non-finite loss or gradient norm on any
    rank skips that optimiser step on every rank (logged).
Then the metrics row, validation every `train.eval_every` iterations, a checkpoint every `train.save_every`.
The GRPO baseline is this loop with `memory.enabled: false`. `python train.py --help` lists every config key.

Multi-process (docs/scaling.md; infra/runtime.py checks the launch options first): the update is planned over every
rank's samples at once (samples.plan_update: one process's mini-batches, each handed to the ranks by tokens); no DDP
wrapper (ranks' micro-batch counts differ, its hooks would deadlock): gradients are summed with bucketed all-reduces.
FSDP (full fine-tune, configs/accelerate/fsdp_8gpu.yaml): generation, old log-probs, the KL reference's log-probs and
validation each run in one `full_weights` block (whole layers: ranks may run different numbers of forwards); the
update pads ranks to equal micro-batch counts with zero-weight ones.

Outputs in `output_dir`: metrics.jsonl (one line per iteration), tb/ (TensorBoard), metrics.png, config.yaml,
ranks.json, checkpoints/iter_XXXXXX/ and `--resume` (infra/metrics.py, infra/checkpoint.py).
"""
from __future__ import annotations

import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import torch
import yaml

from advantages import counts_novelty, episode_advantages, pay_novelty
from config import Config, ConfigError, config_help, load_config, split_cli, to_dict
from engine.branches import supported as branches_supported
from envs import make_env_pool
from eval import validate
from infra.checkpoint import (CheckpointError, check_resume, find_checkpoint, load_checkpoint, save_checkpoint,
                              write_rank_fingerprints)
from infra.metrics import Clock, MetricsLogger, UpdateStats, log_record, plot_metrics
from infra.models import ModelLoadError
from infra.runtime import (Seeds, all_ranks, all_reduce_gradients, check_launch, derive_seed, full_weights,
                           gather_objects, load_models, make_accelerator, stop_on_signals)
from losses import compute_old_logprobs, compute_reference_logprobs, length_buckets, padded_tokens, samples_loss
from memory import TipMemory
from rollout import ChatStream, check_prompt_budget, draw_mode, pair_up, run_episodes, write_tips
from samples import Sample, build_samples, padding_sample, plan_update


# ----------------------------------------------------------------------------- the update


def update(model, optimizer, samples, cfg: Config, accelerator, mode: str, pad_id: int, rng: random.Random,
           sharded: bool = False) -> dict:
    """`train.epochs` passes over every rank's samples (samples.plan_update, with `rng` the same on every rank: one
    shuffle, mini-batches of ~`train.minibatch_steps` steps, each handed to the ranks by tokens): the clipped
    objective (losses.samples_loss, sum(w * l) / N with ONE N per iteration: a step weighs 1 / minibatch_steps
    wherever it lands), gradient all-reduce, clipping, AdamW; a non-finite loss or gradient skips the step."""
    everyone = [s for part in gather_objects(accelerator, [replace(s, old=[]) for s in samples]) for s in part]
    plan = plan_update(everyone, cfg.train.minibatch_steps, cfg.train.epochs, rng, accelerator.num_processes)
    params = [p for p in model.parameters() if p.requires_grad]
    lowprob = cfg.loss.lowprob_mask if mode in cfg.loss.lowprob_mask_modes else "none"
    stats = UpdateStats(samples)
    model.train()
    for shares in (minibatch for epoch in plan.epochs for minibatch in epoch):  # [rank] -> sample indices
        if not any(everyone[i].units for share in shares for i in share):
            continue  # no weighted sample on any rank: nothing to learn, no step
        optimizer.zero_grad(set_to_none=False)
        finite = True
        for micro in micro_batches(everyone, shares, accelerator.process_index, cfg.train.micro_batch_size, sharded,
                                   stats):  # [] = a zero-weight padding pass
            loss, metrics = samples_loss(model, micro or [padding_sample(pad_id)], pad_id, accelerator.device,
                                         cfg.loss, lowprob, plan.normaliser)
            # Each micro-batch's loss is its share of the mini-batch loss, so ranks SUM gradients; FSDP's
            # reduce-scatter averages, hence x world. A non-finite loss still goes through backward (FSDP's
            # collectives must stay matched); the step is skipped on every rank below.
            (loss * accelerator.num_processes if sharded else loss).backward()
            finite = finite and bool(torch.isfinite(loss))
            stats.micro_batch(micro, loss, metrics)
        if not sharded:
            all_reduce_gradients(params, accelerator)
        grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.train.max_grad_norm)
        grad_norm = grad_norm.full_tensor() if hasattr(grad_norm, "full_tensor") else grad_norm  # FSDP: DTensor
        # A NaN loss does not always reach the gradient (clamp's backward drops it), so the losses are checked too.
        stepped = all_ranks(finite, accelerator) and bool(torch.isfinite(grad_norm))
        if stepped:
            optimizer.step()
        else:
            optimizer.zero_grad(set_to_none=False)  # never let NaN/inf reach the weights
        stats.optimizer_step(stepped, grad_norm.item())
    return stats.result()


def micro_batches(everyone: list[Sample], shares: list[list[int]], rank: int, size: int, sharded: bool,
                  stats) -> list[list[Sample]]:
    """This rank's micro-batches of one mini-batch: its share, similar lengths together (losses.length_buckets).
    Under FSDP, where every forward/backward is a collective, empty ones (zero-weight padding passes) follow, up to
    the number the rank with the most runs."""
    lengths = [[len(everyone[i].ids) for i in share] for share in shares]
    buckets = length_buckets(lengths[rank], size)
    stats.padding(*padded_tokens(lengths[rank], buckets))
    batches = [[everyone[shares[rank][j]] for j in bucket] for bucket in buckets]
    if sharded:
        batches += [[] for _ in range(max(len(length_buckets(n, size)) for n in lengths) - len(batches))]
    return batches


# ----------------------------------------------------------------------------- pieces of one iteration


def iteration_tasks(train_tasks: list, count: int, seed: int) -> list:
    """`count` task rows for one iteration (seed: `Seeds.tasks`): balanced over the task list, shuffled."""
    rng = random.Random(seed)
    rows = []
    while len(rows) < count:
        block = list(train_tasks)
        rng.shuffle(block)
        rows += block
    return rows[:count]


def iteration_rows(train_tasks: list, cfg: Config, seeds: Seeds, world: int) -> tuple[list, list]:
    """(tasks, groups) this rank plays: rows rank, rank + world, ... of the iteration's rows, each `group_size`
    times; an episode's group is its row's index, so a group never spans ranks."""
    rows = iteration_tasks(train_tasks, cfg.rollout.tasks_per_iteration, seeds.tasks)
    groups = [r for r in range(seeds.rank, len(rows), world) for _ in range(cfg.rollout.group_size)]
    return [rows[r] for r in groups], groups


def play(model, chat, envs, memory, cfg: Config, tasks, groups, mode, seeds: Seeds, accelerator, bar, clock
         ) -> tuple:
    """(episodes, played): this rank's episodes (rollout.run_episodes), with their novelty bonus once every rank's
    visits are counted (advantages.pay_novelty), and those learned from. An episode cut by an environment crash has a
    partial return: it is counted in the metrics but not learned from (no tip, no advantage statistics, no sample)."""
    clock.start()
    model.eval()
    plays = pair_up(envs, tasks, groups, seeds.episodes(len(tasks)))
    episodes = run_episodes(model, chat, plays, mode=mode, memory=memory, cfg=cfg.rollout,
                            keep_caches=cfg.memory.enabled, progress=bar)
    if counts_novelty(mode, memory, cfg.intrinsic):  # the same on every rank: one gather of every rank's visits
        pay_novelty(episodes, memory, lambda obj: gather_objects(accelerator, obj))
    clock.lap("time_rollout")
    for ep in episodes:
        if ep.truncated == "env_error":
            ep.kv_cache = None
    return episodes, [ep for ep in episodes if ep.truncated != "env_error"]


def reflect(model, chat, played, memory, cfg: Config, env) -> dict:
    """The policy writes a tip per played episode (rollout.write_tips), staged in memory."""
    if not cfg.memory.enabled:
        return {"tips_written": 0.0, "tips_empty": 0.0}
    return write_tips(model, chat, played, memory, cfg.rollout, env.max_score())


def sync_memory(memory, accelerator, clock) -> None:
    """Every rank applies every rank's new tips in rank order, so the memory stays identical (TipMemory.sync)."""
    if memory is not None:
        memory.sync(lambda obj: gather_objects(accelerator, obj))
    clock.lap("time_tips")


def make_samples(played, advantages, cfg: Config, model) -> list[Sample]:
    """samples.build_samples: the contexts each mode learns in (Table 3), every token's weight; a current-turn
    episode's steps branch-packed into one sequence wherever the attention takes a 4-D mask."""
    return build_samples(played, advantages, off_policy_old_logp=cfg.loss.off_policy_old_logp,
                         branch_packing=branches_supported(model), aggregation=cfg.loss.aggregation)


def old_logprobs(model, reference, samples, pad_id: int, cfg: Config, accelerator) -> dict:
    """Old log-probs once (losses.compute_old_logprobs), with the compute-dtype weights the update's forwards gather,
    and with loss.kl_coef log pi_ref: FSDP reshards the policy first, never holding both models whole."""
    with full_weights(model):
        pad, positions = compute_old_logprobs(model, samples, pad_id, accelerator.device, cfg.train.micro_batch_size)
    if cfg.loss.kl_coef:
        with full_weights(model if reference is None else reference):
            compute_reference_logprobs(model, samples, pad_id, accelerator.device, cfg.train.micro_batch_size,
                                       reference=reference)
    return {"old_logp_padding_frac": pad / max(positions, 1), "old_logp_tokens": float(positions)}


# ----------------------------------------------------------------------------- the loop


def make_envs(cfg: Config, chat: ChatStream, world: int) -> tuple:
    """(one environment per episode this rank plays at once, the training tasks, the validation tasks); stops
    before anything is played when a task's first message leaves no room to play."""
    envs = make_env_pool(cfg.env, cfg.rollout.tasks_per_iteration // world * cfg.rollout.group_size)
    train_tasks = envs[0].tasks("train")
    test_tasks = envs[0].tasks("test")
    if cfg.train.eval_tasks > 0:
        test_tasks = test_tasks[: cfg.train.eval_tasks]
    check_prompt_budget(chat, envs[0], train_tasks + (test_tasks if cfg.train.eval_every else []), cfg.rollout)
    return envs, train_tasks, test_tasks


def train(cfg: Config) -> dict:
    from tqdm.auto import tqdm

    # ---- setup
    launch = check_launch(cfg.model)  # before anything loads: an unsupported launch option stops here
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
    checkpoint = find_checkpoint(out_dir, cfg.resume)
    if checkpoint is not None:  # before anything loads: a resume that cannot continue this run stops here
        check_resume(checkpoint, to_dict(cfg), world)
    random.seed(cfg.train.seed + rank)
    np.random.seed(cfg.train.seed + rank)
    torch.manual_seed(cfg.train.seed)  # same init (LoRA) on every rank

    model, tokenizer, reference = load_models(cfg, launch, accelerator, resuming=checkpoint is not None)
    # Sampling: each rank its own stream (with the init seed, two ranks playing the same task would sample the same
    # episodes). A checkpoint saves every rank's stream, so a resumed run continues it.
    torch.manual_seed(derive_seed(cfg.train.seed, "sampling", rank))
    chat = ChatStream(tokenizer)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.train.lr,
                                  weight_decay=cfg.train.weight_decay)
    memory = TipMemory.from_config(cfg.memory) if cfg.memory.enabled or cfg.intrinsic.coef > 0 else None

    start = 1
    if checkpoint is not None:
        start = load_checkpoint(checkpoint, model, optimizer, memory, accelerator) + 1
        accelerator.print(f"resumed from {checkpoint}; continuing at iteration {start}")
    elif accelerator.is_main_process and (out_dir / "metrics.jsonl").exists():
        (out_dir / "metrics.jsonl").unlink()  # a fresh run starts a fresh log
    if accelerator.is_main_process:  # after the resume check: a refused resume leaves the run's files as they were
        (out_dir / "config.yaml").write_text(yaml.safe_dump(to_dict(cfg), sort_keys=False))  # as the launch set it

    envs, train_tasks, test_tasks = make_envs(cfg, chat, world)
    logger = MetricsLogger(out_dir, cfg, accelerator.is_main_process, start)  # drops rows a resume replays
    stop = stop_on_signals()  # SIGTERM / SIGINT: finish the iteration, checkpoint, exit 0
    clock, last = Clock(), {}

    bar = tqdm(range(start, cfg.train.iterations + 1), disable=not accelerator.is_main_process, desc="train",
               initial=start - 1, total=cfg.train.iterations)
    try:
        for iteration in bar:
            # ---- the iteration (Algorithm 1)
            seeds = Seeds(cfg.train.seed, iteration, rank)  # every seed this iteration draws on this rank
            mode = draw_mode(cfg.memory, cfg.train.seed, iteration)  # 1. the mode, identical on all ranks
            tasks, groups = iteration_rows(train_tasks, cfg, seeds, world)  # 2. task rows, this rank's groups
            with full_weights(model):  # FSDP: whole layers while generating (ranks' lengths differ)
                episodes, played = play(model, chat, envs, memory, cfg, tasks, groups, mode, seeds, accelerator,
                                        bar, clock)  # 3. rollout; `played` leaves out episodes a crash cut
                tip_stats = reflect(model, chat, played, memory, cfg, envs[0])  # 4. tips
            sync_memory(memory, accelerator, clock)  # 5. memory sync
            advantages, credit = episode_advantages(played, cfg.loss, cfg.intrinsic.coef)  # 6. GRPO/GiGPO + novelty
            samples = make_samples(played, advantages, cfg, model)  # 7. samples
            old_stats = old_logprobs(model, reference, samples, chat.pad_id, cfg, accelerator)  # 8. (+ pi_ref's)
            update_metrics = update(model, optimizer, samples, cfg, accelerator, mode, chat.pad_id,
                                    random.Random(seeds.minibatches), sharded=launch.fsdp)  # 9. the update

            # ---- log, validate, checkpoint
            counts = {**tip_stats, "episodes_excluded": float(len(episodes) - len(played)), **credit}
            record = log_record(cfg, accelerator, memory, out_dir, seeds, mode, episodes, counts,
                                {**update_metrics, **old_stats}, clock)
            if cfg.train.eval_every and (iteration % cfg.train.eval_every == 0 or iteration == cfg.train.iterations):
                record.update(validate(model, chat, envs, test_tasks, cfg, accelerator, out_dir, seeds))
            logger.log(record)
            last = record
            bar.set_postfix(mode=mode, ret=f"{record['return_mean']:.1f}", mem=int(record.get("memory_size", 0)))

            preempted = not all_ranks(not stop["requested"], accelerator)  # a signal on any rank stops every rank
            scheduled = cfg.train.save_every and iteration % cfg.train.save_every == 0
            if scheduled or iteration == cfg.train.iterations or preempted:
                folder = save_checkpoint(out_dir, iteration, model, tokenizer, optimizer, memory, accelerator,
                                         cfg.train.keep_checkpoints, to_dict(cfg))
            if preempted:
                accelerator.print(f"stopped by a signal after iteration {iteration}: checkpoint {folder}; "
                                  f"continue with --resume=latest")
                break
    except BaseException:
        logger.close(exit_code=1)  # TensorBoard flushed, the wandb run marked failed; resume from the checkpoint
        raise
    finally:
        stop["restore"]()  # the caller's signal handlers come back whatever happened
    logger.close()
    write_rank_fingerprints(out_dir, model, memory, accelerator)
    if accelerator.is_main_process and (out_dir / "metrics.jsonl").exists():
        plot_metrics(out_dir / "metrics.jsonl", out_dir / "metrics.png")
    for env in envs:
        env.close()
    accelerator.wait_for_everyone()
    return last


USAGE = """usage: python train.py --config FILE [--section.key=value ...] [--resume[=PATH]]
       accelerate launch train.py --config FILE [...]

Every config key, with its default (a config file or --key=value overrides it):
"""


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        try:
            print(USAGE + config_help(), flush=True)
        except BrokenPipeError:  # `train.py --help | head`: the reader left; exit quietly
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at interpreter exit
        return
    try:
        cfg = load_config(*split_cli(argv))
    except ConfigError as err:
        sys.exit(f"config error: {err}")
    try:
        train(cfg)
    except (ConfigError, ModelLoadError, FileNotFoundError, CheckpointError) as err:  # one line, no traceback
        if isinstance(err, ConfigError) and os.environ.get("RANK", "0") != "0":
            # Every rank found the same config problem: rank 0 says it once. Exiting first would let the launcher
            # SIGTERM rank 0 before it prints; waiting, this rank is the one the launcher stops when rank 0 exits.
            time.sleep(60)
            sys.exit(1)
        sys.exit(f"error: {err}")


if __name__ == "__main__":
    main()
