"""Checkpoints: save atomically, find, resume; and the rank fingerprints that show ranks stayed identical.

A checkpoint is a folder `output_dir/checkpoints/iter_XXXXXX/` with
    model/              the LoRA adapter (or the full weights, gathered from the shards under FSDP) and the tokenizer
    optimizer.pt        AdamW state (under FSDP: gathered in full to rank 0, keyed by parameter name)
    memory.json         the tip memory and novelty counts (when memory or the intrinsic reward is on)
    state.json          {"iteration": i, "world_size": n}
    config.json         the run's config (check_resume refuses a resume that changes more than its length/logging)
    config.yaml         the same, for `eval.py --config` on another machine
    generation.json     the sampling settings of rollouts, evaluation and tips, and the stop token ids
    rng_rank{r}.pt      Python / NumPy / torch (/ CUDA) generator states of every rank
It is written to a temporary folder and renamed into place, so a crash leaves a complete checkpoint or none.
The newest `keep` checkpoints are kept.

On resume no rank reads the whole optimizer state into host RAM (7B AdamW: 61 GB, x8 ranks = 490 GB), see
load_optimizer: optimizer.pt is memory-mapped (`torch.load(mmap=True)`: its tensors are pages of the file in the
page cache, read when touched, shared by the processes of a node, dropped under memory pressure). Under FSDP the
file holds full tensors, so only rank 0 maps it and `set_optimizer_state_dict(broadcast_from_rank0=True)` sends
the tensors one at a time, every rank keeping its shard (peak per rank: its shards plus one full tensor). Under
data parallel every rank needs all of it (a replica): each maps the file and the optimizer moves the tensors to the
parameters' device; what would stay on the CPU is copied out of the mapping, so no live state is a view of a file
that a later checkpoint deletes.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch
import yaml

from config import REMOVED, TIP_TEMPERATURE, Config, ConfigError, to_dict
from infra.models import load_trainable, save_model
from infra.runtime import gather_objects, is_sharded


class CheckpointError(RuntimeError):
    """A checkpoint could not be written; the previous checkpoints are untouched."""


def generation_settings(config: dict, model, tokenizer) -> dict:
    """How the run generated: rollout sampling, evaluation temperature, tip settings and the stop ids, for whoever
    serves or evaluates the checkpoint outside this code (the full config is in config.yaml)."""
    from engine.generation import stop_ids

    rollout = config.get("rollout", {})
    keys = ("temperature", "top_p", "max_action_tokens", "max_prompt_tokens", "tip_max_tokens")
    return {**{key: rollout.get(key) for key in keys}, "tip_temperature": TIP_TEMPERATURE,
            "eval_temperature": config.get("train", {}).get("eval_temperature"),
            "stop_token_ids": stop_ids(model, tokenizer.eos_token_id)}


def save_checkpoint(out_dir: Path, iteration: int, model, tokenizer, optimizer, memory, accelerator,
                    keep: int, config: dict | None = None) -> Path:
    folder = out_dir / "checkpoints" / f"iter_{iteration:06d}"
    tmp = out_dir / "checkpoints" / f".tmp_iter_{iteration:06d}"
    full_state, optimizer_state = gather_states(model, optimizer)  # a collective under FSDP: every rank calls it

    def shared_part():
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        save_model(model, tokenizer, str(tmp / "model"), full_state,
                   base_name=(config or {}).get("model", {}).get("name_or_path"))
        torch.save(optimizer_state, tmp / "optimizer.pt")
        if memory is not None:
            memory.save(str(tmp / "memory.json"))
        (tmp / "state.json").write_text(json.dumps({"iteration": iteration, "world_size": accelerator.num_processes}))
        if config is not None:  # what check_resume compares a resumed run's config with; the YAML for people and
            (tmp / "config.json").write_text(json.dumps(config, indent=1))  # for `eval.py --config` elsewhere
            (tmp / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
            (tmp / "generation.json").write_text(json.dumps(generation_settings(config, model, tokenizer), indent=1))

    def rank_part():
        rng_state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
        if torch.cuda.is_available():
            rng_state["cuda"] = torch.cuda.get_rng_state_all()
        torch.save(rng_state, tmp / f"rng_rank{accelerator.process_index}.pt")

    # Every rank learns whether every other rank's part was written, so a failure (a full disk, a vanished mount)
    # stops all ranks with the same error instead of leaving some waiting in a barrier.
    _everyone_ok(accelerator, shared_part if accelerator.is_main_process else None, tmp, folder)
    _everyone_ok(accelerator, rank_part, tmp, folder)
    if accelerator.is_main_process:
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)  # a checkpoint folder is complete or absent
        old = sorted((out_dir / "checkpoints").glob("iter_*"))
        for stale in old[: max(0, len(old) - keep)]:
            shutil.rmtree(stale, ignore_errors=True)
    accelerator.wait_for_everyone()
    return folder


def _everyone_ok(accelerator, write, tmp: Path, folder: Path) -> None:
    error = ""
    if write is not None:
        try:
            write()
        except OSError as err:
            error = f"{type(err).__name__}: {err}"
    errors = [e for e in gather_objects(accelerator, error) if e]
    if errors:
        if accelerator.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
        previous = sorted(folder.parent.glob("iter_*"))
        kept = f"the previous checkpoint {previous[-1]} is intact" if previous else "no earlier checkpoint exists"
        raise CheckpointError(f"cannot write checkpoint {folder.name} ({errors[0]}); {kept}")


def gather_states(model, optimizer) -> tuple[dict | None, dict]:
    """(full weights or None, optimizer state). Under FSDP both are gathered in full to rank 0's CPU (other ranks
    get empty dicts), keyed by parameter name; otherwise (None, optimizer.state_dict())."""
    if not is_sharded(model):
        return None, optimizer.state_dict()
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict

    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return get_model_state_dict(model, options=options), get_optimizer_state_dict(model, optimizer, options=options)


def find_checkpoint(out_dir: Path, resume: str) -> Path | None:
    """`resume` is "" (start fresh), "latest" (the newest in out_dir) or a checkpoint folder."""
    if not resume:
        return None
    if resume == "latest":
        found = sorted((out_dir / "checkpoints").glob("iter_*"))
        if not found:
            raise FileNotFoundError(f"--resume=latest: no checkpoint in {out_dir / 'checkpoints'}")
        return found[-1]
    path = Path(resume)
    if not (path / "state.json").is_file():
        raise FileNotFoundError(f"--resume={resume}: not a checkpoint folder (no state.json)")
    return path


# Keys a resumed run may change: how long it runs, what it logs and keeps, where it writes, how many JVMs its
# environments share (the same worlds either way). Anything else (the model, the loss, the rollout, the seed, ...)
# would make the continuation a different run than the one checkpointed.
RESUMABLE_CHANGES = {"output_dir", "resume", "train.iterations", "train.eval_every", "train.eval_tasks",
                     "train.eval_episodes_per_task", "train.save_every", "train.keep_checkpoints",
                     "train.torch_threads", "train.tensorboard", "train.wandb_project", "train.log_episodes",
                     "env.scienceworld.jvms"}


def _flatten(tree: dict, schema=None, prefix: str = "") -> dict:
    """{"section.key": value} down to the config schema's leaves (a dict-valued key is one leaf)."""
    schema, out = Config() if schema is None else schema, {}
    for key, value in tree.items():
        section = getattr(schema, key, None)
        if isinstance(value, dict) and dataclasses.is_dataclass(section):
            out.update(_flatten(value, section, f"{prefix}{key}."))
        else:
            out[prefix + key] = value
    return out


