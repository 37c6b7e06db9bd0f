"""A real server with the real vLLM engine for the text-surface tests (HTTP
generate, application sessions, streaming input, resumable streams).

One server per test session, on the session-scoped vLLM engine
(``vllm_fixtures.vllm_stage``); tests run in the session loop::

    pytestmark = pytest.mark.asyncio(loop_scope="session")
    from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
    # text_server and vllm_stage are fixtures of tests/conftest.py
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
from vllm_duplex.host.deploy import load_config
from vllm_duplex.host.runtime import Runtime

MODEL = "smollm2-135m-instruct"
KEYS = ("key-alice", "key-bob")
# SmolLM2-135M's greedy answer to a bare question follows the CPU's numerics:
# with the chat template's own system prompt, "What is the capital of France?"
# is "Paris" in float32 and "L'Étoile, la Marseillaise..." in bfloat16, while
# "... of Italy?" goes the other way. With an instruction both answer every
# capital of the QA set alike (bench/decode_settings.py, docs/machines.md),
# so the tests ask as an app would, with one.
INSTRUCTIONS = "You are a helpful assistant. Answer in one short sentence."
INSTRUCTED = {"role": "system", "content": INSTRUCTIONS}
FRANCE = [INSTRUCTED, {"role": "user", "content": "What is the capital of France?"}]
WEATHER_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather of a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                               "required": ["city"]}}


def text_runtime(vllm_stage: Any, **limits: Any) -> Runtime:
    """The default deployment (cascade-cpu) with API keys, on the shared engine."""
    config = load_config("cascade-cpu")
    limits = {"resume_grace_s": 0.0, **limits}  # dropped realtime sockets end their sessions
    config = dataclasses.replace(config, api_keys=KEYS,
                                 limits=dataclasses.replace(config.limits, **limits))
    return Runtime(config, shared_stages={"vllm": vllm_stage})


def durable_text_runtime(vllm_stage: Any, redis_url: str, instance_id: str, *,
                         lease_ttl_s: float = 1.0, **limits: Any) -> Runtime:
    """``text_runtime`` as one worker of several sharing a Redis store
    (``durability: {store: redis, url}``): what outlives a worker there."""
    from vllm_duplex.host.store_config import StoreConfig

    config = load_config("cascade-cpu")
    config = dataclasses.replace(
        config, api_keys=KEYS,
        durability=StoreConfig(store="redis", url=redis_url, lease_ttl_s=lease_ttl_s),
        limits=dataclasses.replace(config.limits, resume_grace_s=0.0, **limits))
    return Runtime(config, shared_stages={"vllm": vllm_stage}, instance_id=instance_id)


def auth(key: str = KEYS[0]) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


def client(server: Any, key: str = KEYS[0]) -> httpx.AsyncClient:
    """An HTTP client of ``server`` with ``key``'s bearer token (a generation
    on the CPU engine can take a while: a generous timeout)."""
    return httpx.AsyncClient(base_url=server.http_url, timeout=120, headers=auth(key))


async def sse_events(response: httpx.Response) -> AsyncIterator[tuple[int | None, str, dict[str, Any]]]:
    """(id, event, data) of each SSE event of a streaming ``httpx`` response."""
    seq: int | None = None
    event = "message"
    async for line in response.aiter_lines():
        if line.startswith("id:"):
            seq = int(line[3:].strip())
        elif line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            yield seq, event, json.loads(line[5:])
            seq, event = None, "message"
