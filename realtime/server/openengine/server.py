"""The gRPC server beside the HTTP one: same process, same event loop, same
runtime. OpenEngine services, the standard health-checking service
(``grpc.health.v1.Health``: SERVING once started, NOT_SERVING while it
stops) and server reflection (so ``grpcurl`` needs no proto files)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from vllm_duplex.realtime.server.openengine.services import Engine, Sessions, Streaming, register
from vllm_duplex.realtime.wire.openengine.v1 import engine_pb2, sessions_pb2

if TYPE_CHECKING:
    from vllm_duplex.host.runtime import Runtime

SERVICES = (
    sessions_pb2.DESCRIPTOR.services_by_name["OpenEngineSessions"].full_name,
    engine_pb2.DESCRIPTOR.services_by_name["OpenEngine"].full_name,
    engine_pb2.DESCRIPTOR.services_by_name["OpenEngineStreaming"].full_name,
)


class GrpcServer:
    """``await start()`` after the runtime started (the HTTP lifespan), ``await stop()`` before it stops."""

    def __init__(self, runtime: Runtime, host: str, port: int) -> None:
        self.runtime = runtime
        self.host = host
        self.port = port
        self.health = health.aio.HealthServicer()
        limit = runtime.config.limits.max_request_bytes
        self.server = grpc.aio.server(options=[("grpc.max_receive_message_length", limit)])
        for name, servicer in zip(SERVICES, (Sessions(runtime), Engine(runtime), Streaming(runtime))):
            register(self.server, name, servicer)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self.server)
        reflection.enable_server_reflection(
            (*SERVICES, health.SERVICE_NAME, reflection.SERVICE_NAME), self.server)
        bound = self.server.add_insecure_port(f"{host}:{port}")
        if bound == 0:
            raise OSError(f"cannot bind the gRPC port {host}:{port}")
        self.port = bound

    @property
    def target(self) -> str:
        return f"{self.host}:{self.port}"

    async def start(self) -> None:
        await self.server.start()
        for name in ("", *SERVICES):
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

    async def stop(self, grace_s: float = 2.0) -> None:
        await self.health.enter_graceful_shutdown()
        await self.server.stop(grace_s)
