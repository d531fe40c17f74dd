"""SanityEnv: a pure-Python text world shaped like ScienceWorld, for checking that training helps (docs/sanity.md).

CleanRL's CartPole for an LLM agent with memory: no JVM, microsecond steps, short prompts, and tasks a 135M model
can learn in a few iterations on CPU. Three families (`env.sanity.families`):

* ``lab``: "turn on the red lamp, then focus on it". Each lamp has a wire, a button (and a panel with
  num_stages 4); the solution is e.g. connect the red wire -> press the red button -> focus on the red lamp.
* ``garden``: the same structure with other nouns and verbs (fill the tomato pot, plant the tomato seed, water
  the tomato pot, focus on the tomato plant): the out-of-distribution family.
* ``pick``: ONE step; K nonsense words are listed, the same word ("dax") pays 100 in every variation. The first
  listed word the answer contains is the password tried ("The password is dax." works; an answer naming no listed
  word opens nothing), so success measures what the model says, not where a word sits in the shuffled list.

How it maps to ScienceWorld: the first message is an observation ("look around") + the task + the instruction;
every later observation ends with the available commands; rewards are score changes (stages pay 100/num_stages
each, so they sum to the final score); the task is done at 100 (success); a fatal action (touching the bare wire,
eating the wild berry, focusing on a wrong lamp/plant, as ScienceWorld's wrong focus) ends the episode at -100
(reward = -100 - score so far); `max_steps` ends it with ``info["truncated"]``. A command not in the list is
mapped to the listed one with the highest word-set Jaccard similarity (first on ties), as ScienceWorld's action
correction does; a stage done too early answers with the unmet condition ("That does not work yet: the red wire
is loose."), like ScienceWorld's "The door is closed."

Difficulty (lab/garden): 0 = the task spells out the commands in order; 1 = it names only the goal, the stages
go in the family's fixed order (a rule to learn); 2 = goal only, and each variation has its own hidden order of
the stages before the focus (found by exploring, or by memory). A variation = (target, distractor set, order at
difficulty 2); all distinct variations are enumerated and shuffled with `seed`; train = the first
`train_variations`, test = the last `test_variations` (disjoint, no shared content). Same config -> same text.

Extras beyond envs.base.Env: ``gold_actions(task)``, ``commands()`` (the current list), ``history``,
``first_message``; step info adds ``raw_action`` and ``corrected``.
"""
from __future__ import annotations

import itertools
import random
import re
from dataclasses import dataclass, field
from functools import lru_cache

from envs.base import Env, Task, history_window_prompt
from envs.scienceworld.prompts import best_match, clean_action  # pure text helpers: no JVM, no py4j

FAMILIES = ("lab", "garden", "pick")
RESPOND = "Respond with exactly one command from the list, no other words."
OVER = "The episode is over."
NOT_YET = "That does not work yet:"  # a target stage tried too early; the rest names the first unmet stage
ORACLE_TIP = 'The command to play now is "{command}".'  # rollout.tip_source=oracle: quotes that command, no other


