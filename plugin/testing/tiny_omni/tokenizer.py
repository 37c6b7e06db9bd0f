"""The tiny models' tokenizer: byte-level BPE (every string encodes, as with
the real Qwen tokenizers) trained with the ``tokenizers`` library on a few
fixed sentences -- deterministic, no network -- plus the model's special
tokens, which come after the learned vocabulary."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

# What the merges are learned from: the words the tests and the shipped
# instructions use, so common words are one or two tokens.
_CORPUS = (
    "You are a helpful voice assistant who can hear and see. Answer in one or two short sentences.",
    "What is the capital of France? The capital of France is Paris. And of Germany? Berlin.",
    "Hello, how are you today? I can hear you and I can see the camera.",
)
LEARNED = 320  # byte alphabet (256) + merges


def byte_level_bpe(specials: Sequence[str]) -> Any:
    """A ``tokenizers.Tokenizer``: ``LEARNED`` learned tokens, then
    ``specials`` in order (ids ``LEARNED``, ``LEARNED + 1``, ...)."""
    from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=LEARNED, show_progress=False, special_tokens=[],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(list(_CORPUS) * 4, trainer)
    tok.add_special_tokens([AddedToken(s, special=True, normalized=False) for s in specials])
    for i, s in enumerate(specials):
        if tok.token_to_id(s) != LEARNED + i:
            raise RuntimeError(f"special token {s!r} did not land at id {LEARNED + i}")
    return tok


def chatml_template(default_system: str, media: dict[str, str]) -> str:
    """A ChatML chat template; ``media`` maps a content part's ``type``
    (``image``, ``audio``...) to its placeholder text."""
    parts = "".join(f"{{% elif content['type'] == '{kind}' %}}{text}" for kind, text in media.items())
    return (
        "{% for message in messages %}"
        "{% if loop.first and message['role'] != 'system' %}"
        f"<|im_start|>system\n{default_system}<|im_end|>\n{{% endif %}}"
        "<|im_start|>{{ message['role'] }}\n"
        "{% if message['content'] is string %}{{ message['content'] }}"
        "{% else %}{% for content in message['content'] %}"
        "{% if content['type'] == 'text' %}{{ content['text'] }}" + parts + "{% endif %}{% endfor %}"
        "{% endif %}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
    )
