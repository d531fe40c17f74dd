"""Episode logs read the same plain (x.jsonl, what a run writes) and gzip-compressed (x.jsonl.gz, how results/ keeps
them: `gzip -9 -n`): tools/compare.py's measurements and tools/viewer.py's pages, on real files, no mocks."""
import gzip
import json
import shutil

from infra.metrics import jsonl_files, jsonl_text
from tools import compare
from tools.viewer import make_app

COMMANDS = "Available commands: look around, open door, focus on the red lamp."


def episode(mode: str, group: int, ret: float, actions: list[str]) -> dict:
    return {"task": "lab/1", "mode": mode, "group": group, "seed": 7, "return": ret, "extrinsic_return": ret,
            "success": ret == 100.0, "truncated": "", "observations": [COMMANDS] * len(actions),
            "tips_shown": [""] * len(actions), "actions": actions, "rewards": [ret / len(actions)] * len(actions),
            "intrinsic": [1.0] * len(actions), "corrected": [0] * len(actions), "final_observation": "done",
            "tip": "open the door first"}


LOGS = {  # out/runs/<folder>/episodes/<name>.jsonl
    "grpo_s0/episodes/iter_000001_rank0": [episode("no_memory", 0, -100.0, ["focus on the red lamp"]),
                                           episode("no_memory", 0, 33.0, ["open door", "look around"])],
    "grpo_s0/episodes/iter_000004_rank0": [episode("no_memory", 1, 100.0, ["open door", "x y z"]),
                                           episode("no_memory", 1, 100.0, ["look around"])],
    "grpo_s0/episodes/val_000002": [episode("no_memory", 0, 0.0, ["zzz"])],
    "grpo_s0/episodes/val_000004": [episode("no_memory", 0, 66.0, ["open door"])],
    "base_s0/episodes/evaluation": [episode("no_memory", 0, -100.0, ["qqq", "look around"])],
}


def write_run(out, compressed: bool):
    """The same runs, episode logs plain or compressed as results/ compresses them."""
    for name, records in LOGS.items():
        path = out / "runs" / f"{name}.jsonl"
        path.parent.mkdir(parents=True, exist_ok=True)
        data = "".join(json.dumps(r) + "\n" for r in records).encode()
        if compressed:  # gzip -9 -n: no name, no time stamp
            path.with_name(path.name + ".gz").write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
        else:
            path.write_bytes(data)
    run = out / "runs" / "grpo_s0"
    (run / "config.yaml").write_text("train:\n  iterations: 4\n")
    (run / "metrics.jsonl").write_text("".join(json.dumps({"iteration": i, "mode": "no_memory", "return_mean": 1.0})
                                               + "\n" for i in (1, 4)))
    return run


def test_compressed_and_plain_episode_logs_read_the_same(tmp_path):
    plain, packed = write_run(tmp_path / "plain" / "out", False), write_run(tmp_path / "gz" / "out", True)
    assert not list((packed / "episodes").glob("*.jsonl")) and len(list((packed / "episodes").glob("*.gz"))) == 4

    for name in ("iter_000001_rank0", "val_000004"):  # either name of the file finds it
        expected = LOGS[f"grpo_s0/episodes/{name}"]
        assert compare.read_jsonl(plain / "episodes" / f"{name}.jsonl") == expected
        assert compare.read_jsonl(packed / "episodes" / f"{name}.jsonl") == expected
        assert compare.read_jsonl(packed / "episodes" / f"{name}.jsonl.gz") == expected
    assert list(jsonl_files(packed / "episodes", "iter_*")) == ["iter_000001_rank0", "iter_000004_rank0"]

    signal = compare.training_signal([plain])
    assert signal["no_memory"]["episodes"] == 4 and signal["no_memory"]["fatal_share_first_quarter"] == 0.5
    assert compare.training_signal([packed]) == signal
    use = compare.command_use_over_training(plain.parents[1], "grpo", [0])
    stages = ("untrained", "first_quarter", "last_quarter", "final_validation")
    assert [use[stage]["episodes"] for stage in stages] == [1, 2, 2, 1]
    assert use["final_validation"]["partial"] == 1.0  # val_000004 (the last), not val_000002
    assert compare.command_use_over_training(packed.parents[1], "grpo", [0]) == use

    pages = ("/", "/episodes/iter_000001_rank0", "/episodes/iter_000004_rank0/1", "/episodes/val_000002",
             "/episodes/val_000004.jsonl")
    plain_app, packed_app = make_app(plain).test_client(), make_app(packed).test_client()
    for url in pages:
        want, got = plain_app.get(url), packed_app.get(url)
        assert want.status_code == got.status_code == 200, url
        assert got.get_data(as_text=True).replace(str(packed), "RUN") == want.get_data(as_text=True).replace(
            str(plain), "RUN"), url
    index = packed_app.get("/").get_data(as_text=True)
    assert 'href="/episodes/iter_000004_rank0"' in index and 'href="/episodes/val_000004"' in index
    assert packed_app.get("/episodes/iter_000002_rank0").status_code == 404


def test_the_plain_log_wins_where_both_forms_exist(tmp_path):
    """A plain file is what a run writes last: where a compressed copy lies next to it, the plain one is read."""
    (tmp_path / "val_000001.jsonl").write_text('{"a": 1}\n')
    (tmp_path / "val_000001.jsonl.gz").write_bytes(gzip.compress(b'{"a": 2}\n'))
    (tmp_path / "val_000002.jsonl.gz").write_bytes(gzip.compress(b'{"a": 3}\n'))
    assert jsonl_files(tmp_path) == {"val_000001": tmp_path / "val_000001.jsonl",
                                     "val_000002": tmp_path / "val_000002.jsonl.gz"}
    assert jsonl_text(tmp_path / "val_000001.jsonl.gz") == '{"a": 1}\n'
    assert jsonl_text(tmp_path / "val_000002.jsonl") == '{"a": 3}\n'
    assert jsonl_text(tmp_path / "val_000003.jsonl") is None and compare.read_jsonl(tmp_path / "val_000003.jsonl") == []
    shutil.rmtree(tmp_path)
    assert jsonl_files(tmp_path) == {}  # a missing folder holds no logs
