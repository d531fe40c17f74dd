"""Table 3 (samples.contexts) and the samples built from it, on hand-built episodes of every layout.

Token ids are chosen so that what a context holds is a set check: prompt text 10-49, tip blocks 90-99, actions
60-79. A context "sees tips" iff it holds an id in 90-99. No model: these are the bookkeeping rules, checked against
the paper's table written out below, independently of samples.py's own code."""
import pytest

from envs.base import Task
from rollout import Episode
from samples import Context, build_samples, contexts

TIPS = set(range(90, 100))
ACTIONS = [[60, 61], [62], [63, 64, 65]]  # three steps
LOGPS = [[-0.1, -0.2], [-0.3], [-0.4, -0.5, -0.6]]  # recorded while sampling, one per action token


def episode(layout: str, mode: str) -> Episode:
    """Three steps played as rollout.run_episodes records them: each prompt delta with its tip block (memory modes)
    and its tip-free twin, then the action and its recorded log-probs."""
    ep = Episode(task=Task("t", 0), group=0, mode=mode, layout=layout)
    for t, (action, logp) in enumerate(zip(ACTIONS, LOGPS)):
        text = [10 + t, 20 + t]
        tips = [] if mode == "no_memory" else [90 + t, 95]
        ep.add_prompt(text[:1] + tips + text[1:], text)
        ep.add_action(action, logp)
    return ep


def sees_tips(c: Context) -> bool:
    return bool(TIPS & set(c.ids))


def actions_in(c: Context) -> list[int]:
    return [i for i, m in zip(c.ids, c.mask) if m]


# The paper's Table 3, written out: does the scored context see tips, does the old one, and is the old one the
# context the actions were played in (so its log-probs were recorded)?
TABLE3 = {
    ("no_memory", "with_tips"): (False, False, True),
    ("on_policy_tips", "with_tips"): (True, True, True),
    ("off_policy", "with_tips"): (False, True, True),
    ("off_policy", "without_tips"): (False, False, False),
}
LAYOUTS = {  # layout -> samples per episode for (on-policy, off-policy)
    "packed": (1, 1), "current_turn": (3, 1), "window": (3, 3),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mode, old_logp", TABLE3)
def test_contexts_follow_table_3(layout, mode, old_logp):
    if layout != "window" and (layout == "current_turn") != (mode != "no_memory"):
        pytest.skip("full history: no-memory episodes are packed, memory episodes current-turn (rollout.run_episodes)")
    ep = episode(layout, mode)
    pairs = contexts(ep, old_logp)
    scored_tips, old_tips, played = TABLE3[(mode, old_logp)]
    assert len(pairs) == LAYOUTS[layout][mode == "off_policy"]
    for scored, old in pairs:
        assert sees_tips(scored) == scored_tips
        assert all(sees_tips(c) == old_tips for c in old)
        # the same actions in the same order in the context scored and in the old context(s)
        assert actions_in(scored) == [a for c in old for a in actions_in(c)]
        assert all((c.logp is not None) == played for c in old)
    # every action of the episode is trained on exactly once, in step order
    assert [a for scored, _ in pairs for a in actions_in(scored)] == [a for action in ACTIONS for a in action]


def test_current_turn_off_policy_by_hand():
    """One tip-free stream scored; each action's old log-prob in its own step prompt (the stream so far + that turn
    with its tips), the log-probs recorded there."""
    ep = episode("current_turn", "off_policy")
    ((scored, old),) = contexts(ep, "with_tips")
    assert scored.ids == [10, 20, 60, 61, 11, 21, 62, 12, 22, 63, 64, 65]
    assert scored.mask == [0, 0, 1, 1, 0, 0, 1, 0, 0, 1, 1, 1]
    assert [c.ids for c in old] == [[10, 90, 95, 20, 60, 61],
                                    [10, 20, 60, 61, 11, 91, 95, 21, 62],
                                    [10, 20, 60, 61, 11, 21, 62, 12, 92, 95, 22, 63, 64, 65]]
    assert [c.logp for c in old] == LOGPS
    ((scored_alg1, old_alg1),) = contexts(ep, "without_tips")
    assert old_alg1 == [scored_alg1] == [scored] and old_alg1[0].logp is None


def test_build_samples_old_logprobs_advantages_and_weights():
    on = build_samples([episode("packed", "no_memory")], [0.5])
    assert len(on) == 1 and on[0].old_logp == [-0.1, -0.2, -0.3, -0.4, -0.5, -0.6]  # recorded: no forward needed
    assert on[0].advantages == [0.5] * 6 and on[0].weights == pytest.approx([1 / 2] * 2 + [1.0] + [1 / 3] * 3)
    assert on[0].steps == 3 and on[0].units == pytest.approx(3.0)
    alg1 = build_samples([episode("current_turn", "off_policy")], [0.5], off_policy_old_logp="without_tips")
    assert alg1[0].old_logp == [] and alg1[0].recorded_logp is None  # never sampled there: losses computes it
    (without,) = build_samples([episode("packed", "no_memory")], [0.5], branch_packing=False)
    assert without.old_logp == on[0].old_logp  # branch packing changes nothing in a packed episode


def test_per_step_advantages_follow_their_steps():
    """GiGPO: one advantage per step; each window sample carries its own step's on every action token."""
    samples = build_samples([episode("window", "off_policy")], [[1.0, -2.0, 3.0]])
    assert [s.advantages for s in samples] == [[1.0, 1.0], [-2.0], [3.0, 3.0, 3.0]]
    assert [s.old_logp for s in samples] == LOGPS


def test_branch_packed_sample_holds_the_per_step_samples():
    """A current-turn on-policy episode: one branch-packed sequence whose old contexts, advantages and recorded
    log-probs are the per-step samples', one step weighing 1 in both."""
    ep = episode("current_turn", "on_policy_tips")
    (packed,) = build_samples([ep], [0.7])
    per_step = build_samples([ep], [0.7], branch_packing=False)
    assert len(per_step) == 3 and packed.branches is not None
    assert [(c.ids, c.mask) for c in packed.old] == [(s.ids, s.mask) for s in per_step]
    assert packed.advantages == [a for s in per_step for a in s.advantages] == [0.7] * 6
    assert packed.old_logp == [x for s in per_step for x in s.old_logp] == [x for lp in LOGPS for x in lp]
    assert packed.steps == 3 and packed.units == pytest.approx(sum(s.units for s in per_step)) == pytest.approx(3.0)
    # the tip-free stream up to where the last step's prompt leaves it, then per step the rest of its prompt + action
    assert packed.ids == [10, 20, 60, 61, 11, 21, 62, 12] + [90, 95, 20, 60, 61] + [91, 95, 21, 62] + [92, 95, 22, 63,
                                                                                                      64, 65]
    assert packed.mask == [0] * 8 + [0, 0, 0, 1, 1] + [0, 0, 0, 1] + [0, 0, 0, 1, 1, 1]


def test_an_episode_without_actions_gives_no_samples():
    ep = Episode(task=Task("t", 0), group=0, mode="off_policy", layout="current_turn")
    assert contexts(ep) == [] and build_samples([ep], [1.0]) == []
