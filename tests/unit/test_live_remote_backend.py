"""A GPT-Live delegation on an external Responses backend, without sockets:
the deployment's ``responses_backends`` (``host/backends.py``), the request a
delegated turn makes (``remote.py``), the remote's stream read line by line
into ``session.delegation.created`` and ``response.event`` frames (each
validated by the SDK's models, nested events too), and the turn's course
through the codec (``remote_turns.py``): the voice's call, the backend's
call answered by the client and continued, the voice's answer."""

from __future__ import annotations

import json

import pytest
from vllm_duplex.domain.backends import ResponsesBackend
from vllm_duplex.domain.commands import ItemCreate, ResponseCreate
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.payloads import ToolCall
from vllm_duplex.host.backends import backends_from_raw
from vllm_duplex.host.deploy import load_config
from vllm_duplex.realtime.wire.live.delegated import LiveCommands
from vllm_duplex.realtime.wire.live.remote import Outcome, RemoteRun

from test_live_delegation_codec import WEATHER, finish, render, reply, started

REMOTE = ResponsesBackend("remote", "http://127.0.0.1:9/v1", "smollm2", timeout_s=5.0,
                          api_key="sk-secret")
DELEGATION = {"type": "responses", "responses": {
    "model": "remote", "tools": [WEATHER], "instructions": "Use the tools."}}


# ---- the config ---------------------------------------------------------------------


def test_a_backend_is_read_with_its_key_from_the_environment_or_a_file(monkeypatch, tmp_path):
    monkeypatch.setenv("REMOTE_KEY", "sk-from-env")
    (tmp_path / "key").write_text("sk-from-file\n")
    got = backends_from_raw({
        "a": {"base_url": "http://10.0.0.7:8000/v1/", "api_key_env": "REMOTE_KEY"},
        "b": {"base_url": "https://x.example/v1", "model": "m", "timeout_s": 5,
              "api_key_file": str(tmp_path / "key")}})
    assert got["a"].url == "http://10.0.0.7:8000/v1/responses" and got["a"].model == "a"
    assert got["a"].api_key == "sk-from-env" and got["a"].timeout_s == 60.0
    assert got["b"].api_key == "sk-from-file" and got["b"].timeout_s == 5.0
    assert "sk-from" not in repr(got)  # a key never shows in a log


@pytest.mark.parametrize("raw, says", [
    ({"a": {"base_url": "10.0.0.7:8000"}}, "base_url"),
    ({"a": {"base_url": "http://h/v1", "api_key": "sk-inline"}}, "unknown"),
    ({"a": {"base_url": "http://h/v1", "api_key_env": "NOT_SET_ANYWHERE_42"}}, "not set"),
    ({"a": {"base_url": "http://h/v1", "timeout_s": 0}}, "timeout_s"),
    (["a"], "maps names"),
])
def test_a_bad_backend_fails_the_start_by_name(raw, says):
    with pytest.raises(ValueError, match=says):
        backends_from_raw(raw)


def test_the_shipped_configs_name_no_backend_so_delegation_stays_on_the_engine():
    assert load_config("cascade-cpu").responses_backends == {}


# ---- a delegated turn through the codec ---------------------------------------------


def codec_with_backend():
    c, _ = started(delegation=DELEGATION)
    c.remote.backends = {"remote": REMOTE}
    c.decisions.heard("What is the weather in Paris?", None)
    return c


def voice_calls(c, rid: str = "resp_1") -> list:
    voice = reply(rid)
    frames = render(c, voice.start_events()[0])
    _, calls = voice.on_tool_call(ToolCall(rid, "call_v", "get_weather", '{"city": "Paris"}'))
    for event in [*calls, *finish(voice)]:
        frames += render(c, event)
    return frames


def sse(*events: dict) -> list[str]:
    lines = []
    for e in events:
        lines += [f"event: {e['type']}", "data: " + json.dumps(e), ""]
    return lines


