"""KV-cache reuse (engine/generation.py) against re-encoding, with the real SmolLM2-135M in fp32 and greedy decoding.

Reuse must not change what the model does: over multi-turn conversations of different lengths in one batch,
with an action that stops at eos early, one that hits the token limit, episodes that finish early and drop out,
the group-shared first message and tip writing from the episode's cache, the generated ids are identical.
"""
import dataclasses

import pytest
import torch

from config import RolloutConfig
from envs.base import Env, Task
from engine.generation import NonFiniteScoresError, RowSampler, ScoreCheck, cut_at_eos, generate, left_pad, prefill
from engine.kvcache import PrefixCache
from memory import TipEntry, TipMemory
import rollout as rollout_module
from rollout import ChatStream, pair_up, run_episodes, write_tips


def test_prefix_cache_reuse_length_and_padding_helpers():
    cache = PrefixCache(tokens=[5, 6, 7, 8], keys=[], values=[])
    assert cache.reusable([5, 6, 7, 8, 9]) == 4
    assert cache.reusable([5, 6, 9]) == 2  # a history-window prompt shares only its opening
    assert cache.reusable([1]) == 0
    assert cut_at_eos([3, 4, 2, 2, 2], eos_id=2) == [3, 4, 2] and cut_at_eos([3, 4], eos_id=2) == [3, 4]
    ids, mask = left_pad([[1, 2, 3], [4]], pad_id=0)
    assert ids.tolist() == [[1, 2, 3], [0, 0, 4]] and mask.tolist() == [[1, 1, 1], [0, 0, 1]]


def assert_cache_is_exact(model, cache: PrefixCache, next_token: int) -> None:
    """The next-token logits from the cache equal a fresh forward over the whole unpadded stream (positions,
    padding and trimming all right; only summation order differs)."""
    from transformers import DynamicCache

    batched = DynamicCache(ddp_cache_data=[(k[None], v[None]) for k, v in zip(cache.keys, cache.values)])
    with torch.no_grad():
        cached = model(input_ids=torch.tensor([[next_token]]), position_ids=torch.tensor([[len(cache.tokens)]]),
                       cache=batched, use_cache=True).logits[0, -1]
        fresh = model(input_ids=torch.tensor([cache.tokens + [next_token]])).logits[0, -1]
    assert torch.allclose(cached, fresh, atol=2e-3, rtol=0), (cached - fresh).abs().max()


@pytest.mark.slow
def test_multi_turn_generation_with_caches_matches_reencoding(policy):
    model, tokenizer = policy
    model.eval()
    chat = ChatStream(tokenizer)
    questions = ["Say hi.", "Write a long story about a dragon who learns to cook.", "What is 2+2? Answer briefly."]
    follow_ups = ["Now say it again, shorter.", "Continue the story.", "And 3+3?"]
    plain = [chat.first_turn(q) for q in questions]
    cached_contexts = [list(c) for c in plain]
    caches = [None] * len(plain)
    lengths = set()
    for turn in range(3):
        live = [0, 1, 2] if turn < 2 else [1, 2]  # conversation 0 ends after two turns and drops out
        want = generate(model, chat.pad_id, chat.eos_id, [plain[i] for i in live], max_new_tokens=12,
                        temperature=0.0)
        live_caches = [caches[i] for i in live]
        got = generate(model, chat.pad_id, chat.eos_id, [cached_contexts[i] for i in live], max_new_tokens=12,
                       temperature=0.0, caches=live_caches)
        assert got == want, f"turn {turn}"
        for i, action, cache in zip(live, got, live_caches):
            assert cache.tokens == cached_contexts[i] + action[: len(cache.tokens) - len(cached_contexts[i])]
            assert cache.keys[0].shape[1] == len(cache.tokens)
            caches[i] = cache
            assert_cache_is_exact(model, cache, chat.eos_id)
            delta = action + chat.close_action(action) + chat.next_turn(follow_ups[i])
            plain[i] = plain[i] + delta
            cached_contexts[i] = cached_contexts[i] + delta
            lengths.add(len(action))
    assert 12 in lengths and min(lengths) < 12  # one action hit the token limit, one stopped at eos


