"""The EMPO² objective: pure functions from tensors and masks to the loss and its metrics, then the model-facing side
that computes those tensors with forward passes over samples (advantages: advantages.py).

Paper map (arXiv 2602.23008; the equations are written out in docs/algorithm.md):

* `clipped_policy_loss` - Eq. 1 with the reference's clip values: ratio = exp(logp - old_logp), asymmetric clip
                          [1 - 0.2, 1 + 0.3], dual clip c = 10 for negative advantages; Eq. 2's low-probability
                          token mask (drop tokens whose current probability is below delta, log delta = -5) for
                          the modes it is configured for (default: off-policy only); + kl_coef x KL(pi || pi_ref)
                          and - entropy_coef x entropy as verl-agent (`reference_kl`; WebShop: 0.01 and 0.001, with
                          its clip 0.2 / 0.2 and c = 3; ScienceWorld: both 0, as the paper's recipe).
* `action_logprobs`     - log pi(a_t | context) of action tokens only, in fp32, + the entropy (a metric, or with
                          grad for the entropy bonus, `Entropy`: no second [N, V] tensor kept for backward).
* `sequence_action_logprobs`, `compute_old_logprobs`, `samples_loss` - the model-facing side: one forward pass
                          over right-padded sequences whose LM head sees only each row's own action positions
                          (a [sum of action tokens, V] logit tensor), the old log-probs once per iteration,
                          and the objective of a micro-batch of samples;
                          `length_buckets` forms micro-batches of similar length so little compute goes to padding.

Contexts per mode: samples.py; docs/algorithm.md (paper Table 3).

Loss weights (samples.loss_weights): every action token carries a weight w and a mini-batch's loss is
sum(w * keep * l) / N over the whole mini-batch on all ranks, N the units `train.minibatch_steps` steps hold
(samples.minibatch_normaliser). w = 1 / len(its action), the reference's: each step's tokens are averaged and every
step weighs 1 / minibatch_steps (verl's seq-mean-token-mean with one step per sample), so a packed full-history
episode, one sequence for speed, weighs each step exactly as its own step sample would (docs/decisions.md, "Loss
weights"). The low-probability indicator of Eq. 2 multiplies the term; the 1/len normaliser stays. WebShop trains
with `loss.aggregation: token` (verl-agent's token-mean): w = 1, every action token weighs the same.
"""
from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from engine.branches import branch_inputs


