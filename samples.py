"""Training samples: which context each mode trains on (paper §4.2, Table 3), the loss weight of every action token,
and how an iteration's samples are cut into mini-batches.

An episode (rollout.Episode) becomes one or more `Sample`s, by its layout (docs/algorithm.md, "The three modes"):

* `packed_sample`     - full history: ONE sequence per episode. On-policy pi(a_t | s_t, u) (or with the tips kept
                        where retrieved, tip_placement=history); off-policy: the tip-free twin, old log-probs from
                        the stream with tips (Table 3) or from the twin (Algorithm 1).
* `step_sample`       - one step's own prompt: a history window (WebShop), or current-turn tips learned on-policy
                        with train.branch_packing=false, pi(a_t | s_t, u, tips_t): every step had its own context.
* `branched_sample`   - current-turn tips learned on-policy, pi(a_t | s_t, u, tips_t): the same per-step contexts
                        as ONE sequence, the tip-free stream once + one branch per step (engine/branches.py).
* `current_turn_off_policy_sample` - current-turn tips learned off-policy: ONE tip-free packed sequence
                        pi(a_t | s_t, u), behaviour log-probs from each step's own with-tip prompt.

Every action token carries its loss weight (`losses.loss_weights`, loss.aggregation; default: each step weighs 1
whatever the layout), so packing never changes what a step weighs. `split_by_steps` cuts the shuffled samples into
mini-batches of about `train.minibatch_steps` steps (a packed episode is never split), and every mini-batch divides
by the same `minibatch_normaliser`, so a step weighs the same in each. Old log-probs: those
recorded while sampling wherever the old context is the one played (`recorded_logp`, loss.old_logp_source).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.branches import BranchPacked, pack_branches
from losses import action_runs, loss_weights


@dataclass
class Sample:
    """One training sequence. Action tokens appear in the same order in `ids` and `old_ids`."""

    ids: list[int]  # the context the loss scores (tip-free twin for off-policy)
    mask: list[int]  # 1 on action tokens of `ids`
    old_ids: list[int]  # the context of the old/behaviour log-probs
    old_mask: list[int]
    advantages: list[float]  # one per action token
    old_logp: list[float] = field(default_factory=list)  # filled by the trainer, one per action token
    ref_logp: list[float] = field(default_factory=list)  # loss.kl_coef > 0: log pi_ref per action token (trainer)
    # Behaviour log-probs from several contexts instead of old_ids: [(ids, mask)] in action order (an off-policy
    # "current_turn" episode: one tip-free sequence to train on, but each action was played in its own step prompt).
    old_contexts: list[tuple[list[int], list[int]]] = field(default_factory=list)
    # One loss weight per action token (losses.loss_weights; build_samples sets them for loss.aggregation). A sample
    # built without them weighs each of its steps 1.
    weights: list[float] = field(default_factory=list)
    # Log-probs recorded while sampling, when old_ids (old_contexts) are the context(s) the actions were sampled in
    # (None: never sampled there, or not recorded); build_samples uses them as old_logp (loss.old_logp_source).
    recorded_logp: list[float] | None = field(default=None, repr=False)
    # Branch-packed per-step contexts (`branched_sample`): positions and attention of ids (None: plain causal).
    branches: BranchPacked | None = field(default=None, repr=False)

    def __post_init__(self):
        if not self.weights:
            self.weights = loss_weights(self.mask, "step")

    def old_sequences(self) -> list[tuple[list[int], list[int]]]:
        return self.old_contexts or [(self.old_ids, self.old_mask)]

    @property
    def steps(self) -> int:
        """Environment steps (actions) this sample trains on."""
        return len(action_runs(self.mask))

    @property
    def units(self) -> float:
        """Its share of a mini-batch's normaliser: the sum of its weights (steps under "step" aggregation)."""
        return float(sum(self.weights))


