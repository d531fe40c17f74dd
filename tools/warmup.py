"""Format warm-up: supervised fine-tuning of the LoRA on gold episodes of ANOTHER task family, before any RL.

    python -m tools.warmup --config configs/sanity_empo2.yaml [--section.key=value ...] [--family=garden] [--epochs=3]
                     [--lr=3e-4] [--tip_share=0] --output=DIR
    python train.py  --config configs/sanity_empo2.yaml --model.init_adapter=DIR   # every arm starts from DIR

Not part of EMPO² (the paper starts RL from Qwen2.5-7B-Instruct, which already answers with commands). A 135M
model does not: on the sanity environment SmolLM2-135M-Instruct writes a listed command in under 1 % of its steps
("I'm ready to help. What's your task?"), so the environment's action correction chooses its actions and a comparison
of RL methods measures that correction, not exploration (docs/sanity.md, "Why nothing separates"). The warm-up
teaches the answer FORMAT only: it trains on the gold (shortest) solutions of the training variations of a family
the comparison never plays (sanity `garden`: pots, seeds and plants) and is never shown a solution of the evaluated
family (`lab`), so whatever the arms learn about the lab's stage order they learn by RL.

Each gold episode is built token for token as rollout.py builds a full-history episode whose policy wrote the gold
commands (`full_history_turn`: the first message, then per step the action ids + eos, the environment's next
observation and the turn reminder), so the warm-up trains exactly the contexts the rollout will show. Loss: the mean
negative log-likelihood of the action tokens of one episode (its eos included), one episode per AdamW step,
`--epochs` passes over the episodes in a seeded order (train.seed). Output, in --output: `model/` (the adapter,
infra.models.save_model: what `--model.init_adapter` and `eval.py --checkpoint` load) and `warmup.json` (the settings,
per-epoch losses, the gold-token log-likelihood before and after on held-out variations of the warm-up family,
the wall time).

Tip reading (`--tip_share=S` > 0, an option; 0 is the format-only warm-up above). The paper's 7B model follows a
tip in its prompt; SmolLM2-135M does not (it played a per-state oracle tip's command in 2.4-4.0 % of the steps that
showed one, results/pilot_switch). With S > 0 each gold episode is played in the rollout's current-turn layout and,
at each step with probability S (seeded), the turn shows a tip block exactly as the rollout renders a memory tip
(memory.tip_block, `tip_only`, the sentence envs.sanity.ORACLE_TIP, at the same place in the turn); the target is
the command the tip names. In half of those steps (while a spare step remains) the tip names a listed, harmless
command that is NOT the gold one (SanityEnv.harmless_commands) and the episode continues from where it leaves it,
so a model that ignores tips cannot fit the data. The warm-up family is garden: no tip or example mentions a lab
object or the lab's switch. warmup.json then also reports, on held-out variations, the share of tip steps where
the model plays the tip's command (greedy and T = 1; for gold-naming and for other tips separately) before and after.

Needs an environment that knows its gold solutions (`gold_actions`: the sanity environment) and full-history
rollouts (`rollout.history_window: -1`); anything else is refused with a message.
"""
from __future__ import annotations

import json
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

from config import ConfigError, config_help, load_config, split_cli, split_options, to_dict
from envs import make_env
from engine.generation import ChatStream
from envs.sanity import ORACLE_TIP
from losses import action_logprobs, sequence_action_logprobs
from infra.models import load_policy, save_model
from memory import TipEntry, tip_block
from rollout import Episode, full_history_turn, generate_actions
from infra.runtime import derive_seed

USAGE = """usage: python -m tools.warmup --config FILE [--family=garden] [--epochs=3] [--lr=3e-4] [--tip_share=0]
                       --output=DIR [--section.key=value ...]

Supervised format warm-up of the LoRA on gold episodes of another sanity family (train with --model.init_adapter=DIR).
Every config key, with its default:
"""


def gold_episode(env, task, chat: ChatStream, prefix: list[int], reminder: str) -> Episode:
    """The full-history token stream of `task` played with its gold commands, as rollout.run_episodes records it
    (mask 1 on the action tokens, each ending with eos as a generated action does)."""
    ep = Episode(task=task, group=0, mode="no_memory")
    observation = env.reset(task)
    for step, action in enumerate(env.gold_actions(task)):
        delta, twin_delta, _ = full_history_turn(chat, ep, observation, "", reminder if step else "", prefix)
        ep.add_prompt(delta, twin_delta)
        ep.observations.append(observation)
        ep.add_action(chat.encode(action) + [chat.eos_id])
        ep.actions.append(action)
        observation, reward, done, info = env.step(action)
        ep.rewards.append(float(reward))
        ep.success = bool(info.get("success", False))
        if done:
            break
    if not ep.success:
        raise RuntimeError(f"the gold commands of {task.key} did not solve it: {ep.actions}")
    return ep