def action_logprobs(logits: torch.Tensor, targets: torch.Tensor, entropy_chunk: int = 256,
                    entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """logits: [..., V] at the positions that predict the target tokens ([N, V] or [B, K, V]); targets: [...] ids.

    Returns (logp [...], entropy [...]) in fp32: the logits are cast to fp32 before the log-softmax (bf16 logits
    would make ratios noisy). logp carries the gradient; its log-softmax output is the one [..., V] tensor that
    backward keeps. The entropy is a metric without autograd (`entropy_metric`), or with entropy_grad (the bonus of
    `loss.entropy_coef`) a function of that same saved tensor (`Entropy`); either way it adds nothing that backward
    keeps and no tensor larger than [entropy_chunk, V].
    """
    return gathered_logprobs(F.log_softmax(logits, dim=-1, dtype=torch.float32), targets, entropy_chunk, entropy_grad)


def gathered_logprobs(log_probs: torch.Tensor, targets: torch.Tensor, entropy_chunk: int = 256,
                      entropy_grad: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """fp32 log-softmax output [..., V] and target ids [...] -> (logp [...] with grad, entropy [...]: with grad
    when entropy_grad, else a metric without)."""
    logp = log_probs.gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    if entropy_grad and log_probs.requires_grad:
        return logp, Entropy.apply(log_probs, entropy_chunk)
    return logp, entropy_metric(log_probs, entropy_chunk)


class Entropy(torch.autograd.Function):
    """H = -sum_v p_v l_v of fp32 log-probs l [..., V] -> [...], differentiable without a second [..., V] tensor
    kept for backward: it saves l itself, which the log-softmax's backward keeps anyway (the same storage), and
    computes dH/dl_v = -p_v (l_v + 1) from it in backward, `chunk` rows at a time. Through the log-softmax this is
    dH/dz_v = -p_v (log p_v + H), the entropy's gradient in the logits z (verl's entropy_from_logits, with grad)."""

    @staticmethod
    def forward(ctx, log_probs: torch.Tensor, chunk: int) -> torch.Tensor:
        ctx.save_for_backward(log_probs)
        ctx.chunk = chunk
        return entropy_metric(log_probs, chunk)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (log_probs,) = ctx.saved_tensors
        flat = log_probs.reshape(-1, log_probs.shape[-1])
        g = grad_out.reshape(-1, 1)
        grad = torch.empty_like(flat)
        for start in range(0, flat.shape[0], ctx.chunk):
            block = flat[start : start + ctx.chunk]
            grad[start : start + ctx.chunk] = -(block.exp() * (block + 1.0)) * g[start : start + ctx.chunk]
        return grad.reshape(log_probs.shape), None


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
    entropy_coef: float = 0.0,
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
    entropy:       [S, T] optional: the metric, and with entropy_coef the bonus (it must then carry the gradient,
                   `gathered_logprobs(entropy_grad=True)`)
    entropy_coef:  - entropy_coef x entropy, the same weights, over every action token (verl's entropy_coeff;
                   verl-agent's default 0.001, used by the WebShop configs; 0 in the paper's ScienceWorld recipe)
    token_weights: [S, T] each token's weight w (`loss_weights`); default 1 / (action tokens of its sample)
    normaliser:    what the weighted sum is divided by (samples.minibatch_normaliser); default S
    ref_logp:      [S, T] reference-policy log-probs (no grad): + kl_coef x KL(pi || pi_ref), the same weights,
                   over every action token (the low-probability mask drops only the surrogate, as verl)

    Returns (loss = sum_{s,t} w * keep * l / normaliser, metrics: floats over action tokens, and counts of
    positive-advantage tokens: all, clipped, masked). With the defaults:
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
    if entropy_coef:  # verl: policy_loss = pg_loss - entropy_coeff * entropy_loss, over every response token
        if entropy is None or (logp.requires_grad and not entropy.requires_grad):  # a detached bonus: no gradient
            raise ValueError("entropy_coef > 0 needs the entropy with its gradient "
                             "(gathered_logprobs(entropy_grad=True))")
        loss = loss - entropy_coef * (entropy * action_mask * token_weights).sum() / max(normaliser, 1e-12)

    with torch.no_grad():
        n_tokens = action_mask.sum().clamp(min=1.0)
        n_kept = keep.sum().clamp(min=1.0)
        clipped = (token_loss.detach() != loss_unclipped.detach()).float() * action_mask
        dual = ((advantages < 0) & (loss_dual.detach() < loss_ppo.detach())).float() * action_mask
        masked_ratio = ratio.detach() * action_mask
        positive = (advantages > 0).float() * action_mask  # the tokens a policy should learn to play more
        metrics = {
            "ratio_mean": (masked_ratio.sum() / n_tokens).item(),
            "ratio_max": masked_ratio.max().item() if action_mask.any() else 0.0,
            "clip_frac": (clipped.sum() / n_tokens).item(),
            "dual_clip_frac": (dual.sum() / n_tokens).item(),
            "masked_frac": 1.0 - (keep.sum() / n_tokens).item(),
            # k3 estimator of KL(old || new) = E_old[(r - 1) - log r], over the tokens that are trained on
            "approx_kl": ((((ratio - 1) - log_ratio).detach() * keep).sum() / n_kept).item(),
            "action_tokens": float(action_mask.sum().item()),
            # counts over positive-advantage tokens (off-policy: the tip-guided actions to distil): clipped, masked
            "pos_adv_tokens": float(positive.sum().item()),
            "pos_adv_clipped": float((clipped * positive).sum().item()),
            "pos_adv_masked": float(((action_mask - keep) * positive).sum().item()),
        }
        if kl is not None:
            metrics["kl_ref"] = (kl.detach().sum() / n_tokens).item()
        if entropy is not None:
            metrics["entropy"] = ((entropy.detach() * action_mask).sum() / n_tokens).item()
    return loss, metrics


# ----------------------------------------------------------------------------- forward passes over samples


def sequence_action_logprobs(model, seqs: list[list[int]], masks: list[list[int]], pad_id: int, device,
                             layouts: list | None = None, entropy_grad: bool = False
                             ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Log-probs (and entropies) of the action tokens of each sequence, in ONE forward pass (right padding).

    seqs[i]: token ids; masks[i]: 1 on action tokens. The decoder runs once over the padded [B, W] batch; the LM
    head then sees, for each row, only the positions that predict one of ITS action tokens: `logits_to_keep` is
    the boolean [B, W] mask `predicts` (transformers slices `hidden_states[predicts]` before the head), so the
    logit tensor is [sum_i n_i, V], not [B, W, V] nor [B, K_union, V] (rows whose actions sit at different places
    would each pay for the union of all rows' action positions). The call goes through the whole model, so peft,
    autocast and FSDP (the LM head belongs to the root unit) see an ordinary forward. Log-probs are fp32 and
    carry the gradient; the entropies are a metric without grad, or with entropy_grad carry it (`action_logprobs`).
    Returns ([n_actions_i] log-probs per sequence, [n_actions_i] entropies per sequence); a first token marked
    as an action is not scored (nothing predicts it). layouts[i]: an engine.branches.BranchPacked (None: plain causal)."""
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
    if layouts is not None and any(layout is not None for layout in layouts):  # positions, 4-D mask (engine/branches.py)
        inputs = branch_inputs(model, seqs, layouts, width, device)
    # As `action_logprobs`, but no name holds the head's output: it is freed once its fp32 log-softmax exists.
    log_probs = F.log_softmax(model(input_ids=ids.to(device), logits_to_keep=predicts.to(device), use_cache=False,
                                    **inputs).logits, dim=-1, dtype=torch.float32)  # [N, V]
    if log_probs.shape[:-1] != (sum(counts),):
        raise RuntimeError(f"the model returned logits of shape {tuple(log_probs.shape)} for a boolean [B, W] "
                           f"logits_to_keep with {sum(counts)} True entries; sequence_action_logprobs needs a "
                           f"causal LM whose forward slices with transformers' slice_logits_to_keep")
    logp, entropy = gathered_logprobs(log_probs, targets.to(log_probs.device), entropy_grad=entropy_grad)  # [N] each
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
    units = [(i, k, c.ids, c.mask) for i, s in enumerate(samples) if not s.old_logp for k, c in enumerate(s.old)]
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
def compute_reference_logprobs(model, samples, pad_id: int, device, micro_batch_size: int, reference=None) -> int:
    """Fill `sample.ref_logp`: log pi_ref of every action token in the context the loss scores it in, once per
    iteration. pi_ref = `reference`, the frozen copy of the initial policy of a full fine-tune (infra.models.load_reference;
    under FSDP the caller holds it inside infra.runtime.full_weights), or with reference=None the base model, i.e. the
    LoRA policy `model` with its adapters disabled (no second copy). Returns the positions through the forward."""
    scorer = reference if reference is not None else getattr(model, "module", model)  # DDP's wrapper has no adapters
    if reference is None and not hasattr(scorer, "disable_adapter"):
        raise ValueError("a full fine-tune's KL term needs its frozen reference copy (infra.models.load_reference): "
                         "pass reference=...; only a LoRA policy is its own reference (adapters disabled)")
    scorer.eval()
    lengths = [len(s.ids) for s in samples]
    with contextlib.nullcontext() if reference is not None else scorer.disable_adapter():
        for bucket in length_buckets(lengths, micro_batch_size):
            micro = [samples[j] for j in bucket]
            logps, _ = sequence_action_logprobs(scorer, [s.ids for s in micro], [s.mask for s in micro], pad_id,
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
    (the iteration's one normaliser, samples.minibatch_normaliser), so the parts of every micro-batch on every
    rank add up to the mini-batch loss. Also its metrics.

    loss_cfg: config.LossConfig (clip values, low-probability threshold); lowprob_mask: the mask for this
    iteration's mode ("none" unless the mode is in `loss.lowprob_mask_modes`)."""
    logps, entropies = sequence_action_logprobs(model, [s.ids for s in micro], [s.mask for s in micro], pad_id,
                                                device, [s.branches for s in micro],
                                                entropy_grad=loss_cfg.entropy_coef > 0)
    return clipped_policy_loss(
        pad_rows(logps, device),  # [S, T]
        pad_rows([torch.tensor(s.old_logp) for s in micro], device),
        pad_rows([torch.tensor(s.advantages) for s in micro], device),
        pad_rows([torch.ones(len(s.advantages)) for s in micro], device),
        clip_low=loss_cfg.clip_low, clip_high=loss_cfg.clip_high, dual_clip=loss_cfg.dual_clip,
        lowprob_mask=lowprob_mask, lowprob_logp_threshold=loss_cfg.lowprob_logp_threshold,
        entropy=pad_rows(entropies, device), entropy_coef=loss_cfg.entropy_coef,
        token_weights=pad_rows([torch.tensor(s.weights, dtype=torch.float32) for s in micro], device),
        normaliser=normaliser, kl_coef=loss_cfg.kl_coef, kl_estimator=loss_cfg.kl_estimator,
        ref_logp=pad_rows([torch.tensor(s.ref_logp) for s in micro], device) if all(s.ref_logp for s in micro)
        else None,
    )
