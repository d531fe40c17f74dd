"""How many Qwen2.5 tokens do ScienceWorld prompts take? Input for choosing `rollout.max_prompt_tokens`.

    PYTHONPATH=. python results/context_budget/measure.py --tokenizer Qwen/Qwen2.5-7B-Instruct

(`--tokenizer` takes a hub id or a local folder; `--gguf_file NAME` loads the tokenizer from a GGUF file in that
folder; `--chat_template_qwen25` replaces the tokenizer's chat template by a minimal Qwen2.5-Instruct one.)
Writes results/context_budget/context_budget.json and prints markdown tables. No model is loaded.

Why. The paper's ScienceWorld budget is 4,500 tokens of context (`rollout.max_prompt_tokens`) and 32 per action
(`rollout.max_action_tokens`), with 30 steps. The first user message holds two full gold demos, and memory modes add
a `<tip>` block of 10 tips, so it is not obvious that 30 steps fit. This script measures it with the repository's
own pieces: the real ScienceWorld environment (`envs.make_env_pool`), the real first message (`env.reset`), the
real chat stream (`rollout.ChatStream`, `rollout.full_history_turn`) and real tip blocks (`memory.tip_block`).

What.
1. First message. For each of the paper's 18 tasks, `ChatStream.first_turn(env.reset(task))` (system prompt + user
   turn + generation prompt) with 2 demos and with 1 demo (`env.scienceworld.num_demos`, simplification "easy"),
   for the first `--variations` training variations: characters and tokens.
2. Context growth. Per task, `--episodes` episodes of `--max_steps` steps played in the real environment by a
   scripted policy (no model):
     * episode 0, "random": a uniformly random action *template* (first word of the valid action, "look around" /
       "look at" / ... kept apart), then a uniformly random valid action of that template;
     * episode 1, "gold+random": ScienceWorld's gold actions of the variation, then random as above.
   "focus on" actions are never played (gold ones are skipped too): a wrong focus ends the episode at -100 and a
   right one may end it with success, and we want episodes that run all 30 steps (the long, unsuccessful episodes
   of an early policy, which are the ones that hit the budget); "reset task" is not played either. Episode k plays
   training variation k. A random policy mostly takes actions with short answers; as a pessimistic bound the
   script also reports, per task, first context + 29 x the longest step seen + max_action_tokens (every step as
   long as the longest one, e.g. a "look around" in a big room).
   The model's action is the action text + eos (what the model emits when it stops by itself), cut at
   `max_action_tokens`. Each recorded episode is then replayed through the chat stream in three ways:
     * no_memory: no tip block;
     * memory / history (once the config key rollout.tip_placement, later a test path of rollout.run_episodes,
       gone since issue 50; this script builds it itself): every turn's tip block stays in the history;
     * memory / current_turn (what rollouts always do now; the paper's pi(a | s_t, u, tips_t)):
       the tip-free history (all previous turns without their blocks) + the current turn with its block, played
       through Episode(layout="current_turn") exactly as rollout.run_episodes builds it.
   (on_policy_tips and off_policy play identically: both play with tips.) The block holds 10 hand-written
   TipEntry objects (tips of 40-60 words, the actions from the task's gold path, returns 8-100), the same block on
   every turn (the reference's top-10-by-return retrieval returns the same entries all episode long).
   An episode is truncated "context" at the first step t where len(context_t) + max_action_tokens >
   max_prompt_tokens (rollout.run_episodes); the context lengths of all played steps are kept, so the budget an
   episode would need (max over steps of len(context) + max_action_tokens) and the truncation step under other
   budgets come out too. The tip-writing context (rollout.tip_context: history + final observation + tip prompt,
   then tip_max_tokens new tokens) is reported as well: it has to fit the model's context too.
"""
from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from config import Config  # noqa: E402
from envs import make_env_pool  # noqa: E402
from envs.base import Task  # noqa: E402
from envs.scienceworld.demos import demo_key, demo_path  # noqa: E402
from memory import TipEntry, tip_block  # noqa: E402
from rollout import ChatStream, Episode, full_history_turn, tip_context  # noqa: E402

OUT = Path(__file__).resolve().parent

