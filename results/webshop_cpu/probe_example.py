"""Does SmolLM2 copy the short prompt's example query? First-step actions per wording of the example (no training).

    python results/webshop_cpu/probe_example.py [--goals 16] [--samples 4] > results/webshop_cpu/probe_example.txt

The CPU setting (configs/webshop_cpu_*.yaml: short prompt, <think> not required, the answer started with
"<action>"), with the short prompt's last sentence worded per VARIANTS. For each, the first observation of
`--goals` training goals is sampled `--samples` times at temperature 1.0, as probe.py does, and counted:
  well-formed, admissible: as probe.py;
  copies the example:      the action is a search for the example's own query;
  on-goal search:          a search whose query shares a content word (4+ letters) with the goal instruction.
"""
import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
import envs.webshop.env as webshop_env  # noqa: E402
from config import load_config  # noqa: E402
from envs import make_env  # noqa: E402
from generation import ChatStream, generate  # noqa: E402
from models import load_policy  # noqa: E402

HEAD = ("Your admissible actions of the current situation are: [{actions}]. "
        "Reply with exactly one admissible action inside <action></action> tags and nothing else")
VARIANTS = {  # name: (the sentence's end, the example query a copy would repeat)
    "example query 'red cotton t-shirt' (the short prompt today)":
        (", for example <action>search[red cotton t-shirt]</action> or <action>click[buy now]</action>.",
         "red cotton t-shirt"),
    "no example": (".", None),
    "placeholder example 'words from your task'":
        (", for example <action>search[words from your task]</action> or <action>click[buy now]</action>.",
         "words from your task"),
}
WORD = re.compile(r"[a-z]{4,}")

parser = argparse.ArgumentParser()
parser.add_argument("--goals", type=int, default=16)
parser.add_argument("--samples", type=int, default=4)
parser.add_argument("--max_new_tokens", type=int, default=32)
args = parser.parse_args()
cfg = load_config("configs/webshop_cpu_grpo.yaml", [])
model, tokenizer = load_policy(cfg.model)
chat = ChatStream(tokenizer)
prefix = cfg.rollout.action_prefix
for name, (tail, example) in VARIANTS.items():
    webshop_env.PROMPT_TAIL_SHORT = HEAD + tail
    env = make_env(cfg.env)
    tasks = env.tasks("train")[: args.goals]
    contexts, seeds, goals = [], [], []
    for g, task in enumerate(tasks):
        first = env.reset(task)
        goal = re.search(r"Your task is to: (.*?)\. Your current observation", first, re.DOTALL).group(1)
        contexts += [chat.first_turn(first) + chat.encode(prefix)] * args.samples
        seeds += [1000 * g + s for s in range(args.samples)]
        goals += [set(WORD.findall(goal.lower()))] * args.samples
    outs = generate(model, chat.pad_id, chat.eos_id, contexts, max_new_tokens=args.max_new_tokens, temperature=1.0,
                    seeds=seeds, batch_size=16)
    well = legal = copies = on_goal = 0
    examples = []
    for k, out in enumerate(outs):
        env.reset(tasks[k // args.samples])
        text = prefix + chat.decode(out)
        action, _ = webshop_env.parse_model_output(text, require_think=False)
        _, _, _, info = env.step(text)
        well += info["well_formed"]
        legal += info["legal"]
        query = action[len("search["):-1].lower() if action and action.lower().startswith("search[") else None
        copies += bool(query and example and query.strip() == example)
        on_goal += bool(query and set(WORD.findall(query)) & goals[k])
        if len(examples) < 4:
            examples.append(repr(text[:100]))
    n = len(outs)
    print(f"## {name}\nwell-formed {well}/{n}; admissible {legal}/{n}; copies the example {copies}/{n}; "
          f"on-goal search {on_goal}/{n}; prompt {len(contexts[0])} tokens")
    print("\n".join(f"    {e}" for e in examples), flush=True)