def build_samples(episodes: list, advantages: list, *, off_policy_old_logp: str = "with_tips",
                  aggregation: str = "step", old_logp_source: str = "rollout", branch_packing: bool = True
                  ) -> list[Sample]:
    """Episodes (rollout.Episode) -> samples: one per episode (packed stream), or one per step (history window, and on-policy
    episodes played with tips in the current turn only: each step had its own context). advantages[i]: episode i's
    advantage, or one per step (advantages.gigpo_step_advantages; per-step samples only). Every action token gets its
    loss weight for `aggregation` (losses.loss_weights), so the layout never changes what a step weighs.
    old_logp_source="rollout": a sample whose old context is the one its actions were sampled in gets the log-probs
    recorded while sampling (`Episode.action_logps`) as `old_logp`; the others (off-policy "without_tips": the
    tip-free context was never sampled in) are left for losses.compute_old_logprobs; "recompute": all are.
    branch_packing: the per-step samples of a current-turn on-policy episode as ONE `branched_sample`."""
    samples = []
    for ep, adv in zip(episodes, advantages):
        start = len(samples)
        add_episode_samples(samples, ep, adv, off_policy_old_logp, branch_packing)
        episode_tokens = sum(len(s.advantages) for s in samples[start:])
        for s in samples[start:]:
            s.weights = loss_weights(s.mask, aggregation, episode_tokens)
            seen = s.recorded_logp
            if old_logp_source == "rollout" and seen is not None and len(seen) == len(s.advantages):
                s.old_logp = list(seen)
    return samples


def recorded(logps: list) -> list[float] | None:
    """The recorded behaviour log-probs of some actions, in order (None if any of them was not recorded)."""
    return None if any(lp is None for lp in logps) else [value for lp in logps for value in lp]


def add_episode_samples(samples: list[Sample], ep, adv, off_policy_old_logp: str, branch_packing: bool = True
                        ) -> None:
    """Append the training samples of one episode; adv: its advantage, or one per step (GiGPO, per-step layouts)."""
    off = ep.mode == "off_policy"
    step_adv = adv if isinstance(adv, list) else [adv] * len(ep.steps)
    if ep.layout == "current_turn" and off:
        if any(ep.twin_mask):
            samples.append(current_turn_off_policy_sample(ep, adv, off_policy_old_logp))
    elif ep.layout == "current_turn" and branch_packing and any(s.action_ids for s in ep.steps):
        samples.append(branched_sample(ep, step_adv))
    elif ep.steps:  # history window, or current-turn tips learned on-policy
        samples += [step_sample(step, a, off, off_policy_old_logp) for step, a in zip(ep.steps, step_adv)
                    if step.action_ids]
    elif any(ep.mask):
        samples.append(packed_sample(ep, float(adv), off, off_policy_old_logp))


def packed_sample(ep, adv: float, off: bool, off_policy_old_logp: str) -> Sample:
    """A full-history episode as ONE sequence (no tips, or tips kept where retrieved: tip_placement=history).
    On-policy: pi(a_t | s_t, u) or pi(a_t | s_t, u, tips) on the stream the model saw, old log-probs there too.
    Off-policy: the numerator pi(a_t | s_t, u) on the tip-free twin; the denominator on the stream with tips
    (Table 3, "with_tips") or on the twin (Algorithm 1, "without_tips")."""
    n, seen = sum(ep.mask), recorded(ep.action_logps)  # the actions' log-probs in ep.ids, the stream played
    if not off:
        return Sample(ep.ids, ep.mask, ep.ids, ep.mask, [adv] * n, recorded_logp=seen)
    if off_policy_old_logp == "with_tips":
        return Sample(ep.twin_ids, ep.twin_mask, ep.ids, ep.mask, [adv] * n, recorded_logp=seen)
    return Sample(ep.twin_ids, ep.twin_mask, ep.twin_ids, ep.twin_mask, [adv] * n)


def step_sample(step, adv: float, off: bool, off_policy_old_logp: str) -> Sample:
    """One step's own prompt + its action (a history window, or current-turn tips learned on-policy: every step
    was played in a context of its own). On-policy: pi(a_t | s_t, u, tips_t) where tips were shown. Off-policy
    (window layout): numerator pi(a_t | s_t, u) on the tip-free prompt, denominator as in `packed_sample`."""
    ids, twin = step.ids + step.action_ids, step.twin_ids + step.action_ids
    mask = [0] * len(step.ids) + [1] * len(step.action_ids)
    twin_mask = [0] * len(step.twin_ids) + [1] * len(step.action_ids)
    advantages, seen = [adv] * len(step.action_ids), step.action_logp  # recorded in step.ids, the prompt played
    if not off:
        return Sample(ids, mask, ids, mask, advantages, recorded_logp=seen)
    if off_policy_old_logp == "with_tips":
        return Sample(twin, twin_mask, ids, mask, advantages, recorded_logp=seen)
    return Sample(twin, twin_mask, twin, twin_mask, advantages)


