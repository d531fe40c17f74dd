"""What generation under FSDP costs: whole layers for the rollout (infra.runtime.full_weights) vs generating on the
sharded model (every decode step all-gathers every layer, and every rank must step in lockstep).

    torchrun --nproc_per_node 2 results/bench/fsdp_generation.py [--model smollm2-135m-instruct] [--rows 4]

Prints, on rank 0: the time to gather/free the whole model, a batched generate inside `full_weights`, the same
generate on the sharded model (transformers' synced_gpus=True, as it would run without full_weights), their ratio,
and the parameter bytes per rank sharded vs gathered. Results of a run are in fsdp_generation.txt next to it.
"""
import argparse
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from config import ModelConfig  # noqa: E402
from engine.generation import ChatStream  # noqa: E402
from infra.models import load_policy  # noqa: E402
from infra.runtime import Launch, full_weights, make_accelerator, shard_model  # noqa: E402


def timed(fn, repeats: int = 3) -> float:
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", default="smollm2-135m-instruct")
    parser.add_argument("--rows", type=int, default=4)
    parser.add_argument("--new_tokens", type=int, default=16)
    args = parser.parse_args()
    torch.set_num_threads(1)
    accelerator = make_accelerator()
    model, tokenizer = load_policy(ModelConfig(name_or_path=args.model, lora=False), autocast_forward=False)
    total_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    shard_model(model, torch.float32, Launch(fsdp=True))
    local_bytes = sum(p.to_local().numel() * p.element_size() for p in model.parameters())
    model.eval()
    chat = ChatStream(tokenizer)
    prompt = chat.first_turn("You are in a kitchen. There is a fridge and a stove. What do you do first?")
    ids = torch.tensor([prompt] * args.rows)
    kwargs = dict(attention_mask=torch.ones_like(ids), max_new_tokens=args.new_tokens,
                  min_new_tokens=args.new_tokens, do_sample=False, pad_token_id=chat.pad_id)

    def gather_only():
        with full_weights(model):
            pass

    def generate_whole():
        with torch.no_grad(), full_weights(model):
            model.generate(input_ids=ids, synced_gpus=False, **kwargs)

    def generate_sharded():
        with torch.no_grad():
            model.generate(input_ids=ids, synced_gpus=True, **kwargs)

    generate_whole()  # warm-up (FSDP lazy init, allocator)
    gather = timed(gather_only)
    whole = timed(generate_whole)
    sharded = timed(generate_sharded)
    if accelerator.is_main_process:
        world = accelerator.num_processes
        print(f"model {args.model}, {world} ranks (gloo, CPU, fp32), {args.rows} rows x {args.new_tokens} new tokens")
        print(f"gather + free the whole model (full_weights enter/exit): {gather:.3f} s")
        print(f"generate inside full_weights (incl. the gather):        {whole:.3f} s")
        print(f"generate on the sharded model (all-gather per layer per token, synced ranks): {sharded:.3f} s")
        print(f"sharded / full_weights: {sharded / whole:.1f}x")
        print(f"parameter bytes per rank: sharded {local_bytes / 2**20:.0f} MiB, inside full_weights "
              f"{total_bytes / 2**20:.0f} MiB (x{total_bytes / local_bytes:.1f})")
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main()
