"""ScienceWorld options (the `env.scienceworld` config section).

Every field is documented next to its default (`train.py --help` prints these comments). Importing this module
imports neither py4j nor scienceworld and changes no logging settings, so the root config can import it freely.
Behaviour behind each option: docs/scienceworld.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ScienceWorldConfig:
    tasks: list[str] = field(default_factory=lambda: ["power-component"])  # task names, one run per task in the paper
    simplification: str = "easy"  # "" = none; comma-separated ScienceWorld simplifications or "easy"
    max_steps: int = 30  # actions per episode (paper App. D.2)
    max_steps_per_task: dict[str, int] = field(default_factory=dict)  # e.g. {chemistry-mix: 60} (reference json)
    train_variations: int = 5  # first N of get_variations_train()
    test_variations: int = 20  # first <= N of get_variations_test()
    num_demos: int = 2  # few-shot gold transcripts in the first message
    demo_max_steps: int = 0  # 0 = whole gold demo; >0 = first N steps of each demo
    demo_cache_dir: str = ""  # "" = $EMPO2_CACHE/scienceworld_demos or ~/.cache/empo2/scienceworld_demos
    action_correction: bool = True  # map an action ScienceWorld does not parse to the closest valid action
    # End every user turn after the first with the naive instruction ("You could try to explore different actions,
    # ... No extra words are allowed."), as the reference ends its last user message each step; said only in the
    # first message it ends up far from the generation point (docs/scienceworld.md)
    turn_reminder: bool = True
    java_heap_mb: int = 512  # JVM -Xmx (skipped when the user sets JAVA_TOOL_OPTIONS); 0 = JVM default
    call_timeout_s: float = 300.0  # a JVM call taking longer counts as a crash (restart); 0 = no timeout
    # JVMs per process for the rollout's environments: 0 = one per environment; N = the environments spread over N
    # shared JVMs (less memory; environments on one JVM take turns, each in its own world; docs/scienceworld.md)
    jvms: int = 0
