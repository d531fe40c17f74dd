"""tools/warmup.py: gold episodes are the chat template's conversation, the warm-up teaches the gold actions of held-out
variations, and `model.init_adapter` starts a policy from exactly the saved adapter (real SmolLM2, real sanity env)."""
from dataclasses import replace

import pytest
import torch

from config import ConfigError, load_config
from envs import make_env
from engine.generation import ChatStream
from infra.models import ModelLoadError, load_policy
from tools.warmup import gold_episode, warmup

SMALL = ["--env.sanity.families=[lab]", "--env.sanity.difficulty=1", "--env.sanity.num_stages=3",
         "--env.sanity.num_distractors=1", "--env.sanity.max_steps=4", "--env.sanity.train_variations=2",
         "--env.sanity.test_variations=1", "--model.lora_rank=8", "--model.lora_targets=[q_proj,v_proj]"]


def small_config(*extra):
    return load_config("configs/sanity_empo2.yaml", SMALL + list(extra))


def test_gold_episode_is_the_conversation_the_chat_template_renders():
    cfg = small_config("--env.sanity.families=[garden]")
    _, tokenizer = load_policy(replace(cfg.model, lora=False))
    chat, env = ChatStream(tokenizer), make_env(cfg.env)
    task = env.tasks("train")[0]
    ep = gold_episode(env, task, chat, [], env.turn_reminder())
    gold = env.gold_actions(task)
    assert ep.success and ep.actions == gold and len(gold) == 3  # num_stages 3: two stages + the focus
    # Independently: replay the gold commands and render the whole conversation with the tokenizer's template.
    messages, observation = [], env.reset(task)
    for k, action in enumerate(gold):
        messages.append({"role": "user", "content": observation + (env.turn_reminder() if k else "")})
        messages.append({"role": "assistant", "content": action})
        observation = env.step(action)[0]
    rendered = tokenizer.apply_chat_template(messages, tokenize=False)
    assert tokenizer.decode(ep.ids) == rendered.rstrip("\n")  # ChatML ends an assistant turn with "<|im_end|>\n"
    trained = [i for i, m in zip(ep.ids, ep.mask) if m]
    assert tokenizer.decode(trained) == "".join(a + "<|im_end|>" for a in gold)


def held_out_nll(model, tokenizer, env, tasks) -> float:
    """Mean NLL of the gold action tokens of `tasks`, from a plain forward over the rendered conversation."""
    values = []
    for task in tasks:
        messages, observation = [], env.reset(task)
        for k, action in enumerate(env.gold_actions(task)):
            messages.append({"role": "user", "content": observation + (env.turn_reminder() if k else "")})
            prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            context = tokenizer.encode(prompt, add_special_tokens=False)
            end_of_turn = tokenizer.convert_tokens_to_ids("<|im_end|>")
            target = tokenizer.encode(action, add_special_tokens=False) + [end_of_turn]
            with torch.no_grad():
                logits = model(input_ids=torch.tensor([context + target])).logits[0, len(context) - 1:-1]
            values += (-torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(target)[:, None])[:, 0]).tolist()
            messages.append({"role": "assistant", "content": action})
            observation = env.step(action)[0]
    return sum(values) / len(values)


