"""The config system: YAML -> typed dataclasses, --key=value overrides, unknown keys rejected by name."""
from pathlib import Path

import dataclasses
import re

import pytest

from config import (REMOVED, Config, ConfigError, config_help, load_config, parse_overrides, read_config_file,
                    split_cli)

CONFIG_DIR = Path(__file__).resolve().parents[1] / "configs"
CONFIGS = sorted(CONFIG_DIR.glob("*.yaml"))
QUICKSTART = str(CONFIG_DIR / "quickstart.yaml")


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_shipped_configs_load(path):
    cfg = load_config(str(path))
    assert cfg.rollout.group_size >= 1


def test_paper_settings_in_scienceworld_configs():
    empo2 = load_config(str(CONFIG_DIR / "scienceworld_empo2.yaml"))
    grpo = load_config(str(CONFIG_DIR / "scienceworld_grpo.yaml"))
    assert empo2.model.name_or_path == "Qwen/Qwen2.5-7B-Instruct" and empo2.model.lora
    assert (empo2.rollout.group_size, empo2.rollout.tasks_per_iteration, empo2.rollout.max_action_tokens) == (8, 16, 32)
    assert (empo2.loss.clip_low, empo2.loss.clip_high, empo2.loss.dual_clip) == (0.2, 0.3, 10.0)
    assert (empo2.memory.p_no_memory, empo2.memory.p_on_policy_tips, empo2.memory.p_off_policy) == (0.75, 0.08, 0.17)
    assert empo2.memory.enabled and not grpo.memory.enabled
    # The GRPO baseline is the same recipe: everything but memory and the bonus is identical.
    assert empo2.loss == grpo.loss and empo2.train == grpo.train and empo2.rollout == grpo.rollout


def test_scienceworld_validation_plays_the_references_four_repeats_of_each_test_variation():
    for name in ("scienceworld_empo2", "scienceworld_grpo", "scienceworld_empo2_paper", "scienceworld_grpo_paper"):
        assert load_config(str(CONFIG_DIR / f"{name}.yaml")).train.eval_episodes_per_task == 4, name
    assert load_config(QUICKSTART).train.eval_episodes_per_task == 1  # the CPU quickstart stays small


def test_overrides_are_typed():
    cfg = load_config(QUICKSTART, ["--train.iterations=7", "--model.lora=false",
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
    ("--rollout.tip_format=short", "rollout.tip_format='short' is not one of"),
    ("--memory.p_no_memory=0.9", "memory.p_"),
])
def test_bad_values_name_the_key(override, fragment):
    with pytest.raises(ConfigError, match=fragment.replace(".", r"\.")):
        load_config(QUICKSTART, [override])


@pytest.mark.parametrize("key", sorted(REMOVED))
def test_a_removed_key_is_refused_by_name(key, tmp_path):
    """Every removed key (config.REMOVED) is refused on the command line and in a YAML file, naming the key and
    what the code now always does; none of them is a field any more."""
    with pytest.raises(ConfigError, match=f"config key '{re.escape(key)}' was removed: {re.escape(REMOVED[key])}"):
        load_config(QUICKSTART, [f"--{key}=1"])
    *sections, name = key.split(".")
    text = "".join("  " * depth + f"{part}:\n" for depth, part in enumerate(sections)) + "  " * len(sections) + \
        f"{name}: 1\n"
    (tmp_path / "old.yaml").write_text(text)
    with pytest.raises(ConfigError, match=re.escape(key)):
        load_config(str(tmp_path / "old.yaml"))
    node = Config()
    for part in sections:
        node = getattr(node, part)
    assert name not in {f.name for f in dataclasses.fields(node)}


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
    empo2 = load_config(str(CONFIG_DIR / "webshop_empo2.yaml"))
    grpo = load_config(str(CONFIG_DIR / "webshop_grpo.yaml"))
    assert empo2.env.name == "webshop" and empo2.rollout.history_window == 2 and empo2.env.webshop.max_steps == 15
    assert empo2.rollout.max_action_tokens == 512 and empo2.rollout.group_size == 8
    assert empo2.memory.enabled and not grpo.memory.enabled and empo2.loss == grpo.loss


@pytest.mark.parametrize("name", ["webshop_empo2", "webshop_grpo"])
def test_webshop_trains_as_verl_agent(name):
    """Every WebShop config trains with verl-agent's actor settings; each value cites the file and line where
    verl-agent sets it, in the fork xlan156/verl-agent at 8ca3a46 (the revision docs/webshop.md read; the upstream
    langfengQ/verl-agent was not inspected)."""
    cfg = load_config(str(CONFIG_DIR / f"{name}.yaml"))
    # examples/grpo_trainer/run_webshop.sh L31: actor_rollout_ref.actor.ppo_mini_batch_size=64; verl/workers/
    # fsdp_workers.py L150 multiplies it by actor_rollout_ref.rollout.n, which verl/trainer/main_ppo.py L161 asserts
    # is 1 (groups come from env.rollout.n, run_webshop.sh L56): 64 step rows per optimiser step.
    assert cfg.train.minibatch_steps == 64
    # verl/trainer/config/ppo_trainer.yaml L53-55: clip_ratio_low 0.2, clip_ratio_high 0.2, clip_ratio_c 3.0 (no
    # WebShop script overrides them)
    assert (cfg.loss.clip_low, cfg.loss.clip_high, cfg.loss.dual_clip) == (0.2, 0.2, 3.0)
    # ppo_trainer.yaml L57: entropy_coeff 0.001; verl/workers/actor/dp_actor.py L414: pg_loss - entropy_loss * coeff
    assert cfg.loss.entropy_coef == 0.001
    # ppo_trainer.yaml L56: loss_agg_mode "token-mean" (verl/trainer/ppo/core_algos.py L410-411: masked_mean)
    assert cfg.loss.aggregation == "token"
    # run_webshop.sh L33-35: use_kl_loss=True, kl_loss_coef=0.01, kl_loss_type=low_var_kl
    assert (cfg.loss.kl_coef, cfg.loss.kl_estimator) == (0.01, "low_var_kl")