@pytest.mark.slow
def test_prefill_shares_a_groups_first_message(policy):
    model, tokenizer = policy
    model.eval()
    chat = ChatStream(tokenizer)
    long = "Name a city. " + "It should be a big one, with a port, a river and an old castle on a hill. " * 3
    contexts = [chat.first_turn("Name a fruit.")] * 3 + [chat.first_turn(long)]
    caches = prefill(model, contexts, chat.pad_id)  # called with grad enabled, as the rollout does
    assert caches[0] is caches[1] is caches[2] and caches[3] is not caches[0]
    assert not any(t.requires_grad for c in (caches[0], caches[3]) for t in c.keys + c.values)  # no autograd graph
    assert caches[0].tokens == contexts[0][:-1] and caches[3].tokens == contexts[3][:-1]
    assert_cache_is_exact(model, caches[0], contexts[0][-1])  # the short one was left-padded in the prefill
    assert_cache_is_exact(model, caches[3], contexts[3][-1])
    want = generate(model, chat.pad_id, chat.eos_id, contexts, max_new_tokens=6, temperature=0.0)
    assert generate(model, chat.pad_id, chat.eos_id, contexts, max_new_tokens=6, temperature=0.0,
                    caches=caches) == want


def play_both_ways(model, chat, envs, tasks, groups, cfg: RolloutConfig, mode="no_memory", memory_entries=()):
    """Greedy episodes + tips with kv_reuse off and on -> (streams, tips, actions) of each."""
    out = {}
    for reuse in (False, True):
        rollout = dataclasses.replace(cfg, kv_reuse=reuse, temperature=0.0)
        memory = TipMemory(capacity=50, top_k=2)
        for task in set(tasks):
            for entry in memory_entries:
                memory.stage(task.key, entry)
        memory.sync()
        eps = run_episodes(model, chat, pair_up(envs, tasks, groups), mode=mode, memory=memory, cfg=rollout,
                           keep_caches=True)
        with pytest.MonkeyPatch.context() as patch:  # greedy tips too: both paths must agree token for token
            patch.setattr(rollout_module, "TIP_TEMPERATURE", 0.0)
            write_tips(model, chat, eps, memory, rollout)
        assert all(ep.kv_cache is None for ep in eps)  # freed after the tip
        out[reuse] = ([ep.ids for ep in eps], [[s.ids + s.action_ids for s in ep.steps] for ep in eps],
                      [ep.tip for ep in eps], [ep.actions for ep in eps], [action_runs(ep) for ep in eps])
    return out


def action_runs(ep) -> list[list[int]]:
    """The generated ids of each action of a full-history episode (runs of the action mask)."""
    runs, current = [], []
    for token, m in zip(ep.ids + [0], ep.mask + [0]):
        if m:
            current.append(token)
        elif current:
            runs, current = runs + [current], []
    return runs


@pytest.mark.slow
def test_rollout_with_kv_reuse_matches_reencoding_on_the_sanity_env(policy):
    from envs.sanity import SanityConfig, SanityEnv

    model, tokenizer = policy
    chat = ChatStream(tokenizer)
    env_cfg = SanityConfig(families=["lab"], num_stages=2, max_steps=3, train_variations=4, test_variations=2)
    envs = [SanityEnv(env_cfg) for _ in range(4)]
    train = envs[0].tasks("train")
    tasks, groups = [train[0]] * 2 + [train[1]] * 2, [0, 0, 1, 1]
    tips = [TipEntry(tip="Connect the wire before pressing the button.", action="connect", ret=50.0)]
    cfg = RolloutConfig(max_action_tokens=6, max_prompt_tokens=2048, tip_max_tokens=12)
    out = play_both_ways(model, chat, envs, tasks, groups, cfg, mode="on_policy_tips", memory_entries=tips)
    assert out[True] == out[False]
    # Tips in each step's own context (the cache reuses only the tip-free history: the previous turn's block is
    # dropped).
    prompts = [ids for steps in out[True][1] for ids in steps]
    assert all(out[True][2]) and prompts and all("<tip>" in chat.decode(ids) for ids in prompts)


