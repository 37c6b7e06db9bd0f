"""GPT-Live Decisions without sockets or an engine: the ``decisions``
delegation and ``triggers`` configs, Decision items, ``decision.create``, the
evaluator's asks and answers, and the runner that answers them on a scripted
chooser. Every server event rendered is checked against the SDK's own model
(``tests/support/live_shapes.py``)."""

from __future__ import annotations

import asyncio
import json
import math

import pytest
from openai.types.live import DecisionCreateEvent, DecisionItemCreateEvent, DecisionItemDeleteEvent
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.decisions import ChoiceAsk, Chosen
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.realtime.server.live.decisions import DecisionRunner
from vllm_duplex.realtime.wire.live.decisions import DecisionRun, ItemReply
from vllm_duplex.testing.decisions import ScriptedChooser

from support.live_shapes import live_event
from support.live_kit import SESSION_DOC, codec, env, frame, start

WEATHER = {"type": "predicate", "name": "weather",
           "instructions": "Did the user ask about the weather?"}
TOPIC = {"type": "choice", "name": "topic", "instructions": "What is the user's topic?",
         "choices": [{"value": "weather"}, {"value": "travel", "description": "trips, places"},
                     {"value": False}]}
URGENCY = {"type": "score", "name": "urgency", "instructions": "How urgent is it?",
           "levels": [{"label": "low"}, {"label": "medium"}, {"label": "high"}]}
DECIDING = {"type": "decisions", "decisions": {"model": "gpt-decider",
                                               "questions": [WEATHER, TOPIC, URGENCY]}}


def decider(**session):
    c = codec()
    start(c, **session)
    c.render(env(ev.SessionCreated(session=SESSION_DOC, resume_token="r")))
    return c


def refused(c, raw: dict) -> DuplexError:
    with pytest.raises(DuplexError) as err:
        c.parse(json.dumps(raw))
    live_event(c.render_error(err.value))  # the error event is the SDK's shape
    return err.value


def a_turn(c, said: str, answered: str) -> tuple[str, str]:
    """A user turn and the voice's reply, as the session reports them; the
    event ids of the turn's last input and output fragments."""
    c.render(env(ev.SpeechStarted(audio_start_ms=0, item_id="u1")))
    heard = live_event(c.render(env(ev.InputTranscriptionCompleted("u1", 0, said))))
    c.render(env(ev.ResponseCreated(response={"id": "r1"})))
    spoke = live_event(c.frames(env(ev.OutputAudioDelta("r1", "a1", 0, 0, b"\0\0",
                                                         spoken=answered)))[-1])
    c.render(env(ev.ResponseDone(response={"id": "r1"})))
    return heard.event_id, spoke.event_id


# ---- config ------------------------------------------------------------------------------

def test_a_decisions_delegation_is_accepted_repeated_and_updated():
    c = decider(delegation=DECIDING)
    started = live_event(c.render(env(ev.SessionCreated(session=SESSION_DOC, resume_token="r"))))
    assert started.session.delegation.type == "decisions"
    assert [q.type for q in started.session.delegation.decisions.questions] == [
        "predicate", "choice", "score"]
    # an update of the same type keeps what it leaves out (the model here)
    c.parse(json.dumps({"type": "session.update", "event_id": "u1", "session": {"delegation": {
        "type": "decisions", "decisions": {"questions": [WEATHER]}}}}))
    updated = live_event(c.render(env(ev.SessionUpdated(session=SESSION_DOC), 2)))
    assert updated.session.delegation.decisions.model == "gpt-decider"
    assert len(updated.session.delegation.decisions.questions) == 1
    c.parse(json.dumps({"type": "session.update", "session": {"delegation": {
        "type": "decisions", "acknowledgement_delay_ms": 100}}}))
    updated = live_event(c.render(env(ev.SessionUpdated(session=SESSION_DOC), 3)))
    assert updated.session.delegation.acknowledgement_delay_ms == 100
    assert updated.session.delegation.decisions.questions[0].name == "weather"


