"""The quickstart before/after the training-signal changes: per-mode metrics, the rate of actions the environment had
to correct, and how often the novelty bonus flips the sign of an episode's advantage under each form.

    PYTHONPATH=. python results/training_signal/analyse.py BEFORE_RUN AFTER_RUN > results/training_signal/summary.json

Each run is `train.py --config configs/quickstart.yaml --train.log_episodes=-1` (every episode logged, same seed 19).
Both bonus forms are applied to the SAME logged episodes of each run (extrinsic returns and per-step bonuses 1/n_t):
    former:  A = normalise(R + 1.0 x mean_t 1/n_t)                      (intrinsic.combine=return, aggregate=mean)
    current: A = normalise(R) + 0.1 x (sum_t 1/n_t - group mean)        (intrinsic.combine=advantage, aggregate=sum)
A flip: sign(A) differs from sign(A without any bonus) for an episode whose score advantage is not 0; a tie: an
episode in a group whose scores are all equal (its score advantage is 0), where any advantage comes from the bonus.
"""
import json
import sys
from pathlib import Path

from advantages import group_advantages, novelty_advantages


def episodes(run: Path) -> dict[int, list[dict]]:
    out: dict[int, list[dict]] = {}
    for file in sorted((run / "episodes").glob("iter_*_rank*.jsonl")):
        iteration = int(file.name.split("_")[1])
        out.setdefault(iteration, []).extend(json.loads(line) for line in file.read_text().splitlines())
    return out


def bonus_statistics(by_iteration: dict[int, list[dict]]) -> dict:
    stats = {"former": [0, 0, 0, 0.0], "current": [0, 0, 0, 0.0]}  # flips, decided, tie episodes, sum |A| at ties
    for eps in by_iteration.values():
        groups = [e["group"] for e in eps]
        score = [e["extrinsic_return"] for e in eps]
        plain = group_advantages(score, groups)
        former = group_advantages([s + (sum(e["intrinsic"]) / len(e["intrinsic"]) if e["intrinsic"] else 0.0)
                                   for s, e in zip(score, eps)], groups)
        current = novelty_advantages(plain, [sum(e["intrinsic"]) for e in eps], groups, 0.1)
        for name, adv in (("former", former), ("current", current)):
            for a0, a in zip(plain, adv):
                if a0 != 0.0:
                    stats[name][1] += 1
                    stats[name][0] += (a0 > 0) != (a > 0)
                else:
                    stats[name][2] += 1
                    stats[name][3] += abs(a)
    return {name: {"sign_flips": f, "episodes_with_score_advantage": d,
                   "flip_rate": f / d if d else 0.0, "tie_episodes": t,
                   "mean_abs_advantage_at_ties": s / t if t else 0.0} for name, (f, d, t, s) in stats.items()}


# The verbs of the instruction's action formats and of ScienceWorld's other actions: an output that starts with one
# at least follows the answer format, even if it names no valid object.
VERBS = {"open", "close", "go", "focus", "move", "connect", "disconnect", "pour", "mix", "pickup", "pick", "put",
         "look", "read", "activate", "deactivate", "use", "eat", "wait", "wait1", "teleport", "inventory", "flush",
         "dunk", "drop", "task"}


def corrected(by_iteration: dict[int, list[dict]]) -> dict:
    flags = [c for eps in by_iteration.values() for e in eps for c in e.get("corrected", [])]
    actions = [a for eps in by_iteration.values() for e in eps for a in e["actions"]]
    later = [a for eps in by_iteration.values() for e in eps for a in e["actions"][1:]]  # turns with a reminder

    def verb(a: str) -> bool:
        words = a.strip().lower().split()
        return bool(words) and words[0].strip(".,:;!\"'`*") in VERBS

    return {"actions": len(flags), "corrected": sum(flags), "rate": sum(flags) / len(flags) if flags else 0.0,
            "starts_with_an_action_verb": sum(map(verb, actions)) / len(actions) if actions else 0.0,
            "starts_with_an_action_verb_after_turn_1": sum(map(verb, later)) / len(later) if later else 0.0}


def metrics(run: Path) -> list[dict]:
    keys = ("iteration", "mode", "return_mean", "loss", "grad_norm", "optimizer_steps", "samples", "train_steps",
            "episode_length", "intrinsic_return_mean", "action_corrected_rate", "tips_retrieved", "val_return_mean",
            "time_rollout", "time_tips", "time_update")
    return [{k: row[k] for k in keys if k in row} for row in map(json.loads, (run / "metrics.jsonl").read_text()
                                                              .splitlines())]


def main(before: str, after: str) -> None:
    out = {}
    for name, run in (("before", Path(before)), ("after", Path(after))):
        eps = episodes(run)
        out[name] = {"metrics": metrics(run), "corrected_actions": corrected(eps), "bonus_forms": bonus_statistics(eps)}
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:3])
