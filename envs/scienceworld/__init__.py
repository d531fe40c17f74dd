"""ScienceWorld (docs/scienceworld.md): the real simulator in a JVM behind the EMPO² Env interface.

    from envs.scienceworld import ScienceWorldEnv, ScienceWorldConfig
    env = ScienceWorldEnv(ScienceWorldConfig(tasks=["power-component"]))   # starts one JVM
    first_prompt = env.reset(env.tasks("train")[0])

Modules: config (options), prompts (reference prompt text, action-text helpers), jvm (JVM process, py4j errors,
logging), demos (gold-path few-shot demos and their cache), env (the Env), __main__ (latency benchmark:
`python -m envs.scienceworld --bench TASK [VARIATION]`). Importing the package loads neither py4j nor scienceworld;
the first JVM does.
"""
from .config import ScienceWorldConfig
from .env import ScienceWorldEnv, shared_hosts
from .prompts import NAIVE_INSTRUCTION, best_match, build_instruction, clean_action, focus_items

__all__ = [
    "NAIVE_INSTRUCTION",
    "ScienceWorldConfig",
    "ScienceWorldEnv",
    "best_match",
    "build_instruction",
    "clean_action",
    "focus_items",
    "shared_hosts",
]
