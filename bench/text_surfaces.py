"""Time to first token of the HTTP text surfaces, against a baseline run in
the same process: the stateless ``POST /v1/generate`` with the whole history
(a fresh prefix each time, so nothing is cached).

- **session continuation**: an application session that already holds the
  history in its live vLLM request answers the next message
  (``POST /v1/sessions/{id}/generate``): only the new message is prefilled.
- **streaming input**: the same next message streamed into
  ``WS /v1/generate/stream`` bound to such a session, word by word at 300 ms
  a word; TTFT from ``end`` to the first ``text-delta``.
- **stateless, prefix cached**: the same stateless request twice (vLLM's
  prefix cache), for reference.
- **gRPC** (``serve --grpc-port``, same process, same engine): the session
  continuation by unary ``OpenEngine.Generate`` with ``max_tokens: 1`` (its
  answer *is* the first token: unary has no earlier event), and streaming
  input into a session by ``OpenEngineStreaming.GenerateStream`` (from
  ``end`` to the first ``text_delta``), beside the HTTP paths.

Every figure is the median over ``--reps`` fresh histories (a nonce at the
start of the system prompt defeats the prefix cache). Run::

    .venv/bin/python bench/text_surfaces.py --reps 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
import uuid

import grpc
import httpx
import websockets
from vllm_duplex.realtime.client.grpc_client import OpenEngineClient
from vllm_duplex.realtime.client.grpc_client import request as grpc_request
from vllm_duplex.realtime.wire.openengine.v1 import engine_pb2 as e
from vllm_duplex.domain.payloads import ContextMessage
from vllm_duplex.host.deploy import load_config
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.realtime.server.serving import BackgroundServer
from lib import machine  # noqa: E402  (bench/lib/; bench/ is the script's directory)
from lib.voice_llm_ttft import HISTORY, SYSTEM  # noqa: E402  (same long context as the voice bench)

QUESTION = "And how much does it cost to take a second checked bag on that flight?"
OPTIONS = {"max_tokens": 4, "temperature": 0.0}


def history(nonce: str) -> list[dict[str, str]]:
    return [{"role": "system", "content": f"[{nonce}] {SYSTEM}"},
            *({"role": r, "content": t} for r, t in HISTORY)]


async def first_delta(http: httpx.AsyncClient, path: str, body: dict) -> float:
    start = time.perf_counter()
    async with http.stream("POST", path, json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("event: text-delta") or line.startswith("event: tool-call"):
                return time.perf_counter() - start
    raise RuntimeError(f"no output from {path}")


async def stateless(http: httpx.AsyncClient, model: str, messages: list) -> float:
    return await first_delta(http, "/v1/generate", {"model": model, "messages": messages,
                                                    "options": OPTIONS})


async def warm_session(http: httpx.AsyncClient, model: str, nonce: str) -> str:
    """A session whose live request holds ``history(nonce)`` (one short turn prefills it)."""
    messages = history(nonce)
    sid = (await http.post("/v1/sessions", json={"model": model, "messages": messages[:-1]})).json()["id"]
    r = await http.post(f"/v1/sessions/{sid}/generate", json={
        "messages": [messages[-1]], "stream": False, "options": {"max_tokens": 1}})
    assert r.status_code == 200, r.text
    return sid


async def streamed(base_ws: str, sid: str) -> float:
    async with websockets.connect(base_ws + "/v1/generate/stream") as ws:
        await ws.send(json.dumps({"type": "start", "session_id": sid, "options": OPTIONS}))
        json.loads(await ws.recv())
        for seq, word in enumerate(QUESTION.split(), start=1):
            await ws.send(json.dumps({"type": "input", "seq": seq, "text": word + " "}))
            json.loads(await ws.recv())
            await asyncio.sleep(0.3)
        start = time.perf_counter()
        await ws.send(json.dumps({"type": "end"}))
        while json.loads(await ws.recv())["type"] != "text-delta":
            pass
        return time.perf_counter() - start


async def grpc_continuation(g: OpenEngineClient, sid: str) -> float:
    start = time.perf_counter()
    await g.generate(messages=[{"role": "user", "content": QUESTION}], session=sid, max_tokens=1)
    return time.perf_counter() - start


async def grpc_streamed(g: OpenEngineClient, sid: str) -> float:
    call = g.streaming.GenerateStream(metadata=g.metadata)
    await call.write(e.GenerateStreamRequest(start=grpc_request(session=sid, **OPTIONS)))
    await call.read()
    for seq, word in enumerate(QUESTION.split(), start=1):
        await call.write(e.GenerateStreamRequest(input=e.InputChunk(seq=seq, text=word + " ")))
        await call.read()
        await asyncio.sleep(0.3)
    start = time.perf_counter()
    await call.write(e.GenerateStreamRequest(end=e.EndOfInput()))
    await call.done_writing()
    while not (await call.read()).HasField("text_delta"):
        pass
    took = time.perf_counter() - start
    while await call.read() is not grpc.aio.EOF:
        pass
    return took


async def main(reps: int) -> None:
    runtime = Runtime(load_config("cascade-cpu"))
    async with BackgroundServer(runtime, grpc_port=0) as server, \
            OpenEngineClient(server.grpc_target) as g:
        model = runtime.model
        base_ws = server.http_url.replace("http", "ws", 1)
        stage = runtime.text.generator.stage
        ask = {"role": "user", "content": QUESTION}
        figures: dict[str, list[float]] = {k: [] for k in (
            "stateless", "cached", "session", "streamed", "grpc_session", "grpc_streamed")}
        async with httpx.AsyncClient(base_url=server.http_url, timeout=300) as http:
            await stateless(http, model, [ask])  # warm-up
            for _ in range(reps):
                messages = [*history(uuid.uuid4().hex), ask]
                figures["stateless"].append(await stateless(http, model, messages))
                figures["cached"].append(await stateless(http, model, messages))
                sid = await warm_session(http, model, uuid.uuid4().hex)
                figures["session"].append(await first_delta(
                    http, f"/v1/sessions/{sid}/generate", {"messages": [ask], "options": OPTIONS}))
                await http.delete(f"/v1/sessions/{sid}")
                sid = await warm_session(http, model, uuid.uuid4().hex)
                figures["streamed"].append(await streamed(base_ws, sid))
                await http.delete(f"/v1/sessions/{sid}")
                sid = await warm_session(http, model, uuid.uuid4().hex)
                figures["grpc_session"].append(await grpc_continuation(g, sid))
                await http.delete(f"/v1/sessions/{sid}")
                sid = await warm_session(http, model, uuid.uuid4().hex)
                figures["grpc_streamed"].append(await grpc_streamed(g, sid))
                await http.delete(f"/v1/sessions/{sid}")
        context = tuple(ContextMessage(m["role"], m["content"]) for m in [*history("x" * 32), ask])
        chat = stage.host.chat
        tokens = len(chat.encode(chat.render(context, True)))
    base = statistics.median(figures["stateless"])
    print(machine.line())
    print(f"TTFT of a {tokens}-token context, median of {reps} (SmolLM2-135M float32):")
    for name, label in (("stateless", "stateless /v1/generate (baseline)"),
                        ("cached", "stateless, prefix cached"),
                        ("session", "session continuation"),
                        ("streamed", "streaming input into a session (from end)"),
                        ("grpc_session", "gRPC session continuation (unary, 1 token)"),
                        ("grpc_streamed", "gRPC GenerateStream into a session (from end)")):
        med = statistics.median(figures[name])
        print(f"  {label:45s} {med * 1000:7.1f} ms  ({med / base:.2f}x)")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=5)
    asyncio.run(main(parser.parse_args().reps))
