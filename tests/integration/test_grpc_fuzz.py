"""Malformed gRPC messages (issue 15): seeded random requests to every
method, well-formed protobuf with bad values and raw bytes that may not
decode at all. Each is answered with a typed status (a google.rpc.ErrorInfo
naming an error-table code) or succeeds; the server stays alive and serves
the next real request."""

from __future__ import annotations

import random

import grpc
import pytest
from google.protobuf import struct_pb2
from grpc_health.v1 import health_pb2, health_pb2_grpc
from support.grpc_fixtures import engine_idle, grpc_client
from support.text_fixtures import FRANCE, MODEL
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from vllm_duplex.domain.errors import ERRORS
from vllm_duplex.realtime.client.grpc_client import OpenEngineError
from vllm_duplex.realtime.wire.openengine.v1 import engine_pb2 as e
from vllm_duplex.realtime.wire.openengine.v1 import sessions_pb2 as s
from vllm_duplex.realtime.wire.openengine.v1 import types_pb2 as t

pytestmark = pytest.mark.asyncio(loop_scope="session")

STRINGS = ["", " ", "x" * 300, "ünïcødé", "a b", "user", "../etc", "\x00", MODEL, "auto", "none",
           "required", "gen_abc.m0w0", "sess_" + "a" * 24 + ".m1w1"]
NUMBERS = [0, -1, 1, 2, 3, 7, 1 << 40, -(1 << 62)]
FLOATS = [0.0, -1.0, 0.5, 3.0, 1e308, float("nan"), float("inf")]


def rand_message(rng: random.Random) -> t.Message:
    return t.Message(role=rng.choice(["user", "assistant", "tool", "system", "robot", ""]),
                     content=rng.choice(STRINGS),
                     tool_calls=[t.ToolCall(id=rng.choice(STRINGS), name=rng.choice(STRINGS),
                                            arguments=rng.choice(["{}", "[]", "{", "1", ""]))]
                     if rng.random() < 0.2 else [],
                     tool_call_id=rng.choice([None, *STRINGS]))


def rand_generate(rng: random.Random) -> e.GenerateRequest:
    params = struct_pb2.Struct()
    params.update(rng.choice([{}, {"type": "object"}, {"type": 3}]))
    options = t.GenerationOptions(
        max_tokens=rng.choice([None, *NUMBERS[:4]]), temperature=rng.choice([None, *FLOATS]),
        top_k=rng.choice([None, *NUMBERS]), seed=rng.choice([None, *NUMBERS]),
        min_tokens=rng.choice([None, *NUMBERS]), stop=rng.sample(STRINGS, rng.randint(0, 2)))
    return e.GenerateRequest(
        model=rng.choice(STRINGS), request_id=rng.choice([None, *STRINGS]),
        instructions=rng.choice([None, *STRINGS]),
        messages=[rand_message(rng) for _ in range(rng.randint(0, 3))],
        tools=[t.Tool(name=rng.choice(STRINGS), parameters=params)] if rng.random() < 0.3 else [],
        tool_choice=rng.choice([None, t.ToolChoice(mode=rng.choice(STRINGS)),
                                t.ToolChoice(function=rng.choice(STRINGS))]),
        parallel_tool_calls=rng.random() < 0.2, options=options,
        reasoning=t.Reasoning(enabled=True) if rng.random() < 0.1 else None,
        deadline_ms=rng.choice([None, *NUMBERS]),
        session=t.GenerationSessionRef(session_id=rng.choice(STRINGS),
                                       owner_instance_id=rng.choice(["", "m9w9"]))
        if rng.random() < 0.4 else None,
        mode=rng.choice([0, 1, 2, 3, 9]), replace_from=rng.choice([None, *NUMBERS]),
        adapter=rng.choice([None, "", "lora"]))


