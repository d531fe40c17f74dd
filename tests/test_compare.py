"""tools/compare.py by hand (fast, no model): permutation test, Welch's t, bootstrap CI, curve area, the runner's bookkeeping."""
import json
import math
import os
import sys
import threading
import time

import numpy as np
import pytest

from tools import compare


def test_exact_permutation_test_by_hand():
    # pooled 1, 2, 3, 4 split 2 + 2: 6 splits; |mean difference| >= 2 only for {1,2}|{3,4} and {3,4}|{1,2}
    assert math.isclose(compare.permutation_p([1, 2], [3, 4]), 2 / 6)
    # identical arms: every split is at least as extreme as 0
    assert compare.permutation_p([5, 5, 5], [5, 5, 5]) == 1.0


def test_welch_t_by_hand():
    t, df = compare.welch_t([1, 2, 3], [4, 5, 6])  # means 2 and 5, variances 1: t = -3 / sqrt(2/3), df = 4
    assert math.isclose(t, -3 / math.sqrt(2 / 3)) and math.isclose(df, 4.0)
    t, df = compare.welch_t([1, 2, 3, 4], [0, 0, 0, 8])  # var 5/3 and 16: se^2 = 5/12 + 4 = 53/12
    assert math.isclose(t, 0.5 / math.sqrt(53 / 12))
    assert math.isclose(df, (53 / 12) ** 2 / ((5 / 12) ** 2 / 3 + 4 ** 2 / 3))


def test_bootstrap_ci_brackets_the_difference_and_is_degenerate_without_spread():
    low, high = compare.bootstrap_ci([10, 10, 10], [4, 4, 4])
    assert low == high == 6.0
    low, high = compare.bootstrap_ci([0, 10, 20, 30, 40], [0, 0, 0, 0, 0])
    assert 0 < low < 20 < high < 40  # the difference of means is 20; resampled means lie in [0, 40]


def test_area_is_the_trapezoid_mean_over_training():
    assert compare.area({0: 0.0, 5: 10.0, 10: 10.0}) == 7.5  # (0 + 10) / 2 * 5 + 10 * 5 = 75, / 10
    assert compare.mean_se([1, 2, 3]) == (2.0, float(np.std([1, 2, 3], ddof=1) / math.sqrt(3)))


def test_arms_differ_only_by_their_overrides():
    assert compare.SETTING_ARMS["difficulty1_warmup"] == ["grpo", "empo2", "empo2_no_off_policy", "empo2_env_tips"]
    assert set(compare.ARMS) == {*compare.SETTING_ARMS["difficulty1"], *compare.SETTING_ARMS["switch_oracle"]}
    assert compare.ARMS["empo2_no_off_policy"][1] == ["--memory.p_on_policy_tips=0.25", "--memory.p_off_policy=0"]
    assert all(not arg.startswith("--train.seed") for arg in compare.SETTING)


def test_parallel_runs_get_one_torch_thread_each_unless_the_caller_says_otherwise(monkeypatch, tmp_path):
    # the sanity configs set train.torch_threads: 2, which overrides OMP_NUM_THREADS inside train.py
    monkeypatch.setattr(compare, "THREADS", 1)
    cmd = compare.train_command("grpo", 3, tmp_path, [])
    assert cmd.count("--train.torch_threads=1") == 1 and cmd[-1] == f"--output_dir={tmp_path}"
    cmd = compare.train_command("grpo", 3, tmp_path, ["--train.torch_threads=2"])
    assert cmd.index("--train.torch_threads=2") > cmd.index("--train.torch_threads=1")  # the last override wins
    monkeypatch.setattr(compare, "THREADS", None)  # one run at a time: the config's thread count
    assert not any("torch_threads" in arg for arg in compare.train_command("grpo", 3, tmp_path, []))


def test_pending_runs_are_seed_major_and_skip_finished_runs(tmp_path):
    runs = tmp_path / "runs"
    for done in ("base_s0/eval.json", "grpo_s0/done.json", "empo2_s1/done.json"):
        (runs / done).parent.mkdir(parents=True)
        (runs / done).write_text("{}")
    (runs / "empo2_s0" / "checkpoints" / "iter_000005").mkdir(parents=True)  # interrupted: still pending (resumed)
    assert compare.pending_runs(tmp_path, [0, 1], ["grpo", "empo2"]) == [
        ("empo2", 0), ("base", 1), ("grpo", 1)]
    assert compare.pending_runs(tmp_path, [1, 0], ["empo2"]) == [("base", 1), ("empo2", 0)]


