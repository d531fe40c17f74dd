"""Batched multi-turn rollouts with HF `generate` and tip writing (paper §4, Algorithm 1 L5-21).

One iteration's rollout (docs/algorithm.md):
* the mode is drawn ONCE per iteration (`draw_mode`): no_memory 0.75, on_policy_tips 0.08, off_policy 0.17;
* B task rows x N episodes run in lockstep: all live episodes go into ONE batched `generate` call per step (capped at
  `rollout.generation_batch_size`), then all environments step in threads; with `rollout.kv_reuse` each episode
  keeps its KV cache between turns and a step feeds only its new tokens (engine.generation.EpisodeCaches owns the
  caches and makes each step's call); an episode is a `Play` (environment, task, group, seed): with a seed it
  samples from its own streams (`Episode.seed`), so its actions do not depend on the rest of the batch;
* in memory modes the tips retrieved for the current observation are appended to that step's user message as a
  `<tip>` block of the current turn only, the paper's pi(a | s_t, u, tips_t) (`Episode`'s "current_turn" layout;
  samples.py says which context each mode learns in);
* a task whose first message leaves no room for its episode stops the run (`check_prompt_budget`, `check_first_turn`);
* after every training episode the policy writes a one-sentence tip (`write_tips`); tips are never trained on.
  `rollout.tip_source: environment` is an ablation, not the paper: the environment's own tip (`Env.oracle_tip`);
  `oracle`: the sanity lab's per-state tips (`Env.oracle_entries`), stored at their states (docs/sanity.md);
* with `intrinsic.coef` > 0 each step earns the novelty bonus 1/n of the state it reached (`advantages.pay_novelty`,
  called by the trainer once every rank's visits of the iteration are counted, so n does not depend on the number
  of ranks).

Token streams (docs/decisions.md). An episode is recorded token-in/token-out: every context the model was given, and
what it generated, is kept as ids, never re-tokenised before the update: `Episode.ids` in the "packed" layout
(no-memory episodes), each step's own prompt in `Episode.steps` in the "current_turn" layout (where `ids` is the
tip-free stream) and the "window" layout. Conversations are append-only, so with full history
(`rollout.history_window: -1`) an episode is ONE sequence scored in one forward pass. The tip-free stream
(`Episode.ids`; a step's `StepPrompt.twin_ids`) is built from the same message deltas WITHOUT the tip blocks (never
by deleting ids afterwards, the reference's bug); the off-policy update scores the actions in that context. With a history window (k >= 0, WebShop
style) each step is its own prompt and its own sample, with a tip and a tip-free prompt.

Deviations: the tip is written from the episode's with-tip stream plus one user turn holding the final observation
and the tip prompt (the reference sends them as two user messages, its tips as plain text without tags); with a
history window the tip sees the whole trajectory (`trajectory_text`), not the last window; the intrinsic reward is a
real novelty count (memory.py).
"""
from __future__ import annotations

import itertools
import random
import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from config import MODES, TIP_TEMPERATURE, ConfigError, MemoryConfig, RolloutConfig
from envs.base import Env, Task
from engine.generation import ChatStream, EpisodeCaches, generate
from engine.kvcache import PrefixCache, supports_kv_reuse
from memory import TipMemory, clean_tip, oracle_tip_entries, tip_block, tip_entries
from infra.runtime import derive_seed

# The released (grammar-fixed) version of the paper's App. B tip-generation prompt.
TIP_PROMPT = (
    "Thanks for playing. Now you have ended a trajectory and collect some meaningless or valuable information "
    "from the interactions with the environment. Please summarize the trajectory, and also summarize what "
    "information you get from this trajectory, and how far this trajectory is from fully completing the task. "
    "Please respond with only one sentence with only one line, do not include any extra words. "
    "Your sentence should be less than 100 words."
)


def draw_mode(memory_cfg: MemoryConfig, seed: int, iteration: int) -> str:
    """One mode per iteration, identical on every rank (seeded by seed and iteration only)."""
    if not memory_cfg.enabled:
        return "no_memory"
    u = random.Random(derive_seed(seed, "mode", iteration)).random()
    for mode, p in memory_cfg.mode_probabilities().items():
        if u < p:
            return mode
        u -= p
    return MODES[-1]  # u within rounding of 1


@dataclass
class StepPrompt:
    """One step's own prompt (with its tips) and its tip-free twin, then the action sampled from it."""

    ids: list[int]
    twin_ids: list[int]
    action_ids: list[int]


