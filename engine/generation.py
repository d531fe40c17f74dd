"""Batched sampling with HF `generate`, and per-episode KV-cache reuse across turns (docs/performance.md).

An agent's conversation is an append-only token stream: turn t+1's context is turn t's context + the action the
model generated + the next user turn. Re-encoding the whole history at every turn prefills O(T^2) tokens over a
T-turn episode; keeping each episode's keys/values between turns prefills O(T). This is what vLLM's prefix
caching gives peers, done here on plain `generate`:

* every episode owns a `PrefixCache` (engine/kvcache.py): the keys/values of a prefix of its own stream, trimmed of pads;
* `generate(..., caches=...)` reuses, for each row, the longest common prefix of its cache and its new context:
  the reused parts go left-padded into one batch cache, one forward encodes the rest of each context but its last
  token (right-padded, `feed_prefixes`: no attention row is ever fully masked), and `generate` starts from the
  last tokens (nothing padded). Position ids count real tokens only, so each token gets the position it would have
  without reuse. Afterwards the grown batch is split back into one trimmed `PrefixCache` per row that needs one;
* `prefill` encodes identical contexts once (the N episodes of a GRPO group start from the same first message)
  and hands every episode of the group the same cache;
* the tip prompt is the episode stream + one user turn, so tip writing reuses the episode's cache for free, and
  a history-window prompt (WebShop) reuses the part it shares with the previous step's prompt (instruction).

`RowSampler(record=True)` keeps the log-prob of every sampled token under the model (`generate(logprobs=...)`):
the update's old log-probs without a second forward (docs/decisions.md); its uniforms are drawn once per call.
`ScoreCheck` turns NaN/inf scores into `NonFiniteScoresError` instead of a silent token. A tip stops at its first
line (`FirstLineStop`) and its batch cache is dropped, not split back (`keep_caches=False`).

Rows that finish (eos or the token limit) simply drop out of the next call: caches are per episode, not per
batch slot. The price is a copy of the reused keys/values into the batch at every call (memory traffic, not
compute: on this CPU it is ~1% of the prefill it replaces), made layer by layer so the keys/values exist about
once (engine/kvcache.py), and holding each live episode's cache between turns. With greedy decoding the reused and the
re-encoded paths produce the same tokens (tests/test_generation.py); the logits differ only by summation order.

A model with fp32 master weights that computes under autocast (full fine-tuning without FSDP, infra.models.load_policy)
generates inside ONE autocast region per call (`one_autocast_region`): autocast caches the compute-dtype copy of
every weight until its outermost region ends, so the weights are cast once per call, not once per decode step.

`ChatStream` turns a tokenizer's chat template into the append-only token deltas the streams are built from
(first turn, the closing of an action, the next user turn). Every row stops at any eos id of the model's
generation config (`stop_ids`: Qwen2.5 has two). A sliding-window model cannot reuse caches
(`engine.kvcache.supports_kv_reuse`); the rollout then re-encodes with a warning.
"""
from __future__ import annotations

import functools

import torch

from engine.kvcache import PrefixCache, batched_cache, split_cache


