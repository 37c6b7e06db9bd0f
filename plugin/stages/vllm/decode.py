"""``ReplyDecoder``: a reply's token ids -> the text, reasoning and tool calls
that may go out so far. Written once, for every path that streams a reply: the
realtime LLM port, the omni port, application-session turns and the stateless
step.

Why the stages decode and not vLLM: a session's live streaming-input request is
sent with ``detokenize=False``. vLLM keeps one detokenizer per request, fed
with every chunk's output tokens, the one token sampled for each prefill chunk
included, which vLLM then drops from the context (``live.py``): its text would
hold words that are not in the KV cache. So the port routes the reply's own
tokens (by count) to a decoder made for that reply.

Decoding is incremental, the way vLLM's own detokenizer does it
(``vllm/v1/engine/detokenizer.py``): the HF tokenizers ``DecodeStream`` for
fast tokenizers, vLLM's ``detokenize_incrementally`` for the others. A token
costs a bounded window of decoding, never a decode of the whole reply; a
multi-byte character split across tokens waits for its last token. The text of
tokens fed one at a time equals ``tokenizer.decode`` of them all (``finish``
adds the replacement character a reply cut mid-character ends with).

On that text, in order:

- reasoning (optional): ``<think>…</think>`` is split off (``ReasoningSplitter``);
  what follows is the answer;
- stop strings: streaming input rejects vLLM's ``stop``, so they are enforced
  here: the answer ends before the first match, and its last ``len(stop) - 1``
  characters are held back while they could still begin one;
- tool calls: with tools, an answer that may be a JSON call (``TOOL_STARTS``) is
  held until it ends, then goes out as one call if it parses as one, else as
  text; a constrained answer (vLLM structured outputs wrote it) streams the
  call's arguments as they are written (``ToolCallScanner``);
- loops (``stop_loops``): a reply whose last tokens are one short unit said
  ``LOOP_REPEATS`` times over ("calendar calendar calendar calendar") ends
  there, as at a stop string. Greedy decoding of a small model falls into such
  a loop now and then, and would speak it up to the length limit -- a minute of
  one word, the LLM and the voice busy for nobody.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream
from vllm.tokenizers.detokenizer_utils import detokenize_incrementally
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.stages.vllm.parsers import (
    ReasoningSplitter,
    ToolCallDelta,
    ToolCallScanner,
)
from vllm_duplex.stages.vllm.tools import may_become_tool_call, parse_tool_call

LOOP_REPEATS = 4  # a unit of up to LOOP_UNIT tokens said this many times in a row: a loop
LOOP_UNIT = 16


def loops(ids: Sequence[int]) -> bool:
    """The last tokens are one unit of 1..``LOOP_UNIT`` tokens repeated
    ``LOOP_REPEATS`` times."""
    for n in range(1, min(LOOP_UNIT, len(ids) // LOOP_REPEATS) + 1):
        tail = list(ids[-n * LOOP_REPEATS:])
        if tail == tail[-n:] * LOOP_REPEATS:
            return True
    return False


# The error the HF tokenizers raise when a decode stream's state went bad; vLLM
# recovers by starting a fresh stream (vllm-project/vllm#17448), so do we.
_INVALID_PREFIX = "Invalid prefix encountered"


@dataclass(frozen=True)
class Text:
    """Answer text that may go out."""

    text: str


@dataclass(frozen=True)
class Reasoning:
    """Text inside ``<think>…</think>``."""

    text: str


@dataclass(frozen=True)
class Call:
    """One whole tool call (``arguments``: JSON text of an object)."""

    name: str
    arguments: str


Piece = Text | Reasoning | Call | ToolCallDelta


class Detokenizer:
    """Token ids -> text, one bounded step per token (see the module doc)."""

    def __init__(self, tokenizer: Any, *, skip_special_tokens: bool = True) -> None:
        self._tokenizer = tokenizer
        self._skip = skip_special_tokens
        self._silent = frozenset(tokenizer.all_special_ids) if skip_special_tokens else frozenset()
        self.ids: list[int] = []
        self.text = ""
        self._waiting = False  # a token made no text yet (an unfinished character)
        backend = getattr(tokenizer, "backend_tokenizer", None)  # fast tokenizers only
        self._backend: Tokenizer | None = backend if isinstance(backend, Tokenizer) else None
        self._stream = DecodeStream(skip_special_tokens=skip_special_tokens)
        self._tokens: list[str] = []  # the slow path's state (vLLM's)
        self._offsets = (0, 0)

    def feed(self, ids: Sequence[int]) -> str:
        """The text ``ids`` add."""
        out = []
        for token in ids:
            self.ids.append(token)
            piece = self._step(token)
            if piece:
                out.append(piece)
                self._waiting = False
            elif token not in self._silent:
                self._waiting = True
        text = "".join(out)
        self.text += text
        return text

    def finish(self) -> str:
        """What the last tokens leave once no more follow (a character cut in
        half decodes to U+FFFD, as ``tokenizer.decode`` has it)."""
        if not self._waiting:
            return ""
        self._waiting = False
        whole = self._tokenizer.decode(self.ids, skip_special_tokens=self._skip)
        if not whole.startswith(self.text):
            return ""
        rest, self.text = whole[len(self.text):], whole
        return rest

    def _step(self, token: int) -> str | None:
        if self._backend is None:
            new, text, prefix, read = detokenize_incrementally(
                self._tokenizer, self.ids, self._tokens, *self._offsets,
                skip_special_tokens=self._skip)
            self._tokens.extend(new)
            self._offsets = (prefix, read)
            return text
        try:
            return self._stream.step(self._backend, token)
        except Exception as exc:
            if not str(exc).startswith(_INVALID_PREFIX):
                raise
            self._stream = DecodeStream(skip_special_tokens=self._skip)
            return self._stream.step(self._backend, token)


class Answer:
    """The answer part of a reply: stop strings, a held possible tool call, or
    a constrained call streamed by its arguments."""

    def __init__(self, stops: Sequence[str] = (), tools: Sequence[dict[str, Any]] = (), *,
                 hold_tools: bool = False, constrained: bool = False) -> None:
        self.stops = tuple(s for s in stops if s)
        self.keep = max((len(s) - 1 for s in self.stops), default=0)
        self.tools = tuple(tools)
        self.always_hold = hold_tools  # a call is expected: hold the whole answer
        self.holding = hold_tools
        self.scanner = ToolCallScanner() if constrained else None
        self.text = ""
        self.sent = 0  # characters of ``text`` released
        self.stopped = False  # a stop string (or a loop) ended it
        self.done = False

    def feed(self, piece: str) -> list[Piece]:
        if self.done or not piece:
            return []
        if self.scanner is not None:
            self.text += piece
            return list(self.scanner.feed(piece))
        start = max(0, len(self.text) - self.keep)  # a match may begin in the held-back tail
        self.text += piece
        hits = [i for i in (self.text.find(s, start) for s in self.stops) if i >= 0]
        if hits:
            self.text, self.stopped = self.text[:min(hits)], True
        if self.tools and self.sent == 0 and not self.always_hold:
            self.holding = may_become_tool_call(self.text)
        if self.stopped:
            return self.final()
        end = len(self.text) - self.keep
        if self.holding or end <= self.sent:
            return []
        released, self.sent = self.text[self.sent:end], end
        return [Text(released)]

    def final(self) -> list[Piece]:
        """The answer is over: what is still due (the held call, or text)."""
        if self.done:
            return []
        self.done = True
        if self.scanner is not None:
            try:
                return [Call(name, args) for name, args in self.scanner.finish()]
            except ValueError as exc:
                raise DuplexError("stage_failed", f"the model wrote an invalid tool call: {exc}") from exc
        if self.holding and (call := parse_tool_call(self.text, self.tools)) is not None:
            self.sent = len(self.text)
            return [Call(*call)]
        rest, self.sent = self.text[self.sent:], len(self.text)
        return [Text(rest)] if rest else []

    @property
    def released(self) -> str:
        """The answer text that went out (as text) so far."""
        return self.text[:self.sent]


class ReplyDecoder:
    """One reply: ``feed`` its token ids as they come, ``finish`` once it ended.

    ``stops``: stop strings; ``tools``: the tools the model may call (a reply
    that may be a call is held); ``hold_tools``: a call is expected (hold the
    whole answer); ``constrained``: the answer is a call written under
    ``tool_call_schema`` (streamed by its arguments); ``reasoning``: split
    ``<think>`` sections off first; ``stop_loops``: a loop ends the answer
    (``looped``).
    """

    def __init__(self, tokenizer: Any, *, stops: Sequence[str] = (),
                 tools: Sequence[dict[str, Any]] = (), hold_tools: bool = False,
                 constrained: bool = False, reasoning: ReasoningSplitter | None = None,
                 stop_loops: bool = False) -> None:
        self.detokenizer = Detokenizer(tokenizer)
        self.reasoning = reasoning
        self.answer = Answer(stops, tools, hold_tools=hold_tools, constrained=constrained)
        self.stop_loops = stop_loops
        self.looped = False

    @property
    def ids(self) -> list[int]:
        return self.detokenizer.ids

    @property
    def text(self) -> str:
        """Everything decoded so far (reasoning, tags and what follows a stop included)."""
        return self.detokenizer.text

    @property
    def stopped(self) -> bool:
        return self.answer.stopped

    @property
    def thinking(self) -> bool:
        return self.reasoning is not None and self.reasoning.inside

    @property
    def constrained(self) -> bool:
        return self.answer.scanner is not None

    def feed(self, ids: Sequence[int]) -> list[Piece]:
        out = self._route(self.detokenizer.feed(ids))
        if (self.stop_loops and not self.answer.done and not self.constrained
                and loops(self.detokenizer.ids)):
            self.looped = self.answer.stopped = True
            out += self.answer.final()
        return out

    def constrain(self) -> None:
        """From now on the answer is a constrained call (it starts afresh)."""
        answer = self.answer
        self.answer = Answer(answer.stops, answer.tools, constrained=True)

    def finish(self, *, truncated: bool = False) -> list[Piece]:
        """What is still due once the reply ended. ``truncated``: the length
        limit cut it (a constrained call cut off is no call)."""
        out = self._route(self.detokenizer.finish())
        if self.reasoning is not None:
            out += self._split(self.reasoning.flush())
        if truncated and self.constrained:
            self.answer.done = True
        return out + self.answer.final()

    def _route(self, text: str) -> list[Piece]:
        if not text:
            return []
        if self.reasoning is None:
            return self.answer.feed(text)
        return self._split(self.reasoning.feed(text))

    def _split(self, pieces: list[tuple[str, str]]) -> list[Piece]:
        out: list[Piece] = []
        for kind, piece in pieces:
            if kind == "reasoning":
                out.append(Reasoning(piece))
            else:
                out += self.answer.feed(piece)
        return out
