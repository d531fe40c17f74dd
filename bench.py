"""Benchmark: one batched `generate` per step versus one call per episode (prints times and the ratio).

    python bench.py --config configs/quickstart.yaml [--episodes=8] [--repeats=3] [--prompt_tokens=N]
                    [--section.key=value ...]

Contexts are real first turns of the configured environment (one per episode, cycling over the training tasks),
generation uses the config's action-token budget and temperature. Both variants generate the same number of new
tokens per episode (eos is disabled for the timing) so the comparison is work-for-work.
"""
from __future__ import annotations

import sys
import time

import torch

from config import load_config, split_cli
from envs import make_env
from models import load_policy
from rollout import ChatStream


def timed_generate(model, chat, contexts, new_tokens, temperature):
    width = max(len(c) for c in contexts)
    ids = torch.full((len(contexts), width), chat.pad_id, dtype=torch.long)
    attention = torch.zeros_like(ids)
    for row, ctx in enumerate(contexts):
        ids[row, width - len(ctx) :] = torch.tensor(ctx)
        attention[row, width - len(ctx) :] = 1
    start = time.perf_counter()
    with torch.no_grad():
        model.generate(input_ids=ids, attention_mask=attention, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                       do_sample=True, temperature=temperature, top_k=0, pad_token_id=chat.pad_id)
    return time.perf_counter() - start


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    options = {"episodes": 8, "repeats": 3, "prompt_tokens": 0}
    rest = []
    for arg in argv:
        key = arg[2:].split("=", 1)[0]
        if key in options and "=" in arg:
            options[key] = int(arg.split("=", 1)[1])
        else:
            rest.append(arg)
    cfg = load_config(*split_cli(rest))
    if cfg.train.torch_threads > 0:
        torch.set_num_threads(cfg.train.torch_threads)
    model, tokenizer = load_policy(cfg.model)
    model.eval()
    chat = ChatStream(tokenizer)
    env = make_env(cfg.env)
    tasks = env.tasks("train")
    texts = [env.reset(tasks[i % len(tasks)]) for i in range(min(len(tasks), options["episodes"]))]
    env.close()
    contexts = [chat.first_turn(texts[i % len(texts)]) for i in range(options["episodes"])]
    if options["prompt_tokens"] > 0:  # keep the last N tokens: a decode-dominated regime, as on a GPU
        contexts = [c[-options["prompt_tokens"] :] for c in contexts]
    new = cfg.rollout.max_action_tokens
    print(f"{len(contexts)} episodes, prompt {min(map(len, contexts))}-{max(map(len, contexts))} tokens, "
          f"{new} new tokens each, torch threads {torch.get_num_threads()}")
    timed_generate(model, chat, contexts[:1], 2, cfg.rollout.temperature)  # warm-up
    batched, single = [], []
    for _ in range(options["repeats"]):
        batched.append(timed_generate(model, chat, contexts, new, cfg.rollout.temperature))
        single.append(sum(timed_generate(model, chat, [c], new, cfg.rollout.temperature) for c in contexts))
    b, s = min(batched), min(single)
    print(f"one batched generate per step : {b:.2f} s")
    print(f"one generate per episode      : {s:.2f} s")
    print(f"speed-up (per-episode / batched): {s / b:.2f}x")


if __name__ == "__main__":
    main()
