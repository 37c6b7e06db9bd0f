"""Responses backends that misbehave, on loopback, for the control-plane tests
of GPT-Live's external delegation (``realtime/server/live/backend.py``): one
that answers an HTTP error, one whose stream is not a Responses stream, one
that never answers; and a port where nothing listens. The real backend, vLLM's
own server, is in ``tests/integration/test_live_remote_vllm.py``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from vllm_duplex.domain.backends import ResponsesBackend
from vllm_duplex.realtime.server.serving import free_port

HOST = "127.0.0.1"


class Misbehaving:
    """The routes: ``/<mode>/v1/responses``; ``asked`` counts the requests,
    ``open`` the requests still being answered (a hung one until its client
    closes it)."""

    def __init__(self) -> None:
        self.asked = 0
        self.open = 0
        self.keys: list[str | None] = []

    async def responses(self, request: Request) -> Response:
        self.asked += 1
        self.keys.append(request.headers.get("authorization"))
        mode = request.path_params["mode"]
        if mode == "error":
            return JSONResponse({"error": {"message": "overloaded"}}, status_code=500)
        return StreamingResponse(self._body(mode), media_type="text/event-stream")

    async def _body(self, mode: str) -> AsyncIterator[bytes]:
        self.open += 1
        try:
            if mode == "malformed":
                yield b"event: response.created\ndata: {this is not json\n\n"
                return
            while True:  # hang: a backend that never answers
                await asyncio.sleep(3600)
                yield b""
        finally:
            self.open -= 1


@asynccontextmanager
async def misbehaving_backends() -> AsyncIterator[tuple[Misbehaving, dict[str, ResponsesBackend]]]:
    """The server and a backend of each kind: ``error``, ``malformed``,
    ``hang`` (timeout_s 3600: the test's clock decides) and ``refused``."""
    state = Misbehaving()
    app = Starlette(routes=[Route("/{mode}/v1/responses", state.responses, methods=["POST"])])
    port = free_port(HOST)
    server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=port, log_level="warning",
                                           lifespan="off"))
    task = asyncio.create_task(server.serve(), name="test-responses-backends")
    while not server.started:
        await asyncio.sleep(0.01)
    base = f"http://{HOST}:{port}"
    backends = {m: ResponsesBackend(m, f"{base}/{m}/v1", "m", timeout_s=3600.0,
                                    api_key="sk-backend-secret")
                for m in ("error", "malformed", "hang")}
    backends["refused"] = ResponsesBackend("refused", f"http://{HOST}:{free_port(HOST)}/v1", "m")
    try:
        yield state, backends
    finally:
        server.should_exit = True
        await task
