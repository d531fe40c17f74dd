"""Evaluation without memory, and adaptation with memory (paper §6: "the trained model without memory at test time";
§6.1 "Adaptation in New Tasks with Memory Updates", Fig. 8).

    python eval.py --config configs/scienceworld_empo2.yaml [--checkpoint=runs/x/checkpoints/iter_000200]
                   [--episodes_per_task=N] [--cases=FILE] [--write_cases=FILE] [--ood[=K]] [--output=DIR]
                   [--section.key=value ...]

Protocol (paper §6.1, reference code): no tips, temperature `train.eval_temperature` (0.4), the test tasks
(ScienceWorld: the first <= 20 test-split variations of each configured task; WebShop: the 500 test goals), each
repeated `--episodes_per_task` times (ScienceWorld: 4 by default, as the reference repeats each test row; WebShop:
1, Table 2's one episode per goal). One episode is a `Case` (task, repeat, seed) that samples from its own seeded
stream (engine.generation.RowSampler), so a case's episode does not depend on the batch size, the number of processes
(cases are sharded over ranks and gathered) or the other cases; `--write_cases=FILE` writes the list and stops (no
model is loaded), `--cases=FILE` replays a saved one (committed lists: configs/eval/; only the cases of the
configured tasks are played). Output, in --output (default OUTPUT_DIR/eval_<run>_<checkpoint>, never a checkpoint
folder): `eval.json` (every statistic and every episode), `eval.md` (paper Table 1 layout for ScienceWorld: return
mean ± standard error per task, the s.e. over variations; Table 2 for WebShop: the purchase score and success rate)
and a seeded sample of `train.log_episodes` episodes, turn by turn, in `episodes/` (tools/viewer.py). `evaluate()` is also
the trainer's periodic validation (fixed cases, seeded independently of training).

`--ood=K` (`adapt_with_memory`): the frozen model replays the same cases K more steps, each with the tips it wrote
after the earlier steps (no parameter updates); step 0 is the evaluation itself. Output: mean ± std per step, the
best step and its gain over step 0, as the paper reports, and the final memory (`memory.json`). Trained on task A
and run on task B it is the paper's OOD transfer (configs/ood/); on the base model it is the Reflexion-style
baseline (tips from earlier trials in the prompt, no updates); on the base model without `--ood`, the Naive one.
"""
from __future__ import annotations

import json
import sys
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np
import torch

from infra.checkpoint import generation_settings
from config import Config, ConfigError, config_help, load_config, split_cli, split_options, to_dict
from envs import make_env_pool
from envs.base import Task
from infra.models import load_policy, load_trainable
from memory import TipEntry, TipMemory, tip_entries
from infra.metrics import episode_record, sample_for_log, write_episodes
from rollout import ChatStream, pair_up, run_episodes, write_tips
from infra.runtime import (LaunchError, Seeds, check_launch, derive_seed, full_weights, gather_objects,
                           make_accelerator, rng_devices)


# Repeats per test item: the ScienceWorld reference repeats every test row 4 times; WebShop's Table 2 is one episode
# on each of the 500 test goals (configs/eval/webshop_table2.jsonl).
EPISODES_PER_CASE = {"scienceworld": 4, "sanity": 4, "webshop": 1}
OOD_STEPS = 10  # adaptation steps after step 0 (the paper plots steps 0-9: --ood=9)


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


def case_order(row: dict) -> tuple:
    """Sort key of a result row: (task name, variation, repeat), whatever rank played it."""
    name, variation = row["task"].rsplit("/", 1)
    return name, int(variation), row["repeat"]


