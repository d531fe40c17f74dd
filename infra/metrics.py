"""What a run reports: one record per iteration in metrics.jsonl, TensorBoard (wandb optional), and metrics.png.

* `EpisodeStats` / `episode_metrics`: return, success, length, truncation reasons, tips, novelty of a set of
  episodes (the extrinsic return: what the environment paid, without the novelty bonus).
* `merge_rank_metrics`: one iteration's record from every rank's episodes, update statistics and counts
  (`log_record`: the exchange and the episode log of a training iteration).
* `MetricsLogger`: appends records on the main process; `plot_metrics` draws the PNG from metrics.jsonl.
* `read_wandb_step`: the last iteration a wandb run holds, as the logger recorded it (output_dir/wandb_step).
* `episode_record` / `sample_for_log` / `write_episodes`: a capped, seeded sample of episodes, turn by turn, in
  output_dir/episodes/*.jsonl (what tools/viewer.py shows).
* `UpdateStats`: what train.update logs (means over micro-batches, token counts, optimiser steps taken / skipped).
* `jsonl_text` / `jsonl_files`: what reads those logs back: a run writes plain `x.jsonl`, results/ keeps episode logs
  as `x.jsonl.gz` (`gzip -9 -n`); both read the same (tools/compare.py, tools/viewer.py).

Resume and Weights & Biases. A resumed run (`start > 1`) re-runs the iterations after its checkpoint. metrics.jsonl and
TensorBoard drop the interrupted run's rows of iterations >= start, so they hold the re-run's. A wandb run's history
cannot be rewritten (its steps only increase; a rewind, `wandb.init(resume_from=...)`, is a private-preview server
feature), so the logger continues the run under its saved id (output_dir/wandb_run_id) and sends wandb only the
iterations it does not hold yet: every iteration once, logged live. An iteration the interrupted run logged after its
last checkpoint keeps that run's row in wandb; the re-run (the same numbers, as a resume is exact, timing fields aside;
docs/decisions.md, Reproducibility) is not sent again. What wandb holds is what the logger last sent it, written after
each wandb.log to output_dir/wandb_step ({"run_id", "step"}), since an offline run cannot ask the server. Rows wandb
lacks (a resume that turns wandb on, or back on after resumes without it) are sent from metrics.jsonl first.
"""
from __future__ import annotations

import gzip
import json
import math
import random
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from config import MODES, Config, to_dict

TRUNCATION_REASONS = ("steps", "context", "env_error")


@dataclass
class EpisodeStats:
    """The fields the metrics need, small and picklable, for gathering across ranks."""

    extrinsic_return: float
    success: bool
    num_actions: int
    truncated: str
    tips_retrieved: list[int]
    intrinsic: list[float]
    intrinsic_return: float = 0.0  # what the novelty bonus was worth (coef x B_i)
    corrected: int = 0  # actions the environment had to correct or penalised (not executable as written)

    @classmethod
    def of(cls, ep, intrinsic_return: float = 0.0) -> "EpisodeStats":
        """ep: a rollout.Episode; intrinsic_return: coef x B_i (log_record)."""
        return cls(ep.extrinsic_return, ep.success, ep.num_actions, ep.truncated, list(ep.tips_retrieved),
                   list(ep.intrinsic), intrinsic_return, sum(ep.corrected))


def episode_metrics(episodes: list[EpisodeStats], memory=None) -> dict:
    returns = [ep.extrinsic_return for ep in episodes]
    n = max(len(episodes), 1)
    out = {
        "return_mean": float(np.mean(returns)) if returns else 0.0,
        "return_std": float(np.std(returns)) if returns else 0.0,
        "success_rate": sum(ep.success for ep in episodes) / n,
        "episode_length": float(np.mean([ep.num_actions for ep in episodes])) if episodes else 0.0,
        "truncation_rate": sum(bool(ep.truncated) for ep in episodes) / n,
        "episodes": float(len(episodes)),
    }
    for reason in TRUNCATION_REASONS:
        out[f"truncated_{reason}"] = sum(ep.truncated == reason for ep in episodes) / n
    steps = [k for ep in episodes for k in ep.tips_retrieved]
    out["tips_retrieved"] = float(np.mean(steps)) if steps else 0.0
    out["tip_hit_rate"] = float(np.mean([k > 0 for k in steps])) if steps else 0.0  # steps shown >= 1 tip
    actions = sum(ep.num_actions for ep in episodes)
    out["action_corrected_rate"] = sum(ep.corrected for ep in episodes) / actions if actions else 0.0
    bonus = [b for ep in episodes for b in ep.intrinsic]
    out["intrinsic_mean"] = float(np.mean(bonus)) if bonus else 0.0  # per step
    out["intrinsic_return_mean"] = float(np.mean([ep.intrinsic_return for ep in episodes])) if episodes else 0.0
    if memory is not None:
        out["memory_size"] = float(memory.size())
    return out