@dataclass
class Episode:
    """One played episode, token-in/token-out, in one of three layouts (samples.py turns each into training samples):

    * "packed": one append-only stream `ids`, what the model saw (no-memory episodes: no tips, so it is also the
      tip-free stream the off-policy update would score);
    * "current_turn": tips only in the current turn (memory modes, the paper's pi(a | s_t, u, tips_t)): `ids` is the
      tip-free stream and every step keeps its own prompt in `steps` = that stream + the turn with its tips;
    * "window": one self-contained StepPrompt per step (rollout.history_window >= 0, WebShop); `ids` stays empty.
    """

    task: Task
    group: int  # episodes with the same group id form one GRPO group
    mode: str
    layout: str = "packed"
    # The full-history stream, tip-free in every layout: what the model saw ("packed"), or the history each step's
    # prompt in `steps` extends with its own tips ("current_turn"); empty in the "window" layout.
    ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1 on generated action tokens
    steps: list[StepPrompt] = field(default_factory=list)  # "window" and "current_turn" layouts
    observations: list[str] = field(default_factory=list)  # observation before each action
    actions: list[str] = field(default_factory=list)  # raw model outputs
    rewards: list[float] = field(default_factory=list)  # what the environment paid, per step
    intrinsic: list[float] = field(default_factory=list)  # novelty bonus 1/n per step (0 until pay_novelty pays it)
    # The state the episode started in, then the one each step reached (None: the environment crashed): what the
    # novelty bonus counts (pay_novelty).
    states: list[str | None] = field(default_factory=list)
    anchors: list[str] = field(default_factory=list)  # GiGPO anchor before each action: env.anchor_state() or the obs
    penalties: list[float] = field(default_factory=list)  # invalid-action penalty per step (info["penalty"]; in rewards)
    corrected: list[bool] = field(default_factory=list)  # the env had to correct the action, or penalised it
    # Per step: log pi of each action token in the context it was sampled in (engine.generation.RowSampler), None where
    # not recorded: the old log-probs of every sample trained in that context (samples.py), without a second forward.
    action_logps: list[list[float] | None] = field(default_factory=list)
    tips_retrieved: list[int] = field(default_factory=list)
    tips_shown: list[str] = field(default_factory=list)  # the tip block of each step's prompt ('' = none)
    final_observation: str = ""
    success: bool = False
    score: float | None = None  # the environment's own score at the end (WebShop: 100 x task reward, penalties aside)
    end: str = ""  # "" = still playing | "done" (the environment ended it) | cut: "steps" | "context" | "env_error"
    tip: str = ""  # the policy's tip (rollout.tip_source=environment: the environment's, set when the episode ends)
    oracle: list[tuple[str, str]] = field(default_factory=list)  # tip_source=oracle: (state, tip) pairs, at the end
    seed: int | None = None  # this episode's own sampling stream (step t: derive_seed(seed, "step", t)); None: global
    kv_cache: PrefixCache | None = field(default=None, repr=False)  # kept for the tip (rollout.kv_reuse)

    def extend(self, ids: list[int], action: bool) -> None:
        """Append to the full-history stream (action tokens are masked in)."""
        self.ids += ids
        self.mask += [int(action)] * len(ids)

    def add_prompt(self, ids: list[int], twin_ids: list[int]) -> None:
        """Record the prompt of a new step (its tip and tip-free versions)."""
        if self.layout == "window":
            self.steps.append(StepPrompt(ids=ids, twin_ids=twin_ids, action_ids=[]))
            return
        if self.layout == "current_turn":  # this step's context: the tip-free history + the turn with its tips
            self.steps.append(StepPrompt(ids=self.ids + ids, twin_ids=self.ids + twin_ids, action_ids=[]))
            ids = twin_ids  # the stream keeps no tips
        self.extend(ids, action=False)

    def add_action(self, action_ids: list[int], logp: list[float] | None = None) -> None:
        """Record the generated action ids of the current step (the same ids in both streams) and, if recorded,
        their log-probs in the context they were sampled in."""
        self.action_logps.append(logp)
        if self.steps:
            self.steps[-1].action_ids = action_ids
        if self.layout != "window":
            self.extend(action_ids, action=True)

    @property
    def last_action_ids(self) -> list[int]:
        """The ids of the last action (to close its turn): the stream's last run of action tokens."""
        if self.steps:
            return self.steps[-1].action_ids
        end = len(self.mask)
        while end and not self.mask[end - 1]:
            end -= 1
        start = end
        while start and self.mask[start - 1]:
            start -= 1
        return self.ids[start:end]

    @property
    def truncated(self) -> str:
        """Why the episode was cut ("steps", "context", "env_error"); "" when it ended by itself or still plays."""
        return "" if self.end == "done" else self.end

    @property
    def extrinsic_return(self) -> float:
        """The environment's return: the sum of its rewards (ScienceWorld: the final score)."""
        return float(sum(self.rewards))

    @property
    def num_actions(self) -> int:
        return len(self.actions)


