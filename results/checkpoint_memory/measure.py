"""Host memory of each rank while an FSDP2 run resumes its AdamW state, before/after F9 (2 CPU processes, gloo).

    python results/checkpoint_memory/measure.py [--hidden 2048] [--layers 12] [--out results/checkpoint_memory]

The model is a stack of `layers` Linear(hidden, hidden) (12 x 2048^2: 50.4M fp32 parameters, 201 MB), one FSDP2
unit per Linear (infra.runtime.shard_model). A first launch takes one AdamW step and writes optimizer.pt the way
infra.checkpoint.save_checkpoint does (infra.checkpoint.gather_states: full tensors on rank 0, torch.save): 403 MB. Then each
variant loads it in a fresh 2-process launch, after the model is sharded and the optimizer built:
    "before": the previous infra.checkpoint.load_checkpoint (kept below): every rank torch.load()s the whole file
              (weights_only=False, no mmap), then set_optimizer_state_dict(full_state_dict=True).
    "after":  the current infra.checkpoint.load_optimizer: rank 0 maps the file (mmap=True), the others read nothing;
              set_optimizer_state_dict(full_state_dict=True, broadcast_from_rank0=True).
    "floor":  only what set_optimizer_state_dict does first in both: _init_optim_state, one AdamW step with zero
              gradients and lr 0 that allocates this rank's gradient (100 MB) and moment (201 MB) shards.
Per rank: the RSS high-water mark during the load (VmHWM, reset through /proc/self/clear_refs just before it)
minus the RSS just before it, and the peak of RssAnon (the process's own memory: what cannot be dropped) and of
RssFile (mapped file pages: page cache, shared between processes, dropped under pressure) from a 1 ms sampler
thread, both minus their value before. Unavoidable in either variant: the rank's own two moment shards
(2 x 201 MB / 2 ranks = 201 MB) and, inside torch, zero gradient shards ("floor"). Each variant also writes a
hash of its rank's loaded shards: the two variants must load the same state (and not the floor's zeros).
"""
from __future__ import annotations

import argparse
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402


def status() -> dict:
    out = {}
    for line in open("/proc/self/status"):
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS", "RssAnon", "RssFile"):
            out[key] = int(value.split()[0]) * 1024
    return out


class Sampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.peak, self.running = status(), True

    def run(self):
        while self.running:
            now = status()
            self.peak = {k: max(v, now[k]) for k, v in self.peak.items()}
            time.sleep(0.001)


def build(hidden: int, layers: int):
    from accelerate.utils import set_seed

    from infra.runtime import Launch, make_accelerator, shard_model

    accelerator = make_accelerator()
    set_seed(0)
    model = torch.nn.Sequential(*[torch.nn.Linear(hidden, hidden) for _ in range(layers)])
    shard_model(model, torch.float32, Launch(fsdp=True, wrap_classes=("Linear",)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    return accelerator, model, optimizer


def load_before(file: Path, model, optimizer, accelerator) -> None:
    """infra.checkpoint.load_checkpoint's optimizer part before F9."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

    set_optimizer_state_dict(model, optimizer, torch.load(file, weights_only=False),
                             options=StateDictOptions(full_state_dict=True))


def worker(phase: str, folder: Path, hidden: int, layers: int) -> None:
    torch.set_num_threads(1)
    accelerator, model, optimizer = build(hidden, layers)
    rank, file = accelerator.process_index, folder / "optimizer.pt"
    if phase == "save":
        from infra.checkpoint import gather_states

        model(torch.randn(2, hidden)).square().mean().backward()
        optimizer.step()
        _, state = gather_states(model, optimizer)
        if accelerator.is_main_process:
            torch.save(state, file)
        accelerator.wait_for_everyone()
        return
    from infra.checkpoint import load_optimizer

    accelerator.wait_for_everyone()
    before = status()
    open("/proc/self/clear_refs", "w").write("5")  # reset VmHWM to the current RSS
    sampler = Sampler()
    sampler.start()
    start = time.perf_counter()
    if phase == "before":
        load_before(file, model, optimizer, accelerator)
    elif phase == "floor":  # what set_optimizer_state_dict does first in both variants (torch-internal)
        from torch.distributed.checkpoint.state_dict import _init_optim_state

        _init_optim_state(optimizer)
    else:
        load_optimizer(file, model, optimizer, accelerator)
    seconds = time.perf_counter() - start
    sampler.running = False
    sampler.join()
    peak = {**sampler.peak, "VmHWM": status()["VmHWM"]}
    digest = hashlib.sha256()
    for index, s in sorted(optimizer.state_dict()["state"].items()):
        for key in sorted(s):
            value = s[key]
            digest.update((value.to_local() if hasattr(value, "to_local") else value).numpy().tobytes())
    own = sum(v.to_local().numel() * v.element_size() for s in optimizer.state.values() for v in s.values()
              if hasattr(v, "to_local"))
    record = {"rank": rank, "seconds": round(seconds, 2), "own_shards_MB": own / 1e6,
              "peak_rss_delta_MB": (peak["VmHWM"] - before["VmRSS"]) / 1e6,
              "peak_anon_delta_MB": (peak["RssAnon"] - before["RssAnon"]) / 1e6,
              "peak_file_delta_MB": (peak["RssFile"] - before["RssFile"]) / 1e6,
              "rss_before_MB": before["VmRSS"] / 1e6, "state_sha256": digest.hexdigest()[:16]}
    (folder / f"{phase}_rank{rank}.json").write_text(json.dumps(record))
    accelerator.wait_for_everyone()


def launch(phase: str, folder: Path, hidden: int, layers: int) -> None:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}", __file__,
           "--worker", phase, "--folder", str(folder), "--hidden", str(hidden), "--layers", str(layers)]
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if proc.returncode:
        raise SystemExit(proc.stderr[-4000:])


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--hidden", type=int, default=2048)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--out", default=str(ROOT / "results" / "checkpoint_memory"))
    parser.add_argument("--worker")
    parser.add_argument("--folder")
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, Path(args.folder), args.hidden, args.layers)
        return
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        launch("save", folder, args.hidden, args.layers)
        size = (folder / "optimizer.pt").stat().st_size
        rows = []
        for phase in ("floor", "before", "after"):
            launch(phase, folder, args.hidden, args.layers)
            rows += [{"variant": phase, **json.loads((folder / f"{phase}_rank{r}.json").read_text())} for r in (0, 1)]
    hashes = {(r["rank"], r["variant"]): r["state_sha256"] for r in rows}
    same = all(hashes[(r, "before")] == hashes[(r, "after")] != hashes[(r, "floor")] for r in (0, 1))
    result = {"hidden": args.hidden, "layers": args.layers, "optimizer_pt_MB": size / 1e6,
              "same_state_both_variants": same, "rows": rows}
    Path(args.out, "output.json").write_text(json.dumps(result, indent=1) + "\n")
    print(f"optimizer.pt {size / 1e6:.0f} MB; both variants load the same state on every rank: {same}")
    print("variant rank  peak RSS +MB  peak anon +MB  peak file +MB  own shards MB  seconds")
    for r in rows:
        print(f"{r['variant']:7} {r['rank']:4}  {r['peak_rss_delta_MB']:11.0f}  {r['peak_anon_delta_MB']:13.0f}  "
              f"{r['peak_file_delta_MB']:13.0f}  {r['own_shards_MB']:13.0f}  {r['seconds']:7.2f}")


if __name__ == "__main__":
    main()
