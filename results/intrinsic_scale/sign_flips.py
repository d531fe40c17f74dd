"""Does the novelty term overturn the score? Recomputed from the committed random-policy measurement.

    python results/intrinsic_scale/sign_flips.py [--data results/intrinsic_scale/power-component.json] [--coef 0.1]

Reads the episodes measure.py wrote (groups = one variation's rollout, 8 episodes), takes the score-decided GRPO
advantage of each episode from its extrinsic return and its novelty B_i = sum_t 1/n_t (`intrinsic_after_sum`, the
counting memory.pay_novelty does), and reports for three forms of the novelty term
  before:   coef * (B_i - group mean of B)                         (advantages.novelty_advantages until 10b5c70)
  centred:  coef * h_c * t_i,  t_i = tanh(B_i - mean_c B)          (the tie-breaker until issue 48)
  after:    coef * h_c * (t_i - mean_c t) / 2                      (advantages.novelty_advantages now)
(c = i's tie class: its group's episodes with its score) the term's range, how many non-zero score advantages
change sign, how many pairs of a group with different scores end in the wrong order (the lower score with the
higher advantage), and the largest |sum of a tie class's terms| (a net push on the class's tokens; 0 = zero-sum).
Writes sign_flips.json next to itself.
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from advantages import group_advantages, novelty_advantages  # noqa: E402


def former_terms(bonuses: list[float], groups: list, coef: float) -> list[float]:
    """coef * (B_i - mean of B over i's group), a group of one: 0."""
    members: dict = {}
    for i, g in enumerate(groups):
        members.setdefault(g, []).append(i)
    return [coef * (b - sum(bonuses[j] for j in members[g]) / len(members[g])) if len(members[g]) > 1 else 0.0
            for b, g in zip(bonuses, groups)]


def centred_terms(base: list[float], bonuses: list[float], scores: list[float], groups: list, coef: float
                  ) -> list[float]:
    """coef * h_c * tanh(B_i - mean_c B): the tie-breaker before issue 48 (centred in B, not in the term). h_c from
    the score advantages themselves: min(gap_c / 2, |a_c|), gap_c / 2 where a_c = 0, 1 where the group ties."""
    terms = [0.0] * len(scores)
    classes: dict = {}
    for i, (g, score) in enumerate(zip(groups, scores)):
        classes.setdefault((g, score), []).append(i)
    for (g, score), tied in classes.items():
        if len(tied) < 2:
            continue
        a = base[tied[0]]
        gap = min((abs(a - base[j[0]]) for (h, other), j in classes.items() if h == g and other != score),
                  default=None)
        h = 1.0 if gap is None else (gap / 2 if a == 0.0 else min(gap / 2, abs(a)))
        mean = sum(bonuses[i] for i in tied) / len(tied)
        for i in tied:
            terms[i] = coef * h * math.tanh(bonuses[i] - mean)
    return terms


def summary(scores: list[float], groups: list, base: list[float], terms: list[float]) -> dict:
    final = [a + t for a, t in zip(base, terms)]
    classes: dict = {}
    for i, (g, score) in enumerate(zip(groups, scores)):
        classes.setdefault((g, score), []).append(i)
    flips = sum(1 for a, f in zip(base, final) if a != 0.0 and a * f <= 0)
    pairs = [(i, j) for i in range(len(scores)) for j in range(len(scores))
             if groups[i] == groups[j] and scores[i] > scores[j]]
    return {"term_min": min(terms), "term_max": max(terms), "sign_flips": flips,
            "score_decided": sum(1 for a in base if a != 0.0),
            "pairs_reordered": sum(final[i] <= final[j] for i, j in pairs), "pairs_with_different_scores": len(pairs),
            "largest_class_sum": max(abs(sum(terms[i] for i in tied)) for tied in classes.values())}


def main() -> None:
    here = Path(__file__).resolve().parent
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=str(here / "power-component.json"))
    parser.add_argument("--coef", type=float, default=0.1)
    args = parser.parse_args()
    episodes = json.loads(Path(args.data).read_text())["episodes"]
    groups = [(e["variation"], e["rollout"]) for e in episodes]
    scores = [e["extrinsic_return"] for e in episodes]
    bonuses = [e["intrinsic_after_sum"] for e in episodes]
    base = group_advantages(scores, groups)
    after = novelty_advantages(base, bonuses, scores, groups, coef=args.coef)
    result = {"data": Path(args.data).name, "coef": args.coef, "episodes": len(episodes),
              "before": summary(scores, groups, base, former_terms(bonuses, groups, args.coef)),
              "centred": summary(scores, groups, base, centred_terms(base, bonuses, scores, groups, args.coef)),
              "after": summary(scores, groups, base, [f - a for f, a in zip(after, base)]),
              "command": " ".join(["python", "results/intrinsic_scale/sign_flips.py"] + sys.argv[1:])}
    (here / "sign_flips.json").write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
