"""Shared fixtures: the real CPU policy (SmolLM2-135M-Instruct + LoRA) and a small scripted text environment."""
import os
import socket
from pathlib import Path

import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
THREADS = max(1, min(2, os.cpu_count() or 1))
torch.set_num_threads(THREADS)

from envs.base import Env, Task

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def suite_threads():
    """Every test starts at the suite's torch thread count: an in-process train() or warm-up sets the process's
    count (train.torch_threads, often 1), which otherwise leaks into every later test, making its speed (1 thread
    generates ~1.4x slower here) and its sampled numbers depend on which tests ran before it."""
    torch.set_num_threads(THREADS)


def free_port() -> int:
    """A free TCP port for a multi-process run's rendezvous."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def raw_webshop_product(asin: str, **overrides) -> dict:
    """One product in WebShop's raw items_shuffle schema, with `overrides` replacing fields."""
    base = {"asin": asin, "name": f"Widget {asin}", "pricing": "$10.00", "customization_options": "",
            "small_description": ["a bullet"], "full_description": "desc", "category": "electronics",
            "query": "Widgets", "product_category": "Electronics › Widgets", "images": ["http://img/1.jpg"]}
    return {**base, **overrides}


def clean_env() -> dict:
    """The environment for a subprocess run: no launcher settings inherited from the caller, one thread per process."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("ACCELERATE_", "FSDP_"))}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    return env


class RoomsEnv(Env):
    """A deterministic text world for rollout-mechanics tests: the observation names the step and echoes the
    action; reward 10 for an action containing "look", episode ends after `max_steps` actions."""

    def __init__(self, max_steps: int = 3):
        self.max_steps, self.t, self.score, self.history = max_steps, 0, 0.0, []

    def tasks(self, split):
        return [Task("rooms", v) for v in range(2 if split == "train" else 1)]

    def reset(self, task):
        self.t, self.score, self.history, self.task = 0, 0.0, [], task
        self.first = f"You are in room 0 of house {task.variation}. Answer with one short action."
        return self.first

    def step(self, action):
        self.t += 1
        reward = 10.0 if "look" in action.lower() else 0.0
        self.score += reward
        obs = f"Step {self.t}: you did '{action[:40]}'. You are in room {self.t}."
        self.history.append((action, obs))
        done = self.t >= self.max_steps
        info = dict(score=self.score, success=self.score >= 10 * self.max_steps, truncated=done, env_error="",
                    action=action)
        return obs, reward, done, info

    def window_prompt(self, window):
        lines = [self.first] + [f"Action: {a}\nObservation: {o}" for a, o in self.history[-window:]] if window else []
        return "\n".join(lines or [self.first])


@pytest.fixture(scope="session")
def policy():
    from config import ModelConfig
    from infra.models import load_policy

    torch.manual_seed(0)
    model, tokenizer = load_policy(ModelConfig(lora_rank=4, lora_alpha=8, lora_targets=["q_proj", "v_proj"]))
    return model, tokenizer


@pytest.fixture
def rooms_env():
    return RoomsEnv


@pytest.fixture(scope="session")
def tiny_folder(tmp_path_factory):
    """A tiny random Qwen2 in a plain HF folder with the SmolLM2 tokenizer (a 7B folder's code path)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from infra.models import SMOLLM2_ALIAS, load_tokenizer, resolve_model_path

    folder = tmp_path_factory.mktemp("tiny")
    tokenizer = load_tokenizer(resolve_model_path(SMOLLM2_ALIAS))
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=2048,
                         tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=2)
    Qwen2ForCausalLM(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return str(folder)


@pytest.fixture(scope="session")
def qwen25_tokenizer():
    """A local Qwen2.5-style tokenizer: byte-level BPE with <|endoftext|>, <|im_start|>, <|im_end|> at Qwen2.5's ids
    151643-151645 and Qwen2.5-Instruct's chat template (tests/chat_reference.py; no hub download here)."""
    from chat_reference import qwen25_tokenizer as build

    return build()
