"""Behaviour log-probs recorded while sampling (build_samples' default) equal the old log-probs a separate
forward computes (every old_logp cleared first, the peers' way), in every mode and layout, with and without KV reuse, for actions
cut at the token limit; and the tip stops at its first line without losing what clean_tip keeps."""
import pytest
import torch

from config import RolloutConfig
from envs.base import Task
from engine.generation import FirstLineStop, generate
from losses import compute_old_logprobs
from memory import TipEntry, TipMemory
from memory import clean_tip
from rollout import ChatStream, pair_up, run_episodes
from samples import build_samples

from conftest import RoomsEnv

pytestmark = pytest.mark.slow  # the real CPU policy

CASES = [  # (mode, history window, kv reuse, temperature, off-policy old context): every layout
    ("no_memory", -1, True, 1.0, "with_tips"),  # packed
    ("no_memory", -1, False, 0.0, "with_tips"),  # packed, re-encoded, greedy
    ("on_policy_tips", -1, True, 1.0, "with_tips"),  # current turn: one sample per step
    ("off_policy", -1, False, 1.0, "with_tips"),  # packed tip-free, one old context per step
    ("off_policy", -1, True, 1.0, "without_tips"),  # the tip-free stream: recomputed
    ("off_policy", 1, True, 1.0, "with_tips"),  # history window
]


def memory_with_tips() -> TipMemory:
    memory = TipMemory()
    for i in range(3):
        memory.add("rooms/0", TipEntry(tip=f"Tip {i}: looking around first helps.", action="look", ret=10.0 * i))
    return memory


@pytest.mark.parametrize("mode,window,reuse,temperature,old_context", CASES)
def test_recorded_logprobs_equal_a_recomputing_forward(policy, mode, window, reuse, temperature, old_context):
    model, tokenizer = policy
    model.eval()
    chat = ChatStream(tokenizer)
    cfg = RolloutConfig(max_action_tokens=8, max_prompt_tokens=4000, temperature=temperature, history_window=window,
                        kv_reuse=reuse)
    episodes = run_episodes(model, chat, pair_up([RoomsEnv(2) for _ in range(2)], [Task("rooms", 0)] * 2, [0, 0],
                                                 [11, 12]), mode=mode, memory=memory_with_tips(), cfg=cfg)
    advantages = [1.0, -0.5]
    recorded = build_samples(episodes, advantages, off_policy_old_logp=old_context)
    recomputed = build_samples(episodes, advantages, off_policy_old_logp=old_context)
    for s in recomputed:  # the peers' way: every old log-prob from a forward after the rollout
        s.old_logp = []
    compute_old_logprobs(model, recomputed, chat.pad_id, "cpu", micro_batch_size=4)
    compute_old_logprobs(model, recorded, chat.pad_id, "cpu", micro_batch_size=4)  # only what was not recorded
    assert len(recorded) == len(recomputed) > 0
    for a, b in zip(recorded, recomputed):
        assert len(a.old_logp) == len(b.old_logp) == len(a.advantages)
        assert max(abs(x - y) for x, y in zip(a.old_logp, b.old_logp)) <= 1e-4
    # Every sample is served from the rollout except the Algorithm-1 off-policy denominator (never sampled there).
    from_rollout = [s.recorded_logp is not None for s in recorded]
    want_recorded = not (mode == "off_policy" and old_context == "without_tips")
    assert all(from_rollout) if want_recorded else not any(from_rollout)
    actions = [ids for ep in episodes for ids in ([s.action_ids for s in ep.steps] if ep.steps else [])]
    if (mode, window) == ("on_policy_tips", -1):  # SmolLM2 runs past 8 tokens here
        assert any(len(ids) == 8 and ids[-1] != chat.eos_id for ids in actions), actions


