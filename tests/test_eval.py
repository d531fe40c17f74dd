"""Evaluation protocol (eval.py): seeded cases give the same per-case episodes at any batch size and any number of
processes; case files; the Table 1 / Table 2 layouts with hand-computed statistics. A tiny random Qwen2 on the
sanity environment keeps every run to seconds."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from config import ConfigError, load_config
from conftest import clean_env, free_port
from envs.base import Task
from eval import (Case, configured_cases, make_cases, markdown_table, output_folder, read_cases, standard_error,
                  summary, write_cases)

ROOT = Path(__file__).resolve().parents[1]
SANITY = str(ROOT / "configs" / "sanity_empo2.yaml")


def test_cases_files_and_their_errors(tmp_path):
    cases = make_cases([Task("lab", 3), Task("lab", 5)], 2, seed=7)
    assert [(c.task.variation, c.repeat) for c in cases] == [(3, 0), (3, 1), (5, 0), (5, 1)]
    assert len({c.seed for c in cases}) == 4 and make_cases([Task("lab", 3)], 1, seed=7)[0] == cases[0]
    write_cases(tmp_path / "cases.jsonl", cases)
    assert read_cases(tmp_path / "cases.jsonl") == cases
    (tmp_path / "bad.jsonl").write_text('{"task": "lab", "variation": 1}\n')
    with pytest.raises(ConfigError, match="bad.jsonl:1"):
        read_cases(tmp_path / "bad.jsonl")
    (tmp_path / "twice.jsonl").write_text("\n".join([(tmp_path / "cases.jsonl").read_text().splitlines()[0]] * 2))
    with pytest.raises(ConfigError, match="appears twice"):
        read_cases(tmp_path / "twice.jsonl")


def test_statistics_and_tables_by_hand():
    rows = [{"return": r, "success": s, "length": 5, "truncated": t}
            for r, s, t in [(100.0, True, ""), (20.0, False, "steps"), (-40.0, False, ""), (0.0, False, "")]]
    stats = summary(rows)
    # mean 20; sample std = sqrt(((80^2) + 0 + 60^2 + 20^2) / 3) = sqrt(3466.67) = 58.88; s.e. = 58.88 / 2 = 29.44
    assert stats["return_mean"] == 20.0 and stats["return_se"] == pytest.approx(29.439, abs=1e-3)
    assert stats["success_rate"] == 0.25 and stats["success_se"] == pytest.approx(0.25)  # sqrt(0.25 / 4)
    assert stats["truncation_rate"] == 0.25 and stats["episodes"] == 4
    result = {**stats, "per_task": {"power-component": stats}}
    table = markdown_table(result, "t")
    assert "| power-component | 4 | 20.0 ± 29.4 | 0.25 | 5.0 | 0.25 |" in table and "**Average**" in table
    # WebShop's Score is the purchase's 100 x task reward, not the return (which subtracts invalid-action penalties)
    shop_rows = [{**row, "score": score, "return": score - 0.1 * k} for k, (row, score)
                 in enumerate(zip(rows, [100.0, 50.0, 0.0, 10.0]))]
    shop = summary(shop_rows)  # scores: mean 40; sample std = sqrt((60^2 + 10^2 + 40^2 + 30^2) / 3) = 45.46; s.e. 22.73
    assert shop["score_mean"] == 40.0 and shop["score_se"] == pytest.approx(22.730, abs=1e-3)
    assert shop["return_mean"] == pytest.approx(40.0 - 0.15)
    webshop = markdown_table(shop, "t", "webshop")
    assert "| Score | 40.0 ± 22.7 |" in webshop and "| Succ. (%) | 25.0 ± 25.0 |" in webshop


def test_the_standard_error_is_over_test_items_when_they_repeat():
    """4 repeats of one variation are not 4 independent samples: the s.e. is over the variations' means."""
    rows = [{"task": f"t/{v}", "return": r, "success": False, "length": 1, "truncated": ""}
            for v, returns in [(0, [10.0, 30.0]), (1, [50.0, 70.0])] for r in returns]
    # variation means 20 and 60: sample std 28.28, s.e. 28.28 / sqrt(2) = 20 (over 4 episodes it would be 12.91)
    assert summary(rows)["return_se"] == pytest.approx(20.0) and summary(rows)["return_mean"] == 40.0
    assert summary(rows)["return_std"] == pytest.approx(25.820, abs=1e-3)  # over episodes, ddof 1
    assert standard_error([10.0, 30.0, 50.0, 70.0]) == pytest.approx(12.910, abs=1e-3)


