"""tools/plots.py on real data: learning curves from the committed sanity runs (results/sanity/runs), OOD adaptation curves
from hand-made eval.json files whose best step and gain are known, and the CLI's one-line errors (exit code 2)."""
import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from tools import plots

ROOT = Path(__file__).resolve().parents[1]
SANITY = ROOT / "results" / "sanity" / "runs"


def png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the PNG header; fails on anything that is not a PNG."""
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR", f"{path} is not a PNG"
    return struct.unpack(">II", head[16:24])


def legend_texts(fig) -> list[str]:
    legends = fig.legends + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return [text.get_text() for legend in legends for text in legend.get_texts()]


def sanity_runs() -> dict[str, list[Path]]:
    return {"EMPO2": sorted(SANITY.glob("empo2_s*")), "GRPO": sorted(SANITY.glob("grpo_s*"))}


def test_learning_curves_from_the_sanity_runs(tmp_path):
    runs = sanity_runs()
    assert len(runs["EMPO2"]) == len(runs["GRPO"]) == 3
    png = plots.learning_curves(runs, tmp_path / "learning_curves.png")
    width, height = png_size(png)
    assert 1000 <= width <= 3000 and 400 <= height <= 1500 and png.stat().st_size > 20_000

    fig = plots.learning_curve_figure(runs)
    train_ax, val_ax = fig.axes
    for ax in (train_ax, val_ax):
        assert ax.get_xlabel() == "iteration" and ax.get_ylabel() == "return" and ax.get_title()
    texts = legend_texts(fig)
    for label in ("EMPO2", "GRPO"):
        assert texts.count(f"{label} (mean of 3 seeds)") == 2  # one legend per panel
    # EMPO2 seed 0 played iteration 3 off-policy and seed 2 iteration 5 on-policy with tips: both modes are named
    assert any("off-policy" in t for t in texts) and any("on-policy with tips" in t for t in texts)
    # the validation mean at iteration 6 is the mean over seeds of each run's val_return_mean there
    finals = [json.loads(line)["val_return_mean"] for run in runs["EMPO2"]
              for line in (run / "metrics.jsonl").read_text().splitlines() if json.loads(line)["iteration"] == 6]
    x, y = val_ax.lines[0].get_data()
    assert x[-1] == 6 and y[-1] == pytest.approx(sum(finals) / 3)


def test_runs_of_different_lengths_and_without_validation(tmp_path):
    short = tmp_path / "short"
    short.mkdir()
    rows = [{"iteration": i, "mode": "no_memory", "return_mean": float(i)} for i in (1, 2)]
    (short / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows) + '{"iteration": 3, "ret')
    fig = plots.learning_curve_figure({"A": [short], "B": [SANITY / "empo2_s0", short]})
    texts = legend_texts(fig)
    assert "A (no validation points)" in texts and "B (mean of 1 seed)" in texts
    assert list(fig.axes[0].lines[0].get_data()[0]) == [1, 2]  # the torn last line is skipped
    only_short = plots.learning_curve_figure({"A": [short]})
    assert "no validation points" in [t.get_text() for t in only_short.axes[1].texts]


def write_ood(path: Path, returns: list[float], std: float = 5.0) -> Path:
    steps = [{"step": s, "return_mean": r, "return_std": std, "return_se": std / 2, "success_rate": 0.0,
              "episodes": 4, "memory_size": 4 * s} for s, r in enumerate(returns)]
    step0 = returns[0]
    best = max(range(1, len(returns)), key=lambda s: returns[s])
    gain = returns[best] - step0
    relative = gain / abs(step0) if step0 else None
    ood = {"steps": steps, "best_step": best, "best_gain": gain, "best_gain_relative": relative}
    path.write_text(json.dumps({"return_mean": step0, "ood": ood}))
    return path


def test_ood_curves_mark_the_best_step_and_its_gain(tmp_path):
    # EMPO2, one file: step 0 = -10, best step 2 (8.7): gain +18.7 = +187 % of |step 0|; error bars = episode std
    empo2 = write_ood(tmp_path / "empo2.json", [-10.0, 5.0, 8.7, 2.0])
    # GRPO, two files: mean curve [-20, -12, -5, -11] -> best step 2, gain +15.0 = +75 %; bars = std of the means
    grpo = [write_ood(tmp_path / "grpo_a.json", [-24.0, -10.0, -4.0, -12.0]),
            write_ood(tmp_path / "grpo_b.json", [-16.0, -14.0, -6.0, -10.0])]
    results = {"EMPO2": [empo2], "GRPO": grpo}
    png = plots.ood_curves(results, tmp_path / "ood_adaptation.png")
    assert min(png_size(png)) >= 500

    texts = legend_texts(plots.ood_figure(results))
    assert "EMPO2 (1 run; best step 2: +18.7, +187 %)" in texts
    assert "GRPO (2 runs; best step 2: +15.0, +75 %)" in texts
    assert json.loads(empo2.read_text())["ood"]["best_step"] == 2  # the file agrees with the plot
    summary = plots.ood_summary(grpo)
    assert list(summary["mean"]) == [-20.0, -12.0, -5.0, -11.0]  # sample std of two values a, b: |a - b| / sqrt(2)
    assert summary["spread"] == pytest.approx([8 / 2 ** 0.5, 4 / 2 ** 0.5, 2 / 2 ** 0.5, 2 / 2 ** 0.5])
    assert list(plots.ood_summary([empo2])["spread"]) == [5.0] * 4
    from_zero = write_ood(tmp_path / "from_zero.json", [0.0, 3.0, 3.0])  # no relative gain; the first of equal maxima
    assert plots.ood_legend("X", plots.ood_summary([from_zero])) == "X (1 run; best step 1: +3.0)"


def test_cli_writes_both_figures(tmp_path, capsys):
    ood = write_ood(tmp_path / "eval.json", [0.0, 3.0])
    written = plots.main(["--runs", f"EMPO2={SANITY / 'empo2_s0'},{SANITY / 'empo2_s1'}",
                          f"GRPO={SANITY / 'grpo_s0'}", "--ood", f"EMPO2={ood}", "--out", str(tmp_path / "out")])
    assert [p.name for p in written] == ["learning_curves.png", "ood_adaptation.png"]
    assert capsys.readouterr().out.splitlines() == [f"wrote {p}" for p in written]


def test_cli_error_for_a_missing_folder_is_one_line(tmp_path):
    missing = tmp_path / "no_such_run"
    proc = subprocess.run([sys.executable, "-m", "tools.plots", "--runs", f"EMPO2={missing}", "--out",
                           str(tmp_path / "out")], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.strip().splitlines() == [f"python -m tools.plots: error: no such run folder: {missing}"]
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("args, message", [
    (["--runs", "EMPO2"], "expected LABEL=PATH"),
    (["--runs", f"A={SANITY / 'base_s0'}"], "has no metrics.jsonl"),
    (["--ood", f"A={SANITY / 'base_s0' / 'eval.json'}"], "has no `ood` field"),
    (["--runs", f"A={SANITY / 'grpo_s0'}", f"A={SANITY / 'grpo_s1'}"], "given twice"),
    ([], "nothing to plot"),
])
def test_cli_errors_name_the_problem(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exit_info:
        plots.main(args + ["--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert exit_info.value.code == 2 and len(err.strip().splitlines()) == 1 and message in err
    assert not (tmp_path / "out").exists()