@pytest.mark.slow
@pytest.mark.java
def test_rollout_with_kv_reuse_matches_reencoding_on_scienceworld(policy, tmp_path):
    pytest.importorskip("scienceworld")
    from envs.scienceworld import ScienceWorldConfig, ScienceWorldEnv
    from envs.scienceworld.demos import forget_demos

    model, tokenizer = policy
    chat = ChatStream(tokenizer)
    # a short first message that still holds a demo: 905 SmolLM2 tokens (power-component: 1,886 and 1.5x the time)
    cfg = ScienceWorldConfig(tasks=["lifespan-longest-lived"], demo_cache_dir=str(tmp_path), max_steps=2)
    envs = [ScienceWorldEnv(cfg) for _ in range(2)]
    try:
        tasks = [Task("lifespan-longest-lived", 0), Task("lifespan-longest-lived", 1)]
        rollout = RolloutConfig(max_action_tokens=5, max_prompt_tokens=4096, tip_max_tokens=12)
        out = play_both_ways(model, chat, envs, tasks, [0, 1], rollout)
    finally:
        for env in envs:
            env.close()
        forget_demos()  # demos of this temporary folder must not outlive it in the process-wide cache
    assert out[True] == out[False]
    assert all(len(a) == 2 for a in out[True][3])  # multi-turn: every episode played all its steps


@pytest.mark.slow
def test_rollout_with_kv_reuse_matches_reencoding_on_webshop_history_window(policy):
    from envs.webshop import WebShopConfig, WebShopEnv

    model, tokenizer = policy
    chat = ChatStream(tokenizer)
    envs = [WebShopEnv(WebShopConfig(max_steps=3)) for _ in range(2)]
    tasks = envs[0].tasks("train")[:2]
    rollout = RolloutConfig(max_action_tokens=10, max_prompt_tokens=4096, tip_max_tokens=12, history_window=2)
    out = play_both_ways(model, chat, envs, tasks, [0, 1], rollout)
    assert out[True] == out[False]
    assert any(len(steps) > 1 for steps in out[True][1])


@pytest.mark.slow
def test_bf16_option_trains_with_kv_reuse_and_fp32_log_probs(tmp_path, tiny_folder):
    """model.dtype=bfloat16 (GPU default; on CPUs with AMX it is faster, docs/performance.md): rollout with KV
    reuse, tips and an off-policy update run, and the loss math stays in fp32. A tiny random Qwen2 folder (a hub
    model's code path): bf16 matrix products are emulated on CPUs without AMX, 135M of them took minutes."""
    import json
    from pathlib import Path

    from config import load_config
    from losses import sequence_action_logprobs
    from infra.models import load_policy
    from train import train

    config = Path(__file__).resolve().parents[1] / "configs" / "sanity_empo2.yaml"
    cfg = load_config(str(config), [
        "--model.dtype=bfloat16", f"--model.name_or_path={tiny_folder}", "--env.sanity.families=[pick]", "--env.sanity.pick_choices=2",
        "--env.sanity.train_variations=7", "--env.sanity.test_variations=4", "--rollout.tasks_per_iteration=1",
        "--rollout.group_size=4", "--rollout.max_action_tokens=6", "--rollout.tip_max_tokens=12",
        "--memory.p_no_memory=0", "--memory.p_on_policy_tips=0", "--memory.p_off_policy=1",
        "--train.iterations=1", "--train.eval_every=0", "--train.save_every=0", "--train.tensorboard=false",
        "--train.micro_batch_size=4", f"--output_dir={tmp_path}"])
    train(cfg)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["mode"] for r in rows] == ["off_policy"] and rows[0]["tips_written"] > 0
    assert all(torch.isfinite(torch.tensor([r["loss"], r["ratio_mean"], r["padding_frac"]])).all() for r in rows)
    model, tokenizer = load_policy(cfg.model)
    assert next(model.parameters()).dtype == torch.bfloat16
    chat = ChatStream(tokenizer)
    (logp,), (entropy,) = sequence_action_logprobs(model, [chat.first_turn("Hi") + [5, 6]], [[0] * 4 + [1, 1]],
                                                  chat.pad_id, "cpu")
    assert logp.dtype == torch.float32 and entropy.dtype == torch.float32


