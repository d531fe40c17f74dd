"""EMPO² vs GRPO in miniature, decisively: four arms, equal everything else, on the sanity environment (CPU).

    python -m tools.compare tips    [--setting S] [--out DIR]  # item 0: do the base model's own tips carry information?
    python -m tools.compare run     [--setting S] [--out DIR] [--seeds 0,1,2,3,4] [--arms a,b] [--jobs N] [--section.key=value ...]
    python -m tools.compare summary [--setting S] [--out DIR]  # tables, confidence intervals, plot (also after `run`)

A setting (docs/sanity.md, "EMPO² vs GRPO": each chosen and committed before its first run) is one entry of
`SETTINGS`, applied to every arm: `difficulty2` (the default; results/comparison), `difficulty1`, registered when
the first was reported unusable (results/comparison_difficulty1), and `difficulty1_warmup`, the second with every run
of a seed starting from the seed's format warm-up (`WARMUPS`, tools/warmup.py; runs/warmup_s<seed>/, made first), and
`switch_oracle` (docs/LOG.md: the switch lab, tip-reading warm-ups, its own `SETTING_ARMS`, paired contrasts on success
and validity checks). An output folder remembers its setting (setting.json). The arms differ only by `ARMS`:

    grpo                configs/sanity_grpo.yaml: memory and the novelty bonus off
    empo2               configs/sanity_empo2.yaml: the paper's mode probabilities 0.75 / 0.08 / 0.17, policy-written tips
    empo2_no_off_policy the paper's ablation of distillation (Fig. 9): the same share of memory iterations (0.25), all
                        on-policy with tips, no off-policy update
    empo2_env_tips      an ABLATION, not the paper: tips written by the environment from the episode's own feedback
                        (rollout.tip_source=environment): isolates the hybrid update from the quality of a 135M model's tips
    switch_oracle: grpo_novelty, empo2_oracle, empo2_oracle_no_off, empo2_oracle_alg1, empo2_policy (docs/LOG.md)

Each run is its own `python train.py` process (runs/<arm>_s<seed>/, its exact command in command.txt). `run` skips
finished runs (done.json) and resumes interrupted ones from their newest checkpoint (train.py --resume=latest, exact:
the same episodes and weights as an uninterrupted run); wall time is summed over a run's sittings. Ctrl-C or SIGTERM
stops `run` cleanly: the running runs finish their iteration and checkpoint, none starts, wall times are recorded
(`stop_on_signals`). A finished run keeps its final LoRA adapter, memory and config in runs/<arm>_s<seed>/final/ (the
checkpoints are then deleted: `eval.py --checkpoint=runs/<arm>_s<seed>/final` re-evaluates it). Iteration 0 of every
curve is the untrained model (runs/base_s<seed>/, the same for every arm). `summary` writes summary.json, summary.md
and compare.png: per arm the final and area-under-curve validation return, the differences to GRPO with their tests,
the tip-usefulness table, and the training signal per memory mode (`training_signal`: fatal episodes, episodes that
reached a stage, groups with no task signal, tip hit rate, per quarter of training the shares that wrote a focus and
that were solved), whether the policy writes a listed command itself (`command_use`), how validation episodes end
before RL and at the end (`episode_endings`) and the validation success rate per iteration: the measurements behind
a verdict.

`--jobs N` runs N runs at once, each with OMP_NUM_THREADS and --train.torch_threads = cores // N (at least 1; the
sanity configs' own torch_threads would oversubscribe the cores). On 2 cores two one-thread runs finished no more
iterations per hour than one two-thread run (results/pilot_switch). The thread count is in each run's command.txt;
results depend on it only through the order of float reductions; wall times of runs that shared the cores are not
comparable with those of runs that did not.
"""
from __future__ import annotations

import argparse
import itertools
import json
import math
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import yaml

from infra.metrics import jsonl_files, jsonl_text

ROOT = Path(__file__).resolve().parents[1]  # the repository
SETTINGS = {  # each registered in docs/sanity.md before its first run: never change a registered setting
    "difficulty2": [  # registered 2026-12-02 (results/comparison)
        "--env.sanity.families=[lab]", "--env.sanity.difficulty=2", "--env.sanity.num_stages=3",
        "--env.sanity.num_distractors=1", "--env.sanity.max_steps=4", "--env.sanity.train_variations=16",
        "--env.sanity.test_variations=8", "--rollout.tasks_per_iteration=2", "--rollout.group_size=4",
        "--rollout.tip_max_tokens=24", "--train.iterations=40", "--train.eval_every=5", "--train.eval_tasks=0",
        "--train.eval_episodes_per_task=4", "--train.save_every=5",
    ],
}
# Registered 2026-12-04 by the first setting's rule ("if the setting is unusable, the next one is difficulty 1"):
# everything as difficulty2 except the stage order, one fixed order for every variation (results/comparison_difficulty1).
SETTINGS["difficulty1"] = ["--env.sanity.difficulty=1" if a == "--env.sanity.difficulty=2" else a
                           for a in SETTINGS["difficulty2"]]
# Registered 2026-12-04 (docs/sanity.md, "third setting"): the second setting's arguments, and every run of a seed
# (its iteration-0 evaluation, its tip measurement and all four arms) starts from that seed's format warm-up
# (tools/warmup.py: supervised, on gold episodes of the garden family, which no arm ever plays).
SETTINGS["difficulty1_warmup"] = list(SETTINGS["difficulty1"])
WARMUPS = {"difficulty1_warmup": ["--family=garden", "--epochs=3", "--lr=3e-4"]}  # tools/warmup.py's own arguments
# Registered 2026-12-06 (docs/LOG.md, "issue 49: the switch grid"): the hard-exploration lab (a colourless "flip the
# main switch" between the wire and the button, success-only reward, no fatal command, no spare step), every run of a
# seed starting from the seed's tip-reading warm-up (tools/warmup.py --tip_share, on the garden family, which no arm
# plays). Validation: tip-free success on the 8 held-out variations, 8 episodes each (64), T = 0.4, every 10 of the 60
# iterations.
SETTINGS["switch_oracle"] = [
    "--env.sanity.families=[lab]", "--env.sanity.switch=true", "--env.sanity.reward=success",
    "--env.sanity.difficulty=1", "--env.sanity.num_stages=3", "--env.sanity.num_distractors=1",
    "--env.sanity.max_steps=4", "--env.sanity.fatal=false", "--env.sanity.train_variations=8",
    "--env.sanity.test_variations=8", "--train.iterations=60", "--train.minibatch_steps=16",
    "--train.micro_batch_size=4", "--train.eval_every=10", "--train.eval_tasks=0", "--train.eval_episodes_per_task=8",
    "--train.save_every=5", "--train.log_episodes=-1",
]
# Its warm-up replaces the setting's arguments (WARMUP_ALONE): the garden episodes of the pilot's warm-up
# (results/pilot_switch/warmup_tips6_s100: 16 / 8 garden variations, max_steps 6 for room to take a detour).
WARMUPS["switch_oracle"] = ["--env.sanity.families=[lab]", "--env.sanity.difficulty=1", "--env.sanity.num_stages=3",
                            "--env.sanity.num_distractors=1", "--env.sanity.max_steps=6",
                            "--env.sanity.train_variations=16", "--env.sanity.test_variations=8", "--family=garden",
                            "--epochs=6", "--lr=3e-4", "--tip_share=0.5"]
WARMUP_ALONE = {"switch_oracle"}
SETTING = SETTINGS["difficulty2"]  # the setting in use; main() sets it from --setting
SETTING_NAME = "difficulty2"
WARMUP: list[str] = []  # the setting's warm-up arguments ([] = none: runs start from the base model)
ARMS = {
    "grpo": ("configs/sanity_grpo.yaml", []),
    "empo2": ("configs/sanity_empo2.yaml", []),
    "empo2_no_off_policy": ("configs/sanity_empo2.yaml", ["--memory.p_on_policy_tips=0.25", "--memory.p_off_policy=0"]),
    "empo2_env_tips": ("configs/sanity_empo2.yaml", ["--rollout.tip_source=environment"]),
}
# The switch grid's arms (issue 49): oracle tips, each shown only at its own state, as a bare tip (no action field).
ORACLE = ["--rollout.tip_source=oracle", "--memory.similarity=exact", "--rollout.tip_format=tip_only",
          "--memory.top_k=3"]