def play_cases(model, chat: ChatStream, envs: list, cases: list[Case], cfg: Config, *, accelerator=None,
               progress=None, memory: TipMemory | None = None, tips: bool = False, logged: set | None = None
               ) -> tuple[list[dict], list[dict]]:
    """Play this rank's share of `cases` (in chunks of len(envs)) and gather every rank's (result rows, episode
    records of the cases in `logged`), sorted by case. memory: retrieve its tips (on-policy with tips); tips: also
    write one tip per episode (rollout.write_tips, seeded by the case), as memory entries in `row["tip_entries"]`."""
    rank, world = (accelerator.process_index, accelerator.num_processes) if accelerator else (0, 1)
    mine = cases[rank::world]
    rows, records = [], []
    for start in range(0, len(mine), len(envs)):
        chunk = mine[start : start + len(envs)]
        seeds = None if any(c.seed is None for c in chunk) else [c.seed for c in chunk]
        plays = pair_up(envs, [c.task for c in chunk], list(range(len(chunk))), seeds)
        episodes = run_episodes(model, chat, plays, mode="on_policy_tips" if memory is not None else "no_memory",
                                memory=memory, cfg=replace(cfg.rollout, temperature=cfg.train.eval_temperature),
                                keep_caches=tips)
        if tips:
            write_tips(model, chat, episodes, None, cfg.rollout)
        for ep, c in zip(episodes, chunk):
            row = {"task": ep.task.key, "repeat": c.repeat, "seed": c.seed, "return": ep.extrinsic_return,
                   "score": ep.extrinsic_return if ep.score is None else float(ep.score), "success": ep.success,
                   "length": ep.num_actions, "truncated": ep.truncated, "actions": ep.actions}
            if tips:
                row.update(tip=ep.tip, tip_entries=[asdict(e) for e in tip_entries(ep, envs[0].max_score())])
            rows.append(row)
            if logged is not None and c in logged:
                records.append({**episode_record(ep), "repeat": c.repeat})
        if progress is not None:
            progress.update(len(chunk))
    # Sorted by case: nothing downstream depends on which rank played what (floating-point sums included).
    parts = gather_objects(accelerator, (rows, records))
    rows = sorted((r for part, _ in parts for r in part), key=case_order)
    records = sorted((r for _, part in parts for r in part), key=case_order)
    return rows, records


def statistics(rows: list[dict]) -> dict:
    """Overall and per-task statistics (a task = all its variations: the paper's Table 1 rows)."""
    per_task: dict = defaultdict(list)
    for r in rows:
        per_task[r["task"].rsplit("/", 1)[0]].append(r)
    return {**summary(rows), "per_task": {name: summary(part) for name, part in sorted(per_task.items())}}


def evaluate(model, chat: ChatStream, envs: list, tasks: list, cfg: Config, *, accelerator=None,
             episodes_per_task: int = 1, progress=None,
             seed: int | None = None, cases: list[Case] | None = None) -> dict:
    """No-memory episodes; returns overall and per-task statistics, every episode's result and a seeded sample of
    `train.log_episodes` episode records for the viewer (the same on all ranks).

    cases: what to play (default: `make_cases(tasks, episodes_per_task, seed)`). A case with a seed samples from its
    own stream, so its episode is the same at any batch size, number of processes or order of cases (up to
    floating-point differences between batch shapes; tests/test_eval.py)."""
    cases = cases if cases is not None else make_cases(tasks, episodes_per_task, seed)
    model.eval()
    logged = set(sample_for_log(cases, cfg.train.log_episodes, derive_seed(cfg.train.seed, "log", "evaluation")))
    rows, records = play_cases(model, chat, envs, cases, cfg, accelerator=accelerator, progress=progress,
                               logged=logged)
    return {**statistics(rows), "episode_results": rows, "logged_episodes": records}


def validate(model, chat, envs, test_tasks, cfg: Config, accelerator, out_dir: Path, seeds: Seeds) -> dict:
    """A training record's validation fields (train.py, every `train.eval_every` iterations): `evaluate` without
    memory, the same cases every time, on its own random stream (it neither consumes the training stream nor depends
    on it)."""
    start = time.perf_counter()
    with full_weights(model), torch.random.fork_rng(devices=rng_devices(accelerator)):
        torch.manual_seed(seeds.validation)
        val = evaluate(model, chat, envs, test_tasks, cfg, accelerator=accelerator, seed=derive_seed(
            cfg.train.seed, "validation"), episodes_per_task=cfg.train.eval_episodes_per_task)
    fields = dict(val_return_mean=val["return_mean"], val_success_rate=val["success_rate"],
                  time_eval=time.perf_counter() - start)
    if cfg.train.log_episodes and accelerator.is_main_process:
        write_episodes(out_dir / "episodes" / f"val_{seeds.iteration:06d}.jsonl", val["logged_episodes"])
    return fields


