"""The environment interface every EMPO² environment implements.

It is deliberately tiny so the rollout loop (rollout.py) stays environment-agnostic:

    env.tasks(split)        -> list[Task]          ("train" / "test")
    env.reset(task)         -> str                 the first user message (task instruction + first observation)
    env.step(action)        -> (observation, reward, done, info)
    env.window_prompt(k)    -> str                 one self-contained user message for history-window mode
    env.anchor_state()      -> str                 optional: the current observation without task-specific text
                                                   (GiGPO's anchor state; "" = use the observation as is)
    env.answer_instruction()-> str                 optional: the text that closes the first message ("" = none);
                                                   a step-0 tip block goes before it (the reference's order)
    env.turn_reminder()     -> str                 optional: text the rollout appends to every user turn after
                                                   the first, after its tips ("" = none): the answer instruction
                                                   next to the generation point, as the reference keeps it
    env.close()

`info` always carries these keys (rollout.py relies on them):

    score      float  cumulative task score so far (ScienceWorld: 0..100, -100 on failure)
    success    bool   the task is solved (ScienceWorld: score == 100; WebShop: reward == 1.0)
    truncated  bool   the episode ended because the per-task step limit was reached
    env_error  str    "" normally; a message when the environment process crashed (the env has
                      restarted itself; the episode is ended and marked, the run goes on)
    action     str    the action actually executed (after action correction, if enabled)

Optional keys (absent means 0 / not applicable):

    penalty    float  the invalid-action penalty applied at this step (already subtracted from the returned
                      reward; WebShop: `invalid_action_penalty` for a malformed output, else 0.0). GiGPO adds it
                      back to separate it: verl-agent charges it to that step's sample only (advantages.py).

An environment may add more keys (for example `valid_actions`).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass


@dataclass(frozen=True, order=True)
class Task:
    """One task instance: a task family plus a variation (ScienceWorld) or a goal index (WebShop)."""

    name: str
    variation: int

    @property
    def key(self) -> str:
        """The memory key of this task (tips and novelty counts are stored per key)."""
        return f"{self.name}/{self.variation}"


STEP_INFO_KEYS = ("score", "success", "truncated", "env_error", "action")


def jaccard(a: str, b: str) -> float:
    """Word-set Jaccard similarity of two texts (case-insensitive; two empty texts are identical).

    The one text similarity of the project: ScienceWorld's action correction picks the valid action closest to the
    model's output with it, and the tip memory's optional similarity filter compares observations with it."""
    words_a, words_b = set(a.lower().split()), set(b.lower().split())
    if not words_a and not words_b:
        return 1.0
    return len(words_a & words_b) / len(words_a | words_b)


def history_window_prompt(first_message: str, history: list[tuple[str, str]], window: int) -> str:
    """The ScienceWorld-style window prompt: the first message, then the last `window` (action, observation) pairs of
    `history`, the newest observation labelled as the current one. Shared by the text-world environments."""
    if not history:
        return first_message
    k = max(0, int(window))
    shown = history[-k:] if k else []
    parts = [first_message, ""]
    if shown:
        parts.append(f"Your most recent {len(shown)} of {len(history)} actions and what followed:")
        for action, obs in shown[:-1]:
            parts.append(f"Action: {action}\nObservation: {obs.strip()}")
        parts.append(f"Action: {shown[-1][0]}")
    parts.append(f"Current observation: {history[-1][1].strip()}")
    return "\n".join(parts)


class Env(abc.ABC):
    """Base class of all environments. Subclasses implement the four abstract methods."""

    @abc.abstractmethod
    def tasks(self, split: str) -> list[Task]:
        """The task instances of a split ("train" or "test")."""

    @abc.abstractmethod
    def reset(self, task: Task) -> str:
        """Start an episode of `task`; return the first user message (instruction + observation)."""

    @abc.abstractmethod
    def step(self, action: str) -> tuple[str, float, bool, dict]:
        """Execute one raw model action; return (observation, reward, done, info)."""

    def window_prompt(self, window: int) -> str:
        """The current state as one self-contained user message showing at most `window` past
        (action, observation) pairs. Used when `rollout.history_window >= 0` (one sample per step)."""
        raise NotImplementedError(f"{type(self).__name__} does not support history-window prompts")

    def answer_instruction(self) -> str:
        """The text that closes every first message reset() returns (a suffix of it; "" = none). The rollout puts a
        step-0 tip block before it, so the answer instruction comes last, as the reference orders them."""
        return ""

    def turn_reminder(self) -> str:
        """Appended to every user turn after the first (after the turn's tip block); "" = nothing."""
        return ""

    def anchor_state(self) -> str:
        """GiGPO's anchor state: the current observation (before the next action) without task-specific text such
        as the instruction, so equal pages of different steps compare equal. "" (the default) means "no anchor of
        its own: use the observation as is"."""
        return ""

    def oracle_tip(self) -> str:
        """rollout.tip_source=environment (an ablation): a tip about the episode just played, written from what the
        environment's feedback revealed ("" = nothing was revealed). Environments without one refuse."""
        raise NotImplementedError(f"{type(self).__name__} writes no tips of its own: rollout.tip_source=environment "
                                  "is an ablation of the sanity environment (env.name=sanity)")

    def oracle_entries(self) -> list[tuple[str, str]]:
        """rollout.tip_source=oracle: (state, command) pairs of the episode just played, one per step where a tip
        helps: the observation a step was played at and the command needed there. Environments without one refuse."""
        raise NotImplementedError(f"{type(self).__name__} has no oracle: rollout.tip_source=oracle is a setting of "
                                  "the sanity environment's lab (env.name=sanity)")

    def max_score(self) -> float:
        """The best return of an episode on the reward's own scale (a tip shows its return out of it)."""
        return 100.0

    def step_limit(self, task: Task) -> int:
        """Most actions an episode of `task` may take (0 = unknown); bounds the context an episode can need."""
        return 0

    def close(self) -> None:
        """Release external resources (processes, files)."""
