"""The batch KV cache (engine/kvcache.py) on synthetic keys/values: its layout against a hand-built padded stack, the
split back per row, the release of the row caches, in-place writes of the static layout, and the peak memory of
building and splitting a batch (about one copy of the keys/values, measured in a fresh process)."""
import json
import os
import subprocess
import sys
import weakref
from pathlib import Path

import pytest
import torch

from engine import kvcache
from engine.kvcache import PrefixCache, batched_cache, split_cache

ROOT = Path(__file__).resolve().parents[1]
LAYERS, HEADS, DIM = 3, 2, 4


def row_cache(n: int, seed: int) -> PrefixCache:
    g = torch.Generator().manual_seed(seed)
    return PrefixCache(tokens=list(range(100 + seed, 100 + seed + n)),
                       keys=[torch.randn(HEADS, n, DIM, generator=g) for _ in range(LAYERS)],
                       values=[torch.randn(HEADS, n, DIM, generator=g) for _ in range(LAYERS)])


def test_the_transformers_internals_are_the_checked_ones():
    """engine/kvcache.py builds on transformers' private layer-wise cache: on another minor version, or with a
    member of TRANSFORMERS_PRIVATE_API gone, stop here rather than let a cache compute something else."""
    problems = kvcache.transformers_api_problems()
    assert not problems, ("engine/kvcache.py relies on transformers internals (TRANSFORMERS_PRIVATE_API) checked "
                          f"against transformers {kvcache.TRANSFORMERS_CHECKED}: " + "; ".join(problems) +
                          ". Re-read transformers/cache_utils.py, re-run tests/test_kvcache.py and "
                          "tests/test_generation.py, then update TRANSFORMERS_CHECKED.")


def test_the_internals_check_sees_another_version_and_a_missing_member(monkeypatch):
    import transformers

    DynamicLayer = kvcache.transformers_cache_classes()[2]
    monkeypatch.setattr(transformers, "__version__", "9.1.0")
    monkeypatch.setattr(DynamicLayer, "__init__", lambda self: None)  # a layer without its fields
    monkeypatch.setattr(DynamicLayer, "lazy_initialization", lambda self, k, v: None)
    problems = kvcache.transformers_api_problems()
    assert "transformers 9.1.0 installed" in problems[0]
    assert problems[1:] == ["transformers.cache_utils.DynamicLayer lacks ['keys', 'values', 'is_initialized', "
                            "'device']"]


@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_batch_cache_right_aligns_the_rows_and_splits_back_to_them(kind):
    rows = [row_cache(5, 0), None, row_cache(2, 1)]
    reuse = [5, 0, 1]  # the third row reuses only its first position
    wanted = [[r.keys[l][:, :n] if r is not None else None for r, n in zip(rows, reuse)] for l in range(LAYERS)]
    batch = batched_cache(rows, reuse, width=5, num_layers=LAYERS, kind=kind, capacity=9)
    for layer, want in zip(batch.layers, wanted):
        expected = torch.zeros(3, HEADS, 5, DIM)  # independent: zeros, each row's reused part at the right
        expected[0], expected[2, :, 4:] = want[0], want[2]
        assert torch.equal(layer.keys, expected)
    valid = torch.tensor([[1] * 5, [0] * 5, [0, 0, 0, 0, 1]])
    out = split_cache(batch, valid, [rows[0].tokens, [], rows[2].tokens[:1]], keep=[True, False, True])
    assert out[1] is None and out[0].tokens == rows[0].tokens and out[2].tokens == rows[2].tokens[:1]
    for layer in range(LAYERS):
        assert torch.equal(out[0].keys[layer], wanted[layer][0]) and torch.equal(out[2].keys[layer], wanted[layer][2])
    assert all(layer.keys is None for layer in batch.layers)  # the batch was emptied as the rows were copied out


