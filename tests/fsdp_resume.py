"""Save and resume an FSDP2-sharded AdamW over 2 CPU processes (gloo); run by tests/test_checkpoint_fsdp.py.

    torchrun --nproc_per_node 2 tests/fsdp_resume.py save   MODEL_FOLDER OUT_DIR
    torchrun --nproc_per_node 2 tests/fsdp_resume.py resume MODEL_FOLDER OUT_DIR

save: shard the model, take two AdamW steps on rank-dependent tokens, write OUT_DIR/rank{r}_saved.pt (this rank's
optimizer state: the local shard of every exp_avg / exp_avg_sq, every step, the param groups), checkpoint with
infra.checkpoint.save_checkpoint, take a third step and write OUT_DIR/rank{r}_uninterrupted.pt (this rank's weight shards).
resume (new processes): a fresh model and optimizer, infra.checkpoint.load_checkpoint, write OUT_DIR/rank{r}_loaded.pt
(the same record, plus every torch.load this rank made: file name and mmap flag), take the third step and write
OUT_DIR/rank{r}_resumed.pt.
"""
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from infra import checkpoint  # noqa: E402
from config import ModelConfig  # noqa: E402
from infra.models import load_policy  # noqa: E402
from infra.runtime import Launch, make_accelerator, shard_model  # noqa: E402


def local(t: torch.Tensor) -> torch.Tensor:
    return (t.to_local() if hasattr(t, "to_local") else t).detach().clone()


def optimizer_record(model, optimizer) -> dict:
    names = {p: n for n, p in model.named_parameters()}
    state = {names[p]: {k: local(v) for k, v in s.items()} for p, s in optimizer.state.items()}
    groups = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    return {"state": state, "param_groups": groups}


def step(model, optimizer, rank: int, iteration: int) -> None:
    gen = torch.Generator().manual_seed(1000 * iteration + rank)  # each rank its own tokens: the reduce matters
    ids = torch.randint(3, model.config.vocab_size, (2, 12), generator=gen)
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def main(mode: str, model_folder: str, out: str) -> None:
    torch.set_num_threads(1)
    out_dir = Path(out)
    accelerator = make_accelerator()
    rank = accelerator.process_index
    model, tokenizer = load_policy(ModelConfig(name_or_path=model_folder, lora=False, dtype="float32"),
                                   autocast_forward=False)
    shard_model(model, torch.float32, Launch(fsdp=True))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2, weight_decay=0.1)
    if mode == "save":
        for iteration in (1, 2):
            step(model, optimizer, rank, iteration)
        torch.save(optimizer_record(model, optimizer), out_dir / f"rank{rank}_saved.pt")
        checkpoint.save_checkpoint(out_dir, 2, model, tokenizer, optimizer, None, accelerator, keep=1)
        record_name = "uninterrupted"
    else:
        loads, original = [], torch.load

        def recording_load(f, *args, **kwargs):
            if isinstance(f, (str, Path)):  # (broadcast_object_list unpickles tensors from BytesIO)
                loads.append((Path(f).name, bool(kwargs.get("mmap"))))
            return original(f, *args, **kwargs)

        torch.load = recording_load
        try:
            iteration = checkpoint.load_checkpoint(out_dir / "checkpoints" / "iter_000002", model, optimizer, None,
                                                   accelerator)
        finally:
            torch.load = original
        assert iteration == 2
        torch.save({**optimizer_record(model, optimizer), "loads": loads}, out_dir / f"rank{rank}_loaded.pt")
        record_name = "resumed"
    step(model, optimizer, rank, 3)
    torch.save({n: local(p) for n, p in model.named_parameters()}, out_dir / f"rank{rank}_{record_name}.pt")
    accelerator.wait_for_everyone()


if __name__ == "__main__":
    main(*sys.argv[1:4])
