"""Smoke checks on a randomly initialised Qwen2.5-shaped model: no network, no model files (README, "On a GPU").

    python -m tools.bench --smoke [--size=0.5b|tiny] [--device=cuda|cpu]   (tools/bench.py adds the speed report)

`write_model(folder, size)` writes, from nothing, what a downloaded Qwen2.5-Instruct folder holds: a Qwen2 config of
the chosen shape (`SIZES`: Qwen2.5-0.5B's, Qwen2.5-7B's, or a tiny one for CPU tests; vocabulary 151,936 as Qwen2.5),
random weights stored in bf16 (so an fp32 and a bf16 load start from the same numbers), and a byte-level BPE
tokenizer trained here on the sanity environment's text, with Qwen2.5-Instruct's chat template and its special
tokens at Qwen's ids (<|endoftext|> 151643, <|im_start|> 151644, <|im_end|> 151645). The final norm's gain is set
so that logits spread like a trained model's (std ~4, the top ones ~20; random init gives ~0.5), so that rounding
effects have a realistic size; random signs keep a tied head from reading back the current token's embedding.

`run_checks(folder, device, out_dir)` drives the real code paths (infra.models.load_policy on the folder,
rollout.run_episodes on `env.name: sanity`, train.train) and returns one record per check:
  (a) left padding: a left-padded batched forward (positions from the mask, as engine.generation.prefill) gives each row
      the next-token log-probs of its unpadded forward, and engine.generation.prefill its keys/values;
  (b) KV reuse: greedy episodes are identical with and without `rollout.kv_reuse` in fp32; in bf16 the share of
      identical episodes is reported (near-tied argmaxes may break differently under rounding);
  (c) behaviour log-probs recorded while sampling vs recomputed by a forward (mean / max |delta|), in fp32 and in
      bf16 with and without `model.fp32_lm_head`;
  (d) training: one iteration per mode (a seed whose first three iterations draw all three modes), the third after
      a resume from the second's checkpoint: finite losses, optimiser steps taken, none skipped.
Each record has `ok` (its pass condition; bf16 numbers are reported, not judged) and its numbers.
"""
from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import torch

# Qwen2.5-Instruct's special tokens and chat template (tests/chat_reference.py checks streams against them).
QWEN25_SYSTEM = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant."
QWEN25_SPECIAL = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645}
QWEN25_CHAT_TEMPLATE = """{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""
# Qwen2's pre-tokenizer split (contractions, letters with one leading non-letter, single digits, punctuation runs,
# newlines, spaces), followed by byte-level mapping without its own regex.
QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+"
               r"|\s+(?!\S)|\s+")

QWEN25 = dict(vocab_size=151936, rope_theta=1e6, max_position_embeddings=32768, rms_norm_eps=1e-6,
              use_sliding_window=False, bos_token_id=151643, eos_token_id=151645, pad_token_id=151643)
SIZES = {  # Qwen2.5-0.5B / -7B (their config.json) and a tiny Qwen2 for CPU tests
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, tie_word_embeddings=True),
    "0.5b": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                 num_key_value_heads=2, tie_word_embeddings=True),
    "7b": dict(hidden_size=3584, intermediate_size=18944, num_hidden_layers=28, num_attention_heads=28,
               num_key_value_heads=4, tie_word_embeddings=False),
}
LOGIT_STD = 6.0  # the spread of the real tokens' logits: a top token ~18, sampled with probability ~0.5-0.9
FP32_TOLERANCE = 1e-3  # |delta log-prob| allowed between two fp32 code paths (summation order only)


def qwen_tokenizer(texts: list[str], vocab_size: int):
    """A PreTrainedTokenizerFast trained on `texts` with Qwen2.5-Instruct's special tokens (at their ids), split and
    chat template; the ids between the trained vocabulary and 151643 are unreachable fillers."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    def pipeline(model):
        tok = Tokenizer(model)
        tok.normalizer = normalizers.NFC()
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(QWEN2_SPLIT), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
        tok.decoder = decoders.ByteLevel()
        return tok

    trained = pipeline(models.BPE())
    trained.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    learned = json.loads(trained.to_str())["model"]
    vocab = dict(learned["vocab"])
    vocab.update({f"<|filler_{i}|>": i for i in range(len(vocab), min(QWEN25_SPECIAL.values()))})
    vocab.update(QWEN25_SPECIAL)
    merges = [tuple(m.split(" ", 1)) if isinstance(m, str) else tuple(m) for m in learned["merges"]]
    backend = pipeline(models.BPE(vocab, merges))
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in QWEN25_SPECIAL])
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                        chat_template=QWEN25_CHAT_TEMPLATE, padding_side="left",
                                        model_input_names=["input_ids", "attention_mask"])
    ids = tokenizer.convert_tokens_to_ids(list(QWEN25_SPECIAL))
    assert ids == list(QWEN25_SPECIAL.values()) and tokenizer.eos_token_id == 151645, ids
    return tokenizer


