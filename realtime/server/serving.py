"""Running the ASGI app under uvicorn: one place for the server settings,
used by ``vllm-duplex serve`` and by tests and benchmarks that need a real
server on loopback."""

from __future__ import annotations

import asyncio
import socket

import uvicorn
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.realtime.server.app import create_app


def uvicorn_config(runtime: Runtime, host: str, port: int,
                   log_level: str = "warning", grpc_port: int | None = None) -> uvicorn.Config:
    return uvicorn.Config(
        create_app(runtime, grpc_port, host),
        host=host,
        port=port,
        ws="websockets-sansio",  # uvicorn's sans-I/O adapter of the `websockets` package
        ws_max_size=runtime.config.limits.max_frame_bytes,
        log_level=log_level,
        lifespan="on",
    )


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class BackgroundServer:
    """A real uvicorn server in the current event loop::

        async with BackgroundServer(runtime, grpc_port=0) as server:
            url = server.ws_url  # ws://127.0.0.1:<port>/v1/realtime
            target = server.grpc_target  # 127.0.0.1:<port> (gRPC)
    """

    def __init__(self, runtime: Runtime, host: str = "127.0.0.1", port: int | None = None,
                 grpc_port: int | None = None):
        """``grpc_port``: also serve gRPC (0: on a free port, see ``grpc_target``)."""
        self.runtime = runtime
        self.host = host
        self.port = port or free_port(host)
        self.grpc_port = free_port(host) if grpc_port == 0 else grpc_port
        self._server = uvicorn.Server(uvicorn_config(runtime, self.host, self.port,
                                                     grpc_port=self.grpc_port))
        self._task: asyncio.Task[None] | None = None

    @property
    def http_url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def grpc_target(self) -> str:
        return f"{self.host}:{self.grpc_port}"

    @property
    def ws_url(self) -> str:
        return f"ws://{self.host}:{self.port}/v1/realtime"

    async def __aenter__(self) -> BackgroundServer:
        self._server.config.setup_event_loop = lambda: None  # we are already in a loop
        self._task = asyncio.create_task(self._server.serve(), name="duplex-uvicorn")
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises the start-up error
                raise RuntimeError("server stopped during start-up")
            await asyncio.sleep(0.01)
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.should_exit = True
        if self._task is not None:
            await self._task
