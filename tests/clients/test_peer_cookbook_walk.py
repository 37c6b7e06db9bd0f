"""The OpenAI Cookbook's realtime eval "walk" harness (openai/openai-cookbook
``examples/evals/realtime_evals/walk_harness``) against our default server
(configs/cascade-cpu.yaml on the test session's vLLM engine), through the
official ``openai`` SDK with ``base_url`` pointing here.

Its data are here unmodified (tests/peers/cookbook_walk: the 11 customer
service examples, the three tools, the Acme Support instructions; MIT, see
SOURCES.md). Its code could not be brought in whole (SOURCES.md says why), so
``_walk_example`` replays its protocol step for step: the session it sends
(G.711 μ-law input at 8 kHz, turn detection off, PCM16 24 kHz output, the
tools, ``tool_choice`` auto), the buffer cleared, 20 ms appends sent as fast
as they go, a manual commit, ``response.create``, then events until
``response.done``, with its latency figures (first audio, first text, done,
from ``response.create``). Its clips are spoken here by Flite from each
example's ``user_text`` and μ-law encoded, as its generate_audio.py does with
OpenAI's TTS.

What must hold is the wire: each example completes, every event parses, the
latency of each example is recorded. Whether the right tool was called with the right
arguments (the harness's grade) is the model's; those are expected failures
with what SmolLM2-135M said: it calls no tool on these instructions (4,500
characters of them) and answers every example alike, "You can use the
following steps to help: 1. **Call the tool**: ..." (build/peers/cookbook_walk/
results.json has each answer and latency).
"""

from __future__ import annotations

import asyncio
import base64
import csv
import json
import time

import numpy as np
import pytest
import pytest_asyncio
import soxr
from openai import AsyncOpenAI
from support.clients import BUILD, invalid_events
from support.peers import PEERS
from support.speech_fixtures import RATE, cascade_runtime, speak
from support.twilio_phone import FRAME, mulaw_encode
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401  (vllm_stage: tests/conftest.py)
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

DATA = PEERS / "cookbook_walk"
EXAMPLES = list(csv.DictReader((DATA / "customer_service_synthetic.csv").open(encoding="utf-8")))
TOOLS = json.loads((DATA / "tools.json").read_text(encoding="utf-8"))
INSTRUCTIONS = (DATA / "system_prompt.txt").read_text(encoding="utf-8").strip()
RESPONSE_TIMEOUT_S = 60.0  # the harness's DEFAULT_RESPONSE_TIMEOUT_SECONDS, per event


def _clip(text: str) -> bytes:
    """The example spoken, as the harness's saved clips are: μ-law, mono, 8 kHz."""
    pcm = soxr.resample(speak(text), RATE, 8000)
    return mulaw_encode(np.clip(pcm, -32768, 32767).astype(np.int16))


async def _walk_example(client: AsyncOpenAI, example: dict[str, str]) -> dict:
    audio = _clip(example["user_text"])
    async with client.realtime.connect(model="gpt-realtime") as conn:
        await conn.session.update(session={
            "type": "realtime", "instructions": INSTRUCTIONS, "tools": TOOLS,
            "tool_choice": "auto", "output_modalities": ["audio"],
            "audio": {"input": {"format": {"type": "audio/pcmu"}, "turn_detection": None},
                      "output": {"format": {"type": "audio/pcm", "rate": 24000},
                                 "voice": "marin"}}})
        await conn.input_audio_buffer.clear()
        for i in range(0, len(audio), FRAME):
            await conn.input_audio_buffer.append(audio=base64.b64encode(audio[i:i + FRAME]).decode())
        await conn.input_audio_buffer.commit()
        start = time.monotonic()
        await conn.response.create(response={})
        events, first_audio, first_text = [], None, None
        while True:
            events.append(json.loads(await asyncio.wait_for(conn.recv_bytes(), RESPONSE_TIMEOUT_S)))
            kind, ms = events[-1]["type"], (time.monotonic() - start) * 1000
            if kind == "response.output_audio.delta" and first_audio is None:
                first_audio = ms
            if kind in ("response.output_audio_transcript.delta", "response.output_text.delta") \
                    and first_text is None:
                first_text = ms
            if kind == "response.done":
                break
    done = events[-1]["response"]
    calls = [{"name": o.get("name"), "arguments": o.get("arguments")}
             for o in done.get("output", []) if o.get("type") == "function_call"]
    said = " ".join(c.get("transcript") or c.get("text") or ""
                    for o in done.get("output", []) if o.get("type") == "message"
                    for c in o.get("content", []))
    return {"example_id": example["example_id"], "user_text": example["user_text"],
            "status": done["status"], "said": said, "calls": calls,
            "errors": [e["error"] for e in events if e["type"] == "error"],
            "invalid": invalid_events(events),
            "latency_first_audio_ms": first_audio, "latency_first_text_ms": first_text,
            "latency_response_done_ms": (time.monotonic() - start) * 1000}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def walked(vllm_stage) -> dict[str, dict]:
    results = {}
    async with BackgroundServer(cascade_runtime(vllm_stage)) as server:
        async with AsyncOpenAI(api_key="sk-local", base_url=server.http_url + "/v1",
                               websocket_base_url=f"ws://127.0.0.1:{server.port}/v1") as client:
            for example in EXAMPLES:
                results[example["example_id"]] = await _walk_example(client, example)
    out = BUILD / "peers" / "cookbook_walk"
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1))  # the harness's results.csv
    return results


def _expected(example: dict[str, str]) -> tuple[str, dict]:
    return example["gt_tool_call"], json.loads(example["gt_tool_call_arg"] or "{}")


IDS = [e["example_id"] for e in EXAMPLES]


@pytest.mark.parametrize("example_id", IDS)
async def test_each_example_completes_and_every_event_parses(walked, example_id):
    seen = walked[example_id]
    assert (seen["status"], seen["errors"], seen["invalid"]) == ("completed", [], []), seen


@pytest.mark.parametrize("example_id", IDS)
async def test_each_example_s_latency_is_recorded(walked, example_id):
    """The harness's three figures: audio came, and before the response was done."""
    seen = walked[example_id]
    assert seen["calls"] or seen["latency_first_audio_ms"] is not None, seen  # a call may come alone
    if seen["latency_first_audio_ms"] is not None:
        assert 0 < seen["latency_first_audio_ms"] <= seen["latency_response_done_ms"], seen


def _normalized(value: str) -> str:
    return "".join(ch for ch in str(value).lower() if ch.isalnum())


@pytest.mark.parametrize("example", [
    pytest.param(e, id=e["example_id"], marks=pytest.mark.xfail(
        strict=False, reason="the harness's grade (the expected tool, its arguments) is the "
        "model's: SmolLM2-135M called no tool and said 'You can use the following steps to "
        "help: 1. **Call the tool**: ...' to each example (the three that expect no call pass)"))
    for e in EXAMPLES])
async def test_model_graded(walked, example):
    """The harness's grade: the expected tool (or none) with the expected arguments."""
    seen = walked[example["example_id"]]
    name, args = _expected(example)
    got = [(c["name"], json.loads(c["arguments"] or "{}")) for c in seen["calls"]]
    if not name:
        assert got == [], seen
        return
    assert any(n == name and all(_normalized(a.get(k, "")) == _normalized(v) for k, v in args.items())
               for n, a in got), seen
