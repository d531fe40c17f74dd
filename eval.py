"""Evaluation without memory (paper §6: "the trained model without memory at test time").

    python eval.py --config configs/scienceworld_empo2.yaml [--checkpoint=runs/x/checkpoints/iter_000200]
                   [--episodes_per_task=N] [--memory_rounds=K] [--output=DIR] [--section.key=value ...]

Plays every test task (ScienceWorld: the first <= 20 test-split variations of each configured task) with the
base model or a checkpoint, no tips, sampling temperature `train.eval_temperature` (0.4 as in the reference),
and writes `eval.json` (per-task mean return, success rate, episodes) and `eval.md` (a markdown table).
`evaluate()` is also the trainer's periodic validation. Under several processes the test tasks are sharded
over ranks and the results gathered.

`adapt_with_memory` (`--memory_rounds=K`) is the paper's OOD adaptation: the frozen model plays the tasks without
memory, then K more rounds with the tips it wrote in earlier rounds. An OOD run is a checkpoint trained on one task
evaluated on another (`--env.scienceworld.tasks=[other-task]`). The full ID/OOD protocol of paper §6.1 (seeded
cases, several episodes per case) is not built yet.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import torch

from config import Config, ConfigError, config_help, load_config, split_cli
from envs import make_env_pool
from models import load_policy, load_trainable
from memory import TipMemory, make_scorer
from rollout import ChatStream, run_episodes, write_tips
from runtime import LaunchError, check_launch, derive_seed, gather_objects, make_accelerator


def evaluate(model, chat: ChatStream, envs: list, tasks: list, cfg: Config, *, accelerator=None,
             episodes_per_task: int = 1, pool: ThreadPoolExecutor | None = None, progress=None,
             seed: int | None = None) -> dict:
    """No-memory episodes on `tasks`; returns overall and per-task statistics and every episode (same on all ranks).

    Case (task, k) is the k-th episode of a task. seed: case (task, k) samples from its own stream
    derive_seed(seed, task, k), so its episode is the same at any batch size, number of processes or order of
    cases (up to floating-point differences between batch shapes); None: torch's global stream."""
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    cases = [(task, k) for task in tasks for k in range(episodes_per_task)][rank::world]
    results = []
    model.eval()
    for start in range(0, len(cases), len(envs)):
        chunk = cases[start : start + len(envs)]
        seeds = None if seed is None else [derive_seed(seed, task.key, k) for task, k in chunk]
        episodes = run_episodes(model, chat, envs, [task for task, _ in chunk], list(range(len(chunk))),
                                mode="no_memory", memory=None, cfg=cfg.rollout, temperature=cfg.train.eval_temperature,
                                pool=pool, seeds=seeds)
        results += [{"task": ep.task.key, "case": k, "return": ep.extrinsic_return, "success": ep.success,
                     "length": ep.num_actions, "truncated": ep.truncated} for ep, (_, k) in zip(episodes, chunk)]
        if progress is not None:
            progress.update(len(chunk))
    # Sorted by case: the statistics do not depend on which rank played what (floating-point sums included).
    results = sorted((r for part in gather_objects(accelerator, results) for r in part),
                     key=lambda r: (r["task"], r["case"]))
    per_task: dict = defaultdict(list)
    for r in results:
        per_task[r["task"]].append(r)
    returns = [r["return"] for r in results]
    return {
        "return_mean": float(np.mean(returns)) if returns else 0.0,
        "return_std": float(np.std(returns)) if returns else 0.0,
        "success_rate": float(np.mean([r["success"] for r in results])) if results else 0.0,
        "episodes": len(results),
        "per_task": {
            key: {
                "return_mean": float(np.mean([v["return"] for v in vals])),
                "success_rate": float(np.mean([v["success"] for v in vals])),
                "episode_length": float(np.mean([v["length"] for v in vals])),
                "episodes": len(vals),
            }
            for key, vals in sorted(per_task.items())
        },
        "episode_results": results,
    }


def adapt_with_memory(model, chat: ChatStream, envs: list, tasks: list, cfg: Config, rounds: int,
                      pool: ThreadPoolExecutor | None = None) -> list[float]:
    """Adaptation with memory updates and no parameter updates (paper §6.1, OOD): round 0 plays `tasks` without
    memory; after every round the frozen policy writes tips, and round r >= 1 plays with the tips retrieved from
    all earlier rounds. Returns the mean extrinsic return of each round (rounds + 1 values)."""
    memory = TipMemory(cfg.memory.capacity, cfg.memory.top_k, make_scorer(cfg.memory.similarity,
                       cfg.memory.embedding_model), cfg.memory.similarity_threshold)
    model.eval()
    means = []
    for round_index in range(rounds + 1):
        returns = []
        for start in range(0, len(tasks), len(envs)):
            chunk = tasks[start : start + len(envs)]
            episodes = run_episodes(model, chat, envs, chunk, list(range(len(chunk))), memory=memory,
                                    mode="on_policy_tips" if round_index else "no_memory", cfg=cfg.rollout,
                                    temperature=cfg.train.eval_temperature, pool=pool, keep_caches=True)
            write_tips(model, chat, episodes, memory, cfg.rollout)
            returns += [ep.extrinsic_return for ep in episodes]
        memory.sync()  # this round's tips become visible to the next round
        means.append(float(np.mean(returns)) if returns else 0.0)
    return means


