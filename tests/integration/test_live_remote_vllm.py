"""A GPT-Live delegation on a real external Responses backend: vLLM's own
OpenAI-compatible server (``vllm.entrypoints.openai.api_server``, SmolLM2 on
the CPU, tool calls parsed by its ``hermes`` parser) on loopback, named in
the deployment's ``responses_backends``. The ``openai`` SDK's live client
speaks to the scripted voice, whose reply calls the delegation's tool: the
turn runs on vLLM's ``/v1/responses``, its stream comes back as
``session.delegation.created`` + ``response.event`` (every frame and every
nested Responses event validated by the SDK's models), the backend's
function call goes to the client, whose output and ``response.create``
continue the run on the same backend with the full input, and the voice
speaks when the backend has answered in words.

The backend is a second vLLM engine beside the suite's: started eager
(``--enforce-eager``, no compilation), small (``--max-model-len 2048``,
``VLLM_CPU_KVCACHE_SPACE=1``), once for the module.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator

import httpx
import pytest
from support.clients import tools_config
from support.live_kit import live, started
from support.live_shapes import responses_event
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    b64,
    chunks,
    module_server,
    no_leaked_tasks,
    silence,
    utterance,
)
from vllm_duplex.assets.prepare import prepared_model_dir
from vllm_duplex.domain.backends import ResponsesBackend
from vllm_duplex.realtime.server.serving import free_port

pytestmark = pytest.mark.asyncio(loop_scope="module")

HOST = "127.0.0.1"
START_TIMEOUT_S = 300.0  # ~60-90 s on a quiet 2-core CPU; more when other engines share it
WEATHER = {"type": "function", "name": "get_weather",
           "description": "Get the current weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                          "required": ["city"]}}

server = module_server(tools_config())


def stop_group(proc: subprocess.Popen) -> None:
    for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def vllm_backend(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ResponsesBackend]:
    port = free_port(HOST)
    log = tmp_path_factory.mktemp("vllm-backend") / "server.log"
    # One OpenMP thread on the first core: the suite's engine is bound to the
    # last ones (domain/machine.py), and threads of two engines spinning on the
    # same cores wait on each other's barriers (minutes per request on 2 cores).
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1",
           "VLLM_CPU_OMP_THREADS_BIND": str(min(os.sched_getaffinity(0)))}
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server",
             "--model", str(prepared_model_dir()), "--served-model-name", "smollm2",
             "--host", HOST, "--port", str(port), "--dtype", "float32", "--enforce-eager",
             "--max-model-len", "2048", "--enable-auto-tool-choice",
             "--tool-call-parser", "hermes"],
            stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    try:
        started = time.monotonic()
        deadline = started + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vLLM's server exited: {log.read_text()[-3000:]}")
            try:
                if httpx.get(f"http://{HOST}:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"vLLM's server did not start in {START_TIMEOUT_S:g} s: "
                            f"{log.read_text()[-3000:]}")
            time.sleep(1.0)
        print(f"vLLM's server up in {time.monotonic() - started:.0f} s")
        yield ResponsesBackend("vllm", f"http://{HOST}:{port}/v1", "smollm2", timeout_s=120.0)
    finally:
        stop_group(proc)


async def speak(conn) -> None:
    for chunk in chunks(utterance() + silence(0.5)):
        await conn.session.input_audio.append(audio=b64(chunk))


async def run_of(events, delegation_id: str) -> list[dict]:
    """The ``response.event``s of one run, each validated, to its end."""
    out = []
    while True:
        frame = await events.until("response.event", timeout=120)
        assert frame.delegation_id == delegation_id
        responses_event(frame.event)
        out.append(frame.event)
        if frame.event["type"] in ("response.completed", "response.incomplete",
                                   "response.failed"):
            return out


async def test_a_spoken_turn_runs_on_vllms_responses_endpoint_with_a_tool_call(
        server, vllm_backend):
    server.runtime.sessions.responses_backends = {"vllm": vllm_backend}
    try:
        async with live(server) as conn:
            events, _ = await started(conn, delegation={"type": "responses", "responses": {
                "model": "vllm", "tools": [WEATHER], "tool_choice": "required",
                "instructions": "You answer weather questions with get_weather.",
                "max_output_tokens": 48}})
            await speak(conn)
            created = await events.until("session.delegation.created", timeout=60)
            assert created.delegation.target == "responses"
            assert created.delegation.response_id.startswith("resp_")  # the remote's own id
            first = await run_of(events, created.delegation.id)
            assert first[0]["type"] == "response.created"
            assert first[0]["response"]["id"] == created.delegation.response_id
            assert first[-1]["type"] == "response.completed"
            [call] = [e["item"] for e in first if e["type"] == "response.output_item.done"]
            assert call["type"] == "function_call" and call["name"] == "get_weather"
            assert not events.of("session.output_audio.delta")  # the voice waits for the answer

            await conn.response.item.create(item={
                "type": "function_call_output", "call_id": call["call_id"],
                "output": json.dumps({"city": "Paris", "celsius": 18, "sky": "sunny"})})
            await conn.response.create(event_id="go_1")
            second = await run_of(events, created.delegation.id)
            assert second[0]["type"] == "response.created"
            assert second[0]["response"]["id"] != created.delegation.response_id  # a new run
            assert second[-1]["type"] in ("response.completed", "response.incomplete")
            words = "".join(e["delta"] for e in second
                            if e["type"] == "response.output_text.delta")
            assert words.strip()  # the backend answered in words, which the voice now speaks
            await events.until("session.output_audio.delta", timeout=60)
            await events.until("session.usage.updated", timeout=60)
        assert not events.of("error")
    finally:
        server.runtime.sessions.responses_backends = {}
