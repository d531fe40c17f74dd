"""Pilot of issue 49 (c): how far the tip-free log-prob of "flip the main switch" at its state moves per update.

    python results/pilot_switch/probe_switch.py --run RUN_DIR [--adapter WARMUP_MODEL_DIR] [--out FILE]

For the warm-up adapter (iteration 0) and every checkpoint RUN_DIR/checkpoints/iter_XXXXXX/model (a run with
train.save_every=1 and train.keep_checkpoints=0), on each training variation of the run's lab (RUN_DIR/config.yaml):
the lab's gold episode in the rollout's tip-free full-history layout (tools.warmup.gold_episode), and the summed
log-prob of the tokens of its second command, "flip the main switch", at the state right after the wire is connected
(the one step only memory can teach). Prints and writes per iteration the mean over variations and the move from the
previous iteration; RUN_DIR/metrics.jsonl gives each iteration's mode.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import torch  # noqa: E402

from config import load_config  # noqa: E402
from engine.generation import ChatStream  # noqa: E402
from envs.sanity import SanityEnv  # noqa: E402
from infra.models import load_policy  # noqa: E402
from losses import sequence_action_logprobs  # noqa: E402
from samples import action_runs  # noqa: E402
from tools.warmup import gold_episode  # noqa: E402

SWITCH = "flip the main switch"


@torch.no_grad()
def switch_logprobs(model, chat: ChatStream, episodes: list) -> list[float]:
    """Per gold episode: the summed log-prob of the switch command's tokens (its eos included), tip-free."""
    logps, _ = sequence_action_logprobs(model, [ep.ids for ep in episodes], [ep.mask for ep in episodes],
                                        chat.pad_id, torch.device("cpu"))
    out = []
    for ep, logp in zip(episodes, logps):
        step = ep.actions.index(SWITCH)
        runs = action_runs(ep.mask)
        start = sum(runs[:step])
        out.append(float(logp[start:start + runs[step]].sum()))
    return out


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--run", required=True)
    parser.add_argument("--adapter", default="", help="the warm-up adapter (iteration 0); default: the run's")
    parser.add_argument("--out", default="")
    args = parser.parse_args()
    run = Path(args.run)
    cfg = load_config(run / "config.yaml")
    torch.set_num_threads(cfg.train.torch_threads or torch.get_num_threads())
    env = SanityEnv(cfg.env.sanity)
    modes = {r["iteration"]: r["mode"] for r in map(json.loads, (run / "metrics.jsonl").read_text().splitlines())}
    folders = [(0, Path(args.adapter or cfg.model.init_adapter))]
    folders += [(int(f.name.split("_")[1]), f / "model") for f in sorted((run / "checkpoints").glob("iter_*"))]
    rows, previous, episodes = [], None, None
    for iteration, folder in folders:
        model, tokenizer = load_policy(replace(cfg.model, init_adapter=str(folder)))
        model.eval()
        chat = ChatStream(tokenizer)
        if episodes is None:  # the same tokenizer in every checkpoint: the gold streams once
            prefix = chat.encode(cfg.rollout.action_prefix) if cfg.rollout.action_prefix else []
            episodes = [gold_episode(env, t, chat, prefix, env.turn_reminder()) for t in env.tasks("train")]
        values = switch_logprobs(model, chat, episodes)
        mean = sum(values) / len(values)
        row = {"iteration": iteration, "mode": modes.get(iteration, "warm-up"), "switch_logp": mean,
               "move": None if previous is None else mean - previous, "variations": len(values)}
        previous = mean
        rows.append(row)
        print(json.dumps(row), flush=True)
    out = Path(args.out) if args.out else run / "switch_logp.json"
    out.write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
