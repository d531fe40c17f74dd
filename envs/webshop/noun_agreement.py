"""How close the dependency-free noun extractor is to spaCy's (docs/webshop.md §5, "Parity").

    python -m envs.webshop.noun_agreement [--data-dir DIR] [--goals 500]

Needs spaCy and an English model (the reward's own loader, reward.SPACY_MODELS); exits with a
message otherwise. Two measurements:
  * nouns: for each text, spaCy's NOUN/PROPN tokens vs `heuristic_nouns`: the share of texts whose
    noun sets are equal, and micro precision/recall of the heuristic's noun sets against spaCy's.
    Texts: the real synthetic instructions (without "Find me", as written and title-cased like
    product names) and attribute phrases of items_ins_v2*.json (when DIR has it; the file holds no
    product titles), and the product titles of each catalogue used below;
  * reward: for the first N test goals of each catalogue (generated, and hybrid or official with
    DIR), the goal product against every product on the first result page of a search for the
    goal's instruction (what an agent chooses among): how often the type factor r_type and the
    title-score decision (> 0.2) agree, and the mean |difference| of the title scores.
"""
from __future__ import annotations

import argparse
import re
import sys

from . import catalogue
from .config import WebShopConfig
from .reward import heuristic_nouns, spacy_available, spacy_nouns, title_score, type_reward
from .world import build_world


def noun_agreement(texts: list[str]) -> dict:
    equal = true_positive = predicted = gold = 0
    for text in texts:
        want, got = set(spacy_nouns(text)), set(heuristic_nouns(text))
        equal += want == got
        true_positive += len(want & got)
        predicted += len(got)
        gold += len(want)
    return {"texts": len(texts), "equal_sets": equal / max(1, len(texts)),
            "precision": true_positive / max(1, predicted), "recall": true_positive / max(1, gold)}


def reward_agreement(world, goals: int = 500) -> dict:
    pairs = same_type = same_decision = 0
    gap = 0.0
    for goal in world.goals[:goals]:
        for asin in world.index.search(goal["instruction_text"])[:10]:
            product = world.by_asin[asin]
            a, b = type_reward(goal, product, spacy_nouns), type_reward(goal, product, heuristic_nouns)
            pairs += 1
            same_type += a["r_type"] == b["r_type"]
            same_decision += (a["title_score"] > 0.2) == (b["title_score"] > 0.2)
            gap += abs(title_score(goal["name"], product["Title"], spacy_nouns)
                       - title_score(goal["name"], product["Title"], heuristic_nouns))
    return {"pairs": pairs, "same_r_type": same_type / max(1, pairs),
            "same_title_decision": same_decision / max(1, pairs), "mean_abs_title_gap": gap / max(1, pairs)}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data-dir", default="", help="folder with items_ins_v2*.json (and optionally items_shuffle*)")
    parser.add_argument("--goals", type=int, default=500)
    args = parser.parse_args(argv)
    if not spacy_available():
        print("spaCy with an English model is not installed; nothing to compare against")
        return 1
    worlds = {"generated": build_world(WebShopConfig(noun_extractor="heuristic"))}
    if args.data_dir:
        world = build_world(WebShopConfig(data_dir=args.data_dir, noun_extractor="heuristic"))
        worlds[world.source] = world
        path = catalogue.find_file(args.data_dir, catalogue.ATTRIBUTE_FILES)
        entries = catalogue.load_attributes(path).values()
        # the instructions without their "Find me " (a verb and a pronoun no title has), as written
        # (lower case) and title-cased like most product names
        instructions = [re.sub(r"^find me\s+", "", e["instruction"], flags=re.IGNORECASE)
                        for e in entries if e.get("instruction")]
        title_cased = [" ".join(w[:1].upper() + w[1:] for w in text.split()) for text in instructions]
        phrases = sorted({a for e in entries for a in e.get("attributes", [])})
        for name, texts in (("real instructions", instructions), ("real instructions, title-cased", title_cased),
                            ("real attribute phrases", phrases)):
            print(f"nouns, {name}: {_format(noun_agreement(texts))}")
    for name, world in worlds.items():
        titles = [p["Title"] for p in world.products]
        print(f"nouns, {name} catalogue titles: {_format(noun_agreement(titles))}")
        print(f"reward, {name} catalogue, goal vs first-page results: {_format(reward_agreement(world, args.goals))}")
    return 0


def _format(result: dict) -> str:
    return ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in result.items())


if __name__ == "__main__":
    sys.exit(main())
