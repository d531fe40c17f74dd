"""Product catalogue: the official WebShop file formats, product processing, the download helper.

Maps to docs/webshop.md:
  §6.1  file schemas: `items_shuffle*.json` (list of raw Amazon products), `items_ins_v2*.json`
        (asin -> attributes [+ instruction, instruction_attributes]), `items_human_ins.json`;
        product loading: which raw fields are kept and how they are normalised (`process_products`,
        WebShop's `engine.load_products`): the pricing string split on "$" (`parse_pricing`),
        option values kept with their duplicates and empty groups (`_process_options`);
        one fixed price per load (single price, uniform(low, high) for a range, 100.0 if missing).
  §6.2  offline default: `generator.py` writes a catalogue in the same raw schema; it goes through
        the same `process_products`.

Deviations (deliberate, documented):
  * The per-load price sampling uses `random.Random(seed)` instead of the unseeded global RNG, so
    a catalogue (and therefore every goal's price clause) is reproducible.
  * Malformed input the original crashes on (a pricing string without a number, an option entry
    without a "value") is tolerated: the price counts as missing, the entry is skipped.
  * Loading the full 5.5 GB `items_shuffle.json` with `json.load` needs tens of GB of memory; the
    project targets the 1000-product setting (`num_products` keeps the first N products).

Command line:  python -m envs.webshop.catalogue download --dest DIR [--print-only]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
import re
import sys
import urllib.request
from pathlib import Path

PRODUCT_FILES = ("items_shuffle_1000.json", "items_shuffle.json")
ATTRIBUTE_FILES = ("items_ins_v2_1000.json", "items_ins_v2.json")
HUMAN_GOAL_FILE = "items_human_ins.json"
MISSING_PRICE = 100.0
DUMMY_ATTRIBUTE = "DUMMY_ATTR"

_AGENTGYM = "https://raw.githubusercontent.com/WooooDyy/AgentGym/3ef9235d23e68e7c2920c5422ad957dc8ced5c6c/agentenv-webshop/webshop/data"
_WEBSHOP = "https://raw.githubusercontent.com/princeton-nlp/WebShop/64fa2a5c15c7daa698b9ac93f5bb5437b634c9bd/baseline_models/data"
# file name -> (url, expected size in bytes or None, expected sha256 or None); size and hash are
# those of the published files at these commits. The originals are also fetched by WebShop's `setup.sh -d small`
# (gdown from Google Drive, e.g. id 1IduG0xl544V_A_jv3tHXC0kyFi7PnyBu for items_ins_v2_1000.json).
OFFICIAL_SOURCES = {
    "items_shuffle_1000.json": (f"{_AGENTGYM}/items_shuffle_1000.json", 4_467_013, None),
    "items_ins_v2_1000.json": (
        f"{_AGENTGYM}/items_ins_v2_1000.json",
        147_099,
        "f88a36314a397b53b3d9c3fa5878e5f7b26d35019a51ec83fbedeca61a948f6f",
    ),
    "items_human_ins.json": (f"{_WEBSHOP}/items_human_ins.json", None, None),
}


# ----------------------------------------------------------------------------- raw -> processed


def parse_pricing(pricing) -> list[float]:
    """The original's `pricing` list (docs/webshop.md §6.1): split on "$", keep digits and dots.

    WebShop splits the string on "$", drops the text before the first "$", strips every character
    that is not a digit or a dot from each piece and keeps the first two numbers, so
    "$19.99$27.99" (the scraped file's range format) and "$19.99 - $27.99" both give
    [19.99, 27.99], "$1,299.00" gives [1299.0]. A missing price (None / "") gives [100.0].
    Deviation: where the original raises (no "$" at all, a piece with no number such as "$" or
    "1.2.3"), such pieces are skipped and a string with no usable number counts as missing.
    """
    if not isinstance(pricing, str) or not pricing:
        return [MISSING_PRICE]
    prices = []
    for piece in pricing.split("$")[1:]:
        digits = re.sub(r"[^\d.]", "", piece)
        try:
            prices.append(float(digits))
        except ValueError:
            continue
    return prices[:2] or [MISSING_PRICE]


def format_price(prices: list[float]) -> str:
    """Display text (docs/webshop.md §2.3): '$X' for one price, '$X to $Y' for a range, '$100.0' if missing."""
    if not prices:
        return f"${MISSING_PRICE}"
    if len(prices) == 1:
        return f"${prices[0]}"
    return f"${prices[0]} to ${prices[1]}"


def sample_price(prices: list[float], rng: random.Random) -> float:
    """The one price per load the reward uses: the single price, uniform(low, high) for a range."""
    if not prices:
        return MISSING_PRICE
    if len(prices) == 1:
        return prices[0]
    return rng.uniform(prices[0], prices[1])


def _process_options(raw) -> dict[str, list[str]]:
    """`customization_options` -> {lower(name): [values]} exactly as WebShop loads them.

    A group whose value list is null is skipped; an empty list is kept as an empty group (it shows
    its name on the item page and, as in the original, gives the product no synthetic goal).
    Values are stripped, "/" becomes " | ", then lower-cased; duplicates are kept (they make
    duplicate goals in the original too). Deviation: entries without a string "value" are skipped
    (the original raises on them).
    """
    options: dict[str, list[str]] = {}
    if not raw or not isinstance(raw, dict):
        return options
    for name, values in raw.items():
        if values is None:
            continue
        cleaned = []
        for entry in values if isinstance(values, list) else []:
            value = entry.get("value") if isinstance(entry, dict) else None
            if isinstance(value, str):
                cleaned.append(value.strip().replace("/", " | ").lower())
        options[str(name).lower()] = cleaned
    return options


def process_products(raw_products: list[dict], attributes: dict | None, seed: int = 0,
                     limit: int = 0) -> list[dict]:
    """Turn raw product dicts (official schema) into the engine's product records (docs/webshop.md §6.1).

    `limit` keeps the first `limit` raw products (0 = all), as WebShop's `num_products` does.
    Returns a list in file order (the search index and ties follow this order). Each record:
    asin, Title, Description, BulletPoints, Price (list), price_text, price (the sampled value the
    reward uses), options {name: [values]}, MainImage, category, query, product_category,
    Attributes, Reviews (always empty, as in the released WebShop).
    """
    rng = random.Random(seed)
    attributes = attributes or {}
    seen: set[str] = set()
    products: list[dict] = []
    # WebShop cuts the raw list to `num_products` before skipping bad or repeated ASINs
    for raw in raw_products[:limit] if limit else raw_products:
        asin = raw.get("asin")
        if not isinstance(asin, str) or asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        prices = parse_pricing(raw.get("pricing"))
        price = sample_price(prices, rng)
        bullets = raw.get("small_description") or []
        if isinstance(bullets, str):
            bullets = [bullets]
        images = raw.get("images") or []
        entry = attributes.get(asin)
        products.append({
            "asin": asin,
            "Title": str(raw.get("name") or ""),
            "Description": str(raw.get("full_description") or ""),
            "BulletPoints": [str(b) for b in bullets],
            "Price": prices,
            "price_text": format_price(prices),
            "price": price,
            "options": _process_options(raw.get("customization_options")),
            "MainImage": images[0] if images else "",
            "category": str(raw.get("category") or ""),
            "query": str(raw.get("query") or "").lower().strip(),
            "product_category": str(raw.get("product_category") or ""),
            "Attributes": list(entry["attributes"]) if entry is not None else [DUMMY_ATTRIBUTE],
            "Reviews": [],
        })
    return products


# ----------------------------------------------------------------------------- files


def find_file(data_dir: str | Path, names: tuple[str, ...]) -> Path | None:
    for name in names:
        path = Path(data_dir) / name
        if path.is_file():
            return path
    return None


def load_json(path: str | Path):
    with open(path, encoding="utf-8") as handle:
        return json.load(handle)


def load_attributes(path: str | Path) -> dict:
    """`items_ins_v2*.json`: asin -> {attributes, [instruction, instruction_attributes]}."""
    data = load_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object keyed by ASIN")
    return data


def load_human_instructions(path: str | Path) -> dict:
    """`items_human_ins.json`: asin -> list of labelled human instructions."""
    data = load_json(path)
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a JSON object keyed by ASIN")
    return data


# ----------------------------------------------------------------------------- download helper


def download_commands(dest: str = "data/webshop") -> list[str]:
    """Shell commands that fetch the official 1000-product files (for users with internet)."""
    lines = [f"mkdir -p {dest}"]
    for name, (url, _, _) in OFFICIAL_SOURCES.items():
        lines.append(f"curl -L -o {dest}/{name} {url}")
    return lines


def download(dest: str | Path, print_only: bool = False) -> list[Path]:
    """Fetch the official files into `dest` and check their sizes / hashes where known.

    Sources: WebShop's own `setup.sh -d small` (Google Drive via gdown) is the original route; the
    same files are committed in the public repositories used here (AgentGym for the 1000-product
    files, princeton-nlp/WebShop for the human instructions). Then run with
    `--env.webshop.data_dir=<dest>`.
    """
    if print_only:
        print("\n".join(download_commands(str(dest))))
        return []
    dest = Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    for name, (url, size, sha256) in OFFICIAL_SOURCES.items():
        target = dest / name
        print(f"downloading {url} -> {target}")
        with urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310 (fixed https URLs)
            data = response.read()
        if size is not None and len(data) != size:
            raise ValueError(f"{name}: got {len(data)} bytes, expected {size}")
        if sha256 is not None and hashlib.sha256(data).hexdigest() != sha256:
            raise ValueError(f"{name}: sha256 mismatch")
        target.write_bytes(data)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    get = sub.add_parser("download", help="fetch the official 1000-product WebShop files")
    get.add_argument("--dest", default="data/webshop")
    get.add_argument("--print-only", action="store_true", help="print the commands, fetch nothing")
    args = parser.parse_args(argv)
    download(args.dest, print_only=args.print_only)
    return 0


if __name__ == "__main__":
    sys.exit(main())
