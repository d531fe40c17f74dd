"""Evaluation without memory (paper §6: "the trained model without memory at test time").

    python eval.py --config configs/scienceworld_empo2.yaml [--checkpoint=runs/x/checkpoints/iter_000200]
                   [--episodes_per_task=N] [--cases=FILE] [--write_cases=FILE] [--memory_rounds=K]
                   [--output=DIR] [--section.key=value ...]

Protocol (paper §6.1, reference code): no tips, temperature `train.eval_temperature` (0.4), the test tasks
(ScienceWorld: the first <= 20 test-split variations of each configured task; WebShop: the 500 test goals), each
repeated `--episodes_per_task` times (default 4, as the reference repeats each test row). One episode is a `Case`
(task, repeat, seed) that samples from its own seeded stream (generation.RowSampler), so a case's episode does not
depend on the batch size, the number of processes (cases are sharded over ranks and gathered) or the other cases;
`--write_cases=FILE` writes the list and stops (no model is loaded), `--cases=FILE` replays a saved one (committed
lists: configs/eval/). Output: `eval.json` (every statistic and every
episode) and `eval.md` (paper Table 1 layout for ScienceWorld: return mean ± standard error per task; Table 2 for
WebShop: score and success rate). `evaluate()` is also the trainer's periodic validation (fixed cases, seeded
independently of training).

`adapt_with_memory` (`--memory_rounds=K`) is the paper's OOD adaptation: the frozen model plays the tasks without
memory, then K more rounds with the tips it wrote in earlier rounds. An OOD run is a checkpoint trained on one task
evaluated on another (`--env.scienceworld.tasks=[other-task]`). Not built yet: seeded cases, mean +/- std per
round and the paper's three transfers as ready-made configs for this mode.
"""
from __future__ import annotations

import json
import sys
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from config import Config, ConfigError, config_help, load_config, split_cli
from envs import make_env_pool
from envs.base import Task
from models import load_policy, load_trainable
from memory import TipMemory, make_scorer
from rollout import ChatStream, run_episodes, write_tips
from runtime import LaunchError, check_launch, derive_seed, gather_objects, make_accelerator


EPISODES_PER_CASE = 4  # the reference repeats every test row 4 times


@dataclass(frozen=True)
class Case:
    """One evaluation episode: the k-th repeat of a task, sampled from its own stream (seed None: torch's global
    stream, for callers that seed it themselves)."""

    task: Task
    repeat: int
    seed: int | None


def make_cases(tasks: list[Task], repeats: int, seed: int | None) -> list[Case]:
    """`repeats` cases per task; case (task, k) samples from derive_seed(seed, task, k)."""
    return [Case(t, k, None if seed is None else derive_seed(seed, t.key, k)) for t in tasks for k in range(repeats)]


