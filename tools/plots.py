"""Paper-style figures from finished runs: EMPO² against GRPO, several seeds per method.

    python -m tools.plots --runs EMPO2=DIR[,DIR...] GRPO=DIR[,DIR...] [--ood LABEL=EVAL_JSON[,EVAL_JSON...] ...] --out OUTDIR

* learning_curves.png (the paper's Fig. 1a / Fig. 3: return against training iteration, EMPO² over GRPO), from
  each run folder's metrics.jsonl. Left: training return per iteration, one colour per label, the mean over the
  label's runs as a line and the min-max over them as a band; every run's own points are drawn too, their marker
  shape giving the iteration's mode (circle: no memory, triangle: on-policy with tips, square: off-policy), so the
  iterations played with memory stand out. Right: validation return (no memory), mean and min-max band.
* ood_adaptation.png (the paper's Fig. 8), only with --ood: a frozen model on a new task, step 0 without memory,
  step s >= 1 with the tips of earlier steps (eval.py --ood writes `ood` into eval.json). One line per label: the
  mean return per step (the mean of the files' means), error bars ± std across the files (one file: ± std across
  its episodes). A star marks the best step (highest mean among steps >= 1, as eval.adapt_with_memory chooses it,
  here on the label's mean curve); the legend gives its gain over step 0, absolute and relative to |step 0|.

Runs may differ in length and may lack validation rows. Bad input (a missing folder or metrics.jsonl, an eval.json
without `ood`, a malformed LABEL=PATH) stops the command with one line and exit code 2, before anything is written.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.ticker import MaxNLocator

COLOURS = ("tab:orange", "tab:blue", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink", "tab:olive")
MODE_MARKERS = {"no_memory": ("o", "no memory"), "on_policy_tips": ("^", "on-policy with tips"),
                "off_policy": ("s", "off-policy (tips removed at update)")}
FONT = 12


class PlotInputError(ValueError):
    """An input the figures cannot be drawn from; the message names the file or argument."""


def read_metrics(run_dir: Path) -> list[dict]:
    """The records of a run's metrics.jsonl; a torn last line (a crash in the middle of a write) is skipped."""
    run_dir = Path(run_dir)
    path = run_dir / "metrics.jsonl"
    if not run_dir.is_dir():
        raise PlotInputError(f"no such run folder: {run_dir}")
    if not path.is_file():
        raise PlotInputError(f"{run_dir} has no metrics.jsonl")
    lines = [line for line in path.read_text().splitlines() if line.strip()]
    rows = []
    for number, line in enumerate(lines, 1):
        try:
            row = json.loads(line)
            float(row["iteration"]), float(row["return_mean"])
        except (ValueError, KeyError, TypeError):
            if number == len(lines):
                break
            raise PlotInputError(f"{path}:{number} is not a metrics record (no iteration / return_mean)") from None
        rows.append(row)
    if not rows:
        raise PlotInputError(f"{path} has no records")
    return rows


def read_ood(eval_json: Path) -> list[dict]:
    """The adaptation steps of an eval.json written by eval.py --ood: [{"step", "return_mean", "return_std"}, ...]."""
    eval_json = Path(eval_json)
    if not eval_json.is_file():
        raise PlotInputError(f"no such file: {eval_json}")
    try:
        result = json.loads(eval_json.read_text())
    except ValueError:
        raise PlotInputError(f"{eval_json} is not JSON") from None
    if not isinstance(result, dict) or "ood" not in result:
        raise PlotInputError(f"{eval_json} has no `ood` field (eval.py writes it with --ood)")
    steps = result["ood"].get("steps") if isinstance(result["ood"], dict) else None
    if not isinstance(steps, list) or not steps or not all(
            isinstance(s, dict) and isinstance(s.get("step"), int) and isinstance(s.get("return_mean"), (int, float))
            for s in steps):
        raise PlotInputError(f"{eval_json}: `ood` has no list of steps with a step and a return_mean each")
    if min(s["step"] for s in steps) != 0:
        raise PlotInputError(f"{eval_json}: `ood` has no step 0 (the return without memory)")
    return steps


