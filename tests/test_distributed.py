"""Several processes on CPU (gloo): the update of 2 ranks, through data parallel and through FSDP2, and of 1 process
equals a hand-written reference in which every step weighs the same in every mini-batch; `accelerate launch` with
the shipped FSDP config trains, checkpoints and resumes; launch options this trainer does not support stop with one
line (infra.runtime.check_launch)."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml

from config import ModelConfig
from conftest import clean_env, free_port
from infra.runtime import LaunchError, check_launch
from advantages import pay_novelty
from samples import minibatch_normaliser

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = str(ROOT / "tests" / "distributed_update.py")
ACCELERATE = str(Path(sys.executable).with_name("accelerate"))


def run(cmd: list[str], timeout: int = 300) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=timeout)
    return proc


# ----------------------------------------------------------------------------- the update over 2 ranks


@pytest.fixture(scope="module")
def updates(tmp_path_factory):
    """Every mode of tests/distributed_update.py: the 1-process ones in one process, the 2-process ones in one
    launch (each mode on a fresh model; launches cost seconds each)."""
    out = tmp_path_factory.mktemp("updates")
    for modes, launcher in [("reference,single", [sys.executable]),
                            ("dp,fsdp,fsdp_nan,dp_episode", [sys.executable, "-m", "torch.distributed.run",
                                                              "--nproc_per_node=2", f"--master_port={free_port()}"])]:
        proc = run(launcher + [SCRIPT, modes, str(out)])
        last = out / f"{modes.split(',')[-1]}.pt"
        finished = [rank for rank in (0, 1) if Path(f"{last}.rank{rank}.done").exists()]
        assert proc.returncode == 0, f"{modes}: ranks that finished their work: {finished}\n{proc.stderr[-6000:]}"
    return {mode: torch.load(out / f"{mode}.pt", weights_only=False)
            for mode in ("reference", "single", "dp", "fsdp", "fsdp_nan", "dp_episode")}


def relative(a: dict, b: dict) -> float:
    """||a - b|| / ||b|| over all tensors of two parameter dicts."""
    diff = sum(((a[k] - b[k]).double() ** 2).sum() for k in b) ** 0.5
    return (diff / sum((b[k].double() ** 2).sum() for k in b) ** 0.5).item()


def change(weights: dict) -> dict:
    """What the update did: the weights after it minus the initial ones."""
    from distributed_update import tiny_model

    return {n: weights[n] - p.detach() for n, p in tiny_model().named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["dp", "fsdp"])
def test_two_ranks_train_on_the_minibatches_of_one_process(updates, mode):
    """Rank 0 holds 4 episodes, rank 1 holds 2: the update cuts the global list into the same mini-batches as one
    process (18 and 3 steps, by hand), hands each to the ranks balanced by tokens (by hand: 1 long episode to rank
    0, 2 short ones to rank 1), and moves the weights as one process does; FSDP pads rank 0 with a zero-weight
    micro-batch per mini-batch."""
    from distributed_update import EPISODES, minibatches_by_hand, shares_by_hand

    batches = minibatches_by_hand()
    assert [sum(len(EPISODES[e][1]) for e in b) for b in batches] == [18, 3]
    assert updates["single"]["shares"] == [[sorted(b) for b in batches]]  # one process: every episode, 2 steps
    assert updates[mode]["shares"] == [[sorted(shares_by_hand(b)[r]) for b in batches] for r in (0, 1)]
    assert relative(change(updates[mode]["weights"]), change(updates["single"]["weights"])) < 1e-5
    assert max(v.abs().max().item() for v in change(updates[mode]["weights"]).values()) > 1e-2  # not untouched
    per_rank = [[len(s) for s in shares_by_hand(b)] for b in batches]  # micro-batches of 1 sample
    assert updates[mode]["padding_passes"] == [float(sum(max(n) - n[r] for n in per_rank) if mode == "fsdp" else 0)
                                               for r in (0, 1)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["single", "dp", "fsdp"])
def test_every_step_weighs_the_same_in_every_minibatch(updates, mode):
    """Six packed episodes of 1-9 steps, minibatch_steps 10, on one process or split 4/2 over two ranks (the
    mini-batches hold 18 steps and 3): after the 2 SGD steps, the weights, the last gradient and the mean loss equal
    the hand-written reference's (tests/distributed_update.py reference_update): one sample per step, verl's
    dual-clip loss with ratios in every region, each step's token mean weighing 1 / minibatch_steps."""
    reference = updates["reference"]["equal"]
    assert set(reference["regions"]) == {"inside", "below", "above", "dual"}  # every clip branch is taken
    trained = updates[mode]
    assert trained["metrics"]["optimizer_steps"] == 2 and trained["skipped"][0] == 0
    assert trained["loss"] == pytest.approx(reference["loss"], rel=1e-5)
    assert relative(trained["grads"], reference["grads"]) < 1e-5
    assert relative(change(trained["weights"]), change(reference["weights"])) < 1e-5


