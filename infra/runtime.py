"""Process-level helpers shared by train.py and eval.py: the launch, sharding, object exchange between ranks, seeds.

* `check_launch(model_cfg)`: what `accelerate launch` asked for (its config file and flags arrive as environment
  variables), checked BEFORE anything is loaded: every supported option takes effect, every other one stops the
  run with a one-line `LaunchError`. This trainer never calls `accelerator.prepare` (it needs control over
  generation and over unequal per-rank work, see train.py), so nothing accelerate would do silently is allowed
  to be skipped silently. Supported:
    - processes / machines (`--num_processes`, `--num_machines`, `--multi_gpu`): data parallel, gradients
      summed by `all_reduce_gradients`;
    - `mixed_precision` no | bf16 | fp16: the compute dtype (`model.dtype`); bf16/fp16 with fp32 master weights for
      a full fine-tune (infra.models.load_policy); a flag that contradicts `model.dtype` is an error;
    - FSDP version 2 for a full fine-tune (`distributed_type: FSDP`, configs/accelerate/fsdp_8gpu.yaml): decoder
      layers sharded with `fully_shard`, FULL_SHARD or SHARD_GRAD_OP, transformer-based wrapping, activation
      checkpointing (= model.gradient_checkpointing), full state dicts.
  Not supported (error): DeepSpeed, Megatron-LM, torch dynamo, fp8, accelerate's gradient accumulation (use
  train.minibatch_steps), FSDP version 1, CPU offload, hybrid/no sharding, size-based wrapping, sharded state dicts,
  rank-0-only loading, FSDP with LoRA (LoRA is a few MB: data parallel is the right tool).
* `make_accelerator()`: accelerate's `Accelerator`, on CPU a real gloo process group under torchrun.
* `load_models(cfg, launch, ...)`: the policy, its tokenizer and the KL reference of a full fine-tune, on this
  rank's device, sharded under FSDP.
* `shard_model(model, ...)` and `full_weights(model)`: FSDP2 sharding, and the context in which generation and the
  no-grad log-prob passes see whole layers (so ranks may run different numbers of forwards there).
* `gather_objects(accelerator, obj)`: every rank's picklable `obj`, in rank order (one collective).
* `stop_on_signals()`: SIGTERM / SIGINT let the training loop finish its iteration and checkpoint (a preempted job).
* `all_ranks`, `all_reduce_gradients`: the update's collectives (train.update).
* `derive_seed(*parts)`: the ONE way this project turns (seed, purpose, iteration, rank, ...) into an integer seed.
  Each random stream that must agree across ranks (the mode draw, the task rows) or be exactly reproducible on resume
  (the mini-batch shuffle) is seeded with it, named by its purpose, so streams never collide by accident of
  arithmetic (`seed * 31 + rank` vs `seed + iteration`) and adding a stream cannot shift another one. `Seeds`: every
  seed of one training iteration on one rank, in one object.
"""
from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import sys
from dataclasses import dataclass, replace

import torch

from config import ConfigError
from infra.models import load_policy, load_reference


class LaunchError(ConfigError):
    """An `accelerate launch` option this trainer does not support; the message names it and the alternative."""


@dataclass
class Launch:
    fsdp: bool = False  # shard the model with FSDP2 (full fine-tune only)
    reshard_after_forward: bool = True  # FULL_SHARD (True) or SHARD_GRAD_OP (False)
    wrap_classes: tuple[str, ...] = ()  # decoder-layer class names to shard one by one ("" = the model's own list)


def _flag(name: str, default: str = "false") -> str:
    return os.environ.get(name, default).strip()


def _true(name: str) -> bool:
    return _flag(name).lower() in ("true", "1", "yes")


_PRECISION = {"bf16": "bfloat16", "fp16": "float16"}