class QuizEnv(Env):
    """Asks its questions in turn, pays nothing, ends after `max_steps` answers: short and long answers mixed."""

    QUESTIONS = ["What is 2+2? Reply with just the number.", "Write a long poem about the sea.",
                 "What colour is the sky? One word."]

    def __init__(self, max_steps: int):
        self.max_steps, self.t = max_steps, 0

    def tasks(self, split):
        return [Task("quiz", 0)]

    def reset(self, task):
        self.t = 0
        return self.QUESTIONS[0]

    def step(self, action):
        self.t += 1
        done = self.t >= self.max_steps
        info = dict(score=0.0, success=False, truncated=done, env_error="", action=action)
        return self.QUESTIONS[self.t % len(self.QUESTIONS)], 0.0, done, info

    def window_prompt(self, window):
        return self.QUESTIONS[self.t % len(self.QUESTIONS)]


@pytest.mark.slow
def test_rollout_with_kv_reuse_matches_reencoding_with_early_finishers_and_cut_actions(policy):
    """Episodes of 1, 3 and 2 turns in one batch (the short ones drop out while the others go on), full history,
    actions cut at the token limit next to actions ending at eos."""
    model, tokenizer = policy
    chat = ChatStream(tokenizer)
    envs = [QuizEnv(1), QuizEnv(3), QuizEnv(2)]
    tasks = [Task("quiz", 0)] * 3
    rollout = RolloutConfig(max_action_tokens=8, max_prompt_tokens=4096, tip_max_tokens=10)
    out = play_both_ways(model, chat, envs, tasks, [0, 1, 2], rollout)
    assert out[True] == out[False]
    assert [len(a) for a in out[True][3]] == [1, 3, 2]
    actions = [a for runs in out[True][4] for a in runs]
    assert any(len(a) == 8 and a[-1] != chat.eos_id for a in actions)  # cut at the token limit, closed with eos
    assert any(a[-1] == chat.eos_id for a in actions)  # stopped by itself


def test_row_sampler_draws_from_softmax_with_temperature_and_top_p():
    """4000 rows with the same logits, each from its own seeded generator: the chosen tokens follow
    softmax(logits / T), restricted by top-p to the smallest set of likeliest tokens reaching p."""
    logits = torch.log(torch.tensor([0.5, 0.3, 0.2])).repeat(4000, 1)
    frequencies = lambda out: torch.bincount(out.argmax(-1), minlength=3).float() / len(out)  # noqa: E731
    plain = RowSampler(list(range(4000)), temperature=1.0, top_p=1.0)(None, logits.clone())
    assert torch.isinf(plain).sum(-1).eq(2).all()  # exactly one token allowed per row
    assert torch.allclose(frequencies(plain), torch.tensor([0.5, 0.3, 0.2]), atol=0.025)
    hot = RowSampler(list(range(4000)), temperature=2.0, top_p=1.0)(None, logits.clone())
    expected = torch.softmax(logits[0] / 2.0, -1)  # 0.415, 0.322, 0.263
    assert torch.allclose(frequencies(hot), expected, atol=0.025)
    nucleus = RowSampler(list(range(4000)), temperature=1.0, top_p=0.7)(None, logits.clone())
    assert torch.allclose(frequencies(nucleus), torch.tensor([0.625, 0.375, 0.0]), atol=0.025)
    again = RowSampler(list(range(4000)), temperature=1.0, top_p=1.0)(None, logits.clone())
    assert torch.equal(again, plain)  # the same seeds, the same draws


@pytest.mark.slow
@pytest.mark.parametrize("reuse", [False, True])
def test_a_seeded_row_samples_the_same_tokens_in_any_batch(policy, reuse):
    """A row's continuation depends on its seed and context only: alone, or in a batch with other rows, at any
    batch size; torch's global random state is neither used nor changed."""
    model, tokenizer = policy
    chat = ChatStream(tokenizer)
    a, b, c = (chat.first_turn(t) for t in ("Name a colour.", "Count to three, slowly, please.", "Hi"))

    def run(contexts, seeds, batch_size=0):
        caches = [None] * len(contexts) if reuse else None
        return generate(model, chat.pad_id, chat.eos_id, contexts, max_new_tokens=10, temperature=1.0,
                        batch_size=batch_size, caches=caches, seeds=seeds)

    state = torch.get_rng_state()
    alone = run([a], [7])
    assert torch.equal(torch.get_rng_state(), state)
    assert run([b, a, c], [1, 7, 2])[1] == alone[0]
    assert run([c, b, a], [2, 1, 7], batch_size=2)[2] == alone[0]
    assert len({tuple(x) for x in run([a] * 4, [10, 11, 12, 13])}) > 1  # other seeds, other samples