ARMS.update({
    "grpo_novelty": ("configs/sanity_grpo.yaml", ["--intrinsic.coef=0.1"]),  # memory object for the counts, no tips
    "empo2_oracle": ("configs/sanity_empo2.yaml", ORACLE),
    "empo2_oracle_no_off": ("configs/sanity_empo2.yaml", [*ORACLE, "--memory.p_on_policy_tips=0.25",
                                                          "--memory.p_off_policy=0"]),
    "empo2_oracle_alg1": ("configs/sanity_empo2.yaml", [*ORACLE, "--loss.off_policy_old_logp=without_tips"]),
    "empo2_policy": ("configs/sanity_empo2.yaml", ["--rollout.tip_format=tip_only", "--memory.top_k=3"]),
})
SETTING_ARMS = {name: ["grpo", "empo2", "empo2_no_off_policy", "empo2_env_tips"] for name in SETTINGS}
SETTING_ARMS["switch_oracle"] = ["grpo", "grpo_novelty", "empo2_oracle", "empo2_oracle_no_off",  # primary, 8 seeds
                                 "empo2_oracle_alg1", "empo2_policy"]  # secondary, 3 seeds
REGISTERED_IN = {"switch_oracle": "docs/LOG.md"}  # where a setting was registered (docs/sanity.md where not listed)
PRIMARY_CONTRASTS = {"switch_oracle": [("empo2_oracle", "grpo"), ("empo2_oracle", "grpo_novelty"),
                                       ("empo2_oracle", "empo2_oracle_no_off")]}
TIP_ROUNDS = 3  # `tips`: rounds with the base model's own tips after the no-memory round


def code_version() -> str:
    """The commit the runs were made with (plus a mark when the checkout has uncommitted changes)."""
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True,
                           text=True).stdout.strip()
    return f"{head or 'unknown'}{' (uncommitted changes)' if dirty else ''}"


THREADS: int | None = None  # OMP_NUM_THREADS for every run's process (set by `run --jobs`); None = torch's default
SIGNALS = {"received": 0}  # SIGTERM / SIGINT received by `run` or `tips` (stop_on_signals); run_command reads it


class RunFailed(RuntimeError):
    pass


def thread_prefix() -> str:
    return f"OMP_NUM_THREADS={THREADS} " if THREADS else ""


def train_command(arm: str, seed: int, run: Path, extra: list[str]) -> list[str]:
    """The exact train.py command of one run. Under `--jobs` the run's torch thread count is set too: the sanity
    configs set train.torch_threads (which overrides OMP_NUM_THREADS), and two runs of two OpenMP threads each on two
    cores spin in OpenMP's barriers (measured: a no-memory iteration took 210 s instead of 57 s, with a third process
    on the cores). `extra` comes after it, so a --train.torch_threads of the caller's still wins."""
    config, arm_overrides = ARMS[arm]
    threads = [f"--train.torch_threads={THREADS}"] if THREADS else []
    return [sys.executable, "train.py", "--config", config, *SETTING, *arm_overrides, f"--train.seed={seed}",
            *threads, *extra, f"--output_dir={run}"]


def run_command(cmd: list[str], log: Path) -> tuple[int, float]:
    """Run one process, its output appended to `log`; (exit code, wall seconds). The process gets a session of its own,
    so a terminal's Ctrl-C reaches only tools/compare.py, which passes each signal it receives on to the process once
    (train.py: the first finishes the iteration, checkpoints and exits 0; a second stops it at once)."""
    env = {**os.environ, "OMP_NUM_THREADS": str(THREADS)} if THREADS else None
    start = time.perf_counter()
    with open(log, "a") as f:
        f.write(f"\n# code {code_version()}\n$ {thread_prefix()}{' '.join(cmd[1:])}\n")
        f.flush()
        process = subprocess.Popen(cmd, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        passed_on = 0
        while True:
            while passed_on < SIGNALS["received"]:
                process.send_signal(signal.SIGTERM)
                passed_on += 1
            try:
                code = process.wait(timeout=0.5)
                break
            except subprocess.TimeoutExpired:
                pass
    return code, time.perf_counter() - start


def stop_on_signals() -> None:
    """SIGTERM / SIGINT (Ctrl-C): every running run finishes its iteration, checkpoints and stops, no new run starts,
    and `run` exits once they have (wall times recorded; `run` again resumes). A second signal stops them at once.
    The handler only counts: the threads that wait on the runs pass the signals on (run_command)."""
    def handler(signum, frame):
        SIGNALS["received"] += 1
        print(f"signal {signum}: " + ("the running runs finish their iteration, checkpoint and stop; no new run starts "
                                      "(again to stop them at once)" if SIGNALS["received"] == 1 else
                                      "stopping the running runs now"), flush=True)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, handler)


def read_jsonl(path: Path) -> list[dict]:
    """The records of x.jsonl, or of x.jsonl.gz where only that exists (results/ keeps episode logs compressed);
    [] where neither exists."""
    text = jsonl_text(path)
    return [json.loads(line) for line in text.splitlines() if line.strip()] if text is not None else []


def configured_iterations(run: Path) -> int:
    """train.iterations of the run, from the config.yaml train.py wrote into its folder."""
    return int(yaml.safe_load((run / "config.yaml").read_text())["train"]["iterations"])


def last_checkpoint(run: Path) -> Path:
    """The run's checkpoint of its last configured iteration. train.py exits with 0 also when a SIGTERM stopped it
    early (after checkpointing the iteration it was in), so exit code 0 alone does not mean finished."""
    iterations = configured_iterations(run)
    saved = sorted((run / "checkpoints").glob("iter_*"))
    if not saved or saved[-1].name != f"iter_{iterations:06d}":
        raise RunFailed(f"{run.name} stopped at {saved[-1].name if saved else 'no checkpoint'} of {iterations} "
                        f"iterations; `python -m tools.compare run` resumes it")
    return saved[-1]


def finished(out: Path, name: str, seed: int) -> bool:
    """Whether run `name` ("warmup", "base" or an arm) of `seed` is complete: a training run writes done.json after
    its last iteration, the untrained model's evaluation eval.json, a warm-up warmup.json (after its adapter)."""
    done = {"base": "eval.json", "warmup": "warmup.json"}.get(name, "done.json")
    return (out / "runs" / f"{name}_s{seed}" / done).exists()


def start_from(out: Path, seed: int) -> list[str]:
    """The override that starts every run of `seed` from the seed's warm-up ([] in a setting without one)."""
    return [f"--model.init_adapter={out / 'runs' / f'warmup_s{seed}'}"] if WARMUP else []


def warmup_run(out: Path, seed: int, extra: list[str]) -> None:
    """The seed's format warm-up (tools/warmup.py), before any other run of the seed; skipped when it has finished. It
    takes a minute or three and writes nothing before its adapter is complete, so an interrupted one simply reruns."""
    run = out / "runs" / f"warmup_s{seed}"
    if finished(out, "warmup", seed):
        return
    run.mkdir(parents=True, exist_ok=True)
    threads = [f"--train.torch_threads={THREADS}"] if THREADS else []
    setting = [] if SETTING_NAME in WARMUP_ALONE else SETTING  # a warm-up of its own: WARMUP says everything
    cmd = [sys.executable, "-m", "tools.warmup", "--config", ARMS["empo2"][0], *setting, f"--train.seed={seed}", *WARMUP,
           *threads, *extra, f"--output={run}"]
    (run / "command.txt").write_text(thread_prefix() + " ".join(cmd[1:]) + "\n")
    print(f"format warm-up, seed {seed}", flush=True)
    if run_command(cmd, run / "log.txt")[0] != 0 or not finished(out, "warmup", seed):
        how = "stopped by a signal; `python -m tools.compare run` reruns it" if SIGNALS["received"] else f"failed; see {run}/log.txt"
        raise RunFailed(f"the warm-up of seed {seed} {how}")


