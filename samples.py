"""Training samples: which context each mode learns in (paper §4.2, Table 3), the loss weight of every action token,
and how an iteration's samples are cut into mini-batches.

Table 3: what the update scores, per mode. The loss is a ratio pi / pi_old over the episode's action tokens; the
two differ only in the context the actions are scored in.

    mode             the loss scores pi(a_t | ...)        the old log-prob pi_old(a_t | ...)
    no_memory        s_t, u        (the context played)  s_t, u         recorded while sampling
    on_policy_tips   s_t, u, tips_t (the context played)  s_t, u, tips_t recorded while sampling
    off_policy       s_t, u        (the tip-free TWIN)    "with_tips" (Table 3, the reference release):
                                                            s_t, u, tips_t recorded while sampling
                                                          "without_tips" (Algorithm 1 L27): the twin, one forward

`contexts(ep)` returns exactly that: for each sample of an episode the context the loss scores and the context(s) its
old log-probs come from. Off-policy is where EMPO² differs from GRPO: the actions were played with tips, the update
learns them without, so the final policy needs no memory. How an episode's contexts are laid out (rollout.Episode):

    layout         what was played                             samples
    packed         one append-only stream (no tips)            one per episode: the stream, in one forward
    current_turn   tip-free stream + each turn's own tips      on-policy: one per step, packed as branches of ONE
                                                               sequence (engine/branches.py); off-policy: one, the
                                                               tip-free stream, old log-probs from each step's prompt
    window         one self-contained prompt per step          one per step (WebShop's history window)

Every action token carries its loss weight (`loss_weights`: each step weighs 1 whatever its length and packing) and
every mini-batch of an iteration divides by the same `minibatch_normaliser`, so a step weighs 1 / minibatch_steps in
whichever optimiser step the shuffle (`split_by_steps`) puts it.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from engine.branches import BranchPacked, pack_branches


@dataclass
class Context:
    """A token sequence with its action tokens marked, and the log-probs recorded when they were sampled in it."""

    ids: list[int]
    mask: list[int]  # 1 on action tokens
    logp: list[float] | None = None  # one per action token; None: never sampled in this context, or not recorded


@dataclass
class Sample:
    """One training sequence: the context the loss scores and where its old log-probs come from (`old`, the contexts
    holding the same action tokens in the same order)."""

    ids: list[int]  # the context the loss scores
    mask: list[int]  # 1 on action tokens of `ids`
    advantages: list[float]  # one per action token
    old: list[Context]  # the old log-probs' context(s), in action order
    old_logp: list[float] = field(default_factory=list)  # one per action token: recorded, or compute_old_logprobs
    ref_logp: list[float] = field(default_factory=list)  # loss.kl_coef > 0: log pi_ref per action token (trainer)
    weights: list[float] = field(default_factory=list)  # one loss weight per action token ([]: each step weighs 1)
    branches: BranchPacked | None = field(default=None, repr=False)  # positions/attention of branch-packed `ids`

    def __post_init__(self):
        if not self.weights:
            self.weights = loss_weights(self.mask, "step")

    @property
    def recorded_logp(self) -> list[float] | None:
        """The old log-probs recorded while sampling, when every old context was played and recorded (else None)."""
        return recorded([c.logp for c in self.old])

    @property
    def steps(self) -> int:
        """Environment steps (actions) this sample trains on."""
        return len(action_runs(self.mask))

    @property
    def units(self) -> float:
        """Its share of a mini-batch's normaliser: the sum of its weights (its steps, with step weights)."""
        return float(sum(self.weights))


# ----------------------------------------------------------------------------- Table 3


