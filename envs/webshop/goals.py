"""Goals (instructions): WebShop's synthetic recipe and the human-goal mode.

Maps to docs/webshop.md §4 (WebShop's `engine/goal.py`: get_synthetic_goals, get_human_goals):
  * synthetic goals: for each product (catalogue order) with an `instruction` in items_ins_v2,
    one price clause is drawn, then every combination of its option values (option names sorted)
    is one goal: instruction + " with name1: v1, and name2: v2" + the product's price clause;
    attributes = instruction_attributes; goal_options = {name: value}. Option values keep their
    duplicates (duplicate goals) and an empty option group yields no goal for the product, as in
    the original; a product without options yields one goal without the " with ..." part.
  * human goals: products in catalogue order; for each, its labelled instructions from
    items_human_ins.json in file order, skipping those with an empty instruction_attributes;
    instruction.strip('.') + price clause (one draw per instruction); goal_options = the list
    instruction_options; weight 1.
  * price clause: from [10, 20, ..., 990] take the first 4 values above the product's price,
    pick 2 at random, use the larger: ", and price lower than X.00 dollars"; with fewer than 2
    values no clause and price_upper = 1e6.
  * synthetic weight = mean over the goal attributes of 1 / (number of goals using that attribute).
  * order: shuffled with random.seed(233) (WEBSHOP_GOAL_SHUFFLE_SEED; `random.Random(233).shuffle`
    draws the same permutation); goal i = goals[i]; test = goals[:500], train = goals[500:].

Deviation: the price-clause draws use a dedicated `random.Random(seed)` (the original used the
unseeded global RNG, so its clauses differ per run; goal order and count do not depend on them).
"""
from __future__ import annotations

import itertools
import random
from collections import Counter

PRICE_STEPS = list(range(10, 1000, 10))
WEBSHOP_GOAL_SHUFFLE_SEED = 233  # the original WebShop's random.seed(233) before it shuffles its goals
NO_PRICE_LIMIT = 1e6


def price_clause(price: float, rng: random.Random) -> tuple[str, float]:
    """(text, price_upper) for a product's sampled price."""
    above = [p for p in PRICE_STEPS if p > price][:4]
    if len(above) < 2:
        return "", NO_PRICE_LIMIT
    upper = float(max(rng.sample(above, 2)))
    return f", and price lower than {upper:.2f} dollars", upper


def _base_goal(product: dict) -> dict:
    return {
        "asin": product["asin"],
        "category": product["category"],
        "query": product["query"],
        "name": product["Title"],
        "product_category": product["product_category"],
    }


def _add_weights(goals: list[dict]) -> None:
    counts = Counter(a for goal in goals for a in goal["attributes"])
    for goal in goals:
        attrs = goal["attributes"]
        goal["weight"] = sum(1.0 / counts[a] for a in attrs) / len(attrs) if attrs else 0.0


def build_synthetic_goals(products: list[dict], attributes: dict, seed: int = WEBSHOP_GOAL_SHUFFLE_SEED,
                          price_seed: int = 233) -> list[dict]:
    """All synthetic goals of the catalogue, shuffled with `seed` (WebShop: 233)."""
    rng = random.Random(price_seed)
    goals = []
    for product in products:
        entry = attributes.get(product["asin"]) or {}
        instruction = entry.get("instruction")
        if not instruction:
            continue
        # one clause per product, drawn before the combinations (even when there are none)
        text, upper = price_clause(product["price"], rng)
        names = sorted(product["options"])
        for combo in itertools.product(*(product["options"][name] for name in names)):
            chosen = dict(zip(names, combo, strict=True))
            option_text = ", and ".join(f"{name}: {value}" for name, value in chosen.items())
            goal = _base_goal(product)
            goal.update({
                "instruction_text": instruction + (f" with {option_text}" if option_text else "") + text,
                "attributes": list(entry.get("instruction_attributes") or []),
                "goal_options": chosen,
                "price_upper": upper,
            })
            goals.append(goal)
    _add_weights(goals)
    random.Random(seed).shuffle(goals)
    return goals


def build_human_goals(products: list[dict], human: dict, seed: int = WEBSHOP_GOAL_SHUFFLE_SEED,
                      price_seed: int = 233) -> list[dict]:
    """Goals from items_human_ins.json (asin -> list of labelled instructions), shuffled with `seed`.

    Products are visited in catalogue order (WebShop iterates its product list), so the goal order
    before the shuffle, and hence goal i, does not depend on the order of the human file.
    """
    rng = random.Random(price_seed)
    goals = []
    for product in products:
        for entry in human.get(product["asin"]) or []:
            if not entry.get("instruction_attributes"):
                continue
            text, upper = price_clause(product["price"], rng)
            goal = _base_goal(product)
            goal.update({
                "instruction_text": str(entry["instruction"]).strip(".") + text,
                "attributes": list(entry["instruction_attributes"]),
                "goal_options": list(entry.get("instruction_options") or []),
                "price_upper": upper,
                "weight": 1.0,  # WebShop gives every human goal weight 1
            })
            goals.append(goal)
    random.Random(seed).shuffle(goals)
    return goals


def split_indices(num_goals: int, split: str, test_goals: int = 500) -> range:
    """Goal indices of a split: test = [0, test_goals), train = [test_goals, num_goals)."""
    cut = min(test_goals, num_goals)
    if split == "test":
        return range(0, cut)
    if split == "train":
        return range(cut, num_goals)
    if split == "all":
        return range(0, num_goals)
    raise ValueError(f"unknown split {split!r}; expected 'train', 'test' or 'all'")
