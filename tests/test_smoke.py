"""The smoke mode (tools/smoke.py, `python -m tools.bench --smoke`) at its CPU size: the model folder it writes from nothing
loads through the real code path as a Qwen2.5 folder would, and its checks (a)-(d) pass on CPU; tools/bench.py's
decode floor and FLOP counts against hand arithmetic; a bad --device is one line."""
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from tools import bench
from tools import smoke
from config import ModelConfig
from infra.models import load_policy
from rollout import ChatStream

from chat_reference import render_episode

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return smoke.write_model(tmp_path_factory.mktemp("smoke") / "model", "tiny")


@pytest.mark.slow
def test_the_folder_is_a_qwen25_shaped_model_with_qwen_chat_tokens(folder):
    model, tokenizer = load_policy(ModelConfig(name_or_path=folder, lora_rank=4))
    assert "Qwen2" not in type(tokenizer).__name__  # the generic fast class, not Qwen2Tokenizer (infra.models.load_tokenizer)
    assert tokenizer.convert_tokens_to_ids(["<|endoftext|>", "<|im_start|>", "<|im_end|>"]) == [151643, 151644, 151645]
    assert model.config.vocab_size == 151936 and model.config.model_type == "qwen2"
    assert set(model.generation_config.eos_token_id) == {151645, 151643}
    chat = ChatStream(tokenizer)
    text = "You see a red lamp and a red wire."
    assert chat.first_turn(text) == render_episode(tokenizer, [text], [])[0]  # the chat template, independently
    rendered = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    assert len(chat.first_turn(text)) < len(rendered) / 3  # trained on the sanity text: words, not bytes
    # Ids the tokenizer never produces have logit 0, far below the real tokens: sampled text is made of words.
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([chat.first_turn(text)])).logits[0, -1]
    assert logits[10_000:151_000].abs().max() == 0 and logits[:500].max() > 8


@pytest.fixture
def one_thread():
    """One torch thread: tiny matmuls on 2 shared cores run ~10x slower with two (docs/performance.md)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.mark.slow
def test_the_smoke_checks_pass_on_cpu(folder, tmp_path, one_thread):
    results = smoke.run_checks(folder, "cpu", tmp_path)
    assert results["left_padding"]["max_logp_delta"] <= 1e-4 and results["left_padding"]["max_key_delta"] <= 1e-5
    assert results["kv_reuse"]["identical"] == results["kv_reuse"]["episodes"] == 8
    assert results["recorded_logprobs"]["max_delta"] <= 1e-4 and results["recorded_logprobs"]["tokens"] > 50
    training = results["training"]
    assert training["iterations"] == [1, 2, 3] and training["resumed_at_3"] and set(training["modes"]) == {"no_memory", "off_policy",
                                                                             "on_policy_tips"}
    assert (tmp_path / "train" / "checkpoints" / "iter_000003").is_dir()  # the resumed run saved its iteration
    assert all(r["ok"] for name, r in results.items() if "_bf16" not in name)
    for name in ("left_padding_bf16_fp32_head", "kv_reuse_bf16_fp32_head", "recorded_logprobs_bf16_fp32_head",
                 "recorded_logprobs_bf16"):
        assert name in results and "ok" not in results[name]  # reported, not judged
    assert results["recorded_logprobs_bf16_fp32_head"]["max_delta"] < 0.2


def test_judge_fails_what_it_should():
    assert not smoke.judge("kv_reuse", {"episodes": 8, "identical": 7})
    assert not smoke.judge("left_padding", {"max_logp_delta": 0.01, "argmax_agree": 3, "rows": 3})
    good = {"iterations": [1, 2, 3], "resumed_at_3": True, "modes": ["no_memory", "off_policy", "on_policy_tips"], "losses": [0.1] * 3,
            "optimizer_steps": [1, 1, 1], "skipped": [0, 0, 0], "grad_norms": [1.0] * 3}
    assert smoke.judge("training", good)
    for change in ({"losses": [0.1, float("nan"), 0.1]}, {"skipped": [0, 1, 0]}, {"modes": ["no_memory"] * 3},
                   {"iterations": [1, 2]}, {"grad_norms": [1.0, 0.0, 1.0]}, {"resumed_at_3": False}):
        assert not smoke.judge("training", {**good, **change}), change


def test_decode_floor_and_flops_match_hand_arithmetic():
    config = smoke.model_config("0.5b")
    # Qwen2.5-0.5B: 24 layers x (q/o 896^2 + k/v 896 x 128 + MLP 3 x 896 x 4864) = 357.9 M decoder weights.
    per_layer = 2 * 896 * 896 + 2 * 896 * 128 + 3 * 896 * 4864
    assert bench.forward_flops(config, 1, 1) == 24 * (2 * per_layer + 2 * 896)
    assert bench.forward_flops(config, 2, 100) == 24 * (2 * per_layer * 200 + 2 * 100 * 100 * 896 * 2)
    tiny = smoke.random_model(smoke.model_config("tiny", tie=False), dtype=torch.bfloat16)
    weights = sum(p.numel() for p in tiny.parameters()) * 2 - 151936 * 64 * 2  # bf16, the embedding is not read
    kv = 2 * 2 * 2 * 16 * 2 * 4 * (100 + 8 / 2)  # K+V x layers x kv heads x head dim x bf16 x rows x mean context
    assert bench.decode_floor_ms(tiny, 4, 100, 8, 1.0) == pytest.approx(1000 * (weights + kv) / 1e9)


def test_a_bad_device_is_one_line():
    proc = subprocess.run([sys.executable, "-m", "tools.bench", "--smoke", "--device", "gpu"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "error: --device=gpu is not a torch device (cpu, cuda, cuda:1, ...)", proc.stderr
