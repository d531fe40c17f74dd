"""Offline catalogue generator: a deterministic WebShop-schema catalogue made by our own code.

See docs/webshop.md §6.2-6.4. `generate_catalogue(seed, n)` returns `(raw_products, attributes)`
in exactly the official file formats (docs/webshop.md §6.1): a list like `items_shuffle_1000.json`
and a dict like `items_ins_v2_1000.json`, so the generated data goes through the same loader, goal
builder, search index and reward as the real files.

What it contains: the product types of `product_types.yaml` (38 types over WebShop's coarse
categories beauty, electronics, fashion, food, furniture, garden), each with an Amazon search
query, a breadcrumb, title nouns, an attribute vocabulary (adjective-like, "with ..." and
"for ..." phrases, in WebShop's style) and option groups. The file is read and validated on first
use (`parse_product_types`; a broken file raises `ProductTypeError` naming the product type and
field). Every product gets a brand, 3-6 attributes (some in the title, all somewhere in the text),
bullet points, a description, 0-2 option groups, a single / ranged ("$a$b", the real file's
format) / missing price, and ~40 % of
products get a synthetic "Find me ..." instruction over 2-4 of their attributes (WebShop's real
ratio is 415/1000). Many products share a type, so search, attributes, options, prices and the
type factor all decide the reward.

`hybrid_catalogue(attributes, seed)` builds products for the ASINs of a real `items_ins_v2` file,
keeping its real attributes and instructions (docs/webshop.md §6.3); used by tests with real data.

Deviations: text is generated, cleaner than scraped Amazon text (absolute scores are not
comparable with published WebShop numbers); no images (MainImage is empty).
"""
from __future__ import annotations

import functools
import random
import re
import string
from pathlib import Path

import yaml

PRODUCT_TYPES_FILE = Path(__file__).with_name("product_types.yaml")
_TOP_KEYS = ("category_roots", "palettes", "product_types")
_TYPE_KEYS = ("query", "category", "breadcrumb", "price", "nouns", "pre", "with", "for", "options")
_OPTION_KEYS = ("name", "palette", "min", "max")
_YAML_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when available: faster (docs/webshop.md §6.4)


class ProductTypeError(ValueError):
    """The product-type file breaks its schema (docs/webshop.md §6.4); the message names the place."""


_FILLERS = [
    "built for everyday use",
    "tested for quality and durability",
    "a thoughtful choice for gifting",
    "backed by our friendly customer service",
    "designed with attention to detail",
    "made to keep its shape and finish",
    "a favorite of thousands of customers",
]
_SYLLABLES = ("ka lo ve ri to na mi zo ber lan dor qu sen tia rex vo el ar nix pra so lu fen gri ho ma ta "
              "wen").split()


# ----------------------------------------------------------------------------- product-type table


def _check_keys(value, keys: tuple[str, ...], where: str) -> None:
    if not isinstance(value, dict):
        raise ProductTypeError(f"{where}: expected a mapping with keys {list(keys)}, got {value!r}")
    missing = [k for k in keys if k not in value]
    unknown = [k for k in value if k not in keys]
    if missing or unknown:
        raise ProductTypeError(f"{where}: " + "; ".join(
            ([f"missing key(s) {missing}"] if missing else []) + ([f"unknown key(s) {unknown}"] if unknown else [])))


def _strings(value, where: str, allow_empty: bool = False, unique: bool = True) -> list[str]:
    if not isinstance(value, list):
        raise ProductTypeError(f"{where}: expected a list of strings, got {value!r}")
    if not value and not allow_empty:
        raise ProductTypeError(f"{where}: the list is empty")
    for index, item in enumerate(value):
        if not isinstance(item, str) or not item.strip():
            raise ProductTypeError(f"{where}[{index}]: expected a non-empty string, got {item!r} "
                                   "(quote values that YAML reads as numbers or booleans)")
    repeated = sorted({item for item in value if value.count(item) > 1})
    if unique and repeated:
        raise ProductTypeError(f"{where}: repeated value(s) {repeated}")
    return value


