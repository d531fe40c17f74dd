"""losses.sequence_action_logprobs: each row's log-probs come from the LM head at that row's own action positions
only, and equal (values and gradients) an independent full-logits computation on rows of different lengths."""
import warnings

import pytest
import torch
import torch.nn.functional as F

from losses import sequence_action_logprobs

VOCAB, PAD = 101, 0

# Rows of different lengths whose action runs sit at different places; row 3 marks its first token (nothing
# predicts it, so it is not scored) and row 4 has no action token at all.
ROWS = [
    (7, [4, 5, 6]),
    (19, [3, 4, 10, 11, 12, 17, 18]),
    (12, [1, 2, 8]),
    (9, [0, 5, 6, 7]),
    (5, []),
]


def tiny_model(peft: bool = False):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                         tie_word_embeddings=False, pad_token_id=PAD)
    model = Qwen2ForCausalLM(config).float()
    if not peft:
        return model
    from peft import LoraConfig, get_peft_model

    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})  # as infra/models.py
    model.enable_input_require_grads()
    with warnings.catch_warnings():  # peft reads the deprecated `is_gradient_checkpointing`
        warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 task_type="CAUSAL_LM"))
    for name, param in model.named_parameters():  # lora_B starts at 0 (lora_A would get no gradient)
        if "lora_B" in name:
            torch.nn.init.normal_(param, std=0.1)
    model.train()  # checkpointing is active in train mode; lora_dropout is 0
    return model


def batch():
    gen = torch.Generator().manual_seed(1)
    seqs, masks = [], []
    for length, actions in ROWS:
        seqs.append(torch.randint(1, VOCAB, (length,), generator=gen).tolist())
        masks.append([int(t in actions) for t in range(length)])
    return seqs, masks


def reference(model, seqs, masks):
    """Full forward over the padded batch (logits at every position), then log_softmax and gather per row."""
    width = max(map(len, seqs))
    ids = torch.tensor([s + [PAD] * (width - len(s)) for s in seqs])
    attention = torch.tensor([[1] * len(s) + [0] * (width - len(s)) for s in seqs])
    log_probs = F.log_softmax(model(input_ids=ids, attention_mask=attention, use_cache=False).logits.float(), dim=-1)
    logps, entropies = [], []
    for r, (seq, mask) in enumerate(zip(seqs, masks)):
        at = [t - 1 for t in range(1, len(seq)) if mask[t]]
        rows = log_probs[r, at]  # [n_r, V]: position t - 1 predicts token t
        logps.append(rows[torch.arange(len(at)), torch.tensor(seq)[[t + 1 for t in at]]])
        entropies.append(-(rows.exp() * rows).sum(-1))
    return logps, entropies


def weighted_sum(logps):
    gen = torch.Generator().manual_seed(2)
    return sum((lp * torch.randn(lp.shape, generator=gen)).sum() for lp in logps)


@pytest.mark.parametrize("peft", [False, True], ids=["plain", "peft_lora_checkpointing"])
def test_rowwise_pass_equals_full_logits_values_and_gradients(peft):
    model = tiny_model(peft)
    seqs, masks = batch()
    params = [p for p in model.parameters() if p.requires_grad]

    logps, entropies = sequence_action_logprobs(model, seqs, masks, PAD, "cpu")
    grads = torch.autograd.grad(weighted_sum(logps), params)
    ref_logps, ref_entropies = reference(model, seqs, masks)
    ref_grads = torch.autograd.grad(weighted_sum(ref_logps), params)

    assert [len(x) for x in logps] == [len([t for t in a if t > 0]) for _, a in ROWS] == [3, 7, 3, 3, 0]
    for got, want, ent, ref_ent in zip(logps, ref_logps, entropies, ref_entropies):
        assert got.dtype == ent.dtype == torch.float32
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        torch.testing.assert_close(ent, ref_ent.detach(), rtol=0, atol=1e-5)
    assert any(g.abs().max() > 0 for g in grads)  # the gradients compared are not all zero
    for name, g, ref_g in zip([n for n, p in model.named_parameters() if p.requires_grad], grads, ref_grads):
        torch.testing.assert_close(g, ref_g, rtol=1e-5, atol=1e-6, msg=lambda m: f"{name}: {m}")


def test_lm_head_sees_only_each_rows_action_positions_and_entropy_has_no_grad():
    model = tiny_model()
    seqs, masks = batch()
    shapes = []
    hook = model.get_output_embeddings().register_forward_hook(lambda m, i, out: shapes.append(tuple(out.shape)))
    try:
        logps, entropies = sequence_action_logprobs(model, seqs, masks, PAD, "cpu")
    finally:
        hook.remove()
    n_actions = sum(len(x) for x in logps)
    # One LM-head call on [sum_i n_i, V]: not [B, K_union, V] (here K_union = 13 and 5 x 13 = 65 rows, not 16).
    assert shapes == [(n_actions, VOCAB)] and n_actions == 16
    assert all(lp.requires_grad for lp in logps if len(lp))
    assert not any(e.requires_grad for e in entropies)


def test_bf16_model_gives_fp32_logprobs_of_its_own_logits():
    model = tiny_model().to(torch.bfloat16)
    seqs, masks = batch()
    with torch.no_grad():
        logps, entropies = sequence_action_logprobs(model, seqs, masks, PAD, "cpu")
        ref_logps, ref_entropies = reference(model, seqs, masks)
    for got, want, ent, ref_ent in zip(logps, ref_logps, entropies, ref_entropies):
        assert got.dtype == ent.dtype == torch.float32
        # bf16 matmuls of [16, H] and [5, 19, H] inputs may round differently: compare at bf16 logit precision
        torch.testing.assert_close(got, want, rtol=0, atol=0.1)
        torch.testing.assert_close(ent, ref_ent, rtol=0, atol=0.1)


def test_entropy_with_grad_equals_full_logits_entropy_gradients():
    """entropy_grad=True (the bonus of loss.entropy_coef): the entropies' parameter gradients equal those of the
    full-logits entropy -sum p log p through plain autograd; the log-probs are unchanged."""
    model = tiny_model(peft=True)
    seqs, masks = batch()
    params = [p for p in model.parameters() if p.requires_grad]
    logps, entropies = sequence_action_logprobs(model, seqs, masks, PAD, "cpu", entropy_grad=True)
    assert all(e.requires_grad for e in entropies if len(e))
    grads = torch.autograd.grad(weighted_sum(entropies), params)
    ref_logps, ref_entropies = reference(model, seqs, masks)
    ref_grads = torch.autograd.grad(weighted_sum(ref_entropies), params)
    for got, want, ent, ref_ent in zip(logps, ref_logps, entropies, ref_entropies):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
        torch.testing.assert_close(ent, ref_ent, rtol=0, atol=1e-5)
    assert any(g.abs().max() > 0 for g in grads)
    for name, g, ref_g in zip([n for n, p in model.named_parameters() if p.requires_grad], grads, ref_grads):
        torch.testing.assert_close(g, ref_g, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