@pytest.mark.slow
def test_a_normaliser_per_minibatch_would_weigh_the_lone_steps_6_times(updates):
    """Mini-batches of 18 steps and 3: dividing each by its own steps (the weighting before issue 40) weighs each
    of the 3 lone steps 6x each of the others; the update it gives differs from the equal-weight reference, and
    the trainer's from it, far beyond 1e-5."""
    reference, per_minibatch = updates["reference"]["equal"], updates["reference"]["per_minibatch"]
    assert reference["minibatch_steps"] == [18, 3]
    assert relative(change(per_minibatch["weights"]), change(reference["weights"])) > 0.3
    assert relative(change(updates["dp"]["weights"]), change(per_minibatch["weights"])) > 0.3


@pytest.mark.slow
def test_episode_weights_differ_from_the_reference(updates):
    """The earlier weighting (each packed episode one sample, its tokens averaged) on the same episodes is what
    the tests above reject: the update differs from the per-step reference by far more than their tolerance."""
    reference, episode = updates["reference"]["equal"], updates["dp_episode"]
    assert relative(change(episode["weights"]), change(reference["weights"])) > 1e-2
    assert relative(episode["grads"], reference["grads"]) > 1e-2


def test_one_normaliser_weighs_every_step_one_minibatch_share():
    """By hand: 21 steps, minibatch_steps 10: every mini-batch divides by 10 (each step weighs 1/10); 6 episodes of
    "episode" aggregation (6 units over 21 steps): 10 x 6 / 21; "token" aggregation (63 tokens over 21 steps):
    10 x 3; fewer steps than one mini-batch: still minibatch_steps steps' units (verl's fixed size), so each of 7
    steps weighs 1/10, not 1/7; nothing to learn: 0."""
    assert minibatch_normaliser(21, 21.0, 10) == 10.0
    assert minibatch_normaliser(21, 6.0, 10) == pytest.approx(60 / 21)
    assert minibatch_normaliser(21, 63.0, 10) == pytest.approx(30.0)
    assert minibatch_normaliser(7, 7.0, 10) == 10.0 and minibatch_normaliser(10, 3.5, 10) == 3.5
    assert minibatch_normaliser(7, 14.0, 10) == 20.0  # 7 steps of 2 tokens, token aggregation: 10 steps' tokens
    assert minibatch_normaliser(0, 0.0, 10) == 0.0


# ----------------------------------------------------------------------------- the novelty bonus over 2 ranks


