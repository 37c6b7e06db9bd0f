"""A conversation longer than the model's context keeps answering: the
session's ``truncation`` drops its oldest messages (the instructions kept),
as OpenAI Realtime does; ``disabled`` fails the reply that no longer fits.
On the test session's real vLLM engine (SmolLM2, max_model_len 2048), text
turns of ~260 tokens each over the realtime socket."""

from __future__ import annotations

import pytest
from support.text_fixtures import KEYS
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError

pytestmark = pytest.mark.asyncio(loop_scope="session")

FILLER = "The quick brown fox jumps over the lazy dog by the river. " * 20  # ~260 tokens


async def turn(client: RealtimeClient, n: int):
    await client.send({"type": "conversation.item.create", "item": {
        "type": "message", "role": "user",
        "content": [{"type": "input_text", "text": f"Note {n}. {FILLER} Say OK."}]}})
    await client.create_response()
    return await client.collect_response(timeout=120)


async def open_session(server, truncation) -> RealtimeClient:
    client = await RealtimeClient.connect(server.ws_url, api_key=KEYS[0])
    await client.update_session({"type": "realtime", "output_modalities": ["text"],
                                 "max_output_tokens": 8, "truncation": truncation,
                                 "instructions": "You answer OK."})
    return client


async def test_a_conversation_past_the_context_keeps_answering(text_server):
    async with await open_session(text_server, "auto") as client:
        assert client.session["truncation"] == "auto"
        done = [(await turn(client, n)).done["response"] for n in range(10)]
    # 10 x ~270 tokens: more than the context holds; every reply still made
    assert {r["status"] for r in done} <= {"completed", "incomplete"}  # incomplete: 8 tokens
    assert not [e for e in client.events if e["type"] == "error"]
    seen = [r["usage"]["input_tokens"] for r in done]
    assert max(seen) <= 2048 - 8  # what the model saw always fit beside the reply
    dropped = [n for n in range(1, 10) if seen[n] < seen[n - 1]]
    assert dropped and seen[dropped[0]] <= 0.75 * 2048 + 300  # cut to 3/4 of the room, plus the turn


async def test_retention_ratio_is_echoed_and_honoured(text_server):
    truncation = {"type": "retention_ratio", "retention_ratio": 0.5,
                  "token_limits": {"post_instructions": 1000}}
    async with await open_session(text_server, truncation) as client:
        assert client.session["truncation"] == truncation
        seen = [(await turn(client, n)).done["response"]["usage"]["input_tokens"]
                for n in range(6)]  # 1,600 tokens: past the 1,000 allowed after the instructions
    assert not [e for e in client.events if e["type"] == "error"]
    assert seen[3] < seen[2] and max(seen) <= 1000 + 100  # the instructions and the template


async def test_disabled_fails_the_reply_that_does_not_fit(text_server):
    async with await open_session(text_server, "disabled") as client:
        failed = None
        for n in range(10):
            try:
                done = (await turn(client, n)).done
            except RealtimeError as err:
                failed = err
                break
            if done["response"]["status"] == "failed":
                failed = done
                break
    assert failed is not None and n >= 5  # the first turns fit; one past 2,048 tokens does not
    errors = [e for e in client.events if e["type"] == "error"]
    assert any("max_model_len" in e["error"]["message"] for e in errors)


async def test_a_bad_truncation_is_refused_and_changes_nothing(text_server):
    async with await RealtimeClient.connect(text_server.ws_url, api_key=KEYS[0]) as client:
        for bad, param in (("sometimes", "session.truncation"),
                           ({"type": "retention_ratio", "retention_ratio": 1.5},
                            "session.truncation.retention_ratio"),
                           ({"type": "retention_ratio", "retention_ratio": 0.5,
                             "token_limits": {"post_instructions": 0}},
                            "session.truncation.token_limits.post_instructions")):
            await client.send({"type": "session.update", "session": {"type": "realtime",
                                                                      "truncation": bad}})
            error = await client.wait_for("error")
            assert error["error"]["code"] == "invalid_value" and error["error"]["param"] == param
        assert client.session["truncation"] == "auto"


async def test_what_was_dropped_stays_in_the_conversation_and_deleting_it_drops_nothing_seen(text_server):
    """As OpenAI Realtime: a truncation leaves the conversation's items as
    they are (no ``conversation.item.deleted``: the client may still retrieve
    them), only the model no longer sees them (``usage.input_tokens`` says
    how much it saw). A client deleting an item the model no longer saw
    leaves what the model sees alone (before: the count of messages dropped
    was kept, so as many messages it had seen went too)."""
    async with await open_session(text_server, "auto") as client:
        seen = []
        for n in range(12):
            seen.append((await turn(client, n)).done["response"]["usage"]["input_tokens"])
            if n and seen[-1] < seen[-2]:
                break
        assert seen[-1] < seen[-2]  # the first truncation
        assert not [e for e in client.events if e["type"] == "conversation.item.deleted"]
        first, reply = [e["item"]["id"] for e in client.events
                        if e["type"] == "conversation.item.added"][:2]  # turn 0 and its reply
        await client.send({"type": "conversation.item.retrieve", "item_id": first})
        kept = await client.wait_for("conversation.item.retrieved")
        assert "Note 0." in kept["item"]["content"][0]["text"]  # dropped from the model, not the conversation
        for item_id in (first, reply):
            await client.send({"type": "conversation.item.delete", "item_id": item_id})
            await client.wait_for("conversation.item.deleted")
        after = (await turn(client, len(seen))).done["response"]["usage"]["input_tokens"]
    assert not [e for e in client.events if e["type"] == "error"]
    assert after > seen[-1] + 200  # what it saw, and the new turn (~270 tokens) after it
