"""Runs that survive: per-rank sampling streams, crashed environments excluded from learning, resume that drops the
interrupted iteration's rows and refuses a changed config or world size, and SIGTERM -> checkpoint -> exit 0.
A tiny random Qwen2 on the sanity environment keeps each run to seconds."""
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from config import ConfigError, load_config
from conftest import clean_env, free_port

ROOT = Path(__file__).resolve().parents[1]
SANITY = str(ROOT / "configs" / "sanity_empo2.yaml")
pytestmark = pytest.mark.slow


def tiny_args(folder: str, out: Path, *extra: str) -> list[str]:
    return [f"--model.name_or_path={folder}", f"--output_dir={out}", "--rollout.group_size=2",
            "--rollout.tasks_per_iteration=2", "--env.sanity.max_steps=2", "--rollout.max_action_tokens=6",
            "--rollout.tip_max_tokens=6", "--train.eval_every=0", "--train.tensorboard=false", "--train.save_every=1",
            "--train.torch_threads=1", *extra]


def rows(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_ranks_sample_their_own_episodes_yet_keep_identical_weights(tmp_path, tiny_folder):
    """Both ranks play the only training variation: with one shared sampling stream they played the same episodes.
    Two off-policy iterations: the second shows, in every prompt, tips the first iteration wrote (memory synced
    over the ranks), and after both updates the ranks' weights and memories are still identical."""
    port = free_port()
    out = tmp_path / "run"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={port}", "train.py",
           "--config", SANITY, *tiny_args(tiny_folder, out, "--train.iterations=2", "--env.sanity.train_variations=1",
                                          "--train.log_episodes=-1", "--memory.p_no_memory=0",
                                          "--memory.p_on_policy_tips=0", "--memory.p_off_policy=1")]
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    played = {(i, r): [json.loads(line) for line in
                       (out / "episodes" / f"iter_{i:06d}_rank{r}.jsonl").read_text().splitlines()]
              for i in (1, 2) for r in (0, 1)}
    for i in (1, 2):
        assert {e["task"] for r in (0, 1) for e in played[i, r]} == {played[i, 0][0]["task"]}  # the same variation
        assert [e["actions"] for e in played[i, 0]] != [e["actions"] for e in played[i, 1]]
    first, second = rows(out)
    assert first["mode"] == second["mode"] == "off_policy"
    assert first["episodes"] == second["episodes"] == 4  # 2 task rows x 2 episodes, gathered from both ranks
    assert first["tips_retrieved"] == 0 and first["tips_written"] > 0  # an empty memory, then the first tips
    assert second["tips_retrieved"] > 0
    written = {e["tip"] for r in (0, 1) for e in played[1, r] if e["tip"]}
    # Iteration 2: every step's prompt carried a block of iteration 1's tips, and both ranks retrieved the same
    # block for the same first observation (identical memories; retrieval here is top-k by return).
    shown = [block for r in (0, 1) for e in played[2, r] for block in e["tips_shown"]]
    assert shown and all(any(tip in block for tip in written) for block in shown)
    assert played[2, 0][0]["tips_shown"][0] == played[2, 1][0]["tips_shown"][0]
    ranks = json.loads((out / "ranks.json").read_text())
    assert ranks["weights_sha256"][0] == ranks["weights_sha256"][1]
    assert ranks["memory_sha256"][0] == ranks["memory_sha256"][1]


def test_a_crashed_episode_is_counted_but_not_learned_from(tmp_path, tiny_folder, monkeypatch):
    from envs.sanity import SanityEnv
    from train import train

    original, calls, lock = SanityEnv.step, [0], threading.Lock()

    def crash_on_the_third_step(self, action):  # as an environment whose process died: done, env_error
        with lock:
            calls[0] += 1
            crash = calls[0] == 3
        if crash:
            return "", 0.0, True, {"env_error": "injected crash", "success": False, "truncated": True}
        return original(self, action)

    monkeypatch.setattr(SanityEnv, "step", crash_on_the_third_step)
    out = tmp_path / "run"
    train(load_config(SANITY, tiny_args(tiny_folder, out, "--train.iterations=2", "--train.log_episodes=-1",
                                        "--memory.p_no_memory=1", "--memory.p_on_policy_tips=0",
                                        "--memory.p_off_policy=0")))
    first, second = rows(out)
    assert first["episodes_excluded"] == 1 and first["truncated_env_error"] == 0.25  # 1 of 4 episodes
    assert second["episodes_excluded"] == 0 and second["optimizer_steps"] > 0  # the run went on
    assert first["samples"] == 3  # three episodes trained (one packed sample each), the crashed one not
    crashed = [e for e in map(json.loads, (out / "episodes" / "iter_000001_rank0.jsonl").read_text().splitlines())
               if e["truncated"] == "env_error"]
    assert len(crashed) == 1 and crashed[0]["tip"] == ""  # no tip from a cut episode