def test_summary_leaves_out_a_finished_run_whose_untrained_evaluation_is_missing(tmp_path):
    run = tmp_path / "runs" / "grpo_s3"
    run.mkdir(parents=True)
    (run / "done.json").write_text('{"wall_seconds": 1.0}')
    assert compare.summarise(tmp_path, [3])["arms"] == {}  # no base_s3/eval.json yet: no iteration 0


def test_a_run_stopped_early_with_exit_code_0_is_not_taken_as_finished(tmp_path):
    (tmp_path / "config.yaml").write_text("train:\n  iterations: 40\n  seed: 1\n")
    for it in (5, 10):
        (tmp_path / "checkpoints" / f"iter_{it:06d}").mkdir(parents=True)
    with pytest.raises(compare.RunFailed, match="stopped at iter_000010 of 40"):
        compare.last_checkpoint(tmp_path)
    (tmp_path / "checkpoints" / "iter_000040").mkdir()
    assert compare.last_checkpoint(tmp_path).name == "iter_000040"


def test_training_signal_counts_fatal_staged_and_flat_groups_per_mode(tmp_path):
    import json

    def write(run, name, records):
        (run / "episodes").mkdir(parents=True, exist_ok=True)
        (run / "episodes" / name).write_text("".join(json.dumps(r) + "\n" for r in records))

    def ep(mode, group, ret, novelty=(), actions=()):  # novelty: the per-step bonuses 1/n_t
        return {"mode": mode, "group": group, "extrinsic_return": ret, "intrinsic": list(novelty),
                "success": ret == 100.0, "actions": list(actions)}

    a, b = tmp_path / "a", tmp_path / "b"
    write(a, "iter_000001_rank0.jsonl", [ep("no_memory", 0, 0.0), ep("no_memory", 0, 0.0),      # flat
                                         ep("no_memory", 1, -100.0, actions=["focus on the blue lamp"]),
                                         ep("no_memory", 1, 33.0)])  # not flat
    write(a, "iter_000002_rank0.jsonl", [ep("off_policy", 0, 66.0), ep("off_policy", 0, 66.0)])  # flat
    write(a, "val_000005.jsonl", [ep("no_memory", 0, -100.0)])  # validation: not training signal
    write(b, "iter_000001_rank0.jsonl", [ep("no_memory", 0, -100.0), ep("no_memory", 0, -100.0)])  # flat
    write(b, "iter_000004_rank0.jsonl", [ep("no_memory", 0, 0.0, [1.0, 0.5]), ep("no_memory", 0, 0.0, [1.0])])
    # a: GRPO (no novelty bonus); b: EMPO²'s bonus, summed over steps, added to the advantage
    (a / "config.yaml").write_text("train:\n  iterations: 8\n")  # quarters: iterations 1-2 and 7-8
    (b / "config.yaml").write_text("train:\n  iterations: 4\nintrinsic:\n  coef: 0.1\n  combine: advantage\n"
                                   "  aggregate: sum\n")  # quarters: iterations 1 and 4
    (a / "metrics.jsonl").write_text('{"mode": "no_memory", "tip_hit_rate": 0.0}\n'
                                     '{"mode": "off_policy", "tip_hit_rate": 0.5}\n')
    (b / "metrics.jsonl").write_text('{"mode": "off_policy", "tip_hit_rate": 1.0}\n')
    signal = compare.training_signal([a, b])
    # quarters by (iteration - 1) * 4 // iterations: a's iterations 1 and 2 of 8 and b's 1 of 4 in the first, b's 4
    # in the last; no memory, first quarter: 0, 0, -100 (wrote a focus), 33, -100, -100
    quarters = signal["no_memory"].pop("endings_by_quarter")
    assert quarters[0] == {"episodes": 6, "success": 0.0, "fatal": 3 / 6, "partial": 1 / 6, "focus": 1 / 6}
    assert quarters[1]["episodes"] == quarters[2]["episodes"] == 0
    assert quarters[3] == {"episodes": 2, "success": 0.0, "fatal": 0.0, "partial": 0.0, "focus": 0.0}
    assert [q["episodes"] for q in signal["off_policy"].pop("endings_by_quarter")] == [2, 0, 0, 0]
    # no memory: returns 0, 0, -100, 33 (a, iteration 1), -100, -100 (b, 1), 0, 0 (b, 4); groups flat, not flat,
    # flat, flat (b's iteration 4 only in its task return: bonuses 0.1 x 1.5 and 0.1 x 1 give the episodes different
    # advantages, so 2 of 4 groups are silent); first quarters: a's iteration 1 and b's 1 (3 of 6 fatal), last
    # quarter: b's iteration 4 (0 of 2)
    assert signal["no_memory"] == {"episodes": 8, "groups": 4, "fatal_share": 3 / 8, "stage_share": 1 / 8,
                                   "flat_group_share": 3 / 4, "silent_group_share": 2 / 4,
                                   "fatal_share_first_quarter": 3 / 6,
                                   "fatal_share_last_quarter": 0.0, "tip_hit_rate": None}
    # a's iteration 2 of 8 is in its first quarter
    assert signal["off_policy"] == {"episodes": 2, "groups": 1, "fatal_share": 0.0, "stage_share": 1.0,
                                    "flat_group_share": 1.0, "silent_group_share": 1.0,
                                    "fatal_share_first_quarter": 0.0,
                                    "fatal_share_last_quarter": None, "tip_hit_rate": 0.75}
    assert signal["on_policy_tips"]["episodes"] == 0 and signal["on_policy_tips"]["fatal_share"] is None