def generate_actions(model, chat: ChatStream, contexts: list[list[int]], caches=None, **kwargs) -> list[list[int]]:
    """engine.generation.generate with the chat's pad and eos ids (caches: per-row PrefixCache list, or None)."""
    return generate(model, chat.pad_id, chat.eos_id, contexts, caches=caches, **kwargs)


def cache_needed(ep: Episode, env: Env, step: int, keep_caches: bool) -> bool:
    """Whether an episode's KV cache is used after step `step`'s call: by its tip (keep_caches; a window-layout
    tip sees the whole trajectory, not the cached window) or by a next turn, which the environment's step limit
    rules out at the last step. Not kept, it is not split out of the batch (an episode that ends earlier, done by
    the environment, is known only after the call: its copy is dropped then)."""
    if keep_caches and ep.layout != "window":
        return True
    limit = env.step_limit(ep.task)
    return limit <= 0 or step + 1 < limit


def row_seeds(episodes: list[Episode], *parts) -> list[int] | None:
    """One generation seed per episode from its own seed (None when the episodes sample from the global stream)."""
    return None if any(ep.seed is None for ep in episodes) else [derive_seed(ep.seed, *parts) for ep in episodes]


def tips_before(text: str, block: str, instruction: str) -> str:
    """`text` with the tip block inserted before `instruction`, the text that closes it (Env.answer_instruction):
    the reference's order, tips and then the answer instruction. `instruction` "" appends the block."""
    if not text.endswith(instruction):
        raise ValueError(f"the message does not end with the environment's answer instruction {instruction!r}")
    return text[:len(text) - len(instruction)] + block + instruction


def full_history_turn(chat: ChatStream, ep: Episode, observation: str, block: str, reminder: str,
                      prefix: list[int], instruction: str = ""):
    """(prompt delta, tip-free delta, model context) for the next turn of an append-only episode. The first message
    is the environment's, its tip block before `instruction` (Env.answer_instruction, which closes it); a later
    user turn is observation + tip block + `reminder` (Env.turn_reminder). Then the generation prompt and `prefix`
    (rollout.action_prefix's ids: the start of the assistant's answer). With the "current_turn" layout `ep.ids` is
    tip-free, so the context holds only this turn's tips."""
    if not ep.ids:
        delta = chat.first_turn(tips_before(observation, block, instruction))
        twin_delta = chat.first_turn(observation)
    else:
        closing = chat.close_action(ep.last_action_ids)
        delta = closing + chat.next_turn(observation + block + reminder)
        twin_delta = closing + chat.next_turn(observation + reminder)
    delta, twin_delta = delta + prefix, twin_delta + prefix
    return delta, twin_delta, ep.ids + delta


class ContextBudgetError(ConfigError):
    """A task's first message leaves no room for its episode within rollout.max_prompt_tokens."""


def check_first_turn(task: Task, first: int, step_limit: int, cfg: RolloutConfig, reminder: int = 0) -> None:
    """Stop before playing when the tip-free first message (`first` tokens) + step_limit actions of
    max_action_tokens, each followed by the per-turn reminder (`reminder` tokens), cannot fit: such a run would
    otherwise produce near-empty "context"-truncated episodes and learn from nothing."""
    steps = max(1, step_limit)
    need = first + steps * cfg.max_action_tokens + (steps - 1) * reminder
    if need > cfg.max_prompt_tokens:
        raise ContextBudgetError(
            f"task {task.key}: the first message is {first} tokens; with {steps} actions of up to "
            f"{cfg.max_action_tokens} tokens (and a {reminder}-token reminder per later turn) an episode needs at "
            f"least {need} > rollout.max_prompt_tokens="
            f"{cfg.max_prompt_tokens}. Raise rollout.max_prompt_tokens (the model's context allows it?) or shorten "
            f"the first message (e.g. fewer demos)")


