"""Process-level helpers shared by train.py and eval.py: the accelerator, object exchange between ranks, seeds.

* `make_accelerator()`: accelerate's `Accelerator`, on CPU a real gloo process group under torchrun.
* `gather_objects(accelerator, obj)`: every rank's picklable `obj`, in rank order (one collective).
* `derive_seed(*parts)`: the ONE way this project turns (seed, purpose, iteration, rank, ...) into an integer seed.
  Each random stream that must agree across ranks (the mode draw, the task rows) or be exactly reproducible on resume
  (the mini-batch shuffle) is seeded with it, named by its purpose, so streams never collide by accident of
  arithmetic (`seed * 31 + rank` vs `seed + iteration`) and adding a stream cannot shift another one.
"""
from __future__ import annotations

import hashlib

import torch


def make_accelerator():
    from accelerate import Accelerator

    # Under torchrun on a machine without a GPU a plain Accelerator() gives independent single-process runs;
    # cpu=True gives a real gloo process group (docs/performance.md, "several processes on CPU").
    return Accelerator(cpu=not torch.cuda.is_available())


def gather_objects(accelerator, obj) -> list:
    """[obj of rank 0, obj of rank 1, ...] on every rank (just [obj] in a single process)."""
    if accelerator is None or accelerator.num_processes == 1:
        return [obj]
    import torch.distributed as dist

    out = [None] * accelerator.num_processes
    dist.all_gather_object(out, obj)
    return out


def derive_seed(*parts) -> int:
    """A 63-bit seed from any mix of ints and strings, stable across Python processes and versions.

    derive_seed(seed, "mode", iteration) == derive_seed(seed, "mode", iteration) on every rank and every run;
    it does not depend on PYTHONHASHSEED (unlike hash()), and different `parts` give unrelated seeds."""
    text = "\x1f".join(str(p) for p in parts).encode()
    return int.from_bytes(hashlib.blake2b(text, digest_size=8).digest(), "little") >> 1
