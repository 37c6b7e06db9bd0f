"""The vLLM stage with the REAL engine (SmolLM2-135M-Instruct, float32, greedy).

One engine serves the whole test session (``vllm_fixtures.vllm_stage``).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer
from vllm.v1.engine.exceptions import EngineDeadError
from vllm_duplex.domain.contracts import SamplingConfig
from vllm_duplex.domain.payloads import (
    ContextMessage,
    GenerateRequest,
    GenerationDone,
    ResetContext,
    StageFailed,
    StageInput,
    StageOutput,
    TextDelta,
    ToolCall,
)
from vllm_duplex.assets import prepare
from vllm_duplex.stages.vllm.llm import VllmLlmStage, parse_tool_call
from support.vllm_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    GREEDY,
    INSTRUCTED,
    ask,
    assistant,
    next_reply,
    no_leaked_tasks,
    open_port,
    speak,
    user,
)

session_loop = pytest.mark.asyncio(loop_scope="session")  # the engine lives in that loop

FRANCE = "What is the capital of France?"
WEATHER = ({"type": "function", "name": "get_weather", "description": "Current weather in a city",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                           "required": ["city"]}},)


# ---- 1. model preparation ------------------------------------------------------


def test_prepare_is_idempotent_and_redoes_an_interrupted_run(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    # A tmp cache: conversion takes ~20 s here, and the real cache stays untouched.
    monkeypatch.setenv(prepare.CACHE_ENV, str(tmp_path))
    target = prepare.model_dir()
    assert target == tmp_path / "models" / "smollm2-135m-instruct"
    target.mkdir(parents=True)
    (target / "config.json").write_text("{half written")  # an interrupted run: no marker
    assert not prepare.is_prepared()

    assert prepare.prepared_model_dir() == target
    assert (target / prepare.MARKER).is_file()
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= {p.name for p in target.iterdir()}
    assert "quantization_config" not in (target / "config.json").read_text()
    marker_mtime = (target / prepare.MARKER).stat().st_mtime_ns

    def no_second_conversion(*args: Any) -> None:
        raise AssertionError("converted again")

    monkeypatch.setattr(prepare, "_convert", no_second_conversion)
    assert prepare.prepared_model_dir() == target  # second call: the marker says done
    assert (target / prepare.MARKER).stat().st_mtime_ns == marker_mtime
    assert not [p for p in tmp_path.joinpath("models").iterdir() if p.name.startswith(".")]


def test_prepare_cli_prints_the_directory(capsys: pytest.CaptureFixture[str]) -> None:
    from vllm_duplex.cli import main

    assert main(["prepare"]) == 0
    assert capsys.readouterr().out.strip() == str(prepare.model_dir())


# ---- 2-6. the stage ---------------------------------------------------------------


@session_loop
async def test_streaming_prefill_equals_one_shot_prefill(vllm_stage: VllmLlmStage) -> None:
    questions = [FRANCE, "Tell me a short story about a brave little dog."]
    for n, question in enumerate(questions):
        streamed, s_fence = await open_port(vllm_stage, f"stream-{n}")
        oneshot, o_fence = await open_port(vllm_stage, f"oneshot-{n}")
        try:
            fast = vllm_stage.fast_paths
            await speak(streamed, s_fence, question)
            s_text, s_outs = await ask(streamed, s_fence, (user(question),))
            assert vllm_stage.fast_paths == fast + 1  # only the assistant prefix was appended
            o_text, o_outs = await ask(oneshot, o_fence, (user(question),))
            assert s_text and s_text == o_text
            assert s_outs[-1].payload == o_outs[-1].payload  # same finish reason and usage
        finally:
            await streamed.close()
            await oneshot.close()


@session_loop
async def test_answers_the_capital_of_france(vllm_stage: VllmLlmStage) -> None:
    port, fence = await open_port(vllm_stage, "france")
    try:
        text, outs = await ask(port, fence, (INSTRUCTED, user(FRANCE)))
    finally:
        await port.close()
    assert "Paris" in text
    done = outs[-1].payload
    assert isinstance(done, GenerationDone) and done.finish_reason == "stop"
    assert done.input_tokens > 20 and done.output_tokens > 3
    assert all(o.fence == fence and o.request_id == fence.request_id("resp") for o in outs)


@session_loop
async def test_multi_turn_fast_path_then_rebuild_on_divergence(vllm_stage: VllmLlmStage) -> None:
    port, fence = await open_port(vllm_stage, "multi", (INSTRUCTED,))
    try:
        await speak(port, fence, FRANCE)
        first, _ = await ask(port, fence, (INSTRUCTED, user(FRANCE)), "r1")
        assert "Paris" in first

        history = (INSTRUCTED, user(FRANCE), assistant(first), user("And of Germany?"))
        rebuilds, fast = vllm_stage.rebuilds, vllm_stage.fast_paths
        await port.submit(StageInput(fence, fence.request_id("resp"),
                                     GenerateRequest("r2", history, GREEDY)))
        # The next turn's words arrive while the reply streams: they wait for
        # its end, then append to the same live request.
        await speak(port, fence, "And of Italy?")
        second, _ = await next_reply(port)
        assert "Berlin" in second
        assert (vllm_stage.rebuilds, vllm_stage.fast_paths) == (rebuilds, fast + 1)

        third, _ = await ask(port, fence, (*history, assistant(second), user("And of Italy?")), "r3")
        assert "Rome" in third
        assert (vllm_stage.rebuilds, vllm_stage.fast_paths) == (rebuilds, fast + 2)

        # The user heard only part of the reply (truncated): history diverges.
        diverged = (*history, assistant(second.split()[0]), user("What is the capital of Spain?"))
        fourth, outs = await ask(port, fence, diverged, "r4")
        assert vllm_stage.rebuilds == rebuilds + 1
        assert fourth.strip() and isinstance(outs[-1].payload, GenerationDone)
    finally:
        await port.close()


@session_loop
async def test_cancel_stops_outputs_within_a_decode_step(vllm_stage: VllmLlmStage) -> None:
    engine = vllm_stage.engine
    unfinished, active = engine.get_num_unfinished_requests(), vllm_stage.active_requests
    port, fence = await open_port(vllm_stage, "cancel")
    outs: list[StageOutput] = []
    first_delta, done = asyncio.Event(), asyncio.Event()

    async def read() -> None:
        async for out in port.outputs():
            outs.append(out)
            if isinstance(out.payload, TextDelta):
                first_delta.set()
            if isinstance(out.payload, GenerationDone):
                done.set()

    reader = asyncio.create_task(read())
    try:
        long = SamplingConfig(max_tokens=400, extra={"ignore_eos": True})
        context = (user("Count from one to two hundred, one number per line."),)
        await port.submit(StageInput(fence, fence.request_id("resp"),
                                     GenerateRequest("long", context, long)))
        await asyncio.wait_for(first_delta.wait(), 60)
        assert engine.get_num_unfinished_requests() == unfinished + 1
        aborted = vllm_stage.aborted_requests

        new = fence.next_epoch()
        await port.cancel(new)
        cancelled_at = vllm_stage.clock.now()
        assert vllm_stage.aborted_requests == aborted + 1
        assert engine.get_num_unfinished_requests() == unfinished  # nothing left in vLLM
        assert vllm_stage.active_requests == active
        await asyncio.sleep(0.5)  # ~10 decode steps of this model on 2 cores
        old = [o for o in outs if o.fence == fence]
        assert old and all(o.created_at <= cancelled_at for o in old)
        assert not any(isinstance(o.payload, GenerationDone) for o in old)

        # The port answers under the new fence (the live request is rebuilt).
        await port.submit(StageInput(new, new.request_id("in"), ResetContext((user(FRANCE),))))
        n = len(outs)
        await port.submit(StageInput(new, new.request_id("resp"),
                                     GenerateRequest("again", (user(FRANCE),), GREEDY)))
        await asyncio.wait_for(done.wait(), 120)
        text = "".join(o.payload.text for o in outs[n:] if isinstance(o.payload, TextDelta))
        assert "Paris" in text and all(o.fence == new for o in outs[n:])
    finally:
        await port.close()
        await reader
    assert engine.get_num_unfinished_requests() == unfinished


@session_loop
async def test_reset_context_then_generate(vllm_stage: VllmLlmStage) -> None:
    port, fence = await open_port(vllm_stage, "reset")
    try:
        await speak(port, fence, "Tell me about the weather")  # to be thrown away
        context = (INSTRUCTED, user(FRANCE))
        new = fence.next_incarnation()
        await port.cancel(new)
        await port.submit(StageInput(new, new.request_id("in"), ResetContext(context)))
        fast = vllm_stage.fast_paths
        text, outs = await ask(port, new, context)
        assert vllm_stage.fast_paths == fast + 1  # prefilled by the reset, not rebuilt
        assert "Paris" in text and all(o.fence == new for o in outs)
    finally:
        await port.close()


@session_loop
async def test_turn_start_reset_extends_the_live_request(vllm_stage: VllmLlmStage) -> None:
    """The cascade policy opens every turn with ResetContext(history): when the
    live request already holds a prefix of it, only the rest is appended."""
    port, fence = await open_port(vllm_stage, "turnstart")
    try:
        first, _ = await ask(port, fence, (INSTRUCTED, user(FRANCE)), "t1")
        history = (INSTRUCTED, user(FRANCE), assistant(first))
        rebuilds, fast = vllm_stage.rebuilds, vllm_stage.fast_paths
        await port.submit(StageInput(fence, fence.request_id("llm"), ResetContext(history)))
        await speak(port, fence, "And of Germany?")
        second, _ = await ask(port, fence, (*history, user("And of Germany?")), "t2")
        assert "Berlin" in second
        assert vllm_stage.rebuilds == rebuilds and vllm_stage.fast_paths == fast + 2
    finally:
        await port.close()


@session_loop
async def test_a_long_conversation_is_tokenized_off_the_event_loop(
        vllm_stage: VllmLlmStage, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rebuilt live request tokenizes the whole conversation: ~17 ms for 2k
    tokens on this CPU, which ran on the loop of every session (issue 21)."""
    import threading

    from vllm_duplex.stages.vllm.chat import ChatTemplate
    from vllm_duplex.stages.vllm.llm import INLINE_TOKENIZE_CHARS

    loop_thread = threading.get_ident()
    on_loop: list[int] = []  # lengths of the texts tokenized on the loop
    encode = ChatTemplate.encode

    def spy(self: ChatTemplate, text: str) -> list[int]:
        if threading.get_ident() == loop_thread:
            on_loop.append(len(text))
        return encode(self, text)

    monkeypatch.setattr(ChatTemplate, "encode", spy)
    history = tuple(m for i in range(12) for m in (
        user(f"Tell me fact number {i} about France, please."),
        assistant(f"Fact number {i}: France has many old cities, long rivers and fine food.")))
    port, fence = await open_port(vllm_stage, "longctx")
    try:
        await port.submit(StageInput(fence, fence.request_id("in"), ResetContext(history)))
        text, _ = await ask(port, fence, (*history, user(FRANCE)))
    finally:
        await port.close()
    assert "Paris" in text
    assert on_loop and max(on_loop) <= INLINE_TOKENIZE_CHARS  # only a few words at a time