def check_prompt_budget(chat: ChatStream, env: Env, tasks: list[Task], cfg: RolloutConfig) -> None:
    """check_first_turn for every task a run will play, before the first iteration (one reset each)."""
    if cfg.history_window >= 0:  # a window prompt does not grow with the episode
        return
    reminder = len(chat.encode(env.turn_reminder()))
    for task in dict.fromkeys(tasks):
        check_first_turn(task, len(chat.first_turn(env.reset(task))), env.step_limit(task), cfg, reminder)


def window_turn(chat: ChatStream, env: Env, window: int, block: str, reminder: str, prefix: list[int],
                instruction: str = ""):
    """(prompt, tip-free prompt, model context) of a history-window step: a fresh one-turn conversation, its tips
    and then the answer instruction last (the reference's order: before `instruction`, which closes the step-0
    message, or before `reminder`, appended to a later one), then `prefix` (rollout.action_prefix's ids)."""
    text = env.window_prompt(window)
    delta = chat.first_turn(tips_before(text, block, instruction) + reminder) + prefix
    return delta, chat.first_turn(text + reminder) + prefix, delta


def kv_reuse_enabled(model, cfg: RolloutConfig) -> bool:
    """rollout.kv_reuse, unless the model has sliding-window layers (then re-encode, with a warning)."""
    if cfg.kv_reuse and not supports_kv_reuse(model):
        warnings.warn("rollout.kv_reuse: this model has sliding-window attention layers; re-encoding every turn")
        return False
    return cfg.kv_reuse


@dataclass(frozen=True)
class Play:
    """One episode to play: `env` plays `task` in GRPO group `group`, sampling from its own streams `seed`
    (engine.generation.RowSampler; None: torch's global stream)."""

    env: Env
    task: Task
    group: int = 0
    seed: int | None = None


def pair_up(envs: list[Env], tasks: list[Task], groups: list[int] | None = None, seeds: list[int] | None = None
            ) -> list[Play]:
    """envs[i] plays tasks[i], in group groups[i] (default 0), from seed seeds[i] (default None)."""
    if len(envs) < len(tasks):
        raise ValueError(f"{len(tasks)} episodes need one environment each; got {len(envs)}")
    return [Play(env, task, groups[i] if groups else 0, seeds[i] if seeds else None)
            for i, (env, task) in enumerate(zip(envs, tasks))]


def run_episodes(model, chat: ChatStream, plays: list[Play], *, mode: str, memory: TipMemory | None,
                 cfg: RolloutConfig, keep_caches: bool = False, progress=None) -> list[Episode]:
    """Play every `Play` in lockstep at `cfg.temperature`: per step retrieve each live episode's tips (memory modes)
    and build its turn -> one batched generate -> step the environments (threads) -> record.

    Every episode records the states it visited (`Episode.states`) for the novelty bonus, which the caller pays
    (`advantages.pay_novelty`). keep_caches: leave each episode's KV cache on `Episode.kv_cache` for `write_tips`
    (with rollout.kv_reuse; otherwise a cache is freed when its episode ends). progress: a tqdm bar (live steps)."""
    if not plays:
        return []
    check_tip_source(plays[0].env, cfg.tip_source)
    use_tips = mode != "no_memory" and memory is not None
    layout = "window" if cfg.history_window >= 0 else "current_turn" if use_tips else "packed"
    episodes = [Episode(task=p.task, group=p.group, mode=mode, layout=layout, seed=p.seed) for p in plays]
    envs = [p.env for p in plays]
    caches = EpisodeCaches(model, chat, len(plays), kv_reuse_enabled(model, cfg), cfg.generation_batch_size)
    prefix = chat.encode(cfg.action_prefix) if cfg.action_prefix else []  # in the context, never trained
    with ThreadPoolExecutor(max_workers=len(plays)) as pool:  # environments wait (a JVM, a web shop): threads
        observations = list(pool.map(lambda p: p.env.reset(p.task), plays))
        first_observations = list(observations)
        reached: list[list[str | None]] = [[] for _ in plays]  # the state after each step (None: env crashed)
        for step in itertools.count():
            # ---- retrieve each live episode's tips and build its turn
            turns = {i: next_turn(chat, envs[i], ep, observations[i], first_observations[i],
                                  memory if use_tips else None, cfg, step, prefix)
                     for i, ep in enumerate(episodes) if not ep.end}
            live = [i for i, context in turns.items() if context is not None]
            if not live:
                break
            # ---- one batched generate call for every live episode
            logps: list = []  # behaviour log-probs of every sampled token: the update's old log-probs (samples.py)
            actions = caches.generate(live, [turns[i] for i in live],
                                      [cache_needed(episodes[i], envs[i], step, keep_caches) for i in live],
                                      max_new_tokens=cfg.max_action_tokens, temperature=cfg.temperature,
                                      top_p=cfg.top_p, seeds=row_seeds([episodes[i] for i in live], "step", step),
                                      logprobs=logps)
            logps += [None] * (len(actions) - len(logps))  # nothing recorded (e.g. a scripted generator): recompute
            for i, action_ids, logp in zip(live, actions, logps):
                episodes[i].add_action(action_ids, logp)
                episodes[i].actions.append((cfg.action_prefix + chat.decode(action_ids)).strip())
            # ---- step the environments and record what they said
            results = list(pool.map(lambda i: envs[i].step(episodes[i].actions[-1]), live))
            for i, result in zip(live, results):
                observations[i] = record_step(episodes[i], envs[i], result, reached[i], cfg.tip_source)
                if episodes[i].end and not keep_caches:
                    caches.drop(i)
            if progress is not None:
                progress.set_postfix(step=step + 1, live=len(live))
    for ep, cache, first, states in zip(episodes, caches.caches, first_observations, reached):
        ep.kv_cache = cache if keep_caches else None
        ep.states, ep.intrinsic = [first] + states, [0.0] * len(ep.rewards)
    return episodes


