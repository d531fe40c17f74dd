"""The prompt as the reference builds it: the answer instruction closes every user turn, after the turn's tips. At
step 0 the tip block goes before the instruction that closes the first message (Env.answer_instruction); every later
turn ends with the environment's reminder (Env.turn_reminder: ScienceWorld's whole naive instruction), in the stream
the model saw and in its tip-free twin; the context budget counts it. Sanity env (no JVM) with the real CPU policy
and SmolLM2's chat template; ScienceWorld's texts by themselves."""
import pytest
import torch
from chat_reference import render_episode

from config import RolloutConfig
from envs.sanity import RESPOND, SanityConfig, SanityEnv
from envs.scienceworld.config import ScienceWorldConfig
from envs.scienceworld.prompts import NAIVE_INSTRUCTION
from memory import TipEntry, TipMemory, tip_block
from rollout import (ChatStream, ContextBudgetError, Episode, check_first_turn, check_prompt_budget, full_history_turn,
                     pair_up, run_episodes, tips_before)

SANITY = SanityConfig(families=["lab"], max_steps=3, train_variations=2, test_variations=1)
# The reference's naive action instruction, typos included (its add_instruction.py, as docs/scienceworld.md quotes).
REFERENCE_NAIVE = ("You could try to explore different actions, especially when you are not sure what the best action "
                   "for your current observation.\nPlease response with only one line with one sentence, following the "
                   "possible action format shown above. No extra words are allowed.")


def scienceworld(**overrides):
    from envs.scienceworld.env import ScienceWorldEnv

    env = object.__new__(ScienceWorldEnv)  # no JVM: only the config is read
    env.cfg = ScienceWorldConfig(**overrides)
    return env


def test_scienceworld_closes_every_turn_with_the_whole_naive_instruction():
    assert NAIVE_INSTRUCTION == REFERENCE_NAIVE
    on, off = scienceworld(), scienceworld(turn_reminder=False)
    assert on.answer_instruction() == "\n\n" + REFERENCE_NAIVE == on.turn_reminder()
    assert "explore different actions" in on.turn_reminder()
    assert off.turn_reminder() == "" and off.answer_instruction() == "\n\n" + REFERENCE_NAIVE


def test_scienceworld_step_zero_puts_the_tips_before_the_naive_instruction():
    """The reference's first user message: observation + "\n" + instruction prompt, then the tip block wrapped as
    "\n\n<tip> {header + memories}\n</tip>\n\n", then "\n\n" + the naive instruction (docs/algorithm.md 5.4)."""
    env = scienceworld()
    first = "You are in the kitchen.\nYour task is to boil water." + env.answer_instruction()
    block = tip_block([TipEntry(tip="Use the stove.", action="activate stove", ret=50.0)])
    assert tips_before(first, block, env.answer_instruction()) == (
        "You are in the kitchen.\nYour task is to boil water."
        "\n\n<tip> Here are some memories you collected in your previous exploration:\n"
        "Use the stove.; At that timestep, the specific action your took was activate stove; "
        "Eventually you got the score 50.0/100.\n\n</tip>\n\n" + "\n\n" + REFERENCE_NAIVE)
    assert tips_before(first, "", env.answer_instruction()) == first
    with pytest.raises(ValueError, match="answer instruction"):
        tips_before("a first message without it", block, env.answer_instruction())