@session_loop
async def test_stop_strings_are_enforced_by_the_stage(vllm_stage: VllmLlmStage) -> None:
    port, fence = await open_port(vllm_stage, "stop")
    try:
        text, outs = await ask(port, fence, (INSTRUCTED, user(FRANCE)),
                               sampling=SamplingConfig(max_tokens=48, stop=(" Paris",)))
        assert text == "The capital of France is"
        assert isinstance(outs[-1].payload, GenerationDone) and outs[-1].payload.finish_reason == "stop"
        # The aborted live request is rebuilt for the next turn.
        rebuilt = vllm_stage.fresh_prefills
        again, _ = await ask(port, fence, (INSTRUCTED, user(FRANCE), assistant(text),
                                           user("Are you sure?")))
        assert again and vllm_stage.fresh_prefills == rebuilt + 1
    finally:
        await port.close()


@session_loop
async def test_tool_call_with_constrained_decoding(vllm_stage: VllmLlmStage) -> None:
    port, fence = await open_port(vllm_stage, "tools")
    vllm_stage.constrain_tools = True
    try:
        _, outs = await ask(port, fence, (user("What is the weather in Paris?"),), tools=WEATHER)
    finally:
        vllm_stage.constrain_tools = False
        await port.close()
    calls = [o.payload for o in outs if isinstance(o.payload, ToolCall)]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    assert json.loads(calls[0].arguments)["city"] == "Paris"
    assert not any(isinstance(o.payload, TextDelta) for o in outs)
    assert isinstance(outs[-1].payload, GenerationDone)