def test_advantage_key_follows_the_novelty_bonus_configuration():
    record = {"extrinsic_return": 33.0, "intrinsic": [1.0, 0.5]}  # bonuses of a new state and a twice-seen one
    advantage = {"coef": 0.1, "combine": "advantage"}
    assert compare.advantage_key(record, {**advantage, "aggregate": "sum"}) == (33.0, 0.15)  # 0.1 x (1 + 0.5)
    assert compare.advantage_key(record, {**advantage, "aggregate": "mean"}) == (33.0, 0.075)  # 0.1 x 1.5 / 2
    assert compare.advantage_key(record, {"coef": 0.1, "combine": "return", "aggregate": "sum"}) == (33.15, 0.0)
    assert compare.advantage_key(record, {}) == (33.0, 0.0)  # GRPO: no bonus
    assert compare.advantage_key({"extrinsic_return": -100.0, "intrinsic": []}, advantage) == (-100.0, 0.0)


def test_arms_are_compared_with_grpo_on_the_seeds_both_have_finished(tmp_path):
    import json

    def run(arm, seed, final):  # one iteration, validated at its end; iteration 0 = base_s<seed>
        folder = tmp_path / "runs" / f"{arm}_s{seed}"
        (folder / "episodes").mkdir(parents=True)
        (folder / "config.yaml").write_text("train:\n  iterations: 1\n")
        (folder / "done.json").write_text('{"wall_seconds": 1.0}')
        (folder / "metrics.jsonl").write_text(json.dumps({"iteration": 1, "mode": "no_memory", "return_mean": 0.0,
                                                          "val_return_mean": final, "tips_retrieved": 0.0}) + "\n")

    for seed in (0, 1, 2):
        (tmp_path / "runs" / f"base_s{seed}").mkdir(parents=True)
        (tmp_path / "runs" / f"base_s{seed}" / "eval.json").write_text('{"return_mean": 0.0}')
    for seed, final in ((0, -10.0), (1, -20.0), (2, 90.0)):  # grpo's seed 2 has no empo2 partner yet
        run("grpo", seed, final)
    run("empo2", 0, -4.0)
    run("empo2", 1, -12.0)
    versus = compare.summarise(tmp_path, [0, 1, 2])["versus_grpo"]["empo2"]
    assert versus["seeds"] == [0, 1]
    assert versus["final"]["difference"] == 7.0  # mean(-4, -12) - mean(-10, -20), not - mean(-10, -20, 90)
    assert versus["auc"]["difference"] == 3.5  # area of 0 -> final over one iteration: final / 2
    assert compare.on_seeds({"seeds": [3, 1], "final": [30.0, 10.0]}, "final", [1, 3]) == [10.0, 30.0]


