"""model.fp32_lm_head under FSDP2 over 2 CPU processes (gloo); run by tests/test_precision.py.

    torchrun --nproc_per_node 2 tests/fsdp_head.py OUT_DIR

For a tied and an untied tiny Qwen2 (full fine-tune: fp32 master weights, bf16 compute), with and without
`infra.models.use_fp32_lm_head`, sharded by `infra.runtime.shard_model`: inside `full_weights` (generation, old log-probs) one
forward records the LM head's input, its logits, the dtype of the head's gathered weight and of a decoder layer's,
and the largest difference to the head applied in fp32 to that input with the unsharded fp32 master weights (a
copy taken before sharding). Then one sharded forward + backward + AdamW step: every gradient finite. Each rank
writes OUT_DIR/rank{r}.pt.
"""
import copy
import faulthandler
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra.models import use_fp32_lm_head  # noqa: E402
from infra.runtime import Launch, full_weights, make_accelerator, shard_model  # noqa: E402


def tiny_model(tie: bool):
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=tie, pad_token_id=0)
    model = Qwen2ForCausalLM(config).float()
    with torch.no_grad():  # logits of a trained model's size (std ~5), so bf16 rounding is visible
        model.model.norm.weight.fill_(40.0)
    return model


def run(tie: bool, fp32_head: bool) -> dict:
    model = tiny_model(tie)
    master = copy.deepcopy(model.lm_head.weight.detach())  # fp32, not on the bf16 grid
    if fp32_head:
        use_fp32_lm_head(model, trainable=True)
    shard_model(model, torch.bfloat16, Launch(fsdp=True))
    ids = torch.randint(1, 97, (2, 10), generator=torch.Generator().manual_seed(1))
    seen = {}
    hook = model.lm_head.register_forward_hook(lambda module, args, out: seen.update(input=args[0].detach()))
    model.eval()
    with torch.no_grad(), full_weights(model):
        logits = model(input_ids=ids).logits
        head_dtype = model.lm_head.weight.dtype
        layer_dtype = model.model.layers[0].self_attn.q_proj.weight.dtype
    hook.remove()
    expected = F.linear(seen["input"].float(), master)
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model(input_ids=ids, labels=ids).loss.backward()
    grads = [p.grad for p in model.parameters()]
    finite = all(g is not None and bool(torch.isfinite(g.full_tensor() if hasattr(g, "full_tensor") else g).all())
                 for g in grads)
    optimizer.step()
    return {"logits_dtype": str(logits.dtype), "head_dtype": str(head_dtype), "layer_dtype": str(layer_dtype),
            "max_delta": (logits.float() - expected).abs().max().item(), "logit_std": expected.std().item(),
            "grads_finite": finite}


def main(out: str) -> None:
    torch.set_num_threads(1)
    accelerator = make_accelerator()
    results = {(tie, head): run(tie, head) for tie in (True, False) for head in (True, False)}
    torch.save(results, Path(out) / f"rank{accelerator.process_index}.pt")
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    faulthandler.enable()  # a rank that aborts prints every thread's Python stack
    main(sys.argv[1])
