"""ScienceWorld environment for EMPO² (one instance = one ScienceWorld JVM).

What this reproduces (docs: empo2.md §4.1 / §6.1, environment-facts.md §2-3)
-------------------------------------------------------------------------------
* **Tasks / splits** (empo2.md §6.1): ``tasks("train")`` = the first ``train_variations`` (5) variations of
  ScienceWorld's *training* split of every configured task (identify-life-stages-2 has only 4);
  ``tasks("test")`` = the first <= ``test_variations`` (20) variations of ScienceWorld's *test* split
  (power-component has 5). The reference repeats rows (x64 / x4); repetition is the trainer's business.
* **Simplification** ``"easy"`` by default (teleport, open doors, self-watering pots, no electrical actions except on
  the electrical tasks; ScienceWorld applies the exception itself).
* **First user message** (empo2.md §4.1 message layout): ``initial observation + "\\n" + instruction prompt``. The
  instruction prompt quotes the reference wording, typos included ("Here is 2 examples:", "pickup OBJ" although
  ScienceWorld's verb is "pick up"), the action-format line, the 'look around' hint, the inventory and the
  "Important! You can only use FOCUS actions on these items: ..." lines, whose items come from a regex for
  "focus on X" over the task description (case-insensitive, a leading "the " dropped, duplicates removed).
* **Naive action instruction** (quoted, "Please response ..." typo kept) is appended ONCE, to the first user message,
  after ``"\\n\\n"`` (project decision 2 in decisions.md: append-only conversations). The reference appends it to the
  *last* user message of every turn instead.
* **Few-shot demos**: the reference ships two fixed hand-picked gold transcripts per task. We build ours from
  ScienceWorld's own gold action sequence (``load(..., generateGoldPath=True)``, ``get_gold_action_sequence()``),
  replayed to record the observations, on training-split variations that are *not* among the first
  ``train_variations`` used for training (then the dev split when the training split is too small, e.g.
  identify-life-stages-2). A demo whose replay does not reach score 100 (gold generation is not fully deterministic
  in the temperature tasks) is skipped and the next candidate variation is tried. Format::

      Task Description: <task description>
      User: <initial look-around observation>
      Assistant: <gold action 1>
      User: <observation 1>
      ...

  The demos are separated by a blank line (the reference layout has one newline between them).
  ``demo_max_steps > 0`` keeps only the first N (action, observation) pairs of each demo (CPU quickstart). Demos are
  cached in-process (class-level dict, lock-protected, one generator per key at a time) and on disk as JSON under
  ``$EMPO2_CACHE/scienceworld_demos/`` (default ``~/.cache/empo2/scienceworld_demos/``; ``demo_cache_dir``
  overrides), written atomically (temp file + ``os.replace``). The cache key is (task, simplification, num_demos,
  demo_max_steps, train_variations, scienceworld version): ``train_variations`` decides which variations are held
  out for demos, so it is part of the key.
* **Reward** = change of the ScienceWorld score since the previous step, so the sum of an episode's rewards is its
  final score in [-100, 100]. Some tasks start above 0 (find-*: 8 after the initial look-around; some paint
  variations 13-20); that part is added to the first step's reward (the package's ``step`` would drop it from the
  rewards, since its reset consumes it). A negative score (failure, e.g. focusing on a wrong object; ScienceWorld
  sets -100) ends the episode; so does completion (``info["success"]`` = score >= 100).
* **Episode limit**: ``max_steps`` (30, paper App. D.2) actions, or ``max_steps_per_task[task]``; reaching it ends
  the episode with ``info["truncated"] = True``. The reference's per-task json uses 60 for chemistry-mix and 120 for
  measure-melting-point-known-substance (set them via ``max_steps_per_task`` to match), and its off-by-one allows
  max_steps + 1 actions; we allow exactly ``max_steps``. ScienceWorld's own move limit (``env_step_limit``, 100
  moves; "look around" is free, "wait1" counts 2) also ends the episode as truncated.
* **Action correction** (reference: ``use_action_correction``, word-set Jaccard to the closest valid action).
  Deviation, for speed: the reference first fetches the valid-action list every step and corrects any action not in
  it. Building that list costs 20-40 ms (up to ~200 ms in rooms with ~1,600 valid actions), the raw server step
  ~1-10 ms, so we first **try the cleaned raw text**; only when ScienceWorld answers "No known action matches that
  input." or "Unknown action. ..." do we fetch the valid actions and execute the one with the highest word-set
  Jaccard similarity (ties -> the first in ScienceWorld's list, as ``max`` does). Consequences: a parseable action
  that is not in the valid list (e.g. "Look Around", "go to kitchen" from far away) is executed as ScienceWorld
  understands it instead of being replaced; an "Unknown action" answer (the parser matched a template but not the
  object, e.g. "go kitchen") already consumed one ScienceWorld move (a world tick) before the corrected action runs.
  Cleaning (both modes): the first non-empty line of the output, surrounding quotes/backticks and a leading
  "Assistant:" / "Action:" label removed, whitespace collapsed, lower-cased, trailing ``.!?;:,`` removed, capped at
  300 characters (so empty / huge / unicode / multi-line outputs never raise). An output with no word in common with
  any valid action (e.g. empty) is mapped to ScienceWorld's alphabetically first valid action, as the reference's
  ``max`` over all-zero similarities does. With correction off an action
  ScienceWorld does not understand is a no-op: the observation is ScienceWorld's message, reward 0, and it still
  counts towards ``max_steps``.
* **Ambiguity prompts** ("Ambiguous request: Please enter the number ...", numbered options, e.g. "open door" or
  "pick up orange" when two oranges are visible): resolved automatically in both modes by answering the number of
  the option with the highest word-set Jaccard similarity to the cleaned action (ties -> the lowest number, i.e. "0",
  as ScienceWorld's gold agent does); up to 3 nested prompts, then a blank answer cancels. The returned observation is
  the answer to the resolved action and ``info["action"]`` is the chosen option's text. Leaving the prompt pending
  would make every non-numeric next action fail with "Unknown action" (and consume a move).
* **History window** (``window_prompt(k)``): the first user message, then the last k (action, observation) pairs;
  the observation of the most recent step is labelled as the current observation. Actions are shown as the cleaned
  model output (record_original_action), not the corrected action.

Speed (our own measurement, 2-vCPU dev VM shared with other jobs, load average 1-2.5, so noisy; warm JVM; gold
actions of variation 0 replayed 3x, ``python -m envs.scienceworld --bench TASK``):

    =====================================================  ===============  ===============  ===============
    median (p90) per step, ms                              power-component  find-animal      use-thermometer
    =====================================================  ===============  ===============  ===============
    valid action, correction on (raw try, no listing)      8-12 (15-27)     8-10 (15-25)     5-6 (8-12)
    misspelled action -> listing + Jaccard + re-step       54-80 (100-180)  41-51 (80-107)   26-31 (47-72)
    the package's full ``ScienceWorldEnv.step``            52-77 (70-210)   36-66 (71-137)   20-50 (42-117)
    =====================================================  ===============  ===============  ===============

    The valid-action list has ~100-1,600 entries (1,611 in power-component's workshop) and costs 20-150 ms; the
    ScienceWorld step itself is most of the remaining time. reset of the loaded task 40-300 ms, of another
    task/variation (load) 30-120 ms; JVM start 1.2-2.5 s. The first reset of a task without cached demos adds gold
    generation + replay: 0.4-1.7 s for most of the 18 paper tasks, 4.3 s chemistry-mix-paint-secondary-color, 9 s
    chemistry-mix (later resets read the in-process or disk cache). First-message sizes with 2 full demos: 3.4k
    (lifespan-*) to 14.9k characters (chemistry-mix, identify-life-stages-2).
Score and completion come from ``server.getScore()`` / ``server.getCompleted()`` (~0.05 ms each) on the JVM's
``PythonInterface`` object, not from the package's ``step``, which also builds look / inventory / task / valid-action
strings on every call. Note: ScienceWorld's failure (score -100) does *not* set its completion flag; we end the
episode on a negative score ourselves (as the package's ``step`` does).

Extras beyond envs.base.Env: ``gold_actions(task)`` (ScienceWorld's gold sequence; ends the current episode),
``valid_actions()``, ``demos(task_name)``, ``history`` / ``first_message`` (current episode), ``jvm_pid``,
``restarts`` (JVM restarts so far), ``max_steps_for(task_name)``; step info also carries ``raw_action`` (the
cleaned model text first tried), ``corrected`` (bool) and ``moves`` (ScienceWorld's move counter).

Robustness
----------
* A py4j / socket error (the JVM died, was killed, or raised) makes ``step`` return
  ``(message, 0.0, True, info)`` with ``info["env_error"] = "<ExceptionType: message>"`` and ``truncated`` False; the
  env has already started a new JVM by then (or will at the next ``reset``). ``reset`` retries once after a restart.
* Threads: each instance holds a lock, so one instance may be used from several threads (calls serialise); distinct
  instances run in parallel (one JVM each). Class-level caches (demos, splits) are lock-protected.
* Memory: each JVM is launched with ``-Xmx{java_heap_mb}m`` (default 512; measured RSS ~370 MB per env;
  ``java_heap_mb: 0`` = the JVM default, 0.6-1 GB RSS). Deviation from "set JAVA_TOOL_OPTIONS": we pass the flag on
  the java command line (py4j ``launch_gateway(javaopts=...)``, our own ~15-line launcher equivalent to the
  package's constructor), so no process-wide environment variable is changed and JVMs can be started in parallel
  threads; when the user has set ``JAVA_TOOL_OPTIONS`` we add nothing, so their settings apply.
* A JVM call slower than ``call_timeout_s`` (py4j socket read timeout, default 300 s) is treated as a crash.
* py4j logs a traceback for every call into a dead JVM (on the root logger, which also makes logging install a
  default stderr handler if none exists); at import we add a root-logger filter that drops exactly those py4j
  records, and set the "py4j" logger to CRITICAL unless the application configured it.
"""
from __future__ import annotations

