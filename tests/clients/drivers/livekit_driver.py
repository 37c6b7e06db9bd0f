"""LiveKit Agents (``livekit-plugins-openai`` ``RealtimeModel`` -> ``RealtimeSession``)
against our server, with the plugin's defaults: only ``base_url`` and the API
key point it here (its model ``gpt-realtime``, ``semantic_vad``, voice
``marin``, input transcription are left as they are)."""

from __future__ import annotations

import asyncio
from typing import Any

from harness import Recorder, main, read_wav
from livekit import rtc
from livekit.agents import llm
from livekit.plugins import openai

FRAME_MS = 20


def new_session(args) -> tuple[Any, Any, Recorder, list[Any]]:
    model = openai.realtime.RealtimeModel(base_url=args.base_url + "/v1", api_key=args.api_key)
    session = model.session()
    rec, errors = Recorder(), []
    session.on("openai_server_event_received", rec.add)
    session.on("error", lambda ev: errors.append(repr(ev.error)))
    return model, session, rec, errors


async def close(model, session) -> None:
    await session.aclose()
    await model.aclose()


async def wait_for(rec: Recorder, etype: str, timeout: float = 10.0, after: int = 0) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            hit = next((e for e in rec.events[after:] if e.get("type") == etype), None)
            if hit is not None:
                return hit
            await asyncio.sleep(0.01)


