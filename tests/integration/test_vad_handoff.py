"""Silero judged inline (``SileroVadStage(inline=True)``): the onset decision
leaves the stage with the chunk that makes it (issue 44 item 3: a barge-in
heard within 100 ms of its onset, every time).

The windows are judged on the event loop, in the ``submit`` that brings the
chunk: no worker thread has to get a core and the GIL first, which on a
loaded 2-core machine let chunks queue for it (``bench/vad_handoff.py``).
Deterministic: which chunk decides is the audio's (sample counts), and the
event is checked before the next chunk.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import numpy as np
from support.speech_fixtures import speak
from vllm_duplex.domain.clock import MonotonicClock
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import (
    AudioIn,
    StageFailed,
    StageInput,
    VadConfig,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.stages.listening.silero_vad import SileroVadStage

RATE = 16000
CHUNK = 320  # 20 ms, as a socket sends it
FENCE = Fence("s1")
CONFIG = VadConfig(prefix_padding_ms=0, silence_duration_ms=300)


def utterance() -> np.ndarray:
    said = speak("Stop, wait a moment please.")
    gap = np.zeros(RATE // 2, np.int16)
    return np.concatenate([gap, said, gap, gap])


def item(payload: Any, k: int = 0) -> StageInput:
    return StageInput(FENCE, FENCE.request_id(f"in{k}"), payload)


def deciding_chunk(stage: SileroVadStage, pcm: np.ndarray) -> int:
    """The chunk whose arrival starts speech, from the VAD alone."""
    vad = stage.new_vad()
    vad.configure(CONFIG)
    for k in range(len(pcm) // CHUNK):
        if any(isinstance(e, VadSpeechStarted)
               for e in vad.feed(pcm[k * CHUNK:(k + 1) * CHUNK], k * 20)):
            return k
    raise AssertionError("no onset in the utterance")


async def heard(stage: SileroVadStage, pcm: np.ndarray) -> tuple[list[tuple[int, Any]], Any]:
    """(index of the last chunk submitted when it came out, payload), every
    chunk given the loop a few turns, as a socket's 20 ms would."""
    port = stage.port("s1")
    await port.open(FENCE)
    out: list[tuple[int, Any]] = []
    k = -1

    async def read() -> None:
        async for o in port.outputs():
            out.append((k, o.payload))

    reader = asyncio.create_task(read())
    await port.submit(item(CONFIG))
    for k in range(len(pcm) // CHUNK):
        await port.submit(item(AudioIn(pcm[k * CHUNK:(k + 1) * CHUNK], k * 20), k))
        for _ in range(3):
            await asyncio.sleep(0)
    await port.drained()
    await port.close()
    await reader
    return out, port


async def test_the_onset_leaves_with_its_chunk_while_every_worker_thread_is_busy():
    stage = SileroVadStage(clock=MonotonicClock(), workers=1, inline=True)
    busy = threading.Event()
    stage.run_later(busy.wait)  # the stage's one worker thread never comes back in time
    try:
        pcm = utterance()
        decides = deciding_chunk(stage, pcm)
        out, _ = await heard(stage, pcm)
    finally:
        busy.set()
        await stage.close()
    started = [k for k, p in out if isinstance(p, VadSpeechStarted)]
    assert started == [decides]  # no later chunk, no thread, no wait
    assert [type(p) for _, p in out] == [VadSpeechStarted, VadSpeechStopped]


async def test_inline_and_worker_thread_ports_hear_the_same():
    pcm = utterance()
    payloads = []
    for inline in (True, False):
        stage = SileroVadStage(clock=MonotonicClock(), inline=inline)
        try:
            out, _ = await heard(stage, pcm)
        finally:
            await stage.close()
        payloads.append([p for _, p in out])
    assert payloads[0] == payloads[1]
    assert [type(p) for p in payloads[0]] == [VadSpeechStarted, VadSpeechStopped]


class FailsOnce:
    """The real model, whose first call raises (as onnxruntime does on a
    broken input or a lost allocation)."""

    def __init__(self, model: Any) -> None:
        self.model, self.failed = model, False

    def new_state(self) -> np.ndarray:
        return self.model.new_state()

    def infer(self, x: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        if not self.failed:
            self.failed = True
            raise RuntimeError("onnxruntime: the call failed")
        return self.model.infer(x, state)


async def test_a_chunk_the_model_fails_on_fails_alone_and_listening_goes_on():
    stage = SileroVadStage(clock=MonotonicClock(), inline=True)
    stage.model = FailsOnce(stage.model)  # the ports' VADs are made from it
    port = stage.port("s1")
    await port.open(FENCE)
    pcm = np.concatenate([np.full(2 * CHUNK, 3000, np.int16), utterance()])
    try:
        for k in range(len(pcm) // CHUNK):
            await port.submit(item(AudioIn(pcm[k * CHUNK:(k + 1) * CHUNK], k * 20), k))
        await port.close()
        payloads = [o.payload async for o in port.outputs()]
    finally:
        await stage.close()
    assert isinstance(payloads[0], StageFailed) and "onnxruntime" in payloads[0].error.message
    assert [type(p) for p in payloads[1:]] == [VadSpeechStarted, VadSpeechStopped]
    assert stage.failed_requests == 1 and stage.completed_requests == len(pcm) // CHUNK - 1
