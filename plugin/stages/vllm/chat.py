"""The chat template of a served model, free of the engine: rendering a
conversation as the model's prompt text, its token ids, the text that opens a
user message after what a live request holds, and the sampling options passed
on to vLLM.

Rendering runs a Jinja template over the whole conversation (milliseconds for
a long history), so callers on the event loop run it in a worker thread
(``EngineHost.off_loop``); the methods here are plain functions of their
arguments and safe to call from any thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from vllm_duplex.domain.contracts import SamplingConfig
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import ContextMessage
from vllm_duplex.stages.vllm.tools import with_tool_prompt

# SamplingConfig.extra keys passed on to SamplingParams. Not logprobs: asking
# for them in a later chunk than the first crashes vLLM 0.32's output handler
# (engine-wide: logprobs state is set up from a request's first chunk only).
EXTRA_SAMPLING = frozenset({"top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                            "frequency_penalty", "ignore_eos", "min_tokens", "stop_token_ids"})
SENTINEL = "VLLMDUPLEXSENTINEL"  # rendered as a user message to find a template's user prefix


class ChatTemplate:
    """A tokenizer's chat template and token ids."""

    def __init__(self, tokenizer: Any) -> None:
        self.tokenizer = tokenizer
        self._renders_tools: bool | None = None  # does the template show tools to the model?

    def render(self, messages: Sequence[ContextMessage], generation_prompt: bool,
               tools: Sequence[dict[str, Any]] = ()) -> str:
        kwargs: dict[str, Any] = {"tools": list(tools)} if tools else {}
        return self.tokenizer.apply_chat_template(
            [{"role": m.role, "content": m.text} for m in messages], tokenize=False,
            add_generation_prompt=generation_prompt, **kwargs)

    def render_with_tools(self, messages: Sequence[ContextMessage],
                          tools: Sequence[dict[str, Any]]) -> str:
        """A generation prompt in which the model sees ``tools``: a template
        that drops them (SmolLM2's) gets them described in the system message.
        Not for the live request of a session, whose held text is rendered
        without tools (describing them would change its prefix every turn)."""
        if tools and not self._template_renders_tools():
            return self.render(with_tool_prompt(messages, tools), True)
        return self.render(messages, True, tools)

    def _template_renders_tools(self) -> bool:
        if self._renders_tools is None:
            probe = [{"role": "user", "content": "hi"}]
            tool = {"type": "function", "function": {"name": SENTINEL.lower(), "parameters": {}}}
            text = self.tokenizer.apply_chat_template(probe, tokenize=False, tools=[tool])
            self._renders_tools = SENTINEL.lower() in text
        return self._renders_tools

    def encode(self, text: str) -> list[int]:
        # The chat template already spells out BOS/special tokens as text.
        return list(self.tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def sampling_options(s: SamplingConfig, default_max_tokens: int) -> dict[str, Any]:
    """``SamplingParams`` arguments for ``s``. Not its stop strings: streaming
    input rejects them, so ``ReplyDecoder`` enforces them."""
    unknown = set(s.extra) - EXTRA_SAMPLING
    if unknown:
        raise DuplexError("invalid_value", f"unsupported sampling options {sorted(unknown)}")
    return {"temperature": s.temperature, "max_tokens": s.max_tokens or default_max_tokens,
            "seed": s.seed, **s.extra}