import json
import logging
import os
import re
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

from envs.base import Env, Task

logger = logging.getLogger(__name__)

if logging.getLogger("py4j").level == logging.NOTSET:
    logging.getLogger("py4j").setLevel(logging.CRITICAL)


class _DropPy4JRootTracebacks(logging.Filter):
    """py4j reports a dead JVM with ``logging.exception(...)`` on the *root* logger (a full traceback per call);
    we handle those errors ourselves, so drop exactly those records (other root records pass)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not ("py4j" in record.pathname and "while sending command" in str(record.msg))


if not any(isinstance(f, _DropPy4JRootTracebacks) for f in logging.getLogger().filters):
    logging.getLogger().addFilter(_DropPy4JRootTracebacks())


@dataclass
class ScienceWorldConfig:
    tasks: list[str] = field(default_factory=lambda: ["power-component"])
    simplification: str = "easy"  # "" = none; comma-separated ScienceWorld simplifications or "easy"
    max_steps: int = 30  # actions per episode (paper App. D.2)
    max_steps_per_task: dict[str, int] = field(default_factory=dict)  # e.g. {chemistry-mix: 60} (reference json)
    train_variations: int = 5  # first N of get_variations_train()
    test_variations: int = 20  # first <= N of get_variations_test()
    num_demos: int = 2  # few-shot gold transcripts in the first message
    demo_max_steps: int = 0  # 0 = whole gold demo; >0 = first N steps of each demo
    demo_cache_dir: str = ""  # "" = $EMPO2_CACHE/scienceworld_demos or ~/.cache/empo2/scienceworld_demos
    action_correction: bool = True
    java_heap_mb: int = 512  # JVM -Xmx (skipped when the user sets JAVA_TOOL_OPTIONS); 0 = JVM default
    env_step_limit: int = 100  # ScienceWorld's own move limit (envStepLimit)
    call_timeout_s: float = 300.0  # a JVM call taking longer counts as a crash (restart); 0 = no timeout


# ----------------------------------------------------------------------------- prompt text (reference wording)

INSTRUCTION_HEAD = (
    "You have done a few science experiments successfully and below are the action history of your experiments "
    "with similar tasks."
)
ACTION_FORMATS = (
    "All your possible action formats are:\n"
    "open OBJ, go OBJ, focus on OBJ, move OBJ to OBJ, connect OBJ to OBJ, pour OBJ in OBJ, mix OBJ, pickup OBJ\n"
    "If you enter an unfamiliar room for the first time, you can use the action 'look around' to discover the "
    "objects in it."
)
FOCUS_TAIL = (
    "You cannot FOCUS on any other things. Please only use FOCUS as required by the task description.\n"
    "Also, please FOCUS more directly, try not to focus on the container."
)
NAIVE_INSTRUCTION = (
    "You could try to explore different actions, especially when you are not sure what the best action for your "
    "current observation.\n"
    "Please response with only one line with one sentence, following the possible action format shown above. "
    "No extra words are allowed."
)
_NUMBER_WORDS = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}

NO_MATCH = "No known action matches that input."
UNKNOWN_ACTION_PREFIX = "Unknown action."
AMBIGUOUS_PREFIX = "Ambiguous request"
CRASH_OBSERVATION = "The environment process crashed and was restarted; this episode is over."
MAX_ACTION_CHARS = 300
SIMPLIFICATIONS = ("easy", "teleportAction", "selfWateringFlowerPots", "openContainers", "openDoors",
                   "noElectricalAction")  # ScienceWorld 1.2.3 (get_possible_simplifications() + "easy")

_FOCUS_RE = re.compile(r"focus on\s+(?:the\s+)?([^.,;]+)", re.IGNORECASE)
_OPTION_RE = re.compile(r"^\s*(\d+):\s*(.*)$")
_LABEL_RE = re.compile(r"^(?:assistant|action)\s*:\s*", re.IGNORECASE)


def _env_errors() -> tuple[type[BaseException], ...]:
    from py4j.protocol import Py4JError

    return (Py4JError, OSError, EOFError)


def task_description(task_desc: str) -> str:
    """The text after "Task Description:" in ScienceWorld's taskDesc."""
    text = task_desc.strip()
    if text.lower().startswith("task description:"):
        text = text[len("task description:"):]
    return text.strip()


