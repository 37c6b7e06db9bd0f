"""A raw-socket client on a speaker and a microphone in a room (the device
of issue 44: a Raspberry Pi, a kiosk, a Python client on a laptop): it plays
each reply delta as it arrives, at real time after what its speaker holds;
its microphone hears the user and the speaker through the room
(``vllm_duplex.testing.room``) and streams in 20 ms chunks at real time. It
behaves as an OpenAI client does: at ``speech_started`` it stops its
playback and truncates the item to what it played."""

from __future__ import annotations

import asyncio
import base64
import time
from collections.abc import Callable
from typing import Any

import numpy as np
from vllm_duplex.realtime.client.realtime import RealtimeClient
from vllm_duplex.testing.room import Room

CHUNK_MS = 20


async def talk_in_room(client: RealtimeClient, room: Room, voice: np.ndarray, *,
                       done: Callable[[list[dict[str, Any]]], bool], max_s: float = 120.0,
                       tail_s: float = 1.0,
                       over_reply: tuple[float, np.ndarray] | None = None) -> int | None:
    """Stream the room's microphone (the user's ``voice`` from the start,
    then silence) until ``done(events)`` and the speaker ran dry ``tail_s``
    ago, or ``max_s``. ``over_reply`` = (s, pcm): the user also says ``pcm``
    ``s`` seconds after the first reply starts playing (double talk);
    returns the sample where it began (None if no reply played)."""
    rate = room.rate
    said_at: list[int] = []
    line = np.zeros(room.played.size, np.float64)  # what the user says, when
    line[:voice.size] = voice[:line.size]
    step = rate * CHUNK_MS // 1000
    t0 = time.monotonic()
    playing: dict[str, int] = {}  # item id -> the sample its audio started playing
    sent: dict[str, int] = {}  # item id -> samples of it received

    def now() -> int:
        return int((time.monotonic() - t0) * rate)

    async def listen() -> None:
        while True:
            event = await client.recv()
            kind = event["type"]
            if kind == "response.output_audio.delta":
                pcm = np.frombuffer(base64.b64decode(event["delta"]), "<i2")
                start = room.play(pcm, now())
                playing.setdefault(event["item_id"], start)
                if over_reply is not None and not said_at:
                    said_at.append(start + int(over_reply[0] * rate))
                    words = over_reply[1][:max(0, line.size - said_at[0])]
                    line[said_at[0]:said_at[0] + words.size] += words
                sent[event["item_id"]] = sent.get(event["item_id"], 0) + pcm.size
            elif kind == "input_audio_buffer.speech_started" and room.play_end > now():
                at = now()
                room.stop(at)
                for item, start in playing.items():
                    if start < at < start + sent[item]:
                        await client.send({"type": "conversation.item.truncate", "item_id": item,
                                           "content_index": 0,
                                           "audio_end_ms": (at - start) * 1000 // rate})

    listener = asyncio.create_task(listen())
    try:
        i = 0
        while time.monotonic() - t0 < max_s:
            await asyncio.sleep(max(0.0, t0 + (i + 1) * CHUNK_MS / 1000 - time.monotonic()))
            if listener.done():
                listener.result()  # the socket failed: say why
            start = i * step
            await client.append_audio(room.mic(start, step, line[start:start + step])
                                      .astype("<i2").tobytes())
            i += 1
            if done(client.events) and room.play_end + tail_s * rate < start:
                break
    finally:
        listener.cancel()
        await asyncio.gather(listener, return_exceptions=True)
    return said_at[0] if said_at else None