def markdown_table(result: dict, title: str) -> str:
    lines = [f"# {title}", "", "| task | episodes | return (mean) | success rate | length |", "|---|---|---|---|---|"]
    for key, row in result["per_task"].items():
        lines.append(f"| {key} | {row['episodes']} | {row['return_mean']:.1f} | {row['success_rate']:.2f} | "
                     f"{row['episode_length']:.1f} |")
    lines.append(f"| **all** | {result['episodes']} | **{result['return_mean']:.1f}** | "
                 f"**{result['success_rate']:.2f}** | |")
    return "\n".join(lines) + "\n"


USAGE = """usage: python eval.py --config FILE [--checkpoint=DIR] [--episodes_per_task=N] [--split=test|train]
                     [--memory_rounds=K] [--output=DIR] [--section.key=value ...]

Every config key, with its default:
"""


def main(argv: list[str] | None = None) -> dict:
    from tqdm.auto import tqdm

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print(USAGE + config_help())
        return {}
    extra = {"checkpoint": "", "episodes_per_task": "", "output": "", "split": "test", "memory_rounds": "0"}
    rest = []
    for arg in argv:
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        if name in extra and "=" in arg:
            extra[name] = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    try:
        cfg = load_config(*split_cli(rest))
        # Evaluation is data parallel (every rank plays its share with the whole model): an FSDP launch is refused
        # rather than ignored; mixed precision and the other supported options apply as in training.
        if check_launch(cfg.model).fsdp:
            raise LaunchError("eval.py runs data parallel, each rank with the whole model: launch it without the "
                              "FSDP config (e.g. configs/accelerate/multi_gpu_8.yaml)")
    except ConfigError as err:
        sys.exit(f"config error: {err}")
    accelerator = make_accelerator()
    torch.manual_seed(derive_seed(cfg.train.seed, "eval", accelerator.process_index))  # sampling: repeatable per seed
    with accelerator.main_process_first():
        model, tokenizer = load_policy(cfg.model, device=accelerator.device)
    if extra["checkpoint"]:
        folder = Path(extra["checkpoint"])
        load_trainable(model, str(folder / "model" if (folder / "model").is_dir() else folder))
    chat = ChatStream(tokenizer)
    size = max(1, cfg.rollout.tasks_per_iteration // accelerator.num_processes) * cfg.rollout.group_size
    envs = make_env_pool(cfg.env, size)
    tasks = envs[0].tasks(extra["split"])
    if cfg.train.eval_tasks > 0:
        tasks = tasks[: cfg.train.eval_tasks]
    per_task = int(extra["episodes_per_task"] or cfg.train.eval_episodes_per_task)
    with ThreadPoolExecutor(max_workers=len(envs)) as pool:
        bar = tqdm(total=len(tasks) * per_task // accelerator.num_processes, desc="eval",
                   disable=not accelerator.is_main_process)
        result = evaluate(model, chat, envs, tasks, cfg, accelerator=accelerator, episodes_per_task=per_task,
                          pool=pool, progress=bar, seed=derive_seed(cfg.train.seed, "evaluation"))
        bar.close()
        if int(extra["memory_rounds"]) > 0:
            if accelerator.num_processes > 1:
                sys.exit("error: --memory_rounds runs in one process (every round's tips come from all episodes)")
            jobs = [task for task in tasks for _ in range(per_task)]
            result["memory_rounds"] = adapt_with_memory(model, chat, envs, jobs, cfg, int(extra["memory_rounds"]),
                                                        pool=pool)
    for env in envs:
        env.close()
    result["model"] = cfg.model.name_or_path
    result["checkpoint"] = extra["checkpoint"]
    result["temperature"] = cfg.train.eval_temperature
    out = Path(extra["output"] or (extra["checkpoint"] or cfg.output_dir))
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval.json").write_text(json.dumps(result, indent=2))
        title = f"Evaluation without memory: {cfg.model.name_or_path} {extra['checkpoint']}".strip()
        (out / "eval.md").write_text(markdown_table(result, title))
        print(markdown_table(result, title))
        if "memory_rounds" in result:
            print("mean return per memory round (0 = no memory):", [round(r, 1) for r in result["memory_rounds"]])
        print(f"wrote {out / 'eval.json'} and {out / 'eval.md'}")
    return result


if __name__ == "__main__":
    main()