def focus_items(description: str) -> list[str]:
    """Objects named by "focus on X" in a task description, in order, without duplicates."""
    items: list[str] = []
    for match in _FOCUS_RE.finditer(description):
        item = " ".join(match.group(1).split())
        if item and item not in items:
            items.append(item)
    return items


def inventory_items(inventory: str) -> str:
    """ScienceWorld's inventory text without its "In your inventory, you see:" header, one item per line."""
    lines = [line.strip() for line in inventory.splitlines()]
    if lines and lines[0].lower().startswith("in your inventory"):
        lines = lines[1:]
    return "\n".join(line for line in lines if line) or "nothing"


def clean_action(text) -> str:
    """The first non-empty line of a model output, normalised to something ScienceWorld's parser can read."""
    if not isinstance(text, str):
        text = "" if text is None else str(text)
    text = text[: 20 * MAX_ACTION_CHARS]
    line = next((ln for ln in text.splitlines() if ln.strip()), "")
    line = " ".join(line.split())
    for _ in range(3):
        line = _LABEL_RE.sub("", line).strip().strip("\"'`*").rstrip(".!?;:,").strip()
    line = line.lower()
    return line[:MAX_ACTION_CHARS].strip()


def jaccard(a: str, b: str) -> float:
    sa, sb = set(a.split()), set(b.split())
    union = sa | sb
    return len(sa & sb) / len(union) if union else 0.0


