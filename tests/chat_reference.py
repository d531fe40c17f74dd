"""Test helpers: a local Qwen2.5-style tokenizer (there is no hub download here) and an independent rendering of a
conversation, with generated action ids spliced in, to check the rollout's token streams against.

`qwen25_tokenizer()`: a byte-level BPE trained with `tokenizers` on a fixed text, padded to Qwen2.5's 151,643
ordinary tokens so that its special tokens sit at Qwen2.5's ids (<|endoftext|> 151643, <|im_start|> 151644,
<|im_end|> 151645), Qwen2's pre-tokenizer split, and Qwen2.5-Instruct's chat template (default system prompt,
ChatML turns; the tool branches are kept although the rollout never uses them): tools.smoke.qwen_tokenizer, which the
GPU smoke run uses too.

`render_episode(tokenizer, user_texts, actions)`: the conversation user_texts[0], actions[0], user_texts[1],
... rendered by `tokenizer.apply_chat_template` (never by rollout/generation code), with each action's generated
ids spliced in where the template puts the assistant message. The stream of an episode holds the generated ids, not
a re-tokenisation of their text, so the ids are spliced, never encoded.
"""
from __future__ import annotations

from collections.abc import Mapping

from tools.smoke import QWEN25_CHAT_TEMPLATE, QWEN25_SPECIAL, QWEN25_SYSTEM, qwen_tokenizer  # noqa: F401 (re-exported)

_CORPUS = [
    "You are in room {n} of house {h}. Answer with one short action.",
    "Step {n}: you did 'look around'. You are in room {n}.",
    "Here are some memories you collected in your previous exploration:",
    "Tip number {n}: look first.; At that timestep, the specific action your took was look around; "
    "Eventually you got the score {n}0.0/100.",
    "Find the red box. You see a red box. It is closed. Open the red box and look inside.",
    "Which colour? Options: red, blue, green. Answer with one word. The answer is blue.",
    "Thanks for playing. Please summarize the trajectory in one sentence of less than 100 words.",
]


def qwen25_tokenizer():
    """A PreTrainedTokenizerFast with Qwen2.5-Instruct's special tokens (at their ids) and chat template."""
    return qwen_tokenizer([line.format(n=n, h=h) for n in range(12) for h in range(3) for line in _CORPUS], 600)


def _ids(out) -> list[int]:
    """apply_chat_template(tokenize=True) returns a list or (transformers 5) a BatchEncoding."""
    return list(out["input_ids"] if isinstance(out, Mapping) else out)


def render_episode(tokenizer, user_texts: list[str], actions: list[list[int]], *, check_boundaries: bool = True
                   ) -> tuple[list[int], list[int]]:
    """(ids, mask) of the conversation user_texts[0], actions[0], user_texts[1], ... as the chat template renders
    it, with the generation prompt after the last user turn, then actions[len(user_texts) - 1] if there is one (an
    episode ends on its last action: nothing is rendered after it). mask: 1 exactly on the generated ids.

    Every action is the generated ids. A generated action ends with eos (the template's end of the assistant turn)
    unless it was cut at the token limit: so the template's text is tokenised around sentinels that stand for the
    assistant contents, and each sentinel is replaced by the action's ids without a trailing eos (the template's own
    end-of-turn token follows, and counts as generated when the action had it). With `check_boundaries` the
    piecewise tokenisation is checked against apply_chat_template(tokenize=True) of the same sentinel conversation
    (no token merges across a sentinel)."""
    assert len(actions) in (len(user_texts) - 1, len(user_texts))
    eos = tokenizer.eos_token_id
    sentinels = [f"@@ACTION{k}@@" for k in range(len(user_texts) - 1)]
    messages = []
    for k, text in enumerate(user_texts):
        messages.append({"role": "user", "content": text})
        if k < len(sentinels):
            messages.append({"role": "assistant", "content": sentinels[k]})
    rendered = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    encode = lambda text: tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
    pieces, rest = [], rendered
    for sentinel in sentinels:
        assert rest.count(sentinel) == 1, f"{sentinel} rendered {rest.count(sentinel)} times"
        before, rest = rest.split(sentinel)
        pieces.append(before)
    pieces.append(rest)
    if check_boundaries:
        whole = _ids(tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True))
        piecewise = encode(pieces[0])
        for sentinel, piece in zip(sentinels, pieces[1:]):
            piecewise += encode(sentinel) + encode(piece)
        assert whole == piecewise, "the template's text merges with a sentinel: pick another sentinel"
    ids = encode(pieces[0])
    mask = [0] * len(ids)
    for action, piece in zip(actions, pieces[1:]):
        ends = bool(action) and action[-1] == eos
        content = list(action[:-1] if ends else action)
        closing = encode(piece)
        assert closing[:1] == [eos], "the template does not end an assistant turn with eos"
        ids += content + closing
        mask += [1] * len(content) + [int(ends)] + [0] * (len(closing) - 1)
    if len(actions) == len(user_texts):
        ids += list(actions[-1])
        mask += [1] * len(actions[-1])
    return ids, mask


def first_difference(a: list[int], b: list[int], tokenizer=None) -> str:
    """Where two token lists part (for assertion messages)."""
    k = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    show = (lambda ids: repr(tokenizer.decode(ids))) if tokenizer is not None else str
    return f"lengths {len(a)} vs {len(b)}; first difference at {k}: {show(a[k:k + 8])} vs {show(b[k:k + 8])}"