def check_tip_source(env: Env, tip_source: str) -> None:
    """Refuse before anything is played when the environment writes no tips (rollout.tip_source: environment) or
    has no oracle (oracle)."""
    if tip_source == "environment":
        env.oracle_tip()
    if tip_source == "oracle":
        env.oracle_entries()


def next_turn(chat: ChatStream, env: Env, ep: Episode, observation: str, first_observation: str,
              memory: TipMemory | None, cfg: RolloutConfig, step: int, prefix: list[int]) -> list[int] | None:
    """Retrieve this turn's tips (none without `memory`), build the turn and record its prompt in `ep`; the context
    to generate from, or None (ep.end = "context") when it leaves no room for an action."""
    retrieved = [] if memory is None else memory.retrieve(ep.task.key, observation, first_observation, cfg.tip_format)
    # tips are model-written: no special tokens in a prompt
    block = chat.plain(tip_block(retrieved, cfg.tip_format))
    # the answer instruction comes last: it closes the first message, a reminder closes each later turn
    reminder = env.turn_reminder() if step > 0 else ""
    instruction = env.answer_instruction() if step == 0 else ""
    if cfg.history_window >= 0:
        delta, twin_delta, context = window_turn(chat, env, cfg.history_window, block, reminder, prefix, instruction)
    else:
        delta, twin_delta, context = full_history_turn(chat, ep, observation, block, reminder, prefix, instruction)
        if step == 0:  # the tip-free first message: stop before playing an episode that cannot fit
            check_first_turn(ep.task, len(twin_delta), env.step_limit(ep.task), cfg,
                             len(chat.encode(env.turn_reminder())))
    if len(context) + cfg.max_action_tokens > cfg.max_prompt_tokens:
        ep.end, ep.final_observation = "context", observation
        return None
    ep.add_prompt(delta, twin_delta)
    ep.tips_retrieved.append(len(retrieved))
    ep.tips_shown.append(block)
    ep.observations.append(observation)
    ep.anchors.append(env.anchor_state() or observation)
    return context


def record_step(ep: Episode, env: Env, result: tuple, reached: list, tip_source: str) -> str:
    """Record one environment step (`Env.step`'s (observation, reward, done, info)) in `ep`, and the state it
    reached in `reached` (None after a crash); at the end, the environment's tip or oracle entries. Returns the
    observation."""
    obs, reward, done, info = result
    ep.rewards.append(float(reward))
    ep.penalties.append(float(info.get("penalty", 0.0)))
    ep.corrected.append(bool(info.get("corrected") or info.get("penalty")))
    reached.append(None if info.get("env_error") else obs)
    ep.success, ep.score = bool(info.get("success", False)), info.get("score", ep.score)
    if done:
        ep.final_observation = obs
        ep.end = "env_error" if info.get("env_error") else "steps" if info.get("truncated") else "done"
        if tip_source == "environment":
            ep.tip = env.oracle_tip()
        if tip_source == "oracle":
            ep.oracle = env.oracle_entries()
    return obs