def test_novelty_is_the_same_on_one_and_two_processes(tmp_path):
    """advantages.pay_novelty as train.play calls it: every rank's visits of the iteration are gathered and counted
    before any bonus is paid, so each step's 1/n (hence B_i) on 2 gloo ranks equals 1 process's for the same
    episodes, and both ranks hold the same counts. Expected values by hand (tests/distributed_novelty.py)."""
    from distributed_novelty import episodes_of, memory_before

    out = {}
    for name, launcher in (("single", [sys.executable]), ("ranks", [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}"])):
        file = tmp_path / f"{name}.json"
        proc = run(launcher + [str(ROOT / "tests" / "distributed_novelty.py"), str(file)])
        assert proc.returncode == 0, f"{name}:\n{proc.stderr[-4000:]}"
        out[name] = json.loads(file.read_text())
    # rooms/0: start x5, hall 1 (earlier) + 4, kitchen 2, garden 2, cellar 1, attic 1;
    # rooms/1: door 1 + 3, room 1 + 3, window 2, roof 1
    by_hand = [[1 / 5, 1 / 2, 1 / 2], [1 / 5, 1 / 5], [1.0, 0.0], [1 / 4, 1 / 4],
               [1 / 2, 1.0], [1 / 2, 1 / 5], [1 / 4, 1 / 2], [1 / 2, 1.0]]
    flat = lambda lists: [x for xs in lists for x in xs]  # noqa: E731
    assert [len(x) for x in out["single"]["intrinsic"]] == [len(x) for x in out["ranks"]["intrinsic"]] == [
        len(x) for x in by_hand]
    assert flat(out["single"]["intrinsic"]) == pytest.approx(flat(by_hand))
    assert flat(out["ranks"]["intrinsic"]) == pytest.approx(flat(by_hand))
    rank0, rank1 = out["ranks"]["visits"]
    assert rank0 == rank1 == out["single"]["visits"][0]
    # Without the gather each rank would count only its own visits: rank 0's first episode would be paid 1/4 for
    # "hall" (4 visits there, not 5), 1 for "kitchen" and 1 for "garden" (reached again on rank 1 only).
    local = []
    for rank in (0, 1):
        episodes = episodes_of(rank, 2)
        pay_novelty(episodes, memory_before())
        local += [ep.intrinsic for ep in episodes]
    assert local[0] == pytest.approx([1 / 4, 1.0, 1.0]) and flat(local) != pytest.approx(flat(by_hand))


@pytest.mark.slow
def test_a_nan_loss_on_one_rank_skips_the_step_on_every_rank(updates):
    from distributed_update import tiny_model

    result = updates["fsdp_nan"]
    assert result["skipped"] == [1.0, 1.0] and result["metrics"]["optimizer_steps"] == 0
    initial = dict(tiny_model().named_parameters())
    assert all(torch.equal(result["weights"][k], initial[k]) for k in initial)


# ----------------------------------------------------------------------------- accelerate launch, FSDP


def launch_config(tmp_path, name="fsdp_8gpu.yaml", **changes) -> str:
    """A shipped accelerate config made runnable here: 2 CPU processes, fp32 (bf16 is 6x slower on this CPU)."""
    cfg = yaml.safe_load((ROOT / "configs" / "accelerate" / name).read_text())
    cfg.update(num_processes=2, use_cpu=True, mixed_precision="no", main_process_port=free_port())
    for key, value in changes.items():
        section, _, field = key.rpartition(".")
        (cfg[section] if section else cfg)[field] = value
    file = tmp_path / f"accelerate_{len(list(tmp_path.glob('accelerate_*')))}.yaml"
    file.write_text(yaml.safe_dump(cfg))
    return str(file)


TRAIN_ARGS = ["--config", "configs/sanity_empo2.yaml", "--model.lora=false", "--model.gradient_checkpointing=true",
              "--train.save_every=1", "--train.eval_every=2", "--train.eval_tasks=1", "--rollout.group_size=2", "--rollout.tip_max_tokens=6",
              "--rollout.max_action_tokens=6", "--env.sanity.max_steps=2", "--train.tensorboard=false",
              "--memory.p_no_memory=0", "--memory.p_on_policy_tips=0", "--memory.p_off_policy=1"]


PROCESS_GROUP_AT_EXIT = """
import atexit, os, sys
import torch.distributed as dist
# Each rank reports into its own file: the ranks share torchrun's stdout, where their lines can interleave.
report = open(os.path.join({out!r}, "rank" + os.environ["RANK"] + ".txt"), "w")
def report_at_exit():
    report.write("process group alive at exit: %s\\n" % dist.is_initialized())
    threads = [open("/proc/self/task/%s/comm" % t).read().strip() for t in os.listdir("/proc/self/task")]
    report.write("gloo threads at exit: %d\\n" % sum("gloo" in name for name in threads))
    report.close()
atexit.register(report_at_exit)  # registered first, so it runs last: after the project's own exit handler
sys.path.insert(0, {root!r})
from infra.runtime import make_accelerator
accelerator = make_accelerator()
import torch.distributed.nn  # what loading a model with transformers imports, after the group exists
accelerator.wait_for_everyone()
report.write("world %d\\n" % accelerator.num_processes)
"""


def test_every_rank_destroys_its_process_group_before_the_interpreter_exits(tmp_path):
    """Left to interpreter shutdown, gloo's threads can abort a finished rank (SIGABRT, "terminate called without
    an active exception"), failing a run whose work was done; make_accelerator registers the clean-up, and the
    group must really be gone by then: no gloo thread left (torch.distributed.nn, imported after the group exists,
    would hold it in its functions' defaults)."""
    script = tmp_path / "at_exit.py"
    script.write_text(PROCESS_GROUP_AT_EXIT.format(root=str(ROOT), out=str(tmp_path)))
    proc = run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2", f"--master_port={free_port()}",
                str(script)], timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    for rank in (0, 1):
        report = (tmp_path / f"rank{rank}.txt").read_text()
        assert report == "world 2\nprocess group alive at exit: False\ngloo threads at exit: 0\n", (rank, report)


@pytest.mark.slow
def test_fsdp_full_fine_tune_trains_checkpoints_and_resumes_with_a_sharded_kl_reference(tmp_path, tiny_folder):
    """model.lora=false, loss.kl_coef=0.01 under FSDP2 on 2 CPU processes, launched with the shipped config: two
    iterations train and checkpoint, a second launch resumes at iteration 3. The frozen reference copy is sharded
    like the policy and scored inside its own full_weights (ranks hold different numbers of samples, no lockstep).
    Iterations 2 and 3 (the resumed one: its reference is the initial model again, not the checkpoint), whose
    gradient is gathered from the shards, each equal kl_coef x grad KL(pi || pi_ref) over both ranks' steps,
    computed independently (tests/kl_gradient.py); kl_ref is finite, and positive once the policy has moved from
    the initial weights (the random tiny model plays identical episodes, so weight decay moves it)."""
    config = launch_config(tmp_path)
    out = tmp_path / "run"
    args = TRAIN_ARGS + [f"--model.name_or_path={tiny_folder}", f"--output_dir={out}", "--loss.kl_coef=0.01",
                         "--train.lr=1e-3", "--train.weight_decay=10"]
    watched = [ACCELERATE, "launch", "--config_file", config, "tests/kl_gradient.py"]
    first = run(watched + [str(tmp_path / "kl_first.json"), *args, "--train.iterations=2"], 600)
    assert first.returncode == 0, first.stderr[-4000:]
    again = run(watched + [str(tmp_path / "kl_again.json"), *args, "--train.iterations=3", "--resume=latest"], 600)
    assert again.returncode == 0, again.stderr[-4000:]
    assert "continuing at iteration 3" in again.stdout + again.stderr
    # iteration 2 (the policy has moved from pi_ref) and iteration 3 (after the resume)
    for calls in (json.loads((tmp_path / "kl_first.json").read_text())[1],
                  json.loads((tmp_path / "kl_again.json").read_text())[0]):
        assert len(calls) == 1 and calls[0]["advantages_zero"] and calls[0]["branch_free"], calls
        assert calls[0]["expected"] > 1e-6 and calls[0]["rel_error"] < 1e-4, calls
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["iteration"] for r in rows] == [1, 2, 3] and all(r["optimizer_steps"] > 0 for r in rows)
    assert all(math.isfinite(r["kl_ref"]) for r in rows) and rows[1]["kl_ref"] > 0 and rows[2]["kl_ref"] > 0
    ranks = json.loads((out / "ranks.json").read_text())
    assert ranks["world_size"] == 2 and len(set(ranks["weights_sha256"])) == 1
    # The checkpoint is a standard, unsharded HF folder, and it holds the trained (not the initial) weights.
    from transformers import AutoModelForCausalLM

    saved = AutoModelForCausalLM.from_pretrained(out / "checkpoints" / "iter_000003" / "model")
    initial = AutoModelForCausalLM.from_pretrained(tiny_folder)
    assert saved.model.layers[0].self_attn.q_proj.weight.dtype == torch.float32  # the fp32 master weights
    assert not torch.equal(saved.model.layers[0].mlp.up_proj.weight, initial.model.layers[0].mlp.up_proj.weight)