def contexts(ep, off_policy_old_logp: str = "with_tips") -> list[tuple[Context, list[Context]]]:
    """Table 3 for one episode (rollout.Episode): one (scored, old) pair per sample, in step order. `scored` is the
    context the loss scores the actions in; `old` the context(s) their old log-probs come from."""
    def step_context(prompt: list[int], action: list[int], logp=None) -> Context:
        return Context(prompt + action, [0] * len(prompt) + [1] * len(action), logp)

    played_steps = [(s, lp) for s, lp in zip(ep.steps, ep.action_logps) if s.action_ids]
    if ep.layout == "packed":  # played = the stream, tip-free: its own twin
        acted = any(ep.mask)
        played = [Context(ep.ids, ep.mask, recorded(ep.action_logps))] if acted else []
        twins = [Context(ep.ids, ep.mask)] if acted else []
    elif ep.layout == "window":  # every step was its own prompt, with tips and tip-free
        played = [step_context(s.ids, s.action_ids, lp) for s, lp in played_steps]
        twins = [step_context(s.twin_ids, s.action_ids) for s, _ in played_steps]
    else:  # "current_turn": each step played in its own prompt; the twin is the one tip-free stream
        played = [step_context(s.ids, s.action_ids, lp) for s, lp in played_steps]
        twins = [Context(ep.ids, ep.mask)] if any(ep.mask) else []
    if ep.mode != "off_policy":
        return [(c, [c]) for c in played]
    if off_policy_old_logp == "without_tips":
        return [(t, [t]) for t in twins]
    if len(twins) == len(played):  # one twin per played context
        return [(t, [p]) for t, p in zip(twins, played)]
    return [(t, played) for t in twins]  # current_turn: one tip-free stream, each action's own with-tip prompt


def recorded(logps: list) -> list[float] | None:
    """The recorded behaviour log-probs of some actions, in order (None if any of them was not recorded)."""
    return None if any(lp is None for lp in logps) else [value for lp in logps for value in lp]


# ----------------------------------------------------------------------------- episodes -> samples


def build_samples(episodes: list, advantages: list, *, off_policy_old_logp: str = "with_tips",
                  branch_packing: bool = True, aggregation: str = "step") -> list[Sample]:
    """Episodes -> samples, one per `contexts` pair. advantages[i]: episode i's advantage, or one per step (GiGPO:
    per-step samples only). branch_packing: a current-turn on-policy episode's per-step samples become ONE
    `branch_packed` sample (the same loss and gradient; off only where the attention cannot take a 4-D mask).
    Every sample whose old contexts were played gets the log-probs recorded while sampling as its `old_logp`; the
    rest (off-policy "without_tips") are left to losses.compute_old_logprobs. aggregation: `loss.aggregation`
    ("step" or "token", `loss_weights`)."""
    samples = []
    for ep, adv in zip(episodes, advantages):
        per_step = iter([a for s, a in zip(ep.steps, adv) if s.action_ids] if isinstance(adv, list) else [])
        made = []
        for scored, old in contexts(ep, off_policy_old_logp):
            runs = action_runs(scored.mask)  # one run of action tokens per step
            step_adv = [next(per_step) for _ in runs] if isinstance(adv, list) else [adv] * len(runs)
            made.append(Sample(ids=scored.ids, mask=scored.mask, old=old,
                               advantages=[a for a, n in zip(step_adv, runs) for _ in range(n)]))
        if branch_packing and ep.layout == "current_turn" and ep.mode != "off_policy" and made:
            made = [branch_packed(ep.ids, made)]
        for s in made:
            s.weights = loss_weights(s.mask, aggregation)
            seen = s.recorded_logp
            if seen is not None and len(seen) == len(s.advantages):
                s.old_logp = list(seen)
        samples += made
    return samples


