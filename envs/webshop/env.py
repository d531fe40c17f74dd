"""WebShopEnv: the project's `Env` interface over the in-process WebShop engine (no HTTP).

Maps to docs/webshop.md §7 (verl-agent / EMPO² setup; the EMPO² paper's WebShop prompt, App. B):
  * tasks: Task("webshop", i) = synthetic goal i ("webshop-human" with goal_source="human");
    test = goals [0, test_goals), train = the rest (verl-agent: 0-499 / 500+).
  * the model answers "<think>...</think><action>...</action>"; the action is the text inside the
    first <action> tag (lower-cased by the engine; surrounding quotes/commas stripped). The output
    is malformed when the tag is missing, the <think> block is missing (`require_think`) or it
    contains CJK characters (verl-agent's check). A malformed output costs
    `invalid_action_penalty`; if it still contains a bare `search[...]`/`click[...]` that action is
    executed, otherwise nothing happens. A well-formed but illegal action is WebShop's no-op
    (reward 0, page unchanged). Nothing raises.
  * training reward, returned by `step` at "buy now" (0 on every other step, minus the penalty):
      reward_mode="score"   -> 100 x task reward (0..100, the same scale as ScienceWorld's score)
      reward_mode="success" -> 10 x (task reward == 1.0) (verl-agent's binary reward)
    info["score"] = 100 x task reward of the purchase (0 before buying), info["success"] =
    (task reward == 1.0), info["truncated"] = max_steps reached without buying, info["penalty"] = the
    invalid-action penalty of this step (0.0 when well-formed; already in the returned reward).
  * prompts (`prompt: paper`; `short` ends with a one-line action instruction and examples instead, for
    small CPU models): `window_prompt(k)` renders the paper's template with the last k (observation, action)
    pairs; with no history (step 0, or k = 0) it renders verl-agent's no-history variant (the same
    text without the history sentences); longer than MAX_PROMPT_CHARS (13,000) -> no-history variant.
    `reset` returns the step-0 rendering; `step` returns the new observation + admissible actions
    as one message (for append-only use; no step counter, so equal states give equal text).
  * observation shown to the model: the [SEP] text with everything up to and including the
    instruction removed and each segment wrapped in single quotes (verl-agent style); in the
    history each past observation is quoted once more and the action is lower-cased, as
    verl-agent's WebshopEnvironmentManager writes "[Observation n: '<obs>', Action n: '<act>']".
  * admissible actions: "search[<your query>]" with a search bar, then "click[x]" for every
    clickable in page order, click[search] included (verl-agent's format_avail_actions).
  * `anchor_state()`: the current page as shown (without the instruction) - verl-agent's GiGPO
    anchor (WebshopEnvironmentManager's format_obs), so the start page and a revisited search page
    are the same anchor state.
"""
from __future__ import annotations

import re

from envs.base import Env, Task

from .config import WebShopConfig
from .engine import WebShopEngine
from .goals import split_indices
from .world import World, load_world

PROMPT_HEAD = (
    "You are an expert autonomous agent operating in the WebShop e-commerce environment. "
    "Your task is to: {task}. "
)
PROMPT_HISTORY = (
    "Prior to this step, you have already taken {step_count} step(s). Below are the most recent "
    "{history_length} observations and the corresponding actions you took: {history} "
    "You are now at step {current_step} and your current observation is: {observation}. "
)
PROMPT_NO_HISTORY = "Your current observation is: {observation}. "
PROMPT_TAIL = (
    "Your admissible actions of the current situation are: [{actions}]. "
    "Now it's your turn to take one action for the current step. You should first reason step-by-step "
    "about the current situation, then think carefully which admissible action best advances the "
    "shopping goal. This reasoning process MUST be enclosed within <think></think> tags. Once you've "
    "finished your reasoning, you should choose an admissible action for current step and present it "
    "within <action></action> tags."
)

# env.webshop.prompt: short (a CPU setting: SmolLM2-135M never writes the paper's <think>/<action> format)
PROMPT_TAIL_SHORT = (
    "Your admissible actions of the current situation are: [{actions}]. "
    "Reply with exactly one admissible action inside <action></action> tags and nothing else, for example "
    "<action>search[red cotton t-shirt]</action> or <action>click[buy now]</action>."
)

MAX_PROMPT_CHARS = 13000  # a longer history prompt falls back to the no-history template
_ACTION_TAG = re.compile(r"<action>(.*?)</action>", re.DOTALL | re.IGNORECASE)
_THINK_TAG = re.compile(r"<think>.*?</think>", re.DOTALL | re.IGNORECASE)
_BARE_ACTION = re.compile(r"(?:search|click)\[[^\[\]]+\]", re.IGNORECASE)
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af]")


def parse_model_output(text: str, require_think: bool = True) -> tuple[str | None, bool]:
    """(action or None, well_formed). Never raises."""
    if not isinstance(text, str):
        return None, False
    tags = _ACTION_TAG.findall(text)
    well_formed = bool(tags) and not _CJK.search(text) and (bool(_THINK_TAG.search(text)) or not require_think)
    if tags:
        action = tags[0].strip().strip("'\"`").rstrip(",.").strip().strip("'\"`").strip()
        return (action or None), well_formed and bool(action)
    bare = _BARE_ACTION.findall(text)
    return (bare[-1].strip() if bare else None), False


