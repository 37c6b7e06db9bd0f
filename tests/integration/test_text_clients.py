"""The Python clients of the text surfaces (``vllm_duplex.realtime.client.http``,
``...client.generate_stream``) against the real server and engine,
and the Python examples of ``docs/api.md`` run as written."""

from __future__ import annotations

import contextlib
import io
import re
import uuid
from pathlib import Path

import pytest
from support.text_fixtures import FRANCE, INSTRUCTIONS, KEYS, MODEL  # noqa: F401
from vllm_duplex.realtime.client.generate_stream import GenerateStreamClient
from vllm_duplex.realtime.client.http import DuplexAPIError, DuplexHttpClient
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401

pytestmark = pytest.mark.asyncio(loop_scope="session")

SHORT = {"max_tokens": 16}
COUNT = [{"role": "user", "content": "Count from 1 to 100."}]
DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"


def client(server, key: str = KEYS[0]) -> DuplexHttpClient:
    return DuplexHttpClient(server.http_url, key)


async def test_generate_streamed_and_once(text_server):  # noqa: F811
    async with client(text_server) as c:
        events = c.generate(model=MODEL, messages=FRANCE, options=SHORT)
        reply = await events.collect()
        assert events.request_id and events.done
        assert reply.text and reply.finish_reason in ("stop", "length")
        assert reply.events[-1].event == "finish" and all(e.seq is None for e in reply.events)
        answer = await c.generate_once(model=MODEL, messages=FRANCE, options=SHORT)
        assert answer["output"]["text"] == reply.text  # greedy: the same step
        assert answer["usage"]["completion_tokens"] == reply.finish["usage"]["completion_tokens"]


async def test_session_two_turns_then_close(text_server):  # noqa: F811
    async with client(text_server) as c:
        session = await c.open_session(MODEL, instructions="Answer in one short sentence.")
        assert session.owner_instance_id and session.wire["state"] == "active"
        first = await session.ask(FRANCE[-1:], options=SHORT)  # (the session has its instructions)
        second = await session.ask([{"role": "user", "content": "And of Italy?"}], options=SHORT)
        assert first and second
        info = await session.info(messages=True)
        assert info["turns"] == 2
        assert [m["role"] for m in info["history"]] == ["system", "user", "assistant", "user",
                                                         "assistant"]
        assert info["history"][2]["content"] == first
        renewed = await session.renew(ttl_s=120, generation=info["lease"]["generation"])
        assert renewed["lease"]["generation"] == info["lease"]["generation"] + 1
        with pytest.raises(DuplexAPIError) as stale:
            await session.renew(generation=info["lease"]["generation"])
        assert (stale.value.code, stale.value.status) == ("lease_conflict", 409)
        closed = await session.close()
        assert closed["state"] == "closed" and closed["close_reason"] == "client"
        with pytest.raises(DuplexAPIError) as err:
            await session.ask(FRANCE, options=SHORT)
        assert (err.value.code, err.value.status) == ("session_closed", 409)


async def test_streaming_input_answers_the_streamed_question(text_server):  # noqa: F811
    async with await GenerateStreamClient.connect(text_server.http_url, api_key=KEYS[0],
                                                  model=MODEL, instructions=INSTRUCTIONS,
                                                  options={"max_tokens": 24}) as gen:
        assert gen.started["type"] == "started" and gen.request_id
        for piece in ("What is the ", "capital of ", "France?"):
            ack = await gen.send(piece, wait=True)
            assert ack == {"type": "ack", "seq": gen.next_seq - 1, "duplicate": False}
        assert (await gen.resend(2, wait=True))["duplicate"] is True
        await gen.send_frame({"type": "input", "seq": 9, "text": "ignored "})
        gap = await gen.recv(timeout=30)
        assert gap["type"] == "error" and gap["terminal"] is False
        assert gap["error"]["code"] == "sequence_gap" and gap["error"]["expected_seq"] == 4
        await gen.end(last_seq=3)
        reply = await gen.collect()
    assert "Paris" in reply.text
    assert reply.finish_reason in ("stop", "length")
    assert gen.finished is not None and gen.finished["type"] == "finish"


