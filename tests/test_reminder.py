"""The answer instruction next to the generation point (Env.turn_reminder): every user turn after the first ends
with the environment's reminder, after the turn's tips, in the stream the model saw and in its tip-free twin; the
context budget counts it. Sanity env (no JVM) with the real CPU policy; ScienceWorld's reminder text by itself."""
import pytest
import torch

from config import RolloutConfig
from envs.sanity import RESPOND, SanityConfig, SanityEnv
from envs.scienceworld.config import ScienceWorldConfig
from envs.scienceworld.prompts import FORMAT_REMINDER, NAIVE_INSTRUCTION
from memory import TipEntry, TipMemory
from rollout import ChatStream, ContextBudgetError, check_first_turn, check_prompt_budget, run_episodes

SANITY = SanityConfig(families=["lab"], max_steps=3, train_variations=2, test_variations=1)


def test_scienceworld_reminder_is_the_instructions_format_line():
    from envs.scienceworld.env import ScienceWorldEnv

    assert FORMAT_REMINDER == ("Please response with only one line with one sentence, following the possible action "
                               "format shown above. No extra words are allowed.")
    assert NAIVE_INSTRUCTION.endswith(FORMAT_REMINDER)
    on, off = object.__new__(ScienceWorldEnv), object.__new__(ScienceWorldEnv)  # no JVM: only the config is read
    on.cfg, off.cfg = ScienceWorldConfig(), ScienceWorldConfig(turn_reminder=False)
    assert on.turn_reminder() == "\n\n" + FORMAT_REMINDER and off.turn_reminder() == ""


def user_turns(chat: ChatStream, ids: list[int]) -> list[str]:
    """The user messages of a ChatML stream, in order."""
    text = chat.tokenizer.decode(ids)
    return [part.split("<|im_end|>")[0] for part in text.split("<|im_start|>user\n")[1:]]


@pytest.mark.slow
@pytest.mark.parametrize("placement", ["current_turn", "history"])
def test_every_later_user_turn_ends_with_the_reminder_after_its_tips(policy, placement):
    model, tokenizer = policy
    chat = ChatStream(tokenizer)
    envs = [SanityEnv(SANITY) for _ in range(2)]
    task = envs[0].tasks("train")[0]
    memory = TipMemory(capacity=10, top_k=2)
    memory.add(task.key, TipEntry(tip="Try the red lamp first.", action="turn on the red lamp", ret=50.0, state=""))
    torch.manual_seed(0)
    cfg = RolloutConfig(max_action_tokens=6, max_prompt_tokens=4000, tip_placement=placement)
    episodes = run_episodes(model, chat, envs, [task, task], [0, 0], mode="off_policy", memory=memory, cfg=cfg)
    reminder = "\n" + RESPOND
    for ep in episodes:
        seen = [s.ids for s in ep.steps] if placement == "current_turn" else [ep.ids]
        for context in seen:
            turns = user_turns(chat, context)
            assert turns[0].count(RESPOND) == 1  # the first message has the instruction once, no reminder added
            for turn in turns[1:]:  # later turns: observation, tip block, then the reminder last
                assert turn.endswith(reminder) and turn.count(RESPOND) == 1
                if "<tip>" in turn:
                    assert turn.index("</tip>") < turn.index(RESPOND)
        twin_turns = user_turns(chat, ep.twin_ids)
        assert len(twin_turns) == ep.num_actions and all(t.endswith(reminder) for t in twin_turns[1:])
        assert all("<tip>" not in t for t in twin_turns)
    assert any("<tip>" in t for ep in episodes for t in user_turns(chat, ep.steps[-1].ids if ep.steps else ep.ids))


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
