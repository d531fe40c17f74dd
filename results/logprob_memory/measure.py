"""Peak host memory of one log-prob pass over a 4-row micro-batch with a 152k vocabulary, before/after F10.

    python results/logprob_memory/measure.py [--runs 8] [--out results/logprob_memory/summary.json]

"union" is the previous `losses.sequence_action_logprobs` (kept below, verbatim apart from names): the LM head
at the UNION of all rows' action positions, [B, K_union, V] fp32, with the entropy built inside autograd.
"rowwise" is the current one: the LM head at each row's own action positions, [sum_i n_i, V], entropy without
autograd. Each (variant, mode) runs in a fresh subprocess; its peak is the RSS high-water mark
(resource.getrusage ru_maxrss) after the pass minus the resident set just before it (model built, gradient
buffers allocated, a small warm-up pass done; the warm-up's own high-water mark stays below the pass's).
Modes: "train" = the update's pass (grad, a loss over the log-probs like samples_loss, backward); "old_logp" =
compute_old_logprobs' pass (torch.no_grad). A last subprocess compares the two variants' values and gradients.

Model: a random Qwen2 (vocab 152,064 like Qwen2.5, hidden 64, 2 layers, untied head) in fp32 on CPU, so every
[., V] tensor is fp32 here (with a bf16 model the head output is bf16 and one fp32 copy is made).
"""
from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402

from losses import sequence_action_logprobs  # noqa: E402

VOCAB, PAD, LENGTHS, RUN_LEN = 152064, 0, (1100, 1400, 1700, 2000), 32


def union_pass(model, seqs, masks, pad_id, device):
    """The implementation before F10 (losses.py at 942bedf), for the comparison."""
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(seqs), width), dtype=torch.long)
    action = torch.zeros((len(seqs), width), dtype=torch.bool)
    for row, (seq, mask) in enumerate(zip(seqs, masks)):
        ids[row, : len(seq)] = torch.tensor(seq)
        attention[row, : len(seq)] = 1
        action[row, : len(mask)] = torch.tensor(mask, dtype=torch.bool)
    positions = torch.nonzero(action[:, 1:].any(0)).squeeze(-1)
    ids, attention = ids.to(device), attention.to(device)
    logits = model(input_ids=ids, attention_mask=attention, logits_to_keep=positions.to(device),
                   use_cache=False).logits
    logits = logits.float()
    log_probs = F.log_softmax(logits, dim=-1)
    logp = log_probs.gather(-1, ids[:, positions + 1].unsqueeze(-1)).squeeze(-1)
    entropy = -(log_probs.exp() * log_probs).sum(-1)
    valid = action[:, positions + 1].to(device)
    return [logp[r][valid[r]] for r in range(len(seqs))], [entropy[r][valid[r]] for r in range(len(seqs))]


PASSES = {"union": union_pass, "rowwise": sequence_action_logprobs}


def tiny_qwen():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                         tie_word_embeddings=False, pad_token_id=PAD)
    return Qwen2ForCausalLM(config).float()


