"""Incremental, sans-I/O parsers of a model's streamed reply text: reasoning
apart from the answer, and the arguments of a constrained tool call as they are
written. ``ReplyDecoder`` (``decode.py``) runs them for every path that streams a
reply; they live beside it, below the text surfaces, because the realtime
stages decode replies too.

Text arrives as decoded deltas split anywhere (mid-tag, mid-JSON-token), so both
parsers keep only the state needed to decide what is already certain, emit that
at once, and give the same events whatever the split (streaming equals batch):

- ``ReasoningSplitter`` separates ``<think>...</think>`` reasoning from reply text.
- ``ToolCallScanner`` streams the arguments of one JSON tool call, or of a JSON
  array of parallel calls, as written under ``tool_call_schema`` constraints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Literal

Kind = Literal["reasoning", "text"]


class ReasoningSplitter:
    """Splits streamed text into ``("reasoning", ...)`` and ``("text", ...)`` pieces.

    Only a suffix that could still become the awaited tag is held back, so text
    such as ``"a < b"`` goes out as soon as it cannot be a tag. ``inside=True``
    starts in reasoning, for prompts that already opened the tag (forced thinking).
    """

    def __init__(self, open_tag: str = "<think>", close_tag: str = "</think>", *,
                 inside: bool = False) -> None:
        if not open_tag or not close_tag:
            raise ValueError("reasoning tags must be non-empty")
        self.open_tag, self.close_tag = open_tag, close_tag
        self.inside = inside
        self.reasoning_chars = 0
        self._held = ""
        self._after_close = False  # models write "</think>\n\n": drop that whitespace

    def feed(self, text: str) -> list[tuple[Kind, str]]:
        """The pieces ``text`` makes certain, in order, same-kind neighbours merged."""
        out: list[tuple[Kind, str]] = []
        s = self._held + text
        while True:
            tag = self.close_tag if self.inside else self.open_tag
            at = s.find(tag)
            if at < 0:
                break
            self._emit(out, s[:at])
            s = s[at + len(tag):]
            self._after_close = self.inside
            self.inside = not self.inside
        keep = next((k for k in range(min(len(tag) - 1, len(s)), 0, -1) if s.endswith(tag[:k])), 0)
        self._emit(out, s[:len(s) - keep])
        self._held = s[len(s) - keep:]
        return out

    def flush(self) -> list[tuple[Kind, str]]:
        """At the end of the stream: what was held back, as its current kind."""
        out: list[tuple[Kind, str]] = []
        self._emit(out, self._held)
        self._held = ""
        return out

    def _emit(self, out: list[tuple[Kind, str]], piece: str) -> None:
        kind: Kind = "reasoning" if self.inside else "text"
        if kind == "text" and self._after_close:
            piece = piece.lstrip()
            self._after_close = not piece
        if not piece:
            return
        if kind == "reasoning":
            self.reasoning_chars += len(piece)
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + piece)
        else:
            out.append((kind, piece))


@dataclass(frozen=True)
class ToolCallDelta:
    """A streamed piece of call ``index``: its ``name`` on the first delta, and
    the next fragment of its arguments JSON text (the fragments of a call join
    to exactly the arguments text ``ToolCallScanner.finish`` returns)."""

    index: int
    name: str | None
    arguments: str


@dataclass
class _Call:
    """One call object in the text, as far as it has been scanned."""

    index: int
    name: str | None = None
    name_sent: bool = False
    args_start: int | None = None  # where the raw arguments value starts in the text
    args_end: int | None = None  # one past its end, once known (never for a scalar: invalid)
    args_string: str | None = None  # decoded, when arguments were given as a JSON string
    args_sent: int = 0  # characters of arguments text emitted
    keys: set[str] = field(default_factory=set)
    key: str = ""
    phase: Literal["key", "colon", "value", "after"] = "key"
    value_start: int = -1  # where the value of ``key`` starts


class ToolCallScanner:
    """Streams ``{"name": ..., "arguments": {...}}`` or an array of such calls.

    A character-level JSON scanner tracks strings, escapes and nesting depth, so
    it knows which key it is in and where the arguments value ends without
    parsing it; the arguments go out as raw source text while generated (held
    back only while the name is not yet known). ``feed`` never raises: what is
    not a valid call is reported by ``finish``, which validates the whole text.
    """

    def __init__(self) -> None:
        self._text = ""
        self._pos = 0  # characters scanned
        self._stack: list[str] = []
        self._in_str = self._esc = False
        self._str_start = 0  # where the string being scanned starts
        self._call_depth = 0  # depth inside a call object (1 bare, 2 in an array); 0 before the start
        self._calls: list[_Call] = []
        self._current: _Call | None = None
        self._done = False  # the top-level value closed
        self._error: str | None = None

    def feed(self, text: str) -> list[ToolCallDelta]:
        """The deltas ``text`` makes certain, one per call touched, in order."""
        out: list[ToolCallDelta] = []
        self._text += text
        while self._pos < len(self._text) and self._error is None:
            self._step(self._pos, self._text[self._pos], out)
            self._pos += 1
        if self._current is not None and self._error is None:
            self._send(self._current, out)
        return out

    def finish(self) -> list[tuple[str, str]]:
        """``[(name, arguments JSON), ...]`` of the complete text; ``ValueError``
        unless it is one valid call or a non-empty array of them."""
        if self._error is not None:
            raise ValueError(f"not a tool call: {self._error}")
        if not self._done:
            raise ValueError("incomplete tool call")
        json.loads(self._text)  # the scanner tracks structure; this checks every token
        if not self._calls:
            raise ValueError("no tool call")
        result = []
        for c in self._calls:
            args = c.args_string
            if args is None and c.args_end is not None:
                args = self._text[c.args_start:c.args_end]
            if c.name is None or args is None:
                raise ValueError("a tool call needs a string name and object (or string) arguments")
            if not isinstance(json.loads(args), dict):
                raise ValueError("tool call arguments must be a JSON object")
            result.append((c.name, args))
        return result

    def _fail(self, why: str) -> None:
        self._error = why

    def _step(self, i: int, ch: str, out: list[ToolCallDelta]) -> None:
        if self._in_str:
            if self._esc:
                self._esc = False
            elif ch == "\\":
                self._esc = True
            elif ch == '"':
                self._in_str = False
                self._string_end(i, out)
            return
        if ch.isspace():
            return
        if self._done:
            return self._fail("text after the call")
        if not self._call_depth:
            if ch not in "{[":
                return self._fail("expected an object or an array")
            self._call_depth = 1 if ch == "{" else 2
        elif len(self._stack) == self._call_depth - 1 and ch not in "{,]":
            return self._fail("array items must be call objects")
        c = self._current
        at_call = c is not None and len(self._stack) == self._call_depth  # directly in the call object
        if c is not None and at_call:
            if c.phase == "key" and ch not in '"}':
                return self._fail(f"expected a key, got {ch!r}")
            if c.phase == "colon":
                if ch != ":":
                    return self._fail(f"expected ':', got {ch!r}")
                c.phase = "value"
                return
            if c.phase == "value":
                if ch in ",:}]":
                    return self._fail(f"expected a value, got {ch!r}")
                c.phase, c.value_start = "after", i
                if c.key == "arguments":
                    c.args_start = i
            elif ch == ",":
                c.phase = "key"
                return
        if ch == '"':
            self._in_str, self._str_start = True, i
        elif ch in "{[":
            self._stack.append(ch)
            if len(self._stack) == self._call_depth:
                if ch != "{":
                    return self._fail("a call must be an object")
                self._current = _Call(len(self._calls))
                self._calls.append(self._current)
        elif ch in "}]":
            if not self._stack or "{[".index(self._stack.pop()) != "}]".index(ch):
                return self._fail("unbalanced brackets")
            if c is not None and at_call:  # the call object closed
                self._send(c, out)
                self._current = None
            elif c is not None and len(self._stack) == self._call_depth and c.key == "arguments":
                c.args_end = i + 1  # the arguments object (or array) closed
            self._done = not self._stack

    def _string_end(self, i: int, out: list[ToolCallDelta]) -> None:
        c = self._current
        if c is None or len(self._stack) != self._call_depth:
            return  # a string outside the call object's own keys and values
        raw = self._text[self._str_start:i + 1]
        try:
            if c.phase == "key":
                c.key, c.phase = json.loads(raw), "colon"
                if c.key in ("name", "arguments") and c.key in c.keys:
                    self._fail(f"duplicate key {c.key!r}")
                c.keys.add(c.key)
            elif c.value_start != self._str_start:
                pass  # not this key's value: invalid JSON that finish() reports
            elif c.key == "name":
                c.name = json.loads(raw)
                self._send(c, out)
            elif c.key == "arguments":
                c.args_end, c.args_string = i + 1, json.loads(raw)
                self._send(c, out)
        except ValueError:
            self._fail("invalid string")

    def _send(self, c: _Call, out: list[ToolCallDelta]) -> None:
        """Emit what of ``c`` is certain and not yet sent, merged into ``out``'s last
        delta when that is the same call."""
        if c.name is None:
            return  # arguments before the name wait for it
        if c.args_string is not None:
            new = c.args_string[c.args_sent:]
        elif c.args_start is None or (c.args_end is None and self._text[c.args_start] not in "{["):
            new = ""  # a string value goes out decoded, once complete; a scalar (invalid) never
        else:
            stop = c.args_end if c.args_end is not None else len(self._text)
            new = self._text[c.args_start + c.args_sent:stop]
        c.args_sent += len(new)
        name = None if c.name_sent else c.name
        if name is None and not new:
            return
        c.name_sent = True
        if out and out[-1].index == c.index:
            prev = out.pop()
            name, new = prev.name if prev.name is not None else name, prev.arguments + new
        out.append(ToolCallDelta(c.index, name, new))