def best_match(action: str, candidates: list[str]) -> int:
    """Index of the candidate with the highest word-set Jaccard similarity (first one on ties)."""
    words = set(action.split())
    best, best_score = 0, -1.0
    for i, cand in enumerate(candidates):
        cw = set(cand.split())
        union = words | cw
        score = len(words & cw) / len(union) if union else 0.0
        if score > best_score:
            best, best_score = i, score
    return best


def format_demo(description: str, observations: list[str], actions: list[str], max_steps: int = 0) -> str:
    """One few-shot transcript: observations[0] is the initial observation, observations[i+1] follows actions[i]."""
    if max_steps > 0:
        actions = actions[:max_steps]
    lines = [f"Task Description: {description}", f"User: {observations[0].strip()}"]
    for action, obs in zip(actions, observations[1:]):
        lines.append(f"Assistant: {action}")
        lines.append(f"User: {obs.strip()}")
    return "\n".join(lines)


def build_instruction(demos: list[str], description: str, inventory: str) -> str:
    """The reference's instruction prompt (empo2.md §4.1) with demos, task, inventory and focus items filled in."""
    parts = []
    if demos:
        n = len(demos)
        parts.append(f"{INSTRUCTION_HEAD}\nHere is {n} examples:\n" + "\n\n".join(demos))
        parts.append(
            f"Follow the report of the {_NUMBER_WORDS.get(n, str(n))} example tasks shown to you previously, "
            f"try to solve a similar new task.\n{description}"
        )
    else:
        parts.append(description)
    parts.append(ACTION_FORMATS)
    parts.append(f"Items in your inventory:\n{inventory_items(inventory)}")
    items = focus_items(description)
    if items:
        parts.append(f"Important! You can only use FOCUS actions on these items: {', '.join(items)}.\n{FOCUS_TAIL}")
    return "\n\n".join(parts)