def _integer(value, where: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ProductTypeError(f"{where}: expected an integer, got {value!r}")
    return value


def _check_type(ptype, where: str, roots: dict, palettes: dict) -> None:
    """Validate one product type (`where` already names it) against the schema of docs/webshop.md §6.4."""
    _check_keys(ptype, _TYPE_KEYS, where)
    if not isinstance(ptype["category"], str) or ptype["category"] not in roots:
        raise ProductTypeError(f"{where}, field 'category': {ptype['category']!r} is not one of the "
                               f"category_roots {list(roots)}")
    _strings(ptype["breadcrumb"], f"{where}, field 'breadcrumb'", unique=False)
    price = ptype["price"]
    if (not isinstance(price, list) or len(price) != 2
            or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in price)
            or not 0 < price[0] <= price[1]):
        raise ProductTypeError(f"{where}, field 'price': expected [low, high] with 0 < low <= high, got {price!r}")
    _strings(ptype["nouns"], f"{where}, field 'nouns'")
    seen: dict[str, str] = {}
    for slot in ("pre", "with", "for"):
        for attribute in _strings(ptype[slot], f"{where}, field '{slot}'", allow_empty=True):
            if attribute in seen:
                raise ProductTypeError(f"{where}, field '{slot}': attribute {attribute!r} is also in "
                                       f"'{seen[attribute]}' (each attribute belongs to one slot)")
            seen[attribute] = slot
    if len(seen) < 3:
        raise ProductTypeError(f"{where}, fields 'pre'/'with'/'for': need at least 3 attributes in total, "
                               f"got {len(seen)}")
    groups = ptype["options"]
    if not isinstance(groups, list):
        raise ProductTypeError(f"{where}, field 'options': expected a list of option groups, got {groups!r}")
    names: set[str] = set()
    for index, group in enumerate(groups):
        at = f"{where}, field 'options'[{index}]"
        _check_keys(group, _OPTION_KEYS, at)
        name = group["name"]
        if not isinstance(name, str) or not name.strip() or name in names:
            raise ProductTypeError(f"{at}: 'name' must be a non-empty string, unique within the type, got {name!r}")
        names.add(name)
        if not isinstance(group["palette"], str) or group["palette"] not in palettes:
            raise ProductTypeError(f"{at}: palette {group['palette']!r} is not defined under 'palettes'")
        low, high = _integer(group["min"], f"{at}, 'min'"), _integer(group["max"], f"{at}, 'max'")
        size = len(palettes[group["palette"]])
        if not 1 <= low <= high <= size:
            raise ProductTypeError(f"{at}: need 1 <= min <= max <= {size} (values in palette "
                                   f"{group['palette']!r}), got min={low}, max={high}")


@functools.lru_cache(maxsize=8)
def _load_table(path: Path) -> dict:
    """The parsed, validated product-type file (cached per path; treat as read-only)."""
    try:
        table = yaml.load(path.read_text(encoding="utf-8"), Loader=_YAML_LOADER)
    except yaml.YAMLError as err:
        raise ProductTypeError(f"{path}: not valid YAML: {err}") from err
    name = path.name
    _check_keys(table, _TOP_KEYS, name)
    roots, palettes, types = table["category_roots"], table["palettes"], table["product_types"]
    if not isinstance(roots, dict) or not roots:
        raise ProductTypeError(f"{name}: 'category_roots': expected a non-empty mapping, got {roots!r}")
    for category, root in roots.items():
        if not isinstance(root, str) or not root.strip():
            raise ProductTypeError(f"{name}: category root {category!r}: expected a non-empty string, got {root!r}")
    if not isinstance(palettes, dict) or not palettes:
        raise ProductTypeError(f"{name}: 'palettes': expected a non-empty mapping, got {palettes!r}")
    for palette, values in palettes.items():
        _strings(values, f"{name}: palette {palette!r}")
    if not isinstance(types, list) or not types:
        raise ProductTypeError(f"{name}: 'product_types': expected a non-empty list, got {types!r}")
    queries: set[str] = set()
    for index, ptype in enumerate(types):
        query = ptype.get("query") if isinstance(ptype, dict) else None
        where = f"{name}: product type #{index + 1}"
        if not isinstance(query, str) or not query.strip():
            raise ProductTypeError(f"{where}, field 'query': expected a non-empty string, got {query!r}")
        where += f" ({query!r})"
        if query in queries:
            raise ProductTypeError(f"{where}, field 'query': another product type has the same query")
        queries.add(query)
        _check_type(ptype, where, roots, palettes)
    return table


