"""The objective against hand-computed values (losses.py)."""
import math

import pytest
import torch

from advantages import (anchor_state_advantages, discounted_returns, gigpo_step_advantages, grpo_advantages,
                        group_advantages, novelty_advantages)
from losses import action_logprobs, clipped_policy_loss
from samples import action_runs, loss_weights


def loss_of(ratios, advantages, mask=None, old=None, **kw):
    """Single-sample helper: tokens with given ratios (old log-prob 0 unless given)."""
    old = torch.tensor([old if old is not None else [0.0] * len(ratios)])
    logp = (old + torch.log(torch.tensor([ratios], dtype=torch.float32))).requires_grad_(True)
    adv = torch.tensor([advantages], dtype=torch.float32)
    mask = torch.tensor([mask or [1] * len(ratios)], dtype=torch.float32)
    loss, metrics = clipped_policy_loss(logp, old, adv, mask, **kw)
    return loss, metrics, logp


def test_grpo_advantages_hand_computed():
    adv = grpo_advantages(torch.tensor([1.0, 2.0, 3.0]))  # mean 2, unbiased std 1
    assert torch.allclose(adv, torch.tensor([-1.0, 0.0, 1.0]) / (1 + 1e-6))
    adv = grpo_advantages(torch.tensor([0.0, 100.0]))  # mean 50, unbiased std 70.7107
    assert torch.allclose(adv, torch.tensor([-50.0, 50.0]) / (math.sqrt(5000) + 1e-6))


def test_grpo_degenerate_groups():
    assert grpo_advantages(torch.tensor([-100.0] * 8)).tolist() == [0.0] * 8  # all equal: no signal, no NaN
    assert grpo_advantages(torch.tensor([42.0])).tolist() == [0.0]  # a group of one has no baseline
    assert grpo_advantages(torch.tensor([])).tolist() == []


def test_group_advantages_groups_are_independent():
    adv = group_advantages([1.0, 3.0, 10.0, 10.0, 5.0], ["a", "a", "b", "b", "c"])
    s = math.sqrt(2.0)  # unbiased std of [1, 3]
    assert adv[0] == pytest.approx(-1 / (s + 1e-6)) and adv[1] == pytest.approx(1 / (s + 1e-6))
    assert adv[2:] == [0.0, 0.0, 0.0]


@pytest.mark.parametrize(
    "ratio, adv, expected, clipped",
    [
        (1.5, 1.0, -1.3, True),  # A > 0, ratio above 1 + 0.3: clipped at 1.3
        (1.2, 1.0, -1.2, False),  # inside the asymmetric range [0.8, 1.3]
        (0.5, 1.0, -0.5, False),  # A > 0, ratio low: min() keeps the unclipped term
        (0.5, -1.0, 0.8, True),  # A < 0, ratio below 1 - 0.2: clipped at 0.8 (no gradient)
        (1.5, -2.0, 3.0, False),  # A < 0, ratio 1.5 above 1 + 0.3, but max() keeps the larger unclipped term
        (20.0, -1.0, 10.0, True),  # A < 0, huge ratio: dual clip caps the loss at -A * c = 10
        (5.0, -1.0, 5.0, False),  # A < 0, ratio below c: plain PPO term
    ],
)
def test_clipped_surrogate_hand_computed(ratio, adv, expected, clipped):
    loss, metrics, _ = loss_of([ratio], [adv], clip_low=0.2, clip_high=0.3, dual_clip=10.0)
    assert loss.item() == pytest.approx(expected, rel=1e-5)
    assert metrics["clip_frac"] == (1.0 if clipped else 0.0)


def test_gradients_follow_the_chosen_branch():
    _, _, logp = loss_of([0.5], [1.0])
    loss, _, logp = loss_of([0.5], [1.0])
    loss.backward()
    assert logp.grad.item() == pytest.approx(-0.5, rel=1e-5)  # d(-A r)/dlogp = -A r
    loss, _, logp = loss_of([0.5], [-1.0])
    loss.backward()
    assert logp.grad.item() == 0.0  # clipped branch is constant
    loss, metrics, logp = loss_of([20.0], [-1.0])
    loss.backward()
    assert logp.grad.item() == 0.0 and metrics["dual_clip_frac"] == 1.0