def test_an_action_cut_at_the_token_limit_keeps_one_logprob_per_token(policy):
    model, tokenizer = policy
    chat = ChatStream(tokenizer)
    contexts = [chat.first_turn("Tell me a long story about a dragon."), chat.first_turn("Say yes.")]
    logps: list = []
    out = generate(model, chat.pad_id, chat.eos_id, contexts, max_new_tokens=6, temperature=1.0, seeds=[1, 2],
                   caches=[None, None], logprobs=logps)
    assert len(out[0]) == 6 and out[0][-1] != chat.eos_id  # cut at the limit
    assert [len(lp) for lp in logps] == [len(o) for o in out]
    # Seedless sampling at temperature > 0 draws with HF's own sampler: nothing is recorded (the trainer recomputes).
    unseeded: list = []
    generate(model, chat.pad_id, chat.eos_id, contexts, max_new_tokens=3, temperature=1.0, logprobs=unseeded)
    assert unseeded == [None, None]


def test_the_tip_stops_at_its_first_line_and_keeps_it(policy):
    _, tokenizer = policy
    texts = tokenizer.batch_decode([[i] for i in range(len(tokenizer))])
    stop = FirstLineStop(texts)
    encode = lambda t: tokenizer.encode(t, add_special_tokens=False)  # noqa: E731
    rows = [encode("\n\nLook around first.\nThen open the door."), encode("Open the box.\n\nMore text here"),
            encode("One line only")]
    stop.reset(len(rows))
    width = max(map(len, rows))
    padded = [r + [tokenizer.eos_token_id] * (width - len(r)) for r in rows]
    flags = [stop(torch.tensor([row[: t + 1] for row in padded])).tolist() for t in range(width)][-1]
    assert flags == [True, True, False]
    for row, n in zip(rows, stop.lengths):
        kept = row[:n] if n else row
        assert clean_tip(tokenizer.decode(kept)) == clean_tip(tokenizer.decode(row))  # the same tip, fewer tokens
    assert 0 < stop.lengths[0] < len(rows[0]) and 0 < stop.lengths[1] < len(rows[1]) and stop.lengths[2] == 0


def test_branch_packed_episode_has_the_per_step_samples_loss_and_gradient(policy):
    """A current-turn on-policy episode as ONE branch-packed sample (samples.branch_packed) against its per-step
    samples (build_samples(branch_packing=False)): the same step-weighted loss and LoRA gradient, on episodes of 2 and 3
    steps in one micro-batch, with fewer tokens through the forward."""
    from config import LossConfig
    from losses import samples_loss

    model, tokenizer = policy
    chat = ChatStream(tokenizer)
    cfg = RolloutConfig(max_action_tokens=8, max_prompt_tokens=4000, temperature=1.0)
    episodes = run_episodes(model, chat, pair_up([RoomsEnv(2), RoomsEnv(3)], [Task("rooms", 0)] * 2, [0, 0], [5, 6]),
                            mode="on_policy_tips", memory=memory_with_tips(), cfg=cfg)
    assert [ep.num_actions for ep in episodes] == [2, 3] and all(ep.layout == "current_turn" for ep in episodes)
    params = [p for p in model.parameters() if p.requires_grad]

    def loss_and_grad(samples):
        for s in samples:  # old log-probs shifted by +-0.3 (by the token's own value: the same in both layouts)
            s.old_logp = [x + (0.3 if round(x * 1000) % 2 else -0.3) for x in s.recorded_logp]
        model.zero_grad(set_to_none=True)
        loss, _ = samples_loss(model, samples, chat.pad_id, "cpu", LossConfig(), "none", sum(s.units for s in samples))
        loss.backward()
        grads = [p.grad.detach().clone() for p in params]
        model.zero_grad(set_to_none=True)
        return loss.item(), grads

    model.train()
    packed = build_samples(episodes, [1.0, -0.5], branch_packing=True)
    per_step = build_samples(episodes, [1.0, -0.5], branch_packing=False)
    assert len(packed) == 2 and len(per_step) == 5 and [s.steps for s in packed] == [2, 3]
    (loss_packed, grad_packed), (loss_steps, grad_steps) = loss_and_grad(packed), loss_and_grad(per_step)
    model.eval()
    assert loss_packed == pytest.approx(loss_steps, rel=1e-5)
    for a, b in zip(grad_packed, grad_steps):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert sum(len(s.ids) for s in packed) < sum(len(s.ids) for s in per_step)  # 951 vs 1115 tokens here
