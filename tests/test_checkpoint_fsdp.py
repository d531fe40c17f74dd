"""Resuming an FSDP2 run restores every rank's AdamW shards exactly, with only rank 0 reading optimizer.pt (memory-
mapped) and the other ranks receiving their shards by broadcast (infra.checkpoint.load_optimizer): 2 CPU processes, gloo.
Without FSDP the mapped state is restored exactly and copied out of the file before training uses it."""
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from conftest import clean_env, free_port

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "fsdp_resume.py")
WORLD = 2


@pytest.fixture(scope="module")
def resumed(tmp_path_factory, tiny_folder):
    out = tmp_path_factory.mktemp("fsdp_resume")
    for mode in ("save", "resume"):  # two launches: the resume starts from new processes, as after a crash
        proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={WORLD}",
                               f"--master_port={free_port()}", SCRIPT, mode, tiny_folder, str(out)],
                              cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-4000:]

    def load(name):
        return [torch.load(out / f"rank{r}_{name}.pt", weights_only=True) for r in range(WORLD)]

    file = torch.load(out / "checkpoints" / "iter_000002" / "optimizer.pt", weights_only=True)
    return {name: load(name) for name in ("saved", "loaded", "uninterrupted", "resumed")} | {"file": file}


@pytest.mark.slow
def test_every_rank_gets_back_its_own_adamw_shards_exactly(resumed):
    file = resumed["file"]
    for rank in range(WORLD):
        saved, loaded = resumed["saved"][rank], resumed["loaded"][rank]
        assert sorted(loaded["state"]) == sorted(saved["state"]) == sorted(file["state"])
        assert loaded["param_groups"] == saved["param_groups"]
        for name, state in saved["state"].items():
            assert sorted(loaded["state"][name]) == sorted(state) == ["exp_avg", "exp_avg_sq", "step"]
            for key, value in state.items():
                got = loaded["state"][name][key]
                assert got.dtype == value.dtype and torch.equal(got, value), f"rank {rank}: {name}.{key} differs"
            assert state["step"].item() == 2.0
            # Independently of load_checkpoint: the shard a rank held before saving is its dim-0 chunk of the full
            # tensor in the file (FSDP2 shards dim 0 like torch.chunk), so save wrote what the ranks held.
            for key in ("exp_avg", "exp_avg_sq"):
                chunks = torch.chunk(file["state"][name][key], WORLD, dim=0)
                expected = chunks[rank] if rank < len(chunks) else file["state"][name][key][:0]
                assert torch.equal(state[key], expected), f"rank {rank}: {name}.{key} is not its chunk of the file"
    # A non-trivial state: the moments moved away from a fresh optimizer's zeros on both ranks.
    for rank in range(WORLD):
        assert any(s["exp_avg"].abs().sum() > 0 for s in resumed["saved"][rank]["state"].values())


@pytest.mark.slow
def test_only_rank_0_reads_the_optimizer_file_and_maps_it(resumed):
    loads = [resumed["loaded"][r]["loads"] for r in range(WORLD)]
    assert loads[0].count(("optimizer.pt", True)) == 1 and not [f for f, mmap in loads[0] if
                                                                  f == "optimizer.pt" and not mmap]
    assert all(f != "optimizer.pt" for r in range(1, WORLD) for f, _ in loads[r])


@pytest.mark.slow
def test_the_step_after_resume_equals_the_uninterrupted_step(resumed):
    for rank in range(WORLD):
        whole, again = resumed["uninterrupted"][rank], resumed["resumed"][rank]
        assert sorted(whole) == sorted(again)
        for name, value in whole.items():
            assert torch.equal(again[name], value), f"rank {rank}: {name} differs after the resumed step"


def test_data_parallel_state_is_restored_exactly_and_does_not_view_the_file(tmp_path):
    from infra.checkpoint import load_optimizer

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    for _ in range(3):
        model(torch.randn(4, 64)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    file = tmp_path / "optimizer.pt"
    torch.save(optimizer.state_dict(), file)
    expected = {i: {k: v.clone() for k, v in s.items()} for i, s in optimizer.state_dict()["state"].items()}
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    load_optimizer(file, model, fresh, SimpleNamespace(is_main_process=True))
    # Overwrite the file in place: a tensor still mapped from it (copy-on-write pages not yet written) would change.
    size = file.stat().st_size
    with open(file, "r+b") as f:
        f.write(bytes(size))
    got = fresh.state_dict()
    assert got["param_groups"] == optimizer.state_dict()["param_groups"]
    assert sorted(got["state"]) == sorted(expected) == [0, 1, 2, 3]
    for index, state in expected.items():
        assert sorted(got["state"][index]) == ["exp_avg", "exp_avg_sq", "step"]
        for key, value in state.items():
            assert torch.equal(got["state"][index][key], value), f"{index}.{key} differs (or views the file)"
    assert expected[0]["step"].item() == 3.0 and expected[0]["exp_avg"].abs().sum() > 0
