"""The ScienceWorld prompt text and the action-text helpers (pure functions, no JVM).

* Prompt strings quote the reference wording, typos included ("Here is 2 examples:", "Please response ...",
  "pickup OBJ" although ScienceWorld's verb is "pick up"): the policy should see what the paper's policy saw.
* `build_instruction` fills in the demos, the task description, the inventory and the "Important! You can only use
  FOCUS actions on these items: ..." line. The items come from a regex for "focus on X" over the task description
  (case-insensitive, a leading "the " dropped, duplicates removed).
* `format_demo` lays out one gold transcript ("Task Description: ...", then "User:" / "Assistant:" lines).
* `clean_action` turns any model output into one parseable line: the first non-empty line, quotes/backticks and a
  leading "Assistant:" / "Action:" label removed, whitespace collapsed, lower-cased, trailing ``.!?;:,`` removed,
  capped at 300 characters. It never raises (empty, huge, unicode, multi-line or non-string outputs).
* `best_match` picks the candidate with the highest `envs.base.jaccard` similarity (word-set Jaccard, the project's
  one text similarity), the first candidate on ties, as the reference's ``max`` does. It compares words
  case-insensitively; since `clean_action` lower-cases the action, that only matters for a candidate with capitals.

Where these strings go in the first message: docs/scienceworld.md.
"""
from __future__ import annotations

import re

from envs.base import jaccard

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

MAX_ACTION_CHARS = 300

_FOCUS_RE = re.compile(r"focus on\s+(?:the\s+)?([^.,;]+)", re.IGNORECASE)
_LABEL_RE = re.compile(r"^(?:assistant|action)\s*:\s*", re.IGNORECASE)


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


def best_match(action: str, candidates: list[str]) -> int:
    """Index of the candidate most similar to `action` (envs.base.jaccard; the first one on ties)."""
    best, best_score = 0, -1.0
    for i, candidate in enumerate(candidates):
        score = jaccard(action, candidate)
        if score > best_score:
            best, best_score = i, score
    return best


def format_demo(description: str, observations: list[str], actions: list[str], max_steps: int = 0) -> str:
    """One few-shot transcript: observations[0] is the initial observation, observations[i+1] follows actions[i].
    max_steps > 0 keeps only the first max_steps (action, observation) pairs."""
    if max_steps > 0:
        actions = actions[:max_steps]
    lines = [f"Task Description: {description}", f"User: {observations[0].strip()}"]
    for action, obs in zip(actions, observations[1:]):
        lines.append(f"Assistant: {action}")
        lines.append(f"User: {obs.strip()}")
    return "\n".join(lines)


def build_instruction(demos: list[str], description: str, inventory: str) -> str:
    """The reference's instruction prompt with demos, task, inventory and focus items filled in."""
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
