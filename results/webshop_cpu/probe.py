"""First-step actions of the CPU model on WebShop, per prompt setting (no training).

    python results/webshop_cpu/probe.py --study format  [--goals 16] [--samples 4] > results/webshop_cpu/probe.txt
    python results/webshop_cpu/probe.py --study example [--goals 16] [--samples 4] > results/webshop_cpu/probe_example.txt

For each setting, the first observation of `--goals` training goals is sampled `--samples` times at temperature 1.0
(the training temperature) with SmolLM2-135M-Instruct, through the project's chat template and generate (an action
prefix is appended to the context and to the text the environment gets, as rollout.action_prefix does), and counted:
  well-formed:        the environment accepts the output's format (no invalid-action penalty);
  admissible:         the parsed action is legal on the page (WebShop executes it, e.g. a search or a listed click);
  copies the example: (example study) the action is a search for the example's own query;
  on-goal search:     (example study) a search whose query shares a content word (4+ letters) with the goal.

Studies:
  format:  which prompt and answer format the model can follow at all (paper prompt vs short prompt, <think>
           required or not, the answer started with "<action>");
  example: the CPU setting (configs/webshop_cpu_*.yaml) with the short prompt's last sentence worded three ways:
           does the model copy the example query instead of searching for its goal?
"""
import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import envs.webshop.env as webshop_env  # noqa: E402
from config import load_config  # noqa: E402
from envs import make_env  # noqa: E402
from engine.generation import ChatStream, generate  # noqa: E402
from infra.models import load_policy  # noqa: E402

FORMATS = {  # name: (env.webshop.prompt, env.webshop.require_think, rollout.action_prefix)
    "paper prompt, <think> required (the paper configs)": ("paper", True, ""),
    "paper prompt, <think> not required": ("paper", False, ""),
    "short prompt, <think> not required": ("short", False, ""),
    "short prompt, <think> not required, answer started with <action> (configs/webshop_cpu_*.yaml)":
        ("short", False, "<action>"),
}
HEAD = ("Your admissible actions of the current situation are: [{actions}]. "
        "Reply with exactly one admissible action inside <action></action> tags and nothing else")
EXAMPLES = {  # name: (the short prompt's last sentence ends so, the example query a copy would repeat)
    "example query 'red cotton t-shirt' (the short prompt today)":
        (", for example <action>search[red cotton t-shirt]</action> or <action>click[buy now]</action>.",
         "red cotton t-shirt"),
    "no example": (".", None),
    "placeholder example 'words from your task'":
        (", for example <action>search[words from your task]</action> or <action>click[buy now]</action>.",
         "words from your task"),
}
WORD = re.compile(r"[a-z]{4,}")


def first_actions(model, chat, env, prefix: str, goals: int, samples: int, max_new_tokens: int):
    """Sample `samples` first actions for each of the first `goals` training goals; yields (goal text, what the
    environment got, the step's info) per sample, the environment reset to that goal before the step."""
    tasks = env.tasks("train")[:goals]
    contexts, seeds, goal_texts = [], [], []
    for g, task in enumerate(tasks):
        first = env.reset(task)
        goal_texts.append(re.search(r"Your task is to: (.*?)\. Your current observation", first, re.DOTALL).group(1))
        contexts += [chat.first_turn(first) + (chat.encode(prefix) if prefix else [])] * samples
        seeds += [1000 * g + s for s in range(samples)]
    outs = generate(model, chat.pad_id, chat.eos_id, contexts, max_new_tokens=max_new_tokens, temperature=1.0,
                    seeds=seeds, batch_size=16)
    for k, out in enumerate(outs):
        env.reset(tasks[k // samples])
        text = prefix + chat.decode(out)  # what the rollout hands the environment
        _, _, _, info = env.step(text)
        yield goal_texts[k // samples], text, info, len(contexts[0])


def report(name: str, rows: list[tuple], example: str | None, study: str) -> None:
    n = len(rows)
    well = sum(info["well_formed"] for _, _, info, _ in rows)
    legal = sum(info["legal"] for _, _, info, _ in rows)
    line = f"well-formed {well}/{n} = {well / n:.1%}; admissible {legal}/{n} = {legal / n:.1%}"
    if study == "example":
        copies = on_goal = 0
        for goal, text, _, _ in rows:
            action, _ = webshop_env.parse_model_output(text, require_think=False)
            query = action[len("search["):-1].lower() if action and action.lower().startswith("search[") else None
            copies += bool(query and example and query.strip() == example)
            on_goal += bool(query and set(WORD.findall(query)) & set(WORD.findall(goal.lower())))
        line += f"; copies the example {copies}/{n}; on-goal search {on_goal}/{n}"
    print(f"## {name}\n{line}; prompt {rows[0][3]} tokens")
    print("\n".join(f"    {text[:120]!r}" for _, text, _, _ in rows[:4]), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--study", choices=["format", "example"], default="format")
    parser.add_argument("--goals", type=int, default=16)
    parser.add_argument("--samples", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=None, help="default: 48 (format), 32 (example)")
    args = parser.parse_args()
    max_new_tokens = args.max_new_tokens or (48 if args.study == "format" else 32)
    if args.study == "format":
        cfg = load_config("configs/webshop_empo2.yaml", [
            "--model.name_or_path=smollm2-135m-instruct", "--model.dtype=float32", "--model.lora_rank=8",
            "--model.lora_targets=[q_proj,v_proj]", "--model.gradient_checkpointing=false"])
    else:
        cfg = load_config("configs/webshop_cpu_grpo.yaml", [])
    model, tokenizer = load_policy(cfg.model)
    chat = ChatStream(tokenizer)
    settings = FORMATS if args.study == "format" else EXAMPLES
    for name, setting in settings.items():
        if args.study == "format":
            cfg.env.webshop.prompt, cfg.env.webshop.require_think, prefix = setting
            example = None
        else:
            tail, example = setting
            webshop_env.PROMPT_TAIL_SHORT = HEAD + tail
            prefix = cfg.rollout.action_prefix
        env = make_env(cfg.env)
        rows = list(first_actions(model, chat, env, prefix, args.goals, args.samples, max_new_tokens))
        report(name, rows, example, args.study)


if __name__ == "__main__":
    main()