def reference_draws(seeds, scores_per_step, temperature, top_p):
    """Today's RowSampler, one row and one step at a time: each row's own torch.Generator draws one uniform per step
    (torch.rand(())), inverted through that row's tempered, top-p-cut distribution."""
    generators = [torch.Generator().manual_seed(seed) for seed in seeds]
    steps = []
    for scores in scores_per_step:
        tokens = []
        for row, generator in enumerate(generators):
            u = torch.rand((), generator=generator)
            probs = torch.softmax(scores[row].float() / temperature, dim=-1)
            if top_p < 1.0:
                sorted_probs, order = probs.sort(descending=True)
                outside = sorted_probs.cumsum(-1) - sorted_probs > top_p
                probs = probs.scatter(-1, order, sorted_probs.masked_fill(outside, 0.0))
            cdf = probs.cumsum(-1)
            index = int(torch.searchsorted(cdf, (u * cdf[-1]).reshape(1), right=True))
            tokens.append(min(index, int(torch.nonzero(probs > 0).max())))
        steps.append(tokens)
    return steps


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_pre_drawn_uniforms_give_the_per_step_reference_samples(temperature, top_p):
    """The uniforms drawn once per call give, bit for bit, the tokens of one draw per step and row."""
    g = torch.Generator().manual_seed(0)
    seeds, steps = [3, 1, 4, 1_000_003], 6
    scores = [torch.randn(4, 50, generator=g) * 3 for _ in range(steps)]
    sampler = RowSampler(seeds, temperature, top_p, steps=steps)
    got = [sampler(None, s.clone()).argmax(-1).tolist() for s in scores]
    assert got == reference_draws(seeds, scores, temperature, top_p)
    assert len({tuple(step) for step in got}) > 1
    with pytest.raises(RuntimeError, match="called once more"):
        sampler(None, scores[0].clone())


@pytest.mark.slow
@pytest.mark.parametrize("temperature, reuse", [(1.0, True), (1.0, False)])
def test_static_and_dynamic_kv_caches_give_the_same_episodes(policy, temperature, reuse, monkeypatch):
    """The static batch KV cache (in-place buffers, what rollouts use) vs the dynamic one (DynamicCache, switched
    to where generate builds its batch cache): identical actions, recorded log-probs and tips, sampled with fixed
    seeds (every token and log-prob must match; greedy decoding on the static cache is what the reuse tests above
    check against re-encoding), over episodes of 1-3 turns with cut and eos-ended actions, with and without
    reusing the cache across turns."""
    from engine import generation

    feed = generation.feed_prefixes

    model, tokenizer = policy
    chat = ChatStream(tokenizer)
    out = {}
    for kind in ("dynamic", "static"):
        monkeypatch.setattr(generation, "feed_prefixes", lambda *a, kind_=kind, **k: feed(*a, **{**k, "kind": kind_}))
        cfg = RolloutConfig(max_action_tokens=8, max_prompt_tokens=4096, tip_max_tokens=10, kv_reuse=reuse,
                            temperature=temperature)
        eps = run_episodes(model, chat, pair_up([QuizEnv(1), QuizEnv(3), QuizEnv(2)], [Task("quiz", 0)] * 3,
                                                [0, 1, 2], [5, 6, 7]), mode="no_memory", memory=None, cfg=cfg,
                           keep_caches=True)
        monkeypatch.setattr(rollout_module, "TIP_TEMPERATURE", temperature)  # tips as greedy / sampled as actions
        write_tips(model, chat, eps, None, cfg)
        out[kind] = [(ep.ids, ep.action_logps, ep.tip) for ep in eps]
    assert out["static"] == out["dynamic"]
    assert [len(ep[1]) for ep in out["static"]] == [1, 3, 2]


