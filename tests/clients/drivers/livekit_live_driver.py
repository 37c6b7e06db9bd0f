"""LiveKit Agents 1.8.9's GPT-Live model (``livekit.plugins.openai.realtime.
GPTLiveModel`` -> ``GPTLiveSession``), unmodified and with its defaults
(model ``gpt-live-1``, voice ``marin``, ``responses`` delegation), against
our ``/v1/live/sessions``: only ``base_url`` and the API key point it here.
Driven as ``AgentSession`` drives a duplex model: ``_update_session`` with
the agent's instructions, then ``push_audio`` like a microphone (silence
included) while its ``audio_stream`` is read. ``tool_call`` gives it a
``@function_tool`` and runs each call as ``AgentSession`` does (the result
back through ``_append_items``), with ``responses_options`` its own option
for the backend's tool choice. ``barge_in`` speaks a second question
(``--barge-audio``) over the reply and records what LiveKit's session emits
to the framework -- its audio frames, ``transcript_delta``,
``input_speech_started``, final ``input_audio_transcription_completed`` --
each stamped with when it came."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from typing import Any

from harness import Recorder, arguments, main, read_wav
from livekit import rtc
from livekit.agents import llm
from livekit.plugins.openai.realtime import GPTLiveModel

FRAME_MS = 20
RATE = 24000


def frame(pcm: bytes, rate: int) -> rtc.AudioFrame:
    return rtc.AudioFrame(data=pcm, sample_rate=rate, num_channels=1,
                          samples_per_channel=len(pcm) // 2)


@llm.function_tool
async def get_weather(city: str) -> str:
    """Get the current weather in a city."""
    # terse: SmolLM2 says such a result back as it is (test_live_cascade_tools.py)
    return "Sunny, 18 degrees." if city else "No city given."


class Run:
    def __init__(self, args, **options: Any) -> None:
        self.model = GPTLiveModel(base_url=args.base_url + "/v1", api_key=args.api_key,
                                  **options)
        self.session = self.model.session()
        self.rec = Recorder()
        self.errors: list[str] = []
        self.audio_ms = 0.0
        self.frames: list[tuple[float, float]] = []  # (arrival, ms) of each audio frame
        self.session.on("openai_server_event_received", self.rec.add)
        self.session.on("error", lambda ev: self.errors.append(repr(ev.error)))
        self.utterance, self.rate = read_wav(args.audio)
        self._queue: list[bytes] = []
        self._tasks: list[asyncio.Task] = []

    async def start(self, tools: list[llm.Tool] | None = None) -> None:
        await self.session._update_session(instructions="You are a helpful voice assistant.",
                                           **({"tools": tools} if tools else {}))
        self._tasks = [asyncio.create_task(self._microphone()), asyncio.create_task(self._speaker())]

    async def _microphone(self) -> None:
        step = self.rate * FRAME_MS // 1000 * 2
        silence = b"\0" * step
        loop = asyncio.get_running_loop()
        start, i = loop.time(), 0
        while True:
            chunk = self._queue.pop(0) if self._queue else silence
            self.session.push_audio(frame(chunk, self.rate))
            i += 1
            await asyncio.sleep(max(0.0, start + i * FRAME_MS / 1000 - loop.time()))

    async def _speaker(self) -> None:
        async for out in self.session.audio_stream:
            f = out.frame
            ms = 1000 * f.samples_per_channel / f.sample_rate
            self.audio_ms += ms
            self.frames.append((time.monotonic(), ms))

    def say(self, utterance: bytes | None = None) -> float:
        """Queue an utterance (the ``--audio`` one by default); when it starts (about)."""
        pcm = self.utterance if utterance is None else utterance
        step = self.rate * FRAME_MS // 1000 * 2
        self._queue.extend(pcm[i:i + step] for i in range(0, len(pcm), step))
        return time.monotonic() + FRAME_MS / 1000

    def text(self, kind: str) -> str:
        return "".join(e.get("delta", "") for e in self.rec.events if e.get("type") == kind)

    async def until(self, done, timeout: float) -> None:
        async with asyncio.timeout(timeout):
            while not done():
                await asyncio.sleep(0.05)

    async def close(self) -> dict[str, Any]:
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self.session.aclose()
        await self.model.aclose()
        return {**self.rec.summary(), "client_errors": self.errors,
                "input_transcript": self.text("session.input_transcript.delta"),
                "output_transcript": self.text("session.output_transcript.delta"),
                "audio_ms": self.audio_ms, "session_id": self.session.session_id,
                "started": self.rec.first("session.started")}


async def conversation(args) -> dict[str, Any]:
    """A spoken turn: the engine answers by itself, in audio and transcript."""
    run = Run(args)
    try:
        await run.start()
        await run.until(lambda: run.rec.first("session.started"), 10)
        run.say()
        # the reply whole: its words come with the audio that says them, and
        # usage follows its end
        await run.until(lambda: run.rec.first("session.usage.updated") and run.audio_ms > 500,
                        args.timeout - 5)
    finally:
        result = await run.close()
    return result


async def mute(args) -> dict[str, Any]:
    """Muted speech is not heard; the model keeps its floor."""
    run = Run(args)
    try:
        await run.start()
        await run.until(lambda: run.rec.first("session.started"), 10)
        run.session.mute_input()
        await run.until(lambda: run.rec.first("session.input_audio.muted"), 10)
        run.say()
        await asyncio.sleep(len(run.utterance) / 2 / run.rate + 2.0)
        heard = {"input_transcript": run.text("session.input_transcript.delta"),
                 "audio_ms": run.audio_ms}
        run.session.unmute_input()
        await run.until(lambda: run.rec.first("session.input_audio.unmuted"), 10)
    finally:
        result = await run.close()
    return {**result, "while_muted": heard}


async def tool_call(args) -> dict[str, Any]:
    """A spoken question the backend answers with a function call: the
    function runs with its arguments, its result goes back, and the voice
    speaks the answer."""
    run = Run(args, responses_options={"tool_choice": "required"})
    calls: list[dict[str, Any]] = []
    after: dict[str, Any] = {}

    async def answer(call: llm.FunctionCall) -> None:
        arguments = json.loads(call.arguments)
        output = await get_weather(**arguments)
        calls.append({"name": call.name, "arguments": arguments, "output": output})
        after["transcript_at"] = len(run.text("session.output_transcript.delta"))
        after["audio_ms_at"] = run.audio_ms
        await run.session._append_items([llm.FunctionCallOutput(
            call_id=call.call_id, name=call.name, output=output, is_error=False)])

    tasks: list[asyncio.Task] = []
    run.session.on("function_call", lambda call: tasks.append(asyncio.create_task(answer(call))))
    try:
        await run.start([get_weather])
        await run.until(lambda: run.rec.first("session.started"), 10)
        run.say()
        await run.until(lambda: calls, args.timeout / 2)
        # the continuation's run ends once its words are spoken (the voice is paced)
        await run.until(lambda: len(completed(run)) >= 2, args.timeout / 2)
        await asyncio.gather(*tasks)
    finally:
        result = await run.close()
    result["calls"] = calls
    result["answer"] = result["output_transcript"][after.get("transcript_at", 0):]
    result["answer_audio_ms"] = result["audio_ms"] - after.get("audio_ms_at", 0.0)
    result["response_events"] = [(e.get("event") or {}).get("type") for e in run.rec.events
                                 if e.get("type") == "response.event"]
    return result


async def barge_in(args) -> dict[str, Any]:
    """A question with a long answer, and a second one spoken over that
    answer once a second of it played: what LiveKit emits to the framework,
    stamped, relative to when the second question began (``onset``)."""
    run = Run(args)
    barge, rate = read_wav(args.barge_audio)
    assert rate == run.rate, "both utterances at one rate"
    seen: list[dict[str, Any]] = []

    def stamp(kind: str, **fields: Any) -> None:
        seen.append({"t": time.monotonic(), "kind": kind, **fields})

    run.session.on("input_speech_started", lambda _: stamp("input_speech_started"))
    run.session.on("input_audio_transcription_completed", lambda ev: stamp(
        "user_transcript", text=ev.transcript) if ev.is_final else None)
    run.session.on("transcript_delta", lambda ev: stamp(
        "transcript_delta", text=ev.text, start_ms=ev.start_ms, end_ms=ev.end_ms))
    onset = None
    try:
        await run.start()
        await run.until(lambda: run.rec.first("session.started"), 10)
        run.say()
        await run.until(lambda: run.audio_ms > 1000, args.timeout / 2)  # a second of it played
        onset = run.say(barge)
        with contextlib.suppress(TimeoutError):  # the test then says what came instead
            await run.until(lambda: answered(seen, onset), args.timeout / 2)
            await asyncio.sleep(2.0)  # the answer goes on: its words and audio keep coming
    finally:
        result = await run.close()
    at = onset or time.monotonic()
    result["onset_events"] = [{**e, "t": round(e["t"] - at, 3)} for e in seen]
    result["frames"] = [(round(t - at, 3), ms) for t, ms in run.frames]
    return result


def answered(seen: list[dict[str, Any]], onset: float) -> bool:
    """Whether the voice has begun a reply after LiveKit ended the user's
    message spoken over it (its final transcript)."""
    heard = [e["t"] for e in seen if e["kind"] == "user_transcript" and e["t"] >= onset]
    return bool(heard) and any(e["kind"] == "transcript_delta" and e["t"] > heard[0]
                               for e in seen)


def completed(run: Run) -> list[dict[str, Any]]:
    return [e for e in run.rec.events if e.get("type") == "response.event"
            and (e.get("event") or {}).get("type") == "response.completed"]


if __name__ == "__main__":
    parser = arguments()
    parser.add_argument("--barge-audio", help="barge_in: what is said over the reply (WAV)")
    main({"conversation": conversation, "mute": mute, "tool_call": tool_call,
          "barge_in": barge_in}, parser)