def rand_request(rng: random.Random, method: str):
    ref = t.GenerationSessionRef(session_id=rng.choice(STRINGS), owner_instance_id=rng.choice(["", "x"]))
    if method == "OpenGenerationSession":
        return s.OpenGenerationSessionRequest(
            model=rng.choice(STRINGS), adapter=rng.choice([None, "lora"]),
            session_id=rng.choice([None, *STRINGS]), ttl_s=rng.choice([None, *FLOATS]),
            instructions=rng.choice([None, *STRINGS]),
            messages=[rand_message(rng) for _ in range(rng.randint(0, 2))])
    if method == "GetGenerationSession":
        return s.GetGenerationSessionRequest(ref=ref, include_history=rng.random() < 0.5)
    if method == "RenewGenerationSession":
        return s.RenewGenerationSessionRequest(ref=ref, ttl_s=rng.choice([None, *FLOATS]),
                                               generation=rng.choice([None, *NUMBERS]))
    if method == "CloseGenerationSession":
        return s.CloseGenerationSessionRequest(ref=ref)
    if method == "Abort":
        return e.AbortRequest(request_id=rng.choice(STRINGS))
    return rand_generate(rng)


METHODS = {"OpenGenerationSession": "OpenEngineSessions", "GetGenerationSession": "OpenEngineSessions",
           "RenewGenerationSession": "OpenEngineSessions", "CloseGenerationSession": "OpenEngineSessions",
           "Generate": "OpenEngine", "Abort": "OpenEngine"}


def typed(err: grpc.aio.AioRpcError) -> None:
    got = OpenEngineError(err)
    assert got.code in ERRORS, (err.code(), err.details())
    assert err.code().name == ERRORS[got.code].grpc_status


async def test_malformed_requests_get_typed_statuses_and_the_server_lives(text_server):
    rng = random.Random(15)
    async with grpc_client(text_server) as g:
        for i in range(150):
            method = rng.choice(sorted(METHODS))
            path = f"/openengine.v1.{METHODS[method]}/{method}"
            if rng.random() < 0.3:  # raw bytes: may not decode at all
                payload = rng.randbytes(rng.randint(1, 64))
            else:
                req = rand_request(rng, method)
                if method == "Generate":  # a valid one runs on the engine: keep it short
                    req.options.max_tokens = 2
                payload = req.SerializeToString()
            call = g.channel.unary_unary(path, request_serializer=None, response_deserializer=None)
            try:
                await call(payload, metadata=g.metadata, timeout=60)
            except grpc.aio.AioRpcError as err:
                typed(err)
        # the stream: random frames, undecodable ones among them; errors are frames or one status
        for _ in range(10):
            stream = g.channel.stream_stream("/openengine.v1.OpenEngineStreaming/GenerateStream",
                                             request_serializer=None, response_deserializer=None)
            call = stream(metadata=g.metadata, timeout=60)
            for _ in range(rng.randint(1, 6)):
                pick = rng.random()
                if pick < 0.3:
                    frame = rng.randbytes(rng.randint(1, 32))
                elif pick < 0.6:
                    start = rand_generate(rng)
                    start.options.max_tokens = 2
                    frame = e.GenerateStreamRequest(start=start).SerializeToString()
                else:
                    frame = e.GenerateStreamRequest(input=e.InputChunk(
                        seq=rng.choice(NUMBERS), text=rng.choice(STRINGS))).SerializeToString()
                await call.write(frame)
            await call.done_writing()
            try:
                while (got := await call.read()) is not grpc.aio.EOF:
                    assert e.GenerateResponse.FromString(got).WhichOneof("event")
            except grpc.aio.AioRpcError as err:
                typed(err)
        # alive: health, and a real request answered
        health = await health_pb2_grpc.HealthStub(g.channel).Check(health_pb2.HealthCheckRequest())
        assert health.status == health_pb2.HealthCheckResponse.SERVING
        assert (await g.generate(model=MODEL, messages=FRANCE, max_tokens=4)).finish_reason
        assert await engine_idle(text_server)
