"""GPT-Live Decisions on the default CPU pipeline (Silero -> Whisper -> vLLM
SmolLM2 -> Piper), driven by the ``openai`` SDK's own live client: decisions
evaluated on the engine's own LLM (the test session's one vLLM engine, the
one the voice speaks with), about what the user said aloud.

Every raw frame is validated against the SDK's model of its type
(``Microphone`` reads them through ``live_event``)."""

from __future__ import annotations

import pytest
import pytest_asyncio
from openai import AsyncOpenAI
from support.live_shapes import live_event
from support.speech_fixtures import cascade_runtime, speak
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from support.live_kit import Microphone
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")

# A question a word of the conversation answers: what SmolLM2-135M can judge
# (docs/live-conformance.md, Decisions; it is near chance on the predicate).
CITY = {"type": "choice", "name": "city", "instructions": "Which city did the user ask about?",
        "choices": [{"value": "Tokyo"}, {"value": "Paris"}, {"value": "London"}]}
ASKED = {"type": "predicate", "name": "weather",
         "instructions": "Did the user ask about the weather?"}


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):  # noqa: F811
    async with BackgroundServer(cascade_runtime(vllm_stage)) as srv:
        yield srv


def answers(event) -> dict:
    return {a.name: a for a in event.event.decision.answers}


def prob(choice, value: str) -> float:
    return next(p.probability for p in choice.probabilities if p.value == value)


async def test_decisions_judge_what_the_user_said_on_the_engines_llm(server):
    session = {"model": "gpt-live-1",
               "delegation": {"type": "decisions", "decisions": {
                   "model": "gpt-live-decider", "questions": [CITY, ASKED]}},
               "triggers": [{"type": "decisions", "event_type": "session.input_transcript.delta",
                             "decisions": {"questions": [CITY]}}]}
    async with AsyncOpenAI(api_key="sk-local", base_url=server.http_url + "/v1") as client:
        async with client.live.connect() as conn:
            await conn.session.start(session=session)
            started = live_event((await conn.recv_bytes()).decode())
            assert started.type == "session.started", started
            assert started.session.delegation.decisions.questions[0].name == "city"
            async with Microphone(conn) as mic:
                # a Decision item: stored and acknowledged with its id
                await conn.decision.item.create(event_id="i1", item={
                    "role": "developer", "content": "Questions are about the user's words."})
                await mic.until(lambda: mic.of("decision.item.created"), 10)
                (created,) = mic.of("decision.item.created")
                assert created.client_event_id == "i1" and created.item.role == "developer"

                # before anything is said: a decision on an empty conversation
                await conn.decision.create(event_id="before")
                await mic.until(lambda: mic.of("decision.event"), 120)
                (before,) = mic.of("decision.event")
                assert before.delegation_id and before.trigger_id is None
                p_before = prob(answers(before)["city"], "Paris")

                mic.say(speak("What's the weather like in Paris today?"))
                # the trigger fires at the end of the user's turn, naming its last fragment
                await mic.until(lambda: any(e.trigger_id for e in mic.of("decision.event")), 180)
                fired = next(e for e in mic.of("decision.event") if e.trigger_id)
                heard = {e.event_id for e in mic.of("session.input_transcript.delta")}
                assert fired.source_event_id in heard
                assert fired.source_event_type == "session.input_transcript.delta"
                assert fired.delegation_id is None
                assert answers(fired)["city"].choice == "Paris"
                await mic.until(lambda: mic.quiet(1.5), 120)  # the voice answered meanwhile
                assert mic.text("session.output_transcript.delta")

                # decision.create: a delegation named at once, answered on the same conversation
                await conn.decision.create(event_id="after")
                await mic.until(lambda: len([e for e in mic.of("decision.event")
                                             if e.delegation_id]) == 2, 120)
                delegated = mic.of("session.delegation.created")[-1]
                assert delegated.client_event_id == "after"
                assert delegated.delegation.target == "decisions"
                asked = mic.of("decision.event")[-1]
                assert asked.delegation_id == delegated.delegation.id != before.delegation_id
                got = answers(asked)
                # what the user said is what the decision judged
                assert got["city"].choice == "Paris"
                assert prob(got["city"], "Paris") > p_before
                assert sum(p.probability for p in got["city"].probabilities) == pytest.approx(1)
                assert 0.0 <= got["weather"].probability <= 1.0
                decision = asked.event.decision
                assert decision.model and decision.usage.input_tokens > 0

                # an event_id is used once for the session's life; the session goes on
                await conn.decision.create(event_id="after")
                await mic.until(lambda: mic.of("error"), 10)
                (err,) = mic.of("error")
                assert (err.error.code, err.error.client_event_id) == ("duplicate_id", "after")
                await conn.decision.item.delete(item_id=created.item.id, event_id="x1")
                await mic.until(lambda: mic.of("decision.item.deleted"), 10)