# Update statistics that are counts (summed over ranks) and ones that are equal on all ranks or maxima.
# loss: each rank holds its part of the mean; old_logp_tokens: its own forward positions
SUMMED_KEYS = ("samples", "train_steps", "action_tokens", "loss", "old_logp_tokens", "pos_adv_tokens")
MAX_KEYS = ("ratio_max", "optimizer_steps", "skipped_updates")  # optimiser steps are global: equal on all ranks


def merge_rank_metrics(parts: list[tuple[list[EpisodeStats], dict, dict]], memory=None) -> dict:
    """parts: one (episode stats, update statistics, counts) per rank -> one flat record; counts (tips written,
    episodes excluded, ...) are summed over ranks."""
    record = episode_metrics([ep for episodes, _, _ in parts for ep in episodes], memory)
    for key in parts[0][1]:
        values = [stats[key] for _, stats, _ in parts]
        if key in SUMMED_KEYS:
            record[key] = float(sum(values))
        elif key in MAX_KEYS:
            record[key] = float(max(values))
        else:
            record[key] = float(np.mean(values))
    for key in parts[0][2]:
        record[key] = float(sum(counts[key] for _, _, counts in parts))
    return record


def log_record(cfg: Config, accelerator, memory, out_dir: Path, seeds, mode: str, episodes, counts: dict,
               update_metrics: dict, clock) -> dict:
    """One training iteration's metrics row (train.py) from one exchange (every rank's episodes, update statistics
    and counts); with train.log_episodes a seeded sample (`seeds.log`, infra.runtime.Seeds) of this rank's episodes,
    turn by turn, for tools/viewer.py."""
    from infra.runtime import gather_objects  # here: the log readers (tools/compare, viewer) need no torch

    times = clock.lap("time_update")
    if cfg.train.log_episodes:  # a crashed episode with its partial return
        records = [episode_record(ep) for ep in episodes]
        write_episodes(out_dir / "episodes" / f"iter_{seeds.iteration:06d}_rank{seeds.rank}.jsonl",
                       sample_for_log(records, cfg.train.log_episodes, seeds.log))
    stats = [EpisodeStats.of(ep, cfg.intrinsic.coef * sum(ep.intrinsic)) for ep in episodes]
    parts = gather_objects(accelerator, (stats, update_metrics, counts))
    return {"iteration": seeds.iteration, "mode": mode, **merge_rank_metrics(parts, memory), **times}


def _iteration(line: str) -> float:
    """The iteration of a metrics.jsonl line; infinity for a torn line (a crash in the middle of a write)."""
    try:
        return json.loads(line)["iteration"]
    except (ValueError, KeyError, TypeError):
        return math.inf


def read_wandb_step(out_dir: Path, run_id: str) -> int | None:
    """The last iteration the logger sent to wandb run `run_id` (output_dir/wandb_step); None when unrecorded."""
    try:
        saved = json.loads((out_dir / "wandb_step").read_text())
    except (OSError, ValueError):
        return None
    return saved["step"] if isinstance(saved, dict) and saved.get("run_id") == run_id else None