async def push_utterance(session, args) -> None:
    pcm, rate = read_wav(args.audio)
    step = rate * FRAME_MS // 1000 * 2
    for i in range(0, len(pcm), step):
        chunk = pcm[i:i + step]
        session.push_audio(rtc.AudioFrame(data=chunk, sample_rate=rate, num_channels=1,
                                          samples_per_channel=len(chunk) // 2))
        await asyncio.sleep(FRAME_MS / 1000 if args.realtime else 0)


async def read_generation(gen: llm.GenerationCreatedEvent, *, stop_after_audio_ms: float | None = None,
                          on_audio=None) -> dict[str, Any]:
    """Everything one generation streams: its messages' text and audio, its calls."""
    out: dict[str, Any] = {"user_initiated": gen.user_initiated, "messages": [], "calls": []}

    async def message(msg: llm.MessageGeneration) -> None:
        seen: dict[str, Any] = {"id": msg.message_id, "text": "", "audio_ms": 0.0}
        out["messages"].append(seen)

        async def text() -> None:
            async for piece in msg.text_stream:
                seen["text"] += str(piece)

        async def audio() -> None:
            async for frame in msg.audio_stream:
                seen["audio_ms"] += 1000 * frame.samples_per_channel / frame.sample_rate
                if on_audio is not None:
                    on_audio(seen)

        await asyncio.gather(text(), audio())
        seen["modalities"] = list(await msg.modalities)

    async def messages() -> None:
        tasks = []
        async for msg in gen.message_stream:
            tasks.append(asyncio.create_task(message(msg)))
        await asyncio.gather(*tasks)

    async def calls() -> None:
        async for call in gen.function_stream:
            out["calls"].append({"name": call.name, "call_id": call.call_id,
                                 "arguments": call.arguments})

    await asyncio.gather(messages(), calls())
    return out


async def conversation(args) -> dict[str, Any]:
    """Audio in; the server's turn detection answers; reply audio + transcript out."""
    model, session, rec, errors = new_session(args)
    gens: list[llm.GenerationCreatedEvent] = []
    transcripts: list[str] = []
    session.on("generation_created", gens.append)
    session.on("input_audio_transcription_completed",  # also fired for partials: keep finals
               lambda ev: transcripts.append(ev.transcript) if ev.is_final else None)
    try:
        updated = await wait_for(rec, "session.updated")
        await push_utterance(session, args)
        await wait_for(rec, "response.created", timeout=20)
        reply = await read_generation(gens[0])
        await wait_for(rec, "response.done", timeout=20)
        await asyncio.sleep(0.2)  # a user transcript may land just after the reply
    finally:
        await close(model, session)
    return {**rec.summary(), "client_errors": errors, "reply": reply, "user_transcripts": transcripts,
            "session": updated.get("session"),
            "chat_ctx_roles": [getattr(i, "role", i.type) for i in session.chat_ctx.items]}


async def generate_reply(args) -> dict[str, Any]:
    """``generate_reply(instructions=...)``: the future resolves with a user-initiated
    generation (the server echoes the response's metadata.client_event_id)."""
    model, session, rec, errors = new_session(args)
    try:
        await wait_for(rec, "session.updated")
        gen = await session.generate_reply(instructions="Say hello.")
        reply = await read_generation(gen)
    finally:
        await close(model, session)
    created = rec.first("response.created") or {}
    return {**rec.summary(), "client_errors": errors, "reply": reply,
            "response_metadata": (created.get("response") or {}).get("metadata")}


async def interrupt(args) -> dict[str, Any]:
    """``interrupt()`` as the reply's first audio plays: the reply stops."""
    model, session, rec, errors = new_session(args)
    fired: dict[str, Any] = {}

    def on_audio(seen: dict[str, Any]) -> None:
        if not fired:
            fired["at_audio_ms"] = seen["audio_ms"]
            fired["at_event"] = len(rec.events)
            session.interrupt()

    try:
        await wait_for(rec, "session.updated")
        gen = await session.generate_reply()
        reply = await read_generation(gen, on_audio=on_audio)
        done = await wait_for(rec, "response.done", timeout=10)
    finally:
        await close(model, session)
    return {**rec.summary(), "client_errors": errors, "reply": reply, "interrupted": fired,
            "done": done.get("response")}


@llm.function_tool
async def get_weather(city: str) -> str:
    """The weather in a city (the tool both tool scenarios register)."""
    return "sunny"


async def tool_round_trip(args) -> dict[str, Any]:
    """A function tool: the model calls it, the agent returns its output, the model answers."""
    model, session, rec, errors = new_session(args)

    try:
        await wait_for(rec, "session.updated")
        await session.update_tools([get_weather])
        first = await read_generation(await session.generate_reply())
        call = first["calls"][0] if first["calls"] else None
        second = None
        if call is not None:
            ctx = session.chat_ctx.copy()
            ctx.items.append(llm.FunctionCallOutput(call_id=call["call_id"], name=call["name"],
                                                    output="sunny", is_error=False))
            await session.update_chat_ctx(ctx)
            second = await read_generation(await session.generate_reply(tool_choice="none"))
    finally:
        await close(model, session)
    tools = [e for e in rec.events if e.get("type") == "session.updated"][-1]["session"].get("tools")
    return {**rec.summary(), "client_errors": errors, "first": first, "second": second,
            "session_tools": tools}


async def tool_choice_none(args) -> dict[str, Any]:
    """``generate_reply(tool_choice="none")`` with a tool registered: no call."""
    model, session, rec, errors = new_session(args)

    try:
        await wait_for(rec, "session.updated")
        await session.update_tools([get_weather])
        reply = await read_generation(await session.generate_reply(tool_choice="none"))
    finally:
        await close(model, session)
    return {**rec.summary(), "client_errors": errors, "reply": reply}


async def truncate(args) -> dict[str, Any]:
    """``truncate(audio_end_ms=...)`` of a reply that was heard only in part."""
    model, session, rec, errors = new_session(args)
    try:
        await wait_for(rec, "session.updated")
        reply = await read_generation(await session.generate_reply())
        message_id = reply["messages"][0]["id"]
        mark = len(rec.events)
        session.truncate(message_id=message_id, modalities=["audio", "text"], audio_end_ms=480)
        truncated = await wait_for(rec, "conversation.item.truncated", after=mark)
    finally:
        await close(model, session)
    return {**rec.summary(), "client_errors": errors, "reply": reply, "truncated": truncated}


if __name__ == "__main__":
    main({"conversation": conversation, "generate_reply": generate_reply, "interrupt": interrupt,
          "tool_round_trip": tool_round_trip, "tool_choice_none": tool_choice_none,
          "truncate": truncate})
