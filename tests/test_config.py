"""The config system: YAML -> typed dataclasses, --key=value overrides, unknown keys rejected by name."""
from pathlib import Path

import pytest

from config import ConfigError, load_config, parse_overrides, split_cli

CONFIGS = sorted((Path(__file__).resolve().parents[1] / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load(path):
    cfg = load_config(str(path))
    assert cfg.rollout.group_size >= 1


def test_paper_settings_in_scienceworld_configs():
    empo2 = load_config("configs/scienceworld_empo2.yaml")
    grpo = load_config("configs/scienceworld_grpo.yaml")
    assert empo2.model.name_or_path == "Qwen/Qwen2.5-7B-Instruct" and empo2.model.lora
    assert (empo2.rollout.group_size, empo2.rollout.tasks_per_iteration, empo2.rollout.max_action_tokens) == (8, 16, 32)
    assert (empo2.loss.clip_low, empo2.loss.clip_high, empo2.loss.dual_clip) == (0.2, 0.3, 10.0)
    assert (empo2.memory.p_no_memory, empo2.memory.p_memory_on_policy, empo2.memory.p_memory_off_policy) == (
        0.75, 0.08, 0.17)
    assert empo2.memory.enabled and not grpo.memory.enabled
    # The GRPO baseline is the same recipe: everything but memory and the bonus is identical.
    assert empo2.loss == grpo.loss and empo2.train == grpo.train and empo2.rollout == grpo.rollout


def test_overrides_are_typed():
    cfg = load_config("configs/quickstart.yaml", ["--train.iterations=7", "--model.lora=false",
                                                  "--loss.clip_high=0.25", "--env.scienceworld.tasks=[boil, melt]",
                                                  "--output_dir=/tmp/x", "--resume"])
    assert cfg.train.iterations == 7 and cfg.model.lora is False and cfg.loss.clip_high == 0.25
    assert cfg.env.scienceworld.tasks == ["boil", "melt"] and cfg.output_dir == "/tmp/x" and cfg.resume == "latest"


@pytest.mark.parametrize("override, fragment", [
    ("--train.iteratons=3", "train.iteratons"),
    ("--bogus=1", "bogus"),
    ("--env.scienceworld.nope=1", "env.scienceworld.nope"),
    ("--train.iterations=three", "train.iterations"),
    ("--model.lora=maybe", "model.lora"),
    ("--train=3", "train"),
    ("--loss.lowprob_mask=always", "loss.lowprob_mask"),
    ("--memory.p_no_memory=0.9", "memory.p_"),
])
def test_bad_values_name_the_key(override, fragment):
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        load_config("configs/quickstart.yaml", [override])


def test_unknown_key_in_yaml(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("train:\n  learning_rate: 0.1\n")
    with pytest.raises(ConfigError, match="train.learning_rate"):
        load_config(str(bad))
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(tmp_path / "missing.yaml"))


def test_cli_parsing():
    assert split_cli(["--config", "a.yaml", "--x.y=1"]) == ("a.yaml", ["--x.y=1"])
    assert split_cli(["--config=b.yaml"]) == ("b.yaml", [])
    assert parse_overrides(["--a.b=1", "--a.c=x=y"]) == {"a": {"b": "1", "c": "x=y"}}
    with pytest.raises(ConfigError):
        parse_overrides(["positional"])


def test_webshop_configs():
    empo2 = load_config("configs/webshop_empo2.yaml")
    grpo = load_config("configs/webshop_grpo.yaml")
    assert empo2.env.name == "webshop" and empo2.env.history_window == 2 and empo2.env.webshop.max_steps == 15
    assert empo2.rollout.max_action_tokens == 512 and empo2.rollout.group_size == 8
    assert empo2.memory.enabled and not grpo.memory.enabled and empo2.loss == grpo.loss