def left_pad(rows: list[list[int]], pad_id: int, width: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids [B, W], attention mask [B, W]), right-aligned."""
    width = max(len(r) for r in rows) if width is None else width
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, width - len(row) :] = torch.tensor(row)
            mask[i, width - len(row) :] = 1
    return ids, mask


def right_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Token lists -> (ids [B, W], attention mask [B, W]), left-aligned."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        if row:
            ids[i, : len(row)] = torch.tensor(row)
            mask[i, : len(row)] = 1
    return ids, mask


def sampling_kwargs(temperature: float, top_p: float) -> dict:
    """Pure temperature/top-p sampling (no top-k), or greedy decoding at temperature 0."""
    if temperature > 0:
        return dict(do_sample=True, temperature=temperature, top_p=top_p, top_k=0)
    return dict(do_sample=False, temperature=None, top_p=None, top_k=None)


class RowSampler:
    """A logits processor that samples every row from its own seeded torch.Generator (temperature and top-p applied
    here) and returns logits that allow only the chosen token, which greedy decoding then takes. So a row's tokens
    depend on its seed and its own logits only: not on the other rows of the batch, the batch size, or what was
    sampled before from torch's global stream (which it leaves untouched). temperature 0: the argmax (greedy).

    The uniforms of all `steps` calls are drawn up front, one CPU tensor per row (the same numbers, in the same
    order, as one torch.rand(()) per call; tested), and copied to the device once: no host work per token.

    record=True also keeps, per call, log softmax(logits)[chosen]: the log-prob of the sampled token under the
    model's own (untempered, unfiltered) distribution, the pi the loss scores. At temperature 1 and top-p 1 that is
    the distribution the token was drawn from; otherwise it is still what a recomputing forward would give."""

    def __init__(self, seeds: list[int] | None, temperature: float, top_p: float, record: bool = False,
                 steps: int = 1):
        self.temperature, self.top_p, self.calls = temperature, top_p, 0
        self.uniforms = None  # [B, steps]
        if temperature > 0:
            generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds]
            self.uniforms = torch.stack([torch.rand(steps, generator=g) for g in generators])
        self.recorded: list[torch.Tensor] | None = [] if record else None  # one [B] tensor per call, on the device

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.temperature > 0:
            chosen = self._draw(scores)
        else:
            chosen = scores.argmax(-1, keepdim=True)  # the first maximum, as greedy `generate` takes it
        self.calls += 1
        if self.recorded is not None:  # [B, V] -> [B]; no host sync here (read once after the call)
            self.recorded.append(torch.log_softmax(scores.float(), -1).gather(-1, chosen).squeeze(-1))
        return torch.full_like(scores, float("-inf")).scatter(-1, chosen, 0.0)

    def _draw(self, scores: torch.Tensor) -> torch.Tensor:
        """[B, V] logits -> [B, 1] the token each row's own generator draws from softmax(scores / T), top-p."""
        if self.calls >= self.uniforms.shape[1]:
            raise RuntimeError(f"RowSampler drew its {self.uniforms.shape[1]} uniforms per row: called once more")
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)  # [B, V]
        if self.top_p < 1.0:  # keep the smallest set of most likely tokens whose mass reaches top_p
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            outside = sorted_probs.cumsum(-1) - sorted_probs > self.top_p
            probs = probs.scatter(-1, order, sorted_probs.masked_fill(outside, 0.0))
        cdf = probs.cumsum(-1)
        self.uniforms = self.uniforms.to(cdf.device)  # a no-op after the first call
        uniform = self.uniforms[:, self.calls]
        chosen = torch.searchsorted(cdf, (uniform * cdf[:, -1]).unsqueeze(-1), right=True)
        # u * total rounds up to total once in ~1e7 draws: stay on the last token that has probability
        last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).to(torch.int64).argmax(-1, keepdim=True)
        return torch.minimum(chosen, last)

    def logprobs(self, rows: list[list[int]]) -> list[list[float]]:
        """The recorded log-probs of each row's kept tokens (rows: the generated rows as cut by `cut_at_eos`)."""
        table = torch.stack(self.recorded, 1).cpu().tolist() if self.recorded else [[] for _ in rows]  # [B, calls]
        return [values[: len(row)] for values, row in zip(table, rows)]


class NonFiniteScoresError(RuntimeError):
    """The model gave NaN or infinite next-token scores: nothing can be sampled from them."""


class ScoreCheck:
    """The first logits processor of every call: a row whose scores are not finite (NaN, +inf, or all -inf) is
    noted with the step it happened at and set to uniform, so the call runs to its end without a host sync per
    token; `raise_if_bad` then stops with the first step and row. Unchecked, a NaN row becomes token V-1
    (RowSampler's searchsorted) or token 0 (argmax) without a word."""

    def __init__(self):
        self.first_bad, self.calls = None, 0  # first_bad: [B] step of a row's first non-finite scores, -1 = none

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        bad = ~torch.isfinite(scores.amax(-1))  # amax propagates NaN; +inf and all -inf are not finite either
        if self.first_bad is None:
            self.first_bad = torch.full(bad.shape, -1, dtype=torch.long, device=scores.device)
        self.first_bad = torch.where((self.first_bad < 0) & bad, self.calls, self.first_bad)
        self.calls += 1
        return scores.masked_fill(bad.unsqueeze(-1), 0.0)

    def raise_if_bad(self, first_row: int = 0) -> None:
        """One host sync per call. first_row: the index of this batch's first row among the caller's contexts."""
        steps = [] if self.first_bad is None else self.first_bad.tolist()
        bad = [(step, row) for row, step in enumerate(steps) if step >= 0]
        if bad:
            step, row = min(bad)
            raise NonFiniteScoresError(
                f"non-finite next-token scores (NaN or inf) at generation step {step} (0 = the first new token) of "
                f"row {first_row + row} of the call ({len(bad)} row(s) affected): nothing can be sampled from them. "
                "Look for NaN/inf weights or activations (e.g. an fp16 overflow)")