def branch_packed(stream: list[int], per_step: list[Sample]) -> Sample:
    """A current-turn on-policy episode's per-step samples (each step's own prompt, the tip-free history + that turn
    with its tips, + its action) as ONE sequence: the tip-free `stream` once, then per step a branch (the rest of its
    prompt + its action) that sees the stream only up to where its prompt leaves it, at the positions it had
    (engine/branches.py). The loss and gradient equal the per-step samples' at a fraction of the tokens."""
    points, branches, masks = [], [], []
    for s in per_step:
        prompt = s.mask.index(1)
        shared = common_prefix(s.ids, stream, prompt - 1)  # where this step's prompt leaves the stream
        points.append(shared)
        branches.append(s.ids[shared:])
        masks.append(s.mask[shared:])
    packed = pack_branches(stream, points, branches, masks)
    return Sample(ids=packed.ids, mask=packed.mask, old=[c for s in per_step for c in s.old],
                  advantages=[a for s in per_step for a in s.advantages], branches=packed)


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
    reference's per-step samples. The packed sample's loss equals theirs, at the price of re-encoding every prefix
    (tools/bench.py measures it; tests/test_rollout.py checks the equality)."""
    out, offset, end = [], 0, 0
    for n in action_runs(sample.mask):
        end = sample.mask.index(1, end)  # this action's first token
        mask = [0] * end + [1] * n
        end += n
        old_logp = sample.old_logp[offset: offset + n] if sample.old_logp else []
        out.append(Sample(ids=sample.ids[:end], mask=mask, old=[Context(sample.ids[:end], mask)],
                          advantages=sample.advantages[offset: offset + n], old_logp=old_logp))
        offset += n
    return out


# ----------------------------------------------------------------------------- loss weights and mini-batches


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


def loss_weights(mask: list[int], aggregation: str = "step") -> list[float]:
    """One loss weight per action token of a sequence (in order); a mini-batch's loss is sum(w * l) / N.

    "step" (the reference, ScienceWorld): 1 / len(its action), so every step weighs 1 whatever its length
        and however it is packed: a packed episode contributes exactly what its per-step samples would (verl's
        seq-mean-token-mean with one step per sample);
    "token" (verl-agent's token-mean, WebShop): 1, every action token weighs the same."""
    runs = action_runs(mask)
    if aggregation == "step":
        return [1.0 / n for n in runs for _ in range(n)]
    if aggregation == "token":
        return [1.0] * sum(runs)
    raise ValueError(f"unknown loss aggregation {aggregation!r}; expected step or token")


def minibatch_normaliser(total_steps: int, total_units: float, minibatch_steps: int) -> float:
    """What every mini-batch of an iteration divides its weighted loss sum by: the units (sum of `Sample.weights`)
    that `minibatch_steps` of the iteration's steps hold on average, total_units / total_steps per step (all ranks'
    samples). With step weights every step then weighs 1 / minibatch_steps in whichever optimiser step it lands,
    however many steps that one holds, also when the iteration has fewer steps than one mini-batch (verl divides by
    its fixed ppo_mini_batch_size even for a short last mini-batch). No steps: 0 (nothing to learn)."""
    if total_steps <= 0:
        return 0.0
    return minibatch_steps * float(total_units) / total_steps


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


@dataclass
class UpdatePlan:
    """One iteration's update over EVERY rank's samples, identical on every rank (verl: the whole batch cut into equal
    mini-batches, each handed out to the workers). Each epoch shuffles the global list once and cuts it into
    mini-batches of about `minibatch_steps` steps (`split_by_steps`); each mini-batch's samples go to the ranks
    balanced by tokens (`hand_out`); every mini-batch divides its weighted loss sum by `normaliser`. The mini-batches,
    and so every step's weight, are the same on any number of ranks."""

    normaliser: float  # minibatch_normaliser over all the samples
    epochs: list[list[list[list[int]]]]  # [epoch][mini-batch][rank] -> indices into the global sample list


def plan_update(samples: list[Sample], minibatch_steps: int, epochs: int, rng, world: int) -> UpdatePlan:
    """The UpdatePlan of `samples` (every rank's, in rank order): max(1, round(steps / minibatch_steps))
    mini-batches per epoch, one `rng.shuffle` per epoch."""
    steps, tokens = [s.steps for s in samples], [len(s.ids) for s in samples]
    count = max(1, round(sum(steps) / minibatch_steps))
    plan = []
    for _ in range(epochs):
        order = list(range(len(samples)))
        rng.shuffle(order)
        plan.append([hand_out(chunk, tokens, world) for chunk in split_by_steps(order, steps, count)])
    return UpdatePlan(minibatch_normaliser(sum(steps), sum(s.units for s in samples), minibatch_steps), plan)


def hand_out(chunk: list[int], tokens: list[int], world: int) -> list[list[int]]:
    """One mini-batch's samples -> one share per rank: the longest first, each to the rank holding the fewest tokens
    so far (ties: the lower rank); a share keeps the mini-batch's order. One rank: the whole mini-batch, in order."""
    load, owner = [0] * world, {}
    for i in sorted(chunk, key=lambda i: -tokens[i]):  # stable: equal lengths keep the shuffled order
        owner[i] = min(range(world), key=load.__getitem__)
        load[owner[i]] += tokens[i]
    return [[i for i in chunk if owner[i] == r] for r in range(world)]


def padding_sample(pad_id: int) -> Sample:
    """A 2-token sample with one action token and weight 0: the cheapest forward/backward FSDP can match."""
    return Sample(ids=[pad_id, pad_id], mask=[0, 1], advantages=[0.0], old=[Context([pad_id, pad_id], [0, 1])],
                  old_logp=[0.0], weights=[0.0])