def test_case_lists_keep_the_configured_tasks_and_evaluations_never_write_into_a_checkpoint(tmp_path):
    cases = make_cases([Task("boil", 0), Task("melt", 1), Task("melt", 2)], 2, seed=3)
    assert [c.task for c in configured_cases(cases, [Task("melt", 9)], "f")] == [Task("melt", 1)] * 2 + [
        Task("melt", 2)] * 2
    with pytest.raises(SystemExit, match="no case of the configured tasks"):
        configured_cases(cases, [Task("freeze", 0)], "f")
    assert output_folder("", "runs/a/checkpoints/iter_000200", "runs/ood") == Path("runs/ood/eval_a_iter_000200")
    assert output_folder("", str(tmp_path / "copied"), "runs/ood") == Path("runs/ood/eval_copied")
    assert output_folder("", "", "runs/ood") == Path("runs/ood/eval_base")
    (tmp_path / "state.json").write_text("{}")
    with pytest.raises(SystemExit, match="is a training checkpoint"):
        output_folder(str(tmp_path), "", "runs/x")


@pytest.mark.parametrize("config, committed", [
    ("configs/webshop_empo2.yaml", "webshop_table2.jsonl"),
    ("configs/ood/biology1_to_biology2.yaml", "ood_biology1_to_biology2.jsonl"),
    ("configs/ood/electricity_to_chemistry.yaml", "ood_electricity_to_chemistry.jsonl")])
