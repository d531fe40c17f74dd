"""Scripted and random WebShop agents and a step-latency benchmark.

    python -m envs.webshop.agents [--split test] [--goals 500] [--data-dir DIR] [--seed 0]
                                  [--noun-extractor auto|heuristic|spacy]

Prints score (100 x mean task reward) and success rate (% of episodes with reward 1.0) of:
  * the scripted agent: reads only the instruction and the observations. It searches the
    instruction (without "Find me" and the price clause, with the option values), ranks the
    first-page results by (displayed price within the limit, words shared with the instruction,
    search rank), opens the best one, goes back to the next one if the item lacks one of the
    goal's option values (at most 4 items), clicks the option values named in the instruction
    ("with name: value, and ..."), buys;
  * the random agent: searches the instruction, then clicks uniformly among the admissible clicks
    (click[search], listed but never legal, left out; on the search page it searches again) until
    it buys or hits the step cap;
and the median latency of `env.step` for search and for click steps (docs/webshop.md §9;
target < 5 ms for 1000 products). The numbers describe the configured catalogue (by default the
generated offline one), not the published WebShop setting.
"""
from __future__ import annotations

import argparse
import random
import re
import statistics
import time

from .config import WebShopConfig
from .env import WebShopEnv

_PRICE = re.compile(r",? and price lower than ([\d.]+) dollars\s*$")
_WORD = re.compile(r"[a-z0-9]+")


def wrap(action: str) -> str:
    return f"<think>scripted</think><action>{action}</action>"


def parse_instruction(text: str) -> tuple[str, dict[str, str], float]:
    """(base instruction, {option name: value}, price limit) of a synthetic instruction."""
    price = float("inf")
    match = _PRICE.search(text)
    if match:
        price, text = float(match.group(1)), text[:match.start()]
    options: dict[str, str] = {}
    position = text.rfind(" with ")
    while position >= 0:
        parts = text[position + len(" with "):].split(", and ")
        if all(": " in part for part in parts):
            options = dict(part.split(": ", 1) for part in parts)
            text = text[:position]
            break
        position = text.rfind(" with ", 0, position)
    base = re.sub(r"^find me\s+", "", text.strip(), flags=re.IGNORECASE)
    return base, options, price


def _results(observation: str) -> list[tuple[str, str, float]]:
    """(asin, title, lowest displayed price) triples of a results observation."""
    segments = observation.split(" [SEP] ")
    found = []
    for i, segment in enumerate(segments):
        if re.fullmatch(r"B[0-9A-Z]{9}", segment) and i + 2 < len(segments):
            prices = re.findall(r"\$([\d.]+)", segments[i + 2])
            found.append((segment, segments[i + 1], float(prices[0]) if prices else float("inf")))
    return found


def scripted_episode(env: WebShopEnv, task, max_tries: int = 4) -> dict:
    env.reset(task)
    base, options, price_limit = parse_instruction(env.engine.instruction)
    _, _, done, info = env.step(wrap(f"search[{' '.join([base, *options.values()])}]"))
    wanted = set(_WORD.findall(base.lower()))

    def score(entry):
        rank, (_, title, price) = entry
        return (price <= price_limit, len(wanted & set(_WORD.findall(title.lower()))), -rank)

    candidates = sorted(enumerate(_results(env.engine.observation())), key=score, reverse=True)
    ranked = [asin for _, (asin, _, _) in candidates]
    for attempt, asin in enumerate(ranked[:max_tries]):
        _, _, done, info = env.step(wrap(f"click[{asin.lower()}]"))
        has_options = all(f"click[{v}]" in info["admissible_actions"] for v in options.values())
        if has_options or attempt == min(max_tries, len(ranked)) - 1:
            for value in options.values():
                if not done and f"click[{value}]" in info["admissible_actions"]:
                    _, _, done, info = env.step(wrap(f"click[{value}]"))
            if not done:
                _, _, done, info = env.step(wrap("click[buy now]"))
            break
        _, _, done, info = env.step(wrap("click[< prev]"))
    return info


def random_episode(env: WebShopEnv, task, rng: random.Random) -> dict:
    env.reset(task)
    base, _, _ = parse_instruction(env.engine.instruction)
    _, _, done, info = env.step(wrap(f"search[{base}]"))
    while not done:
        # click[search] is listed (as in verl-agent) but never legal: a random clicker skips it
        clicks = [a for a in info["admissible_actions"] if a.startswith("click[") and a != "click[search]"]
        action = rng.choice(clicks) if clicks else f"search[{base}]"
        _, _, done, info = env.step(wrap(action))
    return info


def evaluate(env: WebShopEnv, tasks, agent: str = "scripted", seed: int = 0) -> dict:
    rng = random.Random(seed)
    infos = [scripted_episode(env, t) if agent == "scripted" else random_episode(env, t, rng) for t in tasks]
    return {
        "episodes": len(infos),
        "score": sum(i["score"] for i in infos) / max(1, len(infos)),
        "success_rate": 100.0 * sum(i["success"] for i in infos) / max(1, len(infos)),
    }


def step_latency(env: WebShopEnv, tasks, repeats: int = 1) -> dict:
    """Median wall time (ms) of env.step for search steps and click steps."""
    search_ms, click_ms = [], []
    for _ in range(repeats):
        for task in tasks:
            env.reset(task)
            base, options, _ = parse_instruction(env.engine.instruction)
            start = time.perf_counter()
            _, _, done, info = env.step(wrap(f"search[{base}]"))
            search_ms.append(1000 * (time.perf_counter() - start))
            for action in [a for a in info["admissible_actions"] if a.startswith("click[b")][:1] + ["click[features]",
                                                                                                   "click[< prev]"]:
                start = time.perf_counter()
                env.step(wrap(action))
                click_ms.append(1000 * (time.perf_counter() - start))
    return {"search_ms": statistics.median(search_ms), "click_ms": statistics.median(click_ms),
            "search_steps": len(search_ms), "click_steps": len(click_ms)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="WebShop scripted / random agents and step latency")
    parser.add_argument("--split", default="test")
    parser.add_argument("--goals", type=int, default=500, help="first N goals of the split (0 = all)")
    parser.add_argument("--data-dir", default="")
    parser.add_argument("--catalogue-seed", type=int, default=0)
    parser.add_argument("--num-products", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0, help="random agent seed")
    parser.add_argument("--noun-extractor", default="auto", choices=("auto", "heuristic", "spacy"))
    args = parser.parse_args(argv)
    start = time.perf_counter()
    env = WebShopEnv(WebShopConfig(data_dir=args.data_dir, catalogue_seed=args.catalogue_seed,
                                   num_products=args.num_products, noun_extractor=args.noun_extractor))
    print(f"world: {env.world.source}, {len(env.world.products)} products, {len(env.world.goals)} goals, "
          f"nouns: {env.world.noun_extractor}, built in {time.perf_counter() - start:.2f} s")
    tasks = env.tasks(args.split)
    tasks = tasks[:args.goals] if args.goals else tasks
    for agent in ("scripted", "random"):
        result = evaluate(env, tasks, agent, args.seed)
        print(f"{agent:8s} agent on {result['episodes']} {args.split} goals: score {result['score']:.1f}, "
              f"success {result['success_rate']:.1f} %")
    latency = step_latency(env, tasks[:200])
    print(f"env.step median latency: search {latency['search_ms']:.2f} ms ({latency['search_steps']} steps), "
          f"click {latency['click_ms']:.2f} ms ({latency['click_steps']} steps)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
