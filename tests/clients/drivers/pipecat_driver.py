"""Pipecat (``OpenAIRealtimeLLMService`` in a real ``Pipeline``) against our
server, with the service's defaults: only ``base_url`` (the server's ``/v1``,
as one points any OpenAI-compatible client at a server) and the API key are
set; its model ``gpt-realtime-2.1`` and session properties are its own."""

from __future__ import annotations

import asyncio
from typing import Any

from harness import main, read_wav
from pipecat.adapters.llm.schemas.function_schema import FunctionSchema
from pipecat.adapters.llm.schemas.tools_schema import ToolsSchema
from pipecat.frames.frames import (
    EndFrame,
    ErrorFrame,
    Frame,
    InputAudioRawFrame,
    InterruptionFrame,
    LLMFullResponseEndFrame,
    LLMRunFrame,
    TranscriptionFrame,
    TTSAudioRawFrame,
    TTSStartedFrame,
    TTSTextFrame,
)
from pipecat.pipeline.pipeline import Pipeline
from pipecat.pipeline.runner import PipelineRunner
from pipecat.pipeline.task import PipelineParams, PipelineTask
from pipecat.processors.aggregators.llm_context import LLMContext
from pipecat.processors.aggregators.llm_response_universal import (
    LLMContextAggregatorPair,
)
from pipecat.processors.frame_processor import FrameDirection, FrameProcessor
from pipecat.services.openai.realtime.llm import OpenAIRealtimeLLMService

FRAME_MS = 20


class Sink(FrameProcessor):
    """The end of the pipeline: what reached the user (audio, text, transcripts)."""

    def __init__(self) -> None:
        super().__init__()
        self.audio_ms = 0.0
        self.text = ""
        self.transcripts: list[str] = []
        self.errors: list[str] = []
        self.responses = 0
        self.interruptions = 0
        self.audio_after_interruption_ms = 0.0
        # The answer to an interruption: the audio turn Pipecat starts after it.
        # Pipecat also ends the interrupted response twice (its own
        # LLMFullResponseEndFrame, then the server's cancelled response.done),
        # so a count of response ends does not say the answer is whole.
        self.answer_audio_ms: float | None = None
        self.answer_done = False
        self.changed = asyncio.Event()

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if isinstance(frame, TTSAudioRawFrame):
            ms = 1000 * len(frame.audio) / 2 / frame.sample_rate / frame.num_channels
            self.audio_ms += ms
            if self.interruptions:
                self.audio_after_interruption_ms += ms
            if self.answer_audio_ms is not None:
                self.answer_audio_ms += ms
        elif isinstance(frame, TTSStartedFrame):
            if self.interruptions:
                self.answer_audio_ms, self.answer_done = 0.0, False
        elif isinstance(frame, TTSTextFrame):
            self.text += frame.text + " "
        elif isinstance(frame, TranscriptionFrame):
            self.transcripts.append(frame.text)
        elif isinstance(frame, ErrorFrame):
            self.errors.append(frame.error)
        elif isinstance(frame, LLMFullResponseEndFrame):
            self.responses += 1
            self.answer_done = self.answer_audio_ms is not None
        elif isinstance(frame, InterruptionFrame):
            self.interruptions += 1
        self.changed.set()
        await self.push_frame(frame, direction)

    async def until(self, predicate, timeout: float = 15.0) -> bool:
        """Whether ``predicate`` came true within ``timeout`` (a miss is an observation)."""
        try:
            async with asyncio.timeout(timeout):
                while not predicate():
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            return False
        return True

    def seen(self) -> dict[str, Any]:
        return {"audio_ms": self.audio_ms, "text": " ".join(self.text.split()),
                "user_transcripts": self.transcripts, "errors": self.errors,
                "responses": self.responses, "interruptions": self.interruptions,
                "audio_after_interruption_ms": self.audio_after_interruption_ms,
                "answer_audio_ms": self.answer_audio_ms,
                "audio_before_interruption_ms": self.audio_ms - self.audio_after_interruption_ms}


class Head(FrameProcessor):
    """The start of the pipeline: where errors and user transcripts pushed upstream end up."""

    def __init__(self, sink: Sink) -> None:
        super().__init__()
        self.sink = sink

    async def process_frame(self, frame: Frame, direction: FrameDirection) -> None:
        await super().process_frame(frame, direction)
        if direction == FrameDirection.UPSTREAM:  # the service sends these up, to the user side
            if isinstance(frame, ErrorFrame):
                self.sink.errors.append(frame.error)
            elif isinstance(frame, TranscriptionFrame):
                self.sink.transcripts.append(frame.text)
            self.sink.changed.set()
        await self.push_frame(frame, direction)


