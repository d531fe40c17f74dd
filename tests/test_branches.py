"""engine/branches.py: one branch-packed forward per episode gives the same action log-probs and gradients as scoring
each step's `trunk[:p_t] + delta_t + action_t` as its own sequence (SDPA, eager, peft LoRA)."""
import random
import warnings

import pytest
import torch
import torch.nn.functional as F

from engine import branches
from engine.branches import BranchPacked, branch_attention_mask, pack_branches
from losses import sequence_action_logprobs


def branch_action_logprobs(model, packed_list, pad_id, device):
    """The project's scoring path for branch-packed samples: one forward, fp32 log-probs of the mask-1 tokens."""
    logps, _ = sequence_action_logprobs(model, [p.ids for p in packed_list], [p.mask for p in packed_list], pad_id,
                                        device, packed_list)
    return logps

VOCAB, PAD = 97, 0


def tiny_model(attn: str = "sdpa", lora: bool = False):
    """A random 2-layer Qwen2 in fp32 with the given attention implementation, optionally LoRA-wrapped."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False, pad_token_id=PAD)
    config._attn_implementation = attn
    model = Qwen2ForCausalLM(config).float()
    assert model.config._attn_implementation == attn
    if not lora:
        return model
    from peft import LoraConfig, get_peft_model

    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", category=FutureWarning)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 lora_dropout=0.0))
    with torch.no_grad():  # lora_B starts at zero; make the adapters change the output
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.5)
    return model


def random_episode(rng: random.Random, steps: int, trunk_len: int = 40):
    """(trunk, branch_points, branches, branch_masks, advantages) with random tokens (never the pad id)."""
    trunk = [rng.randrange(1, VOCAB) for _ in range(trunk_len)]
    points = sorted(rng.sample(range(1, trunk_len + 1), steps))
    bs, ms = [], []
    for _ in range(steps):
        delta, action = rng.randint(1, 5), rng.randint(1, 4)
        tail = rng.randint(0, 1)  # a mask-0 token after the action (e.g. an end-of-turn token without loss)
        bs.append([rng.randrange(1, VOCAB) for _ in range(delta + action + tail)])
        ms.append([0] * delta + [1] * action + [0] * tail)
    advantages = [rng.uniform(-1, 1) for _ in range(steps)]
    return trunk, points, bs, ms, advantages


def episodes(seed: int = 0, lengths=(1, 2, 4)):
    """Episodes of different step counts, so the batch is right-padded."""
    rng = random.Random(seed)
    return [random_episode(rng, steps) for steps in lengths]


def reference_logprobs(model, episode) -> list[torch.Tensor]:
    """Per step: a plain forward of trunk[:p_t] + b_t alone; the next-token log-prob at each action token."""
    trunk, points, bs, ms, _ = episode
    out = []
    for p, b, m in zip(points, bs, ms):
        seq = trunk[:p] + b
        logits = model(input_ids=torch.tensor([seq])).logits[0]  # [S, V]
        logp = F.log_softmax(logits.float(), dim=-1)
        idx = [p + i for i, flag in enumerate(m) if flag]  # indices of the action tokens in seq
        out.append(torch.stack([logp[j - 1, seq[j]] for j in idx]))
    return out


def pack(episode) -> BranchPacked:
    trunk, points, bs, ms, _ = episode
    return pack_branches(trunk, points, bs, ms)


def split_steps(logp: torch.Tensor, episode) -> list[torch.Tensor]:
    """An episode's packed action log-probs [n] split into its steps (the actions come in step order)."""
    return list(logp.split([sum(m) for m in episode[3]]))


def weighted_loss(per_step: list[list[torch.Tensor]], eps) -> torch.Tensor:
    """sum over episodes and steps of advantage_t * sum(logp of step t's actions)."""
    return sum(a * lp.sum() for steps, ep in zip(per_step, eps) for a, lp in zip(ep[4], steps))


def trainable(model):
    return [p for p in model.parameters() if p.requires_grad]


def check_matches_reference(model, eps):
    """Packed log-probs and gradients equal the per-step reference within fp32 tolerance."""
    packed = branch_action_logprobs(model, [pack(ep) for ep in eps], pad_id=PAD, device="cpu")
    got = [split_steps(lp, ep) for lp, ep in zip(packed, eps)]
    want = [reference_logprobs(model, ep) for ep in eps]
    for g_steps, w_steps in zip(got, want):
        assert len(g_steps) == len(w_steps)
        for g, w in zip(g_steps, w_steps):
            assert g.dtype == torch.float32
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
    loss_got, loss_want = weighted_loss(got, eps), weighted_loss(want, eps)
    assert abs(loss_got.item() - loss_want.item()) <= 1e-5 * max(1.0, abs(loss_want.item()))
    params = trainable(model)
    grads_got = torch.autograd.grad(loss_got, params)
    grads_want = torch.autograd.grad(loss_want, params)
    assert any(g.abs().sum() > 0 for g in grads_want)
    for g, w in zip(grads_got, grads_want):
        torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-6)


# ----------------------------------------------------------------------------- layout and mask


