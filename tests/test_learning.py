"""Does training change the policy the way the method says? Real SmolLM2-135M (LoRA), real update path, on CPU.

* Learnability: on the sanity environment's one-step "pick" task (one of K listed words opens the door, the same
  word in every variation) six iterations of the real trainer raise the success rate on held-out variations far
  above the untrained model's. Flipping the sign of the advantage (or of the log-ratio) in losses.py makes this
  test fail: the success rate then stays at or below the untrained model's.
* Off-policy "reward-guided distillation" (paper §4.2): episodes played WITH tips in the prompt and updated
  off-policy on the tip-free context raise log pi(a | no tips) of positive-advantage actions, lower it for
  negative ones, and move the tip-free probability of the tip-induced action towards its with-tips probability.
  Through the run's own path: two-step episodes played by `run_episodes(mode="off_policy")` with tips in the current
  turn (the default placement), `build_samples` (one packed tip-free sample per episode, behaviour log-probs in
  each step's own with-tip prompt), `compute_old_logprobs`, `train.update`. Only the generated ids are scripted
  (teacher-forced actions: a sampled 135M model would rarely say the tip's answer).
"""
import random

import pytest
import torch

from advantages import group_advantages
from config import load_config
from envs.base import Env, Task
from losses import sequence_action_logprobs
from memory import TipEntry, TipMemory, tip_block
from infra.models import load_policy
from rollout import ChatStream, Episode, pair_up, run_episodes
from samples import build_samples

pytestmark = pytest.mark.slow

QUESTION = "Which colour? Options: red, blue, green. Answer with one word."
TIP = [TipEntry(tip="The answer is blue.", action="blue", ret=100.0)]
# With the tip SmolLM2-135M says GOOD far more often than without it (log-prob -3.6 vs -9.6): a tip-induced action.
# Every token of both actions stays above the low-probability mask's log delta = -5 without tips, so the
# off-policy update does learn on them (tokens below it would be masked, as Eq. 2 intends). The two actions share
# no token: with the Table-3 ratio pi(a | no tips) / pi_old(a | tips), a shared first token ("The") whose ratio
# starts above 1 + clip_high is clipped for the positive action but not for the negative one, and would be pushed
# down by the negative sample alone.
GOOD, BAD = "The answer is blue.", "Red"


@pytest.fixture
def fresh_policy():
    """A policy of its own (the session-wide one is shared by tests that update it)."""
    from config import ModelConfig

    torch.manual_seed(0)
    return load_policy(ModelConfig(lora_rank=8, lora_alpha=16, lora_targets=["q_proj", "v_proj"]))


def one_step_episode(chat: ChatStream, action: str, mode: str, with_tips: bool) -> Episode:
    """The question (with the tip block in the turn, as the rollout shows memory tips), then `action`."""
    ep = Episode(task=Task("colours", 0), group=0, mode=mode, layout="current_turn")
    block = tip_block(TIP) if with_tips else ""
    ep.add_prompt(chat.first_turn(QUESTION + block), chat.first_turn(QUESTION))
    ep.add_action(chat.encode(action) + [chat.eos_id])
    ep.actions.append(action)
    ep.rewards.append(100.0 if action == GOOD else 0.0)
    return ep


def action_logprob(model, chat: ChatStream, action: str, with_tips: bool) -> float:
    """log pi(action + eos | the question, with or without the tip block): summed over the action tokens."""
    step = one_step_episode(chat, action, "no_memory", with_tips).steps[0]  # the prompt played, with its tips
    ids, mask = step.ids + step.action_ids, [0] * len(step.ids) + [1] * len(step.action_ids)
    model.eval()
    with torch.no_grad():
        (logp,), _ = sequence_action_logprobs(model, [ids], [mask], chat.pad_id, "cpu")
    return logp.sum().item()


class ColoursEnv(Env):
    """Two rounds of QUESTION; the answer GOOD pays 100 each round."""

    def __init__(self):
        self.t = 0

    def tasks(self, split):
        return [Task("colours", 0)]

    def reset(self, task):
        self.t = 0
        return QUESTION

    def step(self, action):
        self.t += 1
        reward, done = (100.0 if action == GOOD else 0.0), self.t >= 2
        return f"Round {self.t + 1}. {QUESTION}", reward, done, dict(score=reward, success=reward > 0, truncated=done,
                                                                      env_error="", action=action)