@pytest.mark.java
def test_a_jvm_killed_mid_rollout_is_restarted_and_its_episode_excluded(tmp_path, tiny_folder, monkeypatch, caplog):
    """Real ScienceWorld: the JVM of one environment is SIGKILLed just before its step (the second step of the
    rollout). The step fails in py4j, the environment logs a restart and starts a new JVM, the episode is counted
    but not learned from, and the next iteration plays on the new JVM."""
    pytest.importorskip("scienceworld")
    from envs.scienceworld import ScienceWorldEnv
    from train import train

    original, calls, lock, killed = ScienceWorldEnv.step, [0], threading.Lock(), []

    def kill_my_jvm_on_the_second_step(self, action):
        with lock:
            calls[0] += 1
            kill = calls[0] == 2
        if kill:
            jvm = self._host._jvm
            os.kill(jvm.pid, signal.SIGKILL)
            jvm.proc.wait(timeout=30)  # dead before the step goes out
            killed.append(self)
        return original(self, action)

    monkeypatch.setattr(ScienceWorldEnv, "step", kill_my_jvm_on_the_second_step)
    out = tmp_path / "run"
    args = [f"--model.name_or_path={tiny_folder}", f"--output_dir={out}", "--env.scienceworld.num_demos=0",
            "--env.scienceworld.max_steps=3", "--rollout.tasks_per_iteration=1", "--rollout.group_size=2",
            "--rollout.max_action_tokens=6", "--rollout.tip_max_tokens=6", "--train.iterations=2",
            "--train.eval_every=0", "--train.tensorboard=false", "--train.torch_threads=1",
            "--memory.p_no_memory=1", "--memory.p_on_policy_tips=0", "--memory.p_off_policy=0"]
    with caplog.at_level(logging.WARNING, logger="envs.scienceworld.env"):
        train(load_config(str(ROOT / "configs" / "quickstart.yaml"), args))
    first, second = rows(out)
    assert first["episodes_excluded"] == 1 and first["truncated_env_error"] == 0.5 and first["samples"] == 1
    assert second["episodes_excluded"] == 0 and second["samples"] == 2  # the restarted environment plays again
    (env,) = killed
    assert env.restarts == 1
    assert "ScienceWorld JVM failed; starting a new one" in caplog.text


def test_resume_drops_the_interrupted_iterations_rows_and_refuses_a_changed_run(tmp_path, tiny_folder):
    from train import train

    out = tmp_path / "run"
    train(load_config(SANITY, tiny_args(tiny_folder, out, "--train.iterations=2")))
    # The interrupted run had logged iteration 3 (and a half-written 4) after its last checkpoint (iteration 2).
    with open(out / "metrics.jsonl", "a") as f:
        f.write(json.dumps({"iteration": 3, "return_mean": 123.0}) + "\n" + '{"iteration": 4, "ret')  # torn
    resume = tiny_args(tiny_folder, out, "--train.iterations=3", "--resume=latest")
    with pytest.raises(ConfigError, match="rollout.temperature: 1.0 -> 0.5"):
        train(load_config(SANITY, resume + ["--rollout.temperature=0.5"]))
    train(load_config(SANITY, resume))
    got = rows(out)
    assert [r["iteration"] for r in got] == [1, 2, 3] and got[2].get("return_mean") != 123.0
    state = out / "checkpoints" / "iter_000003" / "state.json"
    state.write_text(json.dumps({**json.loads(state.read_text()), "world_size": 8}))
    with pytest.raises(ConfigError, match="written by 8 processes, this run has 1"):
        train(load_config(SANITY, tiny_args(tiny_folder, out, "--train.iterations=4", "--resume=latest")))


def test_a_checkpoint_older_than_a_config_key_resumes_with_its_default_and_refuses_another(tmp_path):
    """A checkpoint written before the code gained a key (its config.json lacks it) ran, in effect, with the key's
    default: resuming with the default continues it, resuming with another value is refused by name."""
    from infra.checkpoint import check_resume
    from config import Config, to_dict

    folder = tmp_path / "iter_000001"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps({"iteration": 1, "world_size": 1}))
    old = to_dict(Config())
    del old["model"]["init_adapter"]  # the code of this checkpoint had no such key
    (folder / "config.json").write_text(json.dumps(old))
    check_resume(folder, to_dict(Config()), world_size=1)
    changed = Config()
    changed.model.init_adapter = "/some/adapter"
    with pytest.raises(ConfigError, match="model.init_adapter: '' -> '/some/adapter'"):
        check_resume(folder, to_dict(changed), world_size=1)


