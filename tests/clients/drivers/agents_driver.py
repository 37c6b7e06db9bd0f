"""The OpenAI Agents SDK (``RealtimeAgent`` + ``RealtimeRunner``) against our
server, with the SDK's defaults: only the socket ``url`` and the API key point
it here (its model ``gpt-realtime-2.1``, ``semantic_vad``, voice, input
transcription are its own). The SDK validates every server event against the
``openai`` types and drops what does not validate."""

from __future__ import annotations

import asyncio
import base64
from typing import Any

from agents import function_tool
from agents.realtime import RealtimeAgent, RealtimeRunner
from harness import Recorder, main, read_wav

FRAME_MS = 20


@function_tool
def get_weather(city: str) -> str:
    """The weather in a city."""
    return f"sunny in {city}"


class Observed:
    """The session's events as an agent author sees them."""

    def __init__(self) -> None:
        self.raw = Recorder()
        self.kinds: list[str] = []
        self.audio_bytes = 0
        self.audio_after_interrupt = 0
        self.interrupted_at: int | None = None
        self.tools: list[dict[str, Any]] = []
        self.errors: list[str] = []
        self.history: list[Any] = []  # as history_updated / history_added tell it

    def add(self, event) -> None:
        self.kinds.append(event.type)
        if event.type == "raw_model_event" and getattr(event.data, "type", "") == "raw_server_event":
            self.raw.add(event.data.data)
        elif event.type == "audio":
            n = len(event.audio.data)
            self.audio_bytes += n
            if self.interrupted_at is not None:
                self.audio_after_interrupt += n
        elif event.type == "tool_start":
            self.tools.append({"name": event.tool.name, "arguments": event.arguments})
        elif event.type == "tool_end":
            self.tools[-1]["output"] = str(event.output)
        elif event.type == "error":
            self.errors.append(repr(event.error))
        elif event.type == "history_updated":
            self.history = list(event.history)
        elif event.type == "history_added":
            self.history.append(event.item)


def history(items: list[Any]) -> list[dict[str, Any]]:
    out = []
    for item in items:
        entry: dict[str, Any] = {"type": item.type, "role": getattr(item, "role", None),
                                 "status": getattr(item, "status", None)}
        parts = getattr(item, "content", None) or []
        entry["text"] = " ".join(str(getattr(p, "transcript", None) or getattr(p, "text", None) or "")
                                 for p in parts).strip()
        if item.type == "function_call":
            entry.update(name=item.name, output=item.output)
        out.append(entry)
    return out


async def _run(args, agent: RealtimeAgent, body) -> tuple[Observed, Any]:
    seen = Observed()
    runner = RealtimeRunner(agent)
    session = await runner.run(model_config={"url": args.base_url.replace("http", "ws", 1)
                                             + "/v1/realtime", "api_key": args.api_key})
    async with session:
        async def consume() -> None:
            async for event in session:
                seen.add(event)

        reader = asyncio.create_task(consume())
        try:
            await body(session, seen)
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)
    return seen, history(seen.history)


async def until(predicate, timeout: float) -> bool:
    try:
        async with asyncio.timeout(timeout):
            while not predicate():
                await asyncio.sleep(0.01)
    except TimeoutError:
        return False
    return True


def _done(seen: Observed, n: int = 1):
    return lambda: seen.raw.types().count("response.done") >= n


async def conversation(args) -> dict[str, Any]:
    """Audio in; the server's turn detection answers; the history holds the
    user's transcript and the assistant's."""
    agent = RealtimeAgent(name="Assistant", instructions="You are a helpful voice assistant.")
    pcm, rate = read_wav(args.audio)

    async def body(session, seen: Observed) -> None:
        await until(lambda: "session.updated" in seen.raw.types(), 10)
        step = rate * FRAME_MS // 1000 * 2
        for i in range(0, len(pcm), step):
            await session.send_audio(pcm[i:i + step])
            await asyncio.sleep(FRAME_MS / 1000 if args.realtime else 0.001)
        await until(_done(seen), args.timeout - 5)
        await until(lambda: "conversation.item.input_audio_transcription.completed"
                    in seen.raw.types(), 2)
        await asyncio.sleep(0.3)  # history updates follow the raw events

    seen, hist = await _run(args, agent, body)
    updated = seen.raw.first("session.updated") or {}
    return {**seen.raw.summary(), "kinds": sorted(set(seen.kinds)), "audio_bytes": seen.audio_bytes,
            "errors": seen.errors, "history": hist, "session": updated.get("session")}


async def tool_round_trip(args) -> dict[str, Any]:
    """A text question; the model calls the agent's tool; the SDK returns its
    output; the model answers."""
    agent = RealtimeAgent(name="Assistant", instructions="Use your tools.", tools=[get_weather])

    async def body(session, seen: Observed) -> None:
        await until(lambda: "session.updated" in seen.raw.types(), 10)
        await session.send_message("What is the weather in Paris?")
        await until(lambda: _done(seen, 2)() and seen.audio_bytes > 0, args.timeout - 5)
        await asyncio.sleep(0.3)

    seen, hist = await _run(args, agent, body)
    updated = [e for e in seen.raw.events if e.get("type") == "session.updated"]
    return {**seen.raw.summary(), "tools": seen.tools, "audio_bytes": seen.audio_bytes,
            "errors": seen.errors, "history": hist,
            "session_tools": (updated[-1].get("session") or {}).get("tools") if updated else None}


async def interrupt(args) -> dict[str, Any]:
    """``session.interrupt()`` as the reply starts playing: the SDK sends
    ``conversation.item.truncate`` with what it played (and no cancel, since
    the server's VAD may interrupt): the reply must stop, and history keep
    only what was heard."""
    agent = RealtimeAgent(name="Assistant", instructions="You are a helpful voice assistant.")

    async def body(session, seen: Observed) -> None:
        await until(lambda: "session.updated" in seen.raw.types(), 10)
        await session.send_message("Tell me a story.")
        # half a second in (24 kHz PCM16): the SDK's truncate then names a part
        # with words in it, which its history must keep (and no more)
        await until(lambda: seen.audio_bytes >= 24000, 10)
        seen.interrupted_at = len(seen.raw.events)
        await session.interrupt()
        await until(_done(seen), 10)
        await asyncio.sleep(0.3)

    seen, hist = await _run(args, agent, body)
    after = seen.raw.events[seen.interrupted_at or 0:]
    done = seen.raw.first("response.done") or {}
    item_done = [e for e in seen.raw.events if e.get("type") == "response.output_item.done"]
    # Deltas the server sent before the truncate reached it are in flight: what must
    # stop is what follows the server's answer to it.
    types = [e.get("type") for e in seen.raw.events]
    cut = types.index("conversation.item.truncated") if "conversation.item.truncated" in types else 0
    return {**seen.raw.summary(), "audio_bytes": seen.audio_bytes,
            "audio_deltas_after_interrupt": sum(e.get("type") == "response.output_audio.delta"
                                                for e in after),
            "audio_deltas_after_truncated": types[cut:].count("response.output_audio.delta"),
            "truncated": seen.raw.first("conversation.item.truncated"),
            "done_status": (done.get("response") or {}).get("status"),
            "item_done_transcripts": [(p.get("transcript") or p.get("text"))
                                      for e in item_done for p in (e.get("item") or {}).get("content", [])],
            "errors": seen.errors, "history": hist}


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


if __name__ == "__main__":
    main({"conversation": conversation, "tool_round_trip": tool_round_trip, "interrupt": interrupt})