def micro_batch(runs: int):
    """4 rows of 1100-2000 tokens; each has `runs` action runs of 32 tokens at its own random places."""
    seqs, masks = [], []
    for row, length in enumerate(LENGTHS):
        rng = random.Random(row)
        seqs.append([rng.randrange(1, VOCAB) for _ in range(length)])
        slots = sorted(rng.sample(range(1, length // RUN_LEN), runs))  # non-overlapping 32-token slots
        mask = [0] * length
        for slot in slots:
            mask[slot * RUN_LEN : (slot + 1) * RUN_LEN] = [1] * RUN_LEN
        masks.append(mask)
    return seqs, masks


def sizes(masks) -> dict:
    union = set()
    for mask in masks:
        union |= {t for t in range(1, len(mask)) if mask[t]}
    n = sum(sum(m[1:]) for m in masks)
    return {"rows": len(masks), "lengths": [len(m) for m in masks], "action_tokens": n, "k_union": len(union),
            "union_lm_head_rows": len(masks) * len(union), "rowwise_lm_head_rows": n,
            "union_copy_gib": len(masks) * len(union) * VOCAB * 4 / 2**30, "rowwise_copy_gib": n * VOCAB * 4 / 2**30}


def maxrss_mib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def samples_loss_like(fn, model, seqs, masks):
    """What samples_loss does with the pass: a loss over the log-probs, the entropies only as a detached metric."""
    logps, entropies = fn(model, seqs, masks, PAD, "cpu")
    entropy = torch.cat(entropies).detach().mean().item()
    return sum(lp.mean() for lp in logps) / len(logps), entropy


def child(variant: str, mode: str, runs: int) -> None:
    torch.set_num_threads(2)
    model = tiny_qwen()
    fn = PASSES[variant]
    small_seqs = [s[:64] for s in micro_batch(1)[0]]
    small_masks = [[0] * 32 + [1] * 32 for _ in small_seqs]
    loss, _ = samples_loss_like(fn, model, small_seqs, small_masks)  # warm-up: allocator, threads, autograd
    loss.backward()
    model.zero_grad(set_to_none=False)  # gradient buffers exist before the baseline, as in training
    seqs, masks = micro_batch(runs)
    before, warm_peak = rss_mib(), maxrss_mib()
    start = time.perf_counter()
    if mode == "train":
        loss, _ = samples_loss_like(fn, model, seqs, masks)
        loss.backward()
    else:
        with torch.no_grad():
            logps, _ = fn(model, seqs, masks, PAD, "cpu")
            [lp.float().cpu().tolist() for lp in logps]
    seconds = time.perf_counter() - start
    after = maxrss_mib()
    assert after > warm_peak, "the pass did not raise the high-water mark: the measurement says nothing"
    print(json.dumps({"variant": variant, "mode": mode, "rss_before_mib": before, "warmup_peak_mib": warm_peak,
                      "peak_mib": after, "pass_peak_mib": after - before, "seconds": seconds}))


def check(runs: int) -> None:
    """Values and gradients of both variants on the same batch (sequentially, so one set of big tensors at a time)."""
    torch.set_num_threads(2)
    model = tiny_qwen()
    seqs, masks = micro_batch(runs)
    out = {}
    for variant, fn in PASSES.items():
        model.zero_grad(set_to_none=True)
        logps, entropies = fn(model, seqs, masks, PAD, "cpu")
        (sum((lp * torch.linspace(-1, 1, len(lp))).sum() for lp in logps)).backward()
        out[variant] = ([lp.detach() for lp in logps], [e.detach() for e in entropies],
                        {n: p.grad.clone() for n, p in model.named_parameters()},
                        any(e.requires_grad for e in entropies))
        del logps, entropies
    (ul, ue, ug, ureq), (rl, re, rg, rreq) = out["union"], out["rowwise"]
    print(json.dumps({
        "max_abs_logp_diff": max((a - b).abs().max().item() for a, b in zip(ul, rl)),
        "max_abs_entropy_diff": max((a - b).abs().max().item() for a, b in zip(ue, re)),
        "max_abs_grad_diff": {n: (ug[n] - rg[n]).abs().max().item() for n in ug if (ug[n] - rg[n]).any()},
        "max_abs_grad": {n: ug[n].abs().max().item() for n in ug if (ug[n] - rg[n]).any()},
        "params_with_identical_grad": sum(not (ug[n] - rg[n]).any() for n in ug), "params": len(ug),
        "logp_dtype": str(rl[0].dtype), "entropy_requires_grad": {"union": ureq, "rowwise": rreq}}))


def run_child(args: list[str]) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS="2", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, __file__, *args], env=env, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=8, help="32-token action runs per row")
    parser.add_argument("--out", default=str(Path(__file__).with_name("summary.json")))
    parser.add_argument("--child", nargs=2, metavar=("VARIANT", "MODE"))
    parser.add_argument("--check", action="store_true")
    parser.add_argument("--variants", default="rowwise,union")
    args = parser.parse_args()
    if args.child:
        return child(*args.child, args.runs)
    if args.check:
        return check(args.runs)
    result = {"runs_per_row": args.runs, "run_len": RUN_LEN, "vocab": VOCAB, "threads": 2,
              "torch": torch.__version__, **sizes(micro_batch(args.runs)[1]), "passes": []}
    print(json.dumps({k: v for k, v in result.items() if k != "passes"}), flush=True)
    for mode in ("train", "old_logp"):
        for variant in args.variants.split(","):
            result["passes"].append(run_child(["--child", variant, mode, "--runs", str(args.runs)]))
            print(json.dumps(result["passes"][-1]), flush=True)
    if "union" in args.variants and "rowwise" in args.variants:
        result["check"] = run_child(["--check", "--runs", str(args.runs)])
        print(json.dumps(result["check"]), flush=True)
    Path(args.out).write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