def test_release_frees_each_row_cache_once_the_batch_holds_it():
    shared, own, kept = row_cache(4, 0), row_cache(3, 1), row_cache(2, 2)
    alive = [weakref.ref(t) for t in shared.keys + own.values]
    batch = batched_cache([shared, shared, own, kept], [4, 4, 3, 2], width=4, num_layers=LAYERS,
                          release=[True, True, True, False])
    assert all(ref() is None for ref in alive)  # freed while the batch is alive: the keys/values exist once
    assert shared.tokens == [] and shared.reusable([100, 101]) == 0  # an emptied cache reuses nothing
    assert len(kept.keys) == LAYERS and kept.tokens == [102, 103]  # not released: untouched
    assert torch.equal(batch.layers[0].keys[3, :, 2:], kept.keys[0])


def test_static_layer_writes_in_place_what_a_dynamic_layer_concatenates():
    rows = [row_cache(3, 0), row_cache(1, 1)]
    static = batched_cache(rows, [3, 1], 3, num_layers=LAYERS, kind="static", capacity=5)
    dynamic = batched_cache(rows, [3, 1], 3, num_layers=LAYERS, kind="dynamic")
    buffer = static.layers[0].key_buffer.data_ptr()
    for _ in range(2):
        new = torch.randn(2, HEADS, 1, DIM), torch.randn(2, HEADS, 1, DIM)
        k_static, v_static = static.update(*new, layer_idx=0)
        k_dynamic, v_dynamic = dynamic.update(*new, layer_idx=0)
        assert torch.equal(k_static, k_dynamic) and torch.equal(v_static, v_dynamic)
    assert static.layers[0].key_buffer.data_ptr() == buffer and static.get_seq_length() == 5
    with pytest.raises(RuntimeError, match="do not fit the 5"):
        static.update(*new, layer_idx=0)
    with pytest.raises(ValueError, match="kind='paged'"):
        batched_cache(rows, [3, 1], 3, num_layers=LAYERS, kind="paged")


PEAK_SCRIPT = r"""
import json, re, sys
from pathlib import Path
import torch
import transformers.cache_utils  # imported before measuring: batched_cache imports it on first use
from engine.kvcache import PrefixCache, batched_cache, split_cache

def resident(key):
    return int(re.search(key + r":\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) * 1024

kind, layers, heads, dim, lengths = sys.argv[1], 24, 2, 64, [1500, 1200, 1000, 800]
base = resident("VmRSS")
rows = [PrefixCache(list(range(n)), [torch.randn(heads, n, dim) for _ in range(layers)],
                    [torch.randn(heads, n, dim) for _ in range(layers)]) for n in lengths]
Path("/proc/self/clear_refs").write_text("5")
batch = batched_cache(rows, lengths, max(lengths), num_layers=layers, kind=kind, capacity=max(lengths) + 16,
                      release=[True] * len(rows))
build = resident("VmHWM") - base
del rows
Path("/proc/self/clear_refs").write_text("5")
width = batch.layers[0].keys.shape[2]
valid = torch.tensor([[0] * (width - n) + [1] * n for n in lengths])
out = split_cache(batch, valid, [list(range(n)) for n in lengths])
del batch
split = resident("VmHWM") - base
print(json.dumps(dict(build=build, split=split, rows=sum(lengths) * layers * heads * dim * 8,
                      batch=len(lengths) * (max(lengths) + 16) * layers * heads * dim * 8)))
"""


@pytest.mark.skipif(not Path("/proc/self/clear_refs").exists(), reason="needs Linux /proc peak-RSS reset")
@pytest.mark.parametrize("kind", ["dynamic", "static"])
def test_building_and_splitting_a_batch_holds_the_keys_values_about_once(kind):
    """Peak resident memory (VmHWM) of batched_cache + split_cache over 4 row caches (24 layers, 110 MB): at most
    the batch (147 MB) + three layers above what the process held without them. Building the whole batch while every
    row cache lives, or every row copy while the whole batch lives, would be rows + batch (~260 MB) or more.
    glibc serves each tensor by mmap here (MALLOC_MMAP_THRESHOLD_), so freed memory leaves the process at once."""
    env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", PEAK_SCRIPT, kind], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    peak = json.loads(proc.stdout.splitlines()[-1])
    layer = peak["batch"] / 24
    assert peak["build"] <= peak["batch"] + 3 * layer, peak
    assert peak["split"] <= peak["batch"] + 3 * layer, peak
