"""One spoken question in its own realtime session, timed as it arrives (the
turn of ``fast_turns.py``; ``barge_in.py``, ``hearing.py`` and ``capacity.py``
ask theirs the same way): Flite speaks it at real time into an open
microphone, and the turn gap, the TTFA after ``speech_stopped``, the visible
revisions, the answer and the server's critical path are read from the events.
"""

from __future__ import annotations

import asyncio
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))

from support.speech_fixtures import RATE, chunks, speak  # noqa: E402
from vllm_duplex.realtime.client.realtime import RealtimeClient  # noqa: E402

from .sides import Server  # noqa: E402
from .speech_corpus import right_answer  # noqa: E402

QUESTIONS = (  # (text, voice, a word the right answer holds)
    ("What is the capital of France?", "slt", "paris"),
    ("What is the largest ocean?", "rms", "pacific"),
    ("Where is the Eiffel Tower?", "awb", "paris"),
    ("What is the capital of Italy?", "kal16", "rome"),
    ("How many days are in a week?", "slt", "seven"),
)
MODES = {"semantic": {"type": "semantic_vad", "eagerness": "auto"},
         "server": {"type": "server_vad", "silence_duration_ms": 500}}
LOUD = 300  # |sample| above this is speech (Flite pads with digital silence)


@dataclass
class Turn:
    side: str
    mode: str
    stage: str  # fresh | warm
    question: str
    gap_ms: float | None = None
    ttfa_ms: float | None = None
    revisions: int = 0  # replies the client saw start, then cancelled
    answered: bool = False  # a reply completed within the turn's 40 s
    right: bool = False
    answer: str = ""
    path: str = ""
    metadata: dict[str, str] = field(default_factory=dict)
    events: list[dict[str, Any]] = field(default_factory=list)  # of a revised or unanswered turn



def last_loud_s(pcm: np.ndarray) -> float:
    loud = np.flatnonzero(np.abs(pcm.astype(np.int32)) > LOUD)
    return float(loud[-1] + 1) / RATE


async def ask(server: Server, mode: str, stage: str, text: str, voice: str, expect: str,
              tail_s: float = 6.0) -> Turn:
    """One question in its own session, the microphone open until the reply is done."""
    pcm = speak(text, voice=voice, tail_s=tail_s)
    turn = Turn(server.side, mode, stage, text)
    async with await RealtimeClient.connect(server.url) as client:
        server.sessions += 1
        await client.update_session({"audio": {"input": {"turn_detection": MODES[mode]}}})
        start = time.monotonic()

        async def send() -> None:
            for i, chunk in enumerate(chunks(pcm)):
                await client.append_audio(chunk)
                await asyncio.sleep(max(0.0, start + (i + 1) * 0.02 - time.monotonic()))

        sender = asyncio.ensure_future(send())
        answered: dict[str, Any] | None = None
        try:
            while answered is None and time.monotonic() - start < 40:
                try:
                    event = await client.recv(timeout=1.0)
                except TimeoutError:
                    continue
                if event["type"] == "response.done":
                    resp = event["response"]
                    if resp.get("status") == "cancelled":
                        turn.revisions += 1
                    else:
                        answered = resp
        finally:
            sender.cancel()
            await asyncio.gather(sender, return_exceptions=True)
    end = start + last_loud_s(pcm)
    events = client.events
    if answered is not None:
        rid = answered["id"]
        audio = [e["_recv_t"] for e in events
                 if e["type"] == "response.output_audio.delta" and e.get("response_id") == rid]
        stopped = [e["_recv_t"] for e in events if e["type"] == "input_audio_buffer.speech_stopped"]
        if audio:
            turn.gap_ms = (audio[0] - end) * 1000
            if stopped:
                turn.ttfa_ms = (audio[0] - stopped[-1]) * 1000
        turn.answer = "".join(e.get("delta", "") for e in events
                              if e["type"] == "response.output_audio_transcript.delta"
                              and e.get("response_id") == rid)
        turn.right = right_answer(turn.answer, (expect,))
        turn.metadata = answered.get("metadata") or {}
        turn.path = turn.metadata.get("duplex_critical_path", "")
        if turn.path and turn.gap_ms is not None:
            # The server's path starts when the end of speech reached it and
            # ends when it sent the first audio: the rest of the client's gap
            # is the socket, both ways (and the client's own loop).
            server_ms = sum(float(part.rsplit(" ", 1)[1]) for part in turn.path.split(", "))
            turn.path += f", socket {max(0.0, turn.gap_ms - server_ms):.0f}"
    turn.answered = answered is not None
    if turn.revisions or answered is None:  # kept for --json: what the client saw, in order
        turn.events = [{k: e[k] for k in ("type", "_recv_t", "delta", "transcript", "response")
                        if k in e} for e in events if not e["type"].endswith("audio.delta")]
    return turn