def test_score_check_flags_every_non_finite_row_and_only_those():
    scores = torch.tensor([[0.0, 1.0, float("-inf")], [float("nan"), 0.0, 0.0], [0.0, float("inf"), 0.0],
                           [float("-inf")] * 3])
    check = ScoreCheck()
    out = check(None, scores)
    assert check.first_bad.tolist() == [-1, 0, 0, 0] and torch.isfinite(out[1:]).all()
    assert torch.equal(out[0], scores[0])  # a finite row (one token masked to -inf) is left as it is
    check(None, torch.zeros(4, 3))
    with pytest.raises(NonFiniteScoresError, match=r"step 0 .* row 6 of the call \(3 row"):
        check.raise_if_bad(first_row=5)


@pytest.mark.slow
@pytest.mark.parametrize("temperature, seeds", [(1.0, [1, 2, 3]), (0.0, None), (1.0, None)])
def test_non_finite_scores_stop_generation_with_the_step_and_row(policy, temperature, seeds):
    """NaN logits for one row at one step (a forward hook on the real model's LM head) stop `generate` with an error
    naming them, through our sampler, greedy argmax and HF's own sampler; without the check they became a token."""
    model, tokenizer = policy
    chat = ChatStream(tokenizer)
    contexts = [chat.first_turn(q) for q in ("Name a colour.", "Count to three.", "Hi")]
    head, forwards = model.get_output_embeddings(), []

    def poison(module, inputs, output):  # per batch: forward 0 encodes the contexts, forward k + 1 scores step k
        if output.shape[0] == 1:  # the second batch (batch_size 2): context 2 alone
            forwards.append(1)
            if len(forwards) == 3:
                output[0] = float("nan")
        return output

    handle = head.register_forward_hook(poison)
    try:
        with pytest.raises(NonFiniteScoresError, match=r"generation step 1 \(0 = the first new token\) of row 2"):
            generate(model, chat.pad_id, chat.eos_id, contexts, max_new_tokens=6, temperature=temperature,
                     caches=[None] * 3, seeds=seeds, batch_size=2)  # row 2 = the second batch's first row
    finally:
        handle.remove()


def nan_for_fully_masked_rows(module, query, key, value, attention_mask, **kwargs):
    """SDPA, except that a query row whose mask allows no key gets NaN, as some SDPA kernels give it."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    out, weights = sdpa_attention_forward(module, query, key, value, attention_mask, **kwargs)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        empty = ~attention_mask.any(-1)  # [B, 1, Q]
        out = out.masked_fill(empty.squeeze(1)[:, :, None, None], float("nan"))  # out: [B, Q, heads, dim]
    return out, weights


@pytest.mark.slow
def test_no_attention_row_is_fully_masked_so_a_nan_kernel_changes_nothing(policy):
    """Under an attention kernel that returns NaN for fully masked query rows, a plain left-padded forward poisons
    the padded row; prefill and generate (with and without caches, a 1-token context included) never build such a
    row, so they give the same tokens as plain SDPA and finite caches."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    model, tokenizer = policy
    chat = ChatStream(tokenizer)
    contexts = [chat.first_turn("Hi"), chat.first_turn("Write a long story about a dragon who learns to cook."),
                [chat.eos_id]]
    run = lambda caches: generate(model, chat.pad_id, chat.eos_id, contexts, max_new_tokens=5,  # noqa: E731
                                  temperature=0.0, caches=caches)
    with torch.no_grad():
        want_reuse, want_plain = run(prefill(model, contexts, chat.pad_id)), run(None)
        AttentionInterface.register("nan_if_fully_masked", nan_for_fully_masked_rows)
        AttentionMaskInterface.register("nan_if_fully_masked", sdpa_mask)
        config, original = model.config, model.config._attn_implementation
        config._attn_implementation = "nan_if_fully_masked"
        try:
            ids, mask = left_pad(contexts[:2], chat.pad_id)
            logits = model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0)).logits
            assert torch.isnan(logits[0, -1]).all()  # the kernel does poison a left-padded batch
            caches = prefill(model, contexts, chat.pad_id)
            assert all(torch.isfinite(t).all() for c in caches if c is not None for t in c.keys + c.values)
            assert run(caches) == want_reuse and run(None) == want_plain
        finally:
            config._attn_implementation = original
