"""Training smoke on WebShop: train.py with the WebShop EMPO² config (and GiGPO credit) runs one iteration on CPU
with the tiny model."""
import json
from pathlib import Path

import pytest

from config import load_config

CONFIG = Path(__file__).resolve().parents[2] / "configs" / "webshop_empo2.yaml"

TINY_MODEL = ["--model.name_or_path=smollm2-135m-instruct", "--model.dtype=float32", "--model.lora_rank=4",
              "--model.lora_alpha=8", "--model.lora_targets=[q_proj, v_proj]", "--model.gradient_checkpointing=false"]


@pytest.mark.slow
def test_one_webshop_iteration(tmp_path):
    """One off-policy EMPO² iteration on real WebShop pages (history window 2: one sample per step), with GiGPO's
    anchor-state credit on (loss.gigpo_weight=1; the config's 0 is GRPO): the group's episodes all start from the
    same search page, so step 0 always forms an anchor-state group."""
    from train import train

    cfg = load_config(str(CONFIG), TINY_MODEL + [
        f"--output_dir={tmp_path}", "--train.iterations=1", "--train.eval_every=0",
        "--train.minibatch_steps=10000", "--train.micro_batch_size=1", "--train.tensorboard=false",
        "--rollout.tasks_per_iteration=1", "--rollout.group_size=3", "--rollout.max_action_tokens=24",
        "--rollout.tip_max_tokens=16", "--env.webshop.max_steps=2", "--loss.gigpo_weight=1.0",
        "--memory.p_no_memory=0", "--memory.p_on_policy_tips=0", "--memory.p_off_policy=1",
    ])
    train(cfg)
    row = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert row["iteration"] == 1 and row["mode"] == "off_policy" and row["episodes"] == 3
    assert row["samples"] >= 3  # history window: one sample per step
    assert row["optimizer_steps"] + row["skipped_updates"] == 1
    assert "steps_with_anchor_credit" in row
    assert (tmp_path / "checkpoints" / "iter_000001" / "memory.json").is_file()
