"""``OpenEngineStreaming.GenerateStream`` with a real ``grpc.aio`` client on
the real engine (issue 15): start first and once, numbered chunks
(duplicates acknowledged, gaps refused with the expected seq), input after
end refused, exactly one terminal outcome; cancel, the gRPC deadline and a
disconnect stop the vLLM request; a bound session survives a cancel. Also
the standard health service and server reflection."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from support.grpc_fixtures import engine_idle, grpc_client
from support.text_fixtures import FRANCE, KEYS, MODEL, client
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from vllm_duplex.realtime.client.grpc_client import OpenEngineError, request
from vllm_duplex.realtime.wire.openengine.v1 import engine_pb2 as e

pytestmark = pytest.mark.asyncio(loop_scope="session")


def start(**kw) -> e.GenerateStreamRequest:
    return e.GenerateStreamRequest(start=request(**kw))


def chunk(seq: int, text: str) -> e.GenerateStreamRequest:
    return e.GenerateStreamRequest(input=e.InputChunk(seq=seq, text=text))


END = e.GenerateStreamRequest(end=e.EndOfInput())


async def rest(call) -> list[e.GenerateResponse]:
    """Every response until the stream ends (a terminal status raises)."""
    out = []
    while (got := await asyncio.wait_for(call.read(), 120)) is not grpc.aio.EOF:
        out.append(got)
    return out


def kinds(responses) -> list[str]:
    return [r.WhichOneof("event") for r in responses]


async def test_chunks_in_order_duplicates_and_gaps_then_one_finish(text_server):
    async with grpc_client(text_server) as g:
        call = g.streaming.GenerateStream(metadata=g.metadata)
        await call.write(start(model=MODEL, max_tokens=12, request_id="grpc-stream-1",
                               messages_=FRANCE[:1]))  # the instruction, then the streamed question
        started = await call.read()
        assert started.started.request_id == "grpc-stream-1" and not started.started.early_output
        for seq, text in ((1, "What is the "), (2, "capital of "), (1, "What is the ")):
            await call.write(chunk(seq, text))
        gap = chunk(5, "oops")
        await call.write(gap)
        await call.write(chunk(3, "France?"))
        acks = [await call.read() for _ in range(5)]
        assert [(a.ack.seq, a.ack.duplicate) for a in acks if a.HasField("ack")] == [
            (1, False), (2, False), (1, True), (3, False)]
        err = acks[3].error  # the gap: non-terminal, names the expected seq
        assert (err.code, err.param, err.details["expected_seq"]) == ("sequence_gap", "seq", 3)
        await call.write(e.GenerateStreamRequest(end=e.EndOfInput(last_seq=3)))
        await call.done_writing()
        out = await rest(call)
        assert kinds(out).count("finish") == 1 and kinds(out)[-1] == "finish"
        assert set(kinds(out)) <= {"text_delta", "finish"}
        text = "".join(r.text_delta.delta for r in out if r.HasField("text_delta"))
        assert "Paris" in text
        assert await call.code() is grpc.StatusCode.OK
        # the same question, stateless: the same greedy answer
        same = await g.generate(model=MODEL, messages=FRANCE, max_tokens=12)
        assert same.text == text


async def test_start_first_and_once_and_no_input_after_end(text_server):
    async with grpc_client(text_server) as g:
        call = g.streaming.GenerateStream(metadata=g.metadata)
        await call.write(chunk(1, "early"))
        first = await call.read()
        assert (first.error.code, first.error.param) == ("invalid_event", "type")
        await call.write(start(model=MODEL, max_tokens=4))
        assert (await call.read()).HasField("started")
        await call.write(start(model=MODEL))
        assert (await call.read()).error.code == "invalid_event"  # start comes once
        await call.write(e.GenerateStreamRequest())  # no frame at all
        assert (await call.read()).error.code == "invalid_event"
        await call.write(chunk(1, "Say hi "))
        assert (await call.read()).ack.seq == 1
        await call.write(END)
        await call.write(chunk(2, "late"))
        await call.write(END)
        await call.done_writing()
        out = await rest(call)
        errors = [r.error.code for r in out if r.HasField("error")]
        assert errors and set(errors) == {"input_after_end"}
        assert kinds(out).count("finish") == 1 and kinds(out)[-1] == "finish"


async def test_a_stream_half_closed_before_end_is_one_terminal_status(text_server):
    async with grpc_client(text_server) as g:
        call = g.streaming.GenerateStream(metadata=g.metadata)
        await call.write(start(model=MODEL))
        await call.read()
        await call.write(chunk(1, "Hello "))
        await call.done_writing()
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await rest(call)
        err = OpenEngineError(info.value)
        assert (err.status, err.code) == (grpc.StatusCode.INVALID_ARGUMENT, "invalid_event")
        assert await engine_idle(text_server)


async def test_cancel_deadline_and_disconnect_stop_the_engine_work(text_server):
    story = "Tell me a long story about a dragon who learns to fly. "
    async with grpc_client(text_server) as g:
        # the client cancels mid-reply
        call = g.streaming.GenerateStream(metadata=g.metadata)
        await call.write(start(model=MODEL, max_tokens=400))
        await call.read()
        await call.write(chunk(1, story))
        await call.read()
        await call.write(END)
        assert (await call.read()).HasField("text_delta")
        call.cancel()
        assert await engine_idle(text_server)
        # a cancel frame before end: finish "cancelled" is the one terminal
        call = g.streaming.GenerateStream(metadata=g.metadata)
        await call.write(start(model=MODEL))
        await call.read()
        await call.write(e.GenerateStreamRequest(cancel=e.CancelStream()))
        out = await rest(call)
        assert kinds(out) == ["finish"] and out[0].finish.finish_reason == "cancelled"
        # the gRPC deadline mid-reply
        call = g.streaming.GenerateStream(metadata=g.metadata, timeout=1.5)
        await call.write(start(model=MODEL, max_tokens=400))
        await call.read()
        await call.write(chunk(1, story))
        await call.write(END)
        with pytest.raises(grpc.aio.AioRpcError) as info:
            await rest(call)
        assert info.value.code() is grpc.StatusCode.DEADLINE_EXCEEDED
        assert await engine_idle(text_server)
    # a disconnect: the channel goes away mid-reply
    g = grpc_client(text_server)
    call = g.streaming.GenerateStream(metadata=g.metadata)
    await call.write(start(model=MODEL, max_tokens=400))
    await call.read()
    await call.write(chunk(1, story))
    await call.write(END)
    await call.read()
    assert (await call.read()).HasField("text_delta")
    await g.close()
    assert await engine_idle(text_server)


async def test_a_bound_session_continues_and_survives_cancel(text_server):
    async with grpc_client(text_server) as g, client(text_server) as http, \
            grpc_client(text_server, KEYS[1]) as bob:
        s = await g.open_session(MODEL, history=FRANCE)
        call = bob.streaming.GenerateStream(metadata=bob.metadata)
        await call.write(start(session=s.ref))
        refused = await call.read()  # another key's session: unknown (a frame error, not terminal)
        assert (refused.error.code, refused.error.param) == ("session_not_found", "session_id")
        call.cancel()
        async with g.stream(session=s.ref, max_tokens=8) as stream:
            assert stream.started.session_id == s.ref.session_id
            assert (await stream.cancel()).finish_reason == "cancelled"
        got = await g.get_session(s.ref)
        assert got.state in ("active", "detached") and got.turns == 0
        async with g.stream(session=s.ref, max_tokens=8) as stream:
            await stream.input("And of Germany? ")
            result = await stream.end()
        assert result.finish_reason in ("stop", "length") and result.text
        r = await http.get(f"/v1/sessions/{s.ref.session_id}")
        assert r.json()["turns"] == 1
        await g.close_session(s.ref)
        assert await engine_idle(text_server)


async def test_health_and_reflection_are_served(text_server):
    async with grpc.aio.insecure_channel(text_server.grpc_target) as channel:
        check = health_pb2_grpc.HealthStub(channel).Check
        for service in ("", "openengine.v1.OpenEngineStreaming"):
            got = await check(health_pb2.HealthCheckRequest(service=service))
            assert got.status == health_pb2.HealthCheckResponse.SERVING
        stub = reflection_pb2_grpc.ServerReflectionStub(channel)

        async def ask():
            yield reflection_pb2.ServerReflectionRequest(list_services="")
        async for answer in stub.ServerReflectionInfo(ask()):
            names = {s.name for s in answer.list_services_response.service}
        assert {"openengine.v1.OpenEngineSessions", "openengine.v1.OpenEngine",
                "openengine.v1.OpenEngineStreaming", "grpc.health.v1.Health"} <= names