@pytest.mark.slow
def test_unsupported_accelerate_config_stops_with_one_line(tmp_path):
    """One launch end to end (the other options are check_launch's cases below, set as accelerate sets them)."""
    config = launch_config(tmp_path, **{"fsdp_config.fsdp_offload_params": True})
    message = "fsdp_offload_params=true is not supported"
    proc = run([ACCELERATE, "launch", "--config_file", config, "train.py", "--config", "configs/quickstart.yaml",
                f"--output_dir={tmp_path / 'run'}", "--model.lora=false"], 120)
    assert proc.returncode != 0
    ours = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(ours) == 1 and message in ours[0], proc.stderr[-3000:]  # once, not once per rank
    assert "train.py\", line" not in proc.stderr  # no traceback from our code (the launcher prints its own)
    assert not (tmp_path / "run" / "checkpoints").exists()  # stopped before loading anything


# ----------------------------------------------------------------------------- check_launch, option by option


@pytest.mark.parametrize("env, message", [
    ({"ACCELERATE_USE_DEEPSPEED": "true"}, "DeepSpeed is not supported"),
    ({"ACCELERATE_DYNAMO_BACKEND": "INDUCTOR"}, "dynamo_backend=INDUCTOR is not supported"),
    ({"ACCELERATE_USE_MEGATRON_LM": "true"}, "Megatron-LM is not supported"),
    ({"ACCELERATE_GRADIENT_ACCUMULATION_STEPS": "4"}, "gradient_accumulation_steps=4"),
    ({"ACCELERATE_MIXED_PRECISION": "fp16"}, "contradicts model.dtype=bfloat16"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "1"}, "fsdp_version=1 is not supported"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_OFFLOAD_PARAMS": "true"},
     "fsdp_offload_params=true is not supported"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_SHARDING_STRATEGY": "HYBRID_SHARD"}, "HYBRID_SHARD"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_STATE_DICT_TYPE": "SHARDED_STATE_DICT"},
     "FULL_STATE_DICT"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_AUTO_WRAP_POLICY": "SIZE_BASED_WRAP"},
     "TRANSFORMER_BASED_WRAP"),
    ({"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_CPU_RAM_EFFICIENT_LOADING": "true"},
     "cpu_ram_efficient_loading"),
])
def test_check_launch_refuses_what_it_cannot_honour(monkeypatch, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(LaunchError, match=message):
        check_launch(ModelConfig(dtype="bfloat16", lora=False))


def test_check_launch_applies_what_it_supports(monkeypatch):
    model = ModelConfig(dtype="float32", lora=False)
    monkeypatch.setenv("ACCELERATE_MIXED_PRECISION", "bf16")
    assert not check_launch(model).fsdp and model.dtype == "bfloat16"  # bf16 compute over fp32 master weights
    for key, value in {"ACCELERATE_USE_FSDP": "true", "FSDP_VERSION": "2", "FSDP_RESHARD_AFTER_FORWARD": "false",
                       "FSDP_ACTIVATION_CHECKPOINTING": "true",
                       "FSDP_TRANSFORMER_CLS_TO_WRAP": "Qwen2DecoderLayer"}.items():
        monkeypatch.setenv(key, value)
    launch = check_launch(model)
    assert launch.fsdp and not launch.reshard_after_forward and launch.wrap_classes == ("Qwen2DecoderLayer",)
    assert model.gradient_checkpointing
    with pytest.raises(LaunchError, match="with model.lora=true launch data parallel"):
        check_launch(ModelConfig(lora=True))
