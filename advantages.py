"""Advantages: how much better each episode (or step) did than its group, and the novelty bonus that breaks its ties.
Pure functions over returns and groups, except `pay_novelty`, which counts the iteration's visits into the memory
and writes each step's bonus into its episode.

Paper map (arXiv 2602.23008; the equations are written out in docs/algorithm.md):

* `grpo_advantages`     - §2 / Eq. 1: A_i = (R_i - mean_j R_j) / (std_j R_j + eps) within one group (the N episodes
                          of one task row), std unbiased as in the reference; R_i is the score.
* `gigpo_step_advantages` (with `discounted_returns`, `anchor_state_advantages`, `pool_normalise`) - optional
                          (`loss.advantage: gigpo`), not in the paper: GiGPO (Feng et al. 2025, the WebShop anchor)
                          as verl-agent computes it, one advantage per step sample = episode level + weight x step
                          level. Episode level: each step row's score R_i - p_it against its group's pool, which
                          is every step row (`episode_stats="step"`, verl-agent's default) or one score per
                          episode (`"episode"`, GiGPO Eq. 3). Step level: rows of a group with the same anchor
                          state (the page without the task text, `Env.anchor_state()`) compared by their
                          discounted return G_it - p_it. The invalid-action penalty p_it hits its own row only.
* the novelty bonus     - §4.2, one section opened by its formulas and guarantees: `pay_novelty` counts every
                          rank's visits in memory.py's counts, then pays B_i = sum_t 1/n_t (= sum(Episode.intrinsic));
                          `novelty_advantages` makes it reach the advantage (the reference release computes it and
                          then ignores it) as a tie-breaker: centred among the episodes tied on i's score, bounded so
                          that it orders them by exploration but never reorders scores or flips a score advantage's
                          sign, and summing to zero in each tie class (docs/algorithm.md §6).
* `episode_advantages`  - what train.py calls once per iteration: GRPO or GiGPO (`loss.advantage`) on the played
                          episodes, then the novelty tie-breaker (`intrinsic.coef`).

Every function works in float64 and returns Python floats or tensors; a group of one has no baseline (advantage 0),
a group whose returns are all equal has no signal (0, never NaN); eps = 1e-6 as the reference. The trainer calls
`episode_advantages` once per iteration (train.py), which picks GRPO or GiGPO and adds the novelty term; the
objective that consumes them is losses.py.
"""
from __future__ import annotations

import math
from typing import Callable

import torch


def pool_normalise(values: torch.Tensor, pool: torch.Tensor, eps: float = 1e-6, divide_std: bool = True
                   ) -> torch.Tensor:
    """[M] values -> [M] (value - mean(pool)) / (std(pool) + eps) in float64, std unbiased (divide_std=False: only
    centred). A pool of fewer than two members, or whose members are all equal, gives exactly 0 everywhere: no
    baseline / no signal (and no rounding residue such as 1e-10 from mean(x, x, x) != x)."""
    values, pool = values.double(), pool.double()
    if pool.numel() < 2 or bool((pool == pool[0]).all()):
        return torch.zeros_like(values)
    centred = values - pool.mean()
    return centred / (pool.std(unbiased=True) + eps) if divide_std else centred


def grpo_advantages(returns: torch.Tensor, eps: float = 1e-6, divide_std: bool = True) -> torch.Tensor:
    """returns: [N] episode returns of one group -> [N] advantages (divide_std=False: R - mean, GiGPO "w/o std")."""
    return pool_normalise(returns, returns, eps, divide_std).float()


def group_advantages(returns: list[float], group_ids: list, eps: float = 1e-6, divide_std: bool = True
                     ) -> list[float]:
    """GRPO advantages for a flat list of episodes; episodes with equal group_id form one group."""
    advantages = [0.0] * len(returns)
    groups: dict = {}
    for index, gid in enumerate(group_ids):
        groups.setdefault(gid, []).append(index)
    for members in groups.values():
        adv = grpo_advantages(torch.tensor([returns[i] for i in members], dtype=torch.float64), eps, divide_std)
        for i, value in zip(members, adv.tolist()):
            advantages[i] = value
    return advantages


def discounted_returns(rewards: list[float], gamma: float) -> list[float]:
    """[T] step rewards -> [T] returns from each step on: R_t = sum_{k >= t} gamma^(k - t) r_k."""
    out, running = [0.0] * len(rewards), 0.0
    for t in range(len(rewards) - 1, -1, -1):
        running = rewards[t] + gamma * running
        out[t] = running
    return out


