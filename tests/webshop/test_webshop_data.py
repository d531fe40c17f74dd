"""WebShop data: official-schema loading, the offline generator, goals, splits, real data checks."""
import collections
import itertools
import json
import math
import os
import random
import re
from pathlib import Path

import pytest

from conftest import raw_webshop_product as raw_product
from envs.webshop import catalogue, generator, goals
from envs.webshop.config import WebShopConfig
from envs.webshop.world import build_world, load_world

# Real WebShop data (never committed): $EMPO2_WEBSHOP_DATA, else ../shared/webshop next to the checkout.
ROOT = Path(__file__).resolve().parents[2]  # the repository root (this file is tests/webshop/...)
REAL_DIR = Path(os.environ.get("EMPO2_WEBSHOP_DATA") or ROOT.parent / "shared" / "webshop")
REAL_ATTRIBUTES = REAL_DIR / "items_ins_v2_1000.json"


# ----------------------------------------------------------------------------- loading (docs/webshop.md §6.1)


def test_parse_and_format_price():
    assert catalogue.parse_pricing("$12.99") == [12.99]
    assert catalogue.parse_pricing("$1,299.00 - $1,499.50") == [1299.0, 1499.5]
    assert catalogue.parse_pricing("") == [100.0] and catalogue.parse_pricing(None) == [100.0]  # missing
    assert catalogue.format_price([9.0]) == "$9.0"
    assert catalogue.format_price([19.99, 24.99]) == "$19.99 to $24.99"
    assert catalogue.format_price([]) == "$100.0"


def test_process_products_rules():
    raw = [
        raw_product("nan"), raw_product("B0TOOLONG123"), raw_product("B000000001"),
        raw_product("B000000001", name="duplicate"),
        raw_product("B000000002", pricing="$5.00 - $7.00", customization_options={
            "Color": [{"value": "Black/White", "image": None}, {"value": "Red"}], "Style": None, "Size": []}),
        raw_product("B000000003", pricing="", query="  Mixed Case Query "),
    ]
    attributes = {"B000000001": {"attributes": ["usb 3.0"]}, "B000000002": {"attributes": []}}
    products = catalogue.process_products(raw, attributes, seed=0)
    assert [p["asin"] for p in products] == ["B000000001", "B000000002", "B000000003"]
    first, ranged, unpriced = products
    assert first["Title"] == "Widget B000000001" and first["Attributes"] == ["usb 3.0"]
    assert first["MainImage"] == "http://img/1.jpg" and first["BulletPoints"] == ["a bullet"]
    assert ranged["options"] == {"color": ["black | white", "red"], "size": []}  # "/" -> " | ", null groups dropped
    assert 5.0 <= ranged["price"] <= 7.0 and ranged["price_text"] == "$5.0 to $7.0"
    assert ranged["Attributes"] == [] and unpriced["Attributes"] == [catalogue.DUMMY_ATTRIBUTE]
    assert unpriced["price"] == 100.0 and unpriced["price_text"] == "$100.0"
    assert unpriced["query"] == "mixed case query"
    again = catalogue.process_products(raw, attributes, seed=0)
    assert again[1]["price"] == ranged["price"]  # one fixed, seeded price per load
    # limit cuts the raw list before bad/repeated ASINs are skipped (WebShop's num_products)
    assert [p["asin"] for p in catalogue.process_products(raw, attributes, limit=4)] == ["B000000001"]
    assert len(catalogue.process_products(raw, attributes, limit=5)) == 2


# ----------------------------------------------------------------------------- goals (docs/webshop.md §4)


def test_price_clause_branches():
    rng = random.Random(0)
    seen = {goals.price_clause(12.5, rng)[1] for _ in range(200)}
    assert seen == {30.0, 40.0, 50.0}  # max of 2 drawn from [20, 30, 40, 50]
    assert goals.price_clause(975.0, rng) == (", and price lower than 990.00 dollars", 990.0)
    assert goals.price_clause(985.0, rng) == ("", goals.NO_PRICE_LIMIT)


def _toy_products():
    raw = [raw_product("B000000001", customization_options={"Size": [{"value": "S"}, {"value": "M"}],
                                                             "Color": [{"value": "Red"}, {"value": "Blue"},
                                                                       {"value": "Green"}]}),
           raw_product("B000000002"), raw_product("B000000003")]
    attributes = {
        "B000000001": {"attributes": ["a1", "a2"], "instruction": "Find me widgets", "instruction_attributes": ["a1"]},
        "B000000002": {"attributes": ["a2"], "instruction": "Find me other widgets",
                       "instruction_attributes": ["a1", "a2"]},
        "B000000003": {"attributes": ["a3"]},
    }
    return catalogue.process_products(raw, attributes), attributes