def standard_error(values: list[float], clusters: list | None = None) -> float:
    """Standard error of the mean of `values`. clusters[i]: the test item (task variation or goal) of value i; the
    repeats of one item are not independent samples, so with repeats the s.e. is taken over the items' means
    (every item has the same number of repeats in our case lists, so their mean is the mean of the values)."""
    if clusters is not None and len(set(clusters)) < len(values):
        by_item: dict = defaultdict(list)
        for value, item in zip(values, clusters):
            by_item[item].append(value)
        values = [float(np.mean(v)) for v in by_item.values()]
    return float(np.std(values, ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0


def summary(rows: list[dict]) -> dict:
    """Mean, standard deviation (over episodes, ddof 1) and standard error (over test items: a variation's or
    goal's repeats are averaged first) of the return and of the environment's score (they differ on WebShop: the
    return includes the invalid-action penalties and follows `reward_mode`, the score is 100 x the task reward of
    the purchase, Table 2's "Score"), success rate, length, truncation rate."""
    returns = [r["return"] for r in rows]
    scores = [r.get("score", r["return"]) for r in rows]
    successes = [float(r["success"]) for r in rows]
    items = [r.get("task", i) for i, r in enumerate(rows)]
    return {
        "return_mean": float(np.mean(returns)) if rows else 0.0,
        "return_std": float(np.std(returns, ddof=1)) if len(rows) > 1 else 0.0,
        "return_se": standard_error(returns, items),
        "score_mean": float(np.mean(scores)) if rows else 0.0,
        "score_se": standard_error(scores, items),
        "success_rate": float(np.mean(successes)) if rows else 0.0,
        "success_se": standard_error(successes, items),
        "episode_length": float(np.mean([r["length"] for r in rows])) if rows else 0.0,
        "truncation_rate": float(np.mean([bool(r["truncated"]) for r in rows])) if rows else 0.0,
        "episodes": len(rows),
    }


def adapt_with_memory(model, chat: ChatStream, envs: list, cases: list[Case], cfg: Config, steps: int, *,
                      accelerator=None, progress=None, log=None) -> tuple[dict, TipMemory]:
    """The paper's OOD adaptation (§6.1, Fig. 8): a frozen model, no parameter updates. Step 0 plays `cases` without
    memory (the same episodes as `evaluate` on them); after every step the model writes one tip per episode, and
    step s >= 1 replays the cases with the tips of all earlier steps retrieved (memory keyed by task variation, as
    in training). Step s samples case c from derive_seed(c.seed, "ood", s). Every rank adds every rank's tips in
    case order, so the memory, and the result, do not depend on the number of processes.

    log(step, records): called with each step's episode records (a seeded sample of `train.log_episodes`).
    Returns the per-step statistics, the best step (highest mean return among steps >= 1), its gain over step 0
    (absolute, and relative to |step 0|, as the paper's "+137.5 %"), and the final memory."""
    memory = TipMemory.from_config(cfg.memory)
    model.eval()
    per_step = []
    for step in range(steps + 1):
        step_cases = [c if step == 0 or c.seed is None else replace(c, seed=derive_seed(c.seed, "ood", step))
                      for c in cases]
        logged = set(sample_for_log(step_cases, cfg.train.log_episodes, derive_seed(cfg.train.seed, "log", step)))
        rows, records = play_cases(model, chat, envs, step_cases, cfg, accelerator=accelerator,
                                   progress=progress, memory=memory if step else None, tips=True, logged=logged)
        for row in rows:  # after the step: its tips become visible to the next one
            for entry in row.pop("tip_entries"):
                memory.add(row["task"], TipEntry(**entry))
        per_step.append({"step": step, **statistics(rows), "memory_size": memory.size(), "episode_results": rows})
        if log is not None:
            log(step, records)
    return {"steps": per_step, **best_step(per_step)}, memory


def best_step(per_step: list[dict]) -> dict:
    """The step >= 1 with the highest mean return (step 0 without later steps) and its gain over step 0: absolute,
    and relative to |step 0| (the paper's "+137.5 %"; None when step 0 is 0)."""
    step0 = per_step[0]["return_mean"]
    best = max(per_step[1:], key=lambda s: s["return_mean"]) if len(per_step) > 1 else per_step[0]
    gain = best["return_mean"] - step0
    return {"best_step": best["step"], "best_gain": gain, "best_gain_relative": gain / abs(step0) if step0 else None}


def ood_table(ood: dict, title: str) -> str:
    """Mean return ± standard deviation per adaptation step (paper Fig. 8) and the best-step gain over step 0."""
    lines = [f"# {title}", "", "| step | memory | episodes | return (mean ± std) | success rate | tips in memory |",
             "|---|---|---|---|---|---|"]
    for s in ood["steps"]:
        lines.append(f"| {s['step']} | {'no' if s['step'] == 0 else 'yes'} | {s['episodes']} | "
                     f"{s['return_mean']:.1f} ± {s['return_std']:.1f} | {s['success_rate']:.2f} | {s['memory_size']} |")
    relative = ood["best_gain_relative"]
    lines += ["", f"Best step: {ood['best_step']}, gain over step 0: {ood['best_gain']:+.1f}"
              + (f" ({100 * relative:+.1f} % of |step 0|)" if relative is not None else "")]
    return "\n".join(lines) + "\n"


def markdown_table(result: dict, title: str, env_name: str = "scienceworld") -> str:
    """ScienceWorld: one row per task, return mean +/- standard error (paper Table 1). WebShop: score (100 x task
    reward of the purchase, 0 without one; not the training return, which subtracts invalid-action penalties) and
    success rate (%) over all goals (paper Table 2)."""
    if env_name == "webshop":
        lines = [f"# {title}", "", f"| | ours ({result['episodes']} episodes) |", "|---|---|",
                 f"| Score | {result['score_mean']:.1f} ± {result['score_se']:.1f} |",
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


def report(result: dict, label: str, env_name: str) -> str:
    """eval.md: the evaluation table; with an OOD run also the per-step table and the last step's per-task table (a
    step fixed in advance, e.g. the Reflexion-style baseline's Table 1 row: picking the best step would select on the
    test cases)."""
    table = markdown_table(result, f"Evaluation without memory: {label}", env_name)
    if "ood" in result:
        table += "\n" + ood_table(result["ood"], f"Adaptation with memory, no updates: {label}")
        last = result["ood"]["steps"][-1]
        table += "\n" + markdown_table(last, f"Step {last['step']} (the last) with memory: {label}", env_name)
    return table


def configured_cases(cases: list[Case], tasks: list[Task], source: str) -> list[Case]:
    """The cases of a committed list whose task is one the config names (a list may hold all 18 Table-1 tasks while
    the paper trains and evaluates one model per task); an error when none is left."""
    names = {t.name for t in tasks}
    kept = [c for c in cases if c.task.name in names]
    if not kept:
        raise SystemExit(f"config error: {source} has no case of the configured tasks {sorted(names)}")
    if len(kept) < len(cases):
        print(f"{source}: {len(kept)} of {len(cases)} cases are of the configured tasks {sorted(names)}")
    return kept


def output_folder(output: str, checkpoint: str, output_dir: str) -> Path:
    """Where eval.py writes: --output, else OUTPUT_DIR/eval_<run>_<iter_XXXXXX> for RUN/checkpoints/iter_XXXXXX (so the
    EMPO² and GRPO checkpoints of one OOD config do not share a folder), eval_<folder name> for another checkpoint
    folder, eval_base without one. Never a checkpoint folder: an --ood run's memory.json would replace the training
    memory a resume loads."""
    folder = Path(checkpoint).resolve() if checkpoint else None
    name = "base" if folder is None else (f"{folder.parent.parent.name}_{folder.name}"
                                          if folder.parent.name == "checkpoints" else folder.name)
    out = Path(output) if output else Path(output_dir) / f"eval_{name}"
    if (out / "state.json").is_file():
        raise SystemExit(f"config error: --output={out} is a training checkpoint; write the evaluation elsewhere")
    return out


def generation_differences(folder: Path, cfg: Config, model, tokenizer) -> list[str]:
    """The sampling settings in which this config differs from the ones the checkpoint was trained with
    (checkpoint generation.json): a mismatched --config changes prompts budgets and sampling silently otherwise."""
    path = folder / "generation.json"
    if not path.is_file():
        return []
    trained, now = json.loads(path.read_text()), generation_settings(to_dict(cfg), model, tokenizer)
    return [f"{key} = {now.get(key)!r} here, {value!r} in training ({path})"
            for key, value in trained.items() if now.get(key) != value]


def planned_tasks(env, cfg: Config, split: str) -> list[Task]:
    """The tasks of `split` (the first train.eval_tasks of them when > 0)."""
    tasks = env.tasks(split)
    return tasks[: cfg.train.eval_tasks] if cfg.train.eval_tasks > 0 else tasks


USAGE = """usage: python eval.py --config FILE [--checkpoint=DIR] [--episodes_per_task=N] [--split=test|train]
                     [--cases=FILE] [--write_cases=FILE] [--ood[=K]] [--output=DIR] [--section.key=value ...]

--ood[=K]: the OOD adaptation protocol after the evaluation: K (default 10) more steps with memory, no updates
(configs/ood/ holds the paper's three transfers). Every config key, with its default:
"""


def main(argv: list[str] | None = None) -> dict:
    from tqdm.auto import tqdm

    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print(USAGE + config_help())
        return {}
    extra = {"checkpoint": "", "episodes_per_task": "", "output": "", "split": "test", "ood": "",
             "cases": "", "write_cases": ""}
    rest = split_options([f"--ood={OOD_STEPS}" if arg == "--ood" else arg for arg in argv], extra)
    try:
        cfg = load_config(*split_cli(rest))
        # Evaluation is data parallel (every rank plays its share with the whole model): an FSDP launch is refused
        # rather than ignored; mixed precision and the other supported options apply as in training.
        if check_launch(cfg.model).fsdp:
            raise LaunchError("eval.py runs data parallel, each rank with the whole model: launch it without the "
                              "FSDP config (e.g. configs/accelerate/multi_gpu_8.yaml)")
        ood_steps = int(extra["ood"] or 0)
        if ood_steps < 0:
            raise ConfigError(f"--ood={ood_steps}: the number of adaptation steps must be >= 0")
    except ConfigError as err:  # before ValueError: ConfigError is one
        sys.exit(f"config error: {err}")
    except ValueError as err:
        sys.exit(f"config error: --ood takes a number of steps ({err})")
    per_task = int(extra["episodes_per_task"] or EPISODES_PER_CASE[cfg.env.name])
    if extra["write_cases"]:  # the case list only: no model, one environment
        (env,) = make_env_pool(cfg.env, 1)
        cases = make_cases(planned_tasks(env, cfg, extra["split"]), per_task, derive_seed(cfg.train.seed, "evaluation"))
        env.close()
        write_cases(Path(extra["write_cases"]), cases)
        print(f"wrote {len(cases)} cases to {extra['write_cases']}")
        return {"cases": len(cases)}
    # Checked before anything loads or starts: where to write, and the case list
    out = output_folder(extra["output"], extra["checkpoint"], cfg.output_dir)
    try:
        listed = read_cases(Path(extra["cases"])) if extra["cases"] else None
    except (ConfigError, OSError) as err:
        sys.exit(f"config error: {err}")
    accelerator = make_accelerator()
    torch.manual_seed(derive_seed(cfg.train.seed, "eval", accelerator.process_index))  # sampling: repeatable per seed
    with accelerator.main_process_first():
        # A checkpoint holds the whole adapter: the one its run started from (init_adapter) is not needed
        model, tokenizer = load_policy(replace(cfg.model, init_adapter="") if extra["checkpoint"] else cfg.model,
                                       device=accelerator.device)
    if extra["checkpoint"]:
        folder = Path(extra["checkpoint"])
        load_trainable(model, str(folder / "model" if (folder / "model").is_dir() else folder))
        if accelerator.is_main_process:
            for line in generation_differences(folder, cfg, model, tokenizer):
                print(f"warning: {line}", file=sys.stderr)
    chat = ChatStream(tokenizer)
    size = max(1, cfg.rollout.tasks_per_iteration // accelerator.num_processes) * cfg.rollout.group_size
    envs = make_env_pool(cfg.env, size)
    tasks = planned_tasks(envs[0], cfg, extra["split"])
    cases = make_cases(tasks, per_task, derive_seed(cfg.train.seed, "evaluation"))
    if listed is not None:
        try:
            cases = configured_cases(listed, tasks, extra["cases"])
        except SystemExit:
            for env in envs:  # stop the environments' JVMs before leaving
                env.close()
            raise
    main_process = accelerator.is_main_process

    def log(name: str, records: list[dict]) -> None:
        if main_process and cfg.train.log_episodes:
            write_episodes(out / "episodes" / f"{name}.jsonl", records)

    label = f"{cfg.model.name_or_path} {extra['checkpoint']}".strip()
    bar = tqdm(total=-(-len(cases) // accelerator.num_processes) * (1 + ood_steps), desc="eval",
               disable=not main_process)
    if ood_steps:  # step 0 of the adaptation is the evaluation itself (same cases, same seeds)
        ood, memory = adapt_with_memory(model, chat, envs, cases, cfg, ood_steps, accelerator=accelerator,
                                        progress=bar, log=lambda step, records: log(f"ood_step_{step:02d}", records))
        result = {**ood["steps"][0], "ood": ood}
        if main_process:
            out.mkdir(parents=True, exist_ok=True)
            memory.save(str(out / "memory.json"))
    else:
        result = evaluate(model, chat, envs, tasks, cfg, accelerator=accelerator, progress=bar, cases=cases)
        log("evaluation", result.pop("logged_episodes"))
    bar.close()
    for env in envs:
        env.close()
    result.update(model=cfg.model.name_or_path, checkpoint=extra["checkpoint"], temperature=cfg.train.eval_temperature)
    if main_process:
        out.mkdir(parents=True, exist_ok=True)
        (out / "eval.json").write_text(json.dumps(result, indent=2))
        table = report(result, label, cfg.env.name)
        (out / "eval.md").write_text(table)
        print(table)
        print(f"wrote {out / 'eval.json'} and {out / 'eval.md'}")
    return result


if __name__ == "__main__":
    main()
