"""One `train.update` over fixed samples, in 1 process or in 2 (data parallel or FSDP), and a hand-written
reference; run by tests/test_distributed.py, which compares them.

    python tests/distributed_update.py single OUT.pt
    torchrun --nproc_per_node 2 tests/distributed_update.py dp OUT.pt
    torchrun --nproc_per_node 2 tests/distributed_update.py fsdp OUT.pt
    torchrun --nproc_per_node 2 tests/distributed_update.py fsdp_nan OUT.pt   (rank 1 has a NaN loss; one mini-batch)
    torchrun --nproc_per_node 2 tests/distributed_update.py dp_episode OUT.pt (every episode weighs 1)
    python tests/distributed_update.py reference OUT.pt   (the reference's per-step samples, by hand)
    torchrun --nproc_per_node 2 tests/distributed_update.py dp,fsdp DIR     (several modes, one launch: DIR/<mode>.pt)

Six packed "episodes" of very different lengths (1 to 9 actions of 1-4 tokens, advantages of both signs): in 2
processes rank 0 holds episodes of [1, 8, 1, 1] steps and rank 1 of [1, 9]. train.minibatch_steps = 10 cuts the 21
steps into 2 mini-batches of the global list, whichever rank holds them, and the shuffle (seed 6) makes them 18
steps and 3: a normaliser per mini-batch would weigh each of the 3 lone steps 6x each of the others. Handed out by
tokens, rank 0 gets one long episode per mini-batch and rank 1 two short ones: FSDP pads rank 0 with a zero-weight
micro-batch per mini-batch. Old log-probs are shifted token by token (`SHIFTS`) so that the
ratios fall inside the clip band, below 0.8, above 1.3 and above the dual clip's 10 with a negative advantage.
SGD makes the weight change proportional to the gradient itself (AdamW's normalised step would hide a wrong
weighting). "reference" does not use the trainer: it forms the mini-batches by hand (`chunks_by_hand`), every action
becomes its own sample (the prefix up to it, as the reference trains), the clipped and dual-clipped loss is written
out here, each step's token mean weighs 1 / minibatch_steps, one backward and one SGD step per mini-batch; it also
gives the update with each mini-batch divided by its own steps (the weighting before issue 40).

Each rank of a 2-process run writes OUT.pt.rank<R>.done once its work is done and every rank has passed the last
barrier, then leaves with os._exit(0): the update is what this script measures, and a rank of the `dp` launch has
died in CI with SIGABRT ("terminate called without an active exception", the signature of a C++ thread left
joinable, as in the gloo process group's teardown at interpreter exit), failing the launch. The project's own exit
path (infra.runtime.end_process_group, registered by make_accelerator) is tested by test_distributed.py's at-exit test
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
from samples import Context, Sample  # noqa: E402
from infra.runtime import Launch, full_weights, gather_objects, make_accelerator, shard_model  # noqa: E402
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
    (3, [(2, 1)], 1.0),  # rank 0
    (4, [(3, 3), (1, 2), (2, 1), (4, 2), (1, 1), (2, 2), (3, 1), (1, 0)], -0.5),
    (2, [(1, 0)], 2.0),
    (5, [(3, 0)], -1.5),
    (3, [(2, 0)], 0.7),  # rank 1
    (2, [(1, 2), (2, 1), (3, 2), (1, 1), (2, 3), (4, 1), (1, 2), (2, 1), (3, 0)], 1.2),
]
RANK_OF = [0, 0, 0, 0, 1, 1]
MINIBATCH_STEPS, LR, SEED = 10, 0.5, 6
# log(ratio) at the initial weights, token by token (cycled): inside [0.8, 1.3], below, above, above 10 (the dual
# clip where the advantage is negative), above 1.3 but below 10, just below 1.
SHIFTS = [0.1, -0.5, 0.5, 3.0, 1.0, -0.05]


def samples() -> list[Sample]:
    rng = random.Random(0)
    out = []
    for before, actions, advantage in EPISODES:
        mask = [0] * before
        for n_action, n_after in actions:
            mask += [1] * n_action + [0] * n_after
        ids = [rng.randrange(1, VOCAB) for _ in mask]
        out.append(Sample(ids=ids, mask=mask, old=[Context(ids, mask)], advantages=[advantage] * sum(mask)))
    return out


def shifted(old_logp: list[float], episode: int) -> list[float]:
    """The old log-probs of one episode's action tokens, moved so that ratio = exp(SHIFTS[...]) at the start."""
    return [v - SHIFTS[(episode + t) % len(SHIFTS)] for t, v in enumerate(old_logp)]