def check_launch(model_cfg) -> Launch:
    """Validate the accelerate launch options against `model_cfg` (a config.ModelConfig, updated in place where a
    launch option decides a model setting); return what train.py must do. Raises LaunchError."""
    if _true("ACCELERATE_USE_DEEPSPEED"):
        raise LaunchError("DeepSpeed is not supported: for a sharded full fine-tune use "
                          "--config_file configs/accelerate/fsdp_8gpu.yaml")
    if _true("ACCELERATE_USE_MEGATRON_LM"):
        raise LaunchError("Megatron-LM is not supported: use configs/accelerate/fsdp_8gpu.yaml")
    if _flag("ACCELERATE_DYNAMO_BACKEND", "no").lower() not in ("no", ""):
        raise LaunchError(f"dynamo_backend={_flag('ACCELERATE_DYNAMO_BACKEND')} is not supported (generation changes "
                          f"shapes every step); set dynamo_backend: 'NO'")
    steps = _flag("ACCELERATE_GRADIENT_ACCUMULATION_STEPS", "1")
    if steps not in ("", "1"):
        raise LaunchError(f"gradient_accumulation_steps={steps} is not supported: an optimiser step already "
                          f"accumulates its mini-batch (train.minibatch_steps, train.micro_batch_size)")
    precision = _flag("ACCELERATE_MIXED_PRECISION", "no").lower()
    if precision not in ("no", "bf16", "fp16"):
        raise LaunchError(f"mixed_precision={precision} is not supported: use no, bf16 or fp16")
    if precision in _PRECISION:
        wanted = _PRECISION[precision]
        if model_cfg.dtype == "float32":  # the flag takes effect: fp32 (master) weights, forwards in `wanted`
            model_cfg.dtype = wanted
        elif model_cfg.dtype != wanted:
            raise LaunchError(f"mixed_precision={precision} contradicts model.dtype={model_cfg.dtype}; "
                              f"drop the flag or set --model.dtype={wanted}")
    if not _true("ACCELERATE_USE_FSDP"):
        return Launch()
    return _check_fsdp(model_cfg)


def _check_fsdp(model_cfg) -> Launch:
    if model_cfg.lora:
        raise LaunchError("FSDP shards a full fine-tune; with model.lora=true launch data parallel instead "
                          "(configs/accelerate/multi_gpu_8.yaml), or set --model.lora=false")
    problems = {
        "fsdp_version": (_flag("FSDP_VERSION", "1"), ("2",), "set fsdp_version: 2 (FSDP2, torch.distributed.fsdp."
                                                              "fully_shard)"),
        "fsdp_sharding_strategy": (_flag("FSDP_SHARDING_STRATEGY", "FULL_SHARD").upper(),
                                   ("FULL_SHARD", "SHARD_GRAD_OP", "1", "2"), "use FULL_SHARD or SHARD_GRAD_OP"),
        "fsdp_offload_params": (_flag("FSDP_OFFLOAD_PARAMS").lower(), ("false",), "CPU offload is not supported"),
        "fsdp_auto_wrap_policy": (_flag("FSDP_AUTO_WRAP_POLICY", "TRANSFORMER_BASED_WRAP").upper(),
                                  ("TRANSFORMER_BASED_WRAP",), "use TRANSFORMER_BASED_WRAP (one shard unit per "
                                                               "decoder layer)"),
        "fsdp_state_dict_type": (_flag("FSDP_STATE_DICT_TYPE", "FULL_STATE_DICT").upper(), ("FULL_STATE_DICT",),
                                 "checkpoints are full HF folders: set FULL_STATE_DICT"),
        "fsdp_cpu_ram_efficient_loading": (_flag("FSDP_CPU_RAM_EFFICIENT_LOADING").lower(), ("false",),
                                           "every rank loads the checkpoint, then shards it: set false"),
        "fsdp_forward_prefetch": (_flag("FSDP_FORWARD_PREFETCH").lower(), ("false",), "an FSDP1 option"),
        "fsdp_activation_checkpointing_offload": (_flag("FSDP_ACTIVATION_CHECKPOINTING_OFFLOAD").lower(), ("false",),
                                                  "not supported"),
    }
    for key, (value, allowed, hint) in problems.items():
        if value not in allowed:
            raise LaunchError(f"FSDP option {key}={value} is not supported: {hint}")
    if "FSDP_BACKWARD_PREFETCH" in os.environ:
        raise LaunchError("FSDP option fsdp_backward_prefetch is an FSDP1 option: remove it")
    if _true("FSDP_ACTIVATION_CHECKPOINTING"):
        model_cfg.gradient_checkpointing = True  # the same thing, done by transformers on the unsharded model
    names = tuple(n.strip() for n in _flag("FSDP_TRANSFORMER_CLS_TO_WRAP", "").split(",") if n.strip())
    reshard = _flag("FSDP_RESHARD_AFTER_FORWARD", "").lower()
    strategy = _flag("FSDP_SHARDING_STRATEGY", "FULL_SHARD").upper()
    full_shard = reshard == "true" if reshard in ("true", "false") else strategy in ("FULL_SHARD", "1")
    return Launch(fsdp=True, reshard_after_forward=full_shard, wrap_classes=names)


