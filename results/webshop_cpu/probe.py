"""First-step action validity of the CPU model on WebShop, per prompt setting (no training).

    python results/webshop_cpu/probe.py [--goals 16] [--samples 4] > results/webshop_cpu/probe.txt

For each setting, the first observation of `--goals` training goals is sampled `--samples` times at temperature
1.0 (the training temperature) with SmolLM2-135M-Instruct, through the project's chat template and generate (an
action prefix is appended to the context and to the text the environment gets, as rollout.action_prefix does):
  well-formed: the environment accepts the output's format (no invalid-action penalty);
  admissible:  the parsed action is legal on the page (WebShop executes it, e.g. a search or a listed click).
"""
import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from config import load_config  # noqa: E402
from envs import make_env  # noqa: E402
from generation import ChatStream, generate  # noqa: E402
from models import load_policy  # noqa: E402

SETTINGS = {  # name: (env.webshop.prompt, env.webshop.require_think, rollout.action_prefix)
    "paper prompt, <think> required (the paper configs)": ("paper", True, ""),
    "paper prompt, <think> not required": ("paper", False, ""),
    "short prompt, <think> not required": ("short", False, ""),
    "short prompt, <think> not required, answer started with <action> (configs/webshop_cpu_*.yaml)":
        ("short", False, "<action>"),
}

parser = argparse.ArgumentParser()
parser.add_argument("--goals", type=int, default=16)
parser.add_argument("--samples", type=int, default=4)
parser.add_argument("--max_new_tokens", type=int, default=48)
args = parser.parse_args()
cfg = load_config("configs/webshop_empo2.yaml", ["--model.name_or_path=smollm2-135m-instruct", "--model.dtype=float32",
                                                 "--model.lora_rank=8", "--model.lora_targets=[q_proj,v_proj]",
                                                 "--model.gradient_checkpointing=false"])
model, tokenizer = load_policy(cfg.model)
chat = ChatStream(tokenizer)
for name, (prompt, require_think, prefix) in SETTINGS.items():
    cfg.env.webshop.prompt, cfg.env.webshop.require_think = prompt, require_think
    env = make_env(cfg.env)
    tasks = env.tasks("train")[: args.goals]
    contexts, seeds = [], []
    for g, task in enumerate(tasks):
        ids = chat.first_turn(env.reset(task)) + (chat.encode(prefix) if prefix else [])
        contexts += [ids] * args.samples
        seeds += [1000 * g + s for s in range(args.samples)]
    outs = generate(model, chat.pad_id, chat.eos_id, contexts, max_new_tokens=args.max_new_tokens, temperature=1.0,
                    seeds=seeds, batch_size=16)
    well, legal, examples = 0, 0, []
    for k, out in enumerate(outs):
        env.reset(tasks[k // args.samples])
        text = prefix + chat.decode(out)  # what the rollout hands the environment
        _, _, _, info = env.step(text)
        well += info["well_formed"]
        legal += info["legal"]
        if len(examples) < 4:
            examples.append(repr(text[:120]))
    n = len(outs)
    print(f"## {name}\nwell-formed {well}/{n} = {well / n:.1%}; admissible {legal}/{n} = {legal / n:.1%}; "
          f"prompt {len(contexts[0])} tokens")
    print("\n".join(f"    {e}" for e in examples), flush=True)