def chunks_by_hand(order: list[int], steps: list[int], count: int) -> list[list[int]]:
    """The trainer's split, written out: in the shuffled order, a sample joins chunk floor(count x (steps before
    it) / total steps), at most count - 1."""
    total, seen, chunks = sum(steps[i] for i in order), 0, [[] for _ in range(count)]
    for i in order:
        chunks[min(count - 1, count * seen // total)].append(i)
        seen += steps[i]
    return chunks


def minibatches_by_hand() -> list[list[int]]:
    """The episodes of each mini-batch, on any number of ranks: the global list (rank 0's, then rank 1's, i.e.
    EPISODES in order) shuffled once with random.Random(SEED) and cut into round(21 / 10) = 2 chunks."""
    steps = [len(actions) for _, actions, _ in EPISODES]
    order = list(range(len(EPISODES)))
    random.Random(SEED).shuffle(order)
    return chunks_by_hand(order, steps, max(1, round(sum(steps) / MINIBATCH_STEPS)))


def shares_by_hand(batch: list[int], world: int = 2) -> list[list[int]]:
    """One mini-batch's episodes per rank: by tokens, longest first, each to the rank with the fewest so far."""
    tokens = {e: before + sum(a + b for a, b in actions) for e, (before, actions, _) in enumerate(EPISODES)}
    shares, load = [[] for _ in range(world)], [0] * world
    for e in sorted(batch, key=lambda e: (-tokens[e], batch.index(e))):
        r = load.index(min(load))
        shares[r].append(e)
        load[r] += tokens[e]
    return [sorted(share, key=batch.index) for share in shares]


def full_forward_logp(model, ids: list[int], mask: list[int]) -> torch.Tensor:
    """log pi of the masked tokens of one sequence: a plain forward, log-softmax, gather (no project code)."""
    logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # [L, V]
    logp = torch.log_softmax(logits[:-1], -1).gather(-1, torch.tensor(ids[1:])[:, None])[:, 0]  # predicts t+1
    return logp[torch.tensor(mask[1:], dtype=torch.bool)]


def step_loss(logp: torch.Tensor, old: torch.Tensor, a: float, regions: dict) -> torch.Tensor:
    """One step's token mean of verl's dual-clip PPO loss (clip 0.8 / 1.3, c = 10); counts each token's region."""
    ratio = torch.exp(torch.clamp(logp - old, -20, 20))
    token = torch.maximum(-a * ratio, -a * torch.clamp(ratio, 0.8, 1.3))
    if a < 0:
        token = torch.minimum(token, torch.full_like(token, -a * 10.0))
    for r in ratio.tolist():
        key = "dual" if a < 0 and r > 10 else "below" if r < 0.8 else "above" if r > 1.3 else "inside"
        regions[key] = regions.get(key, 0) + 1
    return token.mean()


def reference_update(per_minibatch: bool = False) -> dict:
    """The reference on the mini-batches, by hand: per mini-batch, the sum of its steps' losses
    divided by MINIBATCH_STEPS (per_minibatch: by its own steps), backward, SGD. Returns the weights, the last
    mini-batch's gradient, the mean mini-batch loss, the mini-batches' steps and the ratio regions met."""
    model = tiny_model()
    data, losses, regions = samples(), [], {}
    with torch.no_grad():  # once, at the initial weights, as the trainer's old log-probs
        old = [torch.tensor(shifted(full_forward_logp(model, s.ids, s.mask).tolist(), e)) for e, s in enumerate(data)]
    batches = minibatches_by_hand()
    for batch in batches:
        model.zero_grad()
        step_losses = []
        for e in batch:
            sample, offset, start = data[e], 0, None
            for pos, m in enumerate(sample.mask + [0]):
                if m and start is None:
                    start = pos
                elif not m and start is not None:  # one action = one step sample: the prefix up to its end
                    n = pos - start
                    logp = full_forward_logp(model, sample.ids[:pos], [0] * start + [1] * n)
                    step_losses.append(step_loss(logp, old[e][offset:offset + n], sample.advantages[0], regions))
                    offset, start = offset + n, None
        loss = torch.stack(step_losses).sum() / (len(step_losses) if per_minibatch else MINIBATCH_STEPS)
        loss.backward()
        losses.append(loss.item())
        with torch.no_grad():
            for p in model.parameters():
                p -= LR * p.grad
    return {"weights": {n: p.detach().clone() for n, p in model.named_parameters()},
            "grads": {n: p.grad.detach().clone() for n, p in model.named_parameters()},
            "loss": sum(losses) / len(losses), "minibatches": batches, "regions": regions,
            "minibatch_steps": [sum(len(EPISODES[e][1]) for e in b) for b in batches]}


def main(modes: str, out: str) -> None:
    """Each of the comma-separated `modes` in turn, in this launch (one process group, a fresh model per mode):
    into `out`, or for several modes into out/<mode>.pt."""
    torch.set_num_threads(1)
    names = modes.split(",")
    files = [out] if len(names) == 1 else [str(Path(out) / f"{mode}.pt") for mode in names]
    accelerator = None
    for mode, out_file in zip(names, files):
        if mode == "reference":
            torch.save({"equal": reference_update(), "per_minibatch": reference_update(per_minibatch=True)}, out_file)
            continue
        accelerator = accelerator or make_accelerator()
        update_once(mode, out_file, accelerator)
    if accelerator is not None:
        leave(accelerator, files[-1])


def update_once(mode: str, out_file: str, accelerator) -> None:
    """One `train.update` of a fresh tiny model over this rank's samples, saved (rank 0) to `out_file`."""
    model = tiny_model()
    for p in model.parameters():
        p.requires_grad_(True)
    if mode.startswith("fsdp"):
        shard_model(model, torch.float32, Launch(fsdp=True))
    mine = samples()
    held = [e for e in range(len(mine)) if mode == "single" or RANK_OF[e] == accelerator.process_index]
    mine = [mine[e] for e in held]
    cfg = Config()
    cfg.train.minibatch_steps, cfg.train.epochs, cfg.train.micro_batch_size = MINIBATCH_STEPS, 1, 1
    cfg.train.max_grad_norm = 1e9
    if mode == "fsdp_nan":  # one mini-batch: the skip, not the weighting, is what this mode checks
        cfg.train.minibatch_steps = 1000
    if mode == "dp_episode":  # this project's earlier weighting: every episode weighs 1
        for s in mine:
            s.weights = [1.0 / len(s.advantages)] * len(s.advantages)
    with full_weights(model):
        compute_old_logprobs(model, mine, PAD, accelerator.device, 1)
    for e, s in zip(held, mine):
        s.old_logp = shifted(s.old_logp, e)
    if mode == "fsdp_nan" and accelerator.process_index == 1:  # a NaN loss on the rank it is handed to: all skip
        mine[0].old_logp = [float("nan")] * len(mine[0].old_logp)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=LR)
    handed = trace_minibatches(model, optimizer)
    metrics = update(model, optimizer, mine, cfg, accelerator, "on_policy_tips", PAD, random.Random(SEED),
                     sharded=mode.startswith("fsdp"))
    full = {n: (p.full_tensor() if hasattr(p, "full_tensor") else p) for n, p in model.named_parameters()}
    state = {n: p.detach().clone() for n, p in full.items()}
    grads = {n: (p.grad.full_tensor() if hasattr(p.grad, "full_tensor") else p.grad).detach().clone()
             for n, p in model.named_parameters()}  # the last mini-batch's gradient
    padding = gather_objects(accelerator, metrics["padding_passes"])  # zero-weight micro-batches, per rank
    skipped = gather_objects(accelerator, metrics["skipped_updates"])
    loss = sum(gather_objects(accelerator, metrics["loss"]))  # each rank holds its part of the mini-batch loss
    shares = gather_objects(accelerator, handed)  # [rank][optimiser step] -> the episodes it forwarded
    if accelerator.is_main_process:
        torch.save({"weights": state, "grads": grads, "metrics": metrics, "padding_passes": padding,
                    "skipped": skipped, "loss": loss, "shares": shares}, out_file)


def trace_minibatches(model, optimizer) -> list[list[int]]:
    """What this rank trains on: per optimiser step, the episodes whose sequences went through the model's forward
    (micro-batches of one, so a forward's input is one episode's ids; FSDP's padding passes match no episode)."""
    index = {tuple(s.ids): e for e, s in enumerate(samples())}
    handed, current = [], []

    def forward(module, args, kwargs):
        if module.training:
            current.extend(index[tuple(row)] for row in kwargs["input_ids"].tolist() if tuple(row) in index)

    def step(*_):
        handed.append(sorted(current))
        current.clear()

    model.register_forward_pre_hook(forward, with_kwargs=True)
    optimizer.register_step_post_hook(step)
    return handed


def leave(accelerator, out_file: str) -> None:
    """After a barrier: in a multi-process launch, write OUT.rank<R>.done and leave with os._exit(0) (see above)."""
    accelerator.wait_for_everyone()
    if accelerator.num_processes > 1:
        Path(f"{out_file}.rank{accelerator.process_index}.done").write_text("done\n")
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)


if __name__ == "__main__":
    faulthandler.enable()
    main(sys.argv[1], sys.argv[2])