def test_step_zero_on_the_chat_template_has_the_tips_then_the_instruction():
    """full_history_turn's step-0 delta is SmolLM2's chat template of the first message with the block spliced in
    before its closing instruction; the tip-free twin is the template of the message as the environment wrote it."""
    from infra.models import SMOLLM2_ALIAS, load_tokenizer, resolve_model_path

    tokenizer = load_tokenizer(resolve_model_path(SMOLLM2_ALIAS))
    chat = ChatStream(tokenizer)
    env = SanityEnv(SANITY)
    task = env.tasks("train")[0]
    first = env.reset(task)
    closing = "\nRespond with exactly one command from the list, no other words."
    assert env.answer_instruction() == closing and first.endswith(closing)
    block = tip_block([TipEntry(tip="Connect the wire first.", action="connect the red wire", ret=100.0)])
    ep = Episode(task=task, group=0, mode="on_policy_tips")
    delta, twin, context = full_history_turn(chat, ep, first, block, "", [], env.answer_instruction())

    def template(text):
        return render_episode(tokenizer, [text], [])[0]  # apply_chat_template, independently of ChatStream

    assert delta == template(first[:-len(closing)] + block + closing) == context
    assert twin == template(first)
    shown = tokenizer.decode(delta)
    assert shown.index("</tip>") < shown.index(RESPOND) and shown.count(RESPOND) == 1


def user_turns(chat: ChatStream, ids: list[int]) -> list[str]:
    """The user messages of a ChatML stream, in order."""
    text = chat.tokenizer.decode(ids)
    return [part.split("<|im_end|>")[0] for part in text.split("<|im_start|>user\n")[1:]]


@pytest.mark.slow
def test_every_user_turn_ends_with_the_instruction_after_its_tips(policy):
    model, tokenizer = policy
    chat = ChatStream(tokenizer)
    envs = [SanityEnv(SANITY) for _ in range(2)]
    task = envs[0].tasks("train")[0]
    memory = TipMemory(capacity=10, top_k=2)
    memory.add(task.key, TipEntry(tip="Try the red lamp first.", action="turn on the red lamp", ret=50.0, state=""))
    torch.manual_seed(0)
    cfg = RolloutConfig(max_action_tokens=6, max_prompt_tokens=4000)
    episodes = run_episodes(model, chat, pair_up(envs, [task, task]), mode="off_policy", memory=memory, cfg=cfg)
    reminder = "\n" + RESPOND
    for ep in episodes:
        for context in [s.ids for s in ep.steps]:
            turns = user_turns(chat, context)
            for turn in turns:  # every turn: observation (and its tip block), then the answer instruction last
                assert turn.endswith(reminder) and turn.count(RESPOND) == 1
                if "<tip>" in turn:
                    assert turn.index("</tip>") < turn.index(RESPOND)
        twin_turns = user_turns(chat, ep.ids)  # the tip-free stream
        assert len(twin_turns) == ep.num_actions and all(t.endswith(reminder) for t in twin_turns)
        assert all("<tip>" not in t for t in twin_turns)
    assert any("<tip>" in t for ep in episodes for t in user_turns(chat, ep.steps[-1].ids if ep.steps else ep.ids))
    first_turns = [user_turns(chat, ep.steps[0].ids if ep.steps else ep.ids)[0] for ep in episodes]
    assert all("<tip>" in turn for turn in first_turns)  # step 0 showed the tip, before the instruction


@pytest.mark.slow
def test_the_budget_check_counts_the_reminder_of_every_later_turn(policy):
    _, tokenizer = policy
    chat = ChatStream(tokenizer)
    env = SanityEnv(SANITY)
    task = env.tasks("train")[0]
    first = len(chat.first_turn(env.reset(task)))
    per_turn = len(chat.encode(env.turn_reminder()))
    assert per_turn > 5
    fits = first + 3 * 6 + 2 * per_turn  # 3 actions of 6 tokens, 2 later turns with a reminder
    check_first_turn(task, first, 3, RolloutConfig(max_action_tokens=6, max_prompt_tokens=fits), per_turn)
    with pytest.raises(ContextBudgetError, match="reminder"):
        check_first_turn(task, first, 3, RolloutConfig(max_action_tokens=6, max_prompt_tokens=fits - 1), per_turn)
    with pytest.raises(ContextBudgetError):  # the run-level check measures the environment's reminder itself
        check_prompt_budget(chat, env, [task], RolloutConfig(max_action_tokens=6, max_prompt_tokens=fits - 1))
    check_prompt_budget(chat, env, [task], RolloutConfig(max_action_tokens=6, max_prompt_tokens=fits))
