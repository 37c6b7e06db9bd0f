"""One model step on the shared vLLM engine, as typed events.

``Generation`` runs a ``GenerateSpec`` (full history and tools from the
caller) as one vLLM request and yields the events of the generate API:
``text-delta``, ``reasoning-delta``, ``tool-call-delta``, ``tool-call``,
``control``, and exactly one terminal ``finish`` or ``error``. It never runs a
tool and keeps no state after it ends.

Why the loop decodes token by token itself instead of letting vLLM do it:
the mutable limits (``max_tokens``, the reasoning budget) are enforced here,
exactly, and can change mid-generation (``/control``): the engine request is
sized to the room left in the context, and the step stops it (abort) the
moment a limit is reached. The reasoning budget uses "budget forcing": when
the model has thought for ``reasoning_budget`` tokens, the request is
aborted and a new one continues from the same tokens plus the closing tag
(the prefix cache makes that a few-token prefill). The same phase switch
attaches the tool-call grammar (vLLM structured outputs) only to the answer,
so a model may think freely and still be made to write a valid call.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any

from vllm import SamplingParams
from vllm.inputs import tokens_input
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.exceptions import EngineDeadError
from vllm_duplex.core.errors import DuplexError
from vllm_duplex.stages.vllm.chat import (
    parse_tool_call,
    sampling_options,
    tool_call_schema,
)
from vllm_duplex.stages.vllm.llm import VllmLlmStage
from vllm_duplex.text.parsers import ReasoningSplitter, ToolCallScanner
from vllm_duplex.text.requests import GenerateSpec, GenerationControl, GenEvent

log = logging.getLogger(__name__)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_TOOL_STARTS = ("{", "[", "<tool_call>", "```")


class TextGenerator:
    """Runs stateless generations on a ``VllmLlmStage``'s engine (shared with
    the realtime sessions). Counters feed ``/metrics``."""

    def __init__(self, stage: VllmLlmStage) -> None:
        self.stage = stage
        self._ids = itertools.count()
        self.active_requests = 0
        self.aborted_requests = 0
        self.completed = 0

    def start(self, spec: GenerateSpec, control: GenerationControl | None = None) -> Generation:
        return Generation(self, spec, control or spec.control())

    def vllm_id(self, request_id: str) -> str:
        return f"duplex-gen.{request_id}.{next(self._ids)}"


class _Answer:
    """The answer text after reasoning: stop strings (held back until they
    cannot match), and a reply that may be a tool call (held until it ends)."""

    def __init__(self, spec: GenerateSpec, constrained: bool) -> None:
        self.stops = spec.sampling.stop
        self.tools = spec.callable_tools()
        self.text = ""
        self.sent = 0
        self.stopped = False
        self.scanner = ToolCallScanner() if constrained else None
        self.holding = False

    def feed(self, piece: str) -> list[tuple[str, Any]]:
        if self.stopped:
            return []
        self.text += piece
        if self.scanner is not None:
            return [("call-delta", d) for d in self.scanner.feed(piece)]
        hits = [i for i in (self.text.find(s) for s in self.stops) if i >= 0]
        if hits:
            self.text, self.stopped = self.text[:min(hits)], True
            return self._release(final=True)
        return self._release(final=False)

    def _release(self, final: bool) -> list[tuple[str, Any]]:
        if self.tools and self.sent == 0 and not final:
            head = self.text.lstrip()
            if not head or head.startswith(_TOOL_STARTS) or any(s.startswith(head) for s in _TOOL_STARTS):
                self.holding = True
                return []
            self.holding = False
        if self.holding and not final:
            return []
        keep = 0 if final else max((len(s) - 1 for s in self.stops), default=0)
        end = len(self.text) - keep
        if end <= self.sent:
            return []
        piece, self.sent = self.text[self.sent:end], end
        return [("text", piece)]

    def finish(self) -> tuple[list[tuple[str, Any]], list[tuple[str, str]]]:
        """(text pieces still due, tool calls) at the end of the step."""
        if self.scanner is not None:
            try:
                return [], self.scanner.finish()
            except ValueError as exc:
                raise DuplexError("stage_failed", f"the model wrote an invalid tool call: {exc}") from exc
        if self.holding:
            call = parse_tool_call(self.text, self.tools)
            if call is not None:
                return [], [call]
        return self._release(final=True), []


class Generation:
    """One running step. Iterate ``events()`` once; ``stop(reason)`` ends it
    early from anywhere (``cancelled`` → finish ``cancelled``; ``deadline`` →
    error ``deadline_exceeded``)."""

    def __init__(self, generator: TextGenerator, spec: GenerateSpec, control: GenerationControl) -> None:
        self.generator = generator
        self.spec = spec
        self.control = control
        self.request_id = spec.request_id
        self._stop_reason: str | None = None
        self._vllm_id: str | None = None
        self._aborted_ids: set[str] = set()
        self.finished = False

    async def stop(self, reason: str = "cancelled") -> None:
        if self.finished or self._stop_reason is not None:
            return
        self._stop_reason = reason
        await self._abort()

    async def _abort(self) -> None:
        vid = self._vllm_id
        if vid is None or vid in self._aborted_ids:
            return
        self._aborted_ids.add(vid)
        self.generator.aborted_requests += 1
        try:
            await self.generator.stage.engine.abort(vid)
        except Exception:  # a dead engine has nothing left to abort
            log.debug("abort of %s failed", vid, exc_info=True)

    async def events(self) -> AsyncIterator[GenEvent]:
        run = self._run()
        try:
            async for ev in run:
                yield ev
        except DuplexError as err:
            yield GenEvent("error", {"error": err.to_wire()})
        except EngineDeadError:
            yield GenEvent("error", {"error": DuplexError("engine_dead", "the vLLM engine died").to_wire()})
        except Exception as exc:  # noqa: BLE001 - one step's bug must not take the server down
            log.exception("generation %s failed", self.request_id)
            yield GenEvent("error", {"error": DuplexError("internal_error", repr(exc)).to_wire()})
        finally:
            await run.aclose()  # its engine request's cleanup, now rather than at GC
            self.finished = True
            self.control.abandon(DuplexError("generation_finished", "the generation ended first"))
            if self._vllm_id is not None:
                # The consumer went away mid-step (disconnect): free the engine request.
                await asyncio.shield(self._abort())

    async def _run(self) -> AsyncIterator[GenEvent]:
        gen, spec, control = self.generator, self.spec, self.control
        stage = gen.stage
        if not stage.healthy:
            raise DuplexError("engine_dead", "the vLLM engine is dead")
        tools = spec.callable_tools()
        prompt = stage.render_with_tools(spec.context(), tools)
        splitter = ReasoningSplitter(THINK_OPEN, THINK_CLOSE, inside=spec.reasoning)
        if spec.reasoning:
            prompt += THINK_OPEN + "\n"
        prompt_ids = stage._prefill_ids(prompt)
        if len(prompt_ids) >= stage.max_model_len:
            raise DuplexError("invalid_value", f"the messages take {len(prompt_ids)} tokens; the "
                              f"context holds {stage.max_model_len}", param="messages")
        answer = _Answer(spec, constrained=False)
        out_ids: list[int] = []  # everything after the prompt, forced tags included
        emitted = 0  # characters of decode(out_ids) already handled
        generated = reasoning_tokens = 0
        call_ids: dict[int, str] = {}
        finish_reason: str | None = None

        def handle(pieces: list[tuple[str, str]]) -> list[GenEvent]:
            events = []
            for kind, piece in pieces:
                if kind == "reasoning":
                    events.append(GenEvent("reasoning-delta", {"delta": piece}))
                    continue
                for what, item in answer.feed(piece):
                    events.extend(self._answer_event(what, item, call_ids))
            return events

        def decode_new() -> str:
            nonlocal emitted
            text = stage.decode(out_ids)
            if text.endswith("\ufffd"):
                return ""  # an incomplete UTF-8 sequence: wait for its next token
            piece, emitted = text[emitted:], len(text)
            return piece

        while finish_reason is None:
            constrained = spec.must_call and not splitter.inside
            if constrained and answer.scanner is None:
                answer = _Answer(spec, constrained=True)
            room = stage.max_model_len - len(prompt_ids) - len(out_ids)
            if room < 1:
                finish_reason = "length"
                break
            structured = None
            if constrained:
                schema = tool_call_schema(tools)
                if spec.parallel_tool_calls:
                    schema = {"type": "array", "items": schema, "minItems": 1}
                structured = StructuredOutputsParams(json=schema)
            options = sampling_options(spec.sampling, room)
            options["max_tokens"] = room
            params = SamplingParams(detokenize=False, structured_outputs=structured,
                                    output_kind=RequestOutputKind.DELTA, **options)
            self._vllm_id = vid = gen.vllm_id(self.request_id)
            gen.active_requests += 1
            # Why this request ends early to continue in another: "force" (the
            # reasoning budget is spent: close the tag) or "closed" (the model
            # closed it and the answer needs the tool-call grammar).
            switch: str | None = None
            outputs = stage.engine.generate(tokens_input(prompt_ids + out_ids), params, vid)
            try:
                async for out in outputs:
                    if vid in self._aborted_ids:
                        if out.finished:
                            break
                        continue
                    for changes, fut in control.take():
                        yield GenEvent("control", {"applied": changes, "output_tokens": generated},
                                       waiters=(fut,))
                    if generated >= control.max_tokens:  # lowered below what is out already
                        finish_reason = "length"
                        await self._abort()
                        break
                    comp = out.outputs[0]
                    for tok in comp.token_ids:
                        out_ids.append(tok)
                        generated += 1
                        was_inside = splitter.inside
                        for ev in handle(splitter.feed(decode_new())):
                            yield ev
                        if was_inside:
                            reasoning_tokens += 1
                        if answer.stopped:
                            finish_reason = "stop"
                        elif generated >= control.max_tokens:
                            finish_reason = "length"
                        elif splitter.inside and control.reasoning_budget is not None and \
                                reasoning_tokens >= control.reasoning_budget:
                            switch = "force"
                        elif was_inside and not splitter.inside and spec.must_call:
                            switch = "closed"  # thinking over: the answer needs the grammar
                        if finish_reason or switch:
                            break
                    if finish_reason or switch:
                        await self._abort()
                        break
                    if out.finished:
                        finish_reason = comp.finish_reason or "stop"
                        if finish_reason == "abort":
                            finish_reason = None
                        break
            finally:
                gen.active_requests -= 1
                await outputs.aclose()
            if self._stop_reason is not None:
                break
            if switch == "force":
                forced = stage._prefill_ids(THINK_CLOSE + "\n\n")
                out_ids.extend(forced)
                for ev in handle(splitter.feed(decode_new())):
                    yield ev
            elif switch is None and finish_reason is None:
                finish_reason = "stop"  # the engine ended the request without a reason
        self._vllm_id = None
        if self._stop_reason == "deadline":
            raise DuplexError("deadline_exceeded", f"deadline of {spec.deadline_ms} ms passed")
        if self._stop_reason is not None:
            finish_reason = "cancelled"
        else:
            for ev in handle(splitter.flush()):
                yield ev
            if finish_reason == "length" and answer.scanner is not None:
                text_pieces, calls = [], []  # a call cut off by the limit is no call
            else:
                text_pieces, calls = answer.finish()
            for what, item in text_pieces:
                for ev in self._answer_event(what, item, call_ids):
                    yield ev
            for index, (name, arguments) in enumerate(calls):
                call_id = call_ids.get(index) or f"call_{uuid.uuid4().hex[:24]}"
                if index not in call_ids:  # held, not streamed: its arguments in one delta
                    yield GenEvent("tool-call-delta", {"index": index, "id": call_id, "name": name,
                                                       "arguments_delta": arguments})
                yield GenEvent("tool-call", {"index": index, "id": call_id, "name": name,
                                             "arguments": arguments})
            if calls and finish_reason == "stop":
                finish_reason = "tool_calls"
        gen.completed += 1
        yield GenEvent("finish", {"request_id": self.request_id, "finish_reason": finish_reason,
                                  "usage": {"prompt_tokens": len(prompt_ids),
                                            "completion_tokens": generated,
                                            "total_tokens": len(prompt_ids) + generated,
                                            "completion_tokens_details": {
                                                "reasoning_tokens": reasoning_tokens}}})

    def _answer_event(self, what: str, item: Any, call_ids: dict[int, str]) -> list[GenEvent]:
        if what == "text":
            return [GenEvent("text-delta", {"delta": item})]
        # a streamed tool-call delta (constrained output)
        call_id = call_ids.setdefault(item.index, f"call_{uuid.uuid4().hex[:24]}")
        data: dict[str, Any] = {"index": item.index, "id": call_id, "arguments_delta": item.arguments}
        if item.name is not None:
            data["name"] = item.name
        elif not item.arguments:
            return []
        return [GenEvent("tool-call-delta", data)]