def train_run(out: Path, arm: str, seed: int, extra: list[str]) -> None:
    """One arm and seed to the end: fresh, resumed, or skipped when it has finished."""
    run = out / "runs" / f"{arm}_s{seed}"
    if finished(out, arm, seed):
        return
    run.mkdir(parents=True, exist_ok=True)
    cmd = train_command(arm, seed, run, start_from(out, seed) + extra)
    (run / "command.txt").write_text(thread_prefix() + " ".join(cmd[1:]) + "\n")
    resume = any((run / "checkpoints").glob("iter_*"))
    print(f"{'resuming' if resume else 'training'} {arm} seed {seed}", flush=True)
    walls = json.loads((run / "wall_seconds.json").read_text()) if (run / "wall_seconds.json").exists() else []
    code, wall = run_command(cmd + (["--resume=latest"] if resume else []), run / "log.txt")
    (run / "wall_seconds.json").write_text(json.dumps(walls + [round(wall, 1)]))
    if code != 0:
        how = "stopped by a signal" if SIGNALS["received"] else f"failed ({code}); see {run / 'log.txt'}"
        raise RunFailed(f"{arm} seed {seed} {how}; `python -m tools.compare run` resumes it")
    final = last_checkpoint(run)  # RunFailed when a signal stopped it early (exit code 0, an earlier checkpoint)
    shutil.rmtree(run / "final", ignore_errors=True)
    shutil.copytree(final, run / "final", ignore=shutil.ignore_patterns("optimizer.pt", "rng_rank*"))  # adapter
    shutil.rmtree(run / "checkpoints")
    (run / "done.json").write_text(json.dumps({"wall_seconds": sum(walls) + wall, "final": final.name,
                                               "omp_num_threads": THREADS}))


def validation_episodes_per_task(setting: list[str] | None = None) -> int:
    """The setting's train.eval_episodes_per_task (4 where it does not say): iteration 0 is measured as the rest.
    `setting`: its arguments (default: the setting in use)."""
    given = [a.split("=", 1)[1] for a in (SETTING if setting is None else setting)
             if a.startswith("--train.eval_episodes_per_task=")]
    return int(given[-1]) if given else 4


def base_run(out: Path, seed: int, extra: list[str]) -> None:
    """Iteration 0 of every curve: the untrained model on the validation protocol (the same for every arm)."""
    run = out / "runs" / f"base_s{seed}"
    if finished(out, "base", seed):
        return
    run.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "eval.py", "--config", ARMS["empo2"][0], *SETTING, f"--train.seed={seed}",
           *start_from(out, seed), *extra, f"--episodes_per_task={validation_episodes_per_task()}", f"--output={run}"]
    (run / "command.txt").write_text(thread_prefix() + " ".join(cmd[1:]) + "\n")
    print(f"untrained model, seed {seed}", flush=True)
    if run_command(cmd, run / "log.txt")[0] != 0:
        how = "stopped by a signal; `python -m tools.compare run` reruns it" if SIGNALS["received"] else f"failed; see {run}/log.txt"
        raise RunFailed(f"the untrained evaluation of seed {seed} {how}")


def tip_usefulness(out: Path, extra: list[str]) -> None:
    """The frozen base model on the TRAINING variations: no memory, then TIP_ROUNDS rounds with the tips it wrote
    itself (eval.py --ood, the OOD protocol applied in-distribution), once with policy tips, once with the
    environment's (the oracle ablation's tips). Says whether tips carry information in this setting at all. With a
    warm-up, the model measured is seed 0's warmed-up one (the policy every arm of seed 0 starts from)."""
    if WARMUP:
        try:
            warmup_run(out, 0, extra)
        except RunFailed as error:
            sys.exit(str(error))
    for source in ("policy", "environment"):
        run = out / "tips" / source
        if (run / "eval.json").exists() or SIGNALS["received"]:
            continue
        run.mkdir(parents=True, exist_ok=True)
        cmd = [sys.executable, "eval.py", "--config", ARMS["empo2"][0], *SETTING, "--train.seed=0",
               *start_from(out, 0), f"--rollout.tip_source={source}", "--split=train", f"--ood={TIP_ROUNDS}",
               "--episodes_per_task=4", *extra, f"--output={run}"]
        (run / "command.txt").write_text(" ".join(cmd[1:]) + "\n")
        print(f"tip usefulness, {source} tips", flush=True)
        if run_command(cmd, run / "log.txt")[0] != 0 and not SIGNALS["received"]:
            sys.exit(f"failed; see {run / 'log.txt'}")


# ---------------------------------------------------------------------------------------------- statistics

def mean_se(values) -> tuple[float, float]:
    values = np.asarray(values, dtype=float)
    return float(values.mean()), float(values.std(ddof=1) / np.sqrt(len(values))) if len(values) > 1 else 0.0


