"""One `train.update` over fixed samples, in 1 process or in 2 (data parallel or FSDP); run by
tests/test_distributed.py, which compares the weights the three produce.

    python tests/distributed_update.py single OUT.pt
    torchrun --nproc_per_node 2 tests/distributed_update.py dp OUT.pt
    torchrun --nproc_per_node 2 tests/distributed_update.py fsdp OUT.pt
    torchrun --nproc_per_node 2 tests/distributed_update.py fsdp_nan OUT.pt   (rank 1 has a NaN loss)
    torchrun --nproc_per_node 2 tests/distributed_update.py dp_episode OUT.pt (loss.aggregation=episode)
    python tests/distributed_update.py reference OUT.pt   (the reference's per-step samples, by hand)

Five packed "episodes" of different lengths, with 1 to 4 actions of different lengths and different advantages; in 2
processes rank 0 holds samples 0-2 and rank 1 samples 3-4, so the ranks run different numbers of micro-batches (FSDP
pads rank 1 with a zero-weight one). SGD makes the weight change proportional to the gradient itself (AdamW's
normalised step would hide a wrong weighting). "reference" does not use the trainer: every action becomes its own
sample (the prefix up to it, as the reference trains), the clipped loss is written out here, averaged over each
step's tokens, then over all steps, one backward.

Each rank of a 2-process run writes OUT.pt.rank<R>.done once its work is done and every rank has passed the last
barrier, then leaves with os._exit(0): the update is what this script measures, and a rank of the `dp` launch has
died in CI with SIGABRT ("terminate called without an active exception", the signature of a C++ thread left
joinable, as in the gloo process group's teardown at interpreter exit), failing the launch. The project's own exit
path (runtime.end_process_group, registered by make_accelerator) is tested by test_distributed.py's at-exit test
and by its `accelerate launch train.py` tests. faulthandler prints every thread's Python stack should a rank still
abort.
"""
import faulthandler
import os
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from config import Config  # noqa: E402
from losses import compute_old_logprobs  # noqa: E402
from samples import Sample  # noqa: E402
from runtime import Launch, full_weights, gather_objects, make_accelerator, shard_model  # noqa: E402
from train import update  # noqa: E402

VOCAB, PAD = 97, 0


def tiny_model():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                         tie_word_embeddings=False, pad_token_id=PAD)
    return Qwen2ForCausalLM(config).float()


EPISODES = [  # (tokens before the first action, [(action tokens, tokens after it)], advantage)
    (5, [(2, 2), (1, 0)], 1.0),
    (4, [(3, 3), (1, 2), (2, 1), (4, 0)], -0.5),
    (3, [(1, 0)], 2.0),
    (6, [(2, 3), (5, 0)], -1.5),
    (2, [(1, 2), (1, 2), (3, 0)], 0.7),
]


def samples() -> list[Sample]:
    rng = random.Random(0)
    out = []
    for before, actions, advantage in EPISODES:
        mask = [0] * before
        for n_action, n_after in actions:
            mask += [1] * n_action + [0] * n_after
        ids = [rng.randrange(1, VOCAB) for _ in mask]
        out.append(Sample(ids, mask, ids, mask, [advantage] * sum(mask)))
    return out


def full_forward_logp(model, ids: list[int], mask: list[int]) -> torch.Tensor:
    """log pi of the masked tokens of one sequence: a plain forward, log-softmax, gather (no project code)."""
    logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # [L, V]
    logp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]  # predicts t+1
    return logp[torch.tensor(mask[1:], dtype=torch.bool)]


def reference_update(model) -> float:
    """The reference's loss on per-step samples, by hand: returns the loss; leaves the gradient in .grad."""
    step_losses = []
    for sample in samples():
        with torch.no_grad():
            old = full_forward_logp(model, sample.ids, sample.mask) - 0.1
        offset, start = 0, None
        for pos, m in enumerate(sample.mask + [0]):
            if m and start is None:
                start = pos
            elif not m and start is not None:  # one action = one step sample: the prefix up to its end
                n = pos - start
                logp = full_forward_logp(model, sample.ids[:pos], [0] * start + [1] * n)
                ratio = torch.exp(torch.clamp(logp - old[offset:offset + n], -20, 20))
                a = sample.advantages[0]
                token = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 0.8, 1.3))
                if a < 0:
                    token = torch.minimum(token, torch.full_like(token, -a * 10.0))
                step_losses.append(token.mean())
                offset, start = offset + n, None
    loss = torch.stack(step_losses).mean()
    loss.backward()
    return loss.item()


def main(mode: str, out_file: str) -> None:
    torch.set_num_threads(1)
    model = tiny_model()
    for p in model.parameters():
        p.requires_grad_(True)
    if mode == "reference":
        loss = reference_update(model)
        grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
        with torch.no_grad():
            for p in model.parameters():
                p -= 0.5 * p.grad  # the SGD step the trainer's runs take
        torch.save({"weights": {n: p.detach().clone() for n, p in model.named_parameters()}, "grads": grads,
                    "loss": loss}, out_file)
        return
    accelerator = make_accelerator()
    if mode.startswith("fsdp"):
        shard_model(model, torch.float32, Launch(fsdp=True))
    mine = samples()
    if mode != "single":
        mine = mine[:3] if accelerator.process_index == 0 else mine[3:]
    cfg = Config()
    cfg.train.minibatch_steps, cfg.train.epochs, cfg.train.micro_batch_size, cfg.train.max_grad_norm = 1000, 1, 1, 1e9
    if mode == "dp_episode":  # this project's earlier weighting: every episode weighs 1
        cfg.loss.aggregation = "episode"
        for s in mine:
            s.weights = [1.0 / len(s.advantages)] * len(s.advantages)
    with full_weights(model):
        compute_old_logprobs(model, mine, PAD, accelerator.device, 1)
    for s in mine:  # an off-policy-like ratio != 1, so the clip and the ratio both matter
        s.old_logp = [v - 0.1 for v in s.old_logp]
    if mode == "fsdp_nan" and accelerator.process_index == 1:  # one rank's loss is NaN: every rank must skip
        mine[0].old_logp = [float("nan")] * len(mine[0].old_logp)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    metrics = update(model, optimizer, mine, cfg, accelerator, "on_policy_tips", PAD, random.Random(0),
                     sharded=mode.startswith("fsdp"))
    full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p) for n, p in model.named_parameters()}
    state = {n: p.detach().clone() for n, p in full.items()}
    grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
             for n, p in model.named_parameters()}  # the last (here: the only) mini-batch's gradient
    padding = gather_objects(accelerator, metrics["padding_passes"])  # zero-weight micro-batches, per rank
    skipped = gather_objects(accelerator, metrics["skipped_updates"])
    loss = sum(gather_objects(accelerator, metrics["loss"]))  # each rank holds its part of the mini-batch loss
    if accelerator.is_main_process:
        torch.save({"weights": state, "grads": grads, "metrics": metrics, "padding_passes": padding,
                    "skipped": skipped, "loss": loss}, out_file)
    accelerator.wait_for_everyone()
    if accelerator.num_processes > 1:
        Path(f"{out_file}.rank{accelerator.process_index}.done").write_text("done\n")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    faulthandler.enable()
    main(sys.argv[1], sys.argv[2])
