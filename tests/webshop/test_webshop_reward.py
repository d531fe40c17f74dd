"""WebShop reward: every branch of docs/webshop.md §5, with hand-computed expected values."""
import pytest

from envs.webshop.reward import (
    attribute_matches,
    get_reward,
    heuristic_nouns,
    normalize_color,
    option_matches,
    title_score,
    token_set_ratio,
    type_reward,
)

BREADCRUMB = "Clothing, Shoes & Jewelry › Men › Clothing › Shirts › Dress Shirts"


def product(**overrides):
    base = {
        "asin": "B000TEST01", "Title": "Acme Cotton Dress Shirt", "BulletPoints": ["Machine wash", "Button closure"],
        "Description": "A crisp shirt for the office.", "Attributes": ["machine washable", "slim fit"],
        "price": 20.0, "query": "men's dress shirts", "product_category": BREADCRUMB, "options": {},
    }
    base.update(overrides)
    return base


def goal(**overrides):
    base = {
        "asin": "B000TEST01", "name": "Acme Cotton Dress Shirt", "query": "men's dress shirts",
        "product_category": BREADCRUMB, "attributes": ["slim fit"], "goal_options": {"color": "black"},
        "price_upper": 30.0,
    }
    base.update(overrides)
    return base


def test_fuzzy_numbers_match_thefuzz():
    # the documented values (docs/webshop.md §5) of thefuzz's token_set_ratio
    # (thefuzz rounds to an integer: 85.714 -> 86, 70.588 -> 71)
    assert token_set_ratio("large", "x-large") == 100
    assert token_set_ratio("machine wash", "machine washable") == 86
    assert token_set_ratio("long sleeve", "short sleeve") == 71
    assert token_set_ratio("Slim-Fit", "slim fit") == 100  # thefuzz's processing: case and punctuation


# ----------------------------------------------------------------------------- attributes


def test_attribute_fuzzy_match_above_85():
    assert attribute_matches(["machine wash"], product()) == 1  # 85.7 > 85 with "machine washable"


def test_attribute_substring_fallbacks():
    p = product(Attributes=["zzz"])
    assert attribute_matches(["cotton dress"], p) == 1  # title (lower-cased)
    assert attribute_matches(["button closure"], p) == 1  # joined bullet points (lower-cased)
    assert attribute_matches(["the office"], p) == 1  # description
    assert attribute_matches(["long sleeve"], p) == 0  # nowhere
    assert attribute_matches(["long sleeve"], product(Attributes=["short sleeve"])) == 0  # 70.6 is not > 85


# ----------------------------------------------------------------------------- options


def test_color_normalisation_first_listed_word():
    assert normalize_color("navy blue") == "blue"  # "blue" precedes "navy" in COLOR_SET
    assert normalize_color("black | white") == "black"
    assert normalize_color("color light blue") == "blue"
    assert normalize_color("large") == "large"


def test_option_matches_synthetic_name_value_quirk():
    # synthetic goals compare "name value": exact value -> 100; a superset value on the selected side
    # scores 83.3 ("size large" vs "x-large") -> no match
    assert option_matches({"size": "large"}, {"size": "large"}) == 1
    assert option_matches({"size": "large"}, {"size": "x-large"}) == 0
    # colour normalisation: goal "color navy blue" -> "blue", selected "light blue" -> "blue"
    assert option_matches({"color": "navy blue"}, {"color": "light blue"}) == 1
    assert option_matches({"color": "navy blue"}, {"color": "black"}) == 0
    assert option_matches({"color": "black", "size": "large"}, {}) == 0


def test_option_matches_human_bare_values():
    assert option_matches(["large"], {"size": "x-large"}) == 1  # token subset -> 100
    assert option_matches(["blue", "12 inch (pack of 1)"], {"color": "navy blue", "size": "12 inch"}) == 2


# ----------------------------------------------------------------------------- type factor


def test_heuristic_nouns():
    # Title Case: every capitalised non-function word, as spaCy tags them PROPN ("'s" is dropped)
    assert heuristic_nouns("Acme Men's Slim Fit Cotton Dress Shirt, Black, X-Large") == (
        "acme", "men", "slim", "fit", "cotton", "dress", "shirt", "black", "x", "large")
    assert heuristic_nouns("Socks Pack of 2 for All Seasons") == ("socks", "pack", "seasons")
    # lower case: adjectives, colours, adjective-like suffixes and single letters are dropped
    assert heuristic_nouns("portable waterproof adjustable 2 pack, black, 10 x 12 inches") == ("pack", "inches")
    assert heuristic_nouns("new soft") == ()


def test_title_score_values():
    assert title_score("Acme Cotton Dress Shirt", "Zeta Dress Shirt") == 0.5  # 2 of 4 goal nouns
    assert title_score("new soft", "Anything") == 0.2  # goal name without nouns