def anchor_state_advantages(states: list[list[str]], step_returns: list[list[float]], group_ids: list,
                            eps: float = 1e-6, divide_std: bool = True) -> list[list[float]]:
    """GiGPO's step-level advantages. states[i][t]: the anchor state before episode i's action t; step_returns[i][t]:
    its discounted return (gigpo_step_advantages passes G_it - p_it). Steps of one GRPO group (same group id) whose
    states are identical form an anchor-state group; within it A_t = (R_t - mean) / (std + eps) (divide_std=False:
    R_t - mean, GiGPO "w/o std"). A state seen once, or with equal returns, gets exactly 0 (`pool_normalise`)."""
    anchors: dict = {}
    for i, (gid, episode_states) in enumerate(zip(group_ids, states)):
        for t, state in enumerate(episode_states):
            anchors.setdefault((gid, state), []).append((i, t))
    out = [[0.0] * len(r) for r in step_returns]
    for members in anchors.values():
        returns = torch.tensor([step_returns[i][t] for i, t in members], dtype=torch.float64)
        values = pool_normalise(returns, returns, eps, divide_std)
        for (i, t), value in zip(members, values.tolist()):
            out[i][t] = value
    return out


def gigpo_step_advantages(step_rewards: list[list[float]], penalties: list[list[float]], anchors: list[list[str]],
                          group_ids: list, *, gamma: float, weight: float, divide_std: bool,
                          episode_stats: str = "step", eps: float = 1e-6) -> tuple[list[list[float]], int]:
    """GiGPO's advantage of every step sample (one sample per step), computed as verl-agent computes it.

    Inputs: one list per episode i, one entry per step t in it (all of an episode's lists have equal length).
      step_rewards[i][t]  the environment's reward for action t WITHOUT the invalid-action penalty
      penalties[i][t]     the invalid-action penalty charged to action t (0.0 for a well-formed output)
      anchors[i][t]       the anchor state before action t: the observation without task text (Env.anchor_state())
      group_ids[i]        the GRPO group (task row) of episode i; episodes and anchors are compared only within one

    Each step row (i, t) gets two scores; its penalty enters that row only (verl-agent's
    apply_invalid_action_penalty), never R_i or an earlier step's return:
      episode score  E_it = R_i - p_it                R_i = sum_t r_it
      step score     S_it = G_it - p_it               G_it = sum_{k >= t} gamma^(k - t) r_ik
    Episode level (GiGPO Eq. 3): E_it is normalised with the mean/std of its group's pool:
      episode_stats="step"    - the pool is E of every step row of the group, so a longer episode weighs more
                                (verl-agent's default, episode_norm_reward(compute_mean_std_cross_steps=True));
      episode_stats="episode" - one score per episode, that of its first row E_i0 (= R_i unless step 0
                                was penalised; verl-agent's compute_mean_std_cross_steps=False, rows in step order).
    Step level (Eq. 6-7): the rows of one group with equal anchors form an anchor group; S is normalised in it.
    A_it = episode level + weight x step level (Eq. 8). divide_std=False only centres both levels (verl-agent's
    "mean_norm", GiGPO "w/o std"); True divides by (std + eps), std unbiased. A pool or anchor group with fewer
    than two members, or all members equal, gives exactly 0 to all its rows (verl-agent: one-member anchor groups
    0 too, but a one-member episode pool keeps its raw score and a zero-std pool divides by eps alone; in
    "episode" mode this also drops the episode-level penalty of a row whose group's pool is all equal).

    Returns (advantages[i][t], the number of rows whose step-level advantage is not 0 and counts: 0 at weight 0)."""
    if episode_stats not in ("step", "episode"):
        raise ValueError(f"episode_stats must be 'step' or 'episode', not {episode_stats!r}")
    n = len(step_rewards)
    if not len(penalties) == len(anchors) == len(group_ids) == n:
        raise ValueError("step_rewards, penalties, anchors and group_ids need one entry per episode")
    for i in range(n):
        if not len(step_rewards[i]) == len(penalties[i]) == len(anchors[i]):
            raise ValueError(f"episode {i}: step_rewards, penalties and anchors differ in length")

    # Row scores (float64 tensors, one per episode).
    rewards = [torch.tensor(r, dtype=torch.float64) for r in step_rewards]
    pens = [torch.tensor(p, dtype=torch.float64) for p in penalties]
    episode_scores = [r.sum() - p for r, p in zip(rewards, pens)]  # [T_i]
    step_scores = [torch.tensor(discounted_returns(r, gamma), dtype=torch.float64) - p
                   for r, p in zip(step_rewards, pens)]  # [T_i]

    # Episode level: each group's pool (all rows, or each episode's first row), applied to every row.
    episode_level: list[torch.Tensor] = [torch.zeros(0, dtype=torch.float64)] * n
    members: dict = {}
    for i, gid in enumerate(group_ids):
        members.setdefault(gid, []).append(i)
    for group in members.values():
        rows = [episode_scores[i] for i in group if len(episode_scores[i])]
        if not rows:
            continue
        pool = torch.cat(rows) if episode_stats == "step" else torch.stack([r[0] for r in rows])
        for i in group:
            episode_level[i] = pool_normalise(episode_scores[i], pool, eps, divide_std)

    # Step level: anchor groups inside each group.
    step_level = anchor_state_advantages(anchors, [s.tolist() for s in step_scores], group_ids, eps, divide_std)
    advantages = [[float(e) + weight * s for e, s in zip(ep_level.tolist(), st_level)]
                  for ep_level, st_level in zip(episode_level, step_level)]
    # rows whose step-level credit reaches the advantage (none at weight 0: GRPO as verl-agent runs it)
    credited = sum(value != 0.0 for st_level in step_level for value in st_level) if weight else 0
    return advantages, credited