def make_accelerator():
    from accelerate import Accelerator

    # torch.distributed.nn's functions take `group=group.WORLD` as a default argument, evaluated when the module is
    # first imported (loading a model imports it). Imported after the process group exists, ten defaults would hold
    # the group for good: destroy_process_group could not free it, and gloo's threads would live into interpreter
    # shutdown (end_process_group). Imported first, the defaults are None.
    import torch.distributed.nn  # noqa: F401

    # Under torchrun on a machine without a GPU a plain Accelerator() gives independent single-process runs;
    # cpu=True gives a real gloo process group (docs/performance.md, "several processes on CPU"). Mixed precision
    # is ours to apply (check_launch), so the Accelerator is told "no" whatever the launcher said.
    accelerator = Accelerator(cpu=not torch.cuda.is_available(), mixed_precision="no")
    atexit.register(end_process_group)
    return accelerator


def end_process_group() -> None:
    """Destroy the process group while the interpreter is still whole. Left to interpreter shutdown, gloo's worker
    threads can outlive the objects they hold and the process dies with SIGABRT ("terminate called without an
    active exception") after its work is done, which torchrun reports as a failed run. Runs at exit (registered
    by make_accelerator); a no-op without a process group or when it is already gone."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


# ----------------------------------------------------------------------------- FSDP2


def shard_model(model, compute_dtype: torch.dtype, launch: Launch):
    """Shard a fully trainable model over all ranks with FSDP2: every decoder layer is one unit (its parameters
    all-gathered just before it runs, freed after), the rest (embeddings, final norm, LM head) is the root unit.
    Parameters, gradients and AdamW state stay fp32 shards; each layer computes in `compute_dtype` and gradients
    are reduced in fp32 (MixedPrecisionPolicy). With model.fp32_lm_head the LM head is its own unit with an fp32
    policy (a tied head: the root unit is fp32). Returns the same module object, now an FSDPModule."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    names = set(launch.wrap_classes or getattr(model, "_no_split_modules", None) or ())
    layers = [m for m in model.modules() if type(m).__name__ in names]
    if not layers:
        raise LaunchError(f"FSDP: no module of class {sorted(names)} in {type(model).__name__}; set "
                          f"fsdp_transformer_layer_cls_to_wrap to its decoder layer class")
    policy = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    for layer in layers:
        fully_shard(layer, mp_policy=policy, reshard_after_forward=launch.reshard_after_forward)
    root_policy = policy
    if getattr(model, "empo2_fp32_lm_head", False):  # model.fp32_lm_head: the head gathers and computes in fp32
        fp32 = MixedPrecisionPolicy(param_dtype=torch.float32, reduce_dtype=torch.float32)  # casts its input up
        head = model.get_output_embeddings()
        if head.weight is model.get_input_embeddings().weight:  # tied: one parameter, so the root unit holds it
            root_policy = fp32  # embeddings, final norm and head in fp32; each layer casts its input to bf16
        else:
            fully_shard(head, mp_policy=fp32, reshard_after_forward=launch.reshard_after_forward)
    fully_shard(model, mp_policy=root_policy, reshard_after_forward=launch.reshard_after_forward)
    model.empo2_reshard_after_forward = launch.reshard_after_forward  # restored by full_weights
    return model


def load_models(cfg, launch, accelerator, resuming: bool) -> tuple:
    """(policy, tokenizer, reference or None), each on this rank's device and sharded under FSDP."""
    with accelerator.main_process_first():  # rank 0 converts/downloads the model once
        # A resume's checkpoint holds the whole adapter: the one the run started from (init_adapter) is not needed
        model_cfg = replace(cfg.model, init_adapter="") if resuming else cfg.model
        model, tokenizer = load_policy(model_cfg, device=accelerator.device, autocast_forward=not launch.fsdp)
    if launch.fsdp:  # after loading (every rank holds the same fp32 weights), before the optimizer sees them
        shard_model(model, getattr(torch, cfg.model.dtype), launch)
    # pi_ref of the KL term. LoRA: the policy with its adapters disabled (no copy). Full fine-tune: a frozen copy of
    # the initial policy from name_or_path (on resume too), sharded like the policy; the optimizer never sees it.
    reference = None
    if cfg.loss.kl_coef and not cfg.model.lora:
        reference = load_reference(cfg.model, device=accelerator.device, autocast_forward=not launch.fsdp)
        if launch.fsdp:
            shard_model(reference, getattr(torch, cfg.model.dtype), launch)
    return model, tokenizer, reference


def is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