def test_synthetic_goals_recipe():
    products, attributes = _toy_products()
    built = goals.build_synthetic_goals(products, attributes)
    assert len(built) == 3 * 2 + 1  # option combinations of product 1 + one goal for the option-less product 2
    texts = {g["instruction_text"].split(", and price")[0] for g in built}
    assert "Find me widgets with color: red, and size: s" in texts  # option names sorted
    assert "Find me other widgets" in texts
    for g in built:
        assert g["price_upper"] > 10.0 and g["instruction_text"].endswith(f"{g['price_upper']:.2f} dollars")
    # weights: a1 is used by 7 goals, a2 by 1 -> product-2 goal weight = (1/7 + 1/1) / 2
    other = next(g for g in built if g["asin"] == "B000000002")
    assert other["weight"] == pytest.approx((1 / 7 + 1) / 2)
    # deterministic: the same seed (233) gives the same order, another seed another order
    again = goals.build_synthetic_goals(products, attributes, seed=233)
    assert [g["instruction_text"] for g in again] == [g["instruction_text"] for g in built]
    assert goals.build_synthetic_goals(products, attributes, seed=1) != built or len(built) < 3


def test_shuffle_is_python_random_seed_233():
    assert goals.WEBSHOP_GOAL_SHUFFLE_SEED == 233  # fixed (no config key): goal i is WebShop's goal i
    items = list(range(50))
    random.seed(233)
    random.shuffle(items)
    expected = items
    shuffled = list(range(50))
    random.Random(233).shuffle(shuffled)
    assert shuffled == expected


def test_human_goals():
    products, _ = _toy_products()
    human = {"B000000001": [
        {"instruction": "i need a red widget.", "instruction_attributes": ["a1"], "instruction_options": ["red"]},
        {"instruction": "no labels", "instruction_attributes": []}],
        "B0NOTINCAT": [{"instruction": "x", "instruction_attributes": ["y"]}]}
    built = goals.build_human_goals(products, human)
    assert len(built) == 1
    assert built[0]["instruction_text"].startswith("i need a red widget, and price lower than")
    assert built[0]["goal_options"] == ["red"]


def test_splits():
    assert goals.split_indices(700, "test") == range(0, 500)
    assert goals.split_indices(700, "train") == range(500, 700)
    assert goals.split_indices(300, "train") == range(300, 300)
    with pytest.raises(ValueError):
        goals.split_indices(10, "dev")


# ----------------------------------------------------------------------------- generator (docs/webshop.md §6.2-6.4)


def test_generator_is_deterministic_and_in_official_schema():
    raw_a, attrs_a = generator.generate_catalogue(seed=3, num_products=200)
    raw_b, attrs_b = generator.generate_catalogue(seed=3, num_products=200)
    raw_c, _ = generator.generate_catalogue(seed=4, num_products=200)
    assert json.dumps(raw_a) == json.dumps(raw_b) and attrs_a == attrs_b
    assert json.dumps(raw_a) != json.dumps(raw_c)
    assert len(raw_a) == 200 and set(attrs_a) == {p["asin"] for p in raw_a}
    required = {"asin", "name", "full_description", "small_description", "pricing", "product_category", "category",
                "query", "customization_options", "images"}
    assert all(required <= set(p) for p in raw_a)
    pricing = collections.Counter("range" if p["pricing"].count("$") == 2 else "none" if not p["pricing"] else "single"
                                  for p in raw_a)
    assert pricing["range"] > 10 and pricing["single"] > 100
    instructed = [a for a in attrs_a.values() if "instruction" in a]
    assert 0.25 < len(instructed) / 200 < 0.6
    for entry in instructed:
        assert entry["instruction"].startswith("Find me ") and set(entry["instruction_attributes"]) <= set(
            entry["attributes"])
    assert len({p["category"] for p in raw_a}) == 6 and len({p["query"] for p in raw_a}) > 30


def test_product_type_file_is_validated(tmp_path):
    types = generator.parse_product_types()
    assert len(types) == 38 and types[0]["breadcrumb"].startswith("Clothing, Shoes & Jewelry › Men")
    text = generator.PRODUCT_TYPES_FILE.read_text()
    broken = {
        "price: [15, 60]": ("price: [60, 15]", "product type #1 (\"men's dress shirts\"), field 'price'"),
        "palette: shoe_size,": ("palette: shoe_sizes,", "field 'options'[1]: palette 'shoe_sizes'"),
        'shoe_size: ["6", "6.5"': ('shoe_size: ["6", 6.5', "palette 'shoe_size'[1]: expected a non-empty string"),
        "for: [daily wear, business, wedding]": ("for: [slim fit]", "field 'for': attribute 'slim fit' is also in"),
    }
    for index, (old, (new, message)) in enumerate(broken.items()):
        path = tmp_path / f"types_{index}.yaml"
        path.write_text(text.replace(old, new, 1))
        with pytest.raises(generator.ProductTypeError, match=re.escape(message)):
            generator.parse_product_types(path)


