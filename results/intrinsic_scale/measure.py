"""How big is the novelty bonus next to ScienceWorld's extrinsic return? (docs/decisions.md, "Intrinsic reward")

    python results/intrinsic_scale/measure.py [--task power-component] [--variations 2] [--group 8] [--rollouts 2]

Plays GRPO groups of `--group` episodes of up to 30 steps with uniformly random valid actions (seeded), `--rollouts`
times per variation (novelty counts persist across rollouts, as in training), and reports per episode the
extrinsic return and the novelty part of the advantage's return under
  before: counts updated while stepping (episode-index order) and summed over steps (coef 1);
  after:  counts taken after the rollout (advantages.pay_novelty), averaged over steps (the removed
          `intrinsic.aggregate: mean`) and summed over steps (B_i as train.py takes it now).
A random policy visits about as many new states as an early policy does, which is when the bonus matters most.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from advantages import pay_novelty  # noqa: E402
from envs.base import Task  # noqa: E402
from envs.scienceworld import ScienceWorldConfig, ScienceWorldEnv  # noqa: E402
from memory import TipMemory  # noqa: E402
from rollout import Episode  # noqa: E402


def play_group(env: ScienceWorldEnv, task: Task, group: int, rng: random.Random):
    """`group` random-action episodes; returns (first observations, states reached per step, returns)."""
    firsts, reached, returns = [], [], []
    for _ in range(group):
        firsts.append(env.reset(task))
        states, total, done = [], 0.0, False
        while not done:
            obs, reward, done, info = env.step(rng.choice(env.valid_actions()))
            states.append(None if info["env_error"] else obs)
            total += reward
        reached.append(states)
        returns.append(total)
    return firsts, reached, returns


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--task", default="power-component")
    parser.add_argument("--variations", type=int, default=2)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--rollouts", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    env = ScienceWorldEnv(ScienceWorldConfig(tasks=[args.task], num_demos=0, max_steps=30))
    rng = random.Random(args.seed)
    before_memory, after_memory = TipMemory(), TipMemory()
    rows = []
    try:
        for variation in range(args.variations):
            task = Task(args.task, variation)
            for rollout in range(args.rollouts):
                firsts, reached, returns = play_group(env, task, args.group, rng)
                # before: visits counted while stepping, episodes in index order at every lockstep step
                for first in firsts:
                    before_memory.visit(task.key, first)
                bonus_before = [[] for _ in reached]
                for step in range(max(len(r) for r in reached)):
                    for i, states in enumerate(reached):
                        if step < len(states):
                            state = states[step]
                            bonus_before[i].append(0.0 if state is None else 1.0 / before_memory.visit(task.key, state))
                # after: advantages.pay_novelty, mean over steps
                episodes = [Episode(task=task, group=0, mode="no_memory", rewards=[0.0] * len(r), states=[f] + r)
                            for f, r in zip(firsts, reached)]
                pay_novelty(episodes, after_memory)
                for i, ep in enumerate(episodes):
                    rows.append({"variation": variation, "rollout": rollout, "steps": len(reached[i]),
                                 "extrinsic_return": returns[i], "intrinsic_before_sum": float(sum(bonus_before[i])),
                                 "intrinsic_after_mean": float(np.mean(ep.intrinsic)) if ep.intrinsic else 0.0,
                                 "intrinsic_after_sum": float(sum(ep.intrinsic))})  # B_i as train.py takes it
    finally:
        env.close()
    summary = {key: float(np.mean([r[key] for r in rows])) for key in
               ("steps", "extrinsic_return", "intrinsic_before_sum", "intrinsic_after_mean", "intrinsic_after_sum")}
    summary["abs_extrinsic_return"] = float(np.mean([abs(r["extrinsic_return"]) for r in rows]))
    summary.update(task=args.task, variations=args.variations, group=args.group, rollouts=args.rollouts,
                   episodes=len(rows), command=" ".join(["python", "results/intrinsic_scale/measure.py"] + sys.argv[1:]))
    out = Path(__file__).resolve().parent / f"{args.task}.json"
    out.write_text(json.dumps({"summary": summary, "episodes": rows}, indent=1))
    print(json.dumps(summary, indent=1))


if __name__ == "__main__":
    main()