class MetricsLogger:
    """metrics.jsonl + TensorBoard (+ optional wandb) on the main process; a no-op elsewhere."""

    def __init__(self, out_dir: Path, cfg: Config, enabled: bool, start: int = 1):
        """start > 1 (a resume): rows of iterations >= start, written after the checkpoint by the interrupted run,
        are dropped from metrics.jsonl and TensorBoard; a wandb run continues under its saved id and gets only the
        iterations it does not hold (the module docstring)."""
        self.enabled, self.path, self.tb, self.wandb = enabled, out_dir / "metrics.jsonl", None, None
        self.out_dir, self.wandb_step = out_dir, 0  # the last iteration the wandb run holds
        if not enabled:
            return
        kept: list[str] = []
        if start > 1 and self.path.exists():
            kept = [line for line in self.path.read_text().splitlines() if _iteration(line) < start]
            tmp = self.path.with_suffix(".tmp")
            tmp.write_text("".join(line + "\n" for line in kept))
            tmp.replace(self.path)
        if cfg.train.tensorboard:
            from torch.utils.tensorboard import SummaryWriter

            self.tb = SummaryWriter(str(out_dir / "tb"), purge_step=start if start > 1 else None)
        if cfg.train.wandb_project:
            import wandb  # optional dependency

            id_file = out_dir / "wandb_run_id"
            run_id = id_file.read_text().strip() if start > 1 and id_file.exists() else None
            self.wandb = wandb.init(project=cfg.train.wandb_project, config=to_dict(cfg), dir=str(out_dir),
                                    id=run_id, resume="allow" if run_id else None)
            id_file.write_text(self.wandb.id)
            if run_id:  # no record (a run directory from before wandb_step): it logged every row live, up to the crash
                held = read_wandb_step(out_dir, run_id)
                self.wandb_step = start - 1 if held is None else held
            if self.wandb_step >= start:
                print(f"wandb run {self.wandb.id} already holds iterations {start}..{self.wandb_step} (logged by the "
                      f"interrupted run); they are kept and not sent again", flush=True)
            for line in kept:  # what wandb lacks from before the checkpoint
                if _iteration(line) > self.wandb_step:
                    self._to_wandb(json.loads(line))

    def log(self, record: dict) -> None:
        if not self.enabled:
            return
        with open(self.path, "a") as f:
            f.write(json.dumps(record) + "\n")
        step = record["iteration"]
        if self.tb:
            for key, value in record.items():
                if isinstance(value, (int, float)) and key != "iteration" and math.isfinite(value):
                    self.tb.add_scalar(key, value, step)
            if "mode" in record:
                self.tb.add_scalar(f"by_mode/{record['mode']}/return_mean", record.get("return_mean", 0.0), step)
            self.tb.flush()
        if self.wandb and step > self.wandb_step:
            self._to_wandb(record)

    def _to_wandb(self, record: dict) -> None:
        """Log one row at step = its iteration, then record that wandb holds it (after: a crash in between can
        only make a resume send the row again, which an online run drops, never leave a hole)."""
        step = record["iteration"]
        self.wandb.log({k: v for k, v in record.items() if isinstance(v, (int, float))}, step=step)
        self.wandb_step = step
        tmp = self.out_dir / "wandb_step.tmp"
        tmp.write_text(json.dumps({"run_id": self.wandb.id, "step": step}))
        tmp.replace(self.out_dir / "wandb_step")

    def close(self, exit_code: int = 0) -> None:
        """Close TensorBoard and finish the wandb run (exit_code != 0: marked failed, as after a crash)."""
        if self.tb:
            self.tb.close()
            self.tb = None
        if self.wandb:
            self.wandb.finish(exit_code=exit_code)
            self.wandb = None


def episode_record(ep, ret: float | None = None) -> dict:
    """An episode turn by turn, as the trajectory viewer (tools/viewer.py) shows it: the observation before each action,
    the tip block in that step's prompt, the action and its reward; the final observation and the tip written
    afterwards. ret: the return its advantage used (default: what the environment paid)."""
    return {"task": ep.task.key, "group": ep.group, "mode": ep.mode, "seed": ep.seed,
            "return": ep.extrinsic_return if ret is None else ret, "extrinsic_return": ep.extrinsic_return,
            "success": ep.success, "truncated": ep.truncated, "observations": ep.observations,
            "tips_shown": ep.tips_shown, "actions": ep.actions, "rewards": ep.rewards, "intrinsic": ep.intrinsic,
            "corrected": ep.corrected, "final_observation": ep.final_observation, "tip": ep.tip}


def sample_for_log(records: list[dict], cap: int, seed: int) -> list[dict]:
    """At most `cap` records (-1: all), a seeded sample in their original order: logs stay small, and drawing the
    sample never touches a random stream the run uses."""
    if cap < 0 or len(records) <= cap:
        return list(records)
    keep = sorted(random.Random(seed).sample(range(len(records)), cap))
    return [records[i] for i in keep]