class Run:
    """One real Pipeline: [head, user aggregator, the realtime service, sink, assistant aggregator]."""

    def __init__(self, args, *, tools: ToolsSchema | None = None) -> None:
        self.llm = OpenAIRealtimeLLMService(api_key=args.api_key, base_url=args.base_url_ws)
        self.raw: list[str] = []
        system = [{"role": "system", "content": "You are a helpful assistant."}]
        self.context = LLMContext(system, tools=tools) if tools else LLMContext(system)
        pair = LLMContextAggregatorPair(self.context)
        self.sink = Sink()
        self.task = PipelineTask(Pipeline([Head(self.sink), pair.user(), self.llm, self.sink,
                                           pair.assistant()]),
                                 params=PipelineParams(audio_in_sample_rate=24000,
                                                       audio_out_sample_rate=24000),
                                 enable_rtvi=False, cancel_on_idle_timeout=False)
        self.runner = PipelineRunner(handle_sigint=False)

    async def __aenter__(self) -> Run:
        self._running = asyncio.create_task(self.runner.run(self.task))
        return self

    async def __aexit__(self, *exc) -> None:
        await self.task.queue_frame(EndFrame())
        try:
            await asyncio.wait_for(self._running, 3)
        except TimeoutError:
            await self.task.cancel()

    async def say(self, args, *, realtime: bool | None = None) -> None:
        pcm, rate = read_wav(args.audio)
        step = rate * FRAME_MS // 1000 * 2
        realtime = args.realtime if realtime is None else realtime
        for i in range(0, len(pcm), step):
            await self.task.queue_frame(InputAudioRawFrame(audio=pcm[i:i + step], sample_rate=rate,
                                                           num_channels=1))
            await asyncio.sleep(FRAME_MS / 1000 if realtime else 0.001)


async def conversation(args) -> dict[str, Any]:
    """Audio in; the server's turn detection answers; reply audio + text out."""
    async with Run(args) as run:
        await run.say(args)
        await run.sink.until(lambda: run.sink.responses >= 1 or run.sink.errors, 30)
        await run.sink.until(lambda: run.sink.transcripts, 1.0)  # a user transcript may land just after the reply
    return {**run.sink.seen(), "context": _messages(run.context)}


async def greeting(args) -> dict[str, Any]:
    """``LLMRunFrame``: the bot speaks first, from the context."""
    async with Run(args) as run:
        await run.task.queue_frame(LLMRunFrame())
        await run.sink.until(lambda: run.sink.responses >= 1 or run.sink.errors)
    return {**run.sink.seen(), "context": _messages(run.context)}


async def barge_in(args) -> dict[str, Any]:
    """The user speaks over the bot's reply: the server's VAD interrupts it and
    Pipecat truncates what it had not played."""
    async with Run(args) as run:
        await run.task.queue_frame(LLMRunFrame())
        await run.sink.until(lambda: run.sink.audio_ms > 0 or run.sink.errors)
        # At the pace of a voice: Pipecat's interruption (which truncates the
        # audio response it is playing) reaches its realtime service through
        # the pipeline some time after speech_started; words pushed at 50x
        # real time get the answer going before it arrives, and Pipecat then
        # truncates the answer instead of the reply it meant.
        await run.say(args, realtime=True)
        # the answer to what the user said over the reply
        answered = await run.sink.until(lambda: run.sink.answer_done, 5)
    return {**run.sink.seen(), "answered": answered, "context": _messages(run.context)}


async def tool_round_trip(args) -> dict[str, Any]:
    """A registered function: the model calls it, Pipecat returns its result, the model answers."""
    weather = FunctionSchema(name="get_weather", description="The weather in a city.",
                             properties={"city": {"type": "string"}}, required=["city"])
    calls: list[dict[str, Any]] = []

    async def get_weather(params) -> None:
        calls.append({"name": params.function_name, "arguments": dict(params.arguments)})
        await params.result_callback({"conditions": "sunny"})

    async with Run(args, tools=ToolsSchema(standard_tools=[weather])) as run:
        run.llm.register_function("get_weather", get_weather)
        await run.task.queue_frame(LLMRunFrame())
        await run.sink.until(lambda: (calls and run.sink.audio_ms > 0 and run.sink.responses >= 2)
                             or run.sink.errors, 20)
    return {**run.sink.seen(), "calls": calls, "context": _messages(run.context)}


def _messages(context: LLMContext) -> list[dict[str, Any]]:
    out = []
    for m in context.get_messages():
        m = m if isinstance(m, dict) else getattr(m, "__dict__", {"repr": repr(m)})
        out.append({k: (v if isinstance(v, (str, int, float, type(None))) else repr(v))
                    for k, v in m.items()})
    return out


if __name__ == "__main__":
    from harness import arguments

    parser = arguments()
    parser.add_argument("--path", default="/v1", help="appended to the base URL as ws://")
    scenarios = {"conversation": conversation, "greeting": greeting, "barge_in": barge_in,
                 "tool_round_trip": tool_round_trip}
    import sys

    argv = parser.parse_args()
    argv.base_url_ws = argv.base_url.replace("http", "ws", 1) + argv.path

    class _P:  # hand the already-parsed arguments (with base_url_ws) to the harness
        def parse_args(self):
            return argv

    main(scenarios, _P())
    sys.exit(0)
