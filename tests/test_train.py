"""End-to-end training on CPU with real ScienceWorld and the real SmolLM2 policy: updates, metrics, memory,
checkpoints, resume, non-finite guard, and a 2-process (gloo) run on ScienceWorld whose ranks stay identical."""
import contextlib
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from config import load_config
from conftest import clean_env, free_port
from samples import Context, Sample

ROOT = Path(__file__).resolve().parents[1]
QUICKSTART = str(ROOT / "configs" / "quickstart.yaml")
pytestmark = [pytest.mark.slow, pytest.mark.java]  # real ScienceWorld and the real CPU policy
TINY = [
    "--env.scienceworld.tasks=[find-living-thing]", "--env.scienceworld.max_steps=2",
    "--env.scienceworld.train_variations=2", "--env.scienceworld.test_variations=1",
    "--env.scienceworld.num_demos=1", "--env.scienceworld.demo_max_steps=2",
    "--rollout.group_size=2", "--rollout.max_action_tokens=8", "--rollout.tip_max_tokens=16",
    "--train.minibatch_steps=4", "--train.eval_tasks=1", "--train.tensorboard=true",
    # the quickstart's train.torch_threads=2 (the suite's count); the 2-process run sets 1 per process
    # off-policy in every iteration: exercises tips in the prompt, the twin stream and the masked update
    "--memory.p_no_memory=0", "--memory.p_on_policy_tips=0", "--memory.p_off_policy=1",
]
METRIC_KEYS = {"iteration", "mode", "return_mean", "return_std", "success_rate", "episode_length", "truncation_rate",
               "tips_retrieved", "memory_size", "loss", "ratio_mean", "ratio_max", "clip_frac", "masked_frac",
               "approx_kl", "entropy", "time_rollout", "time_tips", "time_update", "tips_written"}


def adapter_weights(run: Path, iteration: int) -> dict:
    folder = run / "checkpoints" / f"iter_{iteration:06d}" / "model"
    return load_file(str(folder / "adapter_model.safetensors"))


def test_two_processes_on_scienceworld_keep_identical_weights_and_memory(tmp_path, tiny_folder):
    """The quickstart on 2 gloo ranks, each with its own ScienceWorld JVM and both reading one demo cache: the ranks
    end with identical weights and memory, the checkpoint holds the tips, and the log counts both ranks' episodes. A
    tiny random Qwen2 keeps it to seconds (test_resilience.py checks the sampling and the tips across ranks)."""
    env = clean_env()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", str(free_port()),
           "train.py", "--config", QUICKSTART, *TINY, f"--model.name_or_path={tiny_folder}", f"--output_dir={tmp_path}",
           "--train.iterations=1", "--rollout.tasks_per_iteration=2", "--train.eval_every=0",
           "--train.tensorboard=false", "--train.torch_threads=1"]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = json.loads((tmp_path / "ranks.json").read_text())
    assert ranks["world_size"] == 2
    assert ranks["weights_sha256"][0] == ranks["weights_sha256"][1]
    assert ranks["memory_sha256"][0] == ranks["memory_sha256"][1]
    memory = json.loads((tmp_path / "checkpoints" / "iter_000001" / "memory.json").read_text())
    keys = {key for key, slot in memory["entries"].items() if slot}
    assert len(keys) >= 1 and sum(len(s) for s in memory["entries"].values()) > 0
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row["episodes"] == 4  # 2 task rows x 2 episodes, gathered from both ranks


@pytest.fixture(scope="module")
def two_iterations(tmp_path_factory):
    """Iteration 1, stopped at its checkpoint, then `--resume=latest` to iteration 2 (with a validation): one run
    on the real stack that trains, writes everything and resumes, so iteration 2 can only see iteration 1's tips
    if the memory came back from the checkpoint."""
    from train import train

    out = tmp_path_factory.mktemp("run")
    train(load_config(QUICKSTART, TINY + [f"--output_dir={out}", "--train.iterations=1", "--train.save_every=1",
                                          "--train.eval_every=0"]))
    first = (out / "metrics.jsonl").read_text()
    log = io.StringIO()
    with contextlib.redirect_stdout(log):
        train(load_config(QUICKSTART, TINY + [f"--output_dir={out}", "--train.iterations=2", "--train.save_every=1",
                                              "--train.eval_every=2", "--resume=latest"]))
    return out, first, log.getvalue()


