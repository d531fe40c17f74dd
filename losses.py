"""The EMPO² objective as pure functions: tensors and masks in, loss and metrics out.

Paper map (arXiv 2602.23008; the equations are written out in docs/algorithm.md):

* `grpo_advantages`     - §2 / Eq. 1: A_i = (R_i - mean_j R_j) / (std_j R_j + eps) within one group (the N episodes
                          of one task row), std unbiased as in the reference. R_i is the score (with
                          intrinsic.combine=return also + coef * B_i).
* `novelty_advantages`  - §4.2's novelty bonus, which really reaches the advantage (the reference release computes it
                          and then ignores it): A_i += coef * (B_i - group mean), B_i = sum_t 1/n_t (rollout.py,
                          memory.py), centred but not std-normalised, so a tie on the score goes to the explorer and
                          a real score difference still decides (docs/algorithm.md).
* `gigpo_step_advantages` (with `discounted_returns`, `anchor_state_advantages`, `pool_normalise`) - optional
                          (`loss.advantage: gigpo`), not in the paper: GiGPO (Feng et al. 2025, the WebShop anchor)
                          as verl-agent computes it, one advantage per step sample = episode level + weight x step
                          level. Episode level: each step row's score R_i - p_it against its group's pool, which
                          is every step row (`episode_stats="step"`, verl-agent's default) or one score per
                          episode (`"episode"`, GiGPO Eq. 3). Step level: rows of a group with the same anchor
                          state (the page without the task text, `Env.anchor_state()`) compared by their
                          discounted return G_it - p_it. The invalid-action penalty p_it hits its own row only.
* `clipped_policy_loss` - Eq. 1 with the reference's clip values: ratio = exp(logp - old_logp), asymmetric clip
                          [1 - 0.2, 1 + 0.3], dual clip c = 10 for negative advantages; Eq. 2's low-probability
                          token mask (drop tokens whose current probability is below delta, log delta = -5) for
                          the modes it is configured for (default: off-policy only); no entropy term; + kl_coef x
                          KL(pi || pi_ref) as verl-agent (`reference_kl`, WebShop; 0 for ScienceWorld as the paper).
* `action_logprobs`     - log pi(a_t | context) of action tokens only, in fp32, + the entropy (a metric, no grad).
* `sequence_action_logprobs`, `compute_old_logprobs`, `samples_loss` - the model-facing side: one forward pass
                          over right-padded sequences whose LM head sees only each row's own action positions
                          (a [sum of action tokens, V] logit tensor), the old log-probs once per iteration,
                          and the objective of a micro-batch of samples;
                          `length_buckets` forms micro-batches of similar length so little compute goes to padding.

Contexts per mode: samples.py; docs/algorithm.md (paper Table 3).

Aggregation (`loss.aggregation`, `loss_weights`): every action token carries a weight w and a mini-batch's loss is
sum(w * keep * l) / sum(w) over the whole mini-batch on all ranks. The default "step" is the reference's: w =
1 / len(its action), so each step's tokens are averaged and steps are averaged over the mini-batch
(seq-mean-token-mean over step samples, verl with one step per sample). A packed full-history episode is one
sequence for speed, yet each of its steps weighs exactly what its own step sample would (docs/decisions.md, "Loss weights").
The low-probability indicator of Eq. 2 multiplies the term; the 1/len normaliser stays. "episode" (each episode
weighs 1) and "token" (each token weighs 1) are ablations.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from branches import branch_inputs


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
                          episode_stats: str = "step", eps: float = 1e-6,
                          episode_bonus: list[float] | None = None) -> tuple[list[list[float]], int]:
    """GiGPO's advantage of every step sample (one sample per step), computed as verl-agent computes it.

    Inputs: one list per episode i, one entry per step t in it (all of an episode's lists have equal length).
      step_rewards[i][t]  the environment's reward for action t WITHOUT the invalid-action penalty
      penalties[i][t]     the invalid-action penalty charged to action t (0.0 for a well-formed output)
      anchors[i][t]       the anchor state before action t: the observation without task text (Env.anchor_state())
      group_ids[i]        the GRPO group (task row) of episode i; episodes and anchors are compared only within one
      episode_bonus[i]    optional, added to episode i's episode-level score only (EMPO²'s novelty term); None: 0

    Each step row (i, t) gets two scores; its penalty enters that row only (verl-agent's
    apply_invalid_action_penalty), never R_i or an earlier step's return:
      episode score  E_it = R_i + bonus_i - p_it      R_i = sum_t r_it
      step score     S_it = G_it - p_it               G_it = sum_{k >= t} gamma^(k - t) r_ik
    Episode level (GiGPO Eq. 3): E_it is normalised with the mean/std of its group's pool:
      episode_stats="step"    - the pool is E of every step row of the group, so a longer episode weighs more
                                (verl-agent's default, episode_norm_reward(compute_mean_std_cross_steps=True));
      episode_stats="episode" - one score per episode, that of its first row E_i0 (= R_i + bonus_i unless step 0
                                was penalised; verl-agent's compute_mean_std_cross_steps=False, rows in step order).
    Step level (Eq. 6-7): the rows of one group with equal anchors form an anchor group; S is normalised in it.
    A_it = episode level + weight x step level (Eq. 8). divide_std=False only centres both levels (verl-agent's
    "mean_norm", GiGPO "w/o std"); True divides by (std + eps), std unbiased. A pool or anchor group with fewer
    than two members, or all members equal, gives exactly 0 to all its rows (verl-agent: one-member anchor groups
    0 too, but a one-member episode pool keeps its raw score and a zero-std pool divides by eps alone; in
    "episode" mode this also drops the episode-level penalty of a row whose group's pool is all equal).

    Returns (advantages[i][t], the number of rows whose step-level advantage is not 0)."""
    if episode_stats not in ("step", "episode"):
        raise ValueError(f"episode_stats must be 'step' or 'episode', not {episode_stats!r}")
    n = len(step_rewards)
    bonus = [0.0] * n if episode_bonus is None else list(episode_bonus)
    if not len(penalties) == len(anchors) == len(group_ids) == len(bonus) == n:
        raise ValueError("step_rewards, penalties, anchors, group_ids (and episode_bonus) need one entry per episode")
    for i in range(n):
        if not len(step_rewards[i]) == len(penalties[i]) == len(anchors[i]):
            raise ValueError(f"episode {i}: step_rewards, penalties and anchors differ in length")

    # Row scores (float64 tensors, one per episode).
    rewards = [torch.tensor(r, dtype=torch.float64) for r in step_rewards]
    pens = [torch.tensor(p, dtype=torch.float64) for p in penalties]
    episode_scores = [r.sum() + b - p for r, b, p in zip(rewards, bonus, pens)]  # [T_i]
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
    credited = sum(value != 0.0 for st_level in step_level for value in st_level)
    return advantages, credited


def novelty_advantages(advantages: list, bonuses: list[float], group_ids: list, coef: float) -> list:
    """A_i + coef * (B_i - mean_j B_j) within each group (intrinsic.combine = "advantage", the default).

    advantages[i]: episode i's score advantage (or one per step: the same term is added to each); bonuses[i]: its
    novelty B_i = sum_t 1/n_t, in units of "new states" (a state never seen before pays 1). The bonus is centred in
    the group but NOT divided by its std: one new state more than the group's average is worth `coef` advantage
    units, whatever the group, while a real score difference is worth about +-1 (std-normalised). So ties on the
    score are broken by exploration, tiny bonus differences stay tiny, and the score decides otherwise."""
    groups: dict = {}
    for index, gid in enumerate(group_ids):
        groups.setdefault(gid, []).append(index)
    out = list(advantages)
    for members in groups.values():
        mean = sum(bonuses[i] for i in members) / len(members)
        for i in members:
            extra = coef * (bonuses[i] - mean) if len(members) > 1 else 0.0
            out[i] = [a + extra for a in out[i]] if isinstance(out[i], list) else out[i] + extra
    return out


AGGREGATIONS = ("step", "episode", "token")


def action_runs(mask: list[int]) -> list[int]:
    """The lengths of the runs of consecutive 1s in an action mask: one run per action (step) of a sequence."""
    runs, length = [], 0
    for m in list(mask) + [0]:
        if m:
            length += 1
        elif length:
            runs.append(length)
            length = 0
    return runs


def loss_weights(mask: list[int], aggregation: str, episode_tokens: int = 0) -> list[float]:
    """One loss weight per action token of a sequence (in order); a mini-batch's loss is sum(w * l) / sum(w).

    "step" (the reference): 1 / len(its action), so every step weighs 1 whatever its length and however it is
        packed: a packed episode contributes exactly what its per-step samples would (seq-mean-token-mean over
        step samples, verl's loss with one step per sample);
    "episode": 1 / episode_tokens (the action tokens of the whole episode, over all its samples): every episode
        weighs 1 whatever its number of steps (this project's weighting before step weights);
    "token": 1, every action token weighs the same (verl's token-mean over a mini-batch)."""
    runs = action_runs(mask)
    if aggregation == "step":
        return [1.0 / n for n in runs for _ in range(n)]
    if aggregation == "episode":
        return [1.0 / max(episode_tokens, 1)] * sum(runs)
    if aggregation == "token":
        return [1.0] * sum(runs)
    raise ValueError(f"unknown loss aggregation {aggregation!r}; expected one of {AGGREGATIONS}")


def action_logprobs(logits: torch.Tensor, targets: torch.Tensor, entropy_chunk: int = 256
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [..., V] at the positions that predict the target tokens ([N, V] or [B, K, V]); targets: [...] ids.

    Returns (logp [...], entropy [...]) in fp32: the logits are cast to fp32 before the log-softmax (bf16 logits
    would make ratios noisy). logp carries the gradient; its log-softmax output is the one [..., V] tensor that
    backward keeps. The entropy is only a metric: computed without autograd (`entropy_metric`), it adds nothing
    that backward keeps and no tensor larger than [entropy_chunk, V].
    """
    return gathered_logprobs(F.log_softmax(logits, dim=-1, dtype=torch.float32), targets, entropy_chunk)


def gathered_logprobs(log_probs: torch.Tensor, targets: torch.Tensor, entropy_chunk: int = 256
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 log-softmax output [..., V] and target ids [...] -> (logp [...] with grad, entropy [...] without)."""
    logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    return logp, entropy_metric(log_probs, entropy_chunk)


@torch.no_grad()
def entropy_metric(log_probs: torch.Tensor, chunk: int = 256) -> torch.Tensor:
    """-sum_v p log p over the last dim of fp32 log-probs [..., V] -> [...], without autograd (never requires grad),
    `chunk` rows at a time so the temporaries stay [chunk, V]."""
    flat = log_probs.detach().reshape(-1, log_probs.shape[-1])
    out = torch.empty(flat.shape[0], dtype=flat.dtype, device=flat.device)
    for start in range(0, flat.shape[0], chunk):
        block = flat[start : start + chunk]
        out[start : start + chunk] = -block.exp().mul_(block).sum(-1)
    return out.reshape(log_probs.shape[:-1])


def reference_kl(logp: torch.Tensor, ref_logp: torch.Tensor, estimator: str = "low_var_kl") -> torch.Tensor:
    """Per-token estimate of KL(pi || pi_ref) at the sampled tokens (verl's kl_penalty), [S, T] -> [S, T]:
    k1 = logp - ref; k2 = (logp - ref)^2 / 2; low_var_kl (k3) = exp(ref - logp) - (ref - logp) - 1, in [-10, 10]."""
    diff = logp - ref_logp
    if estimator == "k1":
        return diff
    if estimator == "k2":
        return 0.5 * diff.square()
    if estimator == "low_var_kl":
        return torch.clamp(torch.exp(-diff) + diff - 1.0, -10.0, 10.0)
    raise ValueError(f"unknown KL estimator {estimator!r} (low_var_kl | k1 | k2)")


def clipped_policy_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    action_mask: torch.Tensor,
    *,
    clip_low: float = 0.2,
    clip_high: float = 0.3,
    dual_clip: float = 10.0,
    lowprob_mask: str = "none",
    lowprob_logp_threshold: float = -5.0,
    entropy: torch.Tensor | None = None,
    token_weights: torch.Tensor | None = None,
    normaliser: float | None = None,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
    kl_estimator: str = "low_var_kl",
) -> tuple[torch.Tensor, dict[str, float]]:
    """The per-token clipped surrogate, masked and aggregated.

    logp:          [S, T] current-policy log-probs of the action tokens (requires grad)
    old_logp:      [S, T] behaviour/old log-probs (no grad)
    advantages:    [S, T] per-token advantages
    action_mask:   [S, T] 1 on real action tokens, 0 on padding
    lowprob_mask:  "none" | "token" (paper Eq. 2: drop tokens with logp.detach() < threshold)
                   | "sequence" (reference: drop a whole sample if any old log-prob < threshold)
    entropy:       [S, T] optional, only for the metric
    token_weights: [S, T] each token's weight w (`loss_weights`); default 1 / (action tokens of its sample)
    normaliser:    what the weighted sum is divided by (the mini-batch's units, all ranks); default S
    ref_logp:      [S, T] reference-policy log-probs (no grad): + kl_coef x KL(pi || pi_ref), the same weights,
                   over every action token (the low-probability mask drops only the surrogate, as verl)

    Returns (loss = sum_{s,t} w * keep * l / normaliser, metrics: floats over action tokens). With the defaults:
    the mean over samples of per-sample token means.
    """
    action_mask = action_mask.float()
    log_ratio = torch.clamp(logp - old_logp, -20.0, 20.0)
    ratio = torch.exp(log_ratio)
    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    # Dual clip: with A < 0 a huge ratio would make the loss unbounded; cap it at -A * c.
    loss_dual = torch.minimum(loss_ppo, -advantages * dual_clip)
    token_loss = torch.where(advantages < 0, loss_dual, loss_ppo)  # [S, T]

    keep = action_mask.clone()
    if lowprob_mask == "token":
        keep = keep * (logp.detach() >= lowprob_logp_threshold).float()
    elif lowprob_mask == "sequence":
        low = ((old_logp < lowprob_logp_threshold).float() * action_mask).sum(-1, keepdim=True) > 0
        keep = keep * (~low).float()
    elif lowprob_mask != "none":
        raise ValueError(f"unknown lowprob_mask {lowprob_mask!r}")

    if token_weights is None:  # token mean per sample: the 1/T normaliser of Eq. 1, before any masking
        token_weights = action_mask / action_mask.sum(-1, keepdim=True).clamp(min=1.0)
    if normaliser is None:
        normaliser = float(logp.shape[0])
    loss = (token_loss * keep * token_weights).sum() / max(normaliser, 1e-12)
    kl = None if ref_logp is None else reference_kl(logp, ref_logp, kl_estimator) * action_mask
    if kl is not None and kl_coef:
        loss = loss + kl_coef * (kl * token_weights).sum() / max(normaliser, 1e-12)

    with torch.no_grad():
        n_tokens = action_mask.sum().clamp(min=1.0)
        n_kept = keep.sum().clamp(min=1.0)
        clipped = (token_loss.detach() != loss_unclipped.detach()).float() * action_mask
        dual = ((advantages < 0) & (loss_dual.detach() < loss_ppo.detach())).float() * action_mask
        masked_ratio = ratio.detach() * action_mask
        metrics = {
            "ratio_mean": (masked_ratio.sum() / n_tokens).item(),
            "ratio_max": masked_ratio.max().item() if action_mask.any() else 0.0,
            "clip_frac": (clipped.sum() / n_tokens).item(),
            "dual_clip_frac": (dual.sum() / n_tokens).item(),
            "masked_frac": 1.0 - (keep.sum() / n_tokens).item(),
            # k3 estimator of KL(old || new) = E_old[(r - 1) - log r], over the tokens that are trained on
            "approx_kl": ((((ratio - 1) - log_ratio).detach() * keep).sum() / n_kept).item(),
            "action_tokens": float(action_mask.sum().item()),
        }
        if kl is not None:
            metrics["kl_ref"] = (kl.detach().sum() / n_tokens).item()
        if entropy is not None:
            metrics["entropy"] = ((entropy.detach() * action_mask).sum() / n_tokens).item()
    return loss, metrics


# ----------------------------------------------------------------------------- forward passes over samples


def sequence_action_logprobs(model, seqs: list[list[int]], masks: list[list[int]], pad_id: int, device,
                             layouts: list | None = None) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Log-probs (and entropies) of the action tokens of each sequence, in ONE forward pass (right padding).

    seqs[i]: token ids; masks[i]: 1 on action tokens. The decoder runs once over the padded [B, W] batch; the LM
    head then sees, for each row, only the positions that predict one of ITS action tokens: `logits_to_keep` is
    the boolean [B, W] mask `predicts` (transformers slices `hidden_states[predicts]` before the head), so the
    logit tensor is [sum_i n_i, V], not [B, W, V] nor [B, K_union, V] (rows whose actions sit at different places
    would each pay for the union of all rows' action positions). The call goes through the whole model, so peft,
    autocast and FSDP (the LM head belongs to the root unit) see an ordinary forward. Log-probs are fp32 and
    carry the gradient; the entropies are a metric without grad (`action_logprobs`).
    Returns ([n_actions_i] log-probs per sequence, [n_actions_i] entropies per sequence); a first token marked
    as an action is not scored (nothing predicts it). layouts[i]: a branches.BranchPacked (None: plain causal)."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    action = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, (seq, mask) in enumerate(zip(seqs, masks)):
        ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
        action[row, : len(mask)] = torch.tensor(mask, dtype=torch.bool)
    predicts = action_predictors(action)
    targets = ids[:, 1:][predicts[:, :-1]]  # [N] the token each kept position predicts, in the same row-major order
    counts = predicts.sum(-1).tolist()
    inputs = dict(attention_mask=attention.to(device))
    if layouts is not None and any(layout is not None for layout in layouts):  # positions, 4-D mask (branches.py)
        inputs = branch_inputs(model, seqs, layouts, width, device)
    # As `action_logprobs`, but no name holds the head's output: it is freed once its fp32 log-softmax exists.
    log_probs = F.log_softmax(model(input_ids=ids.to(device), logits_to_keep=predicts.to(device), use_cache=False,
                                    **inputs).logits, dim=-1, dtype=torch.float32)  # [N, V]
    if log_probs.shape[:-1] != (sum(counts),):
        raise RuntimeError(f"the model returned logits of shape {tuple(log_probs.shape)} for a boolean [B, W] "
                           f"logits_to_keep with {sum(counts)} True entries; sequence_action_logprobs needs a "
                           f"causal LM whose forward slices with transformers' slice_logits_to_keep")
    logp, entropy = gathered_logprobs(log_probs, targets.to(log_probs.device))  # [N] each
    return list(logp.split(counts)), list(entropy.split(counts))


def action_predictors(action: torch.Tensor) -> torch.Tensor:
    """[B, W] action-token mask -> [B, W] mask of the positions whose logits predict an action token (position t
    predicts token t + 1; the last column predicts nothing)."""
    predicts = torch.zeros_like(action)
    predicts[:, :-1] = action[:, 1:]
    return predicts


def length_buckets(lengths: list[int], micro_batch_size: int) -> list[list[int]]:
    """Indices grouped into micro-batches of similar length (sorted, then cut), so padding stays small. Exact: a
    mini-batch's gradient is the same sum whichever micro-batch a sample lands in."""
    order = sorted(range(len(lengths)), key=lambda i: lengths[i])
    return [order[i : i + micro_batch_size] for i in range(0, len(order), max(1, micro_batch_size))]


def padded_tokens(lengths: list[int], micro_batches: list[list[int]]) -> tuple[int, int]:
    """(pad positions, all positions) of forward passes over these micro-batches (each padded to its longest)."""
    total = sum(max(lengths[i] for i in mb) * len(mb) for mb in micro_batches if mb)
    return total - sum(lengths[i] for mb in micro_batches for i in mb), total


@torch.no_grad()
def compute_old_logprobs(model, samples, pad_id: int, device, micro_batch_size: int) -> tuple[int, int]:
    """Fill `sample.old_logp` (the ratio's denominator), in the sample's old context(s), for every sample that has
    none yet (samples.build_samples gives most samples the log-probs recorded while sampling).
    Returns (pad positions, all positions) of its forward passes."""
    model.eval()
    # One forward unit per old context: (sample index, part index, ids, mask); most samples have one part.
    units = [(i, k, ids, mask) for i, s in enumerate(samples) if not s.old_logp
             for k, (ids, mask) in enumerate(s.old_sequences())]
    if not units:
        return 0, 0
    lengths = [len(u[2]) for u in units]
    buckets = length_buckets(lengths, micro_batch_size)
    parts: list[dict[int, list[float]]] = [{} for _ in samples]
    for bucket in buckets:
        micro = [units[j] for j in bucket]
        logps, _ = sequence_action_logprobs(model, [u[2] for u in micro], [u[3] for u in micro], pad_id, device)
        for (i, k, _, _), logp in zip(micro, logps):
            parts[i][k] = logp.float().cpu().tolist()
    for sample, part in zip(samples, parts):
        if part:
            sample.old_logp = [value for k in sorted(part) for value in part[k]]
    return padded_tokens(lengths, buckets)


@torch.no_grad()
def compute_reference_logprobs(model, samples, pad_id: int, device, micro_batch_size: int) -> int:
    """Fill `sample.ref_logp`: log pi_ref of every action token in the context the loss scores it in, once per
    iteration; pi_ref = the base model, i.e. the LoRA policy with its adapters disabled (no second copy).
    Returns the positions through the forward."""
    model.eval()
    peft_model = getattr(model, "module", model)  # under DDP the wrapper has no disable_adapter
    lengths = [len(s.ids) for s in samples]
    with peft_model.disable_adapter():
        for bucket in length_buckets(lengths, micro_batch_size):
            micro = [samples[j] for j in bucket]
            logps, _ = sequence_action_logprobs(peft_model, [s.ids for s in micro], [s.mask for s in micro], pad_id,
                                                device, [s.branches for s in micro])
            for sample, logp in zip(micro, logps):
                sample.ref_logp = logp.float().cpu().tolist()
    return sum(lengths)


def pad_rows(rows: list[torch.Tensor], device) -> torch.Tensor:
    """[n_i] tensors -> [S, max n_i], zero-padded."""
    return torch.nn.utils.rnn.pad_sequence([r.to(device) for r in rows], batch_first=True)


def samples_loss(model, micro, pad_id: int, device, loss_cfg, lowprob_mask: str, normaliser: float
                 ) -> tuple[torch.Tensor, dict[str, float]]:
    """This micro-batch's part of a mini-batch objective: sum over its tokens of w * l, divided by `normaliser`
    (the units of the whole mini-batch over all ranks, `Sample.units`), so the parts of every micro-batch on every
    rank add up to the mini-batch loss. Also its metrics.

    loss_cfg: config.LossConfig (clip values, low-probability threshold); lowprob_mask: the mask for this
    iteration's mode ("none" unless the mode is in `loss.lowprob_mask_modes`)."""
    logps, entropies = sequence_action_logprobs(model, [s.ids for s in micro], [s.mask for s in micro], pad_id,
                                                device, [s.branches for s in micro])
    return clipped_policy_loss(
        pad_rows(logps, device),  # [S, T]
        pad_rows([torch.tensor(s.old_logp) for s in micro], device),
        pad_rows([torch.tensor(s.advantages) for s in micro], device),
        pad_rows([torch.ones(len(s.advantages)) for s in micro], device),
        clip_low=loss_cfg.clip_low, clip_high=loss_cfg.clip_high, dual_clip=loss_cfg.dual_clip,
        lowprob_mask=lowprob_mask, lowprob_logp_threshold=loss_cfg.lowprob_logp_threshold,
        entropy=pad_rows(entropies, device).detach(),
        token_weights=pad_rows([torch.tensor(s.weights, dtype=torch.float32) for s in micro], device),
        normaliser=normaliser, kl_coef=loss_cfg.kl_coef, kl_estimator=loss_cfg.kl_estimator,
        ref_logp=pad_rows([torch.tensor(s.ref_logp) for s in micro], device) if all(s.ref_logp for s in micro)
        else None,
    )