def trajectory_text(ep: Episode, observation_chars: int) -> str:
    """A history-window episode as one message for its tip: its first message (the task), then every action (its
    <think> part dropped) and the observation it led to, each observation cut to its first `observation_chars`."""
    lines = [ep.observations[0], "", "Your actions and what followed:"]
    for t, (action, obs) in enumerate(zip(ep.actions, ep.observations[1:] + [ep.final_observation]), 1):
        action = re.sub(r"<think>.*?</think>", "", action, flags=re.S).strip()
        obs = obs if len(obs) <= observation_chars else obs[:observation_chars] + " ..."
        lines.append(f"Action {t}: {action}\nObservation {t}: {obs}")
    return "\n".join(lines)


def tip_context(chat: ChatStream, ep: Episode, budget: int = 1 << 30) -> list[int]:
    """The episode as the model saw it + one user turn with the final observation and the tip prompt. A window-
    layout episode saw only its last window: it gets its whole trajectory instead (trajectory_text), observations
    cut shorter until the context fits `budget` tokens, so the reflection sees the first search query too."""
    if ep.layout == "window" and ep.observations:
        chars = 400
        while True:
            ids = chat.first_turn(trajectory_text(ep, chars) + "\n\n" + TIP_PROMPT)
            if len(ids) <= budget or chars == 0:
                return ids
            chars //= 2
    history = ep.steps[-1].ids + ep.steps[-1].action_ids if ep.steps else ep.ids
    if not history:
        return chat.first_turn(ep.final_observation + "\n\n" + TIP_PROMPT)
    return history + chat.close_action(ep.last_action_ids) + chat.next_turn(ep.final_observation + "\n\n" + TIP_PROMPT)


def write_tips(model, chat: ChatStream, episodes: list[Episode], memory: TipMemory | None, cfg: RolloutConfig,
               max_score: float = 100.0) -> dict[str, float]:
    """The policy reflects on each episode (one batched generate) into `ep.tip`; `tip_entries(ep, max_score)` are
    staged in `memory` (None: the caller stores them). An episode's KV cache (run_episodes(keep_caches=True)) is
    reused: only the tip turn is encoded, then freed. Tips are sampled at config.TIP_TEMPERATURE (the reference's)."""
    todo = [ep for ep in episodes if ep.num_actions > 0]
    # a window-layout tip context is the whole trajectory, not the cached last window: nothing to reuse
    caches = [None if ep.layout == "window" else ep.kv_cache for ep in todo] if kv_reuse_enabled(model, cfg) else None
    for ep in episodes:
        ep.kv_cache = None
    if not todo:
        return {"tips_written": 0.0, "tips_empty": 0.0}
    if cfg.tip_source == "oracle":  # the lab's oracle: one entry per (state, tip) pair, at that state; no generation
        for ep in todo:
            ep.tip = ep.oracle[0][1] if ep.oracle else ""
            for entry in oracle_tip_entries(ep, max_score) if memory is not None else ():
                memory.stage(ep.task.key, entry)
        written = sum(bool(ep.oracle) for ep in todo)
        return {"tips_written": float(written), "tips_empty": float(len(todo) - written)}
    if cfg.tip_source == "environment":  # the ablation: no generation, the environment's tip (set by run_episodes)
        tips = [ep.tip for ep in todo]
    else:  # only the first line is kept (clean_tip): stop there; the caches are dropped after this call: no split
        budget = cfg.max_prompt_tokens - cfg.tip_max_tokens
        outputs = generate_actions(model, chat, [tip_context(chat, ep, budget) for ep in todo], caches,
                                   max_new_tokens=cfg.tip_max_tokens, temperature=TIP_TEMPERATURE,
                                   batch_size=cfg.generation_batch_size, seeds=row_seeds(todo, "tip"),
                                   keep_caches=False, stop=chat.first_line_stop())
        tips = [chat.plain(chat.decode(ids)) for ids in outputs]
    empty = 0
    for ep, text in zip(todo, tips):
        ep.tip = clean_tip(text)
        empty += not ep.tip
        for entry in tip_entries(ep, max_score) if memory is not None else ():
            memory.stage(ep.task.key, entry)
    return {"tips_written": float(len(todo) - empty), "tips_empty": float(empty)}