def test_a_checkpoint_with_a_key_the_code_has_removed_is_refused_by_name(tmp_path):
    """A checkpoint whose run set a key this code no longer has (config.REMOVED) is never resumed as if the key had
    not been there: the refusal names the key and what the code now always does."""
    from infra.checkpoint import check_resume
    from config import Config, to_dict

    folder = tmp_path / "iter_000001"
    folder.mkdir()
    (folder / "state.json").write_text(json.dumps({"iteration": 1, "world_size": 1}))
    old = to_dict(Config())
    old["loss"]["advantage_eps"] = 1e-6  # written by a commit that still had the key
    (folder / "config.json").write_text(json.dumps(old))
    with pytest.raises(ConfigError, match=r"loss\.advantage_eps \(A = \(R - mean\) / \(std \+ 1e-6\)"):
        check_resume(folder, to_dict(Config()), world_size=1)


def test_sigterm_finishes_the_iteration_checkpoints_and_exits_zero(tmp_path, tiny_folder):
    out = tmp_path / "run"
    cmd = [sys.executable, "train.py", "--config", SANITY,
           *tiny_args(tiny_folder, out, "--train.iterations=200", "--train.save_every=0")]
    log = tmp_path / "log.txt"  # a file, not a pipe: progress bars must never block the child on a full pipe
    with open(log, "w") as sink:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=clean_env(), stdout=sink, stderr=subprocess.STDOUT, text=True)
        deadline = time.time() + 240
        while not ((out / "metrics.jsonl").exists() and (out / "metrics.jsonl").read_text().strip()):
            assert proc.poll() is None and time.time() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=240)
    assert proc.returncode == 0, log.read_text()[-3000:]
    done = rows(out)[-1]["iteration"]
    assert done < 200 and f"stopped by a signal after iteration {done}" in log.read_text()
    assert (out / "checkpoints" / f"iter_{done:06d}").is_dir()
    from train import train

    train(load_config(SANITY, tiny_args(tiny_folder, out, f"--train.iterations={done + 1}", "--train.save_every=0",
                                        "--resume=latest")))
    assert [r["iteration"] for r in rows(out)] == list(range(1, done + 2))


def test_a_checkpoint_that_fails_half_way_keeps_the_previous_one_and_says_so(tmp_path, tiny_folder, monkeypatch):
    import torch

    from infra import checkpoint
    from train import train

    out = tmp_path / "run"
    train(load_config(SANITY, tiny_args(tiny_folder, out, "--train.iterations=1")))
    before = sorted(p.name for p in (out / "checkpoints" / "iter_000001").rglob("*"))
    real_save = torch.save

    def disk_full_at_the_optimizer(obj, path, *args, **kwargs):  # the model is already written by then
        if str(path).endswith("optimizer.pt"):
            raise OSError(28, "No space left on device")
        return real_save(obj, path, *args, **kwargs)

    monkeypatch.setattr(checkpoint.torch, "save", disk_full_at_the_optimizer)
    with pytest.raises(checkpoint.CheckpointError, match="cannot write checkpoint iter_000002 .*No space left on "
                                                         "device.*iter_000001 is intact"):
        train(load_config(SANITY, tiny_args(tiny_folder, out, "--train.iterations=2", "--resume=latest")))
    assert sorted(p.name for p in (out / "checkpoints").iterdir()) == ["iter_000001"]  # no half checkpoint left
    assert sorted(p.name for p in (out / "checkpoints" / "iter_000001").rglob("*")) == before



def test_a_run_killed_in_iteration_3_and_resumed_equals_an_uninterrupted_run(tmp_path, tiny_folder):
    """SIGKILL (no chance to checkpoint) in the middle of the run; the resumed run's metrics (timings aside) and
    weights equal those of a run that was never interrupted, across all three modes and an evaluation."""
    args = ["--config", SANITY, "--train.iterations=4", "--train.eval_every=2", "--train.eval_tasks=2",
            "--memory.p_no_memory=0.5", "--memory.p_on_policy_tips=0.25", "--memory.p_off_policy=0.25"]
    whole, killed = tmp_path / "whole", tmp_path / "killed"
    done = subprocess.run([sys.executable, "train.py", *args, *tiny_args(tiny_folder, whole)], cwd=ROOT,
                          env=clean_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "log.txt", "w") as sink:
        proc = subprocess.Popen([sys.executable, "train.py", *args, *tiny_args(tiny_folder, killed)], cwd=ROOT,
                                env=clean_env(), stdout=sink, stderr=subprocess.STDOUT)
        deadline = time.time() + 240
        while not ((killed / "metrics.jsonl").exists() and len(rows(killed)) >= 2):
            assert proc.poll() is None and time.time() < deadline
            time.sleep(0.05)
        proc.kill()  # SIGKILL during iteration 3 (or while iteration 2's checkpoint is written)
        proc.wait(timeout=60)
    again = subprocess.run([sys.executable, "train.py", *args, *tiny_args(tiny_folder, killed), "--resume=latest"],
                           cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]

    def without_times(out):
        return [{k: v for k, v in r.items() if not k.startswith("time")} for r in rows(out)]

    assert {r["mode"] for r in rows(whole)} == {"no_memory", "on_policy_tips", "off_policy"}
    assert without_times(killed) == without_times(whole)
    assert json.loads((killed / "ranks.json").read_text()) == json.loads((whole / "ranks.json").read_text())