def check_resume(folder: Path, config: dict, world_size: int) -> None:
    """Refuse a resume that cannot continue the checkpointed run: another number of processes (the task rows,
    sampling streams and mini-batches are per rank) or a config that differs beyond RESUMABLE_CHANGES."""
    state = json.loads((folder / "state.json").read_text())
    if state.get("world_size", world_size) != world_size:
        raise ConfigError(f"--resume: {folder} was written by {state['world_size']} processes, this run has "
                          f"{world_size}; resume with the same number")
    saved_file = folder / "config.json"
    if not saved_file.is_file():  # written before configs were saved with checkpoints
        return
    saved, now = _flatten(json.loads(saved_file.read_text())), _flatten(config)
    removed = sorted(k for k in saved if k in REMOVED)
    if removed:  # never silently ignored: the run depended on a setting this code no longer has
        raise ConfigError(f"--resume: the checkpoint's config has keys this code has removed: "
                          + "; ".join(f"{k} ({REMOVED[k]})" for k in removed)
                          + ". Resume it at the commit that wrote it")
    # A key the code gained after the checkpoint was written (e.g. model.init_adapter) had, in effect, its default
    # value in that run: resuming with the default continues the same run; any other value is a change.
    defaults = _flatten(to_dict(Config()))
    saved.update({k: defaults[k] for k in now.keys() - saved.keys() if k in defaults})
    changed = sorted(k for k in saved.keys() | now.keys() if saved.get(k) != now.get(k) and k not in RESUMABLE_CHANGES)
    if changed:
        details = ", ".join(f"{k}: {saved.get(k)!r} -> {now.get(k)!r}" for k in changed[:5])
        raise ConfigError(f"--resume: the config differs from the checkpoint's ({details}); only "
                          f"{sorted(RESUMABLE_CHANGES)} may change on resume")