def test_two_iterations_train_and_write_everything(two_iterations):
    out, _, _ = two_iterations
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2] and all(r["mode"] == "off_policy" for r in rows)
    assert METRIC_KEYS <= set(rows[0]), METRIC_KEYS - set(rows[0])
    assert "val_return_mean" in rows[1]
    # One optimiser step per mini-batch of ~4 environment steps (train.minibatch_steps=4), at least one.
    assert all(r["optimizer_steps"] == max(1, round(r["train_steps"] / 4)) for r in rows), rows
    assert rows[1]["memory_size"] > 0 and rows[1]["tips_retrieved"] > 0  # iteration 2 saw iteration 1's tips
    assert (out / "metrics.png").stat().st_size > 0 and any((out / "tb").iterdir())
    # LoRA B matrices start at zero; after the updates they are not.
    weights = adapter_weights(out, 2)
    assert any(name.endswith("lora_B.weight") and t.abs().sum() > 0 for name, t in weights.items())
    before = adapter_weights(out, 1)
    assert any(not torch.equal(before[k], weights[k]) for k in weights)
    memory = json.loads((out / "checkpoints" / "iter_000002" / "memory.json").read_text())
    tips = [e for slot in memory["entries"].values() for e in slot]
    assert tips and all(e["tip"].strip() for e in tips)
    for name in ("optimizer.pt", "state.json", "rng_rank0.pt"):
        assert (out / "checkpoints" / "iter_000002" / name).is_file()


def test_resume_continues_at_the_next_iteration(two_iterations):
    out, first, log = two_iterations
    assert "continuing at iteration 2" in log
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["iteration"] for line in lines] == [1, 2]
    assert lines[0] + "\n" == first  # the resumed run appends; iteration 1's row stays as written
    memory = json.loads((out / "checkpoints" / "iter_000001" / "memory.json").read_text())
    assert json.loads(lines[1])["memory_size"] >= sum(len(slot) for slot in memory["entries"].values()) > 0


def run_update(policy, samples, minibatch_steps):
    """One `update` call on the shared policy; returns (metrics, weights unchanged?)."""
    import random

    from accelerate import Accelerator

    from train import update

    model, tokenizer = policy
    cfg = load_config(QUICKSTART, [f"--train.minibatch_steps={minibatch_steps}"])
    params = [p for p in model.parameters() if p.requires_grad]
    before = [p.detach().clone() for p in params]
    optimizer = torch.optim.AdamW(params, lr=1e-2)
    metrics = update(model, optimizer, samples, cfg, Accelerator(cpu=True), "no_memory", tokenizer.eos_token_id,
                     random.Random(0))
    return metrics, all(torch.equal(a, b) for a, b in zip(before, params))


def test_nonfinite_loss_skips_the_update_and_keeps_weights(policy):
    _, tokenizer = policy
    ids = tokenizer.encode("hello world, this is an action", add_special_tokens=False)
    mask = [0, 0] + [1] * (len(ids) - 2)
    bad = Sample(ids=ids, mask=mask, old=[Context(ids, mask)], advantages=[1.0] * sum(mask),
                 old_logp=[float("nan")] * sum(mask))
    metrics, unchanged = run_update(policy, [bad], minibatch_steps=1000)
    assert metrics["skipped_updates"] == 1 and metrics["optimizer_steps"] == 0 and unchanged


def test_update_without_samples_takes_no_step(policy):
    metrics, unchanged = run_update(policy, [], minibatch_steps=1)
    assert metrics["optimizer_steps"] == 0 and metrics["skipped_updates"] == 0 and unchanged
