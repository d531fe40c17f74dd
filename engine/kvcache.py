"""Per-episode KV caches and the batch cache built from them at every generate call (docs/performance.md).

An episode's `PrefixCache` holds the keys/values of a prefix of its own token stream, trimmed of padding. A call
gathers its rows' caches into one left-padded batch cache (`batched_cache`), decodes, and splits the grown batch
back into per-row caches (`split_cache`). Both directions go layer by layer and free as they go: the row caches of
layer l are released once layer l of the batch holds them, and layer l of the batch once every row has its copy.
So at a turn boundary the keys/values exist about once (plus one layer), not twice (what two copies cost at 7B:
docs/scaling.md). Rows whose cache nobody needs afterwards (the tip call, an
episode at its last step) are not split at all.

Two batch layouts (`batched_cache(kind=)`; rollouts use "static", "dynamic" is the reference a test compares with):
* "dynamic": transformers' `DynamicLayer`; every decode step concatenates each layer's keys/values with the new
  position, i.e. allocates and copies the whole cache again (about 2x the cache moved per token);
* "static": our `BufferLayer`, pre-sized once per call to everything the call can hold (reused prefix + new
  tokens + max_new_tokens); a decode step writes its position in place and attention reads a view of the filled
  part, of exactly the length `DynamicLayer` would hold, so both layouts compute the same attention
  (tests/test_generation.py: token-identical). transformers' own `StaticLayer` is not used: its attention runs
  over the whole pre-sized length at every step (its mask size is `max_cache_len`) and a static cache makes
  `generate` compile the forward on GPUs (`_valid_auto_compile_criteria`), once per new batch shape.

Only full-attention decoder layers are supported (sliding-window layers keep a rolling window that a trimmed
per-row copy cannot represent); `supports_kv_reuse` checks the model's config.

transformers internals: both layouts build on transformers' layer-wise cache (`transformers.cache_utils`), whose
layer class and fields are not a documented API. Everything this file uses of it is named in the block below,
with the version it was checked against; tests/test_kvcache.py fails on another minor version or a missing name.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

KV_CACHES = ("dynamic", "static")

# ---- transformers internals (the only ones the engine relies on) ------------------------------------------------
TRANSFORMERS_CHECKED = "5.24.0"  # requirements.txt pins it; a new minor version: re-read cache_utils.py, then bump
TRANSFORMERS_PRIVATE_API = {
    # class in transformers.cache_utils: the members used here (subclassed, called, or read and written)
    "DynamicLayer": ("__init__()", "lazy_initialization(key_states, value_states)", "update(key_states, "
                     "value_states, ...)", "keys", "values", "is_initialized", "device"),
    "DynamicCache": ("__init__()", "layers"),  # a DynamicCache whose `layers` list is replaced by ours
    "Cache": ("__init__(layers=...)", "layers"),  # the static layout's cache around our BufferLayers
}


def transformers_cache_classes():
    """(Cache, DynamicCache, DynamicLayer) from transformers.cache_utils, the classes TRANSFORMERS_PRIVATE_API
    names; imported lazily, as transformers is everywhere in this project."""
    from transformers.cache_utils import Cache, DynamicCache, DynamicLayer

    return Cache, DynamicCache, DynamicLayer


def transformers_api_problems() -> list[str]:
    """What differs from the transformers this file was checked against: the installed minor version, or a member
    of TRANSFORMERS_PRIVATE_API that is missing. [] when everything is as checked."""
    import inspect

    import transformers

    problems = []
    if transformers.__version__.split(".")[:2] != TRANSFORMERS_CHECKED.split(".")[:2]:
        problems.append(f"transformers {transformers.__version__} installed, engine/kvcache.py was checked against "
                        f"{TRANSFORMERS_CHECKED}")
    try:
        Cache, DynamicCache, DynamicLayer = transformers_cache_classes()
    except ImportError as error:
        return problems + [f"transformers.cache_utils: {error}"]
    layer = DynamicLayer()
    if callable(getattr(layer, "lazy_initialization", None)):  # it sets the fields `update` reads
        layer.lazy_initialization(torch.zeros(1, 1, 0, 1), torch.zeros(1, 1, 0, 1))
    found = {"DynamicLayer": {*vars(layer), "__init__", *(m for m in ("lazy_initialization", "update")
                                                          if callable(getattr(DynamicLayer, m, None)))},
             "DynamicCache": {"__init__", *vars(DynamicCache())},
             "Cache": {"__init__", *vars(Cache(layers=[DynamicLayer()]))}
             if "layers" in inspect.signature(Cache.__init__).parameters else set()}
    for cls, members in TRANSFORMERS_PRIVATE_API.items():
        missing = [m for m in members if m.partition("(")[0] not in found[cls]]
        if missing:
            problems.append(f"transformers.cache_utils.{cls} lacks {missing}")
    return problems
# ------------------------------------------------------------------------------------------------------------------


@dataclass
class PrefixCache:
    """Keys/values of `tokens` (a prefix of one episode's stream): per layer [heads, len(tokens), head_dim].
    `batched_cache(release=...)` empties it (tokens [], no tensors): an emptied cache reuses nothing."""

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


def _dynamic_layer(keys: torch.Tensor | None = None, values: torch.Tensor | None = None):
    """A transformers DynamicLayer holding these tensors as they are (DynamicCache(ddp_cache_data=...) would copy
    them once more through torch.cat)."""
    DynamicLayer = transformers_cache_classes()[2]
    layer = DynamicLayer()
    if keys is not None:
        layer.lazy_initialization(keys, values)
        layer.keys, layer.values = keys, values
    return layer


@lru_cache(maxsize=None)
def _buffer_layer_class():
    """`BufferLayer`, defined on first use (transformers is imported lazily, as everywhere in this project)."""
    DynamicLayer = transformers_cache_classes()[2]

    class BufferLayer(DynamicLayer):
        """A DynamicLayer whose keys/values are views of the first `length` positions of buffers allocated once at
        `capacity` positions: `update` writes the new positions in place instead of concatenating. Everything that
        reads `keys`/`values` (attention, mask sizes, `get_seq_length`) sees what a DynamicLayer would hold. Plain
        greedy/sampled decoding only: beam search and assisted decoding re-index the layer."""

        def __init__(self, capacity: int, keys=None, values=None, length: int = 0):
            super().__init__()
            self.capacity, self.key_buffer, self.value_buffer = capacity, keys, values
            if keys is not None:
                self.device, self.is_initialized = keys.device, True
                self._view(length)

        def _view(self, length: int) -> None:
            self.keys, self.values = self.key_buffer[:, :, :length], self.value_buffer[:, :, :length]

        def lazy_initialization(self, key_states, value_states) -> None:  # no cached part: the first update
            shape = lambda s: (*s.shape[:2], self.capacity, s.shape[-1])  # noqa: E731
            self.key_buffer, self.value_buffer = key_states.new_empty(shape(key_states)), value_states.new_empty(
                shape(value_states))
            self.device, self.is_initialized = key_states.device, True
            self._view(0)

        def update(self, key_states, value_states, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            start = self.keys.shape[-2]
            end = start + key_states.shape[-2]
            if end > self.capacity:
                raise RuntimeError(f"static KV cache: {end} positions do not fit the {self.capacity} "
                                   "this call's buffer was sized for")
            self.key_buffer[:, :, start:end] = key_states
            self.value_buffer[:, :, start:end] = value_states
            self._view(end)
            return self.keys, self.values

    return BufferLayer


def batched_cache(caches: list[PrefixCache | None], reuse: list[int], width: int, *, num_layers: int,
                  kind: str = "dynamic", capacity: int = 0, release: list[bool] | None = None):
    """One batch cache [B, heads, width, head_dim] per layer with row i's first reuse[i] cached positions
    right-aligned (zeros to their left, masked out by the attention mask). kind="static": buffers of `capacity`
    positions (>= width), the first `width` filled. release[i]: empty caches[i] layer by layer as the batch takes
    its keys/values over (rows sharing one cache object must all be in this batch)."""
    Cache, DynamicCache, _ = transformers_cache_classes()
    if kind not in KV_CACHES:
        raise ValueError(f"KV cache kind={kind!r} is not one of {list(KV_CACHES)}")
    if kind == "static" and capacity < width:
        raise ValueError(f"a static batch cache needs capacity >= width, got {capacity} < {width}")
    release = release or [False] * len(caches)
    template = next((c for c, n in zip(caches, reuse) if n > 0), None)
    freed = {id(c): c for c, free in zip(caches, release) if free and c is not None}  # each shared object once
    BufferLayer = _buffer_layer_class() if kind == "static" else None
    layers = []
    for layer in range(num_layers):
        if template is None:  # nothing cached: the layers fill from the first forward
            layers.append(BufferLayer(capacity) if kind == "static" else _dynamic_layer())
            continue
        heads, _, dim = template.keys[layer].shape
        size = capacity if kind == "static" else width
        k = template.keys[layer].new_empty((len(caches), heads, size, dim))
        v = template.values[layer].new_empty((len(caches), heads, size, dim))
        # The left padding must be finite (it is read and masked: 0 x NaN would poison the row); beyond `width`
        # every position is written before attention reads it.
        k[:, :, :width].zero_()
        v[:, :, :width].zero_()
        for row, (cache, n) in enumerate(zip(caches, reuse)):
            if n:
                k[row, :, width - n : width] = cache.keys[layer][:, :n]
                v[row, :, width - n : width] = cache.values[layer][:, :n]
        for cache in freed.values():  # this layer now lives in the batch only
            cache.keys[layer] = cache.values[layer] = None
        layers.append(BufferLayer(capacity, k, v, width) if kind == "static" else _dynamic_layer(k, v))
        del k, v
    for cache in freed.values():
        cache.tokens, cache.keys, cache.values = [], [], []
    if kind == "static":
        return Cache(layers=layers)
    cache = DynamicCache()
    cache.layers = layers
    return cache


def split_cache(cache, valid: torch.Tensor, tokens: list[list[int]], keep: list[bool] | None = None
                ) -> list[PrefixCache | None]:
    """Batch cache + valid [B, S] (1 where a real token sits, S = cached length) -> one trimmed cache per row
    (None where keep[i] is False); tokens[i] are row i's real tokens in order (checked against the count). The
    batch is emptied layer by layer as its rows are copied out: do not use `cache` afterwards."""
    keep = keep if keep is not None else [True] * valid.shape[0]
    device = cache.layers[0].keys.device
    index = {row: torch.nonzero(valid[row]).squeeze(-1).to(device) for row in range(valid.shape[0]) if keep[row]}
    for row, positions in index.items():
        if len(positions) != len(tokens[row]):
            raise RuntimeError(f"row {row}: {len(positions)} cached positions but {len(tokens[row])} tokens")
    out = {row: PrefixCache(tokens=list(tokens[row]), keys=[], values=[]) for row in index}
    for layer in cache.layers:
        for row, positions in index.items():
            out[row].keys.append(layer.keys[row].index_select(1, positions))
            out[row].values.append(layer.values[row].index_select(1, positions))
        layer.keys = layer.values = None  # free this layer of the batch (and its buffers) before the next
        if hasattr(layer, "key_buffer"):
            layer.key_buffer = layer.value_buffer = None
    return [out.get(row) for row in range(valid.shape[0])]