def played_with_tips(model, chat: ChatStream, cfg, monkeypatch) -> list[Episode]:
    """Two off-policy episodes of ColoursEnv through run_episodes, the tip retrieved at every step; the generator
    is scripted: episode 0 answers GOOD twice, episode 1 BAD twice."""
    from engine import generation

    scripted = [chat.encode(GOOD) + [chat.eos_id], chat.encode(BAD) + [chat.eos_id]]
    monkeypatch.setattr(generation, "generate",
                        lambda model, pad_id, eos_id, contexts, caches=None, **kwargs: [list(a) for a in scripted])
    memory = TipMemory(cfg.memory.capacity, cfg.memory.top_k)
    memory.add("colours/0", TIP[0])
    return run_episodes(model, chat, pair_up([ColoursEnv(), ColoursEnv()], [Task("colours", 0)] * 2),
                        mode="off_policy", memory=memory, cfg=cfg.rollout)


def stream_logprob(model, chat: ChatStream, ids: list[int], mask: list[int]) -> float:
    model.eval()
    with torch.no_grad():
        (logp,), _ = sequence_action_logprobs(model, [ids], [mask], chat.pad_id, "cpu")
    return logp.sum().item()


# Measured with this model (8 AdamW steps, lr 1e-3): with the Table-3 denominator pi_old(a | tips) the tip-induced
# token " blue" starts with importance weight pi(a | no tips) / pi_old(a | tips) = e^-3.9 = 0.02, so distillation is
# slow: the rollout case (two steps per episode, GRPO advantages +-0.71) moves the tip-free log-prob of GOOD
# -9.6 -> -8.1 (gap 5.2 -> 3.7), BAD -4.0 -> -6.8, the whole episodes' tip-free log-probs -11.8 -> -9.4 and
# -7.5 -> -14.2 (one-step episodes by hand, advantages +-1: GOOD +0.8, gap 5.2 -> 4.6). With Algorithm 1's tip-free
# denominator the weight starts at 1 (by hand: GOOD -9.6 -> -4.5, gap 5.2 -> 0.4, BAD -4.0 -> -10.6).
# docs/decisions.md, "Off-policy old log-probabilities".
MIN_CHANGE = {"with_tips": 0.3, "without_tips": 2.0}


