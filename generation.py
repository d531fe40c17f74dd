"""Batched sampling with HF `generate`, and per-episode KV-cache reuse across turns (docs/performance.md).

An agent's conversation is an append-only token stream: turn t+1's context is turn t's context + the action the
model generated + the next user turn. Re-encoding the whole history at every turn prefills O(T^2) tokens over a
T-turn episode; keeping each episode's keys/values between turns prefills O(T). This is what vLLM's prefix
caching gives peers, done here on plain `generate`:

* every episode owns a `PrefixCache`: the keys/values of a prefix of its own token stream, trimmed of padding;
* `generate(..., caches=...)` reuses, for each row, the longest common prefix of its cache and its new context,
  left-pads the reused parts into one batched `DynamicCache`, feeds only the new tokens (left-padded too; the
  attention mask marks every pad, and `generate` derives position ids from the mask's cumulative sum, so each
  real token gets the position it would have without reuse), and afterwards splits the grown cache back into
  one trimmed `PrefixCache` per row;
* `prefill` encodes identical contexts once (the N episodes of a GRPO group start from the same first message)
  and hands every episode of the group the same cache;
* the tip prompt is the episode stream + one user turn, so tip writing reuses the episode's cache for free, and
  a history-window prompt (WebShop) reuses the part it shares with the previous step's prompt (instruction).

`RowSampler(record=True)` keeps the log-prob of every sampled token under the model (`generate(logprobs=...)`):
the update's old log-probs without a second forward (docs/decisions.md). A tip stops at its first line
(`FirstLineStop`) and its batch cache is dropped, not split back (`keep_caches=False`).

Rows that finish (eos or the token limit) simply drop out of the next call: caches are per episode, not per
batch slot. The price is a copy of the reused keys/values into the batch at every call (memory traffic, not
compute: on this CPU it is ~1% of the prefill it replaces; docs/performance.md) and holding each live
episode's cache between turns. With greedy decoding the reused and the re-encoded paths produce the same tokens
(tests/test_generation.py); the logits differ only by floating-point summation order.

`ChatStream` turns a tokenizer's chat template into the append-only token deltas the streams are built from
(first turn, the closing of an action, the next user turn). Every row stops at any eos id of the model's
generation config (`stop_ids`: Qwen2.5 has two).

Only full-attention decoder layers are supported (sliding-window layers keep a rolling window that a trimmed
per-row copy cannot represent); `supports_kv_reuse` checks the model's config, and the rollout falls back to
re-encoding with a warning.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass
class PrefixCache:
    """Keys/values of `tokens` (a prefix of one episode's stream): per layer [heads, len(tokens), head_dim]."""

    tokens: list[int]
    keys: list[torch.Tensor]
    values: list[torch.Tensor]

    def reusable(self, context: list[int]) -> int:
        """How many leading tokens of `context` this cache already holds (the longest common prefix)."""
        if context[: len(self.tokens)] == self.tokens:  # the usual case (an append-only turn), at C speed
            return len(self.tokens)
        n = 0
        for a, b in zip(self.tokens, context):
            if a != b:
                break
            n += 1
        return n


def supports_kv_reuse(model) -> bool:
    """True when every decoder layer attends to the full context (no sliding window)."""
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    layer_types = getattr(config, "layer_types", None) or ["full_attention"]
    return all(t == "full_attention" for t in layer_types) and not getattr(config, "use_sliding_window", False)


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

    record=True also keeps, per call, log softmax(logits)[chosen]: the log-prob of the sampled token under the
    model's own (untempered, unfiltered) distribution, the pi the loss scores. At temperature 1 and top-p 1 that is
    the distribution the token was drawn from; otherwise it is still what a recomputing forward would give."""

    def __init__(self, seeds: list[int] | None, temperature: float, top_p: float, record: bool = False):
        self.generators = [torch.Generator().manual_seed(int(seed)) for seed in seeds] if temperature > 0 else []
        self.temperature, self.top_p = temperature, top_p
        self.recorded: list[torch.Tensor] | None = [] if record else None  # one [B] tensor per call, on the device

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
        if self.temperature > 0:
            chosen = self._draw(scores)
        else:
            chosen = scores.argmax(-1, keepdim=True)  # the first maximum, as greedy `generate` takes it
        if self.recorded is not None:  # [B, V] -> [B]; no host sync here (read once after the call)
            self.recorded.append(torch.log_softmax(scores.float(), -1).gather(-1, chosen).squeeze(-1))
        return torch.full_like(scores, float("-inf")).scatter(-1, chosen, 0.0)

    def _draw(self, scores: torch.Tensor) -> torch.Tensor:
        """[B, V] logits -> [B, 1] the token each row's own generator draws from softmax(scores / T), top-p."""
        probs = torch.softmax(scores.float() / self.temperature, dim=-1)  # [B, V]
        if self.top_p < 1.0:  # keep the smallest set of most likely tokens whose mass reaches top_p
            sorted_probs, order = probs.sort(dim=-1, descending=True)
            outside = sorted_probs.cumsum(-1) - sorted_probs > self.top_p
            probs = probs.scatter(-1, order, sorted_probs.masked_fill(outside, 0.0))
        cdf = probs.cumsum(-1)
        uniform = torch.stack([torch.rand((), generator=g) for g in self.generators]).to(cdf.device, cdf.dtype)
        chosen = torch.searchsorted(cdf, (uniform * cdf[:, -1]).unsqueeze(-1), right=True)
        # u * total rounds up to total once in ~1e7 draws: stay on the last token that has probability
        last = probs.shape[-1] - 1 - (probs.flip(-1) > 0).to(torch.int64).argmax(-1, keepdim=True)
        return torch.minimum(chosen, last)

    def logprobs(self, rows: list[list[int]]) -> list[list[float]]:
        """The recorded log-probs of each row's kept tokens (rows: the generated rows as cut by `cut_at_eos`)."""
        table = torch.stack(self.recorded, 1).cpu().tolist() if self.recorded else [[] for _ in rows]  # [B, calls]
        return [values[: len(row)] for values, row in zip(table, rows)]


class FirstLineStop:
    """A `transformers.StoppingCriteria` that ends a row at the first newline after some text: only a tip's first
    line is kept (rollout.clean_tip), so decoding the rest of a paragraph is wasted. `lengths[i]`: how many tokens
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
    but may also emit <|endoftext|>, and both must stop a row (models.load_policy lists them there)."""
    configured = model.generation_config.eos_token_id
    configured = configured if isinstance(configured, list) else [configured]
    return list(dict.fromkeys([eos_id] + [i for i in configured if i is not None]))


def batched_cache(caches: list[PrefixCache | None], reuse: list[int], width: int):
    """One DynamicCache [B, heads, width, head_dim] per layer with row i's first reuse[i] cached positions
    right-aligned (zeros to their left, masked out by the attention mask)."""
    from transformers import DynamicCache

    if width == 0:
        return DynamicCache()
    template = next(c for c, n in zip(caches, reuse) if n > 0)
    layers = []
    for layer in range(len(template.keys)):
        heads, _, dim = template.keys[layer].shape
        k = template.keys[layer].new_zeros((len(caches), heads, width, dim))
        v = template.values[layer].new_zeros((len(caches), heads, width, dim))
        for row, (cache, n) in enumerate(zip(caches, reuse)):
            if n:
                k[row, :, width - n :] = cache.keys[layer][:, :n]
                v[row, :, width - n :] = cache.values[layer][:, :n]
        layers.append((k, v))
    return DynamicCache(ddp_cache_data=layers)


def split_cache(cache, valid: torch.Tensor, tokens: list[list[int]]) -> list[PrefixCache]:
    """Batched DynamicCache + valid [B, S] (1 where a real token sits, S = cached length) -> one trimmed cache
    per row; tokens[i] are row i's real tokens in order (checked against the count)."""
    out = []
    for row in range(valid.shape[0]):
        index = torch.nonzero(valid[row]).squeeze(-1).to(cache.layers[0].keys.device)
        assert len(index) == len(tokens[row]), "cache positions and recorded tokens disagree"
        out.append(PrefixCache(tokens=list(tokens[row]),
                               keys=[layer.keys[row].index_select(1, index) for layer in cache.layers],
                               values=[layer.values[row].index_select(1, index) for layer in cache.layers]))
    return out


@torch.no_grad()
def prefill(model, contexts: list[list[int]], pad_id: int, batch_size: int = 0) -> list[PrefixCache | None]:
    """Encode each DISTINCT context once (all but its last token, which `generate` must feed to sample) and
    return one cache per context; identical contexts share one cache object (a GRPO group's first message)."""
    from transformers import DynamicCache

    distinct = [list(d) for d in dict.fromkeys(tuple(c[:-1]) for c in contexts if len(c) > 1)]
    by_prefix: dict[tuple, PrefixCache] = {}
    step = batch_size if batch_size > 0 else max(1, len(distinct))
    device = next(model.parameters()).device
    for start in range(0, len(distinct), step):
        chunk = distinct[start : start + step]
        ids, mask = left_pad(chunk, pad_id)
        # Left padding: positions count real tokens only, as `generate` counts them.
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        cache = DynamicCache()
        model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
              cache=cache, use_cache=True, logits_to_keep=1)
        for prefix, pc in zip(chunk, split_cache(cache, mask, chunk)):
            by_prefix[tuple(prefix)] = pc
    return [by_prefix.get(tuple(c[:-1])) for c in contexts]


