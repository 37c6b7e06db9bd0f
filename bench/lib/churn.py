"""Session churn against a live server: open, use, close, abandon and let
expire many realtime sessions — gracefully and abruptly — and report what is
left behind. Used by ``bench/reliability.py`` and ``tests/integration/test_leaks.py``.

Each session gets one of five fates (its index mod 5):

- ``graceful``: a text turn, then ``session.close``;
- ``cancelled``: a turn cancelled mid-reply, then ``session.close``;
- ``abrupt``: a turn, the socket dropped mid-reply (the session waits for a
  resume, then expires);
- ``abandoned``: opened and dropped at once (expires);
- ``resumed``: dropped mid-reply, resumed, finished, closed.
"""

from __future__ import annotations

import asyncio
import gc
from collections import Counter
from dataclasses import dataclass

import psutil
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError

FATES = ("graceful", "cancelled", "abrupt", "abandoned", "resumed")
TEXT_TURN = {"output_modalities": ["text"], "audio": {"input": {"turn_detection": None}},
             "max_output_tokens": 8}


@dataclass
class ChurnResult:
    fates: Counter[str]
    errors: list[str]
    seconds: float
    retries: Counter[str]


async def _turn(rt: RealtimeClient) -> None:
    await rt.send({"type": "session.update", "session": TEXT_TURN})
    await rt.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user",
        "content": [{"type": "input_text", "text": "Count from one to twenty."}]}})
    await rt.send({"type": "response.create"})


async def connect(url: str, api_key: str | None, retries: Counter[str]) -> RealtimeClient:
    """Admission is bounded (dropped sessions hold a slot through their grace
    window): ``resource_exhausted`` is retryable, so retry it, as a client should."""
    for _ in range(200):
        try:
            return await RealtimeClient.connect(url, api_key=api_key)
        except RealtimeError as err:
            if err.code != "resource_exhausted":
                raise
            retries["resource_exhausted"] += 1
            await asyncio.sleep(0.05)
    raise RuntimeError("admission refused for 10 s")


async def one_session(url: str, index: int, api_key: str | None,
                      retries: Counter[str] | None = None) -> str:
    fate = FATES[index % len(FATES)]
    rt = await connect(url, api_key, retries if retries is not None else Counter())
    if fate == "abandoned":
        await rt.close(end_session=False)
        return fate
    await _turn(rt)
    if fate == "graceful":
        await rt.wait_for("response.done", timeout=60)
        await rt.close()
    elif fate == "cancelled":
        await rt.wait_for("response.created", timeout=60)
        await rt.send({"type": "response.cancel"})
        await rt.wait_for("response.done", timeout=60)
        await rt.close()
    elif fate == "abrupt":
        await rt.wait_for("response.created", timeout=60)
        await rt.close(end_session=False)
    else:  # resumed
        await rt.wait_for("response.created", timeout=60)
        await rt.close(end_session=False)
        back = await rt.reconnect()
        await back.wait_for("response.done", timeout=60)
        await back.close()
    return fate


async def churn(url: str, sessions: int, *, api_key: str | None = None,
                concurrency: int = 16) -> ChurnResult:
    loop = asyncio.get_running_loop()
    started = loop.time()
    gate = asyncio.Semaphore(concurrency)
    fates: Counter[str] = Counter()
    retries: Counter[str] = Counter()
    errors: list[str] = []

    async def run(i: int) -> None:
        async with gate:
            try:
                fates[await one_session(url, i, api_key, retries)] += 1
            except Exception as exc:  # counted, not raised: the caller decides
                errors.append(f"session {i}: {exc!r}")

    await asyncio.gather(*(run(i) for i in range(sessions)))
    return ChurnResult(fates, errors, loop.time() - started, retries)


async def settle(runtime, timeout: float = 60.0) -> bool:
    """Wait until every session is gone (closed or expired) and the LLM stage
    holds no request; False on timeout."""
    deadline = asyncio.get_running_loop().time() + timeout
    llm = next((s for s in runtime.stages if getattr(s, "serves_text", False)), None)
    while asyncio.get_running_loop().time() < deadline:
        idle = llm is None or (llm.active_requests == 0
                               and llm.engine.get_num_unfinished_requests() == 0)
        if len(runtime.manager) == 0 and idle:
            return True
        await asyncio.sleep(0.05)
    return False


def rss_bytes() -> int:
    gc.collect()
    return psutil.Process().memory_info().rss
