"""Branch packing: score all T per-step samples of one episode in ONE sequence instead of T.

Per-step sample t of an episode is `trunk[:p_t] + delta_t + action_t`: a prefix of one shared tip-free token
stream (the trunk, p_1 < p_2 < ... < p_T), then that step's user turn with tips the trunk lacks (delta_t, never
empty), then the generated tokens (action_t, the only tokens with loss). Scored one by one, the history is
encoded T times: sum_t (p_t + |b_t|) tokens. Packed, it is encoded once: p_T + sum_t |b_t| tokens.

Layout of one packed sequence (L = p_T + sum_t |b_t|, b_t = delta_t + action_t):

    index     0 .. p_T-1  | s_1 .. s_1+|b_1|-1 | s_2 .. | ... | s_T ..
    tokens    trunk[:p_T] | b_1                | b_2    | ... | b_T
    position  0 .. p_T-1  | p_1 .. p_1+|b_1|-1 | p_2 .. | ... | p_T ..
    mask      0 ...       | 0 (delta) 1 (action) per branch

Query j may attend to key k iff k <= j and (k < trunk_visible[j] or k >= segment_start[j]):
  * trunk token j: segment_start = 0, so plain causal attention over the trunk;
  * token j of branch t (starting at s_t): the trunk prefix [0, p_t) plus its own branch's earlier tokens
    [s_t, j], never other branches nor trunk tokens at/after p_t. With RoPE positions p_t, p_t+1, ... every
    branch token then sees exactly the keys (same tokens, same positions) it sees in the per-step sequence, so
    its hidden states, log-probs and gradients match the per-step forward up to float summation order.
The action token j of a branch is predicted by token j-1, which is in the same branch (delta_t is non-empty).

transformers 5.24 mask format (read in masking_utils.py: `_preprocess_mask_arguments`, `create_causal_mask`,
`sdpa_mask`, `eager_mask`; integrations/sdpa_attention.py: `sdpa_attention_forward`; models/qwen2 and llama
`eager_attention_forward`):
  * a 4-D `attention_mask` [B, 1, Q, K] is returned AS IS by `_preprocess_mask_arguments` (early exit before
    any padding, packed-sequence detection from position_ids, or causal pattern), for the full and the
    sliding-window mask alike; so transformers adds no causal mask of its own: ours must already be causal.
  * SDPA passes it straight to `F.scaled_dot_product_attention(attn_mask=...)` with is_causal=False (a mask is
    present). Its own masks are boolean (True = attend); an additive float mask also works there.
  * eager does `attn_weights + attention_mask`: it needs the ADDITIVE float form (0 = attend, finfo.min = not);
    a boolean mask would be silently added as 0/1. Its own `eager_mask` is bool -> float with finfo(dtype).min.
  So `branch_attention_mask` builds a bool mask for SDPA and an additive float mask for eager. Flash-attention
  and flex attention cannot take this [B, 1, W, W] tensor; they are refused.
Limits: the mask costs B * W * W elements (bool: 1 byte each; float: 2-4 bytes), quadratic in the packed length;
a sliding-window model would get no window (the 4-D mask is used as is); pads attend only to themselves.
"""
from dataclasses import dataclass

import torch

from engine.kvcache import supports_kv_reuse

MASKED_ATTENTIONS = ("sdpa", "eager")  # attention implementations that accept an arbitrary 4-D mask


@dataclass
class BranchPacked:
    """One episode packed as trunk[:p_T] + b_1 + ... + b_T; every list has length L (the packed length).

    ids: token ids; mask: 1 on action tokens (loss), 0 elsewhere; positions: RoPE position ids;
    segment_start[j]: index where the branch of token j starts (0 for trunk tokens);
    trunk_visible[j]: how many trunk tokens j may see (p_t for branch t; j + 1 for trunk token j).
    """
    ids: list[int]
    mask: list[int]
    positions: list[int]
    segment_start: list[int]
    trunk_visible: list[int]

    def __len__(self) -> int:
        return len(self.ids)


