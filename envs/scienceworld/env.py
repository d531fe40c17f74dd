"""ScienceWorldEnv: ScienceWorld behind the EMPO² Env interface (one instance = one JVM). Details and the latency
table: docs/scienceworld.md.

* Splits: ``tasks("train")`` = the first ``train_variations`` of ScienceWorld's training split of every task,
  ``tasks("test")`` = the first <= ``test_variations`` of its test split. Repeating rows is the trainer's business.
* First message: initial look-around + "\\n" + `prompts.build_instruction` + `answer_instruction()` ("\\n\\n" +
  `prompts.NAIVE_INSTRUCTION`; a step-0 tip block goes before it, as in the reference). Every later user turn ends
  with the same "\\n\\n" + naive instruction (`turn_reminder`, after the turn's tips), as the reference's last user
  message does; deviation: earlier turns keep theirs (append-only conversations, docs/decisions.md), where the
  reference moves it to the newest message, rewriting the prompt.
* Reward = change of ScienceWorld's score. The baseline is 0, not the initial score (find-*: 8), so the initial part
  is paid with the first reward and the rewards sum to the final score. A negative score (failure; ScienceWorld
  does not set its completion flag then) or a score >= 100 ends the episode. Score, completion and moves come from
  the server object (cheap getters), not from the package's ``step``, which builds many strings per call.
* Limits: ``max_steps`` actions (``max_steps_per_task`` overrides; the reference's off-by-one allows one more) or
  more than ``ENV_STEP_LIMIT`` (100) ScienceWorld moves end the episode with ``truncated``.
* Action correction. Deviation, for speed (the valid-action list costs several plain steps; timings:
  docs/scienceworld.md): the reference fetches the list every step; we first send the cleaned raw text and fetch
  the list only when ScienceWorld answers "No known action matches that input." / "Unknown action. ...", then send
  the most similar valid action (`prompts.best_match`). So a parseable action not in the list is executed as
  ScienceWorld reads it, and an "Unknown action" answer has already cost one move. With correction off, a
  not-understood action is a no-op step.
* Ambiguity prompts ("Ambiguous request: ...", numbered options) are answered with the number of the most similar
  option (ties -> "0", as ScienceWorld's gold agent does), up to 3 nested, then a blank answer cancels.
* ``window_prompt(k)``: the first message, then the last k (cleaned model action, observation) pairs.
* Robustness: a JVM error (`jvm.env_errors`) in ``step`` ends the episode with ``info["env_error"]`` and a fresh
  JVM; ``reset`` restarts and retries once. One lock per instance (calls serialise); instances run in parallel.

Extras beyond envs.base.Env: ``gold_actions(task)``, ``valid_actions()``, ``demos(name)``, ``history``,
``first_message``, ``jvm_pid``, ``restarts``, ``max_steps_for(name)``; step info adds ``raw_action``,
``corrected`` and ``moves``.
"""
from __future__ import annotations

import logging
import re
import threading

from envs.base import Env, Task, history_window_prompt

from . import demos as demo_cache
from .config import ScienceWorldConfig
from .jvm import JvmHost, env_errors
from .prompts import NAIVE_INSTRUCTION, best_match, build_instruction, clean_action, task_description

logger = logging.getLogger(__name__)

NO_MATCH = "No known action matches that input."
UNKNOWN_ACTION_PREFIX = "Unknown action."
AMBIGUOUS_PREFIX = "Ambiguous request"
CRASH_OBSERVATION = "The environment process crashed and was restarted; this episode is over."
SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                   "noElectricalAction")  # ScienceWorld 1.2.3 (get_possible_simplifications() + "easy")

_OPTION_RE = re.compile(r"^\s*(\d+):\s*(.*)$")
ENV_STEP_LIMIT = 100  # ScienceWorld's own move limit (the package's envStepLimit default)