class FirstLineStop:
    """A `transformers.StoppingCriteria` that ends a row at the first newline after some text: only a tip's first
    line is kept (memory.clean_tip), so decoding the rest of a paragraph is wasted. `lengths[i]`: how many tokens
    row i keeps (0: not stopped here; HF pads a stopped row afterwards, `generate` cuts it)."""

    def __init__(self, token_texts: list[str]):
        # Per vocabulary id: has a newline / has text before its first newline / is blank (whitespace, special).
        self.newline = {i for i, t in enumerate(token_texts) if "\n" in t}
        self.text_first = {i for i in self.newline if token_texts[i].split("\n", 1)[0].strip()}
        self.blank = {i for i, t in enumerate(token_texts) if not t.strip().strip('"').strip()}  # as clean_tip
        self.reset(0)

    def reset(self, rows: int) -> None:
        self.lengths, self.seen_text, self.calls = [0] * rows, [False] * rows, 0

    def __call__(self, input_ids: torch.Tensor, scores=None, **kwargs) -> torch.Tensor:
        self.calls += 1
        for row, token in enumerate(input_ids[:, -1].tolist()):  # the token just generated, per row
            if self.lengths[row]:
                continue
            if token in self.newline and (self.seen_text[row] or token in self.text_first):
                self.lengths[row] = self.calls
            elif token not in self.blank:
                self.seen_text[row] = True
        return torch.tensor([n > 0 for n in self.lengths], dtype=torch.bool, device=input_ids.device)


def cut_at_eos(row: list[int], eos_id: int | list[int]) -> list[int]:
    """A generated row up to and including its first eos (any of the ids in a list; the rest is padding)."""
    stops = {eos_id} if isinstance(eos_id, int) else set(eos_id)
    for index, token in enumerate(row):
        if token in stops:
            return row[: index + 1]
    return row


def stop_ids(model, eos_id: int) -> list[int]:
    """`eos_id` first, then every eos id of the model's generation config: Qwen2.5 ends a turn with <|im_end|>
    but may also emit <|endoftext|>, and both must stop a row (infra.models.load_policy lists them there)."""
    configured = model.generation_config.eos_token_id
    configured = configured if isinstance(configured, list) else [configured]
    return list(dict.fromkeys([eos_id] + [i for i in configured if i is not None]))


@torch.no_grad()
def feed_prefixes(model, rows: list[list[int]], caches: list[PrefixCache | None], reuse: list[int], pad_id: int, *,
                  kind: str = "dynamic", room: int = 0, release: list[bool] | None = None):
    """-> (batch cache, mask [B, S]): row i's first reuse[i] cached positions (left-padded, `batched_cache`), then
    rows[i] encoded by one forward; mask marks the real tokens. kind="static" leaves `room` positions to decode.

    The new tokens go in RIGHT-padded, each after its own row's cache: every query position then sees at least one
    real key (its row's first token), so no attention row is fully masked. Some SDPA kernels return NaN for such a
    row; that NaN goes into the pad position's keys/values, and 0 x NaN in the next layer's attention poisons the
    real tokens of the row (transformers #38690). A row with no token at all (nothing cached, nothing to feed) lets
    its first pad attend to itself during this forward only; the returned mask leaves it out."""
    width, new = max(reuse), max(len(r) for r in rows)
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    cache = batched_cache(caches, reuse, width, num_layers=config.num_hidden_layers, kind=kind,
                          capacity=width + new + room, release=release)
    _, cached_mask = left_pad([[0] * n for n in reuse], pad_id, width)
    if new == 0:
        return cache, cached_mask
    ids, new_mask = right_pad(rows, pad_id)
    mask = torch.cat([cached_mask, new_mask], 1)
    feed_mask = mask.clone()
    feed_mask[mask.sum(-1) == 0, width] = 1
    positions = torch.tensor(reuse).unsqueeze(-1) + torch.arange(new)  # pads continue counting (masked anyway)
    device = next(model.parameters()).device
    model(input_ids=ids.to(device), attention_mask=feed_mask.to(device), position_ids=positions.to(device),
          cache=cache, use_cache=True, logits_to_keep=1)
    return cache, mask


