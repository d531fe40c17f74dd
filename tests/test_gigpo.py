"""GiGPO as verl-agent computes it (advantages.gigpo_step_advantages), every expected value worked out by hand; and the
WebShop side it needs: anchor states without the instruction (shared by the start page and a revisited search page)
and the per-step invalid-action penalty in `info`."""
import math

import pytest

from envs.base import Env, Task
from envs.webshop import WebShopConfig, WebShopEnv
from advantages import gigpo_step_advantages

R2 = math.sqrt(2.0)


def two_lengths():
    """One group: episode a takes 3 steps and earns 1 at the end, episode b takes 1 step and earns 0. Both start in
    S; a then visits P and Q alone. No penalties."""
    return dict(step_rewards=[[0.0, 0.0, 1.0], [0.0]], penalties=[[0.0, 0.0, 0.0], [0.0]],
                anchors=[["S", "P", "Q"], ["S"]], group_ids=[0, 0])


def test_episode_stats_step_pools_every_step_row():
    """verl-agent's default: the pool is one score per step row, a's 1 three times and b's 0 once.
    Pool [1, 1, 1, 0]: mean 3/4, unbiased variance (3 x 1/16 + 9/16) / 3 = 1/4, std 1/2 -> a: 1/2, b: -3/2.
    Step level, anchor S: discounted returns (gamma 1/2) a 0 + 0 + 1/4 = 1/4 and b 0 -> mean 1/8, std sqrt(2)/8
    -> a 1/sqrt(2), b -1/sqrt(2); P and Q are seen once -> 0. Weight 1/2."""
    adv, credited = gigpo_step_advantages(**two_lengths(), gamma=0.5, weight=0.5, divide_std=True, eps=0.0)
    assert adv[0] == pytest.approx([0.5 + 0.5 / R2, 0.5, 0.5])
    assert adv[1] == pytest.approx([-1.5 - 0.5 / R2])
    assert credited == 2  # a's and b's step at S
    # Default episode_stats is "step".
    assert gigpo_step_advantages(**two_lengths(), gamma=0.5, weight=0.5, divide_std=True, eps=0.0)[0] == adv


def test_episode_stats_episode_pools_one_score_per_episode():
    """GiGPO Eq. 3: pool [1, 0] -> mean 1/2, std 1/sqrt(2) -> a: 1/sqrt(2), b: -1/sqrt(2) (the step level as above).
    The longer episode no longer pulls the mean towards its own return."""
    adv, credited = gigpo_step_advantages(**two_lengths(), gamma=0.5, weight=0.5, divide_std=True, eps=0.0,
                                          episode_stats="episode")
    assert adv[0] == pytest.approx([1 / R2 + 0.5 / R2, 1 / R2, 1 / R2])
    assert adv[1] == pytest.approx([-1 / R2 - 0.5 / R2])
    assert credited == 2


def test_without_std_both_modes_only_centre():
    """divide_std=False (verl-agent's mean_norm): step pool mean 3/4 -> a 1/4, b -3/4; episode pool mean 1/2 ->
    a 1/2, b -1/2; anchor S mean 1/8 -> a 1/8, b -1/8. Weight 1."""
    step, _ = gigpo_step_advantages(**two_lengths(), gamma=0.5, weight=1.0, divide_std=False)
    assert step[0] == pytest.approx([0.25 + 0.125, 0.25, 0.25]) and step[1] == pytest.approx([-0.75 - 0.125])
    episode, _ = gigpo_step_advantages(**two_lengths(), gamma=0.5, weight=1.0, divide_std=False,
                                       episode_stats="episode")
    assert episode[0] == pytest.approx([0.5 + 0.125, 0.5, 0.5]) and episode[1] == pytest.approx([-0.5 - 0.125])
    with pytest.raises(ValueError):
        gigpo_step_advantages(**two_lengths(), gamma=0.5, weight=1.0, divide_std=False, episode_stats="row")


def test_penalty_hits_its_own_row_only():
    """Episodes a and b both go S -> P and earn 1 at step 1; a's step 1 output was malformed (penalty 0.1).
    gamma 1/2, weight 1, centred only (divide_std=False).
    Episode level, rows E = R - p: a [1, 0.9], b [1, 1] -> mean 3.9 / 4 = 0.975 -> a [0.025, -0.075], b 0.025 x 2.
    Step level, S = G - p with G = [1/2, 1] for both: anchor S has a 0.5, b 0.5 -> exactly 0 (had the penalty been
    in a's reward, a's return at S would be 0.45); anchor P has a 0.9, b 1 -> a -0.05, b +0.05."""
    adv, credited = gigpo_step_advantages([[0.0, 1.0], [0.0, 1.0]], [[0.0, 0.1], [0.0, 0.0]],
                                          [["S", "P"], ["S", "P"]], ["g", "g"], gamma=0.5, weight=1.0,
                                          divide_std=False)
    assert adv[0] == pytest.approx([0.025, -0.075 - 0.05]) and adv[1] == pytest.approx([0.025, 0.025 + 0.05])
    assert credited == 2  # the two steps at P; S got no credit at all