def pack_branches(trunk: list[int], branch_points: list[int], branches: list[list[int]],
                  branch_masks: list[list[int]]) -> BranchPacked:
    """Pack one episode: trunk[:p_T] then branches[t] (= delta_t + action_t) branching off at branch_points[t].

    branch_masks[t][i] is 1 where branches[t][i] is an action token. Raises ValueError on inconsistent input:
    branch points not strictly increasing or outside [0, len(trunk)], mismatched lengths, an empty branch, a
    mask that is not 0/1, or a branch whose first token is an action token (nothing in the branch predicts it).
    """
    if not branches:
        raise ValueError("pack_branches needs at least one branch")
    if not (len(branch_points) == len(branches) == len(branch_masks)):
        raise ValueError(f"got {len(branch_points)} branch points, {len(branches)} branches and "
                         f"{len(branch_masks)} branch masks; they must have the same length (one per step)")
    for t, p in enumerate(branch_points):
        if not 0 <= p <= len(trunk):
            raise ValueError(f"branch point {t} is {p}, outside the trunk [0, {len(trunk)}]")
        if t > 0 and p <= branch_points[t - 1]:
            raise ValueError(f"branch points must be strictly increasing; point {t} is {p} after "
                             f"{branch_points[t - 1]}")
    for t, (branch, bmask) in enumerate(zip(branches, branch_masks)):
        if len(branch) != len(bmask):
            raise ValueError(f"branch {t} has {len(branch)} tokens but its mask has {len(bmask)} entries")
        if not branch:
            raise ValueError(f"branch {t} is empty; each branch is a non-empty user turn (delta) plus the action")
        if any(m not in (0, 1) for m in bmask):
            raise ValueError(f"branch {t} mask must hold only 0/1, got {sorted(set(bmask))}")
        if bmask[0] == 1:
            raise ValueError(f"branch {t} starts with an action token; its delta (user turn) must come first")

    p_last = branch_points[-1]
    ids, mask = list(trunk[:p_last]), [0] * p_last
    positions = list(range(p_last))
    segment_start, trunk_visible = [0] * p_last, list(range(1, p_last + 1))
    for p, branch, bmask in zip(branch_points, branches, branch_masks):
        start, n = len(ids), len(branch)
        ids += branch
        mask += bmask
        positions += range(p, p + n)
        segment_start += [start] * n
        trunk_visible += [p] * n
    return BranchPacked(ids, mask, positions, segment_start, trunk_visible)


def branch_attention_mask(packed_list: list[BranchPacked], width: int, dtype: torch.dtype = torch.bool,
                          device=None) -> torch.Tensor:
    """4-D mask [B, 1, W, W] for the right-padded batch of `packed_list` (row b holds packed_list[b] then pads).

    dtype=torch.bool: True = attend (SDPA). A float dtype: additive, 0 = attend, finfo(dtype).min = masked
    (eager, also fine for SDPA). A pad query attends only to itself, so no row is fully masked (no NaN).
    """
    rows = []
    k = torch.arange(width)  # [W] key index
    for packed in packed_list:
        n = len(packed)
        if n > width:
            raise ValueError(f"a packed sequence has {n} tokens, more than the width {width}")
        start = torch.zeros(width, dtype=torch.long)  # [W] segment start per query; pads: themselves
        seen = torch.zeros(width, dtype=torch.long)   # [W] trunk tokens visible per query; pads: none
        start[:n] = torch.tensor(packed.segment_start, dtype=torch.long)
        start[n:] = k[n:]
        seen[:n] = torch.tensor(packed.trunk_visible, dtype=torch.long)
        q = k[:, None]  # [W, 1] query index
        allowed = (k[None, :] <= q) & ((k[None, :] < seen[:, None]) | (k[None, :] >= start[:, None]))  # [W, W]
        rows.append(allowed)
    allowed = torch.stack(rows)[:, None].to(device)  # [B, 1, W, W]
    if dtype == torch.bool:
        return allowed
    return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
        ~allowed, torch.finfo(dtype).min)


def attention_implementation(model) -> str:
    """The attention implementation the (possibly peft-wrapped) model runs with, e.g. "sdpa" or "eager"."""
    return getattr(model.config, "_attn_implementation", None) or "eager"


def supported(model) -> bool:
    """Whether the model can score branch-packed samples (a 4-D mask in every layer); else per-step samples."""
    return attention_implementation(model) in MASKED_ATTENTIONS and supports_kv_reuse(model)


def branch_inputs(model, seqs: list[list[int]], layouts: list, width: int, device) -> dict:
    """position_ids [B, W] and the 4-D attention mask [B, 1, W, W] of a batch holding branch-packed sequences
    (losses.sequence_action_logprobs scores it); a plain row (layout None) gets positions 0.. and causal attention.
    The mask is boolean for SDPA, additive in the weights' dtype for eager (see the module docstring)."""
    packed = [layout if layout is not None else
              BranchPacked(seq, [0] * len(seq), list(range(len(seq))), [0] * len(seq), list(range(1, len(seq) + 1)))
              for seq, layout in zip(seqs, layouts)]
    positions = torch.zeros((len(seqs), width), dtype=torch.long)
    for row, p in enumerate(packed):
        positions[row, : len(p)] = torch.tensor(p.positions)
    implementation = attention_implementation(model)
    if implementation not in MASKED_ATTENTIONS:
        raise ValueError(f"branch-packed samples need sdpa or eager attention (a 4-D mask), not {implementation!r}; "
                         "build them only where `supported(model)` (samples.build_samples(branch_packing=False))")
    if not supports_kv_reuse(model):  # a 4-D mask replaces the sliding window too
        raise ValueError("branch-packed samples need full attention in every layer (this model has sliding-window "
                         "layers); build them only where `supported(model)`")
    dtype = torch.bool if implementation == "sdpa" else model.get_input_embeddings().weight.dtype
    return dict(attention_mask=branch_attention_mask(packed, width, dtype=dtype, device=device),
                position_ids=positions.to(device))
