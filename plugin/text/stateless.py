"""One model step on the shared vLLM engine, as typed events.

``Generation`` runs a ``GenerateSpec`` (full history and tools from the
caller) as one vLLM request on the stage's ``EngineHost`` and yields the events
of the generate API: text, reasoning and tool-call deltas, tool calls,
``control``, and exactly one terminal ``finish`` or ``error``. It never runs a
tool and keeps no state after it ends.

Why the step feeds the reply's tokens to its ``ReplyDecoder`` one by one
instead of letting vLLM detokenize: the mutable limits (``max_tokens``, the
reasoning budget) are enforced here, exactly, and can change mid-generation
(``/control``): the engine request is sized to the room left in the context,
and the step stops it (abort) the moment a limit is reached. The reasoning
budget uses "budget forcing": when the model has thought for
``reasoning_budget`` tokens, the request is aborted and a new one continues
from the same tokens plus the closing tag (the prefix cache makes that a
few-token prefill). The same phase switch attaches the tool-call grammar (vLLM
structured outputs) only to the answer, so a model may think freely and still
be made to write a valid call.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import AsyncIterator

from vllm import SamplingParams
from vllm.inputs import tokens_input
from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
from vllm.v1.engine.exceptions import EngineDeadError
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.stages.vllm.chat import ChatTemplate, sampling_options
from vllm_duplex.stages.vllm.decode import Call, Piece, Reasoning, ReplyDecoder, Text
from vllm_duplex.stages.vllm.llm import VllmLlmStage
from vllm_duplex.stages.vllm.parsers import ReasoningSplitter, ToolCallDelta
from vllm_duplex.stages.vllm.tools import tool_call_schema
from vllm_duplex.text.events import (
    ControlEvent,
    ErrorEvent,
    FinishEvent,
    ReasoningDeltaEvent,
    TextDeltaEvent,
    TextEvent,
    ToolCallDeltaEvent,
    ToolCallEvent,
    Usage,
)
from vllm_duplex.text.requests import GenerateSpec, GenerationControl

log = logging.getLogger(__name__)

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"


class TextGenerator:
    """Runs stateless generations on a ``VllmLlmStage``'s engine host (shared
    with the realtime sessions); its requests are the host's ``steps``."""

    def __init__(self, stage: VllmLlmStage) -> None:
        self.stage = stage
        self.host = stage.host

    @property
    def active_requests(self) -> int:
        return self.host.counters.steps.active

    @property
    def aborted_requests(self) -> int:
        return self.host.counters.steps.aborted

    def start(self, spec: GenerateSpec, control: GenerationControl | None = None) -> Generation:
        return Generation(self, spec, control or spec.control())


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