def test_update_statistics_average_each_modes_iterations_over_runs():
    row = lambda mode, clip, masked, kl, grad, ent: {"mode": mode, "clip_frac": clip, "masked_frac": masked,  # noqa
                                                     "approx_kl": kl, "grad_norm": grad, "entropy": ent}
    run_a = [row("no_memory", 0.0, 0.0, 0.0, 0.2, 3.0), row("off_policy", 0.25, 0.5, 0.3, 0.1, 3.5)]
    run_b = [row("no_memory", 0.0, 0.0, 0.0, 0.4, 2.0), row("off_policy", 0.0, 0.1, 0.1, 0.05, 2.5),
             row("no_memory", 0.0, 0.0, 0.0, 0.3, 1.0)]
    run_b[1].update(pos_adv_clip_frac=0.5, pos_adv_masked_frac=0.25)  # logged by newer runs only
    stats = compare.update_statistics(run_a + run_b)
    new = {"pos_adv_clip_frac": None, "pos_adv_masked_frac": None}
    assert stats["no_memory"] == {"iterations": 3, "clip_frac": 0.0, "masked_frac": 0.0, "approx_kl": 0.0,
                                  "grad_norm": pytest.approx(0.3), "entropy": pytest.approx(2.0), **new}
    assert stats["off_policy"] == {"iterations": 2, "clip_frac": 0.125, "masked_frac": pytest.approx(0.3),
                                   "approx_kl": pytest.approx(0.2), "grad_norm": pytest.approx(0.075),
                                   "entropy": pytest.approx(3.0), "pos_adv_clip_frac": 0.5,
                                   "pos_adv_masked_frac": 0.25}
    assert stats["on_policy_tips"] == {"iterations": 0, "clip_frac": None, "masked_frac": None, "approx_kl": None,
                                       "grad_norm": None, "entropy": None, **new}


def test_movement_is_each_seeds_change_from_its_own_untrained_return():
    # seeds' untrained returns -40, -20, -30; at iteration 5 each gained 10, 12, 8: mean 10, s.e. 2 / sqrt(3)
    # (the differences' std with ddof 1 is 2), far beyond 2 s.e.; at 10: -40 -> -10, -20 -> -50, -30 -> -30: mean 0
    moved = compare.movement({"0": [-40.0, -20.0, -30.0], "5": [-30.0, -8.0, -22.0], "10": [-10.0, -50.0, -30.0]})
    assert set(moved) == {"5", "10"}
    assert moved["5"]["mean"] == pytest.approx(10.0) and moved["5"]["se"] == pytest.approx(2 / math.sqrt(3))
    assert moved["5"]["moved"] is True
    assert moved["10"]["mean"] == pytest.approx(0.0) and moved["10"]["se"] == pytest.approx(math.sqrt(900 / 3))
    assert moved["10"]["moved"] is False
    # unpaired, iteration 5's returns (-30, -8, -22) against iteration 0's (-40, -20, -30) would be +10 ± 8.6 (Welch's
    # s.e.): not moved. Pairing by seed is what makes it move.
    assert compare.movement({"0": [-5.0], "5": [50.0]})["5"]["moved"] is False  # one seed: no standard error


def test_the_difficulty1_setting_differs_from_the_first_only_in_the_stage_order():
    first, second = compare.SETTINGS["difficulty2"], compare.SETTINGS["difficulty1"]
    assert len(first) == len(second)
    changed = [(a, b) for a, b in zip(first, second) if a != b]
    assert changed == [("--env.sanity.difficulty=2", "--env.sanity.difficulty=1")]


def test_an_output_folder_keeps_the_setting_of_its_runs(tmp_path):
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    compare.check_setting(fresh, "difficulty1")
    assert json.loads((fresh / "setting.json").read_text())["setting"] == "difficulty1"
    compare.check_setting(fresh, "difficulty1")  # the same setting again: fine
    with pytest.raises(SystemExit, match="holds runs of setting 'difficulty1'"):
        compare.check_setting(fresh, "difficulty2")
    older = tmp_path / "older"  # runs made before setting.json existed are the first setting's
    (older / "runs").mkdir(parents=True)
    with pytest.raises(SystemExit, match="holds runs of setting 'difficulty2'"):
        compare.check_setting(older, "difficulty1")
    compare.check_setting(older, "difficulty2")
    assert json.loads((older / "setting.json").read_text())["setting"] == "difficulty2"