@dataclass
class SanityConfig:
    families: list[str] = field(default_factory=lambda: ["lab"])  # task families: lab | garden | pick
    difficulty: int = 1  # 0 = commands spelled out; 1 = goal only, fixed stage order; 2 = per-variation order
    num_stages: int = 3  # lab/garden stages (1-4), the last is always "focus on ..."
    num_distractors: int = 2  # other colours (lab) / plants (garden) in the room, their commands listed too (0-7)
    max_steps: int = 6  # actions per lab/garden episode (1-8); a pick episode always ends after one action
    pick_choices: int = 4  # K: words listed in a pick task (2-8), exactly one of them pays
    fatal: bool = True  # list a fatal command and make focusing on a wrong object fatal (score -100)
    train_variations: int = 32  # training variations per family (the first of the shuffled variations)
    test_variations: int = 8  # test variations per family (the last ones; never equal to a training one)
    seed: int = 0  # the variations, their split and every command order derive from it
    action_correction: bool = True  # map a command not in the list to the closest listed one (word-set Jaccard)
    turn_reminder: bool = True  # end every later user turn with the answer instruction (as the first message does)
    # The hard-exploration lab: "flip the main switch" (listed, names no colour) is needed between connecting the
    # wire and pressing the button; only a premature press or focus reveals it. Lab only (garden never has it),
    # difficulty <= 1, num_stages >= 3.
    switch: bool = False
    reward: str = "stages"  # "stages": each stage pays its share of 100; "success": stages pay 0, success pays 100

    def validate(self) -> None:
        """Raise ValueError naming the offending `env.sanity.<field>`."""
        unknown = [f for f in self.families if f not in FAMILIES]
        if not self.families or unknown:
            raise ValueError(f"env.sanity.families={self.families!r}: expected a non-empty list of {FAMILIES}")
        ranges = {"difficulty": (0, 2), "num_stages": (1, 4), "num_distractors": (0, 7), "max_steps": (1, 8),
                  "pick_choices": (2, 8), "train_variations": (1, 10**6), "test_variations": (0, 10**6)}
        for name, (low, high) in ranges.items():
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or not low <= value <= high:
                raise ValueError(f"env.sanity.{name}={value!r} must be an integer in [{low}, {high}]")
        multi = [f for f in self.families if f != "pick"]
        if multi and self.difficulty == 2 and self.num_stages < 3:
            raise ValueError("env.sanity.difficulty=2 needs env.sanity.num_stages >= 3 (two stages to order)")
        if self.reward not in ("stages", "success"):
            raise ValueError(f"env.sanity.reward={self.reward!r} must be 'stages' or 'success'")
        if self.switch and ("lab" not in self.families or self.difficulty > 1 or self.num_stages < 3):
            raise ValueError("env.sanity.switch is the hard-exploration lab: it needs 'lab' in env.sanity.families, "
                             "env.sanity.difficulty <= 1 and env.sanity.num_stages >= 3")
        for family in self.families:
            available = len(variations(family, self.key()))
            if self.train_variations + self.test_variations > available:
                raise ValueError(f"env.sanity.train_variations + env.sanity.test_variations = "
                                 f"{self.train_variations + self.test_variations} > the {available} distinct "
                                 f"{family} variations of these settings")

    def key(self) -> tuple:
        """The settings that decide the variations (hashable, for the cache)."""
        return (self.difficulty, self.num_stages, self.num_distractors, self.pick_choices, self.seed)


@dataclass(frozen=True)
class Stage:
    command: str  # "connect the {k} wire"
    result: str  # what the command does: "You connect the {k} wire."
    todo: str  # the state while the stage is missing ("the {k} wire is loose"), reported when it blocks another
    done: str  # the state once done ("the {k} wire is connected"), reported when the stage is repeated


@dataclass(frozen=True)
class Family:
    keys: tuple[str, ...]  # the targets a variation picks from (colours, plants)
    scene: str  # the room; {objects} = "a red lamp, a blue lamp and a green lamp"
    noun: str  # what {objects} lists ("lamp")
    goal: str  # the task sentence at difficulty 1 and 2
    prep: tuple[Stage, ...]  # the stages before the focus, in the family's fixed order
    final: Stage  # the focus stage: completes the task
    ready: str  # said when the last prep stage is done
    fatal: str  # the fatal command
    fatal_scene: str  # the scene sentence that shows it
    fatal_result: str


LAB = Family(
    keys=("red", "blue", "green", "yellow", "orange", "purple", "white", "black"),
    scene="You are in a lab. You see {objects}, each with its own panel, wire and button.",
    noun="lamp",
    goal="Your task is to turn on the {k} lamp. When it is on, focus on the {k} lamp.",
    prep=(Stage("open the {k} panel", "You open the {k} panel.", "the {k} panel is closed", "the {k} panel is open"),
          Stage("connect the {k} wire", "You connect the {k} wire.", "the {k} wire is loose",
                "the {k} wire is connected"),
          Stage("press the {k} button", "You press the {k} button.", "the {k} button is not pressed",
                "the {k} button is pressed")),
    final=Stage("focus on the {k} lamp", "You focus on the {k} lamp. It shines: task complete.", "", ""),
    ready="The {k} lamp turns on.",
    fatal="touch the bare wire",
    fatal_scene="A bare wire hangs from the ceiling.",
    fatal_result="You touch the bare wire and get a strong electric shock. Task failed.",
)
GARDEN = Family(
    keys=("tomato", "bean", "pumpkin", "carrot", "pea", "melon", "onion", "pepper"),
    scene="You are in a garden. You see {objects}, each with its own seed packet and watering can.",
    noun="pot",
    goal="Your task is to grow the {k} plant. When it has grown, focus on the {k} plant.",
    prep=(Stage("fill the {k} pot", "You fill the {k} pot with soil.", "the {k} pot is empty",
                "the {k} pot is full of soil"),
          Stage("plant the {k} seed", "You plant the {k} seed.", "the {k} seed is not planted",
                "the {k} seed is planted"),
          Stage("water the {k} pot", "You water the {k} pot.", "the {k} pot is dry", "the {k} pot is watered")),
    final=Stage("focus on the {k} plant", "You focus on the {k} plant. It is in bloom: task complete.", "", ""),
    ready="A {k} plant grows in the {k} pot.",
    fatal="eat the wild berry",
    fatal_scene="A wild berry bush grows by the fence.",
    fatal_result="You eat the wild berry. It is poisonous. Task failed.",
)
MULTI = {"lab": LAB, "garden": GARDEN}
# The hard-exploration lab's extra stage (env.sanity.switch): one switch for the room, named by no colour.
SWITCH = Stage("flip the main switch", "You flip the main switch.", "the main switch is off", "the main switch is on")
PICK_WORD = "dax"  # the word that pays in every pick variation
PICK_OTHERS = ("blick", "wug", "fep", "toma", "zorp", "kiki", "glorp", "snib", "vek", "mib", "tufa")