# ----------------------------------------------------------------------------- the novelty bonus (paper §4.2)
#
#   count   n_t = visits of the state step t reached, in its task's memory (memory.TipMemory.visit: the same state
#               = the same text after lower-casing and collapsing whitespace), every rank's visits of the iteration
#               counted before any is paid                                                        pay_novelty
#   pay     b_t = 1 / n_t (1 for a new state), B_i = sum_t b_t = sum(Episode.intrinsic)            pay_novelty
#   break   A_i += c h_c (t_i - mean_c t) / 2,  t_i = tanh(B_i - mean_c B),  0 <= c < 1      novelty_advantages
#   ties    (c: the episodes of i's group with exactly its score; h_c: half the gap to the nearest other score
#           level, at most |a_c|)
#
# Guarantees: B_i is the same on 1 process and on 8 for the same episodes, and does not depend on their order; within
# a group more new states than a tied episode give a larger advantage, a higher score stays strictly higher, a score
# advantage never changes sign, and each tie class's terms sum to zero. Paid only where it counts (`counts_novelty`:
# intrinsic.coef > 0, in the modes intrinsic.memory_modes_only allows). Tests: tests/test_losses.py (hand groups,
# 2000 random groups), tests/test_rollout.py, tests/test_distributed.py (1 vs 2 processes).


def counts_novelty(mode: str, memory, intrinsic) -> bool:
    """Whether this rollout pays the novelty bonus (needs the memory's visit counts)."""
    if memory is None or intrinsic is None or intrinsic.coef <= 0:
        return False
    return mode != "no_memory" or not intrinsic.memory_modes_only


def pay_novelty(episodes: list, memory, gather: Callable[[object], list] | None = None) -> None:
    """Count every state this iteration's rollout visited, on every rank, THEN pay each step 1/n of the state it
    reached (`Episode.states`; a None state, after an environment crash, is neither counted nor paid).

    gather(obj) returns every rank's obj in rank order (one collective; None = single process): every rank counts
    every rank's visits before any bonus is paid, so an episode's B_i = sum_t 1/n_t is the same on 1 process and on
    8 for the same episodes, and the counts stay identical on all ranks. Counting first makes the bonus independent
    of episode order too (counting while stepping paid the first episode to reach a new state 1, the next 1/2)."""
    mine = [(ep.task.key, state) for ep in episodes for state in ep.states if state is not None]
    for visits in gather(mine) if gather is not None else [mine]:
        for key, state in visits:
            memory.visit(key, state)
    for ep in episodes:
        ep.intrinsic = [0.0 if s is None else 1.0 / memory.visit_count(ep.task.key, s) for s in ep.states[1:]]


