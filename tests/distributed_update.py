"""One `train.update` over fixed samples, in 1 process or in 2 (data parallel or FSDP); run by
tests/test_distributed.py, which compares the weights the three produce.

    python tests/distributed_update.py single OUT.pt
    torchrun --nproc_per_node 2 tests/distributed_update.py dp OUT.pt
    torchrun --nproc_per_node 2 tests/distributed_update.py fsdp OUT.pt
    torchrun --nproc_per_node 2 tests/distributed_update.py fsdp_nan OUT.pt   (rank 1 has a NaN loss)

Five samples of different lengths and advantages; in 2 processes rank 0 holds samples 0-2 and rank 1 samples 3-4,
so the ranks run different numbers of micro-batches (FSDP pads rank 1 with a zero-weight one). SGD makes the
weight change proportional to the gradient itself (AdamW's normalised step would hide a wrong weighting).
"""
import random
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from config import Config  # noqa: E402
from losses import compute_old_logprobs  # noqa: E402
from rollout import Sample  # noqa: E402
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


def samples() -> list[Sample]:
    rng = random.Random(0)
    out = []
    for length, advantage in [(9, 1.0), (14, -0.5), (6, 2.0), (11, -1.5), (17, 0.7)]:
        ids = [rng.randrange(1, VOCAB) for _ in range(length)]
        mask = [0] * (length - 4) + [1, 1, 0, 1]  # two action runs, like an episode
        out.append(Sample(ids, mask, ids, mask, [advantage] * sum(mask)))
    return out


def main(mode: str, out_file: str) -> None:
    torch.set_num_threads(1)
    accelerator = make_accelerator()
    model = tiny_model()
    for p in model.parameters():
        p.requires_grad_(True)
    if mode.startswith("fsdp"):
        shard_model(model, torch.float32, Launch(fsdp=True))
    mine = samples()
    if mode != "single":
        mine = mine[:3] if accelerator.process_index == 0 else mine[3:]
    cfg = Config()
    cfg.train.minibatches, cfg.train.epochs, cfg.train.micro_batch_size, cfg.train.max_grad_norm = 1, 1, 1, 1e9
    with full_weights(model):
        compute_old_logprobs(model, mine, PAD, accelerator.device, 1)
    for s in mine:  # an off-policy-like ratio != 1, so the clip and the ratio both matter
        s.old_logp = [v - 0.1 for v in s.old_logp]
    if mode == "fsdp_nan" and accelerator.process_index == 1:  # one rank's loss is NaN: every rank must skip
        mine[0].old_logp = [float("nan")] * len(mine[0].old_logp)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.5)
    metrics = update(model, optimizer, mine, cfg, accelerator, "on_policy_tips", PAD, random.Random(0),
                     sharded=mode.startswith("fsdp"))
    state = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone() for n, p in
             model.named_parameters()}
    padding = gather_objects(accelerator, metrics["padding_passes"])  # zero-weight micro-batches, per rank
    skipped = gather_objects(accelerator, metrics["skipped_updates"])
    if accelerator.is_main_process:
        torch.save({"weights": state, "metrics": metrics, "padding_passes": padding, "skipped": skipped}, out_file)
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