# ----------------------------------------------------------------------------- the environment


def _scienceworld_version() -> str:
    try:
        from scienceworld.version import __version__

        return str(__version__)
    except Exception:  # pragma: no cover - version module layout changed
        return "unknown"


class ScienceWorldEnv(Env):
    """ScienceWorld behind the EMPO² Env interface. See the module docstring for behaviour and deviations."""

    # class-level caches shared by all instances of the process
    _cache_lock = threading.Lock()
    _demo_cache: dict[str, list[str]] = {}
    _demo_key_locks: dict[str, threading.Lock] = {}
    _split_cache: dict[str, tuple[list[int], list[int], list[int], int]] = {}

    def __init__(self, cfg: ScienceWorldConfig | None = None):
        self.cfg = cfg or ScienceWorldConfig()
        self._lock = threading.RLock()
        self._sw = None  # the JVM's PythonInterface server object (py4j proxy)
        self._gateway = None  # py4j JavaGateway
        self._proc = None  # the JVM subprocess.Popen
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
        for name in self.cfg.tasks:
            self._check_task(name)
        self._start_jvm()
        try:
            for name in self.cfg.tasks:  # validates the names and fills the split cache before any episode
                self._splits(name)
        except BaseException:
            self._stop_jvm()
            raise

    # ------------------------------------------------------------------ JVM management

    def _start_jvm(self) -> None:
        """Launch a ScienceWorld JVM and connect to it (what scienceworld.ScienceWorldEnv.__init__ does, plus -Xmx
        and a socket read timeout). We talk to the server object directly, so the package's Python wrapper class
        is not needed."""
        from py4j.java_gateway import CallbackServerParameters, GatewayParameters, JavaGateway, launch_gateway
        from scienceworld.constants import BASEPATH, JAR_PATH

        javaopts = []
        if self.cfg.java_heap_mb > 0 and "JAVA_TOOL_OPTIONS" not in os.environ:
            javaopts.append(f"-Xmx{int(self.cfg.java_heap_mb)}m")
        port, proc = launch_gateway(
            classpath=JAR_PATH, javaopts=javaopts, die_on_exit=True, cwd=BASEPATH, return_proc=True
        )
        try:
            timeout = self.cfg.call_timeout_s if self.cfg.call_timeout_s > 0 else None
            gateway = JavaGateway(
                gateway_parameters=GatewayParameters(auto_field=True, port=port, read_timeout=timeout),
                callback_server_parameters=CallbackServerParameters(port=0, daemonize=True),
                java_process=proc,
            )
            python_port = gateway.get_callback_server().get_listening_port()
            gateway.java_gateway_server.resetCallbackClient(
                gateway.java_gateway_server.getCallbackClient().getAddress(), python_port
            )
            server = gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()
        except BaseException:
            self._kill(None, proc)
            raise
        self._gateway, self._proc, self._sw = gateway, proc, server
        self._loaded = None

    @property
    def jvm_pid(self) -> int | None:
        """The process id of this env's JVM (None when none is running)."""
        return self._proc.pid if self._proc is not None else None

    @staticmethod
    def _kill(gateway, proc) -> None:
        if gateway is not None:
            try:
                gateway.shutdown()
            except Exception:
                pass
        if proc is None:
            return
        try:
            if proc.poll() is None:
                proc.stdin.write(b"\n")  # --die-on-broken-pipe: the JVM exits when its stdin closes
                proc.stdin.flush()
                proc.stdin.close()
                proc.wait(timeout=3)
        except Exception:
            pass
        try:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=5)
        except Exception:
            pass

    def _stop_jvm(self) -> None:
        gateway, proc = self._gateway, self._proc
        self._gateway = self._proc = self._sw = None
        self._loaded = None
        self._kill(gateway, proc)

    def _restart(self) -> None:
        logger.warning("ScienceWorld JVM failed; starting a new one")
        self.restarts += 1
        self._stop_jvm()
        self._start_jvm()

    @property
    def _server(self):
        if self._sw is None:
            self._start_jvm()
        return self._sw

    def _load(self, name: str, variation: int, gold: bool = False) -> None:
        """Load (task, variation) into the JVM; a loaded task starts from its initial state."""
        err = self._server.load(str(name), int(variation), self.cfg.simplification, bool(gold))
        if err:
            self._loaded = None
            raise RuntimeError(f"ScienceWorld load({name}, {variation}) failed: {err}")
        self._loaded = None if gold else (name, variation, self.cfg.simplification)

    # ------------------------------------------------------------------ splits

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
        with ScienceWorldEnv._cache_lock:
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
        with ScienceWorldEnv._cache_lock:
            ScienceWorldEnv._split_cache[name] = splits
        return splits

    def tasks(self, split: str) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        with self._lock:
            out = []
            for name in self.cfg.tasks:
                train, _, test, _ = self._splits(name)
                ids = train[: self.cfg.train_variations] if split == "train" else test[: self.cfg.test_variations]
                out.extend(Task(name, v) for v in ids)
            return out

    # ------------------------------------------------------------------ demos

    def _demo_key(self, name: str) -> str:
        c = self.cfg
        return (
            f"{name}|{c.simplification or 'none'}|demos={c.num_demos}|max_steps={c.demo_max_steps}"
            f"|train_variations={c.train_variations}|scienceworld={_scienceworld_version()}"
        )

    def _demo_path(self, key: str) -> Path:
        if self.cfg.demo_cache_dir:
            root = Path(self.cfg.demo_cache_dir).expanduser()
        elif os.environ.get("EMPO2_CACHE"):
            root = Path(os.environ["EMPO2_CACHE"]).expanduser() / "scienceworld_demos"
        else:
            root = Path.home() / ".cache" / "empo2" / "scienceworld_demos"
        safe = re.sub(r"[^A-Za-z0-9_.=-]+", "_", key.replace("|", "__"))
        return root / f"{safe}.json"

    def demos(self, name: str) -> list[str]:
        """The few-shot transcripts for task `name` (generated once per process / cache directory)."""
        if self.cfg.num_demos <= 0:
            return []
        key = self._demo_key(name)
        with ScienceWorldEnv._cache_lock:
            if key in ScienceWorldEnv._demo_cache:
                return list(ScienceWorldEnv._demo_cache[key])
            key_lock = ScienceWorldEnv._demo_key_locks.setdefault(key, threading.Lock())
        with key_lock:  # one generator per key; other instances wait for its result
            with ScienceWorldEnv._cache_lock:
                if key in ScienceWorldEnv._demo_cache:
                    return list(ScienceWorldEnv._demo_cache[key])
            path = self._demo_path(key)
            demos = self._read_demo_file(path, key)
            if demos is None:
                started = time.perf_counter()
                demos, variations = self._generate_demos(name)
                logger.info("generated %d ScienceWorld demos for %s (variations %s) in %.1f s",
                            len(demos), name, variations, time.perf_counter() - started)
                if len(demos) == self.cfg.num_demos:  # an incomplete set is retried by the next process
                    self._write_demo_file(path, {"key": key, "task": name, "variations": variations,
                                                 "demos": demos})
            with ScienceWorldEnv._cache_lock:
                ScienceWorldEnv._demo_cache[key] = list(demos)
            return list(demos)

    @staticmethod
    def _read_demo_file(path: Path, key: str) -> list[str] | None:
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if not isinstance(data, dict) or data.get("key") != key or not isinstance(data.get("demos"), list):
            return None
        return [str(d) for d in data["demos"]]

    @staticmethod
    def _write_demo_file(path: Path, data: dict) -> None:
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
            try:
                with os.fdopen(fd, "w", encoding="utf-8") as f:
                    json.dump(data, f, ensure_ascii=False, indent=1)
                os.replace(tmp, path)
            except BaseException:
                try:
                    os.unlink(tmp)
                except OSError:
                    pass
                raise
        except OSError as err:  # a read-only cache is not fatal
            logger.warning("could not write the demo cache %s: %s", path, err)

    def _generate_demos(self, name: str) -> tuple[list[str], list[int]]:
        """Replay ScienceWorld's gold path on held-out training (then dev) variations."""
        train, dev, _, _ = self._splits(name)
        candidates = train[self.cfg.train_variations:] + dev
        demos: list[str] = []
        used: list[int] = []
        server = self._server
        for variation in candidates[: self.cfg.num_demos + 4]:
            self._load(name, variation, gold=True)
            gold = [str(a) for a in server.getGoldActionSequence()]
            server.reset()
            observations = [str(server.step("look around"))]
            for action in gold:
                observations.append(str(server.step(action)))
            score = int(round(100 * server.getScore()))
            if score < 100:
                logger.warning("gold path of %s variation %d reached only %d; skipping it", name, variation, score)
                continue
            desc = task_description(str(server.freeActionTaskDesc()))
            demos.append(format_demo(desc, observations, gold, self.cfg.demo_max_steps))
            used.append(variation)
            if len(demos) >= self.cfg.num_demos:
                break
        self._loaded = None
        if len(demos) < self.cfg.num_demos:
            logger.warning("only %d of %d demos for %s", len(demos), self.cfg.num_demos, name)
        return demos, used

    def gold_actions(self, task: Task) -> list[str]:
        """ScienceWorld's gold action sequence for `task` (0.1-14 s). Ends the current episode, if any."""
        with self._lock:
            self._done = True
            self._load(task.name, task.variation, gold=True)
            return [str(a) for a in self._server.getGoldActionSequence()]

    # ------------------------------------------------------------------ episodes

    def max_steps_for(self, name: str) -> int:
        return int(self.cfg.max_steps_per_task.get(name, self.cfg.max_steps))

    def reset(self, task: Task) -> str:
        with self._lock:
            if self._closed:
                raise RuntimeError("reset() on a closed ScienceWorldEnv")
            for attempt in (0, 1):
                try:
                    return self._reset(task)
                except _env_errors() as err:
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
            observation.strip() + "\n" + build_instruction(demos, description, inventory) + "\n\n" + NAIVE_INSTRUCTION
        )
        self._history = []
        # Baseline 0, not the initial score: some tasks start above 0 (find-*: 8, some paint variations: 13-20), and
        # that part is paid with the first step's reward so that sum(rewards) == the final score.
        self._score = 0
        self._steps = 0
        self._done = False
        self._last_info = self._info(action="", env_error="")
        self._current_observation = observation
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
        with self._lock:
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
            except _env_errors() as err:
                message = f"{type(err).__name__}: {err}".strip()
                try:
                    self._restart()
                except Exception as restart_err:  # reset() will try again
                    logger.error("ScienceWorld restart failed: %s", restart_err)
                    self._stop_jvm()
                self._steps += 1
                self._done = True
                info = self._info(action=cleaned, env_error=message or "ScienceWorld error", raw_action=cleaned,
                                  corrected=False)
                self._history.append((cleaned, CRASH_OBSERVATION))
                self._current_observation = CRASH_OBSERVATION
                self._last_info = info
                return CRASH_OBSERVATION, 0.0, True, info
            reward = float(score - self._score)
            self._score = score
            self._steps += 1
            done = completed or score >= 100 or score < 0
            truncated = False
            if not done and (self._steps >= self.max_steps_for(self._task.name) or moves > self.cfg.env_step_limit):
                done = truncated = True
            self._done = done
            info = self._info(action=self._executed, env_error="", truncated=truncated, raw_action=cleaned,
                              corrected=corrected, moves=moves)
            self._history.append((cleaned, observation))
            self._current_observation = observation
            self._last_info = info
            return observation, reward, done, info

    def _valid_actions(self) -> list[str]:
        # The list call returns the actions sorted, like the package's info["valid"] that the reference uses, so
        # ties in the Jaccard choice go to the same (alphabetically first) action.
        return [str(a) for a in self._server.getValidActionObjectCombinations()]

    def valid_actions(self) -> list[str]:
        """ScienceWorld's valid actions in the current state (costly: 20-200 ms)."""
        with self._lock:
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
            if not self._history:
                return self._first_message
            k = max(0, int(window))
            shown = self._history[-k:] if k else []
            parts = [self._first_message, ""]
            if shown:
                parts.append(f"Your most recent {len(shown)} of {len(self._history)} actions and what followed:")
                for action, obs in shown[:-1]:
                    parts.append(f"Action: {action}\nObservation: {obs.strip()}")
                parts.append(f"Action: {shown[-1][0]}")
            parts.append(f"Current observation: {self._history[-1][1].strip()}")
            return "\n".join(parts)

    # ------------------------------------------------------------------ cleanup

    def close(self) -> None:
        with self._lock:
            self._closed = True
            self._stop_jvm()

    def __del__(self):
        try:
            self._kill(getattr(self, "_gateway", None), getattr(self, "_proc", None))
        except Exception:
            pass