def sanity_texts() -> list[str]:
    """What the smoke runs will say: every sanity-env first message and the observations along its gold path."""
    from envs.sanity import SanityConfig, SanityEnv
    from rollout import TIP_PROMPT

    texts = [QWEN25_SYSTEM, TIP_PROMPT]
    env = SanityEnv(SanityConfig(families=["lab"], train_variations=8, test_variations=2))
    for task in env.tasks("train") + env.tasks("test"):
        texts.append(env.reset(task))
        for action in env.gold_actions(task):
            texts += [action, env.step(action)[0]]
    return texts


def model_config(size: str, tie: bool | None = None):
    """The Qwen2Config of a size in SIZES; tie: override tie_word_embeddings (None: as the size has it)."""
    from transformers import Qwen2Config

    if size not in SIZES:
        raise ValueError(f"unknown smoke model size {size!r}; one of {sorted(SIZES)}")
    shape = dict(SIZES[size], **({} if tie is None else {"tie_word_embeddings": tie}))
    return Qwen2Config(**QWEN25, **shape)


def random_model(config, seed: int = 0, dtype=torch.bfloat16, device="cpu"):
    """A randomly initialised Qwen2ForCausalLM whose logits spread like a trained model's (see the docstring)."""
    from transformers import Qwen2ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = Qwen2ForCausalLM(config).to(dtype)
    hidden = config.hidden_size
    gain = LOGIT_STD / (config.initializer_range * math.sqrt(hidden))
    signs = torch.randint(0, 2, (hidden,), generator=torch.Generator().manual_seed(seed)) * 2 - 1
    with torch.no_grad():
        model.model.norm.weight.copy_(gain * signs.to(model.model.norm.weight))
    return model


def write_model(folder, size: str = "tiny", seed: int = 0, tie: bool | None = None) -> str:
    """A Qwen2.5-shaped HF folder (config, bf16 random weights, generation config, local tokenizer); returns it."""
    from transformers import GenerationConfig

    folder = Path(folder)
    tokenizer = qwen_tokenizer(sanity_texts(), vocab_size=3000)
    model = random_model(model_config(size, tie), seed)
    # Ids the tokenizer never produces (fillers, Qwen's unused tail) get a zero output row, hence logit 0 against
    # the real tokens' spread of LOGIT_STD: as in a trained model, sampled text is made of real words, so actions
    # differ and a GRPO group's returns differ (the training check needs a non-zero advantage).
    real = sum(not t.startswith("<|filler_") for t in tokenizer.get_vocab()) - len(QWEN25_SPECIAL)  # ids 0..real-1
    with torch.no_grad():
        head = model.get_output_embeddings().weight
        head[real : min(QWEN25_SPECIAL.values())] = 0
        head[max(QWEN25_SPECIAL.values()) + 1 :] = 0
    model.generation_config = GenerationConfig(bos_token_id=151643, eos_token_id=[151645, 151643],
                                               pad_token_id=151643)
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


# ----------------------------------------------------------------------------- the checks


def smoke_config(folder: str, dtype: str, out_dir, **overrides):
    """The config every check runs on: the sanity environment's lab family, short episodes, LoRA."""
    from config import load_config

    args = {"output_dir": str(out_dir), "model.name_or_path": folder, "model.dtype": dtype, "model.lora_rank": 8,
            "model.lora_alpha": 16, "env.name": "sanity", "env.sanity.max_steps": 3, "rollout.tasks_per_iteration": 2,
            "rollout.group_size": 4, "rollout.max_action_tokens": 8, "rollout.max_prompt_tokens": 2048,
            "rollout.tip_max_tokens": 12, "memory.top_k": 2, "train.iterations": 2, "train.save_every": 1,
            "train.eval_every": 0, "train.minibatch_steps": 4, "train.lr": 1e-4, "train.tensorboard": False,
            "train.log_episodes": 0,
            # The WebShop configs' KL term to the base model, with the k1 estimator: its gradient (the score of the
            # sampled tokens) is non-zero even at pi = pi_ref, so every update has a gradient although a random
            # model's episodes in a group often earn equal returns (advantage 0).
            "loss.kl_coef": 0.05, "loss.kl_estimator": "k1", **overrides}
    return load_config(None, [f"--{k}={v}" for k, v in args.items()])


