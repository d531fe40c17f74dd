"""Weights & Biases, offline: a run that crashes between logging an iteration and checkpointing it, and its
`--resume`, log to ONE wandb run with every iteration once (infra/metrics.py, MetricsLogger). What wandb wrote is read
back from its own transaction logs (wandb/offline-run-*-<id>/run-<id>.wandb), not through our code: the LevelDB log
format of wandb's datastore (a 7-byte file header, 32 KiB blocks of records: crc32, length, type, data), each
record a `wandb.proto.wandb_internal_pb2.Record`. `wandb sync` uploads these files in order of start time.
A tiny random Qwen2 on the sanity environment keeps each run to seconds."""
import json
import struct
import time
import zlib
from pathlib import Path

import pytest

from config import load_config
from test_resilience import SANITY, rows, tiny_args

pytestmark = pytest.mark.slow

BLOCK, HEADER = 32768, 7
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


@pytest.fixture
def wandb_offline(tmp_path, monkeypatch):
    """wandb offline and silent, every file it writes (cache, settings, data) under tmp_path, none in the home
    folder; no console capture (pytest's own) and no system-metrics sampler process."""
    pytest.importorskip("wandb")
    home = tmp_path / "wandb_home"
    for name in ("DIR", "CACHE_DIR", "CONFIG_DIR", "DATA_DIR", "ARTIFACT_DIR"):
        (home / name.lower()).mkdir(parents=True)
        monkeypatch.setenv(f"WANDB_{name}", str(home / name.lower()))
    for name, value in {"WANDB_MODE": "offline", "WANDB_SILENT": "true", "WANDB_CONSOLE": "off",
                        "WANDB__DISABLE_STATS": "true", "WANDB_DISABLE_GIT": "true", "WANDB_DISABLE_CODE": "true",
                        "WANDB__SAVE_REQUIREMENTS": "false"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("WANDB_RUN_ID", raising=False)
    monkeypatch.delenv("WANDB_RESUME", raising=False)


def wandb_records(path: Path):
    """Every Record in a .wandb transaction log, checksums checked."""
    from wandb.proto import wandb_internal_pb2

    data = path.read_bytes()
    assert struct.unpack("<4sHB", data[:HEADER]) == (b":W&B", 0xBEE1, 0), "not a wandb transaction log"
    pos, payload = HEADER, b""
    while pos < len(data):
        if BLOCK - pos % BLOCK < HEADER:  # a block's trailer too short for a record header: zero padding
            assert not data[pos : pos - pos % BLOCK + BLOCK].strip(b"\0")
            pos += BLOCK - pos % BLOCK
            continue
        checksum, length, kind = struct.unpack("<IHB", data[pos : pos + HEADER])
        chunk = data[pos + HEADER : pos + HEADER + length]
        assert kind in (FULL, FIRST, MIDDLE, LAST) and len(chunk) == length, f"torn record at byte {pos} of {path}"
        assert zlib.crc32(chunk, zlib.crc32(bytes([kind]))) & 0xFFFFFFFF == checksum, f"bad checksum in {path}"
        pos += HEADER + length
        payload += chunk
        if kind in (FULL, LAST):
            record = wandb_internal_pb2.Record()
            record.ParseFromString(payload)
            payload = b""
            yield record


def read_offline_run(folder: Path, timeout: float = 30.0) -> dict:
    """One offline run directory: its run record, history rows ({key: value}, in order) and exit code. run.finish()
    returns before wandb's service has written the log to disk (it flushes soon after, or at process exit), so this
    waits, up to `timeout` seconds, for the log to end with the run's exit record."""
    (log,) = folder.glob("run-*.wandb")
    deadline = time.monotonic() + timeout
    while True:
        try:
            records = list(wandb_records(log))
        except AssertionError:  # a record being written
            records = []
        if any(r.WhichOneof("record_type") == "exit" for r in records):
            break
        assert time.monotonic() < deadline, f"{log}: no exit record after {timeout} s (the run was not finished)"
        time.sleep(0.1)
    run, history, exit_code = None, [], None
    for record in wandb_records(log):
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run = record.run
        elif kind == "history":
            history.append({"/".join(item.nested_key) or item.key: json.loads(item.value_json)
                            for item in record.history.item})
        elif kind == "exit":
            exit_code = record.exit.exit_code
    assert run is not None, f"no run record in {log}"
    return {"folder": folder, "log": log, "run": run, "history": history, "exit_code": exit_code}


class Killed(RuntimeError):
    """The process dying: raised where the checkpoint of an iteration would be written."""


def test_a_run_killed_between_a_log_and_its_checkpoint_and_resumed_logs_one_wandb_run_every_iteration_once(
        tmp_path, tiny_folder, wandb_offline, monkeypatch):
    """Iterations 1-3 are logged, the checkpoint of 2 is written and the run dies writing the checkpoint of 3;
    `--resume=latest` re-runs 3 and runs 4. wandb gets iterations 1-3 from the first process and only 4 from the
    second (it holds 3 already), both under one run id, the second marked as a resume: `wandb sync` would upload
    steps 1, 2, 3, 4 once each, and they hold metrics.jsonl's numbers (a resume is exact, timings aside)."""
    import train as train_module

    out = tmp_path / "run"
    args = ["--train.wandb_project=empo2-test", "--train.save_every=2"]
    real_save = train_module.save_checkpoint

    def dies_at_iteration_3(out_dir, iteration, *rest, **kwargs):
        if iteration == 3:
            raise Killed("killed while writing the checkpoint of iteration 3")
        return real_save(out_dir, iteration, *rest, **kwargs)

    monkeypatch.setattr(train_module, "save_checkpoint", dies_at_iteration_3)
    with pytest.raises(Killed):
        train_module.train(load_config(SANITY, tiny_args(tiny_folder, out, "--train.iterations=3", *args)))
    monkeypatch.setattr(train_module, "save_checkpoint", real_save)
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["iter_000002"]
    assert [r["iteration"] for r in rows(out)] == [1, 2, 3]
    run_id = (out / "wandb_run_id").read_text().strip()

    train_module.train(load_config(SANITY, tiny_args(tiny_folder, out, "--train.iterations=4", "--resume=latest",
                                                     *args)))
    logged = rows(out)
    assert [r["iteration"] for r in logged] == [1, 2, 3, 4]

    runs = sorted((read_offline_run(folder) for folder in (out / "wandb").glob("offline-run-*")),
                  key=lambda r: r["run"].start_time.ToNanoseconds())  # the order `wandb sync` uploads them in
    assert len(runs) == 2, [r["folder"].name for r in runs]  # one per process, both of the same run
    for r in runs:
        assert r["run"].run_id == run_id and r["run"].project == "empo2-test"
        assert r["folder"].name.endswith(f"-{run_id}") and r["log"].name == f"run-{run_id}.wandb"
    first, second = runs
    assert not first["run"].resume and second["run"].resume  # the second continues the run on sync
    assert (first["exit_code"], second["exit_code"]) == (1, 0)  # close() finished both: failed, then done
    steps = [[row["_step"] for row in r["history"]] for r in runs]
    assert steps == [[1, 2, 3], [4]]  # iteration 3 is not sent again
    uploaded = [row for r in runs for row in r["history"]]
    assert [row["_step"] for row in uploaded] == [row["iteration"] for row in uploaded] == [1, 2, 3, 4]
    for row, mine in zip(uploaded, logged):
        numbers = {k: v for k, v in mine.items() if isinstance(v, (int, float)) and not k.startswith("time")}
        assert {k: row[k] for k in numbers} == numbers, row["_step"]
    assert (out / "wandb_run_id").read_text().strip() == run_id
    assert json.loads((out / "wandb_step").read_text()) == {"run_id": run_id, "step": 4}


def test_a_resume_that_turns_wandb_on_sends_the_checkpointed_rows_first(tmp_path, wandb_offline):
    """MetricsLogger as train.py drives it: a run without wandb logs iterations 1-3 and dies with its checkpoint at
    2; the resume (start=3) turns wandb on. The new wandb run gets 1 and 2 from metrics.jsonl, then 3 and 4."""
    from config import Config
    from infra.metrics import MetricsLogger

    out = tmp_path / "run"
    out.mkdir()
    cfg = Config()
    cfg.train.tensorboard = False
    logger = MetricsLogger(out, cfg, enabled=True)
    for i in (1, 2, 3):
        logger.log({"iteration": i, "mode": "no_memory", "return_mean": float(i)})
    logger.close(exit_code=1)
    assert not (out / "wandb").exists()
    cfg.train.wandb_project = "empo2-test"
    logger = MetricsLogger(out, cfg, enabled=True, start=3)
    for i in (3, 4):
        logger.log({"iteration": i, "mode": "no_memory", "return_mean": 10.0 * i})
    logger.close()
    (run,) = [read_offline_run(folder) for folder in (out / "wandb").glob("offline-run-*")]
    assert run["run"].run_id == (out / "wandb_run_id").read_text().strip() and not run["run"].resume
    assert [(row["_step"], row["return_mean"]) for row in run["history"]] == [(1, 1.0), (2, 2.0), (3, 30.0),
                                                                              (4, 40.0)]
    assert [r["return_mean"] for r in rows(out)] == [1.0, 2.0, 30.0, 40.0]
