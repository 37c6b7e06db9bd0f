"""Text handling of the vLLM LLM stage (``llm``), free of the engine:
``ChatTemplate`` (rendering, token ids, the user-message opener), tool calls
(parsing a reply as one, and the JSON schema that constrains a reply to one),
the sampling options passed on to vLLM, and ``Reply``, which turns a reply's
decoded text into the outputs that may go out so far (stop strings enforced,
a possible tool call held back).
"""

from __future__ import annotations

import inspect
import json
import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_duplex.core.contracts import SamplingConfig
from vllm_duplex.core.errors import DuplexError
from vllm_duplex.core.payloads import (
    ContextMessage,
    GenerateRequest,
    GenerationDone,
    StageInput,
    TextDelta,
    ToolCall,
)

# SamplingConfig.extra keys passed on to SamplingParams. Not logprobs: asking
# for them in a later chunk than the first crashes vLLM 0.32's output handler
# (engine-wide: logprobs state is set up from a request's first chunk only).
EXTRA_SAMPLING = frozenset({"top_p", "top_k", "min_p", "repetition_penalty", "presence_penalty",
                            "frequency_penalty", "ignore_eos", "min_tokens", "stop_token_ids"})
SENTINEL = "VLLMDUPLEXSENTINEL"  # rendered as a user message to find a template's user prefix
_TOOL_TEXT = re.compile(r"^\s*(?:<tool_call>|```(?:json)?)?\s*(\{.*\})\s*(?:</tool_call>|```)?\s*$", re.S)
_TOOL_STARTS = ("{", "<tool_call>", "```")


# ---- chat template -----------------------------------------------------------