def test_pack_layout_by_hand():
    """ids, mask, positions and the visibility fields of a 2-step episode, written out by hand."""
    packed = pack_branches([10, 11, 12, 13, 14], [2, 4], [[20, 21], [30, 31, 32]], [[0, 1], [0, 1, 1]])
    assert packed.ids == [10, 11, 12, 13, 20, 21, 30, 31, 32]  # trunk[:4] (trunk[4] is never seen)
    assert packed.mask == [0, 0, 0, 0, 0, 1, 0, 1, 1]
    assert packed.positions == [0, 1, 2, 3, 2, 3, 4, 5, 6]
    assert packed.segment_start == [0, 0, 0, 0, 4, 4, 6, 6, 6]
    assert packed.trunk_visible == [1, 2, 3, 4, 2, 2, 4, 4, 4]


def test_attention_mask_by_hand():
    """The bool mask of that episode (plus one pad) equals a hand-written visibility table; the float form
    masks the same entries with finfo.min and no pad row is all masked."""
    packed = pack_branches([10, 11, 12, 13, 14], [2, 4], [[20, 21], [30, 31, 32]], [[0, 1], [0, 1, 1]])
    rows = ["1000000000",  # trunk 0..3: causal
            "1100000000",
            "1110000000",
            "1111000000",
            "1100100000",  # branch 1 (idx 4, 5): trunk[:2] + itself
            "1100110000",
            "1111001000",  # branch 2 (idx 6..8): trunk[:4] + itself, not branch 1
            "1111001100",
            "1111001110",
            "0000000001"]  # pad: itself
    want = torch.tensor([[c == "1" for c in r] for r in rows])
    got = branch_attention_mask([packed], width=10)
    assert got.shape == (1, 1, 10, 10) and got.dtype == torch.bool
    assert torch.equal(got[0, 0], want)
    additive = branch_attention_mask([packed], width=10, dtype=torch.float32)
    assert torch.equal(additive[0, 0] == 0, want)
    assert torch.all(additive[0, 0][~want] == torch.finfo(torch.float32).min)


@pytest.mark.parametrize("points, branches_, masks, message", [
    ([3, 2], [[1, 2], [1, 2]], [[0, 1], [0, 1]], "strictly increasing"),
    ([2, 2], [[1, 2], [1, 2]], [[0, 1], [0, 1]], "strictly increasing"),
    ([9], [[1, 2]], [[0, 1]], "outside the trunk"),
    ([-1], [[1, 2]], [[0, 1]], "outside the trunk"),
    ([1, 2], [[1, 2]], [[0, 1]], "same length"),
    ([1], [[1, 2]], [[0, 1, 1]], "mask has 3 entries"),
    ([1], [[]], [[]], "empty"),
    ([1], [[1, 2]], [[1, 1]], "starts with an action token"),
    ([1], [[1, 2]], [[0, 2]], "only 0/1"),
    ([], [], [], "at least one branch"),
])
def test_pack_validation(points, branches_, masks, message):
    with pytest.raises(ValueError, match=message):
        pack_branches([5, 6, 7, 8], points, branches_, masks)


def test_refuses_flash_attention():
    model = tiny_model()
    model.config._attn_implementation = "flash_attention_2"
    with pytest.raises(ValueError, match="4-D mask"):
        branch_action_logprobs(model, [pack(episodes()[0])], pad_id=PAD, device="cpu")


# ----------------------------------------------------------------------------- equivalence with per-step forwards


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_matches_per_step_forwards(attn):
    """Episodes of 1, 2 and 4 steps in one right-padded call: log-probs and gradients equal the per-step ones."""
    model = tiny_model(attn)
    assert branches.attention_implementation(model) == attn
    check_matches_reference(model, episodes(seed=0))


def test_matches_per_step_forwards_lora():
    """Through a peft LoRA model (nonzero lora_B): the same equality, gradients w.r.t. the LoRA parameters."""
    model = tiny_model("sdpa", lora=True)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    assert names and all("lora_" in n for n in names)
    check_matches_reference(model, episodes(seed=1))


def test_pads_do_not_change_values():
    """An episode scored alone or next to a much longer one (so it gets many pads) gives the same log-probs."""
    model = tiny_model()
    eps = episodes(seed=2, lengths=(1, 4))
    with torch.no_grad():
        alone = branch_action_logprobs(model, [pack(eps[0])], pad_id=PAD, device="cpu")[0]
        batched = branch_action_logprobs(model, [pack(ep) for ep in eps], pad_id=PAD, device="cpu")[0]
    assert torch.isfinite(batched).all()
    torch.testing.assert_close(batched, alone, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_negative_control_plain_causal_mask(attn, monkeypatch):
    """The test can fail: the same packing with a plain causal mask (branches see earlier branches and the
    trunk after their branch point) differs from the reference by more than 1e-3."""
    model = tiny_model(attn)

    def causal(packed_list, width, dtype=torch.bool, device=None):
        allowed = torch.ones(width, width, dtype=torch.bool).tril().expand(len(packed_list), 1, width, width)
        if dtype == torch.bool:
            return allowed.to(device)
        return torch.zeros(allowed.shape, dtype=dtype).masked_fill(~allowed, torch.finfo(dtype).min).to(device)

    monkeypatch.setattr(branches, "branch_attention_mask", causal)
    eps = episodes(seed=0)
    with torch.no_grad():
        packed = branch_action_logprobs(model, [pack(ep) for ep in eps], pad_id=PAD, device="cpu")
        want = [torch.cat(reference_logprobs(model, ep)) for ep in eps]
    worst = max((g - w).abs().max().item() for g, w in zip(packed, want))
    assert worst > 1e-3


# The real policy (SmolLM2 + LoRA) on real rollout episodes: tests/test_old_logprobs.py, branch-packed vs per-step.