def bootstrap_ci(a, b, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile bootstrap CI of mean(a) - mean(b), seeds resampled within each arm."""
    rng = np.random.default_rng(seed)
    a, b = np.asarray(a, float), np.asarray(b, float)
    diffs = (rng.choice(a, (resamples, len(a))).mean(1) - rng.choice(b, (resamples, len(b))).mean(1))
    low, high = np.percentile(diffs, [2.5, 97.5])
    return float(low), float(high)


def permutation_p(a, b) -> float:
    """Exact two-sided permutation test of mean(a) - mean(b): every split of the pooled seeds into two arms."""
    pooled, n = np.concatenate([a, b]).astype(float), len(a)
    observed = abs(np.mean(a) - np.mean(b))
    splits = [abs(pooled[list(i)].mean() - np.delete(pooled, list(i)).mean()) >= observed - 1e-12
              for i in itertools.combinations(range(len(pooled)), n)]
    return float(np.mean(splits))


def welch_t(a, b) -> tuple[float, float]:
    """Welch's t statistic and its Welch-Satterthwaite degrees of freedom."""
    a, b = np.asarray(a, float), np.asarray(b, float)
    va, vb = a.var(ddof=1) / len(a), b.var(ddof=1) / len(b)
    if va + vb == 0:
        return 0.0, float(len(a) + len(b) - 2)
    return float((a.mean() - b.mean()) / np.sqrt(va + vb)), float(
        (va + vb) ** 2 / (va ** 2 / (len(a) - 1) + vb ** 2 / (len(b) - 1)))


def curve(out: Path, arm: str, seed: int, metric: str = "return_mean") -> dict[int, float]:
    """{iteration: validation `metric`}, iteration 0 = the untrained model ({} where its evaluation lacks the metric).
    The return is the registered metric; "success_rate" says whether it rose by solving tasks or by fewer fatal
    endings."""
    base = json.loads((out / "runs" / f"base_s{seed}" / "eval.json").read_text())
    if metric not in base:
        return {}
    points = {0: base[metric]}
    points.update({r["iteration"]: r[f"val_{metric}"] for r in read_jsonl(out / "runs" / f"{arm}_s{seed}" /
                                                                          "metrics.jsonl") if f"val_{metric}" in r})
    return points


def area(points: dict[int, float]) -> float:
    """Area under the validation curve divided by its length: the trapezoid mean return over training."""
    its = sorted(points)
    return float(np.trapezoid([points[i] for i in its], its) / (its[-1] - its[0]))


def movement(val_return: dict[str, list[float]]) -> dict[str, dict]:
    """The registered usability check (docs/sanity.md, "If the setting is unusable"): per validated iteration, each
    seed's validation return minus its own untrained one (iteration 0, the same seed's base evaluation), mean and
    standard error over seeds, and whether |mean| > 2 standard errors ("moved"). `val_return`: {iteration: [per-seed
    returns]} in the same seed order for every iteration (summarise's val_return)."""
    untrained = np.asarray(val_return["0"], float)
    out = {}
    for it, returns in val_return.items():
        if it == "0":
            continue
        mean, se = mean_se(np.asarray(returns, float) - untrained)
        out[it] = {"mean": mean, "se": se, "moved": bool(len(returns) > 1 and abs(mean) > 2 * se)}
    return out


MODES = ("no_memory", "on_policy_tips", "off_policy")


def training_quarter(iteration: int, iterations: int) -> str | None:
    """"first" or "last" when `iteration` (1-based) lies in the first or last quarter of a run's `iterations`."""
    return "first" if iteration <= iterations / 4 else "last" if iteration > iterations * 3 / 4 else None


def training_signal(runs: list[Path]) -> dict[str, dict]:
    """Why a run learns or does not, per memory mode, pooled over `runs`' logged training episodes (every episode in
    the registered setting: 2 rows x 4 = train.log_episodes' 8): the share of episodes ended by a fatal command
    (negative task return: -100), the share that reached at least one stage (positive task return), and the share
    of groups whose episodes all got the same task return, so that only the novelty bonus gives them an advantage
    (GRPO: no signal at all), and the share whose advantage is zero for every episode, novelty bonus included
    (`silent`: nothing to learn from at all; the difference to the first share is the groups that only the novelty
    bonus moves); plus the mean tip hit rate (steps shown >= 1 tip) of the mode's iterations. The fatal
    share is also given for the first and the last quarter of each run's iterations: what training changed."""
    episodes = {mode: [] for mode in MODES}
    groups = {mode: [] for mode in MODES}
    silent = {mode: [] for mode in MODES}
    hits = {mode: [] for mode in MODES}
    fatal_by_quarter = {mode: {"first": [], "last": []} for mode in MODES}
    endings_by_quarter = {mode: [[] for _ in range(4)] for mode in MODES}  # episode_endings per quarter of training
    for run in runs:
        config = yaml.safe_load((run / "config.yaml").read_text())  # one read: iterations and the novelty bonus
        iterations, intrinsic = int(config["train"]["iterations"]), config.get("intrinsic", {})
        for name, file in jsonl_files(run / "episodes", "iter_*").items():
            iteration = int(name.split("_")[1])
            quarter = training_quarter(iteration, iterations)
            by_group: dict[tuple, list[tuple[float, float]]] = {}
            for record in read_jsonl(file):
                episodes[record["mode"]].append(record["extrinsic_return"])
                endings_by_quarter[record["mode"]][min(3, (iteration - 1) * 4 // iterations)].append(record)
                if quarter:
                    fatal_by_quarter[record["mode"]][quarter].append(record["extrinsic_return"] < 0)
                by_group.setdefault((record["mode"], record["group"]), []).append(
                    (record["extrinsic_return"], advantage_key(record, intrinsic)))
            for (mode, _), returns in by_group.items():
                groups[mode].append(len({task for task, _ in returns}) == 1)
                silent[mode].append(len({key for _, key in returns}) == 1)
        for row in read_jsonl(run / "metrics.jsonl"):
            hits[row["mode"]].append(row.get("tip_hit_rate", 0.0))
    out = {}
    for mode in MODES:
        returns = episodes[mode]
        out[mode] = {
            "episodes": len(returns), "groups": len(groups[mode]),
            "fatal_share": float(np.mean([r < 0 for r in returns])) if returns else None,
            "stage_share": float(np.mean([r > 0 for r in returns])) if returns else None,
            "flat_group_share": float(np.mean(groups[mode])) if groups[mode] else None,
            "silent_group_share": float(np.mean(silent[mode])) if silent[mode] else None,
            **{f"fatal_share_{q}_quarter": float(np.mean(fatal)) if fatal else None
               for q, fatal in fatal_by_quarter[mode].items()},
            "tip_hit_rate": float(np.mean(hits[mode])) if hits[mode] and mode != "no_memory" else None,
            "endings_by_quarter": [episode_endings(records) for records in endings_by_quarter[mode]]}
    return out


COMMANDS_RE = re.compile(r"Available commands: (.*?)\.(?:\n|$)")  # the sanity env's command list (envs/sanity.py)


def command_use(records: list[dict]) -> dict:
    """Does the policy write a listed command itself? Over every step of the episode `records` whose observation
    lists the commands: the share whose output, cleaned as the environment cleans it, is one of them ("own"), and the
    share that shares no word with any of them ("no_word"): the environment's action correction then runs the first
    listed command (best_match's tie rule), so the step's action is the command list's order, not the policy's."""
    from envs.base import jaccard  # pure text helpers: no torch, no JVM
    from envs.scienceworld.prompts import clean_action

    steps = own = no_word = 0
    for record in records:
        for observation, action in zip(record["observations"], record["actions"]):
            match = COMMANDS_RE.search(observation)
            if not match:
                continue
            commands, cleaned = [c.strip() for c in match.group(1).split(",")], clean_action(action)
            steps += 1
            own += cleaned in commands
            no_word += cleaned not in commands and max(jaccard(cleaned, c) for c in commands) == 0
    share = lambda n: n / steps if steps else None  # noqa: E731
    return {"steps": steps, "own": share(own), "no_word": share(no_word)}


def episode_endings(records: list[dict]) -> dict:
    """How the episode `records` end: solved ("success"), by a fatal command ("fatal": negative task return),
    with a partial score ("partial": some stages done, the task unsolved, e.g. out of steps before the focus), and
    the share whose policy wrote a focus command at all ("focus": the lab's and garden's last stage, the only command
    besides the bare wire that can end an episode at -100). Records without a task return are not counted."""
    records = [r for r in records if "extrinsic_return" in r]
    if not records:
        return {"episodes": 0, "success": None, "fatal": None, "partial": None, "focus": None}
    from envs.scienceworld.prompts import clean_action

    mean = lambda flags: float(np.mean(flags))  # noqa: E731
    return {"episodes": len(records), "success": mean([bool(r["success"]) for r in records]),
            "fatal": mean([r["extrinsic_return"] < 0 for r in records]),
            "partial": mean([r["extrinsic_return"] > 0 and not r["success"] for r in records]),
            "focus": mean([any(clean_action(a).startswith("focus on") for a in r["actions"]) for r in records])}


def command_use_over_training(out: Path, arm: str, seeds: list[int]) -> dict[str, dict]:
    """command_use and episode_endings of an arm's runs pooled over `seeds`: the untrained model's logged validation
    episodes, the training episodes of the first and of the last quarter, the last validation's logged episodes."""
    stages = {"untrained": [], "first_quarter": [], "last_quarter": [], "final_validation": []}
    for seed in seeds:
        run = out / "runs" / f"{arm}_s{seed}"
        stages["untrained"] += read_jsonl(out / "runs" / f"base_s{seed}" / "episodes" / "evaluation.jsonl")
        iterations = configured_iterations(run)
        for name, file in jsonl_files(run / "episodes", "iter_*").items():
            quarter = training_quarter(int(name.split("_")[1]), iterations)
            if quarter:
                stages[f"{quarter}_quarter"] += read_jsonl(file)
        validations = list(jsonl_files(run / "episodes", "val_*").values())
        stages["final_validation"] += read_jsonl(validations[-1]) if validations else []
    return {stage: {**command_use(records), **episode_endings(records)} for stage, records in stages.items()}


def advantage_key(record: dict, intrinsic: dict) -> tuple[float, float]:
    """What an episode's group-normalised advantage depends on (advantages.episode_advantages): equal keys in a whole
    group = a zero advantage for every episode. The novelty bonus coef * B_i breaks ties on the score (0 where a
    tie class's bonuses are equal). `intrinsic` is the run's own config section: runs recorded before
    intrinsic.combine and intrinsic.aggregate were removed (docs/LOG.md) may have "return" and "mean" there."""
    steps = record.get("intrinsic") or []
    bonus = sum(steps) / len(steps) if steps and intrinsic.get("aggregate") == "mean" else sum(steps)
    bonus *= intrinsic.get("coef", 0.0)
    if intrinsic.get("combine") == "return":
        return round(record["extrinsic_return"] + bonus, 9), 0.0
    return record["extrinsic_return"], round(bonus, 9)


UPDATE_METRICS = ("clip_frac", "masked_frac", "approx_kl", "grad_norm", "entropy", "pos_adv_clip_frac",
                  "pos_adv_masked_frac")


def iteration_seconds(rows: list[dict]) -> dict:
    """Per mode, the median seconds of a training iteration (rollout + tips + update, validation left out) over the
    pooled iterations `rows` (metrics.jsonl records): a median, so the iterations a pause (the grid is SIGSTOPped while
    tests run) stretched do not move it. `weighted_vs_no_memory`: the mode medians weighted by how often each mode ran,
    over the no-memory median (the project's budget: <= 1.15x)."""
    timed = [r for r in rows if "time_update" in r]
    per_mode = {mode: [r["time_rollout"] + r["time_tips"] + r["time_update"] for r in timed if r["mode"] == mode]
                for mode in MODES}
    medians = {mode: float(np.median(t)) if t else None for mode, t in per_mode.items()}
    ratio = None
    if timed and medians["no_memory"]:
        ratio = sum(len(t) * medians[m] for m, t in per_mode.items() if t) / len(timed) / medians["no_memory"]
    return {"median": medians, "iterations": {m: len(t) for m, t in per_mode.items()}, "weighted_vs_no_memory": ratio}


def update_statistics(rows: list[dict]) -> dict[str, dict]:
    """What the objective did with each mode's iterations, pooled over the metrics.jsonl `rows` of an arm's runs: the
    mean over iterations of the share of action tokens whose importance ratio was clipped, the share dropped by
    Eq. 2's low-probability mask, approx KL(old || current), the gradient norm and the policy entropy. With one
    optimizer step per iteration the on-policy ratio is exactly 1 (nothing clipped or masked); off-policy, the ratio
    is pi(a | context without tips) / pi_old(a | context with tips), so these say how much of a distillation update
    survives the clip and the mask; the pos_adv_ shares say it for the positive-advantage tokens alone (the
    tip-guided actions to distil; runs logged before train.py counted them lack them: None)."""
    by_mode = {mode: [row for row in rows if row["mode"] == mode] for mode in MODES}
    mean = lambda values: float(np.mean(values)) if values else None  # noqa: E731
    return {mode: {"iterations": len(mode_rows),
                   **{k: mean([r[k] for r in mode_rows if k in r]) for k in UPDATE_METRICS}}
            for mode, mode_rows in by_mode.items()}


def on_seeds(row: dict, metric: str, seeds: list[int]) -> list[float]:
    """An arm's per-seed `metric` values (row[metric] follows row["seeds"]) for the given seeds, in their order."""
    return [row[metric][row["seeds"].index(s)] for s in seeds]


def summarise(out: Path, seeds: list[int]) -> dict:
    complete = {arm: [s for s in seeds if finished(out, arm, s) and finished(out, "base", s)]  # base: iteration 0
                for arm in SETTING_ARMS[SETTING_NAME]}
    result = {"setting": SETTING, "setting_name": SETTING_NAME, "warmup": WARMUP, "arms": {}, "versus_grpo": {}}
    for arm, arm_seeds in complete.items():
        if not arm_seeds:
            continue
        curves = [curve(out, arm, s) for s in arm_seeds]
        rows = [read_jsonl(out / "runs" / f"{arm}_s{s}" / "metrics.jsonl") for s in arm_seeds]
        per_mode = {}
        for mode in MODES:
            returns = [r["return_mean"] for run in rows for r in run if r["mode"] == mode]
            per_mode[mode] = {"iterations": len(returns), "return_mean": float(np.mean(returns)) if returns else None}
        its = sorted(set.intersection(*(set(c) for c in curves)))
        successes = [curve(out, arm, s, "success_rate") for s in arm_seeds]
        success_its = [i for i in its if all(i in c for c in successes)]
        result["arms"][arm] = {
            "seeds": arm_seeds, "iterations": its,
            "val_return": {str(i): [c[i] for c in curves] for i in its},
            "val_success": {str(i): [c[i] for c in successes] for i in its if all(i in c for c in successes)},
            "final": [c[its[-1]] for c in curves], "auc": [area({i: c[i] for i in its}) for c in curves],
            **({"final_success": [c[success_its[-1]] for c in successes],
                "auc_success": [area({i: c[i] for i in success_its}) for c in successes]}
               if len(success_its) > 1 and success_its[-1] == its[-1] else {}),
            "movement": movement({str(i): [c[i] for c in curves] for i in its}),
            "train_return_per_mode": per_mode,
            "training_signal": training_signal([out / "runs" / f"{arm}_s{s}" for s in arm_seeds]),
            "command_use": command_use_over_training(out, arm, arm_seeds),
            "update_statistics": update_statistics([r for run in rows for r in run]),
            # metrics.jsonl's tips_retrieved is already a mean over the iteration's steps
            "tips_retrieved_per_step": float(np.mean([r["tips_retrieved"] for run in rows for r in run
                                                      if r["mode"] != "no_memory"] or [0.0])),
            "iteration_seconds": iteration_seconds([r for run in rows for r in run]),
            "wall_seconds": [json.loads((out / "runs" / f"{arm}_s{s}" / "done.json").read_text())["wall_seconds"]
                             for s in arm_seeds],
        }
    grpo = result["arms"].get("grpo")
    for arm, row in result["arms"].items():
        if arm == "grpo" or grpo is None:
            continue
        seeds = [s for s in row["seeds"] if s in grpo["seeds"]]  # the same seeds on both sides while the grid runs
        if len(seeds) < 2:
            continue
        result["versus_grpo"][arm] = {"seeds": seeds}
        for metric in ("final", "auc"):
            ours, theirs = on_seeds(row, metric, seeds), on_seeds(grpo, metric, seeds)
            result["versus_grpo"][arm][metric] = {
                "difference": float(np.mean(ours) - np.mean(theirs)), "ci95": bootstrap_ci(ours, theirs),
                "permutation_p": permutation_p(ours, theirs), "welch_t_df": welch_t(ours, theirs)}
    tips = {}
    for source in ("policy", "environment"):
        path = out / "tips" / source / "eval.json"
        if path.exists():
            steps = json.loads(path.read_text())["ood"]["steps"]
            episodes = path.parent / "episodes"  # each round's logged sample: does a tip make it write commands?
            tips[source] = [(s["return_mean"], s.get("success_rate", 0.0),
                             command_use(read_jsonl(episodes / f"ood_step_{i:02d}.jsonl"))["own"])
                            for i, s in enumerate(steps)]
    result["tip_usefulness"] = tips
    if SETTING_NAME in PRIMARY_CONTRASTS:
        result["contrasts"] = paired_contrasts(result, PRIMARY_CONTRASTS[SETTING_NAME])
        result["validity"] = validity_checks(out, result)
    return result


# ------------------------------------------------------------------ the switch grid's registered analysis (issue 49)

def sign_flip_p(differences) -> float:
    """Exact two-sided sign-flip test of mean(d) = 0 for paired differences d: the share of the 2^n sign assignments
    whose |mean| is at least the observed one."""
    d = np.asarray(differences, float)
    flips = np.array(list(itertools.product((1.0, -1.0), repeat=len(d))))
    return float(np.mean(np.abs((flips * d).mean(1)) >= abs(d.mean()) - 1e-12))


def paired_bootstrap_ci(differences, resamples: int = 10_000, seed: int = 0) -> tuple[float, float]:
    """95 % percentile bootstrap CI of mean(d), the seeds (pairs) resampled."""
    d = np.asarray(differences, float)
    means = np.random.default_rng(seed).choice(d, (resamples, len(d))).mean(1)
    low, high = np.percentile(means, [2.5, 97.5])
    return float(low), float(high)


def holm(p_values: list[float]) -> list[float]:
    """Holm-Bonferroni adjusted p-values, in the input order: the k-th smallest times (m - k + 1), made monotone."""
    adjusted, running = [0.0] * len(p_values), 0.0
    for rank, i in enumerate(np.argsort(p_values, kind="stable")):
        running = max(running, min(1.0, (len(p_values) - rank) * p_values[i]))
        adjusted[i] = running
    return adjusted


def paired_contrasts(result: dict, contrasts: list[tuple[str, str]]) -> dict[str, list[dict]]:
    """Per metric (final and area-under-curve validation success), each contrast arm − other on the seeds both have
    finished, paired by seed (both runs of a seed start from the seed's warm-up): the mean difference, its 95 %
    bootstrap CI, the exact sign-flip p, and Holm's adjustment over the contrasts present (registered: three)."""
    out = {}
    for metric in ("final_success", "auc_success"):
        rows = []
        for arm, other in contrasts:
            a, b = result["arms"].get(arm, {}), result["arms"].get(other, {})
            seeds = [s for s in a.get("seeds", []) if s in b.get("seeds", [])]
            if len(seeds) < 2 or metric not in a or metric not in b:
                continue
            d = np.subtract(on_seeds(a, metric, seeds), on_seeds(b, metric, seeds))
            rows.append({"arm": arm, "other": other, "seeds": seeds, "differences": d.tolist(),
                         "difference": float(d.mean()), "ci95": paired_bootstrap_ci(d), "sign_flip_p": sign_flip_p(d)})
        for row, adjusted in zip(rows, holm([r["sign_flip_p"] for r in rows])):
            row["holm_p"] = adjusted
        out[metric] = rows
    return out


def episode_records(run: Path) -> list[tuple[int, dict]]:
    """(iteration, record) for every logged training episode of a run (train.log_episodes=-1 logs them all)."""
    return [(int(name.split("_")[1]), record) for name, file in jsonl_files(run / "episodes", "iter_*").items()
            for record in read_jsonl(file)]


def memory_versus_tip_free(runs: list[Path], window: int = 5) -> dict:
    """Pooled over `runs`: the success rate of the training episodes played with tips (memory iterations), and of the
    tip-free episodes of the no-memory iterations within `window` iterations of a memory iteration (each counted
    once per run), and their ratio (inf when only the memory episodes succeed)."""
    memory, tip_free = [], []
    for run in runs:
        records = episode_records(run)
        memory_its = {it for it, r in records if r["mode"] != "no_memory"}
        near = {it for it, r in records if r["mode"] == "no_memory" and any(abs(it - m) <= window for m in memory_its)}
        memory += [bool(r["success"]) for it, r in records if it in memory_its]
        tip_free += [bool(r["success"]) for it, r in records if it in near]
    rate = lambda flags: float(np.mean(flags)) if flags else None  # noqa: E731
    m, t = rate(memory), rate(tip_free)
    ratio = None if m is None or t is None else (m / t if t > 0 else (math.inf if m > 0 else None))
    return {"memory_episodes": len(memory), "memory_success": m, "tip_free_episodes": len(tip_free),
            "tip_free_success": t, "ratio": ratio}


def validity_checks(out: Path, result: dict) -> dict:
    """The switch grid's registered validity checks (docs/LOG.md), on the runs finished so far: (1) GRPO has >= 85 %
    all-equal groups and a final validation success <= 10 % (mean over seeds); (2) the oracle arm's memory episodes
    succeed >= 20 % and >= 4x the tip-free episodes of nearby iterations (memory_versus_tip_free); (3) >= 30 % of
    its off-policy groups have mixed returns. A check whose arm has no finished run is None."""
    checks = {}
    grpo = result["arms"].get("grpo")
    if grpo:
        flat = grpo["training_signal"]["no_memory"]["flat_group_share"]
        final = float(np.mean(grpo["final_success"])) if "final_success" in grpo else None
        checks["grpo_stalls"] = {"all_equal_groups": flat, "final_success": final,
                                 "passed": flat is not None and final is not None and flat >= 0.85 and final <= 0.10}
    oracle = result["arms"].get("empo2_oracle")
    if oracle:
        mem = memory_versus_tip_free([out / "runs" / f"empo2_oracle_s{s}" for s in oracle["seeds"]])
        checks["memory_finds"] = {**mem, "passed": mem["memory_success"] is not None and mem["ratio"] is not None
                                  and mem["memory_success"] >= 0.20 and mem["ratio"] >= 4.0}
        flat = oracle["training_signal"]["off_policy"]["flat_group_share"]
        checks["off_policy_signal"] = {"groups": oracle["training_signal"]["off_policy"]["groups"],
                                       "mixed_groups": None if flat is None else 1.0 - flat,
                                       "passed": flat is not None and 1.0 - flat >= 0.30}
    return checks


def contrasts_markdown(summary: dict) -> list[str]:
    """The registered analysis's tables: paired contrasts and validity checks (a setting with PRIMARY_CONTRASTS)."""
    pct = lambda v: "-" if v is None else f"{100 * v:.1f} %"  # noqa: E731
    secs = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    lines = ["", "## Registered analysis", "", "Validation success (tip-free, held-out variations): per arm, "
             "mean ± s.e. over seeds; iteration 0 = the seed's warm-up. Cost: the median seconds of a training "
             "iteration per mode (validation left out; a median, so iterations stretched by a pause of the grid do "
             "not move it), and the mode medians weighted by how often each mode ran, over the no-memory median. "
             "Wall per run: done.json, mean over seeds, including the grid's pauses (the cost to compare is the "
             "median).", "",
             "| arm | seeds | final success | area under the curve | s / iteration: no memory / tips / off-policy | "
             "cost vs no memory | wall per run |", "|---|---|---|---|---|---|---|"]
    for arm, row in summary["arms"].items():
        if "final_success" in row:
            (fm, fs), (am, as_) = mean_se(row["final_success"]), mean_se(row["auc_success"])
            cost = row["iteration_seconds"]
            ratio = cost["weighted_vs_no_memory"]
            lines.append(f"| {arm} | {len(row['seeds'])} | {100 * fm:.1f} ± {100 * fs:.1f} % | {100 * am:.1f} ± "
                         f"{100 * as_:.1f} % | " + " / ".join(secs(cost["median"][m]) for m in MODES) + " | "
                         + ("-" if ratio is None else f"{ratio:.2f}x") + f" | {np.mean(row['wall_seconds']) / 60:.1f} min |")
    lines += ["", "Primary contrasts, paired by seed (95 % bootstrap CI of the mean difference, 10,000 resamples; "
              "exact sign-flip p; Holm over the contrasts present):", "",
              "| metric | contrast | seeds | difference | 95 % CI | sign-flip p | Holm p |", "|---|---|---|---|---|---|---|"]
    for metric, rows in summary.get("contrasts", {}).items():
        for r in rows:
            lines.append(f"| {metric} | {r['arm']} − {r['other']} | {len(r['seeds'])} | {100 * r['difference']:+.1f} "
                         f"pp | [{100 * r['ci95'][0]:+.1f}, {100 * r['ci95'][1]:+.1f}] | {r['sign_flip_p']:.3f} | "
                         f"{r['holm_p']:.3f} |")
    checks = summary.get("validity", {})
    lines += ["", "Validity checks (registered):", ""]
    if "grpo_stalls" in checks:
        c = checks["grpo_stalls"]
        lines.append(f"- GRPO stalls (>= 85 % all-equal groups, final success <= 10 %): {pct(c['all_equal_groups'])}"
                     f", {pct(c['final_success'])}: **{'pass' if c['passed'] else 'FAIL'}**")
    if "memory_finds" in checks:
        c = checks["memory_finds"]
        ratio = "-" if c["ratio"] is None else f"{c['ratio']:.1f}x"
        lines.append(f"- Memory finds what the tip-free policy does not (memory episodes >= 20 % and >= 4x the "
                     f"tip-free episodes of iterations within 5): {pct(c['memory_success'])} of "
                     f"{c['memory_episodes']} vs {pct(c['tip_free_success'])} of {c['tip_free_episodes']} ({ratio}): "
                     f"**{'pass' if c['passed'] else 'FAIL'}**")
    if "off_policy_signal" in checks:
        c = checks["off_policy_signal"]
        lines.append(f"- Off-policy groups with mixed returns (>= 30 %): {pct(c['mixed_groups'])} of {c['groups']}: "
                     f"**{'pass' if c['passed'] else 'FAIL'}**")
    return lines


def setting_name(arguments: list[str]) -> str:
    return next((name for name, args in SETTINGS.items() if args == arguments), "unregistered")


def summary_markdown(summary: dict) -> str:
    name = summary.get("setting_name") or setting_name(summary["setting"])
    warmup = summary.get("warmup") or []
    kind = "tip-reading" if any(a.startswith("--tip_share") for a in warmup) else "format"
    start = (f"the model after its seed's {kind} warm-up (tools/warmup.py " + " ".join(warmup) + "), before RL; "
             "\"untrained\" below means this model" if warmup else "the untrained model")
    lines = [f"# EMPO² vs GRPO on the sanity environment (setting `{name}`, registered in "
             f"{REGISTERED_IN.get(name, 'docs/sanity.md')})", "",
             f"Validation = no-memory return on the 8 held-out test variations ({validation_episodes_per_task(summary['setting'])} "
             f"episodes each, temperature 0.4); iteration 0 = {start}. Mean ± standard error over seeds.", ""]
    if "contrasts" in summary:  # the registered analysis first; the tables of the earlier settings' summary after it
        lines += contrasts_markdown(summary)[1:] + ["", "## Diagnostics (not registered for this setting)", ""]
    lines += ["| arm | seeds | final validation return | area under the curve (mean return) | training return "
              "per mode: no memory / on-policy tips / off-policy (iterations) | tips per memory step | wall per run |",
              "|---|---|---|---|---|---|---|"]
    for arm, row in summary["arms"].items():
        (fm, fs), (am, as_) = mean_se(row["final"]), mean_se(row["auc"])
        modes = " / ".join("-" if m["return_mean"] is None else f"{m['return_mean']:.1f} ({m['iterations']})"
                           for m in row["train_return_per_mode"].values())
        lines.append(f"| {arm} | {len(row['seeds'])} | {fm:.1f} ± {fs:.1f} | {am:.1f} ± {as_:.1f} | {modes} | "
                     f"{row['tips_retrieved_per_step']:.2f} | {np.mean(row['wall_seconds']) / 60:.1f} min |")
    lines += ["", "Arm − GRPO on the seeds both have finished (95 % bootstrap CI over seeds, 10,000 resamples; exact "
              "permutation test; Welch's t):", "",
              "| arm | metric | difference | 95 % CI | permutation p | Welch t (df) |", "|---|---|---|---|---|---|"]
    for arm, metrics in summary["versus_grpo"].items():
        for metric, s in metrics.items():
            if metric == "seeds":
                continue
            lines.append(f"| {arm} ({len(metrics['seeds'])} seeds) | {metric} | {s['difference']:+.1f} | [{s['ci95'][0]:+.1f}, {s['ci95'][1]:+.1f}] | "
                         f"{s['permutation_p']:.3f} | {s['welch_t_df'][0]:+.2f} ({s['welch_t_df'][1]:.1f}) |")
    lines += ["", "Training signal per mode (every logged training episode, pooled over seeds): episodes ended by a "
              "fatal command (-100), episodes that reached at least one stage, groups whose episodes all got the "
              "same task return (no task signal: only the novelty bonus can separate them) and, of all groups, those "
              "with a zero advantage for every episode even with the novelty bonus (nothing to learn), steps shown "
              "at least one tip:", "", "| arm | mode | episodes | fatal | fatal: first / last quarter of training | "
              "≥ 1 stage | groups: one task return / zero advantage | tip hit rate |", "|---|---|---|---|---|---|---|---|"]
    share = lambda v: "-" if v is None else f"{100 * v:.0f} %"  # noqa: E731
    for arm, row in summary["arms"].items():
        for mode, sig in row.get("training_signal", {}).items():
            if sig["episodes"]:
                lines.append(f"| {arm} | {mode} | {sig['episodes']} | {share(sig['fatal_share'])} | "
                             f"{share(sig['fatal_share_first_quarter'])} / {share(sig['fatal_share_last_quarter'])} | "
                             f"{share(sig['stage_share'])} | {share(sig['flat_group_share'])} / "
                             f"{share(sig['silent_group_share'])} of {sig['groups']} | "
                             f"{share(sig['tip_hit_rate'])} |")
    lines += ["", "Does the policy write a listed command itself? Share of steps whose output, cleaned as the "
              "environment cleans it, is one of the listed commands (own), and share that shares no word with any "
              "(the environment's action correction then runs the first listed command); the untrained model's and "
              "the last validation's logged episodes, the training episodes of the first and last quarter, pooled "
              "over seeds:", "", "| arm | untrained (validation) | training: first quarter | training: last quarter | "
              "final validation |", "|---|---|---|---|---|"]
    use = lambda u: "-" if u["own"] is None else (  # noqa: E731
        f"{100 * u['own']:.1f} % own, {100 * u['no_word']:.0f} % no word ({u['steps']} steps)")
    stages = ("untrained", "first_quarter", "last_quarter", "final_validation")
    for arm, row in summary["arms"].items():
        if "command_use" in row:
            lines.append(f"| {arm} | " + " | ".join(use(row["command_use"][stage]) for stage in stages) + " |")
    lines += ["", "How the validation episodes end, before RL and at the last validation (the logged episodes, pooled "
              "over seeds): solved / fatal (-100) / partial score (stages done, unsolved) / the policy wrote a focus "
              "command (the last stage; a focus on the wrong lamp is fatal):", "",
              "| arm | before RL: success / fatal / partial / focus | final: success / fatal / partial / focus |",
              "|---|---|---|---|"]
    ending = lambda e: "-" if not e.get("episodes") else (  # noqa: E731
        " / ".join(share(e[k]) for k in ("success", "fatal", "partial", "focus")) + f" ({e['episodes']} episodes)")
    for arm, row in summary["arms"].items():
        if "command_use" in row:
            lines.append(f"| {arm} | {ending(row['command_use']['untrained'])} | "
                         f"{ending(row['command_use']['final_validation'])} |")
    lines += ["", "What the training episodes do over training, per mode (quarters of each run's iterations, pooled "
              "over seeds): the share that wrote a focus command, and the share solved:", "",
              "| arm | mode | wrote a focus: quarter 1 / 2 / 3 / 4 | solved: quarter 1 / 2 / 3 / 4 |",
              "|---|---|---|---|"]
    for arm, row in summary["arms"].items():
        for mode, sig in row.get("training_signal", {}).items():
            quarters = sig.get("endings_by_quarter")
            if sig["episodes"] and quarters:
                lines.append(f"| {arm} | {mode} | " + " / ".join(share(q["focus"]) for q in quarters) + " | "
                             + " / ".join(share(q["success"]) for q in quarters) + " |")
    lines += ["", "The update per mode (mean over the mode's iterations, pooled over seeds): action tokens whose "
              "importance ratio was clipped, tokens dropped by the low-probability mask (Eq. 2), approx KL(old || "
              "new), gradient norm, entropy, and of the positive-advantage tokens alone the shares clipped and masked. "
              "Off-policy, the ratio compares the tip-free policy with the tip-guided one that acted:", "",
              "| arm | mode | iterations | clipped | masked | approx KL | grad norm | entropy | A > 0: clipped / masked |",
              "|---|---|---|---|---|---|---|---|---|"]
    for arm, row in summary["arms"].items():
        for mode, st in row.get("update_statistics", {}).items():
            if st["clip_frac"] is not None:
                lines.append(f"| {arm} | {mode} | {st['iterations']} | {share(st['clip_frac'])} | "
                             f"{share(st['masked_frac'])} | {st['approx_kl']:.3f} | {st['grad_norm']:.3f} | "
                             f"{st['entropy']:.2f} | {share(st['pos_adv_clip_frac'])} / "
                             f"{share(st['pos_adv_masked_frac'])} |")
    if summary["tip_usefulness"]:
        lines += ["", "Tip usefulness: the frozen base model on the training variations (return, success rate, share "
                  "of the logged steps with an own command) per round; round 0 without memory, then with the tips of "
                  "the earlier rounds:", "",
                  "| tips | " + " | ".join(f"round {i}" for i in range(TIP_ROUNDS + 1)) + " |",
                  "|---|" + "---|" * (TIP_ROUNDS + 1)]
        for source, rounds in summary["tip_usefulness"].items():
            lines.append(f"| {source} | " + " | ".join(
                f"{r:.1f} ({s:.2f}, " + ("-" if own is None else f"{100 * own:.0f} % own") + ")"
                for r, s, own in rounds) + " |")
    first = next(iter(summary["arms"].values()), {"iterations": []})
    lines += ["", "Did the validation return move? (registered usability check: each seed's return minus its own "
              "untrained return, mean ± s.e. over seeds; * = more than 2 standard errors from 0)", "",
              "| arm | " + " | ".join(f"iteration {it}" for it in first["iterations"] if it != 0) + " |",
              "|---|" + "---|" * (len(first["iterations"]) - 1)]
    cell = lambda m: f"{m['mean']:+.1f} ± {m['se']:.1f}" + (" *" if m["moved"] else "")  # noqa: E731
    for arm, row in summary["arms"].items():
        cells = [cell(row["movement"][str(it)]) if str(it) in row["movement"] else "-"
                 for it in first["iterations"] if it != 0]
        lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    moved = [f"{arm} (iteration {', '.join(it for it, m in row['movement'].items() if m['moved'])})"
             for arm, row in summary["arms"].items() if any(m["moved"] for m in row["movement"].values())]
    lines += ["", "Arms whose validation return moved: " + (", ".join(moved) or "none") + "."]
    lines += ["", "Validation return per iteration (mean ± s.e.):", "",
              "| iteration | " + " | ".join(summary["arms"]) + " |", "|---|" + "---|" * len(summary["arms"])]
    for it in first["iterations"]:
        cells = [("%.1f ± %.1f" % mean_se(row["val_return"][str(it)])) if str(it) in row["val_return"] else "-"
                 for row in summary["arms"].values()]
        lines.append(f"| {it} | " + " | ".join(cells) + " |")
    lines += ["", "Validation success rate per iteration (share of the validation episodes that solved the task, "
              "mean ± s.e. over seeds; not a registered metric: it says whether the return rose by solving tasks or "
              "only by fewer fatal endings):", "",
              "| iteration | " + " | ".join(summary["arms"]) + " |", "|---|" + "---|" * len(summary["arms"])]
    for it in first["iterations"]:
        cells = [("%.1f ± %.1f %%" % tuple(100 * v for v in mean_se(row["val_success"][str(it)])))
                 if str(it) in row.get("val_success", {}) else "-" for row in summary["arms"].values()]
        lines.append(f"| {it} | " + " | ".join(cells) + " |")
    lines += ["", "Setting (every arm): `" + " ".join(summary["setting"]) + "`; each run's exact command is in "
              "runs/<arm>_s<seed>/command.txt.", ""]
    return "\n".join(lines)


def plot(out: Path, summary: dict) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(17, 4.2))
    colours = ("tab:blue", "tab:orange", "tab:green", "tab:purple", "tab:red", "tab:brown")
    for (arm, row), colour in zip(summary["arms"].items(), colours):
        its = row["iterations"]
        stats = np.array([mean_se(row["val_return"][str(i)]) for i in its])
        left.plot(its, stats[:, 0], "-o", ms=3, c=colour, label=f"{arm} ({len(row['seeds'])} seeds)")
        left.fill_between(its, stats[:, 0] - stats[:, 1], stats[:, 0] + stats[:, 1], color=colour, alpha=0.2)
        logged = [i for i in its if str(i) in row.get("val_success", {})]
        if logged:
            rate = 100 * np.array([mean_se(row["val_success"][str(i)]) for i in logged])
            middle.plot(logged, rate[:, 0], "-o", ms=3, c=colour, label=arm)
            middle.fill_between(logged, rate[:, 0] - rate[:, 1], rate[:, 0] + rate[:, 1], color=colour, alpha=0.2)
            for k in range(len(row["seeds"])):  # each seed, dashed: a mean can hide one seed that learned
                middle.plot(logged, [100 * row["val_success"][str(i)][k] for i in logged], "--", lw=0.9, c=colour,
                            alpha=0.6)
    middle.set(xlabel="training iteration", ylabel="validation success rate (%)",
               title="solved held-out episodes, mean ± s.e. (dashed: each seed)")
    left.set(xlabel="training iteration", ylabel="validation return (no memory)",
             title=f"{summary.get('setting_name') or setting_name(summary['setting'])}: held-out variations, "
                   "mean ± s.e. over seeds")
    left.legend(fontsize=8)
    if "contrasts" in summary:  # the registered paired contrasts, on success (percentage points)
        pairs = {(r["arm"], r["other"]) for rows in summary["contrasts"].values() for r in rows}
        arms = [f"{a} − {b}" for a, b in sorted(pairs)]
        table = {m: {f"{r['arm']} − {r['other']}": {"difference": 100 * r["difference"],
                                                    "ci95": [100 * v for v in r["ci95"]]} for r in rows}
                 for m, rows in summary["contrasts"].items()}
        metrics, label = ("final_success", "auc_success"), "paired difference, success pp (95 % bootstrap CI)"
    else:
        arms, table = list(summary["versus_grpo"]), {m: {a: summary["versus_grpo"][a][m] for a in
                                                         summary["versus_grpo"]} for m in ("final", "auc")}
        metrics, label = ("final", "auc"), "arm − GRPO (95 % bootstrap CI)"
    for k, metric in enumerate(metrics):
        diffs = [table[metric][a] for a in arms]
        x = np.arange(len(arms)) + 0.2 * (2 * k - 1)
        right.errorbar(x, [d["difference"] for d in diffs], fmt="o", capsize=4, label=metric,
                       yerr=np.abs(np.array([d["ci95"] for d in diffs]).T - [d["difference"] for d in diffs]))
    right.axhline(0, c="grey", lw=1)
    right.set_xticks(range(len(arms)), arms, fontsize=8)
    right.set(ylabel=label, title="contrasts")
    right.legend()
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=110)
    plt.close(fig)


def write_summary(out: Path, seeds: list[int]) -> None:
    summary = summarise(out, seeds)
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    (out / "summary.md").write_text(summary_markdown(summary))
    if summary["arms"]:
        plot(out, summary)
    print((out / "summary.md").read_text())


def pending_runs(out: Path, seeds: list[int], arms: list[str]) -> list[tuple[str, int]]:
    """What `run` still has to do, seed-major (every arm of a seed before the next seed), finished runs left out:
    ("warmup", seed) in a setting with a warm-up, ("base", seed), the untrained model's evaluation, then (arm, seed)
    for each arm."""
    names = ["warmup"] * bool(WARMUP) + ["base", *arms]
    return [(name, seed) for seed in seeds for name in names if not finished(out, name, seed)]


def run_grid(out: Path, seeds: list[int], arms: list[str], jobs: int, extra: list[str]) -> list[str]:
    """Every pending run, `jobs` at a time, in pending_runs' order; the summary is rewritten after each. The warm-ups
    go first, all of them (every other run of a seed starts from its warm-up). A failed run does not stop the
    others (but a seed whose warm-up failed runs nothing else); the failures are returned."""
    lock, failures = threading.Lock(), []

    def one(job: tuple[str, int]) -> None:
        name, seed = job
        if SIGNALS["received"]:  # stopping: no new run
            return
        try:
            if name == "warmup":
                warmup_run(out, seed, extra)
            elif WARMUP and not finished(out, "warmup", seed):
                raise RunFailed(f"{name} seed {seed} not started: the seed's warm-up did not finish")
            else:
                base_run(out, seed, extra) if name == "base" else train_run(out, name, seed, extra)
        except RunFailed as error:
            failures.append(str(error))
            print(error, flush=True)
        if name != "warmup":
            with lock:
                write_summary(out, seeds)

    pending = pending_runs(out, seeds, arms)
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        list(pool.map(one, [job for job in pending if job[0] == "warmup"]))
        list(pool.map(one, [job for job in pending if job[0] != "warmup"]))
    return failures


def check_setting(out: Path, name: str) -> None:
    """Bind an output folder to one setting (setting.json, written on first use): runs of two settings never mix in
    one summary. A folder without setting.json but with runs is the first setting's (made before the file existed)."""
    file = out / "setting.json"
    recorded = json.loads(file.read_text())["setting"] if file.exists() else (
        "difficulty2" if (out / "runs").exists() else None)
    if recorded is not None and recorded != name:
        sys.exit(f"{out} holds runs of setting {recorded!r}, not {name!r}; pass --out for a new folder")
    if not file.exists():
        record = {"setting": name, "arguments": SETTINGS[name]} | ({"warmup": WARMUPS[name]} if name in WARMUPS else {})
        file.write_text(json.dumps(record, indent=1) + "\n")


def main(argv: list[str] | None = None) -> None:
    global THREADS, SETTING, SETTING_NAME, WARMUP
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["tips", "run", "summary"])
    parser.add_argument("--setting", choices=list(SETTINGS), default="difficulty2")
    parser.add_argument("--out", help="default: results/comparison (difficulty2), results/comparison_<setting> else")
    parser.add_argument("--seeds", default="0,1,2,3,4")
    parser.add_argument("--arms", help="default: the setting's arms (SETTING_ARMS)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at once (`run`), each with cores // jobs threads")
    args, extra = parser.parse_known_args(argv)
    SETTING, SETTING_NAME, WARMUP = SETTINGS[args.setting], args.setting, WARMUPS.get(args.setting, [])
    default_out = "results/comparison" + ("" if args.setting == "difficulty2" else f"_{args.setting}")
    out, seeds = Path(args.out or default_out).resolve(), [int(s) for s in args.seeds.split(",")]
    arms = args.arms.split(",") if args.arms else SETTING_ARMS[args.setting]
    unknown = [a for a in arms if a not in SETTING_ARMS[args.setting]]
    if unknown:
        sys.exit(f"unknown arm(s) {unknown} for setting {args.setting}; known: {SETTING_ARMS[args.setting]}")
    if args.jobs < 1:
        sys.exit(f"--jobs={args.jobs} must be at least 1")
    if args.jobs > 1:
        THREADS = max(1, (os.cpu_count() or 1) // args.jobs)
    out.mkdir(parents=True, exist_ok=True)
    check_setting(out, args.setting)
    if args.command in ("tips", "run"):
        stop_on_signals()
    failures = []
    if args.command == "tips":
        tip_usefulness(out, extra)
    elif args.command == "run":
        failures = run_grid(out, seeds, arms, args.jobs, extra)
    write_summary(out, seeds)
    if SIGNALS["received"]:
        sys.exit(f"stopped by a signal; `python -m tools.compare {args.command}` resumes where it stopped")
    if failures:
        sys.exit("\n".join(failures))


if __name__ == "__main__":
    main()
