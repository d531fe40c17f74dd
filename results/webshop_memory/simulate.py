"""Tip hit rate per memory key on WebShop, simulated: no model is needed, because whether a row's step finds a tip
depends only on which goals earlier iterations played (tips written in iteration t are visible from t + 1).

    python results/webshop_memory/simulate.py [--iterations 200] [--data_dir DIR] [--goal_source human]

Row draws are train.py's (`iteration_tasks`, 16 rows per iteration, seed 0, the paper config). For each iteration
and key, the hit rate is the share of rows whose first step (the search page, which shows the instruction) would
retrieve >= 1 tip:
  task                 the row's goal was played in an earlier iteration
  family, none         any row was played earlier (every goal's tips share one slot; top-k by return)
  family, jaccard > x  an earlier row's instruction has word-set Jaccard > x with this row's instruction
  prompt jaccard > 0.5 the same on the whole first user message, the text the memory's filter compares today
                       (memory.similarity=jaccard): the fixed prompt template dominates it
Later steps (result pages, item pages) are not simulated: their observations are not known without a policy.

Tip relevance (tip_relevance.md): the real TipMemory of the WebShop configs (memory.key family, similarity none,
top 10, capacity 1000) filled as a run fills it: every iteration each row's 8 episodes write one entry per step
(`--steps` values), one tip sentence per episode, return 10 with probability `--p_success` (else 0), the goal =
the row's first user message (what memory.tip_entries stores). At each row's first step: the share of the shown
tips written for a goal with the same product type (the goal's `query`) and the hit rate, retrieved by return
alone (before: what retrieval did without the goal) and by goal similarity, then return (after).
"""
import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from envs.webshop.config import WebShopConfig  # noqa: E402
from envs.webshop.env import WebShopEnv  # noqa: E402
from memory import TipEntry, TipMemory  # noqa: E402
from infra.runtime import Seeds  # noqa: E402
from train import iteration_tasks  # noqa: E402


def relevance(env, train_tasks, args, steps: int, goal_of) -> dict:
    """Per iteration: (same-product-type share of shown tips, hit rate), before and after; see the docstring."""
    memory = TipMemory(capacity=1000, top_k=10, key_by="family")
    rng = np.random.default_rng(0)
    query_of = {}  # stored goal text -> its product type
    out = {"before": [], "after": [], "hit_before": [], "hit_after": []}
    for iteration in range(1, args.iterations + 1):
        rows = iteration_tasks(train_tasks, args.rows, Seeds(0, iteration, 0).tasks)
        for form, goal_arg in (("before", lambda g: ""), ("after", lambda g: g)):
            same, shown, hits = 0, 0, []
            for t in rows:
                goal = goal_of(t)
                query_of[goal] = env.world.goals[t.variation]["query"]
                tips = memory.retrieve(t.key, "", goal_arg(goal))
                same += sum(query_of[e.goal] == query_of[goal] for e in tips)
                shown += len(tips)
                hits.append(bool(tips))
            out[form].append(same / shown if shown else float("nan"))
            out["hit_" + form].append(float(np.mean(hits)))
        for r, t in enumerate(rows):
            for e in range(args.group):
                ret = 10.0 if rng.random() < args.p_success else 0.0
                for step in range(steps):
                    memory.stage(t.key, TipEntry(f"tip {iteration}-{r}-{e}", f"action {step}", ret, "",
                                                 goal_of(t), 10.0))
        memory.sync()
    return out