def stage_rewards(n: int) -> list[int]:
    """n integer rewards that sum to 100 (3 -> [33, 33, 34])."""
    return [100 * (i + 1) // n - 100 * i // n for i in range(n)]


@lru_cache(maxsize=64)
def variations(family: str, key: tuple) -> tuple[tuple, ...]:
    """All distinct variations of a family under SanityConfig.key() settings, shuffled with the seed.
    lab/garden: (target, distractors, prep order as indices into the used prep stages); pick: (distractor words)."""
    difficulty, num_stages, num_distractors, pick_choices, seed = key
    if family == "pick":
        out = [(combo,) for combo in itertools.combinations(PICK_OTHERS, pick_choices - 1)]
    else:
        keys, n_prep = MULTI[family].keys, num_stages - 1
        orders = list(itertools.permutations(range(n_prep))) if difficulty == 2 else [tuple(range(n_prep))]
        out = [(target, others, order) for target in keys
               for others in itertools.combinations([k for k in keys if k != target], num_distractors)
               for order in orders]
    random.Random(f"{seed}/{family}/variations").shuffle(out)
    return tuple(out)


class SanityEnv(Env):
    """The sanity environment behind the EMPO² Env interface. See the module docstring and docs/sanity.md."""

    def __init__(self, cfg: SanityConfig | None = None):
        self.cfg = cfg or SanityConfig()
        self.cfg.validate()
        self._task: Task | None = None
        self._first_message = ""
        self._history: list[tuple[str, str]] = []
        self._done = True
        self._last_info: dict = {}

    # ------------------------------------------------------------------ tasks and variations

    def _variations(self, family: str) -> tuple[tuple, ...]:
        if family not in FAMILIES:
            raise ValueError(f"unknown sanity family {family!r}; known: {FAMILIES}")
        return variations(family, self.cfg.key())

    def tasks(self, split: str) -> list[Task]:
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        out = []
        for family in self.cfg.families:
            n = len(self._variations(family))
            ids = range(self.cfg.train_variations) if split == "train" else range(n - self.cfg.test_variations, n)
            out.extend(Task(family, v) for v in ids)
        return out

    def _layout(self, task: Task) -> dict:
        """Everything an episode of `task` needs: target, commands (in list order), stages in solution order."""
        table = self._variations(task.name)
        if not 0 <= task.variation < len(table):
            raise ValueError(f"{task.name} has variations 0..{len(table) - 1}, got {task.variation}")
        rng = random.Random(f"{self.cfg.seed}/{task.name}/{task.variation}/layout")
        if task.name == "pick":
            commands = [PICK_WORD, *table[task.variation][0]]
            rng.shuffle(commands)
            return dict(commands=commands, gold=[PICK_WORD])
        fam = MULTI[task.name]
        target, others, order = table[task.variation]
        used = fam.prep[len(fam.prep) - (self.cfg.num_stages - 1):]  # the last num_stages - 1 prep stages
        stages = [used[i] for i in order] + [fam.final]
        switch = self.cfg.switch and task.name == "lab"
        if switch:  # between the wire and the button; `used` (what look around reports) never shows it
            stages.insert(stages.index(fam.prep[2]), SWITCH)
        shown = [target, *others]
        rng.shuffle(shown)
        commands = ["look around"] + [s.command.format(k=k) for k in shown for s in (*used, fam.final)]
        commands += [fam.fatal] if self.cfg.fatal else []
        commands += [SWITCH.command] if switch else []
        rng.shuffle(commands)
        return dict(commands=commands, gold=[s.command.format(k=target) for s in stages], family=fam,
                    target=target, stages=stages, shown=shown, used=used)

    def gold_actions(self, task: Task) -> list[str]:
        """The shortest solution of `task` (the commands to send, in order)."""
        return list(self._layout(task)["gold"])

    # ------------------------------------------------------------------ text

    def _scene(self) -> str:
        fam, shown = self._lay["family"], self._lay["shown"]
        things = [f"{'an' if k[0] in 'aeiou' else 'a'} {k} {fam.noun}" for k in shown]
        objects = things[0] if len(things) == 1 else ", ".join(things[:-1]) + " and " + things[-1]
        return fam.scene.format(objects=objects) + (" " + fam.fatal_scene if self.cfg.fatal else "")

    def _task_text(self) -> str:
        if self._task.name == "pick":
            return "Your task is to say the password that opens the door. It is one of the words below."
        fam, target = self._lay["family"], self._lay["target"]
        text = fam.goal.format(k=target)
        if self.cfg.difficulty == 0:
            text += " Use these commands, in this order: " + ", ".join(self._lay["gold"]) + "."
        return text

    def _with_commands(self, text: str) -> str:
        return f"{text}\nAvailable commands: {self._command_text}."

    # ------------------------------------------------------------------ episodes

    def reset(self, task: Task) -> str:
        self._lay = self._layout(task)
        self._task = task
        self._command_text = ", ".join(self._lay["commands"])
        self._done_stages: set[str] = set()  # commands of stages done so far (target and distractors)
        self._progress = 0  # target stages done, in solution order
        self._revealed = -1  # the index of the target stage a "That does not work yet" named last (oracle_tip)
        self._needed: list[tuple[str, str, bool]] = []  # per step: (its state, the gold command needed there, revealed)
        self._ended_by = ""  # the command that failed the task (a fatal one or a focus on a distractor)
        self._score = 0
        self._steps = 0
        self._history = []
        self._done = False
        scene = "You stand in front of a locked door." if task.name == "pick" else self._scene()
        self._first_message = f"{scene}\n{self._task_text()}\nAvailable commands: {self._command_text}." + \
            self.answer_instruction()
        self._last_info = self._info(action="")
        return self._first_message

    def _info(self, *, action: str, truncated: bool = False, **extra) -> dict:
        info = dict(score=float(self._score), success=self._score >= 100, truncated=truncated, env_error="",
                    action=action)
        info.update(extra)
        return info

    def step(self, action) -> tuple[str, float, bool, dict]:
        if self._task is None:
            raise RuntimeError("step() called before reset()")
        cleaned = clean_action(action)
        if self._done:
            return OVER, 0.0, True, dict(self._last_info, action="")
        commands = self._lay["commands"]
        executed, corrected = cleaned, False
        state, before = (self._history[-1][1] if self._history else self._first_message), self._progress
        if self._task.name == "pick":  # one action: the first listed word the answer says is the password tried
            said = [w for w in re.findall(r"[a-z]+", cleaned) if w in commands]
            executed, corrected = (said[0] if said else ""), bool(said) and said[0] != cleaned
            won = executed == PICK_WORD
            text = "The door opens: task complete." if won else "Wrong password. The door stays locked."
            reward, ended = (100 if won else 0), True
        elif cleaned not in commands and self.cfg.action_correction:
            executed, corrected = commands[best_match(cleaned, commands)], True
            text, reward, ended = self._execute(executed)
        elif executed not in commands:
            text, reward, ended = "Unknown command: choose one from the list.", 0, False
        else:
            text, reward, ended = self._execute(executed)
        self._score += reward
        self._steps += 1
        truncated = False
        if not ended and self._steps >= self.cfg.max_steps:
            ended = truncated = True
            text += " You are out of steps."
        self._done = ended
        observation = f"{text} {OVER}" if ended else self._with_commands(text)
        info = self._info(action=executed, truncated=truncated, raw_action=cleaned, corrected=corrected)
        self._history.append((cleaned, observation))
        self._last_info = info
        if self._task.name != "pick":  # the command needed at this step's state, and whether the step revealed it
            self._needed.append((state, self._lay["gold"][before], text.startswith(NOT_YET)))
        return observation, float(reward), ended, info

    def _execute(self, command: str) -> tuple[str, int, bool]:
        """(result text, reward, episode ended) of a listed lab/garden command."""
        fam, target, stages = self._lay["family"], self._lay["target"], self._lay["stages"]
        if command == "look around":
            states = [(s.done if s.command.format(k=target) in self._done_stages else s.todo).format(k=target)
                      for s in self._lay["used"]]  # the family's order: never reveals a variation's order
            return self._scene() + (" Now " + ", ".join(states) + "." if states else ""), 0, False
        if command == fam.fatal:
            self._ended_by = command
            return fam.fatal_result, -100 - self._score, True
        stage, key = next((s, k) for s in stages for k in self._lay["shown"]
                          if s.command.format(k=k) == command)  # the switch: (SWITCH, the first object)
        if stage is fam.final and key != target:
            if self.cfg.fatal:  # as ScienceWorld's focus on a wrong object
                self._ended_by = command
                return f"You {command}, but your task is about the {target} one. Task failed.", -100 - self._score, True
            return f"You {command}. It is not the one your task is about.", 0, False
        if command in self._done_stages:
            return f"Nothing happens: {stage.done.format(k=key)}.", 0, False
        if key != target and stage is not SWITCH:  # a distractor's stage works but does nothing for the task
            self._done_stages.add(command)
            return stage.result.format(k=key), 0, False
        index = stages.index(stage)
        if index > self._progress:  # too early: report the first unmet condition, like "The door is closed."
            self._revealed = self._progress
            return f"{NOT_YET} {stages[self._progress].todo.format(k=target)}.", 0, False
        self._done_stages.add(command)
        self._progress += 1
        last = index == len(stages) - 1
        reward = stage_rewards(len(stages))[index] if self.cfg.reward == "stages" else 100 * last
        text = stage.result.format(k=target)
        if index == len(stages) - 2:
            text += " " + fam.ready.format(k=target)
        return text, reward, last

    # ------------------------------------------------------------------ prompts

    def commands(self) -> list[str]:
        """The available commands of the current task, in the order listed."""
        return list(self._lay["commands"]) if self._task is not None else []

    @property
    def first_message(self) -> str:
        return self._first_message

    @property
    def history(self) -> list[tuple[str, str]]:
        """(cleaned model action, observation) pairs of the current episode."""
        return list(self._history)

    def answer_instruction(self) -> str:
        return "\n" + RESPOND

    def turn_reminder(self) -> str:
        return self.answer_instruction() if self.cfg.turn_reminder else ""

    def oracle_tip(self) -> str:
        """What this episode's feedback revealed, as a tip (rollout.tip_source=environment, an ablation): the target
        stages that worked in their order, the stage a "That does not work yet" named as missing, the command that
        failed the task. Nothing the episode did not show: "" when it revealed nothing."""
        if self._task is None:
            return ""
        if self._task.name == "pick":
            tried = self._last_info.get("action", "")
            return f"The password is {PICK_WORD}." if self._score >= 100 else (
                f"The password is not {tried}." if tried else "")
        gold = self._lay["gold"]
        if self._progress == len(gold):
            return "This solved the task, in this order: " + ", ".join(gold) + "."
        parts = ["These steps worked, in this order: " + ", ".join(gold[:self._progress]) + "."] if self._progress else []
        if self._revealed == self._progress:
            parts.append(f"The next step needed is: {gold[self._progress]}.")
        if self._ended_by:
            parts.append(f"Never {self._ended_by}: it fails the task.")
        return " ".join(parts)

    def harmless_commands(self) -> list[str]:
        """The listed lab/garden commands that can never end the episode: all but the fatal command and the focus
        on another object (tools/warmup.py's tip-reading warm-up names one of them in a tip instead of the gold one)."""
        fam, target = self._lay["family"], self._lay["target"]
        focus = {fam.final.command.format(k=k) for k in self._lay["shown"] if k != target}
        return [c for c in self._lay["commands"] if c != fam.fatal and c not in focus]

    def oracle_entries(self) -> list[tuple[str, str]]:
        """rollout.tip_source=oracle (lab and garden): (state, tip) for each step where a tip helps. A step whose
        command was tried too early ("That does not work yet: ...") gets, at the state it was played in, the
        command that was missing; after a success every step's state gets the gold command needed there. The tip
        quotes that command and no other (ORACLE_TIP). Once per state, in step order; [] for pick."""
        if self._task is None:
            return []
        success = self._score >= 100
        out: dict[str, str] = {}
        for state, needed, revealed in self._needed:
            if (revealed or success) and state not in out:
                out[state] = ORACLE_TIP.format(command=needed)
        return list(out.items())

    def step_limit(self, task: Task) -> int:
        return 1 if task.name == "pick" else self.cfg.max_steps

    def window_prompt(self, window: int) -> str:
        if self._task is None:
            raise RuntimeError("window_prompt() called before reset()")
        return history_window_prompt(self._first_message, self._history, window)

    def close(self) -> None:
        self._task = None