def test_the_warmup_setting_is_the_second_plus_a_warmup_that_every_run_of_its_seed_waits_for(tmp_path, monkeypatch):
    assert compare.SETTINGS["difficulty1_warmup"] == compare.SETTINGS["difficulty1"]
    assert compare.WARMUPS["difficulty1_warmup"] == ["--family=garden", "--epochs=3", "--lr=3e-4"]
    monkeypatch.setattr(compare, "WARMUP", ["--family=garden", "--epochs=0"])  # tools/warmup.py refuses 0 epochs
    monkeypatch.setattr(compare, "SETTING_NAME", "difficulty1_warmup")
    monkeypatch.setattr(compare, "SETTING", compare.SETTINGS["difficulty1_warmup"])
    monkeypatch.setitem(compare.SIGNALS, "received", 0)
    (tmp_path / "runs" / "warmup_s1").mkdir(parents=True)
    (tmp_path / "runs" / "warmup_s1" / "warmup.json").write_text("{}")
    assert compare.pending_runs(tmp_path, [0, 1], ["grpo"]) == [("warmup", 0), ("base", 0), ("grpo", 0),
                                                                ("base", 1), ("grpo", 1)]
    assert compare.start_from(tmp_path, 1) == [f"--model.init_adapter={tmp_path / 'runs' / 'warmup_s1'}"]
    # A real tools/warmup.py that fails (a config error, before any model loads): no other run of its seed starts.
    failures = compare.run_grid(tmp_path, [0], ["grpo"], 2, [])
    assert failures[0].startswith("the warm-up of seed 0 failed")
    assert sorted(failures[1:]) == ["base seed 0 not started: the seed's warm-up did not finish",
                                    "grpo seed 0 not started: the seed's warm-up did not finish"]
    assert "--epochs must be >= 1" in (tmp_path / "runs" / "warmup_s0" / "log.txt").read_text()
    assert not (tmp_path / "runs" / "base_s0").exists() and not (tmp_path / "runs" / "grpo_s0").exists()
    assert "setting `difficulty1_warmup`" in (tmp_path / "summary.md").read_text()
    assert "after its seed's format warm-up" in (tmp_path / "summary.md").read_text()
    monkeypatch.setattr(compare, "WARMUP", [])  # a setting without a warm-up starts from the base model
    assert compare.start_from(tmp_path, 1) == [] and ("warmup", 0) not in compare.pending_runs(tmp_path, [0], [])


CHILD = """
import os, signal, sys, time
received = []
signal.signal(signal.SIGTERM, lambda *_: received.append(time.time()))
open(sys.argv[1], "w").write(str(os.getsid(0)))
start = time.time()
while not received and time.time() < start + 30:  # a test that failed before signalling leaves no process behind
    time.sleep(0.05)
time.sleep(2.0)  # run_command polls every 0.5 s: a signal passed on more than once would arrive now
sys.exit(10 + len(received))
"""