def test_warmup_teaches_held_out_gold_actions_and_init_adapter_loads_them(tmp_path):
    cfg = small_config()
    result = warmup(cfg, "garden", epochs=2, lr=1e-3, out=tmp_path / "wu")
    assert result["episodes"] == 2 and result["held_out_episodes"] == 1
    assert result["epoch_nll"][1] < result["epoch_nll"][0]
    garden = make_env(replace(cfg.env, sanity=replace(cfg.env.sanity, families=["garden"])))
    fresh, tokenizer = load_policy(cfg.model)
    before = held_out_nll(fresh, tokenizer, garden, garden.tasks("test"))
    warmed, _ = load_policy(replace(cfg.model, init_adapter=str(tmp_path / "wu")))
    after = held_out_nll(warmed, tokenizer, garden, garden.tasks("test"))
    # One held-out episode: warmup.json's per-episode mean is this per-token mean. Equal values say the warm-up
    # trained the template's conversation and init_adapter restored exactly the adapter it saved.
    assert after < before - 0.3, (before, after)
    assert before == pytest.approx(result["held_out_nll_before"], abs=1e-3)
    assert after == pytest.approx(result["held_out_nll_after"], abs=1e-3)
    # The warm-up's adapter reaches the lab family it never saw: the gold lab actions get likelier too.
    lab = make_env(cfg.env)
    lab_before, lab_after = (held_out_nll(m, tokenizer, lab, lab.tasks("test")) for m in (fresh, warmed))
    assert lab_after < lab_before - 0.3
    # A checkpoint holds the whole adapter: evaluating one does not need the folder its run started from (a run's
    # config.yaml names it by its path on the machine that trained it).
    import eval as evaluation
    result = evaluation.main(["--config", "configs/sanity_empo2.yaml", *SMALL, "--model.init_adapter=/nonexistent",
                              f"--checkpoint={tmp_path / 'wu'}", "--episodes_per_task=1", "--env.sanity.max_steps=1",
                              f"--output={tmp_path / 'eval'}"])
    assert result["episodes"] == 1 and (tmp_path / "eval" / "eval.json").is_file()
    # A mismatched adapter is refused with a message, not loaded partly.
    with pytest.raises(ModelLoadError, match="lora_rank"):
        load_policy(replace(cfg.model, lora_rank=4, init_adapter=str(tmp_path / "wu")))
    with pytest.raises(ModelLoadError, match="adapter_model.safetensors"):
        load_policy(replace(cfg.model, init_adapter=str(tmp_path)))


def test_bad_warmup_and_init_adapter_settings_are_refused():
    with pytest.raises(ConfigError, match="lora=true"):
        small_config("--model.init_adapter=x", "--model.lora=false")
    with pytest.raises(ConfigError, match="kl_coef"):
        small_config("--model.init_adapter=x", "--loss.kl_coef=0.01")
    with pytest.raises(ConfigError, match="history_window"):
        warmup(small_config("--rollout.history_window=2"), "garden", 1, 1e-4, None)


def test_tip_episodes_show_tips_as_the_rollout_does_and_name_other_commands_half_the_time(qwen25_tokenizer):
    """tools.warmup.tip_episode (--tip_share): every step's context is the chat template's rendering of the tip-free
    history plus the current turn with its tip block (memory.tip_block, tip_only, before the answer instruction at
    step 0, before the reminder later), the target is the command the tip names, about half of the tips name a
    harmless non-gold command, every episode still succeeds, and no tip names anything of the lab."""
    import random

    from envs.sanity import ORACLE_TIP, SanityConfig, SanityEnv
    from memory import TipEntry, tip_block
    from rollout import tips_before
    from tools.warmup import tip_episode

    env = SanityEnv(SanityConfig(families=["garden"], num_distractors=2, max_steps=6, train_variations=32,
                                 test_variations=0))
    chat, rng = ChatStream(qwen25_tokenizer), random.Random(0)
    episodes = [tip_episode(env, task, chat, [], env.turn_reminder(), 0.6, rng) for task in env.tasks("train")]
    steps = [s for ep in episodes for s in ep]
    tips = [s for s in steps if s[2]]
    other = [s for s in tips if s[2] != s[3]]
    # seed 0: 125 steps, 69 with a tip (share 0.6), 29 of them naming another command (spare steps permitting)
    assert (len(steps), len(tips), len(other)) == (125, 69, 29)
    assert all(a == chat.encode(named or gold) + [chat.eos_id] for _, a, named, gold in steps)  # the tip's command
    lab_words = {"lamp", "wire", "button", "switch", "panel", "red", "blue", "green"}
    assert not any(lab_words & set(s[2].split()) for s in tips)
    # Independently: replay each episode and render every step's conversation with the chat template.
    for task, ep in zip(env.tasks("train"), episodes):
        observation, history = env.reset(task), []
        for k, (context, _, named, gold) in enumerate(ep):
            block = tip_block([TipEntry(tip=ORACLE_TIP.format(command=named), action="", ret=0.0)], "tip_only") \
                if named else ""
            turn = (tips_before(observation, block, env.answer_instruction()) if k == 0
                    else observation + block + env.turn_reminder())
            messages = history + [{"role": "user", "content": turn}]
            rendered = qwen25_tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
            assert qwen25_tokenizer.decode(context) == rendered, (task, k)
            action = named or gold
            history += [{"role": "user", "content": observation + (env.turn_reminder() if k else "")},
                        {"role": "assistant", "content": action}]
            observation = env.step(action)[0]
        assert env.step("look around")[0] == "The episode is over."  # it ended, in success (tip_episode checks)