def relevance_table(env, train_tasks, args) -> list[str]:
    """The tip-relevance table (markdown lines), also written as tip_relevance.json."""
    first = {}

    def first_message(t):
        if t.variation not in first:
            first[t.variation] = env.reset(t)
        return first[t.variation]

    instruction = lambda t: env.world.goals[t.variation]["instruction_text"]  # noqa: E731
    lines = [f"# Tip relevance, WebShop family slot ({len(train_tasks)} training goals, {args.rows} rows x "
             f"{args.group} episodes per iteration, {args.iterations} iterations, P(return 10) = {args.p_success})",
             "", "Share of the tips shown at a row's first step that were written for a goal with the same product "
             "type (the goal's query; 38 types), and the share of rows shown >= 1 tip; means over iterations "
             "2-{0} (iteration 1 has no tips):".format(args.iterations), "",
             "| steps per episode | goal compared | same type, before | same type, after | hit rate, before | "
             "hit rate, after |", "|---|---|---|---|---|---|"]
    result = {}
    for steps in args.steps:
        for name, goal_of in (("first message", first_message), ("instruction only", instruction)):
            r = relevance(env, train_tasks, args, steps, goal_of)
            result[f"{steps} steps, {name}"] = {k: float(np.nanmean(v[1:])) for k, v in r.items()}
            m = result[f"{steps} steps, {name}"]
            lines.append(f"| {steps} | {name} | {m['before']:.1%} | {m['after']:.1%} | {m['hit_before']:.1%} | "
                         f"{m['hit_after']:.1%} |")
    lines += ["", "`first message` is what the code stores and compares (memory.tip_entries); `instruction only` "
              "compares the instructions alone, for reference (the prompt template around them is shared)."]
    (Path(args.out) / "tip_relevance.json").write_text(json.dumps(result, indent=1))
    return lines


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--iterations", type=int, default=200)
    parser.add_argument("--rows", type=int, default=16)
    parser.add_argument("--data_dir", default="")
    parser.add_argument("--goal_source", default="synthetic")
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent))
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 5, 15])
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--p_success", type=float, default=0.25)
    args = parser.parse_args()
    env = WebShopEnv(WebShopConfig(data_dir=args.data_dir, goal_source=args.goal_source))
    train_tasks = env.tasks("train")
    words, prompt_words = {}, {}  # goal -> word set of its instruction / of its first user message

    def first_words(task):
        if task.variation not in words:
            words[task.variation] = frozenset(env.world.goals[task.variation]["instruction_text"].lower().split())
            prompt_words[task.variation] = frozenset(env.reset(task).lower().split())
        return words[task.variation]

    thresholds = (0.3, 0.5, 0.7)
    keys = (["task", "family, none"] + [f"family, jaccard > {x}" for x in thresholds] + ["prompt jaccard > 0.5"])
    hits = {k: [] for k in keys}
    played: list[frozenset] = []
    played_prompts: set[frozenset] = set()
    played_goals: set[int] = set()
    for iteration in range(1, args.iterations + 1):
        rows = iteration_tasks(train_tasks, args.rows, Seeds(0, iteration, 0).tasks)
        hits["task"].append(np.mean([t.variation in played_goals for t in rows]))
        hits["family, none"].append(float(bool(played)))
        unique = list(set(played))
        for x in thresholds:
            row_hits = []
            for t in rows:
                w = first_words(t)
                row_hits.append(any(len(w & p) / len(w | p) > x for p in unique))
            hits[f"family, jaccard > {x}"].append(np.mean(row_hits))
        hits["prompt jaccard > 0.5"].append(np.mean([any(
            len(prompt_words[t.variation] & p) / len(prompt_words[t.variation] | p) > 0.5 for p in played_prompts)
            for t in rows if first_words(t)]))
        played += [first_words(t) for t in rows]
        played_prompts |= {prompt_words[t.variation] for t in rows}
        played_goals |= {t.variation for t in rows}
    windows = [(1, 10), (11, 50), (51, 100), (101, 200)]
    table = {k: {f"{a}-{b}": float(np.mean(v[a - 1:b])) for a, b in windows if b <= len(v)} | {
        "all": float(np.mean(v))} for k, v in hits.items()}
    source = args.data_dir or "the offline generated catalogue"
    lines = [f"# Tip hit rate per memory key, WebShop ({len(train_tasks)} training goals from {source}, "
             f"{args.goal_source} goals; {args.rows} rows per iteration, {args.iterations} iterations)", "",
             "Share of rows whose first step retrieves >= 1 tip, mean over iterations:", "",
             "| memory key | " + " | ".join(f"iterations {w}" for w in next(iter(table.values()))) + " |",
             "|---|" + "---|" * len(next(iter(table.values())))]
    lines += [f"| {k} | " + " | ".join(f"{v:.1%}" for v in row.values()) + " |" for k, row in table.items()]
    out = Path(args.out)
    name = "hit_rate" + ("_" + Path(args.data_dir).name if args.data_dir else "")
    (out / f"{name}.json").write_text(json.dumps({"train_goals": len(train_tasks), "per_iteration": hits,
                                                  "summary": table}, indent=1, default=float))
    (out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    if not args.data_dir:
        lines = relevance_table(env, train_tasks, args)
        (out / "tip_relevance.md").write_text("\n".join(lines) + "\n")
        print("\n".join(lines))


if __name__ == "__main__":
    main()
