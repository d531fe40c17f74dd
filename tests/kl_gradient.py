"""The KL term's gradient on the real update, against an independent computation (tests/test_distributed.py,
tests/test_resilience.py).

`watch(update, records)` wraps train.update for a full fine-tune with loss.kl_coef > 0 whose advantages are all 0
(the random tiny model plays identical episodes), so the objective's gradient is the KL term's alone. Just before
each optimizer step it records, on every rank, the gradient the update built (whole tensors, also under FSDP) and
the one it should be: kl_coef x grad of the sum over all ranks' steps of each step's token mean, divided by
train.minibatch_steps (every step weighs 1 / minibatch_steps, verl's fixed mini-batch size, also in an iteration
of fewer steps; the test's iterations are one mini-batch each), of
k3 = exp(ref - logp) - (ref - logp) - 1 (KL(pi || pi_ref), low_var_kl), computed here on plain fp32 HF copies: the
policy's current weights, and pi_ref loaded afresh from model.name_or_path. Removing the term from the loss,
detaching it or flipping its sign gives another gradient.

    accelerate launch --config_file FSDP.yaml tests/kl_gradient.py OUT.json TRAIN_ARGS...

runs train.py's main under the wrapper and writes rank 0's records to OUT.json.
"""
import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def whole(t: torch.Tensor) -> torch.Tensor:
    """A parameter or gradient as one plain tensor (an FSDP shard is gathered: every rank must call this)."""
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach().float().cpu()


def step_weights(mask: list[int]) -> list[float]:
    """1 / (length of its action) for every action token: each step's tokens average to one unit."""
    weights, start = [], None
    for t, m in enumerate(list(mask) + [0]):
        if m and start is None:
            start = t
        elif not m and start is not None:
            weights += [1.0 / (t - start)] * (t - start)
            start = None
    return weights


def sampled_logprobs(model, ids: list[int], mask: list[int]) -> torch.Tensor:
    """log pi(token | everything before it) of each action token, one plain causal forward over the sequence."""
    logits = model(input_ids=torch.tensor([ids])).logits[0].float()
    positions = [t for t in range(1, len(ids)) if mask[t]]  # a first-token action has no predictor
    return torch.log_softmax(logits[[t - 1 for t in positions]], -1)[range(len(positions)),
                                                                      [ids[t] for t in positions]]


def expected_gradient(weights: dict, samples, cfg) -> dict:
    """kl_coef x grad of sum over this rank's steps of the step's token-mean k3, divided by train.minibatch_steps;
    summed over ranks."""
    from transformers import AutoModelForCausalLM

    assert cfg.loss.kl_estimator == "low_var_kl", cfg.loss.kl_estimator
    policy = AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path, torch_dtype=torch.float32)
    reference = AutoModelForCausalLM.from_pretrained(cfg.model.name_or_path, torch_dtype=torch.float32)
    policy.load_state_dict(weights, strict=True)
    total = torch.zeros(())
    for s in samples:
        logp = sampled_logprobs(policy, s.ids, s.mask)
        with torch.no_grad():
            ref = sampled_logprobs(reference, s.ids, s.mask)
        k3 = torch.exp(ref - logp) - (ref - logp) - 1.0
        total = total + (k3 * torch.tensor(step_weights(s.mask))).sum()
    (cfg.loss.kl_coef * total / cfg.train.minibatch_steps).backward()
    grads = {n: p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p) for n, p in
             policy.named_parameters()}
    if dist.is_initialized():
        for g in grads.values():
            dist.all_reduce(g)
    return grads


def watch(update, records: list):
    """train.update, recording before every optimizer step: {"got", "expected"} gradient norms, "rel_error" =
    |got - expected| / |expected| over all parameters, "advantages_zero", "branch_free"; one list per call."""

    def checked(model, optimizer, samples, cfg, *args, **kwargs):
        calls = []

        def before_step(opt, args, kwargs):
            names = [n for n, p in model.named_parameters() if p.requires_grad]
            params = dict(model.named_parameters())
            got = {n: whole(params[n].grad) for n in names}
            expected = expected_gradient({n: whole(p) for n, p in model.named_parameters()}, samples, cfg)
            norm = torch.sqrt(sum(g.square().sum() for g in expected.values()))
            # The update clips the gradient's norm before the step; the expected gradient is clipped the same way.
            scale = min(1.0, cfg.train.max_grad_norm / (float(norm) + 1e-6))
            diff = torch.sqrt(sum((got[n] - scale * expected[n]).square().sum() for n in names))
            calls.append({"got": float(torch.sqrt(sum(g.square().sum() for g in got.values()))),
                          "expected": scale * float(norm), "rel_error": float(diff) / max(scale * float(norm), 1e-30),
                          "advantages_zero": all(a == 0 for s in samples for a in s.advantages),
                          "branch_free": all(s.branches is None for s in samples)})

        handle = optimizer.register_step_pre_hook(before_step)
        try:
            return update(model, optimizer, samples, cfg, *args, **kwargs)
        finally:
            handle.remove()
            records.append(calls)

    return checked


def main(out: str, argv: list[str]) -> None:
    import train

    records: list = []
    train.update = watch(train.update, records)
    train.main(argv)
    if os.environ.get("RANK", "0") == "0":  # (the process group may be gone by now)
        Path(out).write_text(json.dumps(records))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:])