def test_run_command_passes_each_signal_on_once_to_a_run_in_its_own_session(tmp_path, monkeypatch):
    """`python -m tools.compare run` stopped by Ctrl-C / SIGTERM: each signal reaches every running run exactly once (train.py
    checkpoints on the first and stops at once on a second), and only through tools/compare.py (own session)."""
    monkeypatch.setitem(compare.SIGNALS, "received", 0)
    ready, result = tmp_path / "ready", {}
    worker = threading.Thread(target=lambda: result.update(
        out=compare.run_command([sys.executable, "-c", CHILD, str(ready)], tmp_path / "log.txt")), daemon=True)
    worker.start()
    deadline = time.time() + 60
    while not (ready.exists() and ready.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    assert int(ready.read_text()) != os.getsid(0)  # a terminal's Ctrl-C does not reach it directly
    compare.SIGNALS["received"] = 1  # what stop_on_signals' handler does
    worker.join(timeout=60)
    code, wall = result["out"]
    assert code == 11  # exactly one SIGTERM
    assert wall >= 2.0
    assert "$ -c" in (tmp_path / "log.txt").read_text()  # the command is logged before the output


def test_after_a_signal_the_grid_starts_no_run(tmp_path, monkeypatch):
    monkeypatch.setitem(compare.SIGNALS, "received", 1)
    assert compare.run_grid(tmp_path, [0, 1], ["grpo", "empo2"], 2, []) == []
    assert not (tmp_path / "runs").exists()


def test_command_use_agrees_with_the_environments_action_correction():
    """Own command / no word in common, by hand and checked against what the real sanity environment does with each
    output: an own command runs uncorrected, an output without a listed word runs the first listed command."""
    import re

    from envs.sanity import SanityConfig, SanityEnv

    env = SanityEnv(SanityConfig(difficulty=1, num_distractors=1, max_steps=4))
    observation = env.reset(env.tasks("train")[0])
    commands = re.search(r"Available commands: (.*?)\.\n", observation).group(1).split(", ")
    outputs = [f'"{commands[2].capitalize()}."',  # quoted, capitalised, a full stop: still the command itself
               "I'm ready to help.",             # no word of any command
               f"maybe {commands[1].split()[-1]}",  # one word of a command, not the command
               "Ima nezh obmihi"]                # no word of any command
    own, no_word = [True, False, False, False], [False, True, False, True]
    observations = []
    for output, is_own, has_no_word in zip(outputs, own, no_word):
        observations.append(observation)
        observation, _, done, info = env.step(output)
        assert info["corrected"] != is_own
        assert not has_no_word or info["action"] == commands[0]  # best_match's tie rule
        if done:
            break
    played = len(observations)
    record = {"observations": observations, "actions": outputs[:played]}
    use = compare.command_use([record, {"observations": ["no command list here"], "actions": ["x"]}])
    assert played >= 2 and use["steps"] == played
    assert use["own"] == sum(own[:played]) / played and use["no_word"] == sum(no_word[:played]) / played


def test_the_validation_success_rate_is_summarised_per_iteration_with_iteration_0_from_the_base_run(tmp_path):
    for seed, base, val in ((0, 0.25, (0.5, 0.0)), (1, 0.0, (0.25, 0.25))):
        (tmp_path / "runs" / f"base_s{seed}").mkdir(parents=True)
        (tmp_path / "runs" / f"base_s{seed}" / "eval.json").write_text(
            json.dumps({"return_mean": 0.0, "success_rate": base}))
        run = tmp_path / "runs" / f"grpo_s{seed}"
        (run / "episodes").mkdir(parents=True)
        (run / "config.yaml").write_text("train:\n  iterations: 10\n")
        (run / "done.json").write_text('{"wall_seconds": 1.0}')
        (run / "metrics.jsonl").write_text("".join(
            json.dumps({"iteration": it, "mode": "no_memory", "return_mean": 0.0, "tips_retrieved": 0.0,
                        "val_return_mean": 0.0, "val_success_rate": s}) + "\n" for it, s in zip((5, 10), val)))
    summary = compare.summarise(tmp_path, [0, 1])
    assert summary["arms"]["grpo"]["val_success"] == {"0": [0.25, 0.0], "5": [0.5, 0.25], "10": [0.0, 0.25]}
    table = compare.summary_markdown(summary)
    # iteration 5: mean 37.5 %, s.e. = std(0.5, 0.25, ddof 1) / sqrt(2) = 0.1768 / 1.414 = 12.5 %
    assert "| 5 | 37.5 ± 12.5 % |" in table and "| 0 | 12.5 ± 12.5 % |" in table


def test_episode_endings_count_success_fatal_partial_and_focus_by_hand():
    record = lambda ret, success, actions: {"extrinsic_return": ret, "success": success, "actions": actions}  # noqa
    records = [record(100.0, True, ["connect the red wire", "press the red button", "Focus on the red lamp."]),
               record(-100.0, False, ["focus on the blue lamp"]),            # fatal, and it wrote a focus
               record(66.0, False, ["connect the red wire", "press the red button", "look around", "look around"]),
               record(0.0, False, ["look around"] * 4),                       # nothing: neither partial nor fatal
               {"actions": ["focus on the red lamp"]}]                        # no task return: not counted
    endings = compare.episode_endings(records)
    assert endings == {"episodes": 4, "success": 0.25, "fatal": 0.25, "partial": 0.25, "focus": 0.5}
    assert compare.episode_endings([])["episodes"] == 0


def test_sign_flip_p_and_holm_by_hand():
    # d = (1, 2, 3): of the 8 sign assignments only +++ and --- reach |mean| 2: p = 2/8
    assert compare.sign_flip_p([1, 2, 3]) == 0.25
    assert compare.sign_flip_p([1, -1]) == 1.0  # mean 0: every assignment is as extreme
    # Holm: sorted 0.01, 0.02, 0.04 -> 3 x 0.01, 2 x 0.02, 1 x 0.04 = 0.03, 0.04, 0.04; returned in input order
    assert compare.holm([0.04, 0.01, 0.02]) == pytest.approx([0.04, 0.03, 0.04])
    assert compare.holm([0.5, 0.01, 0.6]) == pytest.approx([1.0, 0.03, 1.0])  # capped at 1, then monotone
    assert compare.paired_bootstrap_ci([0.25, 0.25, 0.25]) == (0.25, 0.25)


def test_the_switch_setting_warms_up_as_the_pilot_did(tmp_path, monkeypatch):
    """The registered warm-up of each seed is the pilot's (results/pilot_switch/warmup_tips6_s100) but for the seed:
    its arguments replace the setting's, whose lab arguments (switch, success reward, 8 variations) it never had."""
    pilot = (compare.ROOT / "results/pilot_switch/warmup_tips6_s100/command.txt").read_text().splitlines()[-1].split()
    monkeypatch.setattr(compare, "SETTING_NAME", "switch_oracle")
    monkeypatch.setattr(compare, "SETTING", compare.SETTINGS["switch_oracle"])
    monkeypatch.setattr(compare, "WARMUP", compare.WARMUPS["switch_oracle"])
    monkeypatch.setattr(compare, "run_command", lambda cmd, log: (1, 0.0))  # records the command, runs nothing
    with pytest.raises(compare.RunFailed):
        compare.warmup_run(tmp_path, 100, [])
    ours = (tmp_path / "runs" / "warmup_s100" / "command.txt").read_text().split()
    # the same arguments (none repeated, so their order does not matter), another output folder
    assert sorted(ours[:-1]) == sorted(pilot[1:-1]) and len(set(ours)) == len(ours)
    assert ours[-1] == f"--output={tmp_path / 'runs' / 'warmup_s100'}"
    assert compare.validation_episodes_per_task() == 8


def write_switch_run(tmp_path, arm, seed, episodes, val_success):
    """A finished run of the switch setting: `episodes` = [(iteration, mode, group, success)], one record each."""
    run = tmp_path / "runs" / f"{arm}_s{seed}"
    (run / "episodes").mkdir(parents=True)
    (run / "config.yaml").write_text("train:\n  iterations: 40\n")
    (run / "done.json").write_text('{"wall_seconds": 60.0}')
    (run / "metrics.jsonl").write_text("".join(
        json.dumps({"iteration": it, "mode": "no_memory", "return_mean": 100 * v, "tips_retrieved": 0.0,
                    "val_return_mean": 100 * v, "val_success_rate": v}) + "\n" for it, v in val_success.items()))
    by_it = {}
    for it, mode, group, success in episodes:
        by_it.setdefault(it, []).append({"mode": mode, "group": group, "success": success,
                                         "extrinsic_return": 100.0 * success, "actions": [], "observations": [],
                                         "intrinsic": []})
    for it, records in by_it.items():
        (run / "episodes" / f"iter_{it:06d}_rank0.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_switch_analysis_pairs_seeds_and_checks_validity_by_hand(tmp_path, monkeypatch):
    monkeypatch.setattr(compare, "SETTING_NAME", "switch_oracle")
    monkeypatch.setattr(compare, "SETTING", compare.SETTINGS["switch_oracle"])
    final = {"grpo": (0.0, 0.0, 0.125), "empo2_oracle": (0.5, 0.25, 0.375)}  # per seed 0, 1, 2
    for seed in range(3):
        (tmp_path / "runs" / f"base_s{seed}").mkdir(parents=True)
        (tmp_path / "runs" / f"base_s{seed}" / "eval.json").write_text('{"return_mean": 0.0, "success_rate": 0.0}')
        # GRPO: 10 groups of 2, all equal but one (90 %): passes >= 85 %
        write_switch_run(tmp_path, "grpo", seed, [(it, "no_memory", g, it == 1 and g == 0 and k == 0)
                                                   for it in range(1, 6) for g in range(2) for k in range(2)],
                         {10: 0.0, 40: final["grpo"][seed]})
        # oracle: iteration 3 off-policy (2 groups: one mixed), 2 of its 4 episodes succeed; iterations 1 and 9
        # tip-free (1 of 4 successes at iteration 1, which lies within 5 of 3; 9 does not and is not counted)
        write_switch_run(tmp_path, "empo2_oracle", seed,
                         [(3, "off_policy", 0, True), (3, "off_policy", 0, False), (3, "off_policy", 1, True),
                          (3, "off_policy", 1, True), (1, "no_memory", 0, True), (1, "no_memory", 0, False),
                          (1, "no_memory", 1, False), (1, "no_memory", 1, False), (9, "no_memory", 0, True),
                          (9, "no_memory", 0, True)], {10: 0.25, 40: final["empo2_oracle"][seed]})
    summary = compare.summarise(tmp_path, [0, 1, 2])
    (row,) = summary["contrasts"]["final_success"]
    assert (row["arm"], row["other"], row["differences"]) == ("empo2_oracle", "grpo", [0.5, 0.25, 0.25])
    assert row["difference"] == pytest.approx(1 / 3) and row["sign_flip_p"] == 0.25 and row["holm_p"] == 0.25
    # AUC over iterations 0, 10, 40: seed 0 oracle = (0 + 0.25) / 2 * 10 + (0.25 + 0.5) / 2 * 30 = 12.5, / 40
    assert summary["arms"]["empo2_oracle"]["auc_success"][0] == pytest.approx(12.5 / 40)
    checks = summary["validity"]
    assert checks["grpo_stalls"]["all_equal_groups"] == pytest.approx(0.9)
    assert checks["grpo_stalls"]["final_success"] == pytest.approx(0.125 / 3) and checks["grpo_stalls"]["passed"]
    memory = checks["memory_finds"]
    assert (memory["memory_success"], memory["tip_free_success"], memory["ratio"]) == (0.75, 0.25, 3.0)
    assert not memory["passed"]  # 3x < 4x
    assert checks["off_policy_signal"]["mixed_groups"] == 0.5 and checks["off_policy_signal"]["passed"]
    table = compare.summary_markdown(summary)
    assert "| final_success | empo2_oracle − grpo | 3 | +33.3 pp |" in table and "(3.0x): **FAIL**" in table
    assert "registered in docs/LOG.md" in table and "(8 episodes each" in table
    assert table.index("## Registered analysis") < table.index("## Diagnostics") < table.index("final validation return")
    compare.plot(tmp_path, summary)
    assert (tmp_path / "compare.png").stat().st_size > 0


def test_iteration_cost_is_the_median_per_mode_weighted_by_how_often_each_mode_ran():
    rows = [{"mode": "no_memory", "time_rollout": t, "time_tips": 0.0, "time_update": 10.0} for t in (10, 20, 900)]
    rows += [{"mode": "off_policy", "time_rollout": 20.0, "time_tips": 1.0, "time_update": 9.0}]
    rows += [{"mode": "no_memory", "iteration": 0}]  # an untimed record (iteration 0's validation) counts nowhere
    cost = compare.iteration_seconds(rows)
    # no memory: 20, 30, 910 -> median 30 (the paused 910 does not move it); off-policy 30; weighted (3*30 + 30) / 4
    assert cost["median"] == {"no_memory": 30.0, "on_policy_tips": None, "off_policy": 30.0}
    assert cost["iterations"] == {"no_memory": 3, "on_policy_tips": 0, "off_policy": 1}
    assert cost["weighted_vs_no_memory"] == pytest.approx(1.0)
    rows[3]["time_update"] = 49.0  # off-policy 70 s: (3 * 30 + 70) / 4 / 30 = 160 / 120
    assert compare.iteration_seconds(rows)["weighted_vs_no_memory"] == pytest.approx(4 / 3)
