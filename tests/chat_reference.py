"""Test helpers: a local Qwen2.5-style tokenizer (there is no hub download here) and an independent rendering of a
conversation, with generated action ids spliced in, to check the rollout's token streams against.

`qwen25_tokenizer()`: a byte-level BPE trained with `tokenizers` on a fixed text, padded to Qwen2.5's 151,643
ordinary tokens so that its special tokens sit at Qwen2.5's ids (<|endoftext|> 151643, <|im_start|> 151644,
<|im_end|> 151645), Qwen2's pre-tokenizer split, and Qwen2.5-Instruct's chat template written out below (default
system prompt, ChatML turns; the tool branches are kept although the rollout never uses them).

`render_episode(tokenizer, user_texts, actions)`: the conversation user_texts[0], actions[0], user_texts[1],
... rendered by `tokenizer.apply_chat_template` (never by rollout/generation code), with each action's generated
ids spliced in where the template puts the assistant message. The stream of an episode holds the generated ids, not
a re-tokenisation of their text, so the ids are spliced, never encoded.
"""
from __future__ import annotations

from collections.abc import Mapping

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
    import json

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
    text = [line.format(n=n, h=h) for n in range(12) for h in range(3) for line in _CORPUS]
    trained.train_from_iterator(text, trainers.BpeTrainer(
        vocab_size=600, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    learned = json.loads(trained.to_str())["model"]
    vocab = dict(learned["vocab"])
    # Qwen2.5 has 151,643 ordinary tokens; unreachable fillers (no merge produces them) stand in for the rest.
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
