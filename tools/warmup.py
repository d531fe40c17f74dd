"""Format warm-up: supervised fine-tuning of the LoRA on gold episodes of ANOTHER task family, before any RL.

    python -m tools.warmup --config configs/sanity_empo2.yaml [--section.key=value ...] [--family=garden] [--epochs=3]
                     [--lr=3e-4] --output=DIR
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
from losses import action_logprobs
from infra.models import load_policy, save_model
from rollout import Episode, full_history_turn
from infra.runtime import derive_seed

USAGE = """usage: python -m tools.warmup --config FILE [--family=garden] [--epochs=3] [--lr=3e-4] --output=DIR
                       [--section.key=value ...]

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


def warmup(cfg, family: str, epochs: int, lr: float, out: Path) -> dict:
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

    def held_out_nll() -> float:
        with torch.no_grad():
            return float(torch.stack(action_nll(model, held_out, device)).mean())

    before = held_out_nll()
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    rng = random.Random(derive_seed(cfg.train.seed, "warmup_order"))
    start, epoch_losses = time.time(), []
    model.train()
    for epoch in range(epochs):
        order = list(range(len(train)))
        rng.shuffle(order)
        total = 0.0
        for i in order:
            (loss,) = action_nll(model, [train[i]], device)
            if not torch.isfinite(loss):
                raise FloatingPointError(f"non-finite warm-up loss at epoch {epoch}; nothing was saved")
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += loss.item()
        epoch_losses.append(total / len(train))
        print(f"epoch {epoch + 1}/{epochs}: gold-action NLL {epoch_losses[-1]:.3f} ({time.time() - start:.0f} s)",
              flush=True)
    model.eval()
    result = dict(family=family, epochs=epochs, lr=lr, episodes=len(train), held_out_episodes=len(held_out),
                  action_tokens=sum(sum(ep.mask) for ep in train), epoch_nll=epoch_losses,
                  held_out_nll_before=before, held_out_nll_after=held_out_nll(), wall_seconds=time.time() - start,
                  model=cfg.model.name_or_path, seed=cfg.train.seed)
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
    extra = {"family": "garden", "epochs": "3", "lr": "3e-4", "output": ""}
    rest = split_options(argv, extra)
    try:
        cfg = load_config(*split_cli(rest))
        if not extra["output"]:
            raise ConfigError("--output=DIR is required (where the adapter goes)")
        epochs, lr = int(extra["epochs"]), float(extra["lr"])
        if epochs < 1 or lr <= 0:
            raise ConfigError(f"--epochs must be >= 1 and --lr > 0, got {epochs} and {lr}")
        return warmup(cfg, extra["family"], epochs, lr, Path(extra["output"]))
    except ConfigError as err:
        sys.exit(f"config error: {err}")
    except ValueError as err:  # int()/float() of --epochs/--lr, an unknown family
        sys.exit(f"config error: {err}")


if __name__ == "__main__":
    main()