def format_observation(segments: list[str], instruction: str) -> str:
    """Drop everything up to and including the instruction; quote each remaining segment."""
    instruction = " ".join(instruction.split())  # segments are whitespace-normalised
    if instruction in segments:
        segments = segments[segments.index(instruction) + 1:]
    return " [SEP] ".join(f"'{s}'" for s in segments)


def format_actions(actions: list[str]) -> str:
    return "\n" + "\n".join(f"'{a}'," for a in actions) + "\n" if actions else ""


class WebShopEnv(Env):
    """In-process WebShop. Instances are cheap: the world (products, goals, index) is shared."""

    def __init__(self, config: WebShopConfig | None = None, world: World | None = None):
        self.config = config or WebShopConfig()
        self.config.validate()
        self.world = world or load_world(self.config)
        self.engine = WebShopEngine(self.world)
        self.task_name = "webshop-human" if self.config.goal_source == "human" else "webshop"
        self.task: Task | None = None
        self.history: list[tuple[str, str]] = []  # (observation shown, action taken) per step
        self.steps = 0
        self.finished = True
        self._last_info: dict = {}

    # ------------------------------------------------------------------ Env interface

    def tasks(self, split: str) -> list[Task]:
        return [Task(self.task_name, i) for i in split_indices(len(self.world.goals), split, self.config.test_goals)]

    def reset(self, task: Task) -> str:
        if task.name != self.task_name:
            raise ValueError(f"task {task.key!r}: this env serves {self.task_name!r} goals")
        self.engine.reset(task.variation)
        self.task, self.history, self.steps, self.finished = task, [], 0, False
        self._last_info = self._info("", well_formed=True, legal=True, truncated=False)
        return self.window_prompt(0)

    def step(self, action: str) -> tuple[str, float, bool, dict]:
        if self.task is None:
            raise RuntimeError("call reset(task) before step()")
        if self.finished:
            return self._step_message(), 0.0, True, dict(self._last_info, env_error="", penalty=0.0)
        parsed, well_formed = parse_model_output(action, self.config.require_think)
        shown = self.current_observation()
        legal = False
        if parsed is not None:
            legal = self.engine.step(parsed)[3]["legal"]
        self.steps += 1
        # the history shows the action as executed: lower-cased, like verl-agent's projection
        self.history.append((shown, parsed.lower() if parsed is not None else "(no valid action)"))
        reward = 0.0
        if self.engine.done:
            task_reward = self.engine.reward
            reward = 100.0 * task_reward if self.config.reward_mode == "score" else 10.0 * (task_reward == 1.0)
        if not well_formed:
            reward -= self.config.invalid_action_penalty
        truncated = not self.engine.done and self.steps >= self.config.max_steps
        self.finished = self.engine.done or truncated
        self._last_info = self._info(parsed or "", well_formed, legal, truncated)
        return self._step_message(), reward, self.finished, self._last_info

    def window_prompt(self, window: int, max_chars: int = MAX_PROMPT_CHARS) -> str:
        """The one-turn prompt with the last `window` steps (-1 = all); a history prompt longer than `max_chars`
        characters falls back to the no-history template."""
        observation = self.current_observation()
        k = len(self.history) if window < 0 else min(window, len(self.history))
        tail = (PROMPT_TAIL if self.config.prompt == "paper" else PROMPT_TAIL_SHORT).format(
            actions=format_actions(self.admissible_actions()))
        head = PROMPT_HEAD.format(task=self.engine.instruction)
        short = head + PROMPT_NO_HISTORY.format(observation=observation) + tail
        if k <= 0:
            return short
        start = len(self.history) - k
        # verl-agent quotes each past observation (whose segments are already quoted) and action
        history = "\n".join(
            f"[Observation {start + i + 1}: '{obs}', Action {start + i + 1}: '{act}']"
            for i, (obs, act) in enumerate(self.history[start:])
        )
        full = (head
                + PROMPT_HISTORY.format(step_count=len(self.history), history_length=k, history=history,
                                        current_step=len(self.history) + 1, observation=observation)
                + tail)
        return full if len(full) <= max_chars else short

    def max_score(self) -> float:
        """A perfect purchase's reward: 100 (reward_mode score) or 10 (success), penalties aside."""
        return 100.0 if self.config.reward_mode == "score" else 10.0

    def anchor_state(self) -> str:
        """The page before the next action without the instruction (what the model sees as its observation)."""
        return self.current_observation()

    def close(self) -> None:
        self.task = None

    # ------------------------------------------------------------------ helpers

    def current_observation(self) -> str:
        return format_observation(self.engine.segments(), self.engine.instruction)

    def admissible_actions(self) -> list[str]:
        return [] if self.finished else self.engine.admissible_actions()

    def _step_message(self) -> str:
        # no step counter here: equal states give equal text (rollout.py counts novelty on it)
        return (f"Your current observation is: {self.current_observation()}. Your admissible actions of the "
                f"current situation are: [{format_actions(self.admissible_actions())}].")

    def _info(self, action: str, well_formed: bool, legal: bool, truncated: bool) -> dict:
        task_reward = self.engine.reward if self.engine.done else 0.0
        return {
            "score": 100.0 * task_reward,
            "success": self.engine.done and task_reward == 1.0,
            "truncated": truncated,
            "env_error": "",
            "action": action,
            "admissible_actions": self.admissible_actions(),
            "well_formed": well_formed,
            "penalty": 0.0 if well_formed else self.config.invalid_action_penalty,
            "legal": legal,
            "task_reward": task_reward,
            "reward_info": dict(self.engine.reward_info),
            "page": self.engine.page,
            "goal_index": self.engine.goal_index,
        }
