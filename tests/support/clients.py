"""Running the real client libraries (LiveKit Agents, Pipecat, the OpenAI Agents
SDK, Playwright) against a server a test started.

They live in their own virtualenv, ``.venv-clients`` (``scripts/setup.sh``
makes it): their pins clash with ours (the Agents SDK wants websockets < 17,
Pipecat protobuf < 7, soxr 1.0). Each is driven by a script in
``tests/clients/drivers`` that prints what it observed as JSON; the tests
decide what is right. Without that environment the tests skip, except in CI
(``CI`` set), where a missing client environment is a failure.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import typing
import wave
from pathlib import Path
from typing import Any

import pydantic
import pytest
from openai.types.realtime import RealtimeServerEvent
from vllm_duplex.host.deploy import DeployConfig, StageSpec

from support.realtime_fixtures import scripted_config

ROOT = Path(__file__).resolve().parents[2]
CLIENT_PYTHON = ROOT / ".venv-clients" / "bin" / "python"
DRIVERS = ROOT / "tests" / "clients" / "drivers"
BUILD = ROOT / "build"  # screenshots
# The browser SDK (@openai/agents-realtime, npm), installed by scripts/setup.sh
AGENTS_RT_BUNDLE = (ROOT / ".venv-clients" / "npm" / "node_modules" / "@openai" / "agents-realtime"
                    / "dist" / "bundle" / "openai-realtime-agents.mjs")
# What every client's default turn gets from the scripted pipeline (configs/scripted.yaml).
TOOL_ARGUMENTS = '{"city": "Paris"}'


def require_clients_env() -> None:
    if CLIENT_PYTHON.exists():
        return
    message = f"{CLIENT_PYTHON} is missing: run scripts/setup.sh (it makes the clients' virtualenv)"
    if os.environ.get("CI"):
        pytest.fail(message)
    pytest.skip(message)


def tools_config(**limits: Any) -> DeployConfig:
    """The scripted pipeline whose LLM calls a tool when a response may call one
    (``call_tools``), with arguments the clients' ``get_weather(city)`` accepts."""
    config = scripted_config(**limits)
    stages = tuple(StageSpec(s.type, {**s.options, "call_tools": True,
                                      "tool_arguments": TOOL_ARGUMENTS})
                   if s.type == "scripted_llm" else s for s in config.stages)
    return dataclasses.replace(config, stages=stages)


def write_wav(path: Path, pcm16: bytes, rate: int = 24000) -> Path:
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm16)
    return path


async def run_driver(driver: str, http_url: str, *args: str, timeout: float = 120.0,
                     env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run ``drivers/<driver>.py`` in the clients' environment; its observations by scenario.

    Asynchronous: the server under test runs in this event loop."""
    require_clients_env()
    proc = await asyncio.create_subprocess_exec(
        str(CLIENT_PYTHON), str(DRIVERS / f"{driver}.py"), "--base-url", http_url, *args,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=str(ROOT),
        env={**os.environ, "OPENAI_API_KEY": "sk-local", "PYTHONUNBUFFERED": "1", **(env or {})})
    try:
        out, err = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"{driver} did not finish within {timeout:g} s") from None
    lines = out.decode(errors="replace").strip().splitlines()
    if proc.returncode != 0 or not lines:
        tail = err.decode(errors="replace")[-4000:]
        raise AssertionError(f"{driver} exited {proc.returncode}:\n{tail}")
    return json.loads(lines[-1])


def scenario(results: dict[str, Any], name: str) -> dict[str, Any]:
    """One scenario's observations; a scenario that raised fails the test with its traceback."""
    seen = results[name]
    assert "exception" not in seen, f"{name}: {seen['exception']}\n{seen.get('traceback', '')}"
    return seen


def _sdk_classes() -> dict[str, type[pydantic.BaseModel]]:
    """GA event type -> its class in the ``openai`` SDK's ``RealtimeServerEvent`` union."""
    union = typing.get_args(RealtimeServerEvent)[0]  # Annotated[Union[...], discriminator]
    return {typing.get_args(cls.model_fields["type"].annotation)[0]: cls
            for cls in typing.get_args(union)}


SDK_CLASSES = _sdk_classes()


def invalid_events(events: list[dict[str, Any]]) -> list[str]:
    """Why each event does not validate against its SDK class (pydantic validation,
    where the SDK's own parser constructs without checking, as the Agents SDK does)."""
    bad = []
    for event in events:
        wire = {k: v for k, v in event.items() if k != "_recv_t"}
        try:
            SDK_CLASSES[event["type"]].model_validate_json(json.dumps(wire))
        except pydantic.ValidationError as exc:
            bad.append(f"{event['type']}: {[(e['loc'], e['msg']) for e in exc.errors()]}")
    return bad
