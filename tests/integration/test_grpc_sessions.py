"""The OpenEngine gRPC surface, sessions and unary Generate, with a real
``grpc.aio`` client over loopback on the real engine (issue 15): the same
sessions as HTTP, per-key ownership, expiry vs unknown, owner mismatch,
duplicate ids, capability and argument errors from the one error table,
continuation = stateless answer (greedy), Abort, deadline, cancellation."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from support.grpc_fixtures import engine_idle, fails, grpc_client, running
from support.text_fixtures import FRANCE, KEYS, MODEL, client
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from vllm_duplex.realtime.client.grpc_client import OpenEngineError, request
from vllm_duplex.realtime.wire.openengine.v1 import engine_pb2 as e
from vllm_duplex.realtime.wire.openengine.v1 import types_pb2 as t

pytestmark = pytest.mark.asyncio(loop_scope="session")

S = grpc.StatusCode
GERMANY = [{"role": "user", "content": "And what is the capital of Germany?"}]
STORY = [{"role": "user", "content": "Tell me a long story about a dragon who learns to fly."}]


async def test_a_session_opened_over_grpc_is_the_http_session_of_the_same_key(text_server):
    async with grpc_client(text_server) as g, client(text_server) as http, \
            client(text_server, KEYS[1]) as bob_http, grpc_client(text_server, KEYS[1]) as bob:
        s = await g.open_session(MODEL, session_id="grpc-conv-1", ttl_s=30)
        instance = text_server.runtime.manager.instance_id
        assert (s.ref.session_id, s.ref.owner_instance_id, s.state) == ("grpc-conv-1", instance, "active")
        assert s.lease.ttl_s == 30 and s.lease.generation == 1
        r = await http.get("/v1/sessions/grpc-conv-1")
        assert r.status_code == 200 and r.json()["ref"]["owner_instance_id"] == instance
        assert (await bob_http.get("/v1/sessions/grpc-conv-1")).status_code == 404
        await fails(S.NOT_FOUND, "session_not_found", bob.get_session(s.ref))
        await fails(S.NOT_FOUND, "session_not_found", bob.generate(messages=FRANCE, session=s.ref))
        # caller ids are unique; the duplicate is ALREADY_EXISTS naming the field
        err = await fails(S.ALREADY_EXISTS, "duplicate_id", g.open_session(MODEL, session_id="grpc-conv-1"))
        assert err.param == "session_id" and not err.retryable
        # renew: compare-and-swap on the lease generation; a lost CAS is ABORTED and retryable
        assert (await g.renew_session(s.ref, ttl_s=40, generation=1)).lease.generation == 2
        err = await fails(S.ABORTED, "lease_conflict", g.renew_session(s.ref, generation=1))
        assert err.retryable
        # a turn over HTTP, then the history over gRPC: one session
        r = await http.post("/v1/sessions/grpc-conv-1/generate",
                            json={"messages": FRANCE, "stream": False, "options": {"max_tokens": 8}})
        assert r.status_code == 200
        got = await g.get_session(s.ref, history=True)
        assert got.turns == 1 and [m.role for m in got.history] == ["system", "user", "assistant"]
        # close is idempotent; a closed session is FAILED_PRECONDITION, its tombstone answers
        assert (await g.close_session(s.ref)).state == "closed"
        assert (await g.close_session(s.ref)).state == "closed"
        assert (await g.get_session(s.ref)).state == "closed"
        await fails(S.FAILED_PRECONDITION, "session_closed", g.generate(messages=FRANCE, session=s.ref))
        # ttl unset or 0: the server default
        default = text_server.runtime.config.limits.session_ttl_s
        for ttl in (None, 0):
            s2 = await g.open_session(MODEL, ttl_s=ttl)
            assert s2.lease.ttl_s == default and s2.ref.session_id.endswith("." + instance)
            await g.close_session(s2.ref)


async def test_expired_is_told_apart_from_unknown(text_server):
    async with grpc_client(text_server) as g:
        s = await g.open_session(MODEL, ttl_s=0.5)
        await asyncio.sleep(1.6)  # the lease, then the reaper's pass
        assert (await g.get_session(s.ref)).state == "expired"
        expired = await fails(S.NOT_FOUND, "session_expired", g.generate(messages=FRANCE, session=s.ref))
        unknown = await fails(S.NOT_FOUND, "session_not_found",
                              g.generate(messages=FRANCE, session="never-made"))
        assert (expired.reason, unknown.reason) == ("SESSION_EXPIRED", "SESSION_NOT_FOUND")


async def test_an_owner_mismatch_is_refused_with_the_owner_id(text_server):
    async with grpc_client(text_server) as g, grpc_client(text_server, owner="m9w9") as elsewhere:
        s = await g.open_session(MODEL, session_id="grpc-owned")
        wrong = t.GenerationSessionRef(session_id="grpc-owned", owner_instance_id="m9w9")
        for call in (g.get_session(wrong), g.renew_session(wrong), g.close_session(wrong),
                     g.generate(messages=FRANCE, session=wrong),
                     elsewhere.get_session(t.GenerationSessionRef(session_id="grpc-owned"))):
            err = await fails(S.FAILED_PRECONDITION, "wrong_instance", call)
            assert err.metadata["owner_instance_id"] == "m9w9" and err.retryable
        minted = await g.open_session(MODEL)  # a minted id names its owner itself
        other = minted.ref.session_id.rsplit(".", 1)[0] + ".m1w2"
        err = await fails(S.FAILED_PRECONDITION, "wrong_instance", g.get_session(
            t.GenerationSessionRef(session_id=other)))
        assert err.metadata["owner_instance_id"] == "m1w2"
        assert (await g.get_session(s.ref)).state == "active"  # never served, never closed
        await g.close_session(s.ref)
        await g.close_session(minted.ref)


async def test_a_continuation_equals_the_stateless_answer_for_the_same_history(text_server):
    async with grpc_client(text_server) as g:
        s = await g.open_session(MODEL)
        first = await g.generate(messages=FRANCE, session=s.ref, max_tokens=12)
        assert first.session_id == s.ref.session_id and first.finish_reason in ("stop", "length")
        second = await g.generate(messages=GERMANY, session=s.ref, max_tokens=12)
        history = [*FRANCE, {"role": "assistant", "content": first.text}, *GERMANY]
        stateless = await g.generate(model=MODEL, messages=history, max_tokens=12)
        assert second.text == stateless.text and second.text
        assert second.usage.completion_tokens == stateless.usage.completion_tokens
        # the model binding is checked on every continuation
        await fails(S.FAILED_PRECONDITION, "model_mismatch",
                    g.generate(model="other-model", messages=GERMANY, session=s.ref))
        await g.close_session(s.ref)


async def test_capability_and_argument_errors_are_typed_and_name_the_field(text_server):
    async with grpc_client(text_server) as g, grpc_client(text_server, key=None) as anon:
        s = await g.open_session(MODEL)
        branch = request(messages_=FRANCE, session=s.ref)
        branch.mode = e.CONTINUATION_MODE_BRANCH
        err = await fails(S.UNIMPLEMENTED, "capability_unsupported", g._call(g.engine.Generate, branch))
        assert err.param == "mode"
        reasoning = request(messages_=FRANCE, session=s.ref)
        reasoning.reasoning.enabled = True
        await fails(S.UNIMPLEMENTED, "unsupported_option", g._call(g.engine.Generate, reasoning))
        err = await fails(S.INVALID_ARGUMENT, "invalid_value",
                          g.generate(model=MODEL, messages=FRANCE, temperature=5.0))
        assert err.param == "options.temperature"
        await fails(S.INVALID_ARGUMENT, "invalid_value", g.generate(model=MODEL))  # no messages
        await fails(S.NOT_FOUND, "model_not_found", g.generate(model="gpt-4o", messages=FRANCE))
        await fails(S.UNAUTHENTICATED, "unauthorized", anon.generate(model=MODEL, messages=FRANCE))
        await fails(S.UNAUTHENTICATED, "unauthorized", anon.open_session(MODEL))
        caps = await g.capabilities()
        assert caps.sessions and set(caps.continuation_modes) == {"append", "replace"}
        assert caps.owner_affinity_required and caps.instance_id == text_server.runtime.manager.instance_id
        assert dict(caps.streaming_input) == {"text": True, "audio": False, "image": False}
        assert not caps.early_output and caps.max_chunk_bytes > 0 and caps.model == MODEL
        await g.close_session(s.ref)


async def test_abort_stops_a_turn_and_keeps_the_session(text_server):
    async with grpc_client(text_server) as g, grpc_client(text_server, KEYS[1]) as bob:
        s = await g.open_session(MODEL)
        turn = asyncio.create_task(g.generate(messages=STORY, session=s.ref, max_tokens=400,
                                              request_id="grpc-abort-1"))
        await running(text_server, "grpc-abort-1")
        await fails(S.NOT_FOUND, "request_not_found", bob.abort("grpc-abort-1"))
        assert (await g.abort("grpc-abort-1")).aborted
        result = await turn
        assert result.finish_reason == "cancelled"
        assert await engine_idle(text_server)
        after = await g.get_session(s.ref)
        assert after.state in ("active", "detached") and after.turns == 0  # a cancelled turn commits nothing
        again = await g.generate(messages=FRANCE, session=s.ref, max_tokens=6)
        assert again.finish_reason in ("stop", "length")
        await g.close_session(s.ref)


async def test_deadlines_and_cancellation_abort_the_engine_request(text_server):
    async with grpc_client(text_server) as g:
        # the gRPC deadline: the client's DEADLINE_EXCEEDED, the vLLM request aborted
        with pytest.raises(OpenEngineError) as info:
            await g.generate(model=MODEL, messages=STORY, max_tokens=400, timeout=0.5)
        assert info.value.status is S.DEADLINE_EXCEEDED
        assert await engine_idle(text_server)
        # the engine's own deadline (deadline_ms): the same status, typed and retryable
        late = request(model=MODEL, messages_=STORY, max_tokens=400)
        late.deadline_ms = 300
        err = await fails(S.DEADLINE_EXCEEDED, "deadline_exceeded", g._call(g.engine.Generate, late))
        assert err.retryable
        assert await engine_idle(text_server)
        # the client cancels a running call
        call = g.engine.Generate(request(model=MODEL, messages_=STORY, max_tokens=400,
                                         request_id="grpc-cancel-1"), metadata=g.metadata)
        await running(text_server, "grpc-cancel-1")
        call.cancel()
        with pytest.raises(asyncio.CancelledError):
            await call
        assert await engine_idle(text_server)
        assert not any(rid == "grpc-cancel-1" for _, rid in text_server.runtime.text._running)