class ChatTemplate:
    """The tokenizer side of ``VllmLlmStage`` (a base class of it): its chat
    template and token ids. Tokenization of a few words runs on the loop."""

    _tokenizer: Any = None  # set once the engine is up

    async def _load_tokenizer(self, engine: Any) -> None:
        tok = engine.get_tokenizer()
        self._tokenizer = await tok if inspect.isawaitable(tok) else tok

    _renders_tools: bool | None = None  # does the template show tools to the model?

    def render(self, messages: Sequence[ContextMessage], generation_prompt: bool,
               tools: Sequence[dict[str, Any]] = ()) -> str:
        kwargs: dict[str, Any] = {"tools": list(tools)} if tools else {}
        return self._tokenizer.apply_chat_template(
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
            text = self._tokenizer.apply_chat_template(probe, tokenize=False, tools=[tool])
            self._renders_tools = SENTINEL.lower() in text
        return self._renders_tools

    def _prefill_ids(self, text: str) -> list[int]:
        # The chat template already spells out BOS/special tokens as text.
        return list(self._tokenizer.encode(text, add_special_tokens=False))

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self._tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def user_opener(self, messages: Sequence[ContextMessage], held_text: str) -> str | None:
        """Text that opens a user message after ``held_text`` (the render of
        ``messages``, possibly ending in an unclosed reply). Found generically
        by rendering a sentinel user message and cutting at it; None when the
        template does not extend ``held_text`` that way."""
        probe = self.render((*messages, ContextMessage("user", SENTINEL)), False)
        cut = probe.find(SENTINEL)
        if cut < len(held_text) or not probe.startswith(held_text):
            return None
        return probe[len(held_text):cut]


# ---- tool calls --------------------------------------------------------------


def _function(tool: dict[str, Any]) -> dict[str, Any]:
    # OpenAI Realtime/Responses shape {"type": "function", "name": ...} or the
    # Chat Completions shape {"type": "function", "function": {"name": ...}}.
    return tool.get("function") or tool


def parse_tool_call(text: str, tools: Sequence[dict[str, Any]]) -> tuple[str, str] | None:
    """``(name, arguments JSON)`` when ``text`` is one JSON call of a known tool
    (bare, fenced, or in ``<tool_call>`` tags), else None."""
    m = _TOOL_TEXT.match(text)
    try:
        obj = json.loads(m.group(1)) if m else None
    except ValueError:
        return None
    if isinstance(obj, dict) and isinstance(obj.get("function"), dict):
        obj = obj["function"]
    if not isinstance(obj, dict) or obj.get("name") not in {_function(t).get("name") for t in tools}:
        return None
    args = obj.get("arguments", obj.get("parameters", {}))
    return obj["name"], args if isinstance(args, str) else json.dumps(args)


def with_tool_prompt(messages: Sequence[ContextMessage],
                     tools: Sequence[dict[str, Any]]) -> tuple[ContextMessage, ...]:
    """``messages`` with the tools described in the system message (for chat
    templates that do not render tools)."""
    lines = ["You can call these tools. To call one, answer with only a JSON object "
             '{"name": <tool name>, "arguments": {...}}.', "Tools:"]
    for t in tools:
        fn = _function(t)
        desc = f": {fn['description']}" if fn.get("description") else ""
        lines.append(f"- {fn['name']}{desc} Parameters (JSON schema): "
                     f"{json.dumps(fn.get('parameters') or {'type': 'object'})}")
    prompt = "\n".join(lines)
    if messages and messages[0].role == "system":
        return (ContextMessage("system", f"{messages[0].text}\n\n{prompt}"), *messages[1:])
    return (ContextMessage("system", prompt), *messages)


def tool_call_schema(tools: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """JSON schema of one call to any of ``tools`` (for constrained decoding)."""
    return {"anyOf": [{"type": "object", "required": ["name", "arguments"], "properties": {
        "name": {"const": _function(t)["name"]},
        "arguments": _function(t).get("parameters") or {"type": "object"}}} for t in tools]}


# ---- sampling and reply text --------------------------------------------------------------


def sampling_options(s: SamplingConfig, default_max_tokens: int) -> dict[str, Any]:
    """``SamplingParams`` arguments for ``s``. Not its stop strings: streaming
    input rejects them, so ``Reply`` enforces them."""
    unknown = set(s.extra) - EXTRA_SAMPLING
    if unknown:
        raise DuplexError("invalid_value", f"unsupported sampling options {sorted(unknown)}")
    return {"temperature": s.temperature, "max_tokens": s.max_tokens or default_max_tokens,
            "seed": s.seed, **s.extra}


@dataclass(eq=False)
class Reply:
    """One reply in flight, its token ids and the outputs they make (which go
    out under ``item``'s fence and id). ``update``/``send`` say what of its
    decoded text may go out so far: streaming input rejects ``stop`` strings,
    so they are enforced here; with tools, a reply that may be a tool call is
    buffered until it ends."""

    item: StageInput
    request: GenerateRequest
    base_text: str  # what the request holds once the prompt is in (prompt included)
    base_len: int
    ids: list[int] = field(default_factory=list)
    sent: int = 0  # characters of the decoded reply already emitted
    tool_hold: bool = False  # buffering what may become a tool call
    done: bool = False

    def update(self, new_ids: list[int], chat: ChatTemplate) -> tuple[TextDelta | ToolCall | None, bool]:
        """Add ``new_ids`` to the reply: the output now due, and whether a stop
        string ended the reply (the output is then its last)."""
        self.ids.extend(new_ids)
        text = chat.decode(self.ids)
        stops = self.request.sampling.stop
        hits = [i for i in (text.find(s) for s in stops if s) if i >= 0]
        if hits:
            return self.send(text[:min(hits)], final=True), True
        if text.endswith("\ufffd"):
            return None, False  # an incomplete UTF-8 sequence: wait for its next token
        # Hold back what could still become a stop string.
        keep = max((len(s) - 1 for s in stops), default=0)
        return self.send(text[:len(text) - keep] if keep else text, final=False), False

    def send(self, text: str, *, final: bool) -> TextDelta | ToolCall | None:
        """The output due for ``text`` (``final``: the whole reply), if any."""
        req = self.request
        if req.callable_tools() and self.sent == 0 and not final:
            head = text.lstrip()
            # A reply that may be a tool call is buffered until it ends.
            if not head or head.startswith(_TOOL_STARTS) or any(s.startswith(head) for s in _TOOL_STARTS):
                self.tool_hold = True
                return None
            self.tool_hold = False
        if self.tool_hold and not final:
            return None
        if self.tool_hold and final:
            call = parse_tool_call(text, req.callable_tools())
            if call is not None:
                self.sent = len(text)
                return ToolCall(req.response_id, f"call_{uuid.uuid4().hex[:24]}", *call)
        if len(text) > self.sent:
            delta, self.sent = text[self.sent:], len(text)
            return TextDelta(req.response_id, delta)
        return None

    def held(self, chat: ChatTemplate) -> tuple[str, int, tuple[ContextMessage, ...]]:
        """What the live request holds once the reply ended: its text, its
        length in tokens, and the conversation that text renders. The KV then
        holds the prompt and every reply token but the last sampled one (vLLM
        drops it when the next chunk arrives)."""
        kept = self.ids[:-1]
        return (self.base_text + chat.decode(kept, skip_special_tokens=False), self.base_len + len(kept),
                (*self.request.context, ContextMessage("assistant", chat.decode(self.ids))))

    def ended(self, reason: str) -> GenerationDone:
        return GenerationDone(self.request.response_id, reason, input_tokens=self.base_len,
                              output_tokens=len(self.ids))