def one_autocast_region(fn):
    """Run fn(model, ...) inside one autocast region when the model asks for it (`model.generation_autocast_dtype`,
    set by infra.models.load_policy for fp32 master weights with autocast forwards). Each forward's own autocast then
    nests inside it and reuses the weight casts cached for the whole call; the cache (one compute-dtype copy of
    the weights, docs/scaling.md) is freed when the call returns."""
    @functools.wraps(fn)
    def wrapped(model, *args, **kwargs):
        dtype = getattr(model, "generation_autocast_dtype", None)
        if dtype is None:
            return fn(model, *args, **kwargs)
        with torch.autocast(next(model.parameters()).device.type, dtype=dtype):
            return fn(model, *args, **kwargs)
    return wrapped


@one_autocast_region
@torch.no_grad()
def prefill(model, contexts: list[list[int]], pad_id: int, batch_size: int = 0) -> list[PrefixCache | None]:
    """Encode each DISTINCT context once (all but its last token, which `generate` must feed to sample) and
    return one cache per context; identical contexts share one cache object (a GRPO group's first message)."""
    distinct = [list(d) for d in dict.fromkeys(tuple(c[:-1]) for c in contexts if len(c) > 1)]
    by_prefix: dict[tuple, PrefixCache] = {}
    step = batch_size if batch_size > 0 else max(1, len(distinct))
    for start in range(0, len(distinct), step):
        chunk = distinct[start : start + step]
        cache, mask = feed_prefixes(model, chunk, [None] * len(chunk), [0] * len(chunk), pad_id)
        for prefix, pc in zip(chunk, split_cache(cache, mask, chunk)):
            by_prefix[tuple(prefix)] = pc
        del cache
    return [by_prefix.get(tuple(c[:-1])) for c in contexts]


class EpisodeCaches:
    """The KV caches of a batch of episodes played turn by turn, one per episode (None: nothing cached), and the
    one batched `generate` call of each turn (rollout.run_episodes; with rollout.kv_reuse, else every turn is
    encoded from scratch).

    `generate(live, contexts, keep, **sampling)` samples the live rows' actions. At the first turn each distinct
    first message is prefilled once (`prefill`: a GRPO group's N episodes share one cache object). A row's cache is
    emptied as the batch takes it over, so the keys/values exist about once, and comes back as the row's context +
    continuation, or None where `keep` says no later call uses it. `drop(i)` frees a finished episode's; `caches` is
    what is left at the end (`Episode.kv_cache`, for the tip)."""

    def __init__(self, model, chat: ChatStream, rows: int, enabled: bool, batch_size: int = 0):
        self.model, self.chat, self.enabled, self.batch_size = model, chat, enabled, batch_size
        self.caches: list[PrefixCache | None] = [None] * rows
        self.turns = 0

    def generate(self, live: list[int], contexts: list[list[int]], keep: list[bool], **sampling) -> list[list[int]]:
        """One `generate` call for rows `live` (their `contexts`); sampling: generate's other keywords."""
        self.turns += 1
        taken = None  # without reuse: encode every context
        if self.enabled:
            if self.turns == 1:  # the N episodes of a group share their first message: encode it once per group
                for i, cache in zip(live, prefill(self.model, contexts, self.chat.pad_id, self.batch_size)):
                    self.caches[i] = cache
            taken = [self.caches[i] for i in live]
            for i in live:
                self.caches[i] = None  # generate() consumes each row's cache as the batch takes it over
        actions = generate(self.model, self.chat.pad_id, self.chat.eos_id, contexts, caches=taken, keep_caches=keep,
                           batch_size=self.batch_size, **sampling)
        for i, cache in zip(live, taken or []):  # what generate left: each row's cache after its continuation
            self.caches[i] = cache
        return actions

    def drop(self, i: int) -> None:
        self.caches[i] = None