def test_token_mean_per_sample_then_mean_over_samples():
    # sample 1: tokens with loss -1.0 and -1.2 (A=1, ratios 1.0, 1.2); sample 2: one token, loss 2.0, + padding
    logp = torch.log(torch.tensor([[1.0, 1.2], [1.0, 1.0]]))
    old = torch.zeros(2, 2)
    adv = torch.tensor([[1.0, 1.0], [-2.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    loss, metrics = clipped_policy_loss(logp, old, adv, mask)
    assert loss.item() == pytest.approx(((-1.0 - 1.2) / 2 + 2.0) / 2, rel=1e-6)
    assert metrics["ratio_mean"] == pytest.approx((1.0 + 1.2 + 1.0) / 3, rel=1e-6)
    assert metrics["ratio_max"] == pytest.approx(1.2, rel=1e-6)
    assert metrics["action_tokens"] == 3.0


def test_token_lowprob_mask_drops_tokens_keeps_normaliser():
    # current log-probs -1 (kept) and -6 (< -5: masked); old log-probs equal, so ratio 1; A = 1
    logp = torch.tensor([[-1.0, -6.0]], requires_grad=True)
    loss, metrics = clipped_policy_loss(logp, logp.detach().clone(), torch.ones(1, 2), torch.ones(1, 2),
                                        lowprob_mask="token", lowprob_logp_threshold=-5.0)
    assert loss.item() == pytest.approx(-1.0 / 2)  # only the kept token, divided by both tokens (Eq. 2)
    assert metrics["masked_frac"] == pytest.approx(0.5)
    loss.backward()
    assert logp.grad.tolist() == [[-0.5, 0.0]]


def test_positive_advantage_counts_hand_computed():
    """The off-policy diagnostics: of the A > 0 tokens, how many the clip and the low-probability mask silence.
    Tokens: (ratio 2, A 1) clipped; (ratio 1, A 1, logp -6) masked; (ratio 1, A 1) kept; (ratio 2, A -1) not
    counted (A < 0, clipped); a padding token with A 1 not counted."""
    logp = torch.tensor([[-1.0 + math.log(2.0), -6.0, -1.0, -1.0 + math.log(2.0), -1.0]])
    old = torch.tensor([[-1.0, -6.0, -1.0, -1.0, -1.0]])
    adv = torch.tensor([[1.0, 1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    _, m = clipped_policy_loss(logp, old, adv, mask, lowprob_mask="token", lowprob_logp_threshold=-5.0)
    assert (m["pos_adv_tokens"], m["pos_adv_clipped"], m["pos_adv_masked"]) == (3.0, 1.0, 1.0)


def test_sequence_lowprob_mask_drops_whole_sample():
    logp = torch.tensor([[-1.0, -1.0], [-1.0, -1.0]])
    old = torch.tensor([[-1.0, -7.0], [-1.0, -1.0]])  # sample 1 has an old log-prob below -5
    loss, metrics = clipped_policy_loss(logp, old, torch.ones(2, 2), torch.ones(2, 2), lowprob_mask="sequence")
    # sample 1 dropped (contributes 0), sample 2: ratios 1 -> -1; mean over 2 samples
    assert loss.item() == pytest.approx(-0.5)
    assert metrics["masked_frac"] == pytest.approx(0.5)


def test_off_policy_variants_hand_computed():
    """Numerator: current policy WITHOUT tips (logp 0.2). Table 3 denominator: rollout policy WITH tips (0.8);
    Algorithm 1 denominator: old policy without tips (0.2)."""
    current_no_tips = torch.log(torch.tensor([[0.2]]))
    table3, _ = clipped_policy_loss(current_no_tips, torch.log(torch.tensor([[0.8]])), torch.ones(1, 1),
                                    torch.ones(1, 1))
    algorithm1, _ = clipped_policy_loss(current_no_tips, current_no_tips.clone(), torch.ones(1, 1), torch.ones(1, 1))
    assert table3.item() == pytest.approx(-0.25)  # ratio 0.25, A>0: unclipped branch (min keeps 0.25)
    assert algorithm1.item() == pytest.approx(-1.0)  # ratio 1
    negative, m = clipped_policy_loss(current_no_tips, torch.log(torch.tensor([[0.8]])), -torch.ones(1, 1),
                                      torch.ones(1, 1))
    assert negative.item() == pytest.approx(0.8) and m["clip_frac"] == 1.0  # A<0, ratio<0.8: clipped, no grad


def test_approx_kl_and_entropy_metrics():
    logp = torch.log(torch.tensor([[2.0]]))
    _, metrics = clipped_policy_loss(logp, torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                                     entropy=torch.tensor([[0.7]]))
    assert metrics["approx_kl"] == pytest.approx((2.0 - 1.0) - math.log(2.0), rel=1e-6)
    assert metrics["entropy"] == pytest.approx(0.7)


def test_action_logprobs_values():
    logits = torch.tensor([[[0.0, math.log(3.0)]]])  # probabilities 0.25 / 0.75
    logp, entropy = action_logprobs(logits, torch.tensor([[1]]))
    assert logp.item() == pytest.approx(math.log(0.75))
    assert entropy.item() == pytest.approx(-(0.25 * math.log(0.25) + 0.75 * math.log(0.75)))


def entropy_case():
    """Logits [5, 7] (fp32), targets, advantages of both signs, old log-probs around the clip band, token weights."""
    gen = torch.Generator().manual_seed(3)
    logits = (2 * torch.randn(5, 7, generator=gen)).requires_grad_()
    targets = torch.randint(0, 7, (5,), generator=gen)
    adv = torch.tensor([1.0, -2.0, 0.5, -0.5, 3.0])
    shift = torch.tensor([0.0, 0.3, -0.4, 0.1, -0.05])
    weights = torch.tensor([0.5, 0.5, 1.0, 1 / 3, 1 / 3])
    return logits, targets, adv, shift, weights


def test_entropy_bonus_gradient_equals_a_hand_written_reference():
    """loss.entropy_coef: the loss's gradient in the logits equals a hand-written reference: the surrogate plus
    - coef x sum_t w_t H_t / N with H = -sum_v softmax(z) log_softmax(z) through plain autograd, and its closed
    form dH/dz = -p (log p + H). A flipped sign or a detached entropy fails it."""
    logits, targets, adv, shift, weights = entropy_case()
    coef, normaliser = 0.5, 2.0

    def surrogate(logp, entropy, entropy_coef):
        old = (logp.detach() + shift)[None]
        return clipped_policy_loss(logp[None], old, adv[None], torch.ones(1, 5), clip_low=0.2, clip_high=0.2,
                                   dual_clip=3.0, entropy=entropy[None], entropy_coef=entropy_coef,
                                   token_weights=weights[None], normaliser=normaliser)[0]

    logp, entropy = action_logprobs(logits, targets, entropy_grad=True)
    (grad,) = torch.autograd.grad(surrogate(logp, entropy, coef), logits)

    log_p = torch.log_softmax(logits, -1)
    hand_entropy = -(log_p.exp() * log_p).sum(-1)
    torch.testing.assert_close(entropy, hand_entropy, rtol=0, atol=1e-6)
    reference = surrogate(log_p.gather(-1, targets[:, None])[:, 0], hand_entropy.detach(), 0.0) \
        - coef * (weights * hand_entropy).sum() / normaliser
    (ref_grad,) = torch.autograd.grad(reference, logits)
    torch.testing.assert_close(grad, ref_grad, rtol=1e-5, atol=1e-6)

    # the entropy's own gradient in closed form, and that it is a real part of the loss's gradient
    (h_grad,) = torch.autograd.grad(action_logprobs(logits, targets, entropy_grad=True)[1].sum(), logits)
    p = log_p.exp().detach()
    torch.testing.assert_close(h_grad, -p * (log_p.detach() + hand_entropy.detach()[:, None]), rtol=1e-5, atol=1e-6)
    (no_bonus,) = torch.autograd.grad(surrogate(*action_logprobs(logits, targets), 0.0), logits)
    assert (grad - no_bonus).abs().max() > 0.05


def test_entropy_bonus_refuses_a_detached_entropy():
    logits, targets, adv, _, weights = entropy_case()
    logp, entropy = action_logprobs(logits, targets)  # the metric: no gradient
    with pytest.raises(ValueError, match="entropy_coef > 0 needs the entropy with its gradient"):
        clipped_policy_loss(logp[None], logp.detach()[None], adv[None], torch.ones(1, 5), entropy=entropy[None],
                            entropy_coef=0.001)


def test_entropy_bonus_keeps_no_extra_vocabulary_sized_tensor_for_backward():
    """What autograd saves for backward, with and without the entropy's gradient: the same storages (the bonus
    reuses the log-softmax output the log-softmax's backward keeps anyway), so no second [N, V] tensor."""
    logits = torch.randn(64, 1000, requires_grad=True)
    targets = torch.randint(0, 1000, (64,))

    def saved(entropy_grad):
        storages = {}

        def pack(t):
            storages[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
            return t

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            action_logprobs(logits, targets, entropy_grad=entropy_grad)
        return storages

    with_grad, without = saved(True), saved(False)
    assert sum(with_grad.values()) == sum(without.values()) >= 64 * 1000 * 4  # the one [N, V] fp32 log-softmax


def test_nonfinite_inputs_are_detectable():
    loss, _ = clipped_policy_loss(torch.tensor([[float("nan")]]), torch.zeros(1, 1), torch.ones(1, 1),
                                  torch.ones(1, 1))
    assert not torch.isfinite(loss)


def test_length_buckets_keep_padding_small():
    from losses import length_buckets, padded_tokens

    lengths = [100, 10, 90, 12]
    shuffled = [[0, 1], [2, 3]]  # arrival order: each long sample padded against a short one
    assert padded_tokens(lengths, shuffled) == (90 + 78, 200 + 180)
    buckets = length_buckets(lengths, 2)
    assert buckets == [[1, 3], [2, 0]]  # sorted by length, every sample exactly once
    assert padded_tokens(lengths, buckets) == (2 + 10, 24 + 200)
    assert length_buckets(lengths, 1) == [[1], [3], [2], [0]] and padded_tokens(lengths, [[1], [3]]) == (0, 22)


def test_gigpo_step_advantages_by_hand():
    """Group 0: three episodes that all start in state A; two of them also reach B. Group 1 also starts in A but
    is another task row, so it never shares an anchor with group 0. gamma = 0.5."""
    states = [["A", "B"], ["A", "C"], ["A", "B", "D"], ["A"]]
    rewards = [[0.0, 1.0], [0.0, 0.0], [0.0, 0.0, 2.0], [1.0]]
    groups = [0, 0, 0, 1]
    returns = [discounted_returns(r, 0.5) for r in rewards]
    assert returns == [[0.5, 1.0], [0.0, 0.0], [0.5, 1.0, 2.0], [1.0]]  # e.g. 0 + 0.5 * 0 + 0.25 * 2 = 0.5
    steps = anchor_state_advantages(states, returns, groups, eps=0.0)
    # Anchor A in group 0: returns 0.5, 0, 0.5; mean 1/3, unbiased std sqrt(1/12) = 0.288675.
    third = (0.5 - 1 / 3) / math.sqrt(1 / 12)  # 0.57735
    assert steps[0] == pytest.approx([third, 0.0])  # B: returns 1 and 1, equal -> 0
    assert steps[1] == pytest.approx([-2 * third, 0.0])  # C: seen once -> 0
    assert steps[2] == pytest.approx([third, 0.0, 0.0]) and steps[3] == [0.0]  # D once; group 1's A alone
    centred = anchor_state_advantages(states, returns, groups, divide_std=False)
    assert centred[0][0] == pytest.approx(1 / 6) and centred[1][0] == pytest.approx(-1 / 3)
    # Episode-level GRPO: returns 1, 0, 2 -> mean 1, std 1 -> 0, -1, 1; group 1 alone -> 0. Weight 0.5.
    episode = group_advantages([1.0, 0.0, 2.0, 1.0], groups, eps=0.0)
    assert episode == pytest.approx([0.0, -1.0, 1.0, 0.0])
    # (episode + weight x step level, as verl-agent combines them: tests/test_gigpo.py)
    # GiGPO "w/o std" (verl-agent's mean_norm) drops the std at BOTH levels: episode returns 2, 0, 4 -> 0, -2, 2.
    assert group_advantages([2.0, 0.0, 4.0, 1.0], groups, divide_std=False) == pytest.approx([0.0, -2.0, 2.0, 0.0])


def test_gigpo_counts_no_anchor_credit_at_step_weight_zero():
    """Anchor S: episode a's return from S is 1, b's 0 -> both rows get step credit at weight 1, none reaches the
    advantage at weight 0 (GRPO as verl-agent runs it), so steps_with_anchor_credit reports 0."""
    args = ([[0.0, 1.0], [0.0, 0.0]], [[0.0, 0.0], [0.0, 0.0]], [["S", "P"], ["S", "Q"]], [0, 0])
    assert gigpo_step_advantages(*args, gamma=1.0, weight=1.0, divide_std=False)[1] == 2
    adv, credited = gigpo_step_advantages(*args, gamma=1.0, weight=0.0, divide_std=False)
    assert credited == 0 and adv == [[0.5, 0.5], [-0.5, -0.5]]


def test_gigpo_needs_per_step_samples():
    from config import ConfigError, load_config

    with pytest.raises(ConfigError, match="history_window"):
        load_config(None, ["--loss.advantage=gigpo", "--rollout.history_window=-1"])
    assert load_config(None, ["--loss.advantage=gigpo", "--rollout.history_window=2"]).loss.advantage == "gigpo"


# ----------------------------------------------------------------------------- novelty bonus (intrinsic.*)

EXPLORER = [0.5, 0.5, 0.5] + [0.0015] * 27  # three new-ish states, then 27 steps in common ones: sum 1.5405
FAST_FAILURE = [0.1]  # one step into a rare state, then the episode ends: sum 0.1


def test_novelty_tie_on_the_score_goes_to_the_explorer():
    """Both episodes fail at -100: one tie class (the whole group), so h = 1 and A = 0.1 (t - mean t) / 2 with
    t = tanh(B - mean B). By hand: B = 1.5405 and 0.1, mean 0.82025 -> t = +-tanh(0.72025), mean t 0 ->
    A = +-0.05 tanh(0.72025) = +-0.030853."""
    bonuses = [sum(EXPLORER), sum(FAST_FAILURE)]
    adv = novelty_advantages(group_advantages([-100.0, -100.0], [0, 0]), bonuses, [-100.0] * 2, [0, 0], coef=0.1)
    assert adv == pytest.approx([0.05 * math.tanh(0.72025), -0.05 * math.tanh(0.72025)], abs=1e-9)
    assert adv[0] == pytest.approx(0.030853, abs=1e-6)
    # The former form (R = score + coef x mean_t 1/n_t, normalised together) gave the fast failure the full +0.707.
    means = [sum(EXPLORER) / len(EXPLORER), sum(FAST_FAILURE) / len(FAST_FAILURE)]  # 0.05135 vs 0.1
    old = group_advantages([-100.0 + means[0], -100.0 + means[1]], [0, 0])
    assert old[0] == pytest.approx(-1 / math.sqrt(2), abs=1e-4) and old[1] == pytest.approx(1 / math.sqrt(2), abs=1e-4)


def novelty(scores, bonuses, coef, groups=None):
    """Score advantages (GRPO) + the novelty term, as train.py combines them."""
    groups = groups or [0] * len(scores)
    return novelty_advantages(group_advantages(scores, groups), bonuses, scores, groups, coef=coef)


@pytest.mark.parametrize("coef", [0.1, 0.2])
def test_novelty_breaks_ties_and_never_overturns_a_score_by_hand(coef):
    """A_i += coef h_c (t_i - mean of t over c) / 2, t_i = tanh(B_i - mean of B over i's tie class c),
    h_c = min(gap_c / 2, |a_c|) (1: one class)."""
    # G1: all at -100, B = [5, 1, 1, 1]: one class, h = 1, mean B 2 -> t = tanh(3), tanh(-1) x 3, mean t
    # (0.995055 - 3 x 0.761594) / 4 = -0.322432 -> the explorer coef (0.995055 + 0.322432) / 2 = coef 0.658743,
    # the others coef (-0.761594 + 0.322432) / 2 = -coef 0.219581; they sum to 0; the explorer gets the most.
    g1 = novelty([-100.0] * 4, [5.0, 1.0, 1.0, 1.0], coef)
    t_mean = (math.tanh(3.0) - 3 * math.tanh(1.0)) / 4
    assert g1 == pytest.approx([coef * (math.tanh(3.0) - t_mean) / 2] + [coef * (-math.tanh(1.0) - t_mean) / 2] * 3,
                               abs=1e-12)
    assert g1 == pytest.approx([coef * 0.658743] + [-coef * 0.219581] * 3, abs=1e-6)
    assert g1[0] > max(g1[1:]) and sum(g1) == pytest.approx(0.0, abs=1e-12)
    # G2: scores 0 / 10 with B = [30, 0]: two lone classes, no term: -+5 / (sqrt(50) + eps), the score decides.
    a = 5 / (math.sqrt(50) + 1e-6)
    assert novelty([0.0, 10.0], [30.0, 0.0], coef) == pytest.approx([-a, a], abs=1e-6)
    # ... scores [0, 0, 10, 10], B = [30, 0, 0, 0]: mean 5, std sqrt(100 / 3) = 5.7735 -> levels -+0.866025, gap
    # 1.732051, so h = min(0.866025, 0.866025); class 0 has mean B 15 -> t = +-tanh(15), mean t 0 ->
    # +-coef h tanh(15) / 2; class 10 ties on B: 0.
    level = 5 / (math.sqrt(100 / 3) + 1e-6)
    g2 = novelty([0.0, 0.0, 10.0, 10.0], [30.0, 0.0, 0.0, 0.0], coef)
    assert g2 == pytest.approx([-level + coef * level * math.tanh(15) / 2, -level - coef * level * math.tanh(15) / 2,
                                level, level], abs=1e-6)
    assert max(g2[:2]) < min(g2[2:]) and max(g2[:2]) < 0
    # G3: scores [0, 0, 0, 100], B = [12, 0.07, 0.11, 2.02]: mean 25, std 50 -> levels -0.5 and 1.5, gap 2, so
    # h = min(1, 0.5) = 0.5 for the 0-scorers (mean B 4.06: B - mean = 7.94, -3.99, -3.95; t = 1.000000,
    # -0.999316, -0.999259, mean t -0.332858); the 100-scorer is alone: 1.5. The former form (coef (B_i - group
    # mean B)) gave the explorer -0.5 + 0.1 (12 - 3.55) = +0.345: a flipped sign.
    g3 = novelty([0.0, 0.0, 0.0, 100.0], [12.0, 0.07, 0.11, 2.02], coef)
    t = [math.tanh(7.94), math.tanh(-3.99), math.tanh(-3.95)]
    expected = [-0.5 + coef * 0.5 * (x - sum(t) / 3) / 2 for x in t] + [1.5]
    assert g3 == pytest.approx(expected, abs=1e-6)
    assert max(g3[:3]) < g3[3] and max(g3[:3]) < 0  # no 0-scorer reaches the 100-scorer, no sign flipped
    assert g3[0] > g3[2] > g3[1]  # among the 0-scorers: more new states, larger advantage
    assert sum(g3) == pytest.approx(0.0, abs=1e-12)  # the score advantages' sum, 0
    assert g3 == pytest.approx({0.1: [-0.466679, -0.516661, -0.516660, 1.5],
                                0.2: [-0.433357, -0.533323, -0.533320, 1.5]}[coef], abs=1e-6)


def test_novelty_on_random_groups_keeps_order_sign_ties_lone_members_linearity_and_sums():
    """2000 seeded groups of 2-16 episodes (scores from a few values, so ties are common; some equal bonuses), at
    every coef the config allows a run to try: scores order the advantages strictly, no score advantage changes
    sign, within a tie class more novelty gives strictly more (equal novelty: equal), a lone member keeps its score
    advantage exactly, the term is linear in coef, smaller than coef h_c in size, and sums to zero in every tie
    class, so every group's advantages sum to what its score advantages sum to."""
    import random

    rng = random.Random(0)
    scores, bonuses, groups = [], [], []
    for g in range(2000):
        values = rng.sample([-100.0, -3.0, 0.0, 0.5, 7.0, 10.0, 25.0, 100.0], rng.randint(1, 4))
        for _ in range(rng.randint(2, 16)):
            scores.append(rng.choice(values))
            bonuses.append(rng.choice([0.0, 1.0, 2.5]) if rng.random() < 0.3 else rng.uniform(0.0, 8.0))
            groups.append(g)
    base = group_advantages(scores, groups)
    members: dict = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    above, equal, lone = [], [], []  # (i, j): i must end strictly above j / level with j; i alone with its score
    flat = []  # i's whole tie class has one novelty: the term is centred in the class, so it is 0
    for group in members.values():
        for i in group:
            tied = [j for j in group if scores[j] == scores[i]]
            lone += [i] if len(tied) == 1 else []
            flat += [i] if len(tied) > 1 and len({bonuses[j] for j in tied}) == 1 else []
            above += [(i, j) for j in group if (scores[i], bonuses[i]) > (scores[j], bonuses[j])]
            equal += [(i, j) for j in tied if j > i and bonuses[j] == bonuses[i]]
    assert len(lone) > 500 and len(equal) > 500 and len(flat) > 40  # every case occurs often
    terms = {}
    for coef in (0.05, 0.1, 0.2, 0.5, 0.9):
        adv = novelty_advantages(base, bonuses, scores, groups, coef=coef)
        terms[coef] = [x - b for x, b in zip(adv, base)]
        assert all(adv[i] > adv[j] for i, j in above), coef  # scores first, then novelty among ties
        assert all(adv[i] == adv[j] for i, j in equal) and all(adv[i] == base[i] for i in lone + flat)
        assert all(x * b > 0 for x, b in zip(adv, base) if b != 0.0), coef  # no sign flipped
        classes: dict = {}
        for i, (g, score) in enumerate(zip(groups, scores)):
            classes.setdefault((g, score), []).append(i)
        for group in members.values():  # the group's advantages sum to its score advantages' sum
            assert sum(adv[i] for i in group) == pytest.approx(sum(base[i] for i in group), abs=1e-12)
        for tied in classes.values():
            assert abs(sum(terms[coef][i] for i in tied)) < 1e-12  # zero-sum in each tie class
            assert all(abs(terms[coef][i]) < coef for i in tied)  # h_c <= 1
    # |term| <= coef h_c (n - 1) / n in a class of n (|t_i - mean t| < 2 (n - 1) / n); the largest here: 0.76 coef
    assert 0.5 < max(abs(x) for x in terms[0.1]) / 0.1 < 1.0
    assert sum(t != 0.0 for t in terms[0.1]) > len(scores) / 2  # the term is not vacuous
    for coef in (0.05, 0.2, 0.5, 0.9):  # the paper's x0.5 / x2 ablation is a coef change
        assert terms[coef] == pytest.approx([t * coef / 0.1 for t in terms[0.1]], abs=1e-9)


def test_novelty_per_group_and_per_step_lists():
    """Groups are separate; a one-episode group gets nothing; per-step advantages (GiGPO) all get the episode's
    term, and the class's terms sum to zero over its ROWS (verl-agent pools step rows). Group a ties (scores 0, 0;
    one class: h = 1): B 2 and 0 -> t = +-tanh(1) = +-0.761594 on 2 rows and 1 row, mean t over the 3 rows
    0.253865 -> terms 0.2 (0.761594 - 0.253865) / 2 = +0.050773 (each of 2 rows), 0.2 (-0.761594 - 0.253865) / 2
    = -0.101546: 2 x 0.050773 - 0.101546 = 0."""
    adv = novelty_advantages([[0.5, -0.5], 0.0, 0.0, 1.0], [2.0, 0.0, 1.0, 7.0], [0.0, 0.0, 3.0, 5.0],
                             ["a", "a", "b", "c"], coef=0.2)
    assert adv[0] == pytest.approx([0.5 + 0.050773, -0.5 + 0.050773], abs=1e-6)
    assert adv[1] == pytest.approx(-0.101546, abs=1e-6)
    assert sum(adv[0]) + adv[1] == pytest.approx(0.0, abs=1e-12)
    assert adv[2] == 0.0 and adv[3] == 1.0


def test_novelty_coef_must_stay_below_one():
    from config import ConfigError, load_config

    with pytest.raises(ValueError, match="coef"):
        novelty_advantages([0.0, 0.0], [1.0, 0.0], [0.0, 0.0], [0, 0], coef=1.0)
    with pytest.raises(ConfigError, match="intrinsic.coef"):
        load_config(None, ["--intrinsic.coef=1.0"])


# ----------------------------------------------------------------------------- loss weights (samples.loss_weights)


def test_loss_weights_by_hand():
    mask = [0, 1, 1, 0, 0, 1, 0, 1, 1, 1]  # three actions of 2, 1 and 3 tokens
    assert action_runs(mask) == [2, 1, 3]
    assert loss_weights(mask, "step") == pytest.approx([1 / 2, 1 / 2, 1.0, 1 / 3, 1 / 3, 1 / 3])
    assert loss_weights(mask, "token") == [1.0] * 6
    with pytest.raises(ValueError, match="aggregation"):
        loss_weights(mask, "steps")


def test_weighted_sum_over_a_normaliser_by_hand():
    """Two samples: 2 steps (tokens 2 + 1) and 1 step (1 token), ratio 1, A = 1 (token loss -1) and A = 3 (-3).
    Step weights over a 3-step mini-batch: (-1/2 - 1/2 - 1 - 3) / 3 = -5/3; default (mean of sample means): -2."""
    logp = torch.zeros(2, 3, requires_grad=True)
    adv = torch.tensor([[1.0, 1.0, 1.0], [3.0, 0.0, 0.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    weights = torch.tensor([[0.5, 0.5, 1.0], [1.0, 0.0, 0.0]])
    loss, _ = clipped_policy_loss(logp, torch.zeros(2, 3), adv, mask, token_weights=weights, normaliser=3.0)
    assert loss.item() == pytest.approx(-5 / 3)
    loss.backward()  # d loss / d logp = -A w / 3 at ratio 1
    assert torch.allclose(logp.grad, torch.tensor([[-1 / 6, -1 / 6, -1 / 3], [-1.0, 0.0, 0.0]]))
    default, _ = clipped_policy_loss(torch.zeros(2, 3), torch.zeros(2, 3), adv, mask)
    assert default.item() == pytest.approx(-2.0)


def test_reference_kl_estimators_by_hand():
    from losses import reference_kl
    logp = torch.tensor([[math.log(0.5), math.log(0.25), 0.0]])
    ref = torch.tensor([[math.log(0.25), math.log(0.5), 20.0]])
    d = math.log(2.0)  # logp - ref of token 1; token 2: -d; token 3: -20
    assert reference_kl(logp, ref, "k1").tolist()[0] == pytest.approx([d, -d, -20.0], abs=1e-6)
    assert reference_kl(logp, ref, "k2").tolist()[0] == pytest.approx([d * d / 2, d * d / 2, 200.0], abs=1e-5)
    # k3 = exp(ref - logp) - (ref - logp) - 1: 0.5 + d - 1, 2 - d - 1, exp(20) - 21 clamped to 10
    assert reference_kl(logp, ref, "low_var_kl").tolist()[0] == pytest.approx([d - 0.5, 1 - d, 10.0], abs=1e-6)
    with pytest.raises(ValueError, match="k4"):
        reference_kl(logp, ref, "k4")


def test_kl_term_adds_coef_times_weighted_kl_and_its_gradient():
    logp = torch.tensor([[math.log(0.5), math.log(0.25)]], requires_grad=True)
    ref = torch.tensor([[math.log(0.25), math.log(0.5)]])
    zero = torch.zeros(1, 2)
    loss, metrics = clipped_policy_loss(logp, logp.detach(), zero, torch.ones(1, 2), ref_logp=ref, kl_coef=0.01)
    d = math.log(2.0)  # zero advantages: only the KL term; token weights 1/2 each, one sample
    assert loss.item() == pytest.approx(0.01 * ((d - 0.5) + (1 - d)) / 2, abs=1e-9)  # = 0.0025
    assert metrics["kl_ref"] == pytest.approx(0.25, abs=1e-6)
    loss.backward()  # d k3 / d logp = 1 - exp(ref - logp): 1 - 0.5, 1 - 2
    assert logp.grad.tolist()[0] == pytest.approx([0.01 * 0.5 / 2, 0.01 * -1.0 / 2], abs=1e-9)
    no_kl, _ = clipped_policy_loss(logp, logp.detach(), zero, torch.ones(1, 2), ref_logp=ref, kl_coef=0.0)
    assert no_kl.item() == 0.0


def test_reference_logprobs_are_the_base_models_with_lora_disabled(policy):
    from config import ModelConfig
    from losses import compute_reference_logprobs
    from infra.models import load_policy
    from samples import Context, Sample
    model, tokenizer = policy
    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    saved = [p.detach().clone() for p in lora_b]
    ids = tokenizer("Your task is to boil water. > look around. You see a stove and a pot.")["input_ids"]
    mask = [0] * 6 + [1] * (len(ids) - 6)
    sample = Sample(ids=ids, mask=mask, old=[Context(ids, mask)], advantages=[1.0] * (len(ids) - 6))
    try:
        with torch.no_grad():
            for p in lora_b:
                p.normal_(0, 0.05)  # adapters that change the policy, so that disabling them matters
        compute_reference_logprobs(model, [sample], tokenizer.pad_token_id, "cpu", 4)
        with torch.no_grad():
            adapted = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    finally:
        with torch.no_grad():
            for p, value in zip(lora_b, saved):
                p.copy_(value)
    base, _ = load_policy(ModelConfig(lora=False))  # an independent copy of the base weights, no peft at all
    with torch.no_grad():
        log_probs = torch.log_softmax(base(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    positions = range(5, len(ids) - 1)  # position t predicts token t + 1: the action tokens 6..
    expected = [log_probs[t, ids[t + 1]].item() for t in positions]
    assert len(sample.ref_logp) == len(expected)
    # Equal up to fp32 summation order (the scoring forward keeps only action positions, the independent one all;
    # 1.3e-5 in the full suite, where earlier tests change torch's thread count); the adapters move it 0.43.
    assert max(abs(a - b) for a, b in zip(sample.ref_logp, expected)) <= 5e-5
    assert max(abs(adapted[t, ids[t + 1]].item() - e) for t, e in zip(positions, expected)) > 1e-3  # measured 0.43


def scored(model, ids: list[int], positions) -> list[float]:
    """log pi(ids[t + 1] | ids[:t + 1]) at `positions` by a plain full forward (an independent scoring path)."""
    with torch.no_grad():
        log_probs = torch.log_softmax(model(input_ids=torch.tensor([ids])).logits[0].float(), -1)
    return [log_probs[t, ids[t + 1]].item() for t in positions]


@pytest.mark.slow
def test_full_fine_tuning_reference_stays_the_initial_model_after_a_step(tiny_folder):
    """model.lora=false: after an AdamW step that moves the policy, the frozen copy (infra.models.load_reference) still
    scores exactly what a freshly loaded initial model does, and no longer what the policy does."""
    from config import ModelConfig
    from losses import compute_reference_logprobs
    from infra.models import load_policy, load_reference
    from samples import Context, Sample
    cfg = ModelConfig(name_or_path=tiny_folder, lora=False)
    model, tokenizer = load_policy(cfg)
    reference = load_reference(cfg)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    ids = tokenizer("Your task is to boil water. > look around. You see a stove and a pot.")["input_ids"]
    mask = [0] * 6 + [1] * (len(ids) - 6)
    sample = Sample(ids=ids, mask=mask, old=[Context(ids, mask)], advantages=[1.0] * (len(ids) - 6))
    model.train()
    model(input_ids=torch.tensor([ids]), labels=torch.tensor([ids])).loss.backward()
    optimizer.step()
    compute_reference_logprobs(model, [sample], tokenizer.pad_token_id, "cpu", 4, reference=reference)
    fresh, _ = load_policy(cfg)  # an independent copy of the initial weights
    positions = range(5, len(ids) - 1)  # position t predicts token t + 1: the action tokens 6..
    expected = scored(fresh, ids, positions)
    assert len(sample.ref_logp) == len(expected)
    assert max(abs(a - b) for a, b in zip(sample.ref_logp, expected)) <= 5e-5  # as the LoRA test: summation order
    moved = max(abs(a - b) for a, b in zip(scored(model, ids, positions), expected))
    assert moved > 1e-3, moved  # the step changed the policy, so the equality above is not trivial
    with pytest.raises(ValueError, match="infra.models.load_reference"):  # a full fine-tune is not its own reference
        compute_reference_logprobs(model, [sample], tokenizer.pad_token_id, "cpu", 4)


@pytest.mark.slow
def test_full_fine_tuning_reference_is_frozen_and_scores_as_the_untrained_policy(tiny_folder):
    """The copy is never trained (no parameter requires grad, eval mode) and, in bf16 without FSDP, computes exactly
    as the untrained policy (fp32 master weights under autocast): the decoder's linear weights stored in bf16 (what
    autocast casts them to), everything else fp32 as the policy's, so KL(pi || pi_ref) starts at 0."""
    from config import ModelConfig
    from infra.models import load_policy, load_reference
    ids = list(range(5, 40))
    for fp32_head in (True, False):
        cfg = ModelConfig(name_or_path=tiny_folder, lora=False, dtype="bfloat16", fp32_lm_head=fp32_head)
        reference = load_reference(cfg)
        assert not reference.training and not any(p.requires_grad for p in reference.parameters())
        head = reference.get_output_embeddings()
        decoder_linear = {id(p) for m in reference.modules() if isinstance(m, torch.nn.Linear) and m is not head
                          for p in m.parameters()}  # weights and biases
        for param in reference.parameters():
            assert param.dtype == (torch.bfloat16 if id(param) in decoder_linear else torch.float32)
        assert getattr(reference, "empo2_fp32_lm_head", False) == fp32_head  # FSDP: the head's own fp32 unit
        policy, _ = load_policy(cfg)
        policy.eval()
        assert {p.dtype for p in policy.parameters()} == {torch.float32}  # the policy keeps its fp32 master weights
        positions = range(len(ids) - 1)
        assert scored(reference, ids, positions) == scored(policy, ids, positions)  # bit for bit
        sharded = load_reference(cfg, autocast_forward=False)  # under FSDP: stored in the compute dtype
        head = sharded.get_output_embeddings().weight
        assert head.dtype == (torch.float32 if fp32_head else torch.bfloat16)
        assert {p.dtype for p in sharded.parameters() if p is not head} == {torch.bfloat16}
