"""Requests of the HTTP generate surfaces, parsed and validated (sans-I/O).

One parser serves the stateless ``POST /v1/generate``, a continuation of an
application session (``POST /v1/sessions/{id}/generate``) and the start frame
of ``WS /v1/generate/stream``. Strict on purpose: an unknown field, model or
option is a typed error naming it, never silently ignored or replaced by a
default (a caller who asked for ``logprobs`` must learn they got none).

The request shapes follow the Chat Completions / Responses vocabulary:
``messages`` with ``role``/``content`` (a string or text parts), assistant
``tool_calls`` and ``tool`` results with ``tool_call_id``; ``tools`` in either
the Responses shape ``{"type": "function", "name", "parameters"}`` or the
Chat Completions shape ``{"type": "function", "function": {...}}``.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import secrets
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from vllm_duplex.domain import tools as core_tools
from vllm_duplex.domain.contracts import SamplingConfig
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.owner_ids import mint
from vllm_duplex.domain.payloads import ContextMessage
from vllm_duplex.domain.tools import tool_name

_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")
ROLES = ("system", "user", "assistant", "tool")

# options -> (type, lower bound, upper bound); bounds inclusive, None = open.
_OPTIONS: dict[str, tuple[type, float | None, float | None]] = {
    "max_tokens": (int, 1, None),
    "temperature": (float, 0.0, 2.0),
    "top_p": (float, 0.0, 1.0),
    "top_k": (int, -1, 1 << 20),
    "min_p": (float, 0.0, 1.0),
    "seed": (int, 0, (1 << 63) - 1),
    "presence_penalty": (float, -2.0, 2.0),
    "frequency_penalty": (float, -2.0, 2.0),
    "repetition_penalty": (float, 0.0, 100.0),
    "min_tokens": (int, 0, 1 << 20),
}
OPTION_NAMES = tuple(_OPTIONS)
MUTABLE_FIELDS = ("max_tokens", "reasoning_budget")  # changeable mid-generation by /control


def _fail(param: str, message: str, code: str = "invalid_value") -> DuplexError:
    return DuplexError(code, message, param=param)


def check_text(value: Any, param: str) -> str:
    """A string that is valid Unicode text (JSON can carry lone surrogates,
    which no tokenizer takes)."""
    if not isinstance(value, str):
        raise _fail(param, f"{param} must be a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise _fail(param, f"{param} is not valid Unicode text (a lone surrogate)") from None
    return value


def check_id(value: Any, param: str) -> str:
    if not isinstance(value, str) or not _ID.fullmatch(value):
        raise _fail(param, f"{param} must be 1-128 characters of [A-Za-z0-9._:-]")
    return value


def _number(value: Any, kind: type, lo: float | None, hi: float | None, param: str) -> Any:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is int:  # 2.0 is an integer; a huge int is refused by the bounds below
        ok = ok and (isinstance(value, int) or (math.isfinite(value) and value.is_integer()))
    if not ok or (isinstance(value, float) and not math.isfinite(value)):
        raise _fail(param, f"{param} must be {'an integer' if kind is int else 'a number'}")
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        bounds = f"[{'-inf' if lo is None else lo}, {'inf' if hi is None else hi}]"
        raise _fail(param, f"{param} must be within {bounds}")
    return kind(value)


def _object(value: Any, param: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise _fail(param, f"{param} must be a JSON object")
    return value


def _only(obj: Mapping[str, Any], allowed: Sequence[str], where: str) -> None:
    for key in obj:
        if key not in allowed:
            name = f"{where}.{key}" if where else key
            raise _fail(name, f"{name} is not supported here", "unsupported_option")


# ---- messages and tools --------------------------------------------------------


@dataclass(frozen=True)
class ToolCallRecord:
    id: str
    name: str
    arguments: str  # JSON text of an object


@dataclass(frozen=True)
class Message:
    role: str
    content: str
    tool_calls: tuple[ToolCallRecord, ...] = ()
    tool_call_id: str | None = None

    def context(self) -> ContextMessage:
        """As the model sees it: a tool call is written the way the model is
        asked to write one (``{"name": ..., "arguments": {...}}``)."""
        if self.tool_calls:
            calls = [{"name": c.name, "arguments": json.loads(c.arguments)} for c in self.tool_calls]
            text = json.dumps(calls[0] if len(calls) == 1 else calls)
            return ContextMessage("assistant", f"{self.content}\n{text}" if self.content else text)
        return ContextMessage(self.role, self.content)

    def wire(self) -> dict[str, Any]:
        out: dict[str, Any] = {"role": self.role, "content": self.content}
        if self.tool_calls:
            out["tool_calls"] = [{"id": c.id, "type": "function",
                                  "function": {"name": c.name, "arguments": c.arguments}}
                                 for c in self.tool_calls]
        if self.tool_call_id is not None:
            out["tool_call_id"] = self.tool_call_id
        return out


def _content(value: Any, param: str) -> str:
    if value is None:
        return ""
    if isinstance(value, str):
        return check_text(value, param)
    if isinstance(value, list):  # text parts: [{"type": "text"|"input_text"|"output_text", "text": ...}]
        texts = []
        for i, part in enumerate(value):
            part = _object(part, f"{param}[{i}]")
            if part.get("type") not in ("text", "input_text", "output_text") or not isinstance(
                    part.get("text"), str):
                raise _fail(f"{param}[{i}]", "only text content parts are supported here",
                            "unsupported_option")
            texts.append(check_text(part["text"], f"{param}[{i}].text"))
        return "".join(texts)
    raise _fail(param, f"{param} must be a string or a list of text parts")


def _tool_call(raw: Any, param: str) -> ToolCallRecord:
    raw = _object(raw, param)
    fn = _object(raw.get("function", raw), f"{param}.function")
    name, args = fn.get("name"), fn.get("arguments", "{}")
    if not isinstance(name, str) or not name:
        raise _fail(f"{param}.function.name", "a tool call needs a function name")
    if not isinstance(args, str):
        args = json.dumps(args)
    try:
        if not isinstance(json.loads(args), dict):
            raise ValueError
    except (ValueError, RecursionError):
        raise _fail(f"{param}.function.arguments", "tool call arguments must be a JSON object") from None
    call_id = raw.get("id") or f"call_{secrets.token_hex(8)}"
    return ToolCallRecord(str(call_id), name, args)


def parse_messages(raw: Any, param: str = "messages", *, allow_empty: bool = False) -> tuple[Message, ...]:
    if not isinstance(raw, list) or (not raw and not allow_empty):
        raise _fail(param, f"{param} must be a non-empty list of messages")
    out = []
    for i, m in enumerate(raw):
        p = f"{param}[{i}]"
        m = _object(m, p)
        _only(m, ("role", "content", "tool_calls", "tool_call_id"), p)
        role = m.get("role")
        if role == "developer":
            role = "system"
        if role not in ROLES:
            raise _fail(f"{p}.role", f"role must be one of {', '.join(ROLES)}")
        raw_calls = m.get("tool_calls") or []
        if not isinstance(raw_calls, list):
            raise _fail(f"{p}.tool_calls", "tool_calls must be a list")
        calls = tuple(_tool_call(c, f"{p}.tool_calls[{j}]") for j, c in enumerate(raw_calls))
        if calls and role != "assistant":
            raise _fail(f"{p}.tool_calls", "only assistant messages carry tool_calls")
        call_id = m.get("tool_call_id")
        if role == "tool" and not isinstance(call_id, str):
            raise _fail(f"{p}.tool_call_id", "a tool message needs the tool_call_id it answers")
        out.append(Message(role, _content(m.get("content"), f"{p}.content"), calls,
                           call_id if role == "tool" else None))
    return tuple(out)


def parse_tools(raw: Any) -> tuple[dict[str, Any], ...]:
    """The request's tools (``vllm_duplex.domain.tools``), each with a
    description and a parameters schema (chat templates expect both)."""
    return tuple({"type": "function", "name": t["name"], "description": t.get("description", ""),
                  "parameters": t.get("parameters", {"type": "object"})}
                 for t in core_tools.parse_tools(raw))


def parse_tool_choice(raw: Any, tools: Sequence[Mapping[str, Any]]) -> str | dict[str, Any]:
    if raw is None:
        return "auto"
    if raw in ("auto", "none", "required"):
        if raw == "required" and not tools:
            raise _fail("tool_choice", "tool_choice 'required' needs tools")
        return raw
    if isinstance(raw, Mapping):
        fn = raw.get("function")
        name = tool_name(raw) if not isinstance(fn, Mapping) else fn.get("name")
        if not isinstance(name, str) or name not in {tool_name(t) for t in tools}:
            raise _fail("tool_choice", f"tool_choice names no declared tool ({name!r})")
        return {"type": "function", "name": name}
    raise _fail("tool_choice", "tool_choice must be auto, none, required or {type: function, name}")


# ---- generation options ----------------------------------------------------------


def parse_options(raw: Any, max_tokens_cap: int) -> tuple[SamplingConfig, dict[str, Any]]:
    """``options`` -> the sampling config and the initial mutable controls."""
    raw = _object(raw if raw is not None else {}, "options")
    _only(raw, (*_OPTIONS, "stop"), "options")
    values = {k: _number(v, *_OPTIONS[k], f"options.{k}") for k, v in raw.items()
              if k != "stop" and v is not None}
    stop = raw.get("stop") or ()
    if isinstance(stop, str):
        stop = (stop,)
    if not isinstance(stop, (list, tuple)) or len(stop) > 8 or not all(
            isinstance(s, str) and s for s in stop):
        raise _fail("options.stop", "stop must be a string or a list of up to 8 non-empty strings")
    max_tokens = min(values.pop("max_tokens", max_tokens_cap), max_tokens_cap)
    if values.get("min_tokens", 0) > max_tokens:
        raise _fail("options.min_tokens", f"min_tokens must be <= max_tokens ({max_tokens})")
    sampling = SamplingConfig(temperature=values.pop("temperature", 0.0), max_tokens=max_tokens,
                              stop=tuple(stop), seed=values.pop("seed", None), extra=values)
    return sampling, {"max_tokens": max_tokens}


def parse_reasoning(raw: Any) -> tuple[bool, int | None]:
    if raw is None:
        return False, None
    raw = _object(raw, "reasoning")
    _only(raw, ("enabled", "budget_tokens"), "reasoning")
    enabled = raw.get("enabled", True)
    if not isinstance(enabled, bool):
        raise _fail("reasoning.enabled", "reasoning.enabled must be a boolean")
    budget = raw.get("budget_tokens")
    if budget is not None:
        budget = _number(budget, int, 0, None, "reasoning.budget_tokens")
    return enabled, budget


# ---- the parsed request ----------------------------------------------------------


@dataclass
class GenerationControl:
    """The fields of a running generation that ``/control`` may change. The
    generation applies queued changes between two events and reports where."""

    max_tokens: int
    reasoning_budget: int | None = None
    pending: list[tuple[dict[str, Any], asyncio.Future[int]]] = field(default_factory=list)

    def request(self, changes: dict[str, Any]) -> asyncio.Future[int]:
        """Queue ``changes``; the future resolves to the seq of the ``control``
        event that applied them (or fails if the generation ends first)."""
        fut: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self.pending.append((changes, fut))
        return fut

    def withdraw(self, fut: asyncio.Future[int]) -> bool:
        """Drop a change not applied yet; False when it was already taken."""
        kept = [(c, f) for c, f in self.pending if f is not fut]
        withdrawn, self.pending = len(kept) != len(self.pending), kept
        if withdrawn:
            fut.cancel()
        return withdrawn

    def take(self) -> list[tuple[dict[str, Any], asyncio.Future[int]]]:
        pending, self.pending = self.pending, []
        for changes, _ in pending:
            for name, value in changes.items():
                setattr(self, name, value)
        return pending

    def abandon(self, error: DuplexError) -> None:
        for _, fut in self.take():
            if not fut.done():
                fut.set_exception(error)


def parse_control(raw: Any, max_tokens_cap: int) -> dict[str, Any]:
    """A ``/control`` body -> the changes. Immutable fields are ``immutable_field``."""
    raw = _object(raw, "body")
    if not raw:
        raise _fail("body", f"name at least one of {', '.join(MUTABLE_FIELDS)}")
    changes: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in MUTABLE_FIELDS:
            raise _fail(key, f"{key} cannot change once a generation started "
                             f"(mutable: {', '.join(MUTABLE_FIELDS)})", "immutable_field")
        if key == "max_tokens":
            changes[key] = min(_number(value, int, 1, None, key), max_tokens_cap)
        else:
            changes[key] = None if value is None else _number(value, int, 0, None, key)
    return changes


@dataclass(frozen=True)
class GenerateSpec:
    model: str
    request_id: str
    messages: tuple[Message, ...]
    sampling: SamplingConfig
    tools: tuple[dict[str, Any], ...] = ()
    tool_choice: str | dict[str, Any] = "auto"
    parallel_tool_calls: bool = False
    reasoning: bool = False
    reasoning_budget: int | None = None
    stream_id: str | None = None
    deadline_ms: int | None = None

    def control(self) -> GenerationControl:
        return GenerationControl(max_tokens=self.sampling.max_tokens or 1,
                                 reasoning_budget=self.reasoning_budget)

    def context(self) -> tuple[ContextMessage, ...]:
        return tuple(m.context() for m in self.messages)

    def callable_tools(self) -> tuple[dict[str, Any], ...]:
        if self.tool_choice == "none":
            return ()
        if isinstance(self.tool_choice, dict):
            return tuple(t for t in self.tools if tool_name(t) == self.tool_choice["name"])
        return self.tools

    @property
    def must_call(self) -> bool:
        return self.tool_choice == "required" or isinstance(self.tool_choice, dict)


GENERATE_FIELDS = ("model", "request_id", "instructions", "messages", "tools", "tool_choice",
                   "parallel_tool_calls", "options", "reasoning", "stream_id", "deadline_ms")


def check_model(raw: Any, served: str, param: str = "model") -> str:
    if not isinstance(raw, str) or not raw:
        raise _fail(param, "model is required: name the model explicitly")
    if raw != served:
        raise DuplexError("model_not_found", f"model {raw!r} is not served here; this server "
                          f"serves {served!r}", param=param)
    return raw


def parse_generate(body: Any, *, served_model: str, max_tokens_cap: int,
                   extra_fields: Sequence[str] = (), model_required: bool = True,
                   messages_required: bool = True, owner: str | None = None) -> GenerateSpec:
    """A generate request body -> ``GenerateSpec``; raises the typed error.
    A request id minted here names ``owner`` (``gen_<24>.<owner>``), so a
    router sends its abort to this instance."""
    body = _object(body, "body")
    _only(body, (*GENERATE_FIELDS, *extra_fields), "")
    if model_required or body.get("model") is not None:
        model = check_model(body.get("model"), served_model)
    else:
        model = served_model
    request_id = body.get("request_id")
    request_id = check_id(request_id, "request_id") if request_id is not None else (
        mint("gen", owner) if owner is not None else "gen_" + secrets.token_urlsafe(12))
    messages = parse_messages(body.get("messages", [] if not messages_required else None),
                              allow_empty=not messages_required)
    instructions = body.get("instructions")
    if instructions is not None:
        check_text(instructions, "instructions")
        messages = (Message("system", instructions), *messages)
    tools = parse_tools(body.get("tools"))
    choice = parse_tool_choice(body.get("tool_choice"), tools)
    parallel = body.get("parallel_tool_calls", False)
    if not isinstance(parallel, bool):
        raise _fail("parallel_tool_calls", "parallel_tool_calls must be a boolean")
    sampling, _ = parse_options(body.get("options"), max_tokens_cap)
    reasoning, budget = parse_reasoning(body.get("reasoning"))
    stream_id = body.get("stream_id")
    if stream_id is not None:
        check_id(stream_id, "stream_id")
    deadline = body.get("deadline_ms")
    if deadline is not None:
        deadline = _number(deadline, int, 1, 3_600_000, "deadline_ms")
    return GenerateSpec(model=model, request_id=request_id, messages=messages, sampling=sampling,
                        tools=tools, tool_choice=choice, parallel_tool_calls=parallel,
                        reasoning=reasoning, reasoning_budget=budget, stream_id=stream_id,
                        deadline_ms=deadline)