async def test_follow_stream_resumes_without_gaps_or_duplicates(text_server):  # noqa: F811
    stream_id = f"clients-{uuid.uuid4().hex[:8]}"
    async with client(text_server) as c:
        events = c.generate(model=MODEL, messages=COUNT, stream_id=stream_id,
                            options={"max_tokens": 20, "min_tokens": 20})
        seen = []
        async for ev in events:
            seen.append(ev)
            if len(seen) == 3:
                break
        await events.disconnect()  # the generation goes on without us
        assert events.last_seq == 3 and not events.done
        async for ev in events:  # reconnects with ?from=4
            seen.append(ev)
        assert events.done
        assert [e.seq for e in seen] == list(range(1, len(seen) + 1))
        assert seen[-1].event == "finish" and seen[-1].data["finish_reason"] == "length"
        # An independent follower replays the same events from any seq.
        follower = c.follow_stream(stream_id, from_seq=2)
        replay = [ev async for ev in follower]
        assert [(e.seq, e.event, e.data) for e in replay] == [(e.seq, e.event, e.data)
                                                              for e in seen[1:]]
        [found] = await c.lookup_streams([stream_id])
        assert found == {"stream_id": stream_id, "status": "completed", "first_seq": 1,
                         "head_seq": len(seen)}
        assert (await c.delete_stream(stream_id))["status_before"] == "completed"
        assert (await c.delete_stream(stream_id))["status_before"] == "deleted"
        with pytest.raises(DuplexAPIError) as err:
            await c.follow_stream(stream_id).collect()
        assert (err.value.code, err.value.status) == ("stream_not_found", 404)


async def test_errors_carry_the_wire_error(text_server):  # noqa: F811
    async with client(text_server) as alice, client(text_server, KEYS[1]) as bob:
        session = await alice.open_session(MODEL)
        try:
            with pytest.raises(DuplexAPIError) as err:  # another key: as if it did not exist
                await bob.session(session.session_id, session.owner_instance_id).info()
            assert (err.value.status, err.value.code) == (404, "session_not_found")
            assert err.value.param == "session_id" and err.value.retryable is False
            with pytest.raises(DuplexAPIError) as err:
                await alice.session(session.session_id, "inst_elsewhere").info()
            assert (err.value.status, err.value.code) == (421, "wrong_instance")
            assert err.value.owner_instance_id == "inst_elsewhere" and err.value.retryable
        finally:
            await session.close()
        with pytest.raises(DuplexAPIError) as err:
            await alice.abort("no-such-request")
        assert (err.value.status, err.value.code) == (404, "request_not_found")
        with pytest.raises(DuplexAPIError) as err:
            await alice.generate_once(model=MODEL, messages=FRANCE, options={"logprobs": 1})
        assert (err.value.status, err.value.code, err.value.param) == (
            400, "unsupported_option", "options.logprobs")
    async with DuplexHttpClient(text_server.http_url) as nobody:
        with pytest.raises(DuplexAPIError) as err:
            await nobody.lookup_streams(["x"])
        assert (err.value.status, err.value.code) == (401, "unauthorized")


async def test_docs_python_examples_run(text_server):  # noqa: F811
    """Every Python block of docs/api.md, pointed at the test server."""
    blocks = [b for b in re.findall(r"```python\n(.*?)```", DOC.read_text(), re.S)
              if "TARGET, API_KEY, MODEL" not in b]  # the gRPC one: test_grpc_docs.py
    assert len(blocks) >= 5
    preamble = 'BASE, API_KEY, MODEL = "http://127.0.0.1:8000", None, "smollm2-135m-instruct"'
    for block in blocks:
        assert preamble in block and block.rstrip().endswith("asyncio.run(main())")
        code = block.replace(preamble, f"BASE, API_KEY, MODEL = {text_server.http_url!r}, "
                                       f"{KEYS[0]!r}, {MODEL!r}")
        code = code.rstrip().removesuffix("asyncio.run(main())")
        namespace: dict = {}
        exec(compile(code, str(DOC), "exec"), namespace)
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            await namespace["main"]()
        assert out.getvalue()