@pytest.mark.parametrize("question, code, param", [
    ({"type": "choice", "instructions": "x", "choices": [{"value": "a"}]},
     "invalid_value", "choices"),
    ({"type": "choice", "instructions": "x", "choices": [{"value": "true"}, {"value": True}]},
     "invalid_value", "choices"),
    ({"type": "score", "instructions": "x", "levels": [{"label": "a"}, {"label": "a"}]},
     "invalid_value", "levels"),
    ({"type": "predicate"}, "invalid_value", "instructions"),
    ({"type": "predicate", "instructions": [{"type": "input_image", "image_url": "data:,"}]},
     "unsupported_option", "instructions[0].type"),
    ({"type": "rank", "instructions": "x"}, "invalid_value", "type"),
])
def test_a_bad_question_is_a_typed_error_naming_it(question, code, param):
    c = codec()
    err = refused(c, {"type": "session.start", "event_id": "s", "session": {
        "model": "gpt-live-1",
        "delegation": {"type": "decisions", "decisions": {"model": "m", "questions": [question]}}}})
    assert err.code == code and err.event_id == "s"
    assert err.param == f"session.delegation.decisions.questions[0].{param}"
    start(c, delegation=DECIDING)  # the session may still start


def test_triggers_at_start_and_on_update():
    c = decider(triggers=[{"type": "decisions", "event_type": "session.input_transcript.delta",
                           "decisions": {"questions": [WEATHER]}}])
    assert set(c.decisions.triggers) == {"session.input_transcript.delta"}
    c.parse(json.dumps({"type": "session.update", "session": {}}))  # omitted: kept
    assert set(c.decisions.triggers) == {"session.input_transcript.delta"}
    err = refused(c, {"type": "session.update", "event_id": "u", "session": {"triggers": [
        {"type": "decisions", "event_type": "session.output_transcript.delta",
         "decisions": {"questions": [WEATHER]}}] * 2}})
    assert (err.code, err.param) == ("invalid_value", "session.triggers[1].event_type")
    assert set(c.decisions.triggers) == {"session.input_transcript.delta"}  # unchanged
    c.parse(json.dumps({"type": "session.update", "session": {"triggers": []}}))  # disabled
    assert c.decisions.triggers == {}


# ---- items -------------------------------------------------------------------------------

def test_items_are_stored_acknowledged_and_deleted():
    c = decider(delegation=DECIDING)
    reply = c.parse(frame(DecisionItemCreateEvent(type="decision.item.create", event_id="i1", item={
        "role": "developer", "content": "The user is a pilot."})))
    assert isinstance(reply, ItemReply)
    created = live_event(c.render_ack(reply))
    assert created.type == "decision.item.created" and created.client_event_id == "i1"
    assert created.item.role == "developer" and created.item.content == "The user is a pilot."
    auto_id = created.item.id
    json_item = {"id": "facts", "type": "message", "role": "user", "content": [
        {"type": "input_text", "text": "Known facts:"},
        {"type": "input_json", "data": {"city": "Oslo"}}]}
    created = live_event(c.render_ack(c.parse(json.dumps({"type": "decision.item.create",
                                                          "item": json_item}))))
    assert created.item.id == "facts" and created.item.content[1].data == {"city": "Oslo"}
    said = live_event(c.render_ack(c.parse(json.dumps({"type": "decision.item.create", "item": {
        "role": "assistant", "phase": "final_answer",
        "content": [{"type": "output_text", "text": "Noted."}]}}))))
    assert said.item.phase == "final_answer"
    assert list(c.decisions.items) == [auto_id, "facts", said.item.id]
    # they are in every decision's prompt, in order, after the judge's rule
    run = c.parse(frame(DecisionCreateEvent(type="decision.create", event_id="d1")))
    roles = [(m.role, m.text) for m in run.asks[0].messages[1:4]]
    assert roles == [("system", "The user is a pilot."), ("user", 'Known facts:\n{"city": "Oslo"}'),
                     ("assistant", "Noted.")]
    deleted = live_event(c.render_ack(c.parse(frame(DecisionItemDeleteEvent(
        type="decision.item.delete", item_id="facts", event_id="x1")))))
    assert (deleted.type, deleted.item_id, deleted.client_event_id) == (
        "decision.item.deleted", "facts", "x1")
    assert list(c.decisions.items) == [auto_id, said.item.id]