# The 18 tasks of the paper's Table 1 (docs/algorithm.md, section 9), as ScienceWorld names them.
PAPER_TASKS = [
    "chemistry-mix",
    "chemistry-mix-paint-secondary-color",
    "chemistry-mix-paint-tertiary-color",
    "find-animal",
    "find-living-thing",
    "find-non-living-thing",
    "find-plant",
    "identify-life-stages-1",
    "identify-life-stages-2",
    "lifespan-longest-lived",
    "lifespan-longest-lived-then-shortest-lived",
    "lifespan-shortest-lived",
    "power-component",
    "power-component-renewable-vs-nonrenewable-energy",
    "test-conductivity",
    "test-conductivity-of-unknown-substances",
    "measure-melting-point-known-substance",
    "use-thermometer",
]

QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
# Minimal Qwen2.5-Instruct chat template (ChatML, default system prompt, no tool calls).
QWEN25_TEMPLATE = (
    "{%- if messages[0]['role'] == 'system' %}"
    "{{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}"
    "{%- else %}"
    "{{- '<|im_start|>system\\n" + QWEN25_SYSTEM + "<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- for message in messages %}"
    "{%- if not (loop.first and message['role'] == 'system') %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{%- endif %}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)

# Ten one-sentence tips in the style of the policy's trajectory summaries (rollout.TIP_PROMPT asks for one
# sentence of < 100 words); each is 40-60 words.
TIPS = [
    "I teleported to the workshop, picked up the battery, a wire and the light bulb and connected the battery anode "
    "to the wire, but I never connected the bulb back to the battery cathode, so the circuit stayed open and the "
    "bulb never turned on, which left the task about half done.",
    "Looking around in the kitchen first was useful because it listed the fridge, the oven, the stove and the "
    "thermometer, but I wasted many steps opening cupboards one by one instead of picking up the thermometer and "
    "the substance directly, so I ran out of steps before measuring anything.",
    "The trajectory shows that focusing on the container instead of the object itself fails the task immediately, "
    "so the next attempt should first move the right object into the inventory, check its name with look at, and "
    "only then use focus on that exact object name.",
    "I went to the greenhouse and examined the flower pots, which showed seeds at different life stages, but I "
    "kept looking at the same pot repeatedly instead of waiting for the plants to grow, so I only identified the "
    "first stage and never reached the final adult stage.",
    "Mixing only two of the paints in the art studio produced an intermediate secondary color, and I got partial "
    "credit for it, but the task needed a tertiary color, so after mixing I should have poured the third paint "
    "into the same cup and mixed again before focusing.",
    "Moving between the hallway, the bedroom and the living room without a plan cost most of the episode, and the "
    "only valuable information was that the animals are outside, so next time I should teleport outside at once "
    "and look around before doing anything else there.",
    "I connected the unknown substance into the circuit with the battery and the light bulb and saw that the bulb "
    "was on, which means the substance is electrically conductive, but I put it in the wrong box, so the score "
    "stayed low even though the measurement itself was correct.",
    "Heating the substance on the stove while repeatedly checking the thermometer worked, and the temperature "
    "rose steadily, but I did not keep the thermometer in the same container as the substance, so I never saw "
    "the exact melting point and could not pick the correct answer box.",
    "The animal lifespan task only needed me to go outside, look around to see which animals are there, and then "
    "focus on the longest lived one first and the shortest lived one second, which I did correctly and quickly, "
    "so this trajectory fully completed the task.",
    "Most of my actions were invalid because I used pickup instead of pick up and named objects that were not in "
    "the room, so the environment often replied that no known action matches, and I learned little except that "
    "the solar panel and the wind generator are in the workshop.",
]
TIP_RETURNS = [100.0, 91.0, 83.0, 75.0, 67.0, 50.0, 42.0, 33.0, 25.0, 8.0]  # top-10 by return, highest first
FOCUS = "focus on"
NEVER = ("focus on", "reset task")  # a wrong focus ends the episode at -100; "reset task" restarts the world
BUDGET_GRID = [4500, 6144, 8192, 12288, 16384, 24576, 32768]


# ----------------------------------------------------------------------------- tokenizer and chat stream


def load_tokenizer(path: str, gguf_file: str, qwen25_template: bool):
    """The tokenizer as training loads it (infra.models.load_tokenizer), or from a GGUF file in folder `path`."""
    if gguf_file:
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(path, gguf_file=gguf_file, padding_side="left")
        if tokenizer.pad_token is None:
            tokenizer.pad_token = tokenizer.eos_token
    else:
        from infra.models import load_tokenizer as repo_load_tokenizer, resolve_model_path

        tokenizer = repo_load_tokenizer(resolve_model_path(path))
    if qwen25_template:
        tokenizer.chat_template = QWEN25_TEMPLATE
    return tokenizer


def check_template(tokenizer) -> dict:
    """Does the template render the Qwen2.5-Instruct ChatML strings (default system prompt, one turn, two turns)?"""
    one = tokenizer.apply_chat_template([{"role": "user", "content": "U1"}], tokenize=False,
                                        add_generation_prompt=True)
    two = tokenizer.apply_chat_template(
        [{"role": "user", "content": "U1"}, {"role": "assistant", "content": "A1"}, {"role": "user", "content": "U2"}],
        tokenize=False, add_generation_prompt=True)
    head = f"<|im_start|>system\n{QWEN25_SYSTEM}<|im_end|>\n<|im_start|>user\nU1<|im_end|>\n"
    want_one = head + "<|im_start|>assistant\n"
    want_two = head + "<|im_start|>assistant\nA1<|im_end|>\n<|im_start|>user\nU2<|im_end|>\n<|im_start|>assistant\n"
    return {"matches_qwen25_instruct": one == want_one and two == want_two, "first_turn_rendered": one}


def action_ids(chat: ChatStream, action: str, max_action_tokens: int) -> list[int]:
    """What the model emits for `action`: its tokens + eos, cut at max_action_tokens (engine.generation.generate)."""
    return (chat.encode(action) + [chat.eos_id])[:max_action_tokens]


def make_block(gold: list[str], state: str) -> tuple[str, list[TipEntry]]:
    """A tip block of 10 entries; the actions are the task's own (distinct gold actions, cycled)."""
    actions = list(dict.fromkeys(a for a in gold if a)) or ["look around"]
    entries = [TipEntry(tip=tip, action=actions[i % len(actions)], ret=ret, state=state)
               for i, (tip, ret) in enumerate(zip(TIPS, TIP_RETURNS))]
    return tip_block(entries), entries


# ----------------------------------------------------------------------------- playing episodes


def template_of(action: str) -> str:
    words = action.split()
    return " ".join(words[:2]) if words and words[0] == "look" else (words[0] if words else "")


def random_action(env, rng: random.Random) -> str:
    """A uniformly random template, then a uniformly random valid action of it; never "focus on" or "reset task"."""
    by_template: dict[str, list[str]] = {}
    for action in env.valid_actions():
        if not action.startswith(NEVER):
            by_template.setdefault(template_of(action), []).append(action)
    template = rng.choice(sorted(by_template))
    return rng.choice(by_template[template])


def play(env, task: Task, policy: str, max_steps: int, seed: int) -> dict:
    """One scripted episode: the observations the agent sees and the actions it takes."""
    rng = random.Random(f"{seed}/{task.key}/{policy}")
    started = time.perf_counter()
    gold = [a for a in env.gold_actions(task) if not a.startswith(FOCUS)] if policy == "gold+random" else []
    gold_s = time.perf_counter() - started
    observation = env.reset(task)
    observations, actions, end = [observation], [], "max_steps"
    for _ in range(max_steps):
        action = gold.pop(0) if gold else random_action(env, rng)
        observation, _, done, info = env.step(action)
        actions.append(action)
        observations.append(observation)
        if done:
            end = ("env_error" if info.get("env_error") else "success" if info.get("success")
                   else "failure" if not info.get("truncated") else "max_steps" if len(actions) == max_steps
                   else "move_limit")
            break
    return {"task": task.key, "policy": policy, "observations": observations, "actions": actions, "end": end,
            "gold_s": gold_s, "play_s": time.perf_counter() - started}


def account(chat: ChatStream, record: dict, block: str, placement: str, cfg) -> dict:
    """Replay a recorded episode through the chat stream; context length before each action.

    placement: "history" (the block stays in the history, rollout.full_history_turn) or "current_turn" (tip-free
    history + the current turn with its block). With block "" both are the no_memory stream."""
    name, variation = record["task"].rsplit("/", 1)
    layout = "current_turn" if block and placement == "current_turn" else "packed"
    ep = Episode(task=Task(name, int(variation)), group=0, mode="no_memory" if not block else "on_policy_tips",
                 layout=layout)
    lengths = []
    for observation, action in zip(record["observations"], record["actions"]):
        delta, twin_delta, context = full_history_turn(chat, ep, observation, block, "", [])
        ep.add_prompt(delta, twin_delta)
        # What run_episodes checks against the budget: the context the model is given at this step.
        lengths.append(len(ep.steps[-1].ids) if layout == "current_turn" else len(context))
        ep.add_action(action_ids(chat, action, cfg.rollout.max_action_tokens))
    ep.final_observation = record["observations"][-1]
    tip_tokens = len(tip_context(chat, ep)) + cfg.rollout.tip_max_tokens  # rollout.write_tips' context + the tip

    def truncated_at(budget: int):
        return next((t for t, n in enumerate(lengths) if n + cfg.rollout.max_action_tokens > budget), None)

    return {
        "context_per_step": lengths,
        "truncated_at_step": truncated_at(cfg.rollout.max_prompt_tokens),  # actions taken before truncation
        "needed_budget": max(lengths) + cfg.rollout.max_action_tokens,
        "truncated_at_step_by_budget": {b: truncated_at(b) for b in BUDGET_GRID},
        "tip_writing_tokens": tip_tokens,
    }


# ----------------------------------------------------------------------------- main


def make_config(num_demos: int, demo_cache_dir: str) -> Config:
    cfg = Config()
    cfg.env.name = "scienceworld"
    sw = cfg.env.scienceworld
    sw.tasks, sw.simplification, sw.num_demos, sw.max_steps = list(PAPER_TASKS), "easy", num_demos, 30
    sw.demo_cache_dir = demo_cache_dir
    cfg.rollout.max_prompt_tokens, cfg.rollout.max_action_tokens = 4500, 32  # the paper's budget (configs/*.yaml)
    return cfg


def first_messages(env, chat: ChatStream, cfg: Config, variations: int) -> dict:
    """Per task: chars and first-turn tokens of the first `variations` training variations."""
    out = {}
    train = env.tasks("train")
    for name in PAPER_TASKS:
        rows = [t for t in train if t.name == name][:variations]
        cached = demo_path(cfg.env.scienceworld, demo_key(cfg.env.scienceworld, name)).is_file()
        chars, tokens, resets, texts = [], [], [], []
        for task in rows:
            started = time.perf_counter()
            texts.append(env.reset(task))
            resets.append(time.perf_counter() - started)
            chars.append(len(texts[-1]))
            tokens.append(len(chat.first_turn(texts[-1])))
        out[name] = {"variations": [t.variation for t in rows], "chars": chars, "tokens": tokens,
                     "demo_cache_hit": cached, "first_reset_s": resets[0], "other_resets_s": resets[1:],
                     "text_tokens_no_template": len(chat.encode(texts[0]))}
        print(f"  {name}: {tokens[0]} tokens ({chars[0]} chars), first reset {resets[0]:.1f} s", flush=True)
    return out


def summarize(values: list) -> dict:
    values = [v for v in values if v is not None]
    if not values:
        return {"n": 0}
    return {"n": len(values), "mean": statistics.mean(values), "min": min(values), "max": max(values)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--tokenizer", default="Qwen/Qwen2.5-7B-Instruct", help="hub id or local folder")
    parser.add_argument("--gguf_file", default="", help="load the tokenizer from this GGUF file in --tokenizer")
    parser.add_argument("--chat_template_qwen25", action="store_true",
                        help="replace the chat template by a minimal Qwen2.5-Instruct template")
    parser.add_argument("--variations", type=int, default=5, help="training variations per task (first message)")
    parser.add_argument("--episodes", type=int, default=2, help="scripted episodes per task (0 random, 1 gold+random)")
    parser.add_argument("--max_steps", type=int, default=30)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--demo_cache_dir", default="", help="'' = the repository default demo cache")
    parser.add_argument("--tasks", default="", help="comma-separated subset of the 18 tasks (for a quick try)")
    parser.add_argument("--output", default=str(OUT / "context_budget.json"))
    args = parser.parse_args()
    if args.tasks:
        PAPER_TASKS[:] = [t for t in PAPER_TASKS if t in args.tasks.split(",")]
    t_start = time.perf_counter()

    tokenizer = load_tokenizer(args.tokenizer, args.gguf_file, args.chat_template_qwen25)
    chat = ChatStream(tokenizer)
    template = check_template(tokenizer)
    if not template["matches_qwen25_instruct"]:
        print("WARNING: the chat template does not render Qwen2.5-Instruct's ChatML; see --chat_template_qwen25")
    policies = ["random", "gold+random"][: args.episodes] + ["random"] * max(0, args.episodes - 2)
    result = {
        "command": "PYTHONPATH=. python " + " ".join([str(Path(sys.argv[0]))] + sys.argv[1:]),
        "tokenizer": {"name_or_path": args.tokenizer, "gguf_file": args.gguf_file, "class": type(tokenizer).__name__,
                      "vocab": len(tokenizer), "eos": tokenizer.eos_token, "eos_id": tokenizer.eos_token_id,
                      "chat_template_overridden": args.chat_template_qwen25, **template},
        "settings": {"num_demos": 2, "simplification": "easy", "max_prompt_tokens": 4500, "max_action_tokens": 32,
                     "max_steps": args.max_steps, "tip_max_tokens": Config().rollout.tip_max_tokens,
                     "episodes_per_task": args.episodes, "policies": policies, "seed": args.seed,
                     "budget_grid": BUDGET_GRID},
        "timing_s": {},
    }

    # 1. first messages with 2 demos, and the episodes (same environment)
    cfg = make_config(2, args.demo_cache_dir)
    started = time.perf_counter()
    (env,) = make_env_pool(cfg.env, 1)
    result["timing_s"]["env_start_2demos"] = time.perf_counter() - started
    print("first messages, 2 demos:", flush=True)
    started = time.perf_counter()
    result["first_message_2demos"] = first_messages(env, chat, cfg, args.variations)
    result["timing_s"]["first_messages_2demos"] = time.perf_counter() - started

    print("episodes:", flush=True)
    started = time.perf_counter()
    train = env.tasks("train")
    episodes, blocks = [], {}
    for name in PAPER_TASKS:
        rows = [t for t in train if t.name == name]
        gold0 = env.gold_actions(rows[0])
        block, _ = make_block(gold0, env.reset(rows[0]))
        blocks[name] = {"chars": len(block), "tokens": len(chat.encode(block))}
        result.setdefault("tip_block_example", {"task": name, "text": block})
        for k, policy in enumerate(policies):
            record = play(env, rows[k % len(rows)], policy, args.max_steps, args.seed)
            record["accounting"] = {
                "no_memory": account(chat, record, "", "history", cfg),
                "memory/history": account(chat, record, block, "history", cfg),
                "memory/current_turn": account(chat, record, block, "current_turn", cfg),
            }
            record["action_tokens"] = [len(action_ids(chat, a, 32)) for a in record["actions"]]
            record["observation_tokens"] = [len(chat.encode(o)) for o in record["observations"][1:]]
            del record["observations"]  # kept out of the JSON (size); the token counts stay
            episodes.append(record)
            acc = record["accounting"]
            print(f"  {record['task']} {policy}: {len(record['actions'])} steps ({record['end']}), "
                  f"{record['play_s']:.1f} s; needed " + ", ".join(f"{m} {a['needed_budget']}" for m, a in acc.items()),
                  flush=True)
    result["timing_s"]["episodes"] = time.perf_counter() - started
    result["tip_blocks"] = blocks
    result["episodes"] = episodes
    env.close()

    # 2. first messages with 1 demo
    cfg1 = make_config(1, args.demo_cache_dir)
    started = time.perf_counter()
    (env1,) = make_env_pool(cfg1.env, 1)
    print("first messages, 1 demo:", flush=True)
    result["first_message_1demo"] = first_messages(env1, chat, cfg1, args.variations)
    result["timing_s"]["first_messages_1demo"] = time.perf_counter() - started
    env1.close()

    result["timing_s"]["total"] = time.perf_counter() - t_start
    result["aggregate"] = aggregate(result)
    Path(args.output).parent.mkdir(parents=True, exist_ok=True)
    Path(args.output).write_text(json.dumps(result, indent=1))
    print_tables(result)
    print(f"\nwrote {args.output} ({result['timing_s']['total']:.0f} s)")


def aggregate(result: dict) -> dict:
    """Per task and per (mode/placement): truncation under the paper's budget and the budget needed."""
    modes = ["no_memory", "memory/history", "memory/current_turn"]
    per_task, overall = {}, {}
    for mode in modes:
        accs = [(e, e["accounting"][mode]) for e in result["episodes"]]
        overall[mode] = {
            "episodes": len(accs),
            "truncated_fraction_4500": sum(a["truncated_at_step"] is not None for _, a in accs) / len(accs),
            "truncated_at_step_4500": summarize([a["truncated_at_step"] for _, a in accs]),
            "needed_budget": summarize([a["needed_budget"] for _, a in accs]),
            "tip_writing_tokens": summarize([a["tip_writing_tokens"] for _, a in accs]),
            "truncated_fraction_by_budget": {
                b: sum(a["truncated_at_step_by_budget"][b] is not None for _, a in accs) / len(accs)
                for b in BUDGET_GRID},
        }
        for name in PAPER_TASKS:
            mine = [a for e, a in accs if e["task"].rsplit("/", 1)[0] == name]
            per_task.setdefault(name, {})[mode] = {
                "truncated_fraction_4500": sum(a["truncated_at_step"] is not None for a in mine) / len(mine),
                "truncated_at_step_4500": summarize([a["truncated_at_step"] for a in mine]),
                "needed_budget_max": max(a["needed_budget"] for a in mine),
            }
    growth = {}
    for name in PAPER_TASKS:
        eps = [e for e in result["episodes"] if e["task"].rsplit("/", 1)[0] == name]
        per_step = [(a["context_per_step"][-1] - a["context_per_step"][0]) / max(1, len(a["context_per_step"]) - 1)
                    for a in (e["accounting"]["no_memory"] for e in eps)]
        longest = max(max(b - a for a, b in zip(c, c[1:]))
                      for c in (e["accounting"]["no_memory"]["context_per_step"] for e in eps))
        first_ct = max(e["accounting"]["memory/current_turn"]["context_per_step"][0] for e in eps)
        growth[name] = {"tokens_per_step_mean": statistics.mean(per_step), "longest_step_tokens": longest,
                        "pessimistic_needed_current_turn": first_ct + 29 * longest + 32,
                        "steps_played": [len(e["actions"]) for e in eps], "ends": [e["end"] for e in eps]}
    return {"overall": overall, "per_task": per_task, "growth": growth}


def print_tables(result: dict) -> None:
    f2, f1, agg = result["first_message_2demos"], result["first_message_1demo"], result["aggregate"]
    print("\n| task | 2 demos: tokens (chars), var 0 | 2 demos: max tokens over vars | 1 demo: tokens (chars), var 0 "
          "| 1 demo: max tokens | first reset s (2 demos) |")
    print("|---|---|---|---|---|---|")
    for name in PAPER_TASKS:
        a, b = f2[name], f1[name]
        print(f"| {name} | {a['tokens'][0]:,} ({a['chars'][0]:,}) | {max(a['tokens']):,} | {b['tokens'][0]:,} "
              f"({b['chars'][0]:,}) | {max(b['tokens']):,} | {a['first_reset_s']:.1f} |")
    modes = list(agg["overall"])
    print("\n| task | tip block tokens | tokens/step (longest) | pessimistic current_turn | " + " | ".join(
        f"{m}: trunc@4500 (steps)" for m in modes) + " | " + " | ".join(f"{m}: needed" for m in modes) + " |")
    print("|---" * (4 + 2 * len(modes)) + "|")
    for name in PAPER_TASKS:
        row = agg["per_task"][name]
        cells = []
        for m in modes:
            s = row[m]["truncated_at_step_4500"]
            steps = "-" if s["n"] == 0 else f"{s['min']}-{s['max']}" if s["min"] != s["max"] else f"{s['min']}"
            cells.append(f"{row[m]['truncated_fraction_4500']:.0%} ({steps})")
        g = agg["growth"][name]
        print(f"| {name} | {result['tip_blocks'][name]['tokens']} | {g['tokens_per_step_mean']:.0f} "
              f"({g['longest_step_tokens']}) | {g['pessimistic_needed_current_turn']:,} | "
              + " | ".join(cells) + " | " + " | ".join(f"{row[m]['needed_budget_max']:,}" for m in modes) + " |")
    print("\n| mode/placement | truncated @4500 | mean (min) step | needed: mean / max | tip writing max | "
          + " | ".join(f"trunc @{b}" for b in BUDGET_GRID) + " |")
    print("|---" * (5 + len(BUDGET_GRID)) + "|")
    for m, o in agg["overall"].items():
        s = o["truncated_at_step_4500"]
        step = "-" if s["n"] == 0 else f"{s['mean']:.1f} ({s['min']})"
        print(f"| {m} | {o['truncated_fraction_4500']:.0%} | {step} | {o['needed_budget']['mean']:,.0f} / "
              f"{o['needed_budget']['max']:,} | {o['tip_writing_tokens']['max']:,} | "
              + " | ".join(f"{o['truncated_fraction_by_budget'][b]:.0%}" for b in BUDGET_GRID) + " |")


if __name__ == "__main__":
    main()
