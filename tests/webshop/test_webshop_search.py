"""WebShop BM25 search: analysis, hand-computed scores, ranking sanity, latency."""
import math
import statistics
import time

import pytest

from envs.webshop.config import WebShopConfig
from envs.webshop.search import BM25Index, analyze, document_text, option_text
from envs.webshop.world import load_world


def doc(asin, title, description="", bullets=(), options=None):
    return {"asin": asin, "Title": title, "Description": description, "BulletPoints": list(bullets),
            "options": options or {}}


def test_analyze_like_lucene_english():
    assert analyze("The Running Shoes for Men's Walking") == ["run", "shoe", "men", "walk"]
    assert analyze("USB 3.0 x-large, 3.4 fl oz") == ["usb", "3.0", "x", "larg", "3.4", "fl", "oz"]
    assert analyze("<script>alert(1)</script>") == ["script", "alert", "1", "script"]
    assert analyze("") == []


def test_document_text_recipe():
    product = doc("B1", "Acme Shirt", "Desc", ["first bullet", "second bullet"],
                  {"color": ["black", "navy blue"], "size": ["medium", "large"]})
    assert option_text(product["options"]) == "color: black, navy blue, and size: medium, large"
    assert document_text(product) == "acme shirt desc first bullet color: black, navy blue, and size: medium, large"


def test_bm25_scores_hand_computed():
    products = [doc("A", "red shoe"), doc("B", "blue shoe shoe shoe"), doc("C", "green hat")]
    index = BM25Index(products, k1=0.9, b=0.4)
    lengths = [2, 4, 2]
    avgdl = sum(lengths) / 3

    def term(tf, df, dl):
        idf = math.log(1 + (3 - df + 0.5) / (df + 0.5))
        return idf * tf / (tf + 0.9 * (1 - 0.4 + 0.4 * dl / avgdl))

    scores = index.scores("red shoe")
    assert scores[0] == pytest.approx(term(1, 1, 2) + term(1, 2, 2))
    assert scores[1] == pytest.approx(term(3, 2, 4))
    assert scores[2] == 0
    assert index.search("red shoe") == ["A", "B"]  # C matches nothing and is not returned
    assert index.search("shoe shoe") == ["B", "A"]  # repeated query terms weigh double
    assert index.search("nothing here") == []


def test_ties_keep_catalogue_order_and_top_50():
    products = [doc(f"P{i:03d}", "same words") for i in range(80)]
    index = BM25Index(products)
    hits = index.search("same")
    assert len(hits) == 50 and hits == [f"P{i:03d}" for i in range(50)]


@pytest.fixture(scope="module")
def world():
    return load_world(WebShopConfig())


def test_goal_product_in_top_10_for_its_own_title(world):
    asins = sorted({g["asin"] for g in world.goals})
    misses = [a for a in asins if a not in world.index.search(world.by_asin[a]["Title"])[:10]]
    assert not misses, f"{len(misses)} of {len(asins)} goal products not in the top 10 of their own title"


def test_goal_product_usually_found_from_the_instruction(world):
    test_goals = world.goals[:500]
    found = sum(g["asin"] in world.index.search(g["instruction_text"])[:10] for g in test_goals)
    assert found / len(test_goals) > 0.6


def test_search_latency_under_5ms(world):
    queries = [g["instruction_text"] for g in world.goals[:200]]
    times = []
    for query in queries:
        start = time.perf_counter()
        world.index.search(query)
        times.append(time.perf_counter() - start)
    assert statistics.median(times) < 0.005