@pytest.mark.parametrize("item, code, param", [
    ({"role": "user", "content": [{"type": "input_image", "image_url": "data:,"}]},
     "unsupported_option", "item.content[0].type"),
    ({"role": "system", "content": [{"type": "input_json", "data": {}}]},
     "invalid_value", "item.content[0].type"),
    ({"role": "tool", "content": "x"}, "invalid_value", "item.role"),
    ({"role": "user", "content": "  "}, "invalid_value", "item.content"),
    ({"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
     "unsupported_option", "item.type"),
    ({"role": "user", "content": "hi", "phase": "commentary"}, "invalid_value", "item.phase"),
])
def test_a_bad_item_is_a_typed_error_and_stores_nothing(item, code, param):
    c = decider()
    err = refused(c, {"type": "decision.item.create", "event_id": "b", "item": item})
    assert (err.code, err.param, err.event_id) == (code, param, "b")
    assert c.decisions.items == {}


def test_deleting_an_unknown_item_and_reusing_an_id_are_typed_errors():
    c = decider()
    err = refused(c, {"type": "decision.item.delete", "item_id": "nope", "event_id": "x"})
    assert (err.code, err.param) == ("item_not_found", "item_id")
    c.parse(json.dumps({"type": "decision.item.create", "item": {
        "id": "a", "role": "user", "content": "hi"}}))
    err = refused(c, {"type": "decision.item.create", "item": {
        "id": "a", "role": "user", "content": "again"}})
    assert (err.code, err.param) == ("duplicate_id", "item.id")
    assert c.decisions.items["a"]["content"] == "hi"


# ---- decision.create ---------------------------------------------------------------------

def test_decision_create_needs_a_decisions_delegation_and_a_fresh_event_id():
    c = decider()
    err = refused(c, {"type": "decision.create", "event_id": "d1"})
    assert (err.code, err.param) == ("invalid_value", "type")
    c = decider(delegation=DECIDING)
    assert refused(c, {"type": "decision.create"}).param == "event_id"
    run = c.parse(json.dumps({"type": "decision.create", "event_id": "d1"}))
    assert isinstance(run, DecisionRun) and run.event_id == "d1" and run.delegation_id
    delegated = live_event(c.render_delegated(run))
    assert (delegated.delegation.id, delegated.delegation.target, delegated.client_event_id) == (
        run.delegation_id, "decisions", "d1")
    err = refused(c, {"type": "decision.create", "event_id": "d1"})  # for the session's life
    assert (err.code, err.param, err.event_id) == ("duplicate_id", "event_id", "d1")
    other = c.parse(json.dumps({"type": "decision.create", "event_id": "d2"}))
    assert other.delegation_id != run.delegation_id


def test_without_an_llm_stage_decisions_are_refused_by_name():
    c = codec()
    c.decisions.available = False
    start(c, delegation=DECIDING)  # a config alone asks nothing of the engine
    err = refused(c, {"type": "decision.create", "event_id": "d1"})
    assert err.code == "capability_unsupported" and "decision.create" in err.message
    err = refused(c, {"type": "session.update", "session": {"triggers": [
        {"type": "decisions", "event_type": "session.input_transcript.delta",
         "decisions": {"questions": [WEATHER]}}]}})
    assert (err.code, err.param) == ("capability_unsupported", "session.triggers")


def test_a_decision_asks_each_question_about_what_was_said():
    c = decider(delegation=DECIDING)
    a_turn(c, "Will it rain in Oslo tomorrow?", "Yes, take an umbrella.")
    run = c.parse(json.dumps({"type": "decision.create", "event_id": "d1"}))
    assert [a.options for a in run.asks] == [("yes", "no"), ("weather", "travel", "false"),
                                            ("low", "medium", "high")]
    prompt = run.asks[1].messages[-1].text
    assert "User: Will it rain in Oslo tomorrow?" in prompt
    assert "Assistant: Yes, take an umbrella." in prompt
    assert "What is the user's topic?" in prompt and "- travel: trips, places" in prompt
    # a decision before anything was said says so, rather than inventing a conversation
    fresh = decider(delegation=DECIDING).parse(json.dumps({"type": "decision.create",
                                                           "event_id": "d"}))
    assert "(nothing has been said yet)" in fresh.asks[0].messages[-1].text


def test_the_answers_are_the_sdk_decision_in_question_order():
    c = decider(delegation=DECIDING)
    run = c.parse(json.dumps({"type": "decision.create", "event_id": "d1"}))
    chosen = [Chosen(0, (0.9, 0.1), 50, 1, cached_tokens=20),
              Chosen(2, (0.1, 0.2, 0.7), 60, 1),
              Chosen(1, (0.2, 0.5, 0.3), 70, 2)]
    event = live_event(c.render_decision(run, "smollm2", chosen))
    assert (event.type, event.delegation_id, event.trigger_id) == (
        "decision.event", run.delegation_id, None)
    decision = event.event.decision
    assert event.event.type == "decision.completed" and decision.model == "smollm2"
    weather, topic, urgency = decision.answers
    assert (weather.type, weather.name, weather.probability) == ("predicate", "weather", 0.9)
    assert topic.choice is False and topic.confidence == 0.7  # a typed value, as given
    assert [p.value for p in topic.probabilities] == ["weather", "travel", False]
    # levels from 0: the mean position, within the levels; confidence: the level chosen
    assert math.isclose(urgency.score, 0.5 + 2 * 0.3) and urgency.confidence == 0.5
    assert [(p.label, p.value) for p in urgency.probabilities] == [
        ("low", 0), ("medium", 1), ("high", 2)]
    usage = decision.usage
    assert (usage.input_tokens, usage.output_tokens, usage.total_tokens) == (180, 4, 184)
    assert usage.input_tokens_details.cached_tokens == 20


# ---- triggers ----------------------------------------------------------------------------

def test_triggers_fire_once_per_turn_naming_the_fragment_that_ended_it():
    c = decider(triggers=[
        {"type": "decisions", "event_type": "session.input_transcript.delta",
         "decisions": {"questions": [WEATHER]}},
        {"type": "decisions", "event_type": "session.output_transcript.delta",
         "decisions": {"questions": [URGENCY]}}])
    c.render(env(ev.SpeechStarted(audio_start_ms=0, item_id="u1")))
    c.render(env(ev.InputTranscriptionDelta("u1", 0, "Is it")))
    assert c.decisions.take_runs() == []  # not on every fragment
    last = live_event(c.render(env(ev.InputTranscriptionCompleted("u1", 0, "Is it sunny?"))))
    (heard,) = c.decisions.take_runs()
    assert (heard.source_event_id, heard.source_event_type) == (
        last.event_id, "session.input_transcript.delta")
    assert "User: Is it sunny?" in heard.asks[0].messages[-1].text
    c.render(env(ev.ResponseCreated(response={"id": "r1"})))
    c.frames(env(ev.OutputAudioDelta("r1", "a1", 0, 0, b"\0\0", spoken="It is ")))
    said = live_event(c.frames(env(ev.OutputAudioDelta("r1", "a1", 0, 0, b"\0\0",
                                                        spoken="sunny.")))[-1])
    assert c.decisions.take_runs() == []
    c.render(env(ev.ResponseDone(response={"id": "r1"})))
    (spoke,) = c.decisions.take_runs()
    assert spoke.source_event_id == said.event_id and spoke.asks[0].options == (
        "low", "medium", "high")
    assert "Assistant: It is sunny." in spoke.asks[0].messages[-1].text
    assert heard.trigger_id != spoke.trigger_id
    event = live_event(c.render_decision(spoke, "smollm2", [Chosen(0, (0.6, 0.3, 0.1), 9, 1)]))
    assert (event.trigger_id, event.source_event_id, event.delegation_id) == (
        spoke.trigger_id, said.event_id, None)


# ---- the runner (a scripted chooser) -----------------------------------------------------

class Wire:
    def __init__(self) -> None:
        self.frames: list = []
        self.arrived = asyncio.Event()

    async def send(self, text: str) -> bool:
        self.frames.append(live_event(text))
        self.arrived.set()
        return True

    async def next(self):
        await asyncio.wait_for(self.arrived.wait(), 5)
        self.arrived.clear()
        return self.frames[-1]


async def test_the_runner_answers_in_order_and_a_failure_is_typed_and_goes_on():
    c = decider(delegation=DECIDING)
    a_turn(c, "What's the weather like?", "Sunny.")
    chooser = ScriptedChooser(lambda ask: ask.options[-1])
    wire = Wire()
    runner = DecisionRunner(lambda: chooser, c, wire.send)
    try:
        runner.submit(c.parse(json.dumps({"type": "decision.create", "event_id": "d1"})))
        event = await wire.next()
        assert event.type == "decision.event" and event.event.decision.model == "scripted-decider"
        assert [a.type for a in event.event.decision.answers] == ["predicate", "choice", "score"]
        assert event.event.decision.answers[0].probability == 0.25  # "no" chosen
        assert len(chooser.asks) == 3  # one per question, in order
        chooser.fail = DuplexError("stage_failed", "the engine is gone")
        runner.submit(c.parse(json.dumps({"type": "decision.create", "event_id": "d2"})))
        err = await wire.next()
        assert (err.error.code, err.error.client_event_id) == ("stage_failed", "d2")
        chooser.fail = None  # the session goes on: the next decision is answered
        runner.submit(c.parse(json.dumps({"type": "decision.create", "event_id": "d3"})))
        assert (await wire.next()).type == "decision.event"
    finally:
        await runner.close()


async def test_a_decision_that_takes_too_long_is_stopped_and_told():
    c = decider(delegation=DECIDING)
    chooser = ScriptedChooser(hang=True)
    wire = Wire()
    runner = DecisionRunner(lambda: chooser, c, wire.send, timeout_s=0.05)
    try:
        runner.submit(c.parse(json.dumps({"type": "decision.create", "event_id": "slow"})))
        err = await wire.next()
        assert (err.error.code, err.error.client_event_id) == ("deadline_exceeded", "slow")
        assert chooser.cancelled == 1  # its request is freed, not left running
    finally:
        await runner.close()


async def test_a_full_queue_refuses_a_decision_and_skips_a_trigger():
    c = decider(delegation=DECIDING, triggers=[
        {"type": "decisions", "event_type": "session.input_transcript.delta",
         "decisions": {"questions": [WEATHER]}}])
    chooser = ScriptedChooser(hang=True)
    runner = DecisionRunner(lambda: chooser, c, Wire().send, max_queued=1)
    try:
        runner.submit(c.parse(json.dumps({"type": "decision.create", "event_id": "d1"})))
        await asyncio.sleep(0)  # the worker takes it: the queue is empty again
        runner.submit(c.parse(json.dumps({"type": "decision.create", "event_id": "d2"})))
        with pytest.raises(DuplexError) as err:
            runner.submit(c.parse(json.dumps({"type": "decision.create", "event_id": "d3"})))
        assert (err.value.code, err.value.event_id) == ("resource_exhausted", "d3")
        a_turn(c, "Hello.", "Hi.")
        for run in c.decisions.take_runs():
            runner.offer(run)
        assert runner.skipped == 1
    finally:
        await runner.close()
    assert chooser.cancelled == 1  # closing stops the decision under way


# ---- the engine chooser's probabilities (no engine) --------------------------------------

def test_probabilities_from_first_token_logprobs():
    from vllm_duplex.domain.decisions import spread as _spread

    # distinct first tokens: normalised over the options'
    probs = _spread([1, 2], 0, {1: math.log(0.6), 2: math.log(0.2), 3: math.log(0.2)})
    assert probs == pytest.approx((0.75, 0.25))
    # an option outside the top logprobs gets nothing
    assert _spread([1, 2, 4], 1, {1: math.log(0.1), 2: math.log(0.3)}) == pytest.approx(
        (0.25, 0.75, 0.0))
    # a shared first token: all of it to the chosen option among those sharing it
    assert _spread([1, 1, 2], 1, {1: math.log(0.5), 2: math.log(0.5)}) == pytest.approx(
        (0.0, 0.5, 0.5))


def test_the_ask_is_what_the_chooser_sees():
    ask = ChoiceAsk(messages=(), options=("yes", "no"))
    assert asyncio.run(ScriptedChooser().choose(ask)).index == 0