def snapshot(status: str, output: list | None = None) -> dict:
    # As vLLM's server writes it: fields of its own beside the API's.
    return {"id": "resp_remote_1", "object": "response", "created_at": 1796558581,
            "model": "smollm2", "status": status, "output": output or [],
            "tools": [WEATHER], "tool_choice": "auto", "parallel_tool_calls": True,
            "kv_transfer_params": None, "input_messages": None, "usage": None}


CALL = {"type": "function_call", "id": "fc_1", "call_id": "call_remote_1",
        "name": "get_weather", "arguments": '{"city": "Paris"}', "status": "completed",
        "caller": None, "namespace": None}


def call_stream() -> list[str]:
    return sse({"type": "response.created", "sequence_number": 0,
                "response": snapshot("in_progress")},
               {"type": "response.output_item.added", "sequence_number": 1, "output_index": 0,
                "item": {**CALL, "arguments": "", "status": "in_progress"}},
               {"type": "response.function_call_arguments.delta", "sequence_number": 2,
                "item_id": "fc_1", "output_index": 0, "delta": '{"city": "Paris"}'},
               {"type": "response.function_call_arguments.done", "sequence_number": 3,
                "item_id": "fc_1", "output_index": 0, "arguments": '{"city": "Paris"}',
                "name": "get_weather"},
               {"type": "response.output_item.done", "sequence_number": 4, "output_index": 0,
                "item": CALL},
               {"type": "response.completed", "sequence_number": 5,
                "response": {**snapshot("completed", [CALL]),
                             "usage": {"input_tokens": 37, "output_tokens": 12,
                                       "total_tokens": 49}}})


def answer_stream(text: str) -> list[str]:
    message = {"type": "message", "id": "msg_1", "role": "assistant", "status": "completed",
               "content": [{"type": "output_text", "text": text, "annotations": [],
                            "logprobs": None}]}
    return sse({"type": "response.created", "sequence_number": 0,
                "response": snapshot("in_progress")},
               {"type": "response.output_text.delta", "sequence_number": 1, "item_id": "msg_1",
                "output_index": 0, "content_index": 0, "delta": text, "logprobs": []},
               {"type": "response.completed", "sequence_number": 2,
                "response": snapshot("completed", [message])})


def play(c, run: RemoteRun, lines: list[str]) -> tuple[list, Outcome]:
    stream = c.remote.stream(run)
    frames = []
    for line in lines:
        frames += [_live(f) for f in c.render_remote(stream.feed(line))]
    return frames, stream.finish()


def _live(text: str):
    from support.live_shapes import live_event, responses_event

    event = live_event(text)
    if event.type == "response.event":
        responses_event(event.event)
    return event


def test_the_voices_call_runs_the_turn_on_the_backend_and_its_words_are_spoken():
    c = codec_with_backend()
    # The voice's own call is not the client's to answer: only its reply's usage.
    assert [f.type for f in voice_calls(c)] == ["session.usage.updated"]
    [run] = c.remote.take_runs()
    assert run.backend is REMOTE
    assert run.body["model"] == "smollm2" and run.body["stream"] is True
    assert run.body["input"] == [{"type": "message", "role": "user",
                                  "content": "What is the weather in Paris?"}]
    assert run.body["tools"] == [WEATHER] and run.body["instructions"] == "Use the tools."

    frames, outcome = play(c, run, call_stream())
    created, *events = frames
    assert created.type == "session.delegation.created"
    assert created.delegation.response_id == "resp_remote_1"
    assert {e.delegation_id for e in events} == {created.delegation.id}
    assert [e.event["type"] for e in events] == [
        "response.created", "response.output_item.added",
        "response.function_call_arguments.delta", "response.function_call_arguments.done",
        "response.output_item.done", "response.completed"]
    assert c.remote.finished(run, outcome) == []  # the client answers the call first

    # The client answers the backend's call and continues: the same backend, the full input.
    ack = c.parse(json.dumps({"type": "response.item.create", "item": {
        "type": "function_call_output", "call_id": "call_remote_1", "output": "18 C, sunny"}}))
    assert ack == LiveCommands(())
    more = c.parse(json.dumps({"type": "response.create", "event_id": "evt_go"}))
    assert isinstance(more, RemoteRun) and more.event_id == "evt_go"
    assert more.delegation_id == run.delegation_id and more.backend is REMOTE
    assert more.body["input"][1:] == [
        {"type": "function_call", "call_id": "call_remote_1", "name": "get_weather",
         "arguments": '{"city": "Paris"}'},
        {"type": "function_call_output", "call_id": "call_remote_1", "output": "18 C, sunny"}]

    frames, outcome = play(c, more, answer_stream("It is 18 degrees and sunny in Paris."))
    assert "session.delegation.created" not in [f.type for f in frames]  # announced once
    output, speak = c.remote.finished(more, outcome)
    assert isinstance(output, ItemCreate) and output.item.call_id == "call_v"
    assert output.item.output == "It is 18 degrees and sunny in Paris."
    assert isinstance(speak, ResponseCreate) and speak.options.tool_choice == "none"