def check_left_padding(model, chat, contexts: list[list[int]], device) -> dict:
    """(a) The batched left-padded forward and engine.generation.prefill vs one unpadded forward per row."""
    from transformers import DynamicCache

    from engine.generation import left_pad, prefill

    ids, mask = left_pad(contexts, chat.pad_id)
    positions = (mask.cumsum(-1) - 1).clamp(min=0)  # as engine.generation.prefill and `generate` number real tokens
    with torch.no_grad():
        batched = model(input_ids=ids.to(device), attention_mask=mask.to(device), position_ids=positions.to(device),
                        logits_to_keep=1).logits[:, -1].float().log_softmax(-1)
        logit_delta, kv_delta, argmax_same = 0.0, 0.0, 0
        for row, (context, cache) in enumerate(zip(contexts, prefill(model, contexts, chat.pad_id))):
            own = DynamicCache()
            alone = model(input_ids=torch.tensor([context], device=device), cache=own, use_cache=True,
                          logits_to_keep=1).logits[0, -1].float().log_softmax(-1)
            logit_delta = max(logit_delta, (alone - batched[row]).abs().max().item())
            argmax_same += int(alone.argmax() == batched[row].argmax())
            for layer, keys in zip(own.layers, cache.keys):  # prefill caches all but the last token
                kv_delta = max(kv_delta, (layer.keys[0, :, :-1] - keys).abs().max().item())
    return {"rows": len(contexts), "lengths": [len(c) for c in contexts], "max_logp_delta": logit_delta,
            "max_key_delta": kv_delta, "argmax_agree": argmax_same}