def write_cases(path: Path, cases: list[Case]) -> None:
    """One JSON line per case: the committed, explicit list a benchmark is evaluated on."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps({"task": c.task.name, "variation": c.task.variation, "repeat": c.repeat,
                                        "seed": c.seed}) + "\n" for c in cases))


def read_cases(path: Path) -> list[Case]:
    cases = []
    for number, line in enumerate(Path(path).read_text().splitlines(), 1):
        if line.strip():
            try:
                row = json.loads(line)
                cases.append(Case(Task(row["task"], int(row["variation"])), int(row["repeat"]), int(row["seed"])))
            except (ValueError, KeyError, TypeError) as err:
                raise ConfigError(f"{path}:{number}: not a case line ({err}): {line[:80]}") from err
    if len({(c.task, c.repeat) for c in cases}) != len(cases):
        raise ConfigError(f"{path}: the same (task, variation, repeat) appears twice")
    return cases


def evaluate(model, chat: ChatStream, envs: list, tasks: list, cfg: Config, *, accelerator=None,
             episodes_per_task: int = 1, pool: ThreadPoolExecutor | None = None, progress=None,
             seed: int | None = None, cases: list[Case] | None = None) -> dict:
    """No-memory episodes; returns overall and per-task statistics and every episode (the same on all ranks).

    cases: what to play (default: `make_cases(tasks, episodes_per_task, seed)`). A case with a seed samples from its
    own stream, so its episode is the same at any batch size, number of processes or order of cases (up to
    floating-point differences between batch shapes; tests/test_eval.py); results are sorted by case before any
    statistic is computed."""
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    cases = (cases if cases is not None else make_cases(tasks, episodes_per_task, seed))[rank::world]
    results = []
    model.eval()
    for start in range(0, len(cases), len(envs)):
        chunk = cases[start : start + len(envs)]
        seeds = None if any(c.seed is None for c in chunk) else [c.seed for c in chunk]
        episodes = run_episodes(model, chat, envs, [c.task for c in chunk], list(range(len(chunk))),
                                mode="no_memory", memory=None, cfg=cfg.rollout, temperature=cfg.train.eval_temperature,
                                pool=pool, seeds=seeds)
        results += [{"task": ep.task.key, "repeat": c.repeat, "seed": c.seed, "return": ep.extrinsic_return,
                     "success": ep.success, "length": ep.num_actions, "truncated": ep.truncated,
                     "actions": ep.actions} for ep, c in zip(episodes, chunk)]
        if progress is not None:
            progress.update(len(chunk))
    # Sorted by case: the statistics do not depend on which rank played what (floating-point sums included).
    results = sorted((r for part in gather_objects(accelerator, results) for r in part),
                     key=lambda r: (r["task"].rsplit("/", 1)[0], int(r["task"].rsplit("/", 1)[1]), r["repeat"]))
    per_task: dict = defaultdict(list)
    for r in results:
        per_task[r["task"].rsplit("/", 1)[0]].append(r)  # a task = all its variations (paper Table 1 rows)
    return {**summary(results), "per_task": {name: summary(rows) for name, rows in sorted(per_task.items())},
            "episode_results": results}


def standard_error(values: list[float]) -> float:
    return float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0


def summary(rows: list[dict]) -> dict:
    """Mean, standard deviation and standard error of the return, success rate, length, truncation rate."""
    returns = [r["return"] for r in rows]
    successes = [float(r["success"]) for r in rows]
    return {
        "return_mean": float(np.mean(returns)) if rows else 0.0,
        "return_std": float(np.std(returns)) if rows else 0.0,
        "return_se": standard_error(returns),
        "success_rate": float(np.mean(successes)) if rows else 0.0,
        "success_se": standard_error(successes),
        "episode_length": float(np.mean([r["length"] for r in rows])) if rows else 0.0,
        "truncation_rate": float(np.mean([bool(r["truncated"]) for r in rows])) if rows else 0.0,
        "episodes": len(rows),
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


def markdown_table(result: dict, title: str, env_name: str = "scienceworld") -> str:
    """ScienceWorld: one row per task, return mean +/- standard error (paper Table 1). WebShop: score and success
    rate (%) over all goals (paper Table 2)."""
    if env_name == "webshop":
        lines = [f"# {title}", "", f"| | ours ({result['episodes']} episodes) |", "|---|---|",
                 f"| Score | {result['return_mean']:.1f} ± {result['return_se']:.1f} |",
                 f"| Succ. (%) | {100 * result['success_rate']:.1f} ± {100 * result['success_se']:.1f} |"]
        return "\n".join(lines) + "\n"
    lines = [f"# {title}", "", "| task | episodes | return (mean ± s.e.) | success rate | length | truncated |",
             "|---|---|---|---|---|---|"]
    for key, row in result["per_task"].items():
        lines.append(f"| {key} | {row['episodes']} | {row['return_mean']:.1f} ± {row['return_se']:.1f} | "
                     f"{row['success_rate']:.2f} | {row['episode_length']:.1f} | {row['truncation_rate']:.2f} |")
    task_means = [row["return_mean"] for row in result["per_task"].values()]
    lines.append(f"| **Average** (of task means) | {result['episodes']} | **{np.mean(task_means):.1f}** | "
                 f"**{result['success_rate']:.2f}** | | |")
    return "\n".join(lines) + "\n"


def planned_tasks(env, cfg: Config, split: str) -> list[Task]:
    """The tasks of `split` (the first train.eval_tasks of them when > 0)."""
    tasks = env.tasks(split)
    return tasks[: cfg.train.eval_tasks] if cfg.train.eval_tasks > 0 else tasks


USAGE = """usage: python eval.py --config FILE [--checkpoint=DIR] [--episodes_per_task=N] [--split=test|train]
                     [--cases=FILE] [--write_cases=FILE] [--memory_rounds=K] [--output=DIR] [--section.key=value ...]

Every config key, with its default:
"""


def main(argv: list[str] | None = None) -> dict:
    from tqdm.auto import tqdm

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print(USAGE + config_help())
        return {}
    extra = {"checkpoint": "", "episodes_per_task": "", "output": "", "split": "test", "memory_rounds": "0",
             "cases": "", "write_cases": ""}
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
    per_task = int(extra["episodes_per_task"] or EPISODES_PER_CASE)
    if extra["write_cases"]:  # the case list only: no model, one environment
        (env,) = make_env_pool(cfg.env, 1)
        cases = make_cases(planned_tasks(env, cfg, extra["split"]), per_task, derive_seed(cfg.train.seed, "evaluation"))
        env.close()
        write_cases(Path(extra["write_cases"]), cases)
        print(f"wrote {len(cases)} cases to {extra['write_cases']}")
        return {"cases": len(cases)}
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
    tasks = planned_tasks(envs[0], cfg, extra["split"])
    cases = make_cases(tasks, per_task, derive_seed(cfg.train.seed, "evaluation"))
    if extra["cases"]:
        cases = read_cases(Path(extra["cases"]))
    with ThreadPoolExecutor(max_workers=len(envs)) as pool:
        bar = tqdm(total=-(-len(cases) // accelerator.num_processes), desc="eval",
                   disable=not accelerator.is_main_process)
        result = evaluate(model, chat, envs, tasks, cfg, accelerator=accelerator, pool=pool, progress=bar,
                          cases=cases)
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
        (out / "eval.md").write_text(markdown_table(result, title, cfg.env.name))
        print(markdown_table(result, title, cfg.env.name))
        if "memory_rounds" in result:
            print("mean return per memory round (0 = no memory):", [round(r, 1) for r in result["memory_rounds"]])
        print(f"wrote {out / 'eval.json'} and {out / 'eval.md'}")
    return result


if __name__ == "__main__":
    main()