def _type(goal_name, product_name, same_query=False, same_category=False):
    g = goal(name=goal_name, query="q-goal", product_category="A › B › C")
    p = product(Title=product_name, query="q-goal" if same_query else "q-other",
                product_category="A › B › X" if same_category else "Z › Y")
    return type_reward(g, p)


ELEVEN = "Alpha Bravo Charlie Delta Echo Foxtrot Golf Hotel India Juliet Kilo"


def test_type_factor_branches():
    # title score 0.5 > 0.2 alone -> 1.0
    assert _type("Acme Cotton Dress Shirt", "Zeta Dress Shirt")["r_type"] == 1.0
    # title score 1/6 (between 0.1 and 0.2), nothing else -> 0.5
    six = "Acme Cotton Dress Shirt Collar Button"
    assert _type(six, "Zeta Button Hat")["title_score"] == pytest.approx(1 / 6)
    assert _type(six, "Zeta Button Hat")["r_type"] == 0.5
    # ... the same with a query match -> 1.0, with 2 shared breadcrumb levels -> 1.0
    assert _type(six, "Zeta Button Hat", same_query=True)["r_type"] == 1.0
    assert _type(six, "Zeta Button Hat", same_category=True)["category_match"] is True
    assert _type(six, "Zeta Button Hat", same_category=True)["r_type"] == 1.0
    # title score 1/11 < 0.1 -> 0.1 even with query and category matches
    low = _type(ELEVEN, "Kilo Thing", same_query=True, same_category=True)
    assert low["title_score"] == pytest.approx(1 / 11) and low["r_type"] == 0.1
    # title score 0 -> 0.0 even with query and category matches
    assert _type("Acme Cotton Dress Shirt", "Garden Hose", same_query=True, same_category=True)["r_type"] == 0.0
    # goal name without nouns: score 0.2 (not > 0.2) -> 0.5 unless query/category match
    assert _type("new soft", "Garden Hose")["r_type"] == 0.5
    assert _type("new soft", "Garden Hose", same_query=True)["r_type"] == 1.0


def test_category_match_needs_two_shared_levels():
    g = goal(query="x", name="Alpha Bravo Charlie Delta Echo Foxtrot")
    one_level = product(query="y", Title="Zulu Alpha", product_category="A › Q")
    assert type_reward(dict(g, product_category="A › B"), one_level)["category_match"] is False


# ----------------------------------------------------------------------------- total


def test_total_reward_perfect():
    reward, info = get_reward(product(), goal(), {"color": "black"})
    assert reward == 1.0 and info["n_att"] == 1 and info["n_opt"] == 1 and info["r_price"] == 1.0


def test_total_reward_price_over_limit():
    reward, info = get_reward(product(price=35.0), goal(), {"color": "black"})
    assert info["r_price"] == 0.0 and reward == pytest.approx(2 / 3)  # (1 + 1 + 0) / (1 + 1 + 1)


def test_total_reward_no_price_clause():
    reward, _ = get_reward(product(price=999.0), goal(price_upper=1e6), {"color": "black"})
    assert reward == 1.0


def test_total_reward_hand_computed_mix():
    # 2 goal attributes (1 matched), 2 goal options (1 matched), price ok, r_type 0.5:
    # r = 0.5 * (1 + 1 + 1) / (2 + 2 + 1) = 0.3
    g = goal(name="Acme Cotton Dress Shirt Collar Button", query="a", product_category="A › B",
             attributes=["slim fit", "long sleeve"], goal_options={"color": "black", "size": "large"})
    p = product(Title="Zeta Button Hat", query="b", product_category="Z")
    reward, info = get_reward(p, g, {"color": "black", "size": "x-large"})
    assert (info["n_att"], info["n_opt"], info["r_type"]) == (1, 1, 0.5)
    assert reward == pytest.approx(0.3)


def test_total_reward_wrong_type_is_zero():
    reward, _ = get_reward(product(Title="Garden Hose"), goal(), {"color": "black"})
    assert reward == 0.0


def test_human_goal_reward():
    reward, info = get_reward(product(), goal(goal_options=["black", "large"]), {"color": "black", "size": "x-large"})
    assert info["n_opt"] == 2 and reward == 1.0


def test_spacy_extractor_is_optional():
    from envs.webshop.reward import get_noun_extractor

    try:
        import spacy  # noqa: F401
    except ImportError:
        with pytest.raises(RuntimeError, match="heuristic"):
            get_noun_extractor("spacy")
    else:  # pragma: no cover - only where spaCy is installed
        try:
            extract = get_noun_extractor("spacy")
        except RuntimeError:
            pytest.skip("spaCy installed without an English model")
        assert "shirt" in extract("Acme Cotton Dress Shirt")
    with pytest.raises(ValueError):
        get_noun_extractor("bogus")
