"""Decode time with the static vs the dynamic KV cache (the `kind` of `engine.generation.feed_prefixes`), on CPU
(SmolLM2-135M fp32, one thread).

6 rows whose ~1,400-token contexts are cached (`prefill`), then 32 greedy new tokens each; the two layouts are
interleaved, `--repeats` times each, and the median wall time of the `generate` call is printed. Both must give the
same tokens. A dynamic cache concatenates every layer at every step (the whole cache copied per token); the static
one writes each position in place.

    python results/kv_memory/decode_time.py [--repeats 2]
"""
import argparse
import contextlib
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))


@contextlib.contextmanager
def cache_kind(kind: str):
    """Make engine.generation.generate build its batch cache as `kind` ("static" is what it uses)."""
    from engine import generation

    feed = generation.feed_prefixes
    generation.feed_prefixes = lambda *a, **k: feed(*a, **{**k, "kind": kind})
    try:
        yield
    finally:
        generation.feed_prefixes = feed


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    import torch

    torch.set_num_threads(1)
    from config import ModelConfig
    from engine.generation import ChatStream, generate, prefill
    from infra.models import load_policy

    model, tokenizer = load_policy(ModelConfig(lora=False))
    model.eval()
    chat = ChatStream(tokenizer)
    facts = " ".join(f"Fact {i}: shelf {i % 7} holds {i * 3 % 11} red books." for i in range(110))
    contexts = [chat.first_turn(f"Question {q}. {facts} Which shelf holds the most?") for q in range(6)]
    seconds, tokens = {"dynamic": [], "static": []}, {}
    for _ in range(args.repeats):
        for kind in ("dynamic", "static"):
            caches = prefill(model, contexts, chat.pad_id)
            start = time.perf_counter()
            with cache_kind(kind):
                tokens[kind] = generate(model, chat.pad_id, chat.eos_id, contexts, max_new_tokens=32,
                                        temperature=0.0, caches=caches, keep_caches=False)
            seconds[kind].append(time.perf_counter() - start)
    assert tokens["static"] == tokens["dynamic"], "the layouts disagree"
    steps = max(len(t) for t in tokens["static"])
    print(f"6 rows x {max(len(c) for c in contexts)} cached tokens, {steps} decode steps, repeats {args.repeats}")
    for kind, values in seconds.items():
        print(f"{kind:8} median {statistics.median(values):6.2f} s  ({', '.join(f'{v:.2f}' for v in values)})")


if __name__ == "__main__":
    main()