@torch.no_grad()
def generate(model, pad_id: int, eos_id: int, contexts: list[list[int]], *, max_new_tokens: int,
             temperature: float, top_p: float = 1.0, batch_size: int = 0,
             caches: list[PrefixCache | None] | None = None, seeds: list[int] | None = None,
             logprobs: list | None = None, keep_caches: bool = True, stop=None) -> list[list[int]]:
    """Sample a continuation of every context (cut after its first eos, kept), batched `batch_size` at a time.
    A row stops at `eos_id` or at any eos id of the model's generation config (`stop_ids`). seeds: one per context;
    row i then samples from its own generator seeded with seeds[i] (`RowSampler`) instead of torch's global stream.

    caches=None: every context is encoded from scratch (left padding). caches=[...] (one entry per context, None
    for nothing cached yet): each row reuses its cache's common prefix with its context, and on return
    caches[i] holds context i + its continuation (all but a last token that was sampled and never fed). The list
    is emptied while the batch runs, so the caller should hold no other reference to the rows' caches: then
    peak memory is the batched cache plus, briefly, its per-row copies. keep_caches=False: the batch's cache is
    dropped instead of split back per row (the caller has no further turn: a tip), caches[i] stays None.

    logprobs: a list to fill with one entry per context: the log-probs of its output tokens under the model
    (`RowSampler(record=True)`), or None where they were not recorded (seedless sampling at temperature > 0, whose
    tokens HF's own sampler draws). stop: an extra `transformers.StoppingCriteria` (e.g. `FirstLineStop`).
    """
    from transformers import LogitsProcessorList, StoppingCriteriaList

    outputs: list[list[int]] = []
    step = batch_size if batch_size > 0 else max(1, len(contexts))
    device = next(model.parameters()).device
    eos_ids = stop_ids(model, eos_id)
    own_sampler = (seeds is not None and temperature > 0) or (logprobs is not None and temperature <= 0)
    stopping = dict(stopping_criteria=StoppingCriteriaList([stop])) if stop is not None else {}
    # synced_gpus=False: transformers turns it on for an FSDP-wrapped model (every rank then keeps stepping until all
    # are done, one all-reduce per token). Our FSDP generation runs inside runtime.full_weights (whole layers, no
    # collectives), where ranks generate independently and a synced rank would wait forever for the others.
    for start in range(0, len(contexts), step):
        chunk = contexts[start : start + step]
        sampler, sampling = None, sampling_kwargs(temperature, top_p)
        if own_sampler:
            sampler = RowSampler(seeds[start : start + step] if seeds is not None else None, temperature, top_p,
                                 record=logprobs is not None)
            sampling = dict(sampling_kwargs(0.0, 1.0), logits_processor=LogitsProcessorList([sampler]))
        if stop is not None:
            stop.reset(len(chunk))
        if caches is None:
            ids, mask = left_pad(chunk, pad_id)
            generated = model.generate(input_ids=ids.to(device), attention_mask=mask.to(device),
                                       max_new_tokens=max_new_tokens, pad_token_id=pad_id, eos_token_id=eos_ids,
                                       synced_gpus=False, **sampling, **stopping)[:, ids.shape[1] :].tolist()
            actions = [cut_at_eos(row, eos_ids) for row in generated]
        else:
            chunk_caches = caches[start : start + step]
            # At least one token per row must be fed: `generate` samples from the logits of the last input.
            reuse = [min(c.reusable(ctx), len(ctx) - 1) if c is not None else 0 for c, ctx in zip(chunk_caches, chunk)]
            width = max(reuse)
            cache = batched_cache(chunk_caches, reuse, width)
            del chunk_caches
            caches[start : start + step] = [None] * len(chunk)  # the batch holds the keys/values now: free the rows
            _, cached_mask = left_pad([[0] * n for n in reuse], pad_id, width)
            new_ids, new_mask = left_pad([ctx[n:] for ctx, n in zip(chunk, reuse)], pad_id)
            # Only the new tokens go in as input_ids; the mask spans cache + new tokens, so `generate` feeds them all.
            sequences = model.generate(input_ids=new_ids.to(device),
                                       attention_mask=torch.cat([cached_mask, new_mask], 1).to(device), cache=cache,
                                       use_cache=True, max_new_tokens=max_new_tokens, pad_token_id=pad_id,
                                       eos_token_id=eos_ids, synced_gpus=False, **sampling, **stopping)
            generated = sequences[:, new_ids.shape[1] :].tolist()
            actions = [cut_at_eos(row, eos_ids) for row in generated]
            if keep_caches:
                # The cache holds every fed position: cached + new + all generated tokens but the last one.
                length = len(generated[0])  # new tokens of the longest row; the last one was never fed
                fed = [a[: length - 1] for a in actions]
                generated_valid = torch.tensor([[1] * len(a) + [0] * (length - 1 - len(a)) for a in fed],
                                               dtype=torch.long).reshape(len(chunk), length - 1)
                valid = torch.cat([cached_mask, new_mask, generated_valid], 1)
                caches[start : start + step] = split_cache(cache, valid, [ctx + a for ctx, a in zip(chunk, fed)])
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