def test_parse_tool_call() -> None:
    tools = ({"type": "function", "name": "get_weather", "parameters": {"type": "object"}},)
    assert parse_tool_call('{"name": "get_weather", "arguments": {"city": "Paris"}}', tools) == (
        "get_weather", '{"city": "Paris"}')
    assert parse_tool_call('<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>',
                           tools) == ("get_weather", "{}")
    assert parse_tool_call('{"name": "other", "arguments": {}}', tools) is None
    assert parse_tool_call("The weather is fine.", tools) is None


# ---- engine death (a stub engine: a real one cannot be killed per test) -------------


class _DeadAfterStart:
    """Enough of an engine client for ``start``; every request then finds it dead."""

    def __init__(self) -> None:
        self.errored = False
        self._tokenizer = AutoTokenizer.from_pretrained(str(prepare.prepared_model_dir()))

    def get_tokenizer(self) -> Any:
        return self._tokenizer

    async def generate(self, prompt: Any, params: Any, request_id: str) -> AsyncIterator[Any]:
        if request_id.startswith("duplex-warmup"):
            return
        if isinstance(prompt, AsyncIterator):
            await prompt.aclose()  # type: ignore[attr-defined]
        self.errored = True
        raise EngineDeadError()
        yield  # an async generator

    async def abort(self, request_id: Any) -> None:
        pass


@session_loop
async def test_engine_death_fails_the_port_and_health() -> None:
    stage = VllmLlmStage(engine=_DeadAfterStart())  # type: ignore[arg-type]
    port, fence = await open_port(stage, "dead")
    try:
        assert stage.healthy
        _, outs = await ask(port, fence, (user(FRANCE),))
        failed = outs[-1].payload
        assert isinstance(failed, StageFailed) and failed.error.code == "engine_dead"
        assert not stage.healthy
        _, outs = await ask(port, fence, (user(FRANCE),))  # refused at once
        assert isinstance(outs[-1].payload, StageFailed) and outs[-1].payload.error.code == "engine_dead"
    finally:
        await port.close()
    assert stage.active_requests == 0