def parse_product_types(path: str | Path | None = None) -> list[dict]:
    """The product types of `path` (default: product_types.yaml next to this file), ready for the generator.

    Each: category, query, breadcrumb (the full "root › level › ..." string), nouns, pre, with, for,
    options [(group name, palette values, min, max)], price (low, high). Fresh lists on every call.
    """
    table = _load_table(Path(path) if path is not None else PRODUCT_TYPES_FILE)
    roots, palettes = table["category_roots"], table["palettes"]
    return [{
        "category": t["category"],
        "query": t["query"],
        "breadcrumb": " › ".join([roots[t["category"]], *t["breadcrumb"]]),
        "nouns": list(t["nouns"]),
        "pre": list(t["pre"]),
        "with": list(t["with"]),
        "for": list(t["for"]),
        "options": [(g["name"], list(palettes[g["palette"]]), g["min"], g["max"]) for g in t["options"]],
        "price": (float(t["price"][0]), float(t["price"][1])),
    } for t in table["product_types"]]


def _title_case(text: str) -> str:
    return " ".join(w if any(c.isdigit() for c in w) else w[:1].upper() + w[1:] for w in text.split())


def _asin(rng: random.Random, taken: set[str]) -> str:
    while True:
        asin = "B0" + "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(8))
        if asin not in taken:
            taken.add(asin)
            return asin


def _brands(rng: random.Random, count: int = 150) -> list[str]:
    names: list[str] = []
    while len(names) < count:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(2, 3))).capitalize()
        if name not in names and 4 <= len(name) <= 10:
            names.append(name)
    return names


def _slot(ptype: dict, attribute: str) -> str:
    for slot in ("pre", "with", "for"):
        if attribute in ptype[slot]:
            return slot
    return "pre"


def make_instruction(ptype: dict, query: str, attributes: list[str]) -> str:
    """WebShop-style synthetic instruction: 'Find me <adj> <query> with <x> for <y>'."""
    by_slot: dict[str, list[str]] = {"pre": [], "with": [], "for": []}
    for attribute in attributes:
        by_slot[_slot(ptype, attribute)].append(attribute)
    text = "Find me " + (", ".join(by_slot["pre"]) + " " if by_slot["pre"] else "") + query
    if by_slot["with"]:
        text += " with " + ", ".join(by_slot["with"])
    if by_slot["for"]:
        text += " for " + ", ".join(by_slot["for"])
    return text


def _price(rng: random.Random, low: float, high: float) -> str:
    roll = rng.random()
    value = round(rng.uniform(low, high), 2)
    if roll < 0.02:
        return ""
    if roll < 0.27:  # a range, written as the scraped file writes it: "$19.99$27.99"
        return f"${value:,.2f}${round(value * rng.uniform(1.1, 1.6), 2):,.2f}"
    return f"${value:,.2f}"


def _options(rng: random.Random, ptype: dict) -> dict:
    options = {}
    for name, palette, low, high in ptype["options"]:
        if rng.random() < 0.08:  # a few products lack a group
            continue
        count = min(len(palette), rng.randint(low, high))
        values = sorted(rng.sample(range(len(palette)), count))
        options[name] = [{"value": palette[i], "image": None} for i in values]
    return options


