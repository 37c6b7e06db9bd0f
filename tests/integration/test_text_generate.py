"""``POST /v1/generate`` over real HTTP against the real engine: one stateless
model step with external history and tools; a client gone or a deadline
aborts the vLLM request."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest
from support.text_fixtures import FRANCE, KEYS, MODEL, WEATHER_TOOL, auth, sse_events  # noqa: F401
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401

pytestmark = pytest.mark.asyncio(loop_scope="session")

STORY = [{"role": "user", "content": "Tell me a long story about a dragon who learns to fly."}]


async def generate(server, body, key=KEYS[0]) -> list[tuple[str, dict]]:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=120) as http:
        async with http.stream("POST", "/v1/generate", json=body, headers=auth(key)) as r:
            assert r.status_code == 200, await r.aread()
            assert r.headers["content-type"].startswith("text/event-stream")
            return [(event, data) for _, event, data in [e async for e in sse_events(r)]]


async def post(server, path, body, key=KEYS[0]) -> httpx.Response:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=120) as http:
        return await http.post(path, json=body, headers=auth(key))


def text_of(events) -> str:
    return "".join(d["delta"] for e, d in events if e == "text-delta")


async def engine_idle(server, tries: int = 200) -> bool:
    """Every vLLM request of the text surfaces has left the engine."""
    text = server.runtime.text
    engine = text.generator.stage.engine
    for _ in range(tries):
        if text.generator.active_requests == 0 and engine.get_num_unfinished_requests() == \
                text.generator.stage.active_requests:
            return True
        await asyncio.sleep(0.02)
    return False


async def test_a_step_streams_text_then_one_finish_with_usage(text_server):
    sessions_before = len(text_server.runtime.text.sessions.manager), len(text_server.runtime.manager)
    events = await generate(text_server, {"model": MODEL, "messages": FRANCE,
                                          "options": {"max_tokens": 24}})
    names = [e for e, _ in events]
    assert names[-1] == "finish" and names.count("finish") == 1 and "error" not in names
    assert set(names[:-1]) == {"text-delta"}
    assert [d["type"] for _, d in events] == names  # data: carries the type too (as OpenAI's)
    assert "Paris" in text_of(events)
    finish = events[-1][1]
    assert finish["finish_reason"] == "stop"
    usage = finish["usage"]
    assert usage["prompt_tokens"] > 10 and 0 < usage["completion_tokens"] <= 24
    assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
    # Stateless: no session of either kind was created.
    assert (len(text_server.runtime.text.sessions.manager), len(text_server.runtime.manager)) == sessions_before
    assert await engine_idle(text_server)


async def test_stream_false_answers_one_json_document(text_server):
    r = await post(text_server, "/v1/generate", {"model": MODEL, "messages": FRANCE, "stream": False,
                                                 "options": {"max_tokens": 24}})
    body = r.json()
    assert r.status_code == 200 and "Paris" in body["output"]["text"]
    assert body["finish_reason"] == "stop" and body["output"]["tool_calls"] == []


async def test_max_tokens_and_stop_strings(text_server):
    events = await generate(text_server, {"model": MODEL, "messages": STORY, "options": {"max_tokens": 5}})
    assert events[-1][1]["finish_reason"] == "length"
    assert events[-1][1]["usage"]["completion_tokens"] == 5
    events = await generate(text_server, {"model": MODEL, "messages": FRANCE,
                                          "options": {"max_tokens": 24, "stop": [" Paris"]}})
    assert events[-1][1]["finish_reason"] == "stop"
    text = text_of(events)
    assert "Paris" not in text and text.startswith("The capital of France is")


@pytest.mark.parametrize("body, status, code, param", [
    ({"model": "gpt-4o", "messages": FRANCE}, 404, "model_not_found", "model"),
    ({"messages": FRANCE}, 400, "invalid_value", "model"),
    ({"model": MODEL, "messages": []}, 400, "invalid_value", "messages"),
    ({"model": MODEL, "messages": FRANCE, "options": {"logprobs": 2}}, 400, "unsupported_option",
     "options.logprobs"),
    ({"model": MODEL, "messages": FRANCE, "n": 2}, 400, "unsupported_option", "n"),
    ({"model": MODEL, "messages": FRANCE, "options": {"temperature": 9}}, 400, "invalid_value",
     "options.temperature"),
    ({"model": MODEL, "messages": [{"role": "wizard", "content": "hi"}]}, 400, "invalid_value",
     "messages[0].role"),
    ({"model": MODEL, "messages": FRANCE, "tool_choice": "required"}, 400, "invalid_value", "tool_choice"),
    ({"model": MODEL, "messages": FRANCE, "tools": [WEATHER_TOOL],
      "tool_choice": {"type": "function", "name": "nope"}}, 400, "invalid_value", "tool_choice"),
    ({"model": MODEL, "messages": [{"role": "tool", "content": "21C"}]}, 400, "invalid_value",
     "messages[0].tool_call_id"),
])
async def test_bad_requests_get_a_typed_error_never_a_fallback(text_server, body, status, code, param):
    r = await post(text_server, "/v1/generate", body)
    assert r.status_code == status
    err = r.json()["error"]
    assert (err["code"], err["param"]) == (code, param)


async def test_framing_errors_auth_and_body_limit(text_server):
    async with httpx.AsyncClient(base_url=text_server.http_url) as http:
        r = await http.post("/v1/generate", content=b"{not json", headers=auth())
        assert (r.status_code, r.json()["error"]["code"]) == (400, "invalid_json")
        r = await http.post("/v1/generate", json={"model": MODEL, "messages": FRANCE})
        assert (r.status_code, r.json()["error"]["code"]) == (401, "unauthorized")
        big = {"model": MODEL, "messages": [{"role": "user", "content": "x" * (1 << 20)}]}
        r = await http.post("/v1/generate", json=big, headers=auth())
        assert (r.status_code, r.json()["error"]["code"]) == (413, "payload_too_large")


async def test_required_tool_call_streams_valid_arguments(text_server):
    events = await generate(text_server, {
        "model": MODEL, "messages": [{"role": "user", "content": "What's the weather in Paris?"}],
        "tools": [WEATHER_TOOL], "tool_choice": "required"})
    deltas = [d for e, d in events if e == "tool-call-delta"]
    calls = [d for e, d in events if e == "tool-call"]
    assert len(calls) == 1 and calls[0]["name"] == "get_weather"
    assert deltas[0]["name"] == "get_weather" and len(deltas) > 2  # streamed, not one blob
    assert "".join(d["arguments_delta"] for d in deltas) == calls[0]["arguments"]
    assert {d["id"] for d in deltas} == {calls[0]["id"]}
    args = json.loads(calls[0]["arguments"])
    assert isinstance(args["city"], str) and "Paris" in args["city"]
    assert events[-1][1]["finish_reason"] == "tool_calls"
    assert not any(e == "text-delta" for e, _ in events)


async def test_named_tool_choice_and_parallel_calls(text_server):
    time_tool = {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
    events = await generate(text_server, {
        "model": MODEL, "messages": [{"role": "user", "content": "What time is it in Tokyo?"}],
        "tools": [WEATHER_TOOL, time_tool], "tool_choice": {"type": "function", "name": "get_time"},
        "options": {"max_tokens": 64}})
    calls = [d for e, d in events if e == "tool-call"]
    assert [c["name"] for c in calls] == ["get_time"]
    assert isinstance(json.loads(calls[0]["arguments"])["timezone"], str)
    events = await generate(text_server, {
        "model": MODEL, "messages": [{"role": "user", "content": "Weather in Paris and in Rome?"}],
        "tools": [WEATHER_TOOL], "tool_choice": "required", "parallel_tool_calls": True,
        "options": {"max_tokens": 96}})
    calls = [d for e, d in events if e == "tool-call"]
    assert calls and [c["index"] for c in calls] == list(range(len(calls)))
    assert all(json.loads(c["arguments"])["city"] for c in calls)
    assert events[-1][1]["finish_reason"] == "tool_calls"


async def test_external_tool_results_are_used_and_never_executed(text_server):
    messages = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny, 24 degrees Celsius."},
    ]
    events = await generate(text_server, {"model": MODEL, "messages": messages, "tools": [WEATHER_TOOL],
                                          "tool_choice": "none", "options": {"max_tokens": 40}})
    text = text_of(events)
    assert events[-1][1]["finish_reason"] in ("stop", "length")
    assert not any(e.startswith("tool-call") for e, _ in events)
    assert "24" in text or "sunny" in text.lower()


async def test_reasoning_budget_forces_the_answer(text_server):
    events = await generate(text_server, {
        "model": MODEL, "messages": [{"role": "user", "content": "Is 17 a prime number?"}],
        "reasoning": {"enabled": True, "budget_tokens": 8}, "options": {"max_tokens": 48}})
    names = [e for e, _ in events]
    assert names[0] == "reasoning-delta" and "text-delta" in names
    # every reasoning delta comes before the answer
    assert max(i for i, n in enumerate(names) if n == "reasoning-delta") < names.index("text-delta")
    usage = events[-1][1]["usage"]
    assert usage["completion_tokens_details"]["reasoning_tokens"] == 8
    assert "</think>" not in text_of(events)


async def test_disconnect_aborts_the_engine_request(text_server):
    body = {"model": MODEL, "messages": STORY, "options": {"max_tokens": 400}}
    async with httpx.AsyncClient(base_url=text_server.http_url, timeout=120) as http:
        async with http.stream("POST", "/v1/generate", json=body, headers=auth()) as r:
            seen = 0
            async for _, event, _ in sse_events(r):
                seen += event == "text-delta"
                if seen == 3:
                    break
            assert text_server.runtime.text.generator.active_requests == 1
    assert await engine_idle(text_server)
    assert text_server.runtime.text.generator.aborted_requests >= 1


async def test_abort_by_request_id_and_deadline(text_server):
    body = {"model": MODEL, "messages": STORY, "request_id": "story-1", "options": {"max_tokens": 400}}
    task = asyncio.create_task(generate(text_server, body))
    while text_server.runtime.text.generator.active_requests == 0:
        await asyncio.sleep(0.02)
    # another key cannot see it
    r = await post(text_server, "/v1/requests/story-1/abort", {}, key=KEYS[1])
    assert (r.status_code, r.json()["error"]["code"]) == (404, "request_not_found")
    r = await post(text_server, "/v1/requests/story-1/abort", {})
    assert r.status_code == 200 and r.json()["aborted"] is True
    events = await task
    assert events[-1] == ("finish", events[-1][1]) and events[-1][1]["finish_reason"] == "cancelled"
    assert await engine_idle(text_server)

    events = await generate(text_server, {**body, "request_id": "story-2", "deadline_ms": 400})
    assert events[-1][0] == "error" and events[-1][1]["error"]["code"] == "deadline_exceeded"
    assert [e for e, _ in events].count("error") == 1
    assert await engine_idle(text_server)
    # without streaming, the answer has the error's status
    r = await post(text_server, "/v1/generate", {**body, "request_id": "story-3", "deadline_ms": 800,
                                                 "stream": False})
    assert r.status_code == 504 and r.json()["error"]["code"] == "deadline_exceeded"
    assert await engine_idle(text_server)