# ----------------------------------------------------------------------------- latency benchmark


def _bench(task: str = "power-component", variation: int = 0, rounds: int = 3) -> None:
    """Median step latencies (python -m envs.scienceworld --bench)."""
    import statistics

    cfg = ScienceWorldConfig(tasks=[task], num_demos=0, max_steps=1000, env_step_limit=10000)
    t = time.perf_counter()
    env = ScienceWorldEnv(cfg)
    print(f"JVM start + split listing: {time.perf_counter() - t:.2f} s")
    from scienceworld import ScienceWorldEnv as PackageEnv

    pkg = PackageEnv("", envStepLimit=10000)
    try:
        gold = env.gold_actions(Task(task, variation))
        valid_t, corr_t, full_t = [], [], []
        for _ in range(rounds):
            env.reset(Task(task, variation))
            for a in gold:  # before every gold step, one misspelled action that needs the valid-action list
                t = time.perf_counter()
                _, _, _, info = env.step("look arund")
                corr_t.append(time.perf_counter() - t)
                assert info["corrected"] and info["action"] == "look around", info
                t = time.perf_counter()
                _, _, done, _ = env.step(a)
                valid_t.append(time.perf_counter() - t)
                if done:
                    break
            pkg.load(task, variation, cfg.simplification)
            pkg.reset()
            for a in gold:
                t = time.perf_counter()
                pkg.step(a)
                full_t.append(time.perf_counter() - t)

        def fmt(xs):
            xs = sorted(xs)
            p90 = xs[int(0.9 * (len(xs) - 1))]
            return f"median {1000 * statistics.median(xs):.1f} ms, p90 {1000 * p90:.1f} ms (n={len(xs)})"

        print("valid action, no listing:   ", fmt(valid_t))
        print("correction triggered:       ", fmt(corr_t))
        print("package ScienceWorldEnv.step", fmt(full_t))
        t = time.perf_counter()
        env.reset(Task(task, variation))
        print(f"reset (same task): {1000 * (time.perf_counter() - t):.0f} ms")
        t = time.perf_counter()
        env.reset(Task(task, variation + 1))
        print(f"reset (other variation, load): {1000 * (time.perf_counter() - t):.0f} ms")
        try:
            import psutil

            print(f"JVM RSS: {psutil.Process(env.jvm_pid).memory_info().rss / 2**20:.0f} MiB (-Xmx{cfg.java_heap_mb}m)")
        except Exception as err:
            print("JVM RSS: n/a", err)
    finally:
        env.close()
        pkg.close()
        pkg.close = lambda: None


if __name__ == "__main__":  # pragma: no cover
    import sys

    if "--bench" in sys.argv:
        args = [a for a in sys.argv[1:] if a != "--bench"]
        _bench(args[0] if args else "power-component", int(args[1]) if len(args) > 1 else 0)