def test_default_world_goals_are_deterministic():
    world = load_world(WebShopConfig())
    assert world.source == "generated" and len(world.products) == 1000 and len(world.goals) > 2000
    rebuilt = build_world(WebShopConfig())
    assert [g["instruction_text"] for g in rebuilt.goals] == [g["instruction_text"] for g in world.goals]
    assert load_world(WebShopConfig()) is world  # cached per process
    other = build_world(WebShopConfig(catalogue_seed=1, num_products=300))
    assert other.goals[0]["instruction_text"] != world.goals[0]["instruction_text"]
    by_asin = world.by_asin
    for goal in world.goals[:300]:  # goal product satisfies its own goal
        product = by_asin[goal["asin"]]
        assert product["price"] <= goal["price_upper"]
        assert all(product["options"][k] and v in product["options"][k] for k, v in goal["goal_options"].items())


def test_world_from_official_files(tmp_path):
    products, attributes = _toy_products()
    raw = [raw_product("B000000001", customization_options={"Size": [{"value": "S"}, {"value": "M"}]}),
           raw_product("B000000002"), raw_product("B000000003")]
    (tmp_path / "items_shuffle_1000.json").write_text(json.dumps(raw))
    (tmp_path / "items_ins_v2_1000.json").write_text(json.dumps(attributes))
    world = build_world(WebShopConfig(data_dir=str(tmp_path)))
    assert world.source == "official" and len(world.goals) == 3
    with pytest.raises(FileNotFoundError):
        build_world(WebShopConfig(data_dir=str(tmp_path), goal_source="human"))
    human = {"B000000003": [{"instruction": "want widget", "instruction_attributes": ["a3"],
                             "instruction_options": []}]}
    (tmp_path / "items_human_ins.json").write_text(json.dumps(human))
    human_world = build_world(WebShopConfig(data_dir=str(tmp_path), goal_source="human"))
    assert len(human_world.goals) == 1 and human_world.goals[0]["asin"] == "B000000003"
    with pytest.raises(FileNotFoundError):
        build_world(WebShopConfig(data_dir=str(tmp_path / "missing")))
    with pytest.raises(ValueError):
        build_world(WebShopConfig(reward_mode="bogus"))


def test_download_helper_prints_commands(capsys):
    assert catalogue.download("some/dir", print_only=True) == []
    out = capsys.readouterr().out
    for name in ("items_shuffle_1000.json", "items_ins_v2_1000.json", "items_human_ins.json"):
        assert f"some/dir/{name}" in out
    assert catalogue.main(["download", "--dest", "x", "--print-only"]) == 0


# ----------------------------------------------------------------------------- real data (skips when absent)

needs_real = pytest.mark.skipif(not REAL_ATTRIBUTES.is_file(), reason=f"{REAL_ATTRIBUTES} not available")


@needs_real
def test_real_attribute_file_loads():
    attributes = catalogue.load_attributes(REAL_ATTRIBUTES)
    assert len(attributes) == 1000
    instructed = {a: e for a, e in attributes.items() if "instruction" in e}
    assert len(instructed) == 415
    assert sum(1 for e in attributes.values() if not e["attributes"]) == 185
    assert all(e["instruction"].startswith("Find me") and set(e["instruction_attributes"]) <= set(e["attributes"])
               for e in instructed.values())
    assert generator.query_from_instruction(
        "Find me easy carry, high quality refillable containers with rose gold",
        ["easy carry", "high quality", "rose gold"]) == "refillable containers"


@needs_real
def test_goal_builder_on_real_instructions(tmp_path):
    (tmp_path / "items_ins_v2_1000.json").write_bytes(REAL_ATTRIBUTES.read_bytes())
    world = build_world(WebShopConfig(data_dir=str(tmp_path)))
    assert world.source == "hybrid" and len(world.products) == 1000
    attributes = catalogue.load_attributes(REAL_ATTRIBUTES)
    expected = sum(math.prod(len(v) for v in world.by_asin[a]["options"].values())
                   for a, e in attributes.items() if "instruction" in e)
    assert len(world.goals) == expected
    for goal in world.goals:
        entry = attributes[goal["asin"]]
        assert goal["instruction_text"].startswith(entry["instruction"])
        assert goal["attributes"] == entry["instruction_attributes"]
        assert world.by_asin[goal["asin"]]["Attributes"] == entry["attributes"]
    assert {g["asin"] for g in world.goals} == {a for a, e in attributes.items() if "instruction" in e}
    again = build_world(WebShopConfig(data_dir=str(tmp_path)))
    assert [g["instruction_text"] for g in again.goals[:500]] == [g["instruction_text"] for g in world.goals[:500]]
    combos = list(itertools.islice((g for g in world.goals if len(g["goal_options"]) == 2), 1))
    assert not combos or ", and " in combos[0]["instruction_text"]