def tip_episode(env, task, chat: ChatStream, prefix: list[int], reminder: str, share: float, rng: random.Random
                ) -> list[tuple[list[int], list[int], str, str]]:
    """`task` played to success in the rollout's current-turn layout, a tip shown at `share` of the steps: per step
    (its context, exactly as rollout.run_episodes builds it with that turn's tip block; the action ids + eos; the
    command the tip named, "" without a tip; the gold command needed there). A tip names the gold command, or in half of the cases, while a spare
    step remains before the step limit, a harmless other command, which is then played (the target is always the
    command the tip names)."""
    ep = Episode(task=task, group=0, mode="on_policy_tips", layout="current_turn")
    observation, gold, reached = env.reset(task), env.gold_actions(task), 0
    steps, info = [], {}
    while True:
        step = len(ep.actions)
        command, named = gold[reached], ""
        if rng.random() < share:
            spare = env.step_limit(task) - step - (len(gold) - reached)
            if spare > 0 and rng.random() < 0.5:
                command = rng.choice([c for c in env.harmless_commands() if c != gold[reached]])
            named = command
        block = chat.plain(tip_block([TipEntry(tip=ORACLE_TIP.format(command=named), action="", ret=0.0,
                                               state=observation)], "tip_only")) if named else ""
        delta, twin_delta, context = full_history_turn(chat, ep, observation, block, reminder if step else "",
                                                       prefix, env.answer_instruction() if step == 0 else "")
        ep.add_prompt(delta, twin_delta)
        ep.observations.append(observation)
        action = chat.encode(command) + [chat.eos_id]
        ep.add_action(action)
        ep.actions.append(command)
        steps.append((context, action, named, gold[reached]))
        observation, _, done, info = env.step(command)
        reached += command == gold[reached]
        if done:
            break
    if not info.get("success"):
        raise RuntimeError(f"the tip episode of {task.key} did not end in success: {ep.actions}")
    return steps


def steps_nll(model, steps: list[tuple], pad_id: int, device) -> torch.Tensor:
    """The mean negative log-likelihood of all action tokens of an episode's steps (`tip_episode`), each in its own
    context (one forward over the steps, losses.sequence_action_logprobs)."""
    logps, _ = sequence_action_logprobs(model, [s[0] + s[1] for s in steps],
                                        [[0] * len(s[0]) + [1] * len(s[1]) for s in steps], pad_id, device)
    return -torch.cat(logps).mean()


@torch.no_grad()
def tips_followed(model, chat: ChatStream, steps: list[tuple], temperature: float, seed: int,
                  max_new_tokens: int = 16) -> dict:
    """Over the steps (`tip_episode`) that show a tip: the share where the model's output (cleaned as the environment
    cleans it) is the tip's command, for tips naming the gold command and for tips naming another one."""
    from envs.scienceworld.prompts import clean_action

    steps = [s for s in steps if s[2]]
    gold = [named == needed for _, _, named, needed in steps]
    outputs = generate_actions(model, chat, [s[0] for s in steps], max_new_tokens=max_new_tokens,
                               temperature=temperature, seeds=[derive_seed(seed, "tips_followed", i)
                                                               for i in range(len(steps))])
    played = [clean_action(chat.decode(ids)) == s[2] for ids, s in zip(outputs, steps)]
    share = lambda flags: sum(flags) / max(len(flags), 1)  # noqa: E731
    return {"gold_tips": share([p for p, g in zip(played, gold) if g]),
            "other_tips": share([p for p, g in zip(played, gold) if not g]),
            "gold_tip_steps": sum(gold), "other_tip_steps": len(gold) - sum(gold)}


def action_nll(model, episodes: list[Episode], device) -> list[torch.Tensor]:
    """Per episode: the mean negative log-likelihood of its action tokens under `model` (scalar tensors)."""
    losses = []
    for ep in episodes:
        ids = torch.tensor([ep.ids], device=device)
        predicts_action = torch.tensor(ep.mask[1:], device=device, dtype=torch.bool)  # position t predicts id t+1
        logits = model(input_ids=ids).logits[0, :-1][predicts_action]  # the log-softmax only where it is used
        logp, _ = action_logprobs(logits, ids[0, 1:][predicts_action])
        losses.append(-logp.mean())
    return losses