@pytest.mark.parametrize("name", ["scienceworld_empo2", "scienceworld_grpo", "scienceworld_empo2_paper",
                                  "scienceworld_grpo_paper", "quickstart"])
def test_scienceworld_keeps_the_reference_loss(name):
    """ScienceWorld trains with the EMPO² reference's loss (docs/algorithm.md): clip 0.2 / 0.3, dual clip 10, no
    entropy bonus, every step weighing 1."""
    loss = load_config(str(CONFIG_DIR / f"{name}.yaml")).loss
    assert (loss.clip_low, loss.clip_high, loss.dual_clip, loss.entropy_coef, loss.aggregation) == (
        0.2, 0.3, 10.0, 0.0, "step")


def test_entropy_bonus_and_aggregation_are_checked():
    with pytest.raises(ConfigError, match="loss.entropy_coef must be >= 0"):
        load_config(None, ["--loss.entropy_coef=-0.001"])
    with pytest.raises(ConfigError, match="loss.aggregation='episode' is not one of"):
        load_config(None, ["--loss.aggregation=episode"])


def test_base_config_is_overridden_key_by_key(tmp_path):
    (tmp_path / "parent.yaml").write_text("train:\n  lr: 0.5\n  seed: 7\nrollout:\n  group_size: 3\n")
    (tmp_path / "sub").mkdir()
    child = tmp_path / "sub" / "child.yaml"
    child.write_text("base: ../parent.yaml\ntrain:\n  seed: 9\n")
    cfg = load_config(str(child), ["--train.iterations=2"])
    assert (cfg.train.lr, cfg.train.seed, cfg.rollout.group_size, cfg.train.iterations) == (0.5, 9, 3, 2)
    assert read_config_file(child) == {"train": {"lr": 0.5, "seed": 9}, "rollout": {"group_size": 3}}
    (tmp_path / "parent.yaml").write_text("base: sub/child.yaml\n")
    with pytest.raises(ConfigError, match="circular"):
        load_config(str(child))
    child.write_text("base: missing.yaml\n")
    with pytest.raises(ConfigError, match="not found"):
        load_config(str(child))


def test_grpo_configs_are_their_empo2_base_with_memory_off():
    for env in ("scienceworld", "webshop"):
        empo2, grpo = (load_config(str(CONFIG_DIR / f"{env}_{algo}.yaml")) for algo in ("empo2", "grpo"))
        assert grpo.memory.enabled is False and grpo.intrinsic.coef == 0.0
        assert grpo.model == empo2.model and grpo.env == empo2.env and grpo.rollout == empo2.rollout


def test_a_key_that_never_existed_is_unknown():
    with pytest.raises(ConfigError, match="unknown config key 'memory.p_memory_off_policy'"):
        load_config(QUICKSTART, ["--memory.p_memory_off_policy=1"])


def test_help_lists_every_key_with_its_default_and_help():
    text = config_help()

    def keys(obj, prefix=""):
        for f in dataclasses.fields(obj):
            value = getattr(obj, f.name)
            yield from keys(value, f"{prefix}{f.name}.") if dataclasses.is_dataclass(value) else [f"{prefix}{f.name}"]

    lines = text.splitlines()
    for key in keys(Config()):
        (index,) = [i for i, line in enumerate(lines) if line.startswith(f"  --{key}=")]
        assert index + 1 < len(lines) and lines[index + 1].startswith("      "), f"{key} has no help line"
    assert "  --train.lr=1.0e-05\n      AdamW learning rate" in text
    assert "  --memory.p_off_policy=0.17\n" in text


def test_kl_to_the_reference_needs_a_non_negative_coefficient_and_a_known_estimator():
    assert load_config("configs/webshop_empo2.yaml").loss.kl_coef == 0.01
    assert load_config("configs/scienceworld_empo2.yaml").loss.kl_coef == 0.0  # the paper's ScienceWorld recipe
    # A full fine-tune scores a frozen reference copy (infra.models.load_reference), so it may have the KL term too.
    assert load_config(None, ["--loss.kl_coef=0.01", "--model.lora=false"]).loss.kl_coef == 0.01
    with pytest.raises(ConfigError, match="loss.kl_coef must be >= 0"):
        load_config(None, ["--loss.kl_coef=-0.01"])
    with pytest.raises(ConfigError, match="loss.kl_estimator"):
        load_config(None, ["--loss.kl_estimator=k3"])


def test_the_oracle_needs_exact_retrieval_and_the_sentence_alone():
    ok = load_config(None, ["--env.name=sanity", "--env.sanity.switch=true", "--rollout.tip_source=oracle",
                            "--memory.similarity=exact", "--rollout.tip_format=tip_only"])
    assert ok.rollout.tip_source == "oracle" and ok.env.sanity.switch
    for missing in (["--memory.similarity=exact"], ["--rollout.tip_format=tip_only"]):
        with pytest.raises(ConfigError, match="rollout.tip_source=oracle needs memory.similarity=exact"):
            load_config(None, ["--rollout.tip_source=oracle", *missing])