def load_checkpoint(folder: Path, model, optimizer, memory, accelerator) -> int:
    """Restore weights, optimizer, memory and this rank's generators; returns the checkpoint's iteration."""
    load_trainable(model, str(folder / "model"))
    load_optimizer(folder / "optimizer.pt", model, optimizer, accelerator)
    if memory is not None and (folder / "memory.json").is_file():
        memory.load(str(folder / "memory.json"))
    rng_file = folder / f"rng_rank{accelerator.process_index}.pt"
    if rng_file.is_file():
        state = torch.load(rng_file, weights_only=False)
        random.setstate(state["python"])
        np.random.set_state(state["numpy"])
        torch.set_rng_state(state["torch"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
    return json.loads((folder / "state.json").read_text())["iteration"]


def load_optimizer(file: Path, model, optimizer, accelerator) -> None:
    """Restore the optimizer state written by save_checkpoint without any rank holding all of it in host RAM.

    FSDP: optimizer.pt holds full tensors keyed by parameter name (gather_states). Rank 0 memory-maps it, the other
    ranks read nothing; set_optimizer_state_dict(broadcast_from_rank0=True) broadcasts one tensor at a time (over
    the accelerator's process group: NCCL on GPUs, gloo on CPU) and every rank copies its shard out of it. A rank
    holds its shards plus one full tensor at a time; rank 0's mapped pages are page cache, not its own memory.
    Data parallel: every rank needs the whole state. Each maps the file; load_state_dict moves the tensors to the
    parameters' device (as an uninterrupted run holds them: moments with the parameters, `step` on the CPU)."""
    sharded = is_sharded(model)
    state = {}
    if accelerator.is_main_process or not sharded:
        state = torch.load(file, map_location="cpu", mmap=True, weights_only=True)
    if sharded:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        tuples = [{k for k, v in group.items() if isinstance(v, tuple)} for group in optimizer.param_groups]
        set_optimizer_state_dict(model, optimizer, state,
                                 options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
        for group, keys in zip(optimizer.param_groups, tuples):  # its flattening turns AdamW's betas into a list
            group.update({k: tuple(group[k]) for k in keys if isinstance(group.get(k), list)})
    else:
        optimizer.load_state_dict(state)
    del state  # the file stays mapped only while a tensor views it
    _own_cpu_state(optimizer)


def _own_cpu_state(optimizer) -> None:
    """Copy the optimizer's plain CPU tensors out of the file mapping they may still view (FSDP: rank 0's `step`
    scalars; data parallel on CPU: everything). The mapping is private (copy-on-write), yet a page not yet
    written still shows the file: the live state must not depend on a file that rotation deletes or a copy rewrites."""
    from torch.distributed.tensor import DTensor

    for values in optimizer.state.values():
        for key, value in values.items():
            if isinstance(value, torch.Tensor) and not isinstance(value, DTensor) and value.device.type == "cpu":
                values[key] = value.clone()


def write_rank_fingerprints(out_dir: Path, model, memory, accelerator) -> None:
    """ranks.json: a hash of every rank's trainable weights and memory. They must all be equal; a mismatch
    means the ranks drifted apart (e.g. a skipped gradient reduce)."""
    weights = hashlib.sha256()
    for name, param in sorted((n, p) for n, p in model.named_parameters() if p.requires_grad):
        weights.update(name.encode())
        full = param.full_tensor() if hasattr(param, "full_tensor") else param  # FSDP: a collective, same order
        weights.update(full.detach().float().cpu().numpy().tobytes())
    mem = hashlib.sha256(json.dumps(memory.state_dict() if memory else {}, sort_keys=True).encode())
    everyone = gather_objects(accelerator, (weights.hexdigest(), mem.hexdigest()))
    if accelerator.is_main_process:
        (out_dir / "ranks.json").write_text(json.dumps({
            "world_size": accelerator.num_processes, "weights_sha256": [w for w, _ in everyone],
            "memory_sha256": [m for _, m in everyone]}, indent=1))