# Table 3's denominator through the run's default path; Algorithm 1's on one-step episodes built by hand.
@pytest.mark.parametrize("old_logp, path", [("with_tips", "rollout"), ("without_tips", "by_hand")])
def test_off_policy_update_distils_the_tip_into_the_tip_free_policy(fresh_policy, old_logp, path, monkeypatch):
    from accelerate import Accelerator

    from losses import compute_old_logprobs
    from train import update

    model, tokenizer = fresh_policy
    chat = ChatStream(tokenizer)
    cfg = load_config(None, ["--train.epochs=8", "--train.max_grad_norm=10", f"--loss.off_policy_old_logp={old_logp}"])
    before = {(a, t): action_logprob(model, chat, a, t) for a in (GOOD, BAD) for t in (True, False)}
    assert before[(GOOD, True)] > before[(GOOD, False)] + 3  # the tip makes GOOD more likely: tip-induced

    # Played with tips, learned off-policy: GOOD paid, BAD did not.
    if path == "rollout":  # the default path: current-turn tips, one packed tip-free sample per episode
        episodes = played_with_tips(model, chat, cfg, monkeypatch)
        assert [ep.layout for ep in episodes] == ["current_turn"] * 2
        assert [ep.tips_retrieved for ep in episodes] == [[1, 1]] * 2 and [ep.num_actions for ep in episodes] == [2, 2]
        advantages = group_advantages([ep.extrinsic_return for ep in episodes], [ep.group for ep in episodes])
        assert advantages[0] > 0 > advantages[1]
    else:  # one-step episodes built by hand, advantages +-1
        episodes = [one_step_episode(chat, GOOD, "off_policy", True), one_step_episode(chat, BAD, "off_policy", True)]
        advantages = [1.0, -1.0]
    samples = build_samples(episodes, advantages, off_policy_old_logp=old_logp)
    assert len(samples) == 2 and [s.ids for s in samples] == [ep.ids for ep in episodes]  # scored without tips
    assert all("<tip>" not in chat.decode(s.ids) for s in samples)
    if path == "rollout":  # the behaviour log-probs: each action in its own with-tip step prompt
        assert all(len(s.old) == 2 and all(chat.decode(c.ids).count("<tip>") == 1 for c in s.old) for s in samples)
    tip_free = [stream_logprob(model, chat, ep.ids, ep.mask) for ep in episodes]  # every step
    compute_old_logprobs(model, samples, chat.pad_id, "cpu", micro_batch_size=2)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-3)
    metrics = update(model, optimizer, samples, cfg, Accelerator(cpu=True), "off_policy", chat.pad_id,
                     random.Random(0))
    assert metrics["optimizer_steps"] == 8 and metrics["masked_frac"] < 1.0
    print({k: round(v, 2) for k, v in before.items()})

    after = {(a, t): action_logprob(model, chat, a, t) for a in (GOOD, BAD) for t in (True, False)}
    change = MIN_CHANGE[old_logp]
    assert after[(GOOD, False)] > before[(GOOD, False)] + change  # positive advantage: rises without tips
    assert after[(BAD, False)] < before[(BAD, False)] - 1.0  # negative advantage: falls without tips
    gap_before = before[(GOOD, True)] - before[(GOOD, False)]
    gap_after = after[(GOOD, True)] - after[(GOOD, False)]
    print({k: round(v, 2) for k, v in after.items()})
    assert gap_after < gap_before - change  # the tip-free policy moves towards the with-tips policy on GOOD
    # Over whole episodes (both steps) too: the rewarded episode's tip-free log-prob rises, the punished one's falls.
    tip_free_after = [stream_logprob(model, chat, ep.ids, ep.mask) for ep in episodes]
    print("tip-free episode log-probs", [round(v, 2) for v in tip_free], "->", [round(v, 2) for v in tip_free_after])
    assert tip_free_after[0] > tip_free[0] + change and tip_free_after[1] < tip_free[1] - 1.0


PICK = ["--env.sanity.families=[pick]", "--env.sanity.pick_choices=2", "--env.sanity.train_variations=7",
        "--env.sanity.test_variations=4", "--rollout.tasks_per_iteration=2",
        "--rollout.group_size=8", "--rollout.max_action_tokens=4", "--rollout.max_prompt_tokens=256",
        "--train.iterations=6", "--train.minibatch_steps=8", "--train.micro_batch_size=8", "--train.lr=2e-3",
        "--train.eval_every=0", "--train.save_every=0", "--train.tensorboard=false", "--train.torch_threads=2"]


def held_out_success(model, chat: ChatStream, cfg, envs, tasks) -> float:
    """Success rate of 12 sampled answers (temperature 1) per held-out variation."""
    from eval import evaluate

    torch.manual_seed(1)
    return evaluate(model, chat, envs, tasks, cfg, episodes_per_task=12)["success_rate"]


def test_training_raises_the_paying_commands_probability(tmp_path):
    import json
    from pathlib import Path

    from envs.sanity import SanityEnv
    from infra.models import load_trainable
    from train import train

    config = Path(__file__).resolve().parents[1] / "configs" / "sanity_grpo.yaml"
    cfg = load_config(str(config), PICK + [f"--output_dir={tmp_path}", "--train.eval_temperature=1.0"])
    envs = [SanityEnv(cfg.env.sanity) for _ in range(16)]
    held_out = envs[0].tasks("test")
    torch.manual_seed(0)
    model, tokenizer = load_policy(cfg.model)
    chat = ChatStream(tokenizer)
    before = held_out_success(model, chat, cfg, envs, held_out)

    train(cfg)
    load_trainable(model, str(tmp_path / "checkpoints" / "iter_000006" / "model"))
    after = held_out_success(model, chat, cfg, envs, held_out)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    print(f"held-out success {before:.3f} -> {after:.3f}; training success", [r["success_rate"] for r in rows])
    assert after >= 2 * before and after >= before + 0.15  # on variations never trained on, 48 samples each side