@one_autocast_region
@torch.no_grad()
def generate(model, pad_id: int, eos_id: int, contexts: list[list[int]], *, max_new_tokens: int,
             temperature: float, top_p: float = 1.0, batch_size: int = 0,
             caches: list[PrefixCache | None] | None = None, seeds: list[int] | None = None,
             logprobs: list | None = None, keep_caches: bool | list[bool] = True, stop=None) -> list[list[int]]:
    """Sample a continuation of every context (cut after its first eos, kept), batched `batch_size` at a time.
    A row stops at `eos_id` or at any eos id of the model's generation config (`stop_ids`). seeds: one per context;
    row i then samples from its own generator seeded with seeds[i] (`RowSampler`) instead of torch's global stream.

    caches=None: every context is encoded from scratch. caches=[...] (one entry per context, None for nothing
    cached yet): each row reuses its cache's common prefix with its context, and on return caches[i] holds
    context i + its continuation (all but a last token that was sampled and never fed). The given PrefixCache
    objects are consumed: emptied layer by layer as the batch takes them over (a cache shared by several rows, a
    group's prefill, after its last row's batch), so the keys/values exist about once. keep_caches=False (or
    False at row i): that row's cache is dropped instead of split back (no further turn: a tip, a last step),
    caches[i] is None. The batch decodes in a static KV cache (engine/kvcache.py; tests/test_generation.py checks that
    the dynamic one gives the same tokens).

    logprobs: a list to fill with one entry per context: the log-probs of its output tokens under the model
    (`RowSampler(record=True)`), or None where they were not recorded (seedless sampling at temperature > 0, whose
    tokens HF's own sampler draws). stop: an extra `transformers.StoppingCriteria` (e.g. `FirstLineStop`).
    Non-finite scores from the model stop the call with `NonFiniteScoresError` (`ScoreCheck`).
    """
    from transformers import LogitsProcessorList, StoppingCriteriaList

    outputs: list[list[int]] = []
    step = batch_size if batch_size > 0 else max(1, len(contexts))
    device = next(model.parameters()).device
    eos_ids = stop_ids(model, eos_id)
    keep = [keep_caches] * len(contexts) if isinstance(keep_caches, bool) else list(keep_caches)
    if len(keep) != len(contexts) or (caches is not None and len(caches) != len(contexts)):
        raise ValueError("generate: caches and keep_caches need one entry per context")
    if not all(contexts):
        raise ValueError("generate: every context needs at least one token (the one sampling starts from)")
    # The batch that uses a (possibly shared) cache object last is the one that frees it.
    last_batch = {id(c): start for start in range(0, len(contexts), step)
                  for c in (caches or [])[start : start + step] if c is not None}
    own_sampler = (seeds is not None and temperature > 0) or (logprobs is not None and temperature <= 0)
    stopping = dict(stopping_criteria=StoppingCriteriaList([stop])) if stop is not None else {}
    for start in range(0, len(contexts), step):
        chunk = contexts[start : start + step]
        check, sampler, sampling = ScoreCheck(), None, sampling_kwargs(temperature, top_p)
        if own_sampler:
            sampler = RowSampler(seeds[start : start + step] if seeds is not None else None, temperature, top_p,
                                 record=logprobs is not None, steps=max_new_tokens)
            sampling = sampling_kwargs(0.0, 1.0)
        processors = LogitsProcessorList([check] + ([sampler] if sampler is not None else []))
        if stop is not None:
            stop.reset(len(chunk))
        row_caches = caches[start : start + step] if caches is not None else [None] * len(chunk)
        if caches is not None:
            caches[start : start + step] = [None] * len(chunk)  # the batch takes the keys/values over
        # At least one token per row must be fed: `generate` samples from the logits of the last input.
        reuse = [min(c.reusable(ctx), len(ctx) - 1) if c is not None else 0 for c, ctx in zip(row_caches, chunk)]
        release = [c is not None and last_batch[id(c)] == start for c in row_caches]
        # room: the last context token + max_new_tokens - 1 fed tokens, + 1 spare (transformers' deferred stop
        # check, on some devices, runs one forward more)
        cache, mask = feed_prefixes(model, [ctx[n:-1] for ctx, n in zip(chunk, reuse)], row_caches, reuse, pad_id,
                                    kind="static", room=max_new_tokens + 1, release=release)
        del row_caches
        # Only the last token goes in as input_ids, so nothing is padded; the mask spans the cache + that token.
        # synced_gpus=False: transformers turns it on for an FSDP-wrapped model (every rank then keeps stepping until
        # all are done, one all-reduce per token). Our FSDP generation runs inside infra.runtime.full_weights (whole layers,
        # no collectives), where ranks generate independently and a synced rank would wait forever for the others.
        last = torch.tensor([[ctx[-1]] for ctx in chunk])
        mask = torch.cat([mask, torch.ones_like(last)], 1)
        sequences = model.generate(input_ids=last.to(device), attention_mask=mask.to(device), cache=cache,
                                   use_cache=True, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                                   eos_token_id=eos_ids, synced_gpus=False, logits_processor=processors,
                                   **sampling, **stopping)
        check.raise_if_bad(start)
        generated = sequences[:, 1:].tolist()
        actions = [cut_at_eos(row, eos_ids) for row in generated]
        row_keep = keep[start : start + step] if caches is not None else [False] * len(chunk)
        if any(row_keep):
            # The cache holds every fed position: cached + new + all generated tokens but the last one.
            length = len(generated[0])  # new tokens of the longest row; the last one was never fed
            fed = [a[: length - 1] for a in actions]
            generated_valid = torch.tensor([[1] * len(a) + [0] * (length - 1 - len(a)) for a in fed],
                                           dtype=torch.long).reshape(len(chunk), length - 1)
            valid = torch.cat([mask, generated_valid], 1)
            caches[start : start + step] = split_cache(cache, valid, [ctx + a for ctx, a in zip(chunk, fed)],
                                                       row_keep)
        del cache
        if stop is not None and getattr(stop, "lengths", None):
            actions = [a[:n] if n else a for a, n in zip(actions, stop.lengths)]
        outputs += actions
        if logprobs is not None:
            logprobs += sampler.logprobs(actions) if sampler is not None else [None] * len(chunk)
    return outputs