def test_the_committed_case_lists_are_what_the_configs_write(tmp_path, config, committed):
    """The lists in configs/eval/ are the benchmark: regenerating them from their config gives the same bytes."""
    proc = subprocess.run([sys.executable, "eval.py", "--config", config,
                           f"--write_cases={tmp_path / 'cases.jsonl'}"], cwd=ROOT, env=clean_env(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "cases.jsonl").read_text() == (ROOT / "configs" / "eval" / committed).read_text()


def eval_run(tmp_path, model_folder, name, *extra, processes=1, env=None):
    out = tmp_path / name
    launcher = [sys.executable] if processes == 1 else [
        sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={processes}", f"--master_port={free_port()}"]
    cmd = launcher + ["eval.py", "--config", SANITY, f"--model.name_or_path={model_folder}", f"--output={out}",
                      "--env.sanity.test_variations=3", "--episodes_per_task=2", "--train.torch_threads=1",
                      "--rollout.max_action_tokens=6", *extra]
    proc = subprocess.run(cmd, cwd=ROOT, env={**clean_env(), **(env or {})}, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads((out / "eval.json").read_text())
    return result, (out / "eval.md").read_text()


@pytest.fixture(scope="module")
def plain(tmp_path_factory, tiny_folder):
    """The sanity config's evaluation of the tiny model, its 6 cases in one generation batch: the episodes other
    routes (a case file at other batch sizes, --ood's step 0, a hub id) must reproduce."""
    return eval_run(tmp_path_factory.mktemp("eval"), tiny_folder, "plain")


@pytest.mark.slow
def test_the_same_cases_give_the_same_episodes_at_any_batch_size_and_process_count(tmp_path, tiny_folder, plain):
    """6 cases (3 test variations x 2 repeats), sampled at temperature 0.4: the cases written to a file and played
    by one process with 1 environment and generation batch 1 and by 2 processes (cases sharded and gathered), and
    the config's own cases played in one batch of 6, give the same actions and per-case results; the tables are
    identical."""
    written = subprocess.run([sys.executable, "eval.py", "--config", SANITY, "--env.sanity.test_variations=3",
                              "--episodes_per_task=2", f"--write_cases={tmp_path / 'cases.jsonl'}"],
                             cwd=ROOT, env=clean_env(), capture_output=True, text=True, timeout=120)
    assert written.returncode == 0 and "wrote 6 cases" in written.stdout, written.stderr[-2000:]
    one, table_one = eval_run(tmp_path, tiny_folder, "b1", "--rollout.tasks_per_iteration=1",
                              "--rollout.group_size=1", "--rollout.generation_batch_size=1",
                              f"--cases={tmp_path / 'cases.jsonl'}")
    six, table_six = plain  # the same cases from the config, all 6 in one batch
    two, table_two = eval_run(tmp_path, tiny_folder, "p2", "--rollout.tasks_per_iteration=2",
                              "--rollout.group_size=2", f"--cases={tmp_path / 'cases.jsonl'}", processes=2)
    assert len(one["episode_results"]) == 6 and len({json.dumps(r["actions"]) for r in one["episode_results"]}) > 1
    assert one["episode_results"] == six["episode_results"] == two["episode_results"]
    assert table_one == table_six == table_two
    assert [Case(Task(r["task"].split("/")[0], int(r["task"].split("/")[1])), r["repeat"], r["seed"])
            for r in one["episode_results"]] == read_cases(tmp_path / "cases.jsonl")


@pytest.mark.slow
def test_a_checkpoint_copied_elsewhere_with_its_base_model_moved_still_evaluates(tmp_path, tiny_folder):
    """The adapter names the base model as the run did (not a cache path) and the checkpoint carries the run's
    config: copy both the checkpoint and the base model to another folder and the evaluation is the same."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from train import train

    out = tmp_path / "run"
    train(load_config(SANITY, [f"--model.name_or_path={tiny_folder}", f"--output_dir={out}", "--train.iterations=1",
                               "--rollout.group_size=2", "--env.sanity.max_steps=2", "--rollout.max_action_tokens=6",
                               "--rollout.tip_max_tokens=6", "--train.eval_every=0", "--train.tensorboard=false",
                               "--train.torch_threads=1"]))
    checkpoint = out / "checkpoints" / "iter_000001"
    adapter = json.loads((checkpoint / "model" / "adapter_config.json").read_text())
    assert adapter["base_model_name_or_path"] == tiny_folder
    assert load_config(str(checkpoint / "config.yaml")).model.name_or_path == tiny_folder
    generation = json.loads((checkpoint / "generation.json").read_text())
    assert generation["temperature"] == 1.0 and generation["eval_temperature"] == 0.4 and generation["stop_token_ids"]
    here, _ = eval_run(tmp_path, tiny_folder, "here", f"--checkpoint={checkpoint}")
    base = shutil.copytree(tiny_folder, tmp_path / "elsewhere" / "base")
    moved = shutil.copytree(checkpoint, tmp_path / "elsewhere" / "checkpoint")
    shutil.rmtree(out)
    there, _ = eval_run(tmp_path, base, "there", f"--checkpoint={moved}")
    assert there["episode_results"] == here["episode_results"]
    PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(base), moved / "model")  # plain peft loads it


@pytest.mark.slow
def test_ood_adaptation_is_the_evaluation_then_steps_with_memory_at_any_process_count(tmp_path, tiny_folder,
                                                                                     plain):
    """--ood=2: step 0 is exactly the no-memory evaluation of the same cases; steps 1-2 retrieve the tips written
    after the earlier steps; 1 and 2 processes give the same episodes, memory sizes and tables."""
    plain, _ = plain
    one, table = eval_run(tmp_path, tiny_folder, "ood1", "--ood=2")
    two, table_two = eval_run(tmp_path, tiny_folder, "ood2", "--ood=2", "--rollout.tasks_per_iteration=2",
                              processes=2)
    steps = one["ood"]["steps"]
    assert [s["step"] for s in steps] == [0, 1, 2] and all(s["episodes"] == 6 for s in steps)
    assert [{k: v for k, v in r.items() if k != "tip"} for r in steps[0]["episode_results"]] == plain["episode_results"]
    assert one["return_mean"] == plain["return_mean"] and one["per_task"] == plain["per_task"]
    assert 0 < steps[0]["memory_size"] <= steps[1]["memory_size"] <= steps[2]["memory_size"]
    assert steps[1]["episode_results"] != steps[0]["episode_results"]  # another seed per step, and tips
    assert two["ood"] == one["ood"] and table_two == table
    best = max(steps[1:], key=lambda s: s["return_mean"])
    assert one["ood"]["best_step"] == best["step"]
    assert one["ood"]["best_gain"] == pytest.approx(best["return_mean"] - steps[0]["return_mean"])
    assert "| 0 | no | 6 |" in table and "| 2 | yes | 6 |" in table and "Best step:" in table
    memory = json.loads((tmp_path / "ood1" / "memory.json").read_text())
    assert sum(map(len, memory["entries"].values())) == steps[2]["memory_size"]
    episodes = [json.loads(line) for line in (tmp_path / "ood1" / "episodes" / "ood_step_01.jsonl").read_text()
                .splitlines()]
    assert episodes and any(block for e in episodes for block in e["tips_shown"])  # the viewer sees the tips


@pytest.mark.slow
def test_a_hub_id_resolves_from_the_local_hub_cache(tmp_path, tiny_folder, plain):
    """A user's `--model.name_or_path=Org/Name` loads from the Hugging Face cache (offline here): the same
    episodes as the folder itself."""
    snapshot = tmp_path / "hub" / "models--tiny-org--tiny-qwen2" / "snapshots" / ("0" * 40)
    shutil.copytree(tiny_folder, snapshot)
    (snapshot.parents[1] / "refs").mkdir()
    (snapshot.parents[1] / "refs" / "main").write_text("0" * 40)
    by_folder, _ = plain
    by_id, table = eval_run(tmp_path, "tiny-org/tiny-qwen2", "hub", env={"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert by_id["episode_results"] == by_folder["episode_results"] and by_id["model"] == "tiny-org/tiny-qwen2"


def test_logged_episodes_are_a_capped_seeded_sample_in_order():
    from infra.metrics import sample_for_log

    records = [{"i": i} for i in range(10)]
    three = sample_for_log(records, 3, seed=5)
    assert len(three) == 3 and three == sorted(three, key=lambda r: r["i"]) and three == sample_for_log(records, 3, 5)
    assert sample_for_log(records, 3, seed=6) != three or sample_for_log(records, 3, seed=7) != three
    assert sample_for_log(records, -1, 5) == records and sample_for_log(records, 0, 5) == []
    assert sample_for_log(records, 20, 5) == records
