"""Pilot of issue 49 (a, b) on the hard-exploration lab, before any registration: can the warmed-up model find the
switch without tips, and does it play a per-state oracle tip?

    python results/pilot_switch/measure.py --adapter DIR [--seed 100] [--episodes 128] [--rounds 4] [--batch 32]
                                           [--section.key=value ...]

The lab (docs/sanity.md, "The hard-exploration lab"): configs/sanity_empo2.yaml with env.sanity.switch=true,
reward=success, difficulty 1, 3 stages (connect, flip the main switch, press, focus: 4 gold steps), 1 distractor,
max_steps 4 (no spare step), fatal false, plus any --section.key=value given. The policy: SmolLM2-135M-Instruct with
the LoRA adapter DIR (tools.warmup's model/), frozen.
(a) `--episodes` tip-free episodes of the training variations at T = 1 (mode no_memory): their success rate.
(b) `--rounds` rounds of `--batch` episodes at T = 1 with oracle tips (rollout.tip_source=oracle, memory.similarity=
    exact, rollout.tip_format=tip_only, top 3), the memory filled by the earlier rounds' episodes: per round the
    success rate and, over the steps whose turn showed a tip, the share where the model played the command a shown
    tip quotes (its output cleaned as the environment cleans it).
Writes pilot.json next to itself (or --out) and prints it. Every episode samples from its own seeded stream.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from config import load_config, split_cli  # noqa: E402
from engine.generation import ChatStream  # noqa: E402
from envs.sanity import SanityEnv  # noqa: E402
from envs.scienceworld.prompts import clean_action  # noqa: E402
from infra.models import load_policy  # noqa: E402
from infra.runtime import derive_seed  # noqa: E402
from memory import TipMemory  # noqa: E402
from rollout import pair_up, run_episodes, write_tips  # noqa: E402

LAB = ["--env.sanity.families=[lab]", "--env.sanity.switch=true", "--env.sanity.reward=success",
       "--env.sanity.difficulty=1", "--env.sanity.num_stages=3", "--env.sanity.num_distractors=1",
       "--env.sanity.max_steps=4", "--env.sanity.fatal=false", "--rollout.tip_source=oracle",
       "--memory.similarity=exact", "--rollout.tip_format=tip_only", "--memory.top_k=3"]


def play(model, chat, cfg, tasks, mode, memory, seed, tag):
    """One batch of episodes (one environment each), at T = 1, each on its own seeded stream."""
    envs = [SanityEnv(cfg.env.sanity) for _ in tasks]
    seeds = [derive_seed(seed, tag, i) for i in range(len(tasks))]
    return run_episodes(model, chat, pair_up(envs, tasks, list(range(len(tasks))), seeds), mode=mode, memory=memory,
                        cfg=replace(cfg.rollout, temperature=1.0))


def tip_use(episodes) -> tuple[int, int]:
    """(steps whose turn showed a tip, of those the steps where the model played a command a shown tip quotes)."""
    shown = played = 0
    for ep in episodes:
        for block, action in zip(ep.tips_shown, ep.actions):
            if block:
                shown += 1
                played += clean_action(action) in re.findall(r'"([^"]+)"', block)
    return shown, played


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--adapter", required=True)
    parser.add_argument("--seed", type=int, default=100)
    parser.add_argument("--episodes", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent / "pilot.json"))
    args, rest = parser.parse_known_args()
    cfg = load_config(*split_cli(["--config", "configs/sanity_empo2.yaml", *LAB,
                                  f"--model.init_adapter={args.adapter}", *rest]))
    torch.set_num_threads(cfg.train.torch_threads or torch.get_num_threads())
    model, tokenizer = load_policy(cfg.model)
    model.eval()
    chat = ChatStream(tokenizer)
    train = SanityEnv(cfg.env.sanity).tasks("train")
    start = time.time()

    succeeded = 0
    for b in range(0, args.episodes, args.batch):  # (a) without tips
        tasks = [train[i % len(train)] for i in range(b, min(b + args.batch, args.episodes))]
        succeeded += sum(ep.success for ep in play(model, chat, cfg, tasks, "no_memory", None, args.seed, f"a{b}"))
    result = {"no_tips": {"episodes": args.episodes, "successes": succeeded, "success_rate": succeeded / args.episodes},
              "oracle_rounds": []}
    print(json.dumps(result["no_tips"]), flush=True)

    memory = TipMemory.from_config(cfg.memory)
    for r in range(args.rounds):  # (b) with the oracle's tips, the memory filled by the earlier rounds
        tasks = [train[(r * args.batch + i) % len(train)] for i in range(args.batch)]
        episodes = play(model, chat, cfg, tasks, "on_policy_tips", memory, args.seed, f"b{r}")
        shown, played = tip_use(episodes)
        write_tips(model, chat, episodes, memory, cfg.rollout)
        memory.sync()
        row = {"round": r + 1, "episodes": len(episodes), "successes": sum(ep.success for ep in episodes),
               "steps": sum(len(ep.actions) for ep in episodes), "tip_steps": shown, "tip_command_played": played,
               "tip_command_share": played / max(shown, 1), "memory_entries": memory.size()}
        result["oracle_rounds"].append(row)
        print(json.dumps(row), flush=True)
    with_tips = [row for row in result["oracle_rounds"] if row["tip_steps"]]
    result["oracle"] = {"tip_steps": sum(r["tip_steps"] for r in with_tips),
                        "tip_command_share": sum(r["tip_command_played"] for r in with_tips)
                        / max(sum(r["tip_steps"] for r in with_tips), 1),
                        "success_rate_after_round_1": sum(r["successes"] for r in result["oracle_rounds"][1:])
                        / max(sum(r["episodes"] for r in result["oracle_rounds"][1:]), 1)}
    result.update(seconds=time.time() - start, adapter=args.adapter, seed=args.seed,
                  command=" ".join(["python", "results/pilot_switch/measure.py"] + sys.argv[1:]),
                  lab=LAB + rest)
    Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result["oracle"]))


if __name__ == "__main__":
    main()