class ScienceWorldEnv(Env):
    """ScienceWorld behind the EMPO² Env interface. See the module docstring for behaviour and deviations."""

    # (train, dev, test variation ids, number of variations) per task, shared by all instances of the process
    _split_lock = threading.Lock()
    _split_cache: dict[str, tuple[list[int], list[int], list[int], int]] = {}

    def __init__(self, cfg: ScienceWorldConfig | None = None, host: JvmHost | None = None,
                 env_step_limit: int = ENV_STEP_LIMIT):
        """host: a JVM shared with other environments (`shared_hosts`); None = a JVM of its own. env_step_limit:
        ScienceWorld moves after which an episode is truncated (the latency benchmark raises it)."""
        self.cfg = cfg or ScienceWorldConfig()
        self.env_step_limit = env_step_limit
        self._lock = threading.RLock()
        self._host = host or JvmHost(self.cfg.java_heap_mb, self.cfg.call_timeout_s)
        self._token = self._host.register()
        self._server_obj = None  # this environment's PythonInterface (its world) in the host's JVM
        self._generation = 0  # the host JVM it lives in
        self._loaded: tuple[str, int, str] | None = None  # what the JVM has loaded (task, variation, simplification)
        self._task: Task | None = None
        self._first_message = ""
        self._history: list[tuple[str, str]] = []
        self._score = 0
        self._steps = 0
        self._done = True
        self._last_info: dict = {}
        self._closed = False
        self.restarts = 0
        try:
            for name in self.cfg.tasks:
                self._check_task(name)
            with self._turn():
                self._start_jvm()
                for name in self.cfg.tasks:  # validates the names and fills the split cache before any episode
                    self._splits(name)
        except BaseException:
            self._release()
            self._host.unregister(self._token)
            raise

    # ------------------------------------------------------------------ JVM

    def _turn(self):
        """Hold this environment's JVM for a sequence of calls (its world's globals swapped in when shared)."""
        return self._host.session(self._token)

    def _start_jvm(self) -> None:
        self._server_obj, self._generation = self._host.server(self._token)
        self._loaded = None

    def _release(self) -> None:
        self._server_obj, self._loaded = None, None

    def _restart(self) -> None:
        logger.warning("ScienceWorld JVM failed; starting a new one")
        self.restarts += 1
        self._host.failed(self._generation)  # a shared JVM that another environment already replaced stays
        self._release()
        self._start_jvm()

    @property
    def jvm_pid(self) -> int | None:
        """The process id of this env's JVM (None when none is running or the env is closed)."""
        return self._host.pid if self._server_obj is not None else None

    @property
    def _server(self):
        """This environment's PythonInterface object (py4j proxy); starts a JVM when none is running."""
        if self._server_obj is None:
            self._start_jvm()
        return self._server_obj

    def _load(self, name: str, variation: int, gold: bool = False) -> None:
        """Load (task, variation) into the JVM; a loaded task starts from its initial state."""
        err = self._server.load(str(name), int(variation), self.cfg.simplification, bool(gold))
        if err:
            self._loaded = None
            raise RuntimeError(f"ScienceWorld load({name}, {variation}) failed: {err}")
        self._loaded = None if gold else (name, variation, self.cfg.simplification)

    # ------------------------------------------------------------------ tasks, splits, demos

    def _check_task(self, name: str) -> None:
        """Raise ValueError for an unknown task or simplification (no JVM needed). The server itself accepts any
        simplification string and only fails at the first step, so we check as the package's load() does."""
        from scienceworld.constants import ID2TASK

        known = list(ID2TASK.values())
        if name not in known:
            raise ValueError(f"unknown ScienceWorld task {name!r}; known: {known}")
        parts = [p for p in self.cfg.simplification.split(",") if p]
        unknown = [p for p in parts if p not in SIMPLIFICATIONS]
        if unknown:
            raise ValueError(f"unknown ScienceWorld simplification(s) {unknown}; known: {list(SIMPLIFICATIONS)}")
        if ("power-component" in name or "conductivity" in name) and "noElectricalAction" in parts:
            raise ValueError(f"task {name!r} needs electrical actions; remove noElectricalAction")

    def _splits(self, name: str) -> tuple[list[int], list[int], list[int], int]:
        """(train, dev, test variation ids, number of variations) of a task, cached per process."""
        with ScienceWorldEnv._split_lock:
            cached = ScienceWorldEnv._split_cache.get(name)
        if cached is not None:
            return cached
        self._check_task(name)
        self._load(name, 0)
        splits = (
            [int(v) for v in self._server.getVariationsTrain()],
            [int(v) for v in self._server.getVariationsDev()],
            [int(v) for v in self._server.getVariationsTest()],
            int(self._server.getTaskMaxVariations(name)),
        )
        with ScienceWorldEnv._split_lock:
            ScienceWorldEnv._split_cache[name] = splits
        return splits

    def tasks(self, split: str) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        with self._lock, self._turn():
            out = []
            for name in self.cfg.tasks:
                train, _, test, _ = self._splits(name)
                ids = train[: self.cfg.train_variations] if split == "train" else test[: self.cfg.test_variations]
                out.extend(Task(name, v) for v in ids)
            return out

    def demos(self, name: str) -> list[str]:
        """The few-shot transcripts for task `name` (generated once per process / cache directory)."""
        if self.cfg.num_demos <= 0:
            return []
        with self._lock, self._turn():  # the host before the cache's lock, always in this order
            return demo_cache.cached_demos(self.cfg, name, lambda: self._generate_demos(name))

    def _generate_demos(self, name: str) -> tuple[list[str], list[int]]:
        """Replay ScienceWorld's gold path on held-out training (then dev) variations."""
        train, dev, _, _ = self._splits(name)
        demos = demo_cache.generate_demos(
            self._server, lambda variation: self._load(name, variation, gold=True), name,
            train[self.cfg.train_variations:] + dev, self.cfg.num_demos, self.cfg.demo_max_steps,
        )
        self._loaded = None
        return demos

    def gold_actions(self, task: Task) -> list[str]:
        """ScienceWorld's gold action sequence for `task` (slow: seconds for long tasks). Ends the current episode."""
        with self._lock, self._turn():
            self._done = True
            self._load(task.name, task.variation, gold=True)
            return [str(a) for a in self._server.getGoldActionSequence()]

    def max_steps_for(self, name: str) -> int:
        return int(self.cfg.max_steps_per_task.get(name, self.cfg.max_steps))

    def step_limit(self, task: Task) -> int:
        return self.max_steps_for(task.name)

    def answer_instruction(self) -> str:
        return "\n\n" + NAIVE_INSTRUCTION

    def turn_reminder(self) -> str:
        return self.answer_instruction() if self.cfg.turn_reminder else ""

    # ------------------------------------------------------------------ episodes

    def reset(self, task: Task) -> str:
        with self._lock, self._turn():
            if self._closed:
                raise RuntimeError("reset() on a closed ScienceWorldEnv")
            for attempt in (0, 1):
                try:
                    return self._reset(task)
                except env_errors() as err:
                    if attempt:
                        raise RuntimeError(f"ScienceWorld reset failed twice: {err}") from err
                    self._restart()
        raise AssertionError("unreachable")

    def _reset(self, task: Task) -> str:
        _, _, _, n_variations = self._splits(task.name)
        if not 0 <= task.variation < n_variations:
            raise ValueError(f"{task.name} has variations 0..{n_variations - 1}, got {task.variation}")
        demos = self.demos(task.name)
        server = self._server
        if self._loaded == (task.name, task.variation, self.cfg.simplification):
            server.reset()
        else:
            self._load(task.name, task.variation)
        observation = str(server.step("look around"))
        description = task_description(str(server.freeActionTaskDesc()))
        inventory = str(server.freeActionInventory())
        self._task = task
        self._first_message = (
            observation.strip() + "\n" + build_instruction(demos, description, inventory) + self.answer_instruction()
        )
        self._history = []
        # Baseline 0, not the initial score: some tasks start above 0 (find-*: 8, some paint variations: 13-20), and
        # that part is paid with the first step's reward so that sum(rewards) == the final score.
        self._score = 0
        self._steps = 0
        self._done = False
        self._last_info = self._info(action="", env_error="")
        return self._first_message

    def _info(self, *, action: str, env_error: str, truncated: bool = False, **extra) -> dict:
        info = {
            "score": float(self._score),
            "success": self._score >= 100,
            "truncated": truncated,
            "env_error": env_error,
            "action": action,
        }
        info.update(extra)
        return info

    def _send(self, action: str) -> str:
        """One server step, resolving ambiguity prompts; returns the observation and sets self._executed."""
        server = self._server
        observation = str(server.step(action))
        executed = action
        for _ in range(3):
            if not observation.startswith(AMBIGUOUS_PREFIX):
                break
            options = []
            for line in observation.splitlines()[1:]:
                m = _OPTION_RE.match(line)
                if m:
                    options.append((m.group(1), m.group(2).strip()))
            if not options:
                break
            number, executed = options[best_match(action, [text for _, text in options])]
            observation = str(server.step(number))
        else:
            if observation.startswith(AMBIGUOUS_PREFIX):
                observation = str(server.step(""))  # blank answer cancels the prompt
        self._executed = executed
        return observation

    @staticmethod
    def _not_understood(observation: str) -> bool:
        return observation.startswith(NO_MATCH) or observation.startswith(UNKNOWN_ACTION_PREFIX)

    def step(self, action) -> tuple[str, float, bool, dict]:
        with self._lock, self._turn():
            if self._task is None:
                raise RuntimeError("step() called before reset()")
            if self._closed:
                raise RuntimeError("step() on a closed ScienceWorldEnv")
            cleaned = clean_action(action)
            if self._done:  # the episode has ended: no JVM call, nothing changes
                return "The episode is over.", 0.0, True, dict(self._last_info, action="")
            corrected = False
            try:
                observation = self._send(cleaned)
                if self.cfg.action_correction and self._not_understood(observation):
                    valid = self._valid_actions()
                    if valid:
                        choice = valid[best_match(cleaned, valid)]
                        observation = self._send(choice)
                        corrected = True
                server = self._server
                score = int(round(100 * server.getScore()))
                completed = bool(server.getCompleted())
                moves = int(server.getNumMoves())
            except env_errors() as err:
                return self._crashed(cleaned, f"{type(err).__name__}: {err}".strip())
            reward = float(score - self._score)
            self._score = score
            self._steps += 1
            done = completed or score >= 100 or score < 0
            truncated = False
            if not done and (self._steps >= self.max_steps_for(self._task.name) or moves > self.env_step_limit):
                done = truncated = True
            self._done = done
            info = self._info(action=self._executed, env_error="", truncated=truncated, raw_action=cleaned,
                              corrected=corrected, moves=moves)
            self._history.append((cleaned, observation))
            self._last_info = info
            return observation, reward, done, info

    def _crashed(self, cleaned: str, message: str) -> tuple[str, float, bool, dict]:
        """End the episode after a JVM error, with a fresh JVM (or none: reset() will start one)."""
        try:
            self._restart()
        except Exception as restart_err:  # reset() will try again
            logger.error("ScienceWorld restart failed: %s", restart_err)
            self._release()
        self._steps += 1
        self._done = True
        info = self._info(action=cleaned, env_error=message or "ScienceWorld error", raw_action=cleaned,
                          corrected=False)
        self._history.append((cleaned, CRASH_OBSERVATION))
        self._last_info = info
        return CRASH_OBSERVATION, 0.0, True, info

    def _valid_actions(self) -> list[str]:
        # The list call returns the actions sorted, like the package's info["valid"] that the reference uses, so
        # ties in the similarity choice go to the same (alphabetically first) action.
        return [str(a) for a in self._server.getValidActionObjectCombinations()]

    def valid_actions(self) -> list[str]:
        """ScienceWorld's valid actions in the current state (costly: ScienceWorld builds every combination)."""
        with self._lock, self._turn():
            return self._valid_actions()

    # ------------------------------------------------------------------ prompts

    @property
    def first_message(self) -> str:
        return self._first_message

    @property
    def history(self) -> list[tuple[str, str]]:
        """(cleaned model action, observation) pairs of the current episode."""
        return list(self._history)

    def window_prompt(self, window: int) -> str:
        with self._lock:
            if self._task is None:
                raise RuntimeError("window_prompt() called before reset()")
            return history_window_prompt(self._first_message, self._history, window)

    # ------------------------------------------------------------------ cleanup

    def close(self) -> None:
        with self._lock:
            if not self._closed:
                self._closed = True
                self._release()
                self._host.unregister(self._token)  # the host's last environment stops its JVM

    def __del__(self):
        try:
            if not getattr(self, "_closed", True):
                self.close()
        except Exception:
            pass


def shared_hosts(cfg: ScienceWorldConfig, size: int) -> list[JvmHost]:
    """The host of each of `size` environments: `cfg.jvms` shared JVMs, environment i on JVM i % jvms (so the N
    episodes of a group, which sit next to each other, are spread over the JVMs). -Xmx grows with the environments
    a JVM serves."""
    count = max(1, min(cfg.jvms, size))
    per_jvm = -(-size // count)
    heap = cfg.java_heap_mb * per_jvm if cfg.java_heap_mb > 0 else 0
    hosts = [JvmHost(heap, cfg.call_timeout_s) for _ in range(count)]
    return [hosts[i % count] for i in range(size)]