@contextlib.contextmanager
def full_weights(model):
    """Inside: every FSDP unit holds its whole (compute-dtype) parameters, so forwards need no collective and ranks
    may run different numbers of them (generation: episodes end at different steps on different ranks; the
    old log-probs: ranks hold different numbers of samples). Costs one all-gather per layer on entry and the
    memory of the unsharded model in the compute dtype (7B in bf16: 15 GB). A no-op without FSDP."""
    if not is_sharded(model):
        yield model
        return
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]
    for unit in units:
        unit.set_reshard_after_forward(False, recurse=False)
        unit.unshard()
    try:
        yield model
    finally:
        for unit in units:
            unit.reshard()
            unit.set_reshard_after_forward(model.empo2_reshard_after_forward, recurse=False)


# ----------------------------------------------------------------------------- exchange and seeds


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


@dataclass(frozen=True)
class Seeds:
    """Every seed one iteration draws on one rank, each an unrelated stream (derive_seed), the same in every run
    and on resume: the task rows, this rank's episodes, the update's shuffle, the episode log's sample, validation."""

    seed: int  # train.seed
    iteration: int
    rank: int

    @property
    def tasks(self) -> int:
        """The iteration's task rows: the same on every rank."""
        return derive_seed(self.seed, "tasks", self.iteration)

    def episodes(self, count: int) -> list[int]:
        """One sampling stream per episode this rank plays (engine.generation.RowSampler)."""
        return [derive_seed(self.seed, "episode", self.iteration, self.rank, j) for j in range(count)]

    @property
    def minibatches(self) -> int:
        """The update's shuffle of every rank's samples, the same on every rank: rank 0's stream (from when each
        rank shuffled its own samples, so a one-process run keeps its mini-batches)."""
        return derive_seed(self.seed, "minibatches", self.iteration, 0)

    @property
    def log(self) -> int:
        return derive_seed(self.seed, "log", self.iteration, self.rank)

    @property
    def validation(self) -> int:
        return derive_seed(self.seed, "validation", self.iteration, self.rank)


# ----------------------------------------------------------------------------- signals and random streams


def stop_on_signals() -> dict:
    """SIGTERM / SIGINT set {"requested": True}; the loop finishes its iteration, checkpoints and exits 0 (a
    preempted job). A second signal stops at once (KeyboardInterrupt). {"restore"}() puts the old handlers back."""
    import signal
    import threading

    state = {"requested": False, "restore": lambda: None}
    if threading.current_thread() is not threading.main_thread():  # handlers can only be set there
        return state
    previous = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}

    def handler(signum, frame):
        if state["requested"]:
            raise KeyboardInterrupt
        state["requested"] = True
        print(f"signal {signum}: finishing this iteration, then checkpoint and exit (again to stop now)",
              file=sys.stderr, flush=True)

    for sig in previous:
        signal.signal(sig, handler)
    state["restore"] = lambda: [signal.signal(sig, old) for sig, old in previous.items()]
    return state


def rng_devices(accelerator) -> list:
    """The CUDA device whose random state `torch.random.fork_rng` must save and restore (none on CPU)."""
    return [accelerator.device] if accelerator.device.type == "cuda" else []


# ----------------------------------------------------------------------------- collectives of the update


def all_ranks(flag: bool, accelerator) -> bool:
    """True when `flag` is true on every rank (one tiny all-reduce with several processes)."""
    if accelerator.num_processes == 1:
        return flag
    bad = accelerator.reduce(torch.tensor([0.0 if flag else 1.0], device=accelerator.device), reduction="sum")
    return bad.item() == 0


def all_reduce_gradients(params, accelerator, bucket_elements: int = 1 << 26) -> None:
    """Sum the gradients over ranks (each rank's loss already carries its share of the global mini-batch).

    Flat fp32 buckets of at most `bucket_elements` (256 MB), so a full fine-tune never builds one buffer of every
    gradient (28 GB for 7B). A rank without samples has no gradient yet; it still takes part with zeros (one
    process too: AdamW then steps exactly as one rank of a multi-process run would)."""
    for p in params:
        if p.grad is None:
            p.grad = torch.zeros_like(p)
    if accelerator.num_processes == 1:
        return
    buckets, size = [[]], 0
    for p in params:
        if buckets[-1] and size + p.numel() > bucket_elements:
            buckets.append([])
            size = 0
        buckets[-1].append(p)
        size += p.numel()
    for bucket in buckets:
        flat = accelerator.reduce(torch.cat([p.grad.reshape(-1).float() for p in bucket]), reduction="sum")
        offset = 0
        for p in bucket:
            p.grad.copy_(flat[offset : offset + p.numel()].view_as(p.grad).to(p.grad.dtype))
            offset += p.numel()