def novelty_advantages(advantages: list, bonuses: list[float], scores: list[float], group_ids: list, coef: float,
                       eps: float = 1e-6, divide_std: bool = True) -> list:
    """Add EMPO²'s novelty term as a tie-breaker that never overturns the score and sums to zero:
    A_i += coef * h_c * (t_i - mean over c of t) / 2,  t_i = tanh(B_i - mean over c of B),  0 <= coef < 1.

    advantages[i]: episode i's score advantage, or one per step (GiGPO: the same term is added to each); bonuses[i]:
    its novelty B_i = sum_t 1/n_t in new states; scores[i]: the score its group advantage was computed from. c is
    i's tie class: the episodes of its group with exactly its score. a_c = the class's GRPO level, (score - group
    mean) / (std + eps) (divide_std=False: only centred, as GiGPO "w/o std"); h_c = min(gap_c / 2, |a_c|), gap_c
    = the distance to the nearest other level in the group (gap_c / 2 alone where a_c = 0; 1 where the whole group
    ties). The mean of t is over the class's rows (an episode's one advantage, or each of its steps), so the class's
    terms sum to 0 over the rows they are added to. A class of one, or a group of one, gets no term. Hence, within
    a group:
    * more new states than a tied episode => a larger advantage (strictly, until tanh rounds to 1 past ~19 states);
    * a higher score => a strictly higher level + term: |t_i - mean t| < 2, so |term| < coef h_c and each of two
      classes moves by < gap / 2 (coef < 1);
    * a score level never changes sign: the term is < |a_c| in size;
    * the group's advantages sum to what its score advantages sum to (no net push on a class's tokens);
    * the term is linear in coef; the paper's x0.5 / x2 ablation scales alpha in R = score + alpha B, which here
      has no exact counterpart (docs/decisions.md, "Intrinsic reward").
    With per-step advantages (GiGPO) these hold for the episode's score level a_c, not for each step's value."""
    if not 0.0 <= coef < 1.0:  # coef >= 1 could move a level by its full gap or size
        raise ValueError(f"novelty coef must be in [0, 1), got {coef}")
    groups: dict = {}
    for index, gid in enumerate(group_ids):
        groups.setdefault(gid, []).append(index)
    out = list(advantages)
    rows = [len(a) if isinstance(a, list) else 1 for a in advantages]  # what the term is added to, per episode
    for members in groups.values():
        classes: dict = {}
        for i in members:
            classes.setdefault(scores[i], []).append(i)
        if len(members) == len(classes):  # no ties: nothing to break
            continue
        group_scores = torch.tensor([scores[i] for i in members], dtype=torch.float64)
        level = dict(zip(group_scores.tolist(), pool_normalise(group_scores, group_scores, eps, divide_std).tolist()))
        for score, tied in classes.items():
            weight = sum(rows[i] for i in tied)
            if len(tied) < 2 or weight == 0:
                continue
            a = level[score]
            gap = min((abs(a - level[other]) for other in classes if other != score), default=None)
            h = 1.0 if gap is None else (gap / 2 if a == 0.0 else min(gap / 2, abs(a)))
            mean = sum(bonuses[i] for i in tied) / len(tied)
            t = {i: math.tanh(bonuses[i] - mean) for i in tied}
            t_mean = sum(rows[i] * t[i] for i in tied) / weight  # over the class's rows: the terms sum to zero
            for i in tied:
                extra = coef * h * (t[i] - t_mean) / 2
                out[i] = [v + extra for v in out[i]] if isinstance(out[i], list) else out[i] + extra
    return out


def episode_advantages(played: list, loss_cfg, coef: float) -> tuple[list, dict]:
    """(advantages, counts) of an iteration's played episodes (rollout.Episode), as train.py uses them: GRPO's per
    group of N episodes, or with loss.advantage "gigpo" GiGPO's per step as verl-agent computes it, then the novelty
    bonus B_i = sum_t 1/n_t (the sum of Episode.intrinsic) as the tie-breaker on the score (`novelty_advantages`,
    coef = intrinsic.coef; 0 = none). loss_cfg: config.LossConfig; counts: {"steps_with_anchor_credit"} (GiGPO)."""
    groups, counts = [ep.group for ep in played], {}
    if loss_cfg.advantage == "gigpo":
        raw = [[r + p for r, p in zip(ep.rewards, ep.penalties)] for ep in played]  # rewards without penalty
        scores = [sum(r) for r in raw]  # R_i, what the episode level compares (before each row's penalty)
        advantages, credited = gigpo_step_advantages(
            raw, [ep.penalties for ep in played], [ep.anchors for ep in played], groups,
            gamma=loss_cfg.gigpo_gamma, weight=loss_cfg.gigpo_weight, divide_std=loss_cfg.gigpo_divide_std,
            episode_stats=loss_cfg.gigpo_episode_stats)
        counts["steps_with_anchor_credit"] = float(credited)
    else:
        scores = [ep.extrinsic_return for ep in played]
        advantages = group_advantages(scores, groups)
    if coef:
        advantages = novelty_advantages(
            advantages, [sum(ep.intrinsic) for ep in played], scores, groups, coef,
            divide_std=loss_cfg.advantage != "gigpo" or loss_cfg.gigpo_divide_std)
    return advantages, counts