def play(model, chat, cfg, seeds=None, **rollout):
    from envs import make_env
    from rollout import pair_up, run_episodes

    n = cfg.rollout.tasks_per_iteration * cfg.rollout.group_size
    envs = [make_env(cfg.env) for _ in range(n)]
    train_tasks = envs[0].tasks("train")
    tasks = [train_tasks[i // cfg.rollout.group_size] for i in range(n)]
    plays = pair_up(envs, tasks, [i // cfg.rollout.group_size for i in range(n)], seeds)
    return run_episodes(model, chat, plays, mode="no_memory", memory=None,
                        cfg=dataclasses.replace(cfg.rollout, **rollout))


def check_kv_reuse(model, chat, cfg) -> dict:
    """(b) Greedy episodes with and without KV reuse: the token streams, episode by episode."""
    played = {reuse: play(model, chat, cfg, temperature=0.0, kv_reuse=reuse) for reuse in (True, False)}
    same = sum(a.ids == b.ids for a, b in zip(played[True], played[False]))
    return {"episodes": len(played[True]), "identical": same,
            "actions": sum(ep.num_actions for ep in played[True])}


def check_recorded_logprobs(model, chat, cfg, device) -> dict:
    """(c) Old log-probs recorded while sampling vs a recomputing forward over the same sampled episodes."""
    from losses import compute_old_logprobs
    from samples import build_samples

    episodes = play(model, chat, cfg, seeds=list(range(100, 100 + cfg.rollout.tasks_per_iteration
                                                        * cfg.rollout.group_size)), temperature=1.0, kv_reuse=True)
    advantages = [1.0] * len(episodes)
    recorded = build_samples(episodes, advantages)
    recomputed = build_samples(episodes, advantages)
    for s in recomputed:  # every old log-prob from the forward
        s.old_logp = []
    compute_old_logprobs(model, recomputed, chat.pad_id, device, cfg.train.micro_batch_size)
    pairs = [(a, b) for r, c in zip(recorded, recomputed) for a, b in zip(r.old_logp, c.old_logp)]
    deltas = [abs(a - b) for a, b in pairs]
    return {"tokens": len(deltas), "mean_logp": sum(a for a, _ in pairs) / len(pairs),
            "mean_delta": sum(deltas) / len(deltas), "max_delta": max(deltas)}


def mode_seed(cfg) -> int:
    """The first train.seed whose iterations 1-3 draw no_memory and then the two memory modes in some order."""
    from config import MODES
    from rollout import draw_mode

    for seed in range(10_000):
        modes = [draw_mode(cfg.memory, seed, i) for i in (1, 2, 3)]
        if modes[0] == "no_memory" and sorted(modes) == sorted(MODES):
            return seed
    raise RuntimeError("no seed draws every mode in three iterations")  # unreachable with the paper's probabilities


def check_training(folder: str, dtype: str, out_dir) -> dict:
    """(d) Two iterations, then a resume for the third: one per mode, finite losses, no skipped steps."""
    from train import train

    cfg = smoke_config(folder, dtype, out_dir)
    seed = mode_seed(cfg)
    metrics = Path(out_dir) / "metrics.jsonl"
    train(smoke_config(folder, dtype, out_dir, **{"train.seed": seed}))
    before = metrics.read_text().splitlines()
    train(smoke_config(folder, dtype, out_dir, **{"train.seed": seed, "train.iterations": 3, "resume": "latest"}))
    rows = [json.loads(line) for line in metrics.read_text().splitlines()]
    # A resume continues: iterations 1-2 are not played again (a replay would rewrite their rows, timings included).
    continued = metrics.read_text().splitlines()[:2] == before
    return {"seed": seed, "resumed_at_3": continued, "iterations": [r["iteration"] for r in rows],
            "modes": [r["mode"] for r in rows],
            "losses": [r["loss"] for r in rows], "optimizer_steps": [r["optimizer_steps"] for r in rows],
            "skipped": [r["skipped_updates"] for r in rows], "grad_norms": [r["grad_norm"] for r in rows]}


def judge(name: str, record: dict) -> bool:
    """The pass condition of an fp32 check's record (bf16 records are reported, not judged)."""
    from config import MODES

    if name == "left_padding":
        return record["max_logp_delta"] <= FP32_TOLERANCE and record["argmax_agree"] == record["rows"]
    if name == "kv_reuse":
        return record["identical"] == record["episodes"]
    if name == "recorded_logprobs":
        return record["max_delta"] <= FP32_TOLERANCE
    if name == "training":
        return (record["iterations"] == [1, 2, 3] and record["resumed_at_3"]
                and sorted(record["modes"]) == sorted(MODES)
                and all(math.isfinite(x) for x in record["losses"]) and all(s >= 1 for s in record["optimizer_steps"])
                and not any(record["skipped"]) and all(g > 0 for g in record["grad_norms"]))
    raise KeyError(name)


def run_checks(folder: str, device, out_dir, train_dtype: str = "float32") -> dict:
    """{check name: record} for (a)-(d): fp32 records carry `ok`; `_bf16` (bf16 head) and `_bf16_fp32_head`
    (model.fp32_lm_head) records are the same checks in bf16, reported as measured."""
    from envs import make_env
    from infra.models import load_policy
    from rollout import ChatStream

    device = torch.device(device)
    results: dict[str, dict] = {}
    for dtype, head in (("float32", True), ("bfloat16", True), ("bfloat16", False)):
        cfg = smoke_config(folder, dtype, Path(out_dir) / "checks", **{"model.fp32_lm_head": head})
        model, tokenizer = load_policy(cfg.model, device=device)
        model.eval()
        chat = ChatStream(tokenizer)
        tag = "" if dtype == "float32" else "_bf16_fp32_head" if head else "_bf16"
        if head:  # padding and KV reuse in fp32, and in bf16 as the GPU configs run it
            env = make_env(cfg.env)
            first = [chat.first_turn(env.reset(t)) for t in env.tasks("train")[:3]]
            contexts = [first[0], first[1][: len(first[1]) // 2], first[2][: len(first[2]) // 3]]  # 3 lengths
            results["left_padding" + tag] = check_left_padding(model, chat, contexts, device)
            results["kv_reuse" + tag] = check_kv_reuse(model, chat, cfg)
        results["recorded_logprobs" + tag] = check_recorded_logprobs(model, chat, cfg, device)
        del model
    results["training"] = check_training(folder, train_dtype, Path(out_dir) / "train")
    for name, record in results.items():
        if "_bf16" not in name:
            record["ok"] = judge(name, record)
    return results


# ----------------------------------------------------------------------------- the report


def report(device, size: str = "") -> int:
    """The checks (a)-(d) on a random Qwen2.5-shaped model, then decode / prefill / update speed against this
    machine's ceilings (tools/bench.py's measurements). Returns the exit status (1 when a check failed)."""
    import tempfile

    from tools.bench import clock, copy_bandwidth, machine, matmul_ceiling
    from infra.models import load_policy

    gpu = device.type == "cuda"
    size = size or ("0.5b" if gpu else "tiny")
    start = clock()
    with tempfile.TemporaryDirectory() as tmp:
        folder = write_model(Path(tmp) / "model", size)
        print(f"smoke: {machine(device)}, torch {torch.__version__}; random Qwen2.5-{size}-shaped model")
        results = run_checks(folder, device, Path(tmp) / "runs", "bfloat16" if gpu else "float32")
        for name, record in results.items():
            print(describe(name, record))
        cfg = smoke_config(folder, "bfloat16", Path(tmp) / "runs", **{"model.gradient_checkpointing": gpu})
        model, tokenizer = load_policy(cfg.model, device=device)
        model.eval()
        matmul, bandwidth = matmul_ceiling(torch.bfloat16, device), copy_bandwidth(device)
        print(f"speed (bf16, LoRA, fp32 LM head): matmul {matmul:,.0f} GFLOP/s, copy {bandwidth:,.0f} GB/s")
        speed_lines(model, device, matmul, bandwidth, gpu)
        del model
    failed = [name for name, record in results.items() if record.get("ok") is False]
    if gpu:  # the 7B shape's decode, if it fits: random bf16 weights made on the GPU, nothing saved
        config = model_config("7b")
        torch.cuda.empty_cache()
        if torch.cuda.mem_get_info(device)[0] > 100e9:  # fp32 init 30 GB + bf16 15 GB + KV at 128 x 5k 37 GB
            from infra.models import use_fp32_lm_head

            model = random_model(config, device=device)
            print("7B shape, bf16 head:")
            speed_lines(model, device, matmul, bandwidth, gpu, decode_only=True)
            use_fp32_lm_head(model)  # what model.fp32_lm_head costs at decode
            print("7B shape, fp32 head (model.fp32_lm_head):")
            speed_lines(model, device, matmul, bandwidth, gpu, decode_only=True)
        else:
            print("7B shape: skipped, under 100 GB of free GPU memory")
    print(f"smoke: {'FAILED ' + ', '.join(failed) if failed else 'all checks passed'} in {clock() - start:.0f} s")
    return 1 if failed else 0


def describe(name: str, record: dict) -> str:
    def short(value):
        if isinstance(value, float):
            return f"{value:.3g}"
        return "[" + ", ".join(short(v) for v in value) + "]" if isinstance(value, list) else str(value)

    verdict = "" if "ok" not in record else " -> ok" if record["ok"] else " -> FAILED"
    return f"  {name}: " + ", ".join(f"{k} {short(v)}" for k, v in record.items() if k != "ok") + verdict


def speed_lines(model, device, matmul, bandwidth, gpu: bool, decode_only: bool = False) -> None:
    """Decode ms/step against its bandwidth floor at three batch x context shapes; prefill and update tokens/s
    against the matmul rate; the peak memory of each."""
    from tools.bench import decode_floor_ms, decode_ms, forward_flops, peak_memory_gb, prefill_rate, update_rate

    shapes = [(1, 1024), (16, 4096), (128, 5120)] if gpu else [(1, 128), (4, 256), (8, 512)]
    steps = 32 if gpu else 8
    for batch, context in shapes:
        peak_memory_gb(device, reset=True)
        ms = decode_ms(model, batch, context, steps)
        floor = decode_floor_ms(model, batch, context, steps, bandwidth)
        print(f"  decode {batch:>3} rows x {context:>4} cached: {ms:7.2f} ms/step, floor {floor:6.2f} ms "
              f"({floor / ms:.0%}), peak {peak_memory_gb(device):.1f} GB")
    if decode_only:
        return
    for name, (batch, length) in {"prefill": (8, 4096) if gpu else (2, 256), "update": (4, 2048) if gpu else
                                  (2, 128)}.items():
        peak_memory_gb(device, reset=True)
        if name == "prefill":
            rate = prefill_rate(model, torch.randint(0, 1000, (batch, length)).tolist(), 0)
            flops = forward_flops(model.config, batch, length)
        else:  # LoRA: the frozen base needs no weight gradients, so backward ~ one forward (+1 with checkpointing)
            rate = update_rate(model, batch, length, 0)
            flops = forward_flops(model.config, batch, length) * (3 if gpu else 2)
        achieved = rate * flops / (batch * length) / 1e9
        print(f"  {name} {batch} x {length}: {rate:,.0f} tokens/s = {achieved:,.1f} GFLOP/s "
              f"({achieved / matmul:.0%} of the matmul rate), peak {peak_memory_gb(device):.1f} GB")


def main(argv=None) -> int:
    import argparse

    from tools.bench import check_device

    parser = argparse.ArgumentParser(description="smoke checks and speed on a random Qwen2.5-shaped model")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--size", default="", choices=["", *SIZES], help="default: 0.5b on a GPU, tiny on CPU")
    args = parser.parse_args(argv)
    return report(check_device(args.device), args.size)


if __name__ == "__main__":
    raise SystemExit(main())
