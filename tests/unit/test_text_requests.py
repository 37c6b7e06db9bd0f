"""The generate request parser and the streaming-input ordering rules (sans-I/O)."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.input_sequence import Accepted, InputSequence
from vllm_duplex.text.requests import GenerationControl, parse_control, parse_generate

MODEL = "m"
USER = [{"role": "user", "content": "hi"}]


def parse(**body):
    return parse_generate({"model": MODEL, "messages": USER, **body}, served_model=MODEL,
                          max_tokens_cap=100)


def error_of(fn, *args, **kwargs) -> DuplexError:
    with pytest.raises(DuplexError) as info:
        fn(*args, **kwargs)
    return info.value


def test_full_request_shapes_are_understood():
    spec = parse(
        instructions="Be brief.",
        messages=[
            {"role": "developer", "content": [{"type": "text", "text": "Rules."}]},
            {"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "w", "arguments": {"city": "Rome"}}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
        ],
        tools=[{"type": "function", "function": {"name": "w", "parameters": {"type": "object"}}}],
        tool_choice={"type": "function", "function": {"name": "w"}},
        options={"max_tokens": 500, "temperature": 0.5, "top_p": 0.9, "stop": "END", "seed": 3},
        reasoning={"budget_tokens": 7}, stream_id="s-1", deadline_ms=1000, request_id="r-1")
    assert [m.role for m in spec.messages] == ["system", "system", "user", "assistant", "tool"]
    assert spec.messages[3].tool_calls[0].arguments == json.dumps({"city": "Rome"})
    # the model sees the call the way it is asked to write one
    assert json.loads(spec.messages[3].context().text) == {"name": "w", "arguments": {"city": "Rome"}}
    assert spec.tool_choice == {"type": "function", "name": "w"} and spec.must_call
    assert spec.sampling.max_tokens == 100  # clamped to the cap
    assert spec.sampling.stop == ("END",) and spec.sampling.extra == {"top_p": 0.9}
    assert (spec.reasoning, spec.reasoning_budget) == (True, 7)
    assert (spec.stream_id, spec.deadline_ms, spec.request_id) == ("s-1", 1000, "r-1")


@pytest.mark.parametrize("body, code, param", [
    ({"model": "other"}, "model_not_found", "model"),
    ({"model": None}, "invalid_value", "model"),
    ({"options": {"best_of": 2}}, "unsupported_option", "options.best_of"),
    ({"options": {"max_tokens": 0}}, "invalid_value", "options.max_tokens"),
    ({"options": {"max_tokens": 1.5}}, "invalid_value", "options.max_tokens"),
    ({"options": {"top_p": True}}, "invalid_value", "options.top_p"),
    ({"options": {"stop": [""]}}, "invalid_value", "options.stop"),
    ({"tools": [{"type": "code_interpreter"}]}, "unsupported_option", "tools[0].type"),
    ({"tools": [{"name": "a b"}]}, "invalid_value", "tools[0].name"),
    ({"tools": [{"name": "a"}, {"name": "a"}]}, "invalid_value", "tools[1].name"),
    ({"messages": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]},
     "unsupported_option", "messages[0].content[0]"),
    ({"messages": [{"role": "user", "content": "x", "tool_calls": []}]}, None, None),
    ({"messages": [{"role": "user", "tool_calls": [{"function": {"name": "w"}}]}]},
     "invalid_value", "messages[0].tool_calls"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "w", "arguments": "[1]"}}]}]},
     "invalid_value", "messages[0].tool_calls[0].function.arguments"),
    ({"request_id": "has space"}, "invalid_value", "request_id"),
    ({"stream_id": ""}, "invalid_value", "stream_id"),
    ({"deadline_ms": 0}, "invalid_value", "deadline_ms"),
    ({"reasoning": {"enabled": "yes"}}, "invalid_value", "reasoning.enabled"),
    ({"parallel_tool_calls": 1}, "invalid_value", "parallel_tool_calls"),
    ({"logit_bias": {}}, "unsupported_option", "logit_bias"),
])
def test_each_bad_field_is_named(body, code, param):
    if code is None:
        parse(**body)
        return
    err = error_of(parse, **body)
    assert (err.code, err.param) == (code, param)


def test_control_fields():
    assert parse_control({"max_tokens": 500, "reasoning_budget": None}, 100) == {
        "max_tokens": 100, "reasoning_budget": None}
    assert error_of(parse_control, {"tools": []}, 100).code == "immutable_field"
    assert error_of(parse_control, [], 100).code == "invalid_value"


async def test_control_changes_apply_when_taken():
    control = GenerationControl(max_tokens=10)
    fut = control.request({"max_tokens": 20})
    assert control.max_tokens == 10  # not before the generation reaches a boundary
    [(changes, waiter)] = control.take()
    assert control.max_tokens == 20 and waiter is fut and changes == {"max_tokens": 20}
    late = control.request({"max_tokens": 5})
    control.abandon(DuplexError("generation_finished", "over"))
    with pytest.raises(DuplexError):
        await late


def test_input_sequence_rules():
    seq = InputSequence(max_chunk_bytes=10, max_total_bytes=15)
    assert seq.accept(1, 5) is Accepted.NEW
    assert seq.accept(1, 5) is Accepted.DUPLICATE
    err = error_of(seq.accept, 3, 1)
    assert (err.code, err.details["expected_seq"]) == ("sequence_gap", 2)
    assert error_of(seq.accept, 2, 11).code == "payload_too_large"
    assert seq.accept(2, 10) is Accepted.NEW
    assert error_of(seq.accept, 3, 1).code == "payload_too_large"  # 16 > 15 in total
    for bad in (0, -1, "3", True, None):
        assert error_of(seq.accept, bad, 1).code == "invalid_value"
    assert error_of(seq.end, 5).code == "sequence_gap"
    seq.end(2)
    assert error_of(seq.accept, 3, 1).code == "input_after_end"
    assert error_of(seq.end).code == "input_after_end"


@given(st.lists(st.integers(min_value=1, max_value=8), max_size=40))
def test_input_sequence_accepts_exactly_the_next_seq(seqs):
    seq = InputSequence(max_chunk_bytes=10, max_total_bytes=10**6)
    accepted = []
    for n in seqs:
        try:
            if seq.accept(n, 1) is Accepted.NEW:
                accepted.append(n)
        except DuplexError as err:
            assert err.code == "sequence_gap" and n > seq.next_seq
    assert accepted == list(range(1, len(accepted) + 1))
