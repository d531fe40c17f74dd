"""Product catalogue: the official WebShop file formats, product processing, the download helper.

Maps to docs/webshop.md:
  §6.1  file schemas: `items_shuffle*.json` (list of raw Amazon products), `items_ins_v2*.json`
        (asin -> attributes [+ instruction, instruction_attributes]), `items_human_ins.json`;
        product loading: which raw fields are kept and how they are normalised (`process_products`);
        one fixed price per load (single price, uniform(low, high) for a range, 100.0 if missing).
  §6.2  offline default: `generator.py` writes a catalogue in the same raw schema; it goes through
        the same `process_products`.

Deviations (deliberate, documented):
  * The per-load price sampling uses `random.Random(seed)` instead of the unseeded global RNG, so
    a catalogue (and therefore every goal's price clause) is reproducible.
  * Option groups whose value list is null/empty are dropped (they offer nothing to click).
  * Loading the full 5.5 GB `items_shuffle.json` with `json.load` needs tens of GB of memory; the
    project targets the 1000-product setting (`num_products` keeps the first N products).

Command line:  python -m envs.webshop.catalogue download --dest DIR [--print-only]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import random
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
    """'$12.99' -> [12.99]; '$1,299.00 - $1,499.00' -> [1299.0, 1499.0]; '' / junk -> []."""
    if not isinstance(pricing, str) or not pricing.strip():
        return []
    prices = []
    for part in pricing.split("-")[:2]:
        text = part.strip().lstrip("$").replace(",", "").strip()
        try:
            prices.append(float(text))
        except ValueError:
            return []
    return prices


def format_price(prices: list[float]) -> str:
    """Display text (docs/webshop.md §2.3): '$X' for one price, '$X to $Y' for a range, '$100.0' if missing."""
    if not prices:
        return f"${MISSING_PRICE}"
    if len(prices) == 1:
        return f"${prices[0]}"
    return f"${prices[0]} to ${prices[1]}"


def _process_options(raw) -> dict[str, list[str]]:
    options: dict[str, list[str]] = {}
    if not isinstance(raw, dict):
        return options
    for name, values in raw.items():
        if not values:
            continue
        cleaned = []
        for entry in values:
            value = entry.get("value") if isinstance(entry, dict) else entry
            if value is None:
                continue
            value = str(value).lower().replace("/", " | ").strip()
            if value and value not in cleaned:
                cleaned.append(value)
        if cleaned:
            options[str(name).lower().strip()] = cleaned
    return options


def process_products(raw_products: list[dict], attributes: dict | None, seed: int = 0,
                     limit: int = 0) -> list[dict]:
    """Turn raw product dicts (official schema) into the engine's product records (docs/webshop.md §6.1).

    Returns a list in file order (the search index and ties follow this order). Each record:
    asin, Title, Description, BulletPoints, Price (list), price_text, price (the sampled value the
    reward uses), options {name: [values]}, MainImage, category, query, product_category,
    Attributes, Reviews (always empty, as in the released WebShop).
    """
    rng = random.Random(seed)
    attributes = attributes or {}
    seen: set[str] = set()
    products: list[dict] = []
    for raw in raw_products:
        asin = raw.get("asin")
        if not isinstance(asin, str) or asin == "nan" or len(asin) > 10 or asin in seen:
            continue
        seen.add(asin)
        prices = parse_pricing(raw.get("pricing"))
        if not prices:
            price = MISSING_PRICE
        elif len(prices) == 1:
            price = prices[0]
        else:
            price = rng.uniform(prices[0], prices[1])
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
        if limit and len(products) >= limit:
            break
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