def _product(rng: random.Random, ptype: dict, asin: str, brand: str, attributes: list[str],
             noun: str | None = None) -> dict:
    """One raw product (official `items_shuffle` schema) whose text mentions all its attributes."""
    noun = noun or rng.choice(ptype["nouns"])
    in_title = [a for a in attributes if rng.random() < 0.6] or attributes[:1]
    pre = [a for a in in_title if _slot(ptype, a) == "pre"]
    title = f"{brand} " + " ".join(_title_case(a) for a in pre) + (" " if pre else "") + _title_case(noun)
    withs = [a for a in in_title if _slot(ptype, a) == "with"]
    fors = [a for a in in_title if _slot(ptype, a) == "for"]
    if withs:
        title += " with " + " and ".join(_title_case(a) for a in withs)
    if fors:
        title += " for " + _title_case(fors[0])
    bullets = [f"{_title_case(a)} - {rng.choice(_FILLERS)}." for a in rng.sample(attributes, len(attributes))]
    bullets.append(f"Package includes 1 {noun} from {brand}.")
    rest = [a for a in attributes if a not in in_title]
    description = (f"The {brand} {noun} is {rng.choice(_FILLERS)}. "
                   + (f"It offers {', '.join(rest)}. " if rest else "")
                   + f"Shop with confidence: every {ptype['query']} item from {brand} is {rng.choice(_FILLERS)}.")
    return {
        "asin": asin,
        "name": title,
        "brand": brand,
        "full_description": description,
        "small_description": bullets,
        "pricing": _price(rng, *ptype["price"]),
        "images": [],
        "product_category": ptype["breadcrumb"],
        "category": ptype["category"],
        "query": ptype["query"],
        "customization_options": _options(rng, ptype) or "",
        "average_rating": "N.A.",
    }


def generate_catalogue(seed: int = 0, num_products: int = 1000,
                       instruction_rate: float = 0.42) -> tuple[list[dict], dict]:
    """A deterministic catalogue: (raw products as in items_shuffle, attributes as in items_ins_v2)."""
    rng = random.Random(f"webshop-catalogue-{seed}")
    types = parse_product_types()
    brands = _brands(rng)
    taken: set[str] = set()
    raw_products, attributes = [], {}
    for index in range(num_products):
        ptype = types[index % len(types)] if index < len(types) else rng.choice(types)
        pool = ptype["pre"] + ptype["with"] + ptype["for"]
        chosen = rng.sample(pool, min(len(pool), rng.randint(3, 6)))
        asin = _asin(rng, taken)
        raw_products.append(_product(rng, ptype, asin, rng.choice(brands), chosen))
        entry: dict = {"attributes": chosen}
        if rng.random() < instruction_rate:
            goal_attributes = rng.sample(chosen, rng.randint(2, min(4, len(chosen))))
            ordered = [a for a in pool if a in goal_attributes]
            entry["instruction"] = make_instruction(ptype, ptype["query"], ordered)
            entry["instruction_attributes"] = ordered
        attributes[asin] = entry
    rng.shuffle(raw_products)
    return raw_products, attributes


# ----------------------------------------------------------------------------- hybrid (real ASINs)


def query_from_instruction(instruction: str, attributes: list[str]) -> str:
    """Recover the product query from a real 'Find me <adj> <query> with .. for ..' instruction."""
    text = re.sub(r"^find me\s+", "", instruction.strip().lower())
    text = re.split(r"\s+with\s+|\s+for\s+", text)[0]
    head = text.split(",")[-1].strip()
    for attribute in sorted(attributes, key=len, reverse=True):
        if head.startswith(attribute + " "):
            head = head[len(attribute):].strip()
    return head or text


def hybrid_catalogue(attributes: dict, seed: int = 0, limit: int = 0) -> list[dict]:
    """Generated raw products for the ASINs of a real `items_ins_v2` dict (real attributes kept).

    The product type is the generator type whose vocabulary overlaps the real attributes and
    instruction most; instructed products take the query read off their instruction (so the
    goal's query/title nouns are consistent with it).
    """
    rng = random.Random(f"webshop-hybrid-{seed}")
    types = parse_product_types()
    brands = _brands(rng)
    vocabularies = [set(" ".join(t["pre"] + t["with"] + t["for"] + t["nouns"] + [t["query"]]).split()) for t in types]
    raw_products = []
    for asin, entry in attributes.items():
        real = [a for a in entry.get("attributes", []) if isinstance(a, str)]
        words = set(" ".join(real + [entry.get("instruction", "")]).lower().split())
        best = max(range(len(types)), key=lambda i: (len(words & vocabularies[i]), rng.random()))
        ptype = types[best]
        noun = None
        if entry.get("instruction"):
            ptype = dict(ptype, query=query_from_instruction(entry["instruction"], real))
            noun = ptype["query"]
        raw_products.append(_product(rng, ptype, asin, rng.choice(brands), real or [ptype["nouns"][0]], noun))
        if limit and len(raw_products) >= limit:
            break
    return raw_products
