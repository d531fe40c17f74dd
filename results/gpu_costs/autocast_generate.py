"""Full fine-tuning's generation with fp32 master weights under autocast: one autocast region per generate call
(engine.generation.one_autocast_region) vs autocast per forward alone (every weight re-cast at every decode step).

    python results/gpu_costs/autocast_generate.py [--size 0.5b] [--batch 4] [--new 32]

A random Qwen2.5-shaped model (tools/smoke.py, no download), bf16 compute, greedy; prints the weight casts per call,
the seconds per call (best of 3) and their ratio, and checks the tokens are identical. On a GPU the per-step
cast is memory traffic: 6 bytes per parameter per step (read fp32, write bf16), which the decode step then reads
again as bf16 (2 bytes): so casting costs ~3x the decode step's own weight reads."""
import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from tools import smoke  # noqa: E402
from config import ModelConfig  # noqa: E402
from engine.generation import generate  # noqa: E402
from infra.models import load_policy  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--size", default="0.5b")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--new", type=int, default=32)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    folder = smoke.write_model(Path(tempfile.mkdtemp()) / "m", args.size)
    model, _ = load_policy(ModelConfig(name_or_path=folder, dtype="bfloat16", lora=False), device=args.device)
    model.eval()
    contexts = [[5 + i, 17, 300, 42, 7, 9, 11, 12] for i in range(args.batch)]
    results = {}
    for label, dtype in (("one region per call", torch.bfloat16), ("autocast per forward", None)):
        model.generation_autocast_dtype = dtype
        times = []
        for _ in range(3):
            if args.device == "cuda":
                torch.cuda.synchronize()
            start = time.perf_counter()
            tokens = generate(model, 0, 1, contexts, max_new_tokens=args.new, temperature=0.0)
            if args.device == "cuda":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
        results[label] = (min(times), tokens)
        print(f"{label:22s} {min(times):7.3f} s per call ({args.batch} x {args.new} tokens, {args.size}, "
              f"{args.device}, {torch.get_num_threads()} threads)")
    (one, a), (per, b) = results.values()
    print(f"ratio per-forward / one region: {per / one:.2f}x; tokens identical: {a == b}")


if __name__ == "__main__":
    main()
