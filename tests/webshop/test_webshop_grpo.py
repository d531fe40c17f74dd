"""WebShop trains verl-agent's GRPO (the code base of the paper's Table 2): every step row of a group scores its
episode's return minus its OWN invalid-action penalty, normalised over the group's step rows. The WebShop configs
reach it through the GiGPO path without the step level; ScienceWorld keeps one score per episode (the EMPO²
reference). The expected values are worked out by hand or by verl-agent's estimator written out below in plain
Python, with no project code."""
import random
import statistics
from pathlib import Path

import pytest

from advantages import gigpo_step_advantages
from config import load_config

CONFIG_DIR = Path(__file__).resolve().parents[2] / "configs"
WEBSHOP = sorted(CONFIG_DIR.glob("webshop_*.yaml"))
OTHERS = sorted(set(CONFIG_DIR.glob("*.yaml")) - set(WEBSHOP))
EPS = 1e-6  # verl's GRPO epsilon


def verl_agent_grpo(episodes: list[dict]) -> list[list[float]]:
    """verl-agent's GRPO over step rows, written out from its description: an episode's env rewards are summed
    (penalty-free), `apply_invalid_action_penalty` subtracts a row's penalty from that row's score only, and
    every row is normalised with the mean and unbiased std of all step rows sharing its group index."""
    scores = [[sum(ep["raw"]) - p for p in ep["penalties"]] for ep in episodes]
    pools: dict = {}
    for ep, rows in zip(episodes, scores):
        pools.setdefault(ep["group"], []).extend(rows)
    stats = {g: (statistics.mean(rows), statistics.stdev(rows)) for g, rows in pools.items()}
    return [[(x - stats[ep["group"]][0]) / (stats[ep["group"]][1] + EPS) for x in rows]
            for ep, rows in zip(episodes, scores)]


def trained_advantages(episodes: list[dict], cfg) -> list[list[float]]:
    """What train.py computes from the rollout's records: rewards as the environment returned them (penalty already
    subtracted), the penalty per step, the GiGPO settings of `cfg.loss`."""
    recorded = [[r - p for r, p in zip(ep["raw"], ep["penalties"])] for ep in episodes]
    advantages, _ = gigpo_step_advantages(
        [[r + p for r, p in zip(rewards, ep["penalties"])] for rewards, ep in zip(recorded, episodes)],
        [ep["penalties"] for ep in episodes], [ep["anchors"] for ep in episodes], [ep["group"] for ep in episodes],
        gamma=cfg.loss.gigpo_gamma, weight=cfg.loss.gigpo_weight, divide_std=cfg.loss.gigpo_divide_std,
        episode_stats=cfg.loss.gigpo_episode_stats)
    return advantages


def episode(raw, penalties, group=0, anchors=None) -> dict:
    return dict(raw=raw, penalties=penalties, group=group, anchors=anchors or ["Search"] * len(raw))


@pytest.mark.parametrize("path", WEBSHOP, ids=lambda p: p.name)
def test_every_webshop_config_trains_verl_agents_grpo(path):
    loss = load_config(str(path)).loss
    assert (loss.advantage, loss.gigpo_weight, loss.gigpo_episode_stats, loss.gigpo_divide_std) == (
        "gigpo", 0.0, "step", True)


@pytest.mark.parametrize("path", OTHERS, ids=lambda p: p.name)
def test_scienceworld_and_sanity_configs_keep_one_score_per_episode(path):
    assert load_config(str(path)).loss.advantage == "grpo"


def test_a_penalised_row_is_charged_alone_and_rows_are_pooled():
    """Penalty 1 for round numbers. Episode a: search (malformed, penalty 1), buy a perfect match (10): rows
    10 - 1 = 9 and 10. Episode b: two steps, no purchase: rows 0, 0. Pool [9, 10, 0, 0]: mean 4.75, deviations
    4.25, 5.25, -4.75, -4.75, unbiased variance 90.75 / 3 = 30.25, std 5.5."""
    group = [episode([0.0, 10.0], [1.0, 0.0]), episode([0.0, 0.0], [0.0, 0.0])]
    expected = [[4.25 / (5.5 + EPS), 5.25 / (5.5 + EPS)], [-4.75 / (5.5 + EPS)] * 2]
    cfg = load_config(str(CONFIG_DIR / "webshop_grpo.yaml"))
    got = trained_advantages(group, cfg)
    for row, want in zip(got, expected):
        assert row == pytest.approx(want, rel=1e-12)
    assert [x for row in verl_agent_grpo(group) for x in row] == pytest.approx([x for r in expected for x in r])


def test_random_groups_equal_verl_agent_and_each_group_is_pooled_on_its_own():
    """Random WebShop-like groups (1-15 steps, 10 for a perfect purchase at the last step, penalty 0.1 on about a
    quarter of the steps, anchors that repeat so a step level would matter) against verl_agent_grpo; then a change
    to one group leaves every other group's advantages exactly as they were."""
    rng = random.Random(0)
    pages = ["Search", "Results", "Item", "Options"]
    episodes = []
    for group in range(5):
        for _ in range(rng.randint(2, 8)):
            steps = rng.randint(1, 15)
            raw = [0.0] * (steps - 1) + [rng.choice([0.0, 10.0])]
            penalties = [0.1 if rng.random() < 0.25 else 0.0 for _ in range(steps)]
            episodes.append(episode(raw, penalties, group, [rng.choice(pages) for _ in range(steps)]))
    cfg = load_config(str(CONFIG_DIR / "webshop_empo2.yaml"))
    got = trained_advantages(episodes, cfg)
    want = verl_agent_grpo(episodes)
    for row, ref in zip(got, want):
        assert row == pytest.approx(ref, rel=1e-9, abs=1e-12)
    assert any(len(set(row)) > 1 for row in got)  # some episode has a penalised and an unpenalised row

    changed = [dict(ep) for ep in episodes]
    first = next(i for i, ep in enumerate(changed) if ep["group"] == 2)
    changed[first] = episode([0.0, 0.0, 10.0], [0.1, 0.0, 0.0], 2)
    again = trained_advantages(changed, cfg)
    for ep, before, after in zip(changed, got, again):
        if ep["group"] != 2:
            assert after == before
    assert [x for ep, row in zip(changed, again) if ep["group"] == 2 for x in row] != [
        x for ep, row in zip(episodes, got) if ep["group"] == 2 for x in row]