@pytest.mark.parametrize("divide_std", [True, False])
@pytest.mark.parametrize("value", [0.1, 0.7])  # values whose float mean over three copies is not the value itself
def test_all_equal_groups_give_exactly_zero(divide_std, value):
    """Three episodes with the same returns everywhere, plus a group of one episode of one step: every advantage is
    exactly 0.0 (not 1e-11), so steps_with_anchor_credit counts nothing."""
    adv, credited = gigpo_step_advantages([[0.0, value]] * 3 + [[5.0]], [[0.0, 0.0]] * 3 + [[0.0]],
                                          [["S", "P"]] * 3 + [["S"]], [0, 0, 0, 1], gamma=1.0, weight=1.0,
                                          divide_std=divide_std)
    assert adv == [[0.0, 0.0]] * 3 + [[0.0]] and credited == 0
    for mode in ("step", "episode"):
        assert gigpo_step_advantages([[value]] * 3, [[0.0]] * 3, [["S"]] * 3, [0] * 3, gamma=0.95, weight=1.0,
                                     divide_std=divide_std, episode_stats=mode) == ([[0.0]] * 3, 0)


def test_anchor_groups_stay_inside_their_group():
    """Same anchor S in two groups: each group has one S step -> no anchor credit; episode level per group."""
    adv, credited = gigpo_step_advantages([[1.0], [0.0]], [[0.0], [0.0]], [["S"], ["S"]], [0, 1], gamma=1.0,
                                          weight=1.0, divide_std=False)
    assert adv == [[0.0], [0.0]] and credited == 0


# ----------------------------------------------------------------------------- WebShop: anchors and penalties


def act(action: str) -> str:
    return f"<think>reasoning</think>\n<action>{action}</action>"


@pytest.fixture(scope="module")
def env():
    return WebShopEnv(WebShopConfig())


def test_anchor_state_default_is_empty():
    class Bare(Env):
        def tasks(self, split):
            return []

        def reset(self, task):
            return ""

        def step(self, action):
            return "", 0.0, True, {}

    assert Bare().anchor_state() == ""


def test_webshop_anchor_drops_the_instruction_and_a_revisit_shares_it(env):
    """The start page and the search page reached again by click[back to search] are one anchor state, although the
    history-window prompts differ (the whole first prompt keyed step 0 before)."""
    first_prompt = env.reset(Task("webshop", 0))
    instruction = env.world.goals[0]["instruction_text"]
    start = env.anchor_state()
    assert start == "'Search'" and instruction not in start and instruction in first_prompt
    env.step(act(f"search[{instruction}]"))
    results = env.anchor_state()
    assert "Back to Search" in results and "Page 1 (Total results: 50)" in results and instruction not in results
    _, _, _, info = env.step(act("click[back to search]"))
    assert env.anchor_state() == start and env.window_prompt(2) != first_prompt and info["penalty"] == 0.0


def test_webshop_penalty_in_info_and_reward_unchanged(env):
    env.reset(Task("webshop", 0))
    _, reward, _, info = env.step("<action>search[hose]</action>")  # no <think>: malformed, still executed
    assert info["penalty"] == pytest.approx(0.1) and reward == pytest.approx(-0.1) and not info["well_formed"]
    _, reward, _, info = env.step(act("click[back to search]"))
    assert info["penalty"] == 0.0 and reward == 0.0


def test_webshop_revisit_gets_anchor_credit(env):
    """Two episodes of goal 0 (one group), no purchase (rewards 0). a: start -> results -> start again (3 steps);
    b: one malformed step at the start (penalty 0.1). Anchor 'Search' holds a0, a2 and b0 with step scores
    0, 0, -0.1 -> mean -1/30 -> a0, a2 +1/30, b0 -2/30; a1 (results page) alone -> 0. Episode level (step rows,
    centred): rows a 0, 0, 0 and b -0.1 -> mean -0.025 -> a +0.025, b -0.075."""
    instruction = env.world.goals[0]["instruction_text"]
    episodes = []
    for outputs in ([act(f"search[{instruction}]"), act("click[back to search]"), act("search[hose]")],
                    ["<action>search[hose]</action>"]):
        env.reset(Task("webshop", 0))
        anchors, rewards, penalties = [], [], []
        for output in outputs:
            anchors.append(env.anchor_state())
            _, reward, _, info = env.step(output)
            rewards.append(reward + info["penalty"])  # what the caller passes: the reward without the penalty
            penalties.append(info["penalty"])
        episodes.append((anchors, rewards, penalties))
    (anchors_a, rewards_a, pen_a), (anchors_b, rewards_b, pen_b) = episodes
    assert anchors_a[0] == anchors_a[2] == anchors_b[0] != anchors_a[1]
    assert rewards_a == [0.0, 0.0, 0.0] and rewards_b == [0.0] and pen_b == [pytest.approx(0.1)]
    adv, credited = gigpo_step_advantages([rewards_a, rewards_b], [pen_a, pen_b], [anchors_a, anchors_b], [0, 0],
                                          gamma=0.95, weight=1.0, divide_std=False)
    third = 0.1 / 3
    assert adv[0] == pytest.approx([0.025 + third, 0.025, 0.025 + third])
    assert adv[1] == pytest.approx([-0.075 - 2 * third])
    assert credited == 3