class Generation:
    """One running step. Iterate ``events()`` once; ``stop(reason)`` ends it
    early from anywhere (``cancelled`` → finish ``cancelled``; ``deadline`` →
    error ``deadline_exceeded``)."""

    def __init__(self, generator: TextGenerator, spec: GenerateSpec, control: GenerationControl) -> None:
        self.host = generator.host
        self.spec = spec
        self.control = control
        self.request_id = spec.request_id
        self.fence = Fence(f"generate.{spec.request_id}")  # its vLLM ids say whose they are
        self._counts = generator.host.counters.steps
        self._stop_reason: str | None = None
        self._vllm_id: str | None = None
        self._aborted_ids: set[str] = set()
        self._call_ids: dict[int, str] = {}  # streamed calls: index -> id
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
        self._counts.aborted += 1
        await self.host.abort([vid])

    async def events(self) -> AsyncIterator[TextEvent]:
        run = self._run()
        try:
            async for ev in run:
                yield ev
        except DuplexError as err:
            yield ErrorEvent(err)
        except EngineDeadError:
            yield ErrorEvent(DuplexError("engine_dead", "the vLLM engine died"))
        except Exception as exc:  # noqa: BLE001 - one step's bug must not take the server down
            log.exception("generation %s failed", self.request_id)
            yield ErrorEvent(DuplexError("internal_error", repr(exc)))
        finally:
            await run.aclose()  # its engine request's cleanup, now rather than at GC
            self.finished = True
            self.control.abandon(DuplexError("generation_finished", "the generation ended first"))
            if self._vllm_id is not None:
                # The consumer went away mid-step (disconnect): free the engine request.
                await asyncio.shield(self._abort())

    def _prompt_ids(self, chat: ChatTemplate) -> list[int]:
        prompt = chat.render_with_tools(self.spec.context(), self.spec.callable_tools())
        if self.spec.reasoning:
            prompt += THINK_OPEN + "\n"
        return chat.encode(prompt)

    async def _run(self) -> AsyncIterator[TextEvent]:
        spec, control, host = self.spec, self.control, self.host
        if not host.healthy:
            raise DuplexError("engine_dead", "the vLLM engine is dead")
        chat, tools, limit = host.chat, spec.callable_tools(), host.max_model_len
        prompt_ids = await host.off_loop(self._prompt_ids, chat)
        if len(prompt_ids) >= limit:
            raise DuplexError("invalid_value", f"the messages take {len(prompt_ids)} tokens; the "
                              f"context holds {limit}", param="messages")
        decoder = ReplyDecoder(chat.tokenizer, stops=spec.sampling.stop, tools=tools,
                               reasoning=ReasoningSplitter(THINK_OPEN, THINK_CLOSE,
                                                           inside=spec.reasoning))
        generated = reasoning_tokens = 0
        finish_reason: str | None = None

        while finish_reason is None:
            constrained = spec.must_call and not decoder.thinking
            if constrained and not decoder.constrained:
                decoder.constrain()
            room = limit - len(prompt_ids) - len(decoder.ids)  # the ids: everything after the prompt
            if room < 1:
                finish_reason = "length"
                break
            structured = StructuredOutputsParams(json=tool_call_schema(
                tools, parallel=spec.parallel_tool_calls)) if constrained else None
            options = sampling_options(spec.sampling, room)
            options["max_tokens"] = room
            params = SamplingParams(detokenize=False, structured_outputs=structured,
                                    output_kind=RequestOutputKind.DELTA, **options)
            self._vllm_id = vid = host.request_id(self.fence.request_id("gen"))
            self._counts.active += 1
            # Why this request ends early to continue in another: "force" (the
            # reasoning budget is spent: close the tag) or "closed" (the model
            # closed it and the answer needs the tool-call grammar).
            switch: str | None = None
            outputs = host.generate(tokens_input(prompt_ids + decoder.ids), params, vid)
            try:
                async for out in outputs:
                    if vid in self._aborted_ids:
                        if out.finished:
                            break
                        continue
                    for changes, fut in control.take():
                        yield ControlEvent(changes, generated, waiters=(fut,))
                    if generated >= control.max_tokens:  # lowered below what is out already
                        finish_reason = "length"
                        await self._abort()
                        break
                    comp = out.outputs[0]
                    for tok in comp.token_ids:
                        generated += 1
                        was_inside = decoder.thinking
                        for ev in self._events(decoder.feed((tok,))):
                            yield ev
                        if was_inside:
                            reasoning_tokens += 1
                        if decoder.stopped:
                            finish_reason = "stop"
                        elif generated >= control.max_tokens:
                            finish_reason = "length"
                        elif decoder.thinking and control.reasoning_budget is not None and \
                                reasoning_tokens >= control.reasoning_budget:
                            switch = "force"
                        elif was_inside and not decoder.thinking and spec.must_call:
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
                self._counts.active -= 1
                await outputs.aclose()
            if self._stop_reason is not None:
                break
            if switch == "force":
                for ev in self._events(decoder.feed(chat.encode(THINK_CLOSE + "\n\n"))):
                    yield ev
            elif switch is None and finish_reason is None:
                finish_reason = "stop"  # the engine ended the request without a reason
        self._vllm_id = None
        if self._stop_reason == "deadline":
            raise DuplexError("deadline_exceeded", f"deadline of {spec.deadline_ms} ms passed")
        if self._stop_reason is not None:
            finish_reason = "cancelled"
        else:
            pieces = decoder.finish(truncated=finish_reason == "length")
            for ev in self._events(pieces):
                yield ev
            calls = [p for p in pieces if isinstance(p, Call)]
            for index, call in enumerate(calls):
                call_id = self._call_ids.get(index) or _new_call_id()
                if index not in self._call_ids:  # held, not streamed: its arguments in one delta
                    yield ToolCallDeltaEvent(index, call_id, call.arguments, call.name)
                yield ToolCallEvent(index, call_id, call.name, call.arguments)
            if calls and finish_reason == "stop":
                finish_reason = "tool_calls"
        self._counts.completed += 1
        assert finish_reason is not None
        yield FinishEvent(self.request_id, finish_reason,
                          Usage(len(prompt_ids), generated, reasoning_tokens))

    def _events(self, pieces: list[Piece]) -> list[TextEvent]:
        """The events of decoded pieces (whole calls are the caller's)."""
        out: list[TextEvent] = []
        for p in pieces:
            if isinstance(p, Text):
                out.append(TextDeltaEvent(p.text))
            elif isinstance(p, Reasoning):
                out.append(ReasoningDeltaEvent(p.text))
            elif isinstance(p, ToolCallDelta) and (p.name is not None or p.arguments):
                call_id = self._call_ids.setdefault(p.index, _new_call_id())
                out.append(ToolCallDeltaEvent(p.index, call_id, p.arguments, p.name))
        return out