def current_turn_off_policy_sample(ep, adv: float, off_policy_old_logp: str) -> Sample:
    """Off-policy with tips in the current turn only: the update scores pi(a_t | s_t, u) on the tip-free stream,
    ONE packed sequence, as cheap as a no-memory episode. Only the behaviour log-probs (no grad, once) need each
    action's own with-tip step prompt pi_old(a_t | s_t, u, tips_t) (Table 3); Algorithm 1 scores the stream itself."""
    played = [s for s in ep.steps if s.action_ids]
    if off_policy_old_logp != "with_tips":
        return Sample(ep.twin_ids, ep.twin_mask, ep.twin_ids, ep.twin_mask, [adv] * sum(ep.twin_mask))
    old = [(s.ids + s.action_ids, [0] * len(s.ids) + [1] * len(s.action_ids)) for s in played]
    return Sample(ep.twin_ids, ep.twin_mask, ep.twin_ids, ep.twin_mask, [adv] * sum(ep.twin_mask), old_contexts=old,
                  recorded_logp=recorded([s.action_logp for s in played]))


def branched_sample(ep, step_adv: list[float]) -> Sample:
    """Current-turn tips learned on-policy, pi(a_t | s_t, u, tips_t): every step was played in its own context
    (the tip-free history + that turn with its tips), the per-step samples of `step_sample`. Packed here as ONE
    sequence: the tip-free stream (`ep.ids`) once, then per step a branch (the rest of its own prompt + its action)
    that sees the stream only up to where its prompt leaves it, at the positions it had (engine/branches.py). The loss and
    gradient equal the per-step samples' at a fraction of the tokens; old log-probs: recorded in those contexts."""
    played = [(s, a) for s, a in zip(ep.steps, step_adv) if s.action_ids]
    points, branches, masks, advantages = [], [], [], []
    for step, a in played:
        shared = common_prefix(step.ids, ep.ids, len(step.ids) - 1)  # where this step's prompt leaves the stream
        points.append(shared)
        branches.append(step.ids[shared:] + step.action_ids)
        masks.append([0] * (len(step.ids) - shared) + [1] * len(step.action_ids))
        advantages += [a] * len(step.action_ids)
    packed = pack_branches(ep.ids, points, branches, masks)
    old = [(s.ids + s.action_ids, [0] * len(s.ids) + [1] * len(s.action_ids)) for s, _ in played]
    return Sample(packed.ids, packed.mask, packed.ids, packed.mask, advantages, old_contexts=old,
                  recorded_logp=recorded([s.action_logp for s, _ in played]), branches=packed)


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """The length of the longest common prefix of a and b, at most `limit`."""
    n = 0
    for x, y in zip(a[:limit], b):
        if x != y:
            break
        n += 1
    return n


def per_step_samples(sample: Sample) -> list[Sample]:
    """An on-policy packed sample -> one sample per action (the prefix up to that action, only it masked): the
    reference's per-step samples. The packed sample's loss equals the token-weighted loss of these, at the
    price of re-encoding every prefix (tools/bench.py measures it; tests/test_rollout.py checks the equality)."""
    runs, start = [], None
    for pos, m in enumerate(sample.mask + [0]):
        if m and start is None:
            start = pos
        elif not m and start is not None:
            runs.append((start, pos))
            start = None
    out, offset = [], 0
    for begin, end in runs:
        n = end - begin
        mask = [0] * begin + [1] * n
        old_logp = sample.old_logp[offset : offset + n] if sample.old_logp else []
        out.append(Sample(sample.ids[:end], mask, sample.ids[:end], mask, sample.advantages[offset : offset + n],
                          old_logp))
        offset += n
    return out


def split_by_steps(order: list[int], steps: list[int], count: int) -> list[list[int]]:
    """The shuffled sample order cut into `count` consecutive chunks of about equal numbers of steps: a sample goes
    to the chunk its first step falls in (a packed episode is never split)."""
    total = sum(steps[i] for i in order)
    chunks: list[list[int]] = [[] for _ in range(count)]
    seen = 0
    for i in order:
        chunks[min(count - 1, seen * count // total) if total else 0].append(i)
        seen += steps[i]
    return chunks


def minibatch_normaliser(total_steps: int, total_units: float, minibatch_steps: int) -> float:
    """What every mini-batch of an iteration divides its weighted loss sum by: the units (sum of `Sample.weights`)
    that `minibatch_steps` of the iteration's steps hold on average, total_units / total_steps per step (all ranks'
    samples); the iteration's own units when it has fewer steps than one mini-batch. Under "step" aggregation every
    step then weighs 1 / minibatch_steps in whichever optimiser step it lands, however many steps that one holds."""
    if total_steps <= minibatch_steps:
        return float(total_units)
    return minibatch_steps * float(total_units) / total_steps