# ----------------------------------------------------------------------------- chat-template token deltas


class ChatStream:
    """Append-only token deltas from a tokenizer's chat template.

    An episode's stream is `first_turn(obs_0)`, then per step: the action ids, `close_action(action)` and
    `next_turn(obs_t)`. The deltas are derived once from the template by rendering sentinel conversations, so this
    works for ChatML (Qwen, SmolLM2) and other templates that render turns additively."""

    _USER1, _ASSISTANT1, _USER2 = "<<U1-sentinel>>", "<<A1-sentinel>>", "<<U2-sentinel>>"

    def __init__(self, tokenizer):
        self.tokenizer = tokenizer
        self.eos_id = tokenizer.eos_token_id
        self.special_strings = sorted({t for t in tokenizer.all_special_tokens + [
            t.content for t in getattr(tokenizer, "added_tokens_decoder", {}).values() if t.special] if t},
            key=len, reverse=True)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        first_turn = self._render([{"role": "user", "content": self._USER1}], True)
        two_turns = self._render(
            [
                {"role": "user", "content": self._USER1},
                {"role": "assistant", "content": self._ASSISTANT1},
                {"role": "user", "content": self._USER2},
            ],
            True,
        )
        start = two_turns.find(self._ASSISTANT1)
        if not two_turns.startswith(first_turn) or start < 0:
            raise ValueError("cannot derive append-only turns from this chat template; use rollout.history_window >= 0")
        # Everything the template puts after an assistant message, up to the next generation prompt. Templates that
        # re-render past turns differently (e.g. Qwen3 drops empty <think> blocks) are fine: the stream keeps what
        # the model actually saw and generated, it is never re-rendered.
        after_action = two_turns[start + len(self._ASSISTANT1) :]
        eos_text = tokenizer.decode([self.eos_id])
        # The generated action ends with eos; the template's closing text starts with it.
        self.closes_with_eos = after_action.startswith(eos_text)
        if self.closes_with_eos:
            after_action = after_action[len(eos_text) :]
        self._next_prefix, self._next_suffix = after_action.split(self._USER2)
        self._first_line: FirstLineStop | None = None

    def first_line_stop(self) -> FirstLineStop:
        """The tip's stopping criterion, built once from every token's text (~1 s per 50k-token vocabulary)."""
        if self._first_line is None:
            self._first_line = FirstLineStop(self.tokenizer.batch_decode([[i] for i in range(len(self.tokenizer))]))
        return self._first_line

    def _render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=generation_prompt)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def first_turn(self, user_text: str) -> list[int]:
        """System prompt (if the template adds one) + first user turn + generation prompt."""
        return self.encode(self._render([{"role": "user", "content": user_text}], True))

    def close_action(self, action_ids: list[int]) -> list[int]:
        """The eos to append after an action that stopped at the token limit instead of at eos (else [])."""
        if self.closes_with_eos and (not action_ids or action_ids[-1] != self.eos_id):
            return [self.eos_id]
        return []

    def next_turn(self, user_text: str) -> list[int]:
        """End of the assistant turn + the next user turn + generation prompt."""
        return self.encode(self._next_prefix + user_text + self._next_suffix)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def plain(self, text: str) -> str:
        """`text` without the tokenizer's special-token strings: model-written text (a tip) that spells
        "<|im_end|>" would otherwise be encoded as a real end of turn inside a user message."""
        for token in self.special_strings:
            text = text.replace(token, "")
        return text