def across_runs(series: list[dict[float, float]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """x (the union over the runs), and per x the mean, min and max over the runs that have a value there."""
    xs = sorted(set().union(*series))
    values = [[run[x] for run in series if x in run] for x in xs]
    return (np.array(xs), np.array([np.mean(v) for v in values]), np.array([min(v) for v in values]),
            np.array([max(v) for v in values]))


def count(n: int, noun: str) -> str:
    return f"{n} {noun}{'s' if n != 1 else ''}"


def learning_curve_figure(runs: dict[str, list[Path]]) -> Figure:
    """Training return (markers by mode) and validation return per iteration, one colour per label."""
    fig = Figure(figsize=(14, 5.6), layout="constrained")
    train_ax, val_ax = fig.subplots(1, 2)
    modes_seen = set()
    label_handles, val_handles = [], []
    for index, (label, dirs) in enumerate(runs.items()):
        colour, records = COLOURS[index % len(COLOURS)], [read_metrics(d) for d in dirs]
        dodge = 0.08 * (index - (len(runs) - 1) / 2)  # labels' points side by side: equal returns stay visible
        for rows in records:  # every run's own points, marker shape = mode; memory iterations drawn larger
            for mode in sorted({r.get("mode", "no_memory") for r in rows}):
                modes_seen.add(mode)
                points = [(r["iteration"] + dodge, r["return_mean"]) for r in rows
                          if r.get("mode", "no_memory") == mode]
                memory = mode != "no_memory"
                train_ax.scatter(*zip(*points), marker=MODE_MARKERS.get(mode, ("X", mode))[0], color=colour,
                                 s=80 if memory else 24, edgecolors="black" if memory else "none",
                                 alpha=0.95 if memory else 0.6, zorder=3)
        its, mean, low, high = across_runs([{r["iteration"]: r["return_mean"] for r in rows} for rows in records])
        train_ax.plot(its, mean, "-", lw=2.2, color=colour, zorder=2)
        if len(records) > 1:
            train_ax.fill_between(its, low, high, color=colour, alpha=0.18, lw=0)
        label_handles.append(Line2D([], [], color=colour, lw=2.2, label=f"{label} (mean of {count(len(records), 'seed')})"))

        val = [{r["iteration"]: r["val_return_mean"] for r in rows if "val_return_mean" in r} for rows in records]
        val = [v for v in val if v]
        if not val:
            val_handles.append(Line2D([], [], color=colour, lw=2.2, label=f"{label} (no validation points)"))
            continue
        its, mean, low, high = across_runs(val)
        val_ax.plot(its, mean, "-o", lw=2.2, ms=6, color=colour, zorder=2)
        if len(val) > 1:
            val_ax.fill_between(its, low, high, color=colour, alpha=0.18, lw=0)
        val_handles.append(Line2D([], [], color=colour, lw=2.2, marker="o",
                                  label=f"{label} (mean of {count(len(val), 'seed')})"))

    if not val_ax.lines:
        val_ax.text(0.5, 0.5, "no validation points", transform=val_ax.transAxes, ha="center", va="center",
                    fontsize=FONT + 2, color="grey")
    for ax, handles, title in ((train_ax, label_handles, "Training return per iteration"),
                               (val_ax, val_handles, "Validation return, no memory")):
        ax.set_title(f"{title}\n(line: mean over seeds, band: min-max over seeds)", fontsize=FONT + 1)
        ax.set_xlabel("iteration", fontsize=FONT)
        ax.set_ylabel("return", fontsize=FONT)
        ax.tick_params(labelsize=FONT - 1)
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(handles=handles, fontsize=FONT - 1, loc="upper center", bbox_to_anchor=(0.5, -0.13),
                  ncol=min(len(handles), 2), frameon=False)  # below the axes: never over a data point
    mode_handles = [Line2D([], [], marker=MODE_MARKERS.get(m, ("X", m))[0], ls="none", color="dimgrey", ms=8,
                           label=f"iteration played: {MODE_MARKERS.get(m, ('X', m))[1]}")
                    for m in list(MODE_MARKERS) + sorted(modes_seen - set(MODE_MARKERS))]
    fig.legend(handles=mode_handles, loc="outside lower center", ncol=len(mode_handles), fontsize=FONT - 1,
               title_fontsize=FONT - 1, title="training points, one per run and iteration: marker = the "
               "iteration's mode (memory modes drawn larger)")
    fig.suptitle(" vs ".join(runs) + ": learning curves", fontsize=FONT + 3)
    return fig


def ood_summary(files: list[Path]) -> dict:
    """One label's adaptation curve: steps, mean return (mean of the files' means), error bar (std across files;
    one file: its episodes' std), and the best step >= 1 of the mean curve with its gain over step 0."""
    curves = [{s["step"]: (s["return_mean"], s.get("return_std", 0.0)) for s in read_ood(f)} for f in files]
    steps, mean, _, _ = across_runs([{k: v[0] for k, v in c.items()} for c in curves])
    if len(curves) == 1:
        spread = np.array([curves[0][s][1] for s in steps])
    else:
        # sample std (ddof 1): with 2-3 seeds the population std would understate the spread by 1.2-1.4x
        spread = np.array([np.std(v, ddof=1) if len(v) > 1 else 0.0
                           for v in ([c[s][0] for c in curves if s in c] for s in steps)])
    later = [i for i, s in enumerate(steps) if s >= 1]
    best = max(later, key=lambda i: mean[i]) if later else 0  # first of equal maxima, as eval.py's max()
    step0 = float(mean[0])
    gain = float(mean[best]) - step0
    return {"steps": steps, "mean": mean, "spread": spread, "best_step": int(steps[best]),
            "best_return": float(mean[best]), "best_gain": gain, "best_gain_relative": gain / abs(step0) if step0
            else None, "files": len(curves)}


def ood_legend(label: str, summary: dict) -> str:
    """e.g. "EMPO² (3 runs; best step 8: +18.7, +137 %)"."""
    relative = summary["best_gain_relative"]
    gain = f"{summary['best_gain']:+.1f}" + (f", {100 * relative:+.0f} %" if relative is not None else "")
    return f"{label} ({count(summary['files'], 'run')}; best step {summary['best_step']}: {gain})"


def ood_figure(results: dict[str, list[Path]]) -> Figure:
    """Mean return per adaptation step with error bars, one line per label, the best step starred."""
    fig = Figure(figsize=(9, 7), layout="constrained")
    ax = fig.subplots()
    handles, all_steps = [], set()
    for index, (label, files) in enumerate(results.items()):
        colour, summary = COLOURS[index % len(COLOURS)], ood_summary(files)
        dodge = 0.06 * (index - (len(results) - 1) / 2)  # labels side by side: error bars do not hide each other
        bars = ax.errorbar(summary["steps"] + dodge, summary["mean"], yerr=summary["spread"], fmt="-o", lw=2, ms=6,
                           capsize=4, color=colour, label=ood_legend(label, summary))
        ax.plot([summary["best_step"] + dodge], [summary["best_return"]], marker="*", ms=20, color=colour,
                mec="black", ls="none", zorder=4)
        handles.append(bars)
        all_steps |= set(summary["steps"].tolist())
    handles.append(Line2D([], [], marker="*", ms=14, color="white", mec="black", ls="none",
                          label="best step (highest mean, step ≥ 1)"))
    ax.set_xlabel("adaptation step (0 = no memory; weights frozen)", fontsize=FONT)
    ax.set_ylabel("return", fontsize=FONT)
    ax.set_title("OOD adaptation with memory (paper Fig. 8)\nmean return; error bars ± std across runs "
                 "(one run: across its episodes)", fontsize=FONT + 1)
    ax.tick_params(labelsize=FONT - 1)
    if len(all_steps) <= 25:
        ax.set_xticks(sorted(all_steps))  # every step labelled (the points are dodged off the integers)
    else:
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.grid(alpha=0.3)
    ax.legend(handles=handles, fontsize=FONT - 1, loc="upper center", bbox_to_anchor=(0.5, -0.13), frameon=False,
              title="label (gain of the best step over step 0)", title_fontsize=FONT - 1)
    return fig


def learning_curves(runs: dict[str, list[Path]], png: Path) -> Path:
    """Draw learning_curve_figure(runs) into `png`; returns the path."""
    return save(learning_curve_figure(runs), png)


def ood_curves(results: dict[str, list[Path]], png: Path) -> Path:
    """Draw ood_figure(results) into `png`; returns the path."""
    return save(ood_figure(results), png)


def save(fig: Figure, png: Path) -> Path:
    png = Path(png)
    png.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(png, dpi=110)
    return png


def parse_groups(specs: list[str], option: str) -> dict[str, list[Path]]:
    """["EMPO2=a,b", "GRPO=c"] -> {"EMPO2": [a, b], "GRPO": [c]}."""
    groups = {}
    for spec in specs:
        label, sep, paths = spec.partition("=")
        if not sep or not label or not paths.strip(","):
            raise PlotInputError(f"{option} {spec!r}: expected LABEL=PATH[,PATH...]")
        if label in groups:
            raise PlotInputError(f"{option}: label {label!r} given twice")
        groups[label] = [Path(p) for p in paths.split(",") if p]
    return groups


class OneLineParser(argparse.ArgumentParser):
    def error(self, message):
        print(f"{self.prog}: error: {message}", file=sys.stderr)
        sys.exit(2)


def main(argv: list[str] | None = None) -> list[Path]:
    parser = OneLineParser(prog="python -m tools.plots", description=__doc__.splitlines()[0])
    parser.add_argument("--runs", nargs="+", action="extend", default=[], metavar="LABEL=DIR[,DIR...]",
                        help="run folders (with metrics.jsonl) per label, e.g. EMPO2=runs/e_s0,runs/e_s1")
    parser.add_argument("--ood", nargs="+", action="extend", default=[], metavar="LABEL=EVAL_JSON[,EVAL_JSON...]",
                        help="eval.json files written by eval.py --ood, per label")
    parser.add_argument("--out", type=Path, required=True, help="folder for the PNGs")
    args = parser.parse_args(argv)
    try:
        runs, ood = parse_groups(args.runs, "--runs"), parse_groups(args.ood, "--ood")
        if not runs and not ood:
            raise PlotInputError("nothing to plot: give --runs and/or --ood")
        for path in (p for paths in runs.values() for p in paths):  # check every input before writing anything
            read_metrics(path)
        for path in (p for paths in ood.values() for p in paths):
            read_ood(path)
        written = []
        if runs:
            written.append(learning_curves(runs, args.out / "learning_curves.png"))
        if ood:
            written.append(ood_curves(ood, args.out / "ood_adaptation.png"))
    except (ValueError, OSError) as err:  # PlotInputError is a ValueError; an unreadable file is an OSError
        parser.error(str(err))
    for path in written:
        print(f"wrote {path}")
    return written


if __name__ == "__main__":
    main()