def test_periodic_validation_leaves_the_training_stream_alone(tmp_path, tiny_folder):
    """A run that validates after every iteration trains exactly as one that never validates."""
    from train import train

    runs = {}
    for every in (0, 1):
        out = tmp_path / f"eval_every_{every}"
        train(load_config(SANITY, tiny_args(tiny_folder, out, "--train.iterations=2", f"--train.eval_every={every}",
                                            "--train.eval_tasks=2")))
        runs[every] = ([{k: v for k, v in r.items() if not k.startswith(("time", "val_"))} for r in rows(out)],
                       json.loads((out / "ranks.json").read_text()))
    assert "val_return_mean" in rows(tmp_path / "eval_every_1")[0]
    assert runs[0] == runs[1]


def test_a_full_fine_tune_resumes_against_the_initial_reference(tmp_path, tiny_folder, monkeypatch):
    """model.lora=false with the KL term: the reference copy is frozen, the optimizer never sees it, it still holds
    the initial weights after training, and a resumed run reloads it from model.name_or_path (checkpoints do not
    store it), so iteration 2's kl_ref after a resume equals that of an uninterrupted run (a reference built from the
    checkpoint's trained weights would give another kl_ref). Iteration 2's gradient, whole and resumed, is the KL
    term's: kl_coef x grad KL(pi || pi_ref), computed independently (tests/kl_gradient.py)."""
    import math

    import torch
    from transformers import AutoModelForCausalLM

    import infra.runtime
    import train as trainer
    from kl_gradient import watch

    seen = {"references": [], "optimizers": [], "kl_gradients": []}
    real_update, real_load = watch(trainer.update, seen["kl_gradients"]), infra.runtime.load_reference

    def load_reference(*args, **kwargs):
        seen["references"].append(real_load(*args, **kwargs))
        return seen["references"][-1]

    def update(model, optimizer, *args, **kwargs):
        seen["optimizers"].append([p for group in optimizer.param_groups for p in group["params"]])  # kept alive
        return real_update(model, optimizer, *args, **kwargs)

    monkeypatch.setattr(infra.runtime, "load_reference", load_reference)  # as infra.runtime.load_models calls it
    monkeypatch.setattr(trainer, "update", update)
    # The random tiny model plays identical episodes (zero advantages); weight decay is what moves the policy here.
    kl = ["--model.lora=false", "--loss.kl_coef=0.01", "--train.lr=1e-3", "--train.weight_decay=10"]
    whole, cut = tmp_path / "whole", tmp_path / "cut"
    trainer.train(load_config(SANITY, tiny_args(tiny_folder, whole, "--train.iterations=2", *kl)))
    trainer.train(load_config(SANITY, tiny_args(tiny_folder, cut, "--train.iterations=1", *kl)))
    trainer.train(load_config(SANITY, tiny_args(tiny_folder, cut, "--train.iterations=2", "--resume=latest", *kl)))
    assert len(seen["references"]) == 3 and len(seen["optimizers"]) == 4  # iterations 1, 2 | 1 | 2

    def without_times(out):
        return [{k: v for k, v in r.items() if not k.startswith("time")} for r in rows(out)]

    assert without_times(cut) == without_times(whole)
    assert all(math.isfinite(r["kl_ref"]) for r in rows(whole)) and rows(whole)[1]["kl_ref"] > 0
    # Iteration 2 (whole run, resumed run): one optimizer step whose gradient is the KL term's alone, as it should be.
    for calls in (seen["kl_gradients"][1], seen["kl_gradients"][3]):
        assert len(calls) == 1 and calls[0]["advantages_zero"] and calls[0]["branch_free"], calls
        assert calls[0]["expected"] > 1e-6 and calls[0]["rel_error"] < 1e-4, calls
    initial = AutoModelForCausalLM.from_pretrained(tiny_folder).state_dict()
    optimized = {id(p) for params in seen["optimizers"] for p in params}  # all alive: no id is reused
    for reference in seen["references"]:
        assert not any(p.requires_grad for p in reference.parameters())
        assert not optimized & {id(p) for p in reference.parameters()}
        assert all(torch.equal(value, initial[name]) for name, value in reference.state_dict().items())