def warmup(cfg, family: str, epochs: int, lr: float, out: Path, tip_share: float = 0.0) -> dict:
    if not cfg.model.lora:
        raise ConfigError("the warm-up trains a LoRA adapter: it needs model.lora=true")
    if cfg.rollout.history_window >= 0:
        raise ConfigError("the warm-up builds full-history episodes: it needs rollout.history_window=-1")
    if cfg.env.name != "sanity":
        raise ConfigError(f"the warm-up needs gold solutions, which only the sanity environment has (env.name="
                          f"{cfg.env.name!r})")
    env_cfg = replace(cfg.env, sanity=replace(cfg.env.sanity, families=[family]))
    env = make_env(env_cfg)
    if cfg.train.torch_threads > 0:
        torch.set_num_threads(cfg.train.torch_threads)
    torch.manual_seed(derive_seed(cfg.train.seed, "warmup"))
    model, tokenizer = load_policy(cfg.model)
    chat = ChatStream(tokenizer)
    prefix = chat.encode(cfg.rollout.action_prefix) if cfg.rollout.action_prefix else []
    reminder = env.turn_reminder()
    train = [gold_episode(env, t, chat, prefix, reminder) for t in env.tasks("train")]
    held_out = [gold_episode(env, t, chat, prefix, reminder) for t in env.tasks("test")]
    device = next(model.parameters()).device
    if tip_share > 0:  # the same variations, played with tips (a seeded draw per episode and epoch)
        rng_tips = random.Random(derive_seed(cfg.train.seed, "warmup_tips"))
        tip_train = [[tip_episode(env, t, chat, prefix, reminder, tip_share, rng_tips) for t in env.tasks("train")]
                     for _ in range(epochs)]
        probe = [s for t in env.tasks("test") for s in tip_episode(env, t, chat, prefix, reminder, 1.0, rng_tips)]

    def held_out_nll() -> float:
        with torch.no_grad():
            return float(torch.stack(action_nll(model, held_out, device)).mean())

    def tip_reading() -> dict:
        model.eval()
        return {name: tips_followed(model, chat, probe, temperature, cfg.train.seed)
                for name, temperature in (("greedy", 0.0), ("t1", 1.0))}

    before = held_out_nll()
    reading_before = tip_reading() if tip_share > 0 else {}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    rng = random.Random(derive_seed(cfg.train.seed, "warmup_order"))
    start, epoch_losses = time.time(), []
    model.train()
    for epoch in range(epochs):
        order = list(range(len(train)))
        rng.shuffle(order)
        total = 0.0
        for i in order:
            (loss,) = (action_nll(model, [train[i]], device) if tip_share <= 0
                       else [steps_nll(model, tip_train[epoch][i], chat.pad_id, device)])
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite warm-up loss at epoch {epoch}; nothing was saved")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item()
        epoch_losses.append(total / len(train))
        print(f"epoch {epoch + 1}/{epochs}: {'gold-' if tip_share <= 0 else ''}action NLL {epoch_losses[-1]:.3f} "
              f"({time.time() - start:.0f} s)", flush=True)
    model.eval()
    result = dict(family=family, epochs=epochs, lr=lr, episodes=len(train), held_out_episodes=len(held_out),
                  action_tokens=sum(sum(ep.mask) for ep in train), epoch_nll=epoch_losses,
                  held_out_nll_before=before, held_out_nll_after=held_out_nll(), wall_seconds=time.time() - start,
                  model=cfg.model.name_or_path, seed=cfg.train.seed, tip_share=tip_share)
    if tip_share > 0:
        shown = [s[2] for episode in tip_train for steps in episode for s in steps]
        result.update(tip_steps=sum(bool(n) for n in shown), steps=len(shown), tips_followed_before=reading_before,
                      tips_followed_after=tip_reading())
    out.mkdir(parents=True, exist_ok=True)
    save_model(model, tokenizer, out / "model", base_name=cfg.model.name_or_path)
    (out / "warmup.json").write_text(json.dumps(dict(result, config=to_dict(cfg)), indent=1) + "\n")
    print(f"held-out gold-action NLL {before:.3f} -> {result['held_out_nll_after']:.3f}; adapter in {out / 'model'}")
    return result


def main(argv: list[str] | None = None) -> dict:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--help" in argv or "-h" in argv:
        print(USAGE + config_help())
        return {}
    extra = {"family": "garden", "epochs": "3", "lr": "3e-4", "output": "", "tip_share": "0"}
    rest = split_options(argv, extra)
    try:
        cfg = load_config(*split_cli(rest))
        if not extra["output"]:
            raise ConfigError("--output=DIR is required (where the adapter goes)")
        epochs, lr, share = int(extra["epochs"]), float(extra["lr"]), float(extra["tip_share"])
        if epochs < 1 or lr <= 0 or not 0 <= share <= 1:
            raise ConfigError(f"--epochs must be >= 1, --lr > 0 and --tip_share in [0, 1], got {epochs}, {lr}, "
                              f"{share}")
        return warmup(cfg, extra["family"], epochs, lr, Path(extra["output"]), share)
    except ConfigError as err:
        sys.exit(f"config error: {err}")
    except ValueError as err:  # int()/float() of --epochs/--lr, an unknown family
        sys.exit(f"config error: {err}")


if __name__ == "__main__":
    main()