def write_episodes(path: Path, records: list[dict]) -> None:
    """One JSON line per episode record (`episode_record`)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(json.dumps(r) + "\n" for r in records))
    tmp.replace(path)


def jsonl_text(path: Path, errors: str = "strict") -> str | None:
    """The text of the JSON-lines file `path` (x.jsonl), or of its gzip-compressed copy x.jsonl.gz where only that
    exists (`path` may name either form; the plain file, what a run writes, wins where both do); None where neither
    exists. `errors`: how undecodable bytes are handled (str.decode)."""
    plain = Path(path).with_name(Path(path).name.removesuffix(".gz"))
    for candidate, compressed in ((plain, False), (plain.with_name(plain.name + ".gz"), True)):
        if candidate.is_file():
            data = candidate.read_bytes()
            return (gzip.decompress(data) if compressed else data).decode("utf-8", errors)
    return None


def jsonl_files(folder: Path, pattern: str = "*") -> dict[str, Path]:
    """{name: file} of the JSON-lines files in `folder` whose name without .jsonl or .jsonl.gz matches the glob
    `pattern`, sorted by name; one file per name, the plain one where both forms exist."""
    found = {}
    for suffix in (".jsonl.gz", ".jsonl"):  # the plain form last: it wins
        found.update({path.name.removesuffix(suffix): path for path in Path(folder).glob(pattern + suffix)})
    return dict(sorted(found.items()))


def plot_metrics(metrics_path: Path, png_path: Path) -> None:
    """Return per iteration (coloured by mode) and validation return, as a PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in metrics_path.read_text().splitlines() if line.strip()]
    if not rows:
        return
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for mode, colour in zip(MODES, ("tab:blue", "tab:green", "tab:orange")):
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


class Clock:
    """Timings: `lap(key)` = seconds since `start` or the last lap (laps in train.play, train.sync_memory, log_record)."""

    def start(self) -> None:
        self.last, self.laps = time.perf_counter(), {}

    def lap(self, key: str) -> dict:
        now = time.perf_counter()
        self.laps[key], self.last = now - self.last, now
        return self.laps


# ----------------------------------------------------------------------------- the update's row


TOKEN_COUNTS = ("action_tokens", "pos_adv_tokens", "pos_adv_clipped", "pos_adv_masked")  # summed, not averaged


class UpdateStats:
    """What train.update logs for this rank: losses.samples_loss's metrics averaged over the samples of the finite
    micro-batches (token counts summed), the shares of positive-advantage tokens clipped / masked, optimiser steps
    taken and skipped, and `loss`: this rank's part of the mean mini-batch loss (the ranks' parts add up to it,
    SUMMED_KEYS). `samples`: the samples this rank made (ranks add up to the iteration's)."""

    def __init__(self, samples: list):
        self.made, self.sums, self.weight, self.ratio_max = samples, {}, 0.0, 0.0
        self.minibatch_loss, self.loss_sum, self.grad_norms = 0.0, 0.0, []
        self.steps = self.skipped = self.padding_passes = self.pad = self.positions = 0

    def padding(self, pad: int, positions: int) -> None:
        self.pad, self.positions = self.pad + pad, self.positions + positions

    def micro_batch(self, micro: list, loss, metrics: dict) -> None:
        """One forward/backward; `micro` = [] for a zero-weight padding pass."""
        self.padding_passes += not micro
        if not micro or not math.isfinite(loss.item()):
            return
        for key, value in metrics.items():  # means weighted by samples; token counts summed
            self.sums[key] = self.sums.get(key, 0.0) + value * (1 if key in TOKEN_COUNTS else len(micro))
        self.minibatch_loss += loss.item()
        self.ratio_max = max(self.ratio_max, metrics["ratio_max"])
        self.weight += len(micro)

    def optimizer_step(self, stepped: bool, grad_norm: float) -> None:
        if stepped:
            self.steps, self.loss_sum = self.steps + 1, self.loss_sum + self.minibatch_loss
            self.grad_norms.append(grad_norm)
        else:
            self.skipped += 1
        self.minibatch_loss = 0.0

    def result(self) -> dict:
        out = {key: value / max(self.weight, 1.0) for key, value in self.sums.items() if key not in TOKEN_COUNTS}
        positive = self.sums.get("pos_adv_tokens", 0.0)
        out.update(pos_adv_tokens=positive,
                   pos_adv_clip_frac=self.sums.get("pos_adv_clipped", 0.0) / max(positive, 1.0),
                   pos_adv_masked_frac=self.sums.get("pos_adv_masked", 0.0) / max(positive, 1.0))
        out.update(loss=self.loss_sum / max(self.steps, 1), ratio_max=self.ratio_max, optimizer_steps=float(self.steps),
                   skipped_updates=float(self.skipped),
                   grad_norm=float(np.mean(self.grad_norms)) if self.grad_norms else 0.0,
                   samples=float(len(self.made)), train_steps=float(sum(s.steps for s in self.made)),
                   action_tokens=self.sums.get("action_tokens", 0.0), padding_frac=self.pad / max(self.positions, 1),
                   padding_passes=float(self.padding_passes))
        return out