def test_an_output_for_no_waiting_call_and_a_continuation_too_early_are_typed_errors():
    c = codec_with_backend()
    voice_calls(c)
    [run] = c.remote.take_runs()
    c.remote.finished(run, play(c, run, call_stream())[1])
    with pytest.raises(DuplexError) as err:
        c.parse(json.dumps({"type": "response.create"}))
    assert err.value.code == "invalid_value"
    with pytest.raises(DuplexError) as err:
        c.parse(json.dumps({"type": "response.item.create", "item": {
            "type": "function_call_output", "call_id": "call_unknown", "output": "x"}}))
    assert err.value.param == "item.call_id"


@pytest.mark.parametrize("lines, says", [
    (["data: {not json", ""], "not JSON"),
    (["data: {\"sequence_number\": 0}", ""], "without a type"),
    (sse({"type": "response.created", "sequence_number": 0,
          "response": snapshot("in_progress")}), "ended its stream"),
    (sse({"type": "error", "sequence_number": 0, "message": "model overloaded"}),
     "model overloaded"),
])
def test_a_stream_that_is_not_a_responses_stream_is_a_backend_error(lines, says):
    c = codec_with_backend()
    voice_calls(c)
    [run] = c.remote.take_runs()
    with pytest.raises(DuplexError) as err:
        play(c, run, lines)
    assert err.value.code == "backend_error" and says in err.value.message
    assert "'remote'" in err.value.message and "sk-secret" not in err.value.message


def test_a_failed_run_ends_the_delegation_and_the_voice_says_so_and_goes_on():
    c = codec_with_backend()
    voice_calls(c)
    [run] = c.remote.take_runs()
    before = [_live(f) for f in c.render_remote(c.remote.created_unannounced(run))]
    assert [f.type for f in before] == ["session.delegation.created"]
    output, speak = c.remote.finished(run, DuplexError("deadline_exceeded", "too slow"))
    assert output.item.call_id == "call_v" and "did not answer" in output.item.output
    assert isinstance(speak, ResponseCreate)
    # The next turn delegates again, a new delegation.
    c.decisions.heard("And in Rome?", None)
    voice_calls(c, "resp_2")
    [again] = c.remote.take_runs()
    assert again.delegation_id != run.delegation_id
    assert [m["content"] for m in again.body["input"]][-1] == "And in Rome?"


def test_a_model_that_names_no_backend_stays_on_the_engines_own_llm():
    c, _ = started(delegation={**DELEGATION, "responses": {**DELEGATION["responses"],
                                                           "model": "gpt-5.5"}})
    c.remote.backends = {"remote": REMOTE}
    frames = voice_calls(c)
    assert "session.delegation.created" in [f.type for f in frames]
    assert c.remote.take_runs() == []


def test_words_of_a_voice_reply_are_not_a_delegation():
    c = codec_with_backend()
    voice = reply("resp_9")
    frames = render(c, voice.start_events()[0])
    for event in finish(voice):
        frames += render(c, event)
    assert c.remote.take_runs() == []
    assert "session.delegation.created" not in [f.type for f in frames]
