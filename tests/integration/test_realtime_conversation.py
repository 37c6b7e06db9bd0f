"""Conversation items and duplex input modes over a real socket.

Pinned: conversation.item.truncate; conversation.item.create / retrieve /
delete and item_not_found; input modes a policy does not advertise ->
capability_unsupported naming the mode (advertised modes work).

The scripted LLM reports ``usage.input_tokens`` as the number of words in the
context it was given, which makes "what the next turn sees" observable.
"""

from __future__ import annotations

import pytest
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    ANY,
    SCRIPTED_REPLY,
    assert_alive,
    b64,
    expect_error,
    module_server,
    no_leaked_tasks,
    realtime_client,
    tone,
)
from vllm_duplex.realtime.client.realtime import RealtimeClient

pytestmark = pytest.mark.asyncio(loop_scope="module")

INSTRUCTIONS = "Answer briefly."  # two words of context
FIRST_SENTENCE = "Hello from the scripted duplex engine."  # 6 words, 6 x 120 ms of tone


server = module_server()


rt = realtime_client({"instructions": INSTRUCTIONS,
                     "audio": {"input": {"turn_detection": None}}})


async def _respond(rt: RealtimeClient) -> dict:
    await rt.create_response()
    result = await rt.collect_response()
    assert result.status == "completed"
    return result.done["response"]


async def _create(rt: RealtimeClient, item: dict, **extra) -> dict:
    await rt.send({"type": "conversation.item.create", "item": item, **extra})
    added = await rt.wait_for("conversation.item.added", "error", timeout=10)
    assert added["type"] == "conversation.item.added", added
    done = await rt.wait_for("conversation.item.done")
    assert done["item"]["id"] == added["item"]["id"]
    return added


def _user(text: str, item_id: str | None = None) -> dict:
    item = {"type": "message", "role": "user", "content": [{"type": "input_text", "text": text}]}
    if item_id:
        item["id"] = item_id
    return item


# ---- 17: truncate ----------------------------------------------------------------------


async def test_truncate_cuts_the_transcript_to_what_was_heard(rt):
    first = await _respond(rt)
    assert first["usage"]["input_tokens"] == 2  # the instructions only
    item = first["output"][0]
    assert item["content"][0]["transcript"] == SCRIPTED_REPLY

    eid = await rt.send({"type": "conversation.item.truncate", "item_id": item["id"],
                         "content_index": 0, "audio_end_ms": 720})
    truncated = await rt.wait_for("conversation.item.truncated", "error", timeout=10)
    assert truncated["type"] == "conversation.item.truncated", truncated
    assert (truncated["item_id"], truncated["content_index"], truncated["audio_end_ms"]) == \
        (item["id"], 0, 720)
    assert eid

    await rt.send({"type": "conversation.item.retrieve", "item_id": item["id"]})
    retrieved = await rt.wait_for("conversation.item.retrieved")
    assert retrieved["item"]["content"][0]["transcript"] == FIRST_SENTENCE

    # The next turn sees only the heard words: 2 (instructions) + 6, not 2 + 12.
    second = await _respond(rt)
    assert second["usage"]["input_tokens"] == 2 + 6


async def test_truncate_errors(rt):
    reply = (await _respond(rt))["output"][0]
    await _create(rt, _user("hello", "user_1"))

    cases = [
        ({"item_id": reply["id"], "audio_end_ms": 60_000}, "invalid_value", "audio_end_ms"),
        ({"item_id": "user_1", "audio_end_ms": 0}, "invalid_value", ANY),
        ({"item_id": "no_such_item", "audio_end_ms": 0}, "item_not_found", "item_id"),
        ({"item_id": reply["id"], "content_index": 3, "audio_end_ms": 0}, "invalid_value",
         "content_index"),
        ({"item_id": reply["id"], "audio_end_ms": -5}, "invalid_value", "audio_end_ms"),
    ]
    for fields, code, param in cases:
        eid = await rt.send({"type": "conversation.item.truncate", "content_index": 0, **fields})
        await expect_error(rt, code, event_id=eid, param=param)
    await rt.send({"type": "conversation.item.retrieve", "item_id": reply["id"]})
    retrieved = await rt.wait_for("conversation.item.retrieved")
    assert retrieved["item"]["content"][0]["transcript"] == SCRIPTED_REPLY  # nothing was cut


# ---- 18: create / retrieve / delete ---------------------------------------------------


async def test_create_retrieve_delete_items(rt):
    user = await _create(rt, _user("one two three", "msg_user"))
    assert user["previous_item_id"] is None
    assert user["item"]["id"] == "msg_user"
    assert user["item"]["role"] == "user"
    assert user["item"]["content"] == [{"type": "input_text", "text": "one two three"}]

    assistant = await _create(rt, {"type": "message", "role": "assistant", "id": "msg_asst",
                                   "content": [{"type": "output_text", "text": "four five"}]})
    assert assistant["previous_item_id"] == "msg_user"
    assert assistant["item"]["role"] == "assistant"

    tool = await _create(rt, {"type": "function_call_output", "call_id": "call_1",
                              "output": '{"ok":true}'})
    assert tool["item"]["type"] == "function_call_output"
    assert tool["item"]["call_id"] == "call_1" and tool["item"]["output"] == '{"ok":true}'
    assert tool["item"]["id"]  # minted by the server

    await rt.send({"type": "conversation.item.retrieve", "item_id": "msg_user"})
    retrieved = await rt.wait_for("conversation.item.retrieved")
    assert retrieved["item"] == user["item"]

    # The next response sees every item: 2 + 3 + 2 + 1 words.
    assert (await _respond(rt))["usage"]["input_tokens"] == 8

    await rt.send({"type": "conversation.item.delete", "item_id": "msg_user"})
    deleted = await rt.wait_for("conversation.item.deleted")
    assert deleted["item_id"] == "msg_user"
    eid = await rt.send({"type": "conversation.item.retrieve", "item_id": "msg_user"})
    await expect_error(rt, "item_not_found", event_id=eid, param="item_id")


async def test_item_errors(rt):
    await _create(rt, _user("hi", "dup"))
    bad = [
        ({"type": "conversation.item.delete", "item_id": "ghost"}, "item_not_found", "item_id"),
        ({"type": "conversation.item.retrieve", "item_id": "ghost"}, "item_not_found", "item_id"),
        ({"type": "conversation.item.create", "item": _user("again", "dup")}, "invalid_value",
         "item.id"),
        ({"type": "conversation.item.create", "item": _user("x"), "previous_item_id": "ghost"},
         "item_not_found", "previous_item_id"),
        ({"type": "conversation.item.create",
          "item": {"type": "message", "role": "user",
                   "content": [{"type": "output_text", "text": "x"}]}},
         "invalid_value", "item.content[0].type"),
        ({"type": "conversation.item.create", "item": {"type": "message", "role": "robot"}},
         "invalid_value", "item.role"),
        ({"type": "conversation.item.create", "item": {"type": "function_call_output"}},
         "invalid_value", "item.call_id"),
        ({"type": "conversation.item.retrieve"}, "invalid_value", "item_id"),
    ]
    for event, code, param in bad:
        eid = await rt.send(event)
        await expect_error(rt, code, event_id=eid, param=param)
    await assert_alive(rt)


async def test_previous_item_id_inserts_after_that_item(rt):
    await _create(rt, _user("a", "first"))
    await _create(rt, _user("c", "third"))
    middle = await _create(rt, _user("b", "second"), previous_item_id="first")
    assert middle["previous_item_id"] == "first"
    root = await _create(rt, _user("z", "zero"), previous_item_id="root")
    assert root["previous_item_id"] is None


# ---- 20: input modes ----------------------------------------------------------------


@pytest.mark.parametrize("mode", ["rollback_to_checkpoint", "reencode_context",
                                  "replace_latest_chunk"])
async def test_unadvertised_input_mode_is_capability_unsupported(rt, mode):
    assert mode not in rt.events[0]["session"]["capabilities"]["input_modes"]
    eid = await rt.send({"type": "duplex.input", "mode": mode, "checkpoint": "ck_1", "text": "x"})
    event = await expect_error(rt, "capability_unsupported", event_id=eid, param="mode")
    assert mode in event["error"]["message"]
    await assert_alive(rt)


async def test_unknown_input_mode_is_invalid_value(rt):
    eid = await rt.send({"type": "duplex.input", "mode": "telepathy"})
    await expect_error(rt, "invalid_value", event_id=eid, param="mode")


async def test_advertised_input_modes_work(rt):
    await rt.send({"type": "duplex.input", "mode": "append_tokens", "text": "tokens in"})
    added = await rt.wait_for("conversation.item.added")
    assert added["item"]["role"] == "user"
    assert added["item"]["content"] == [{"type": "input_text", "text": "tokens in"}]

    await rt.send({"type": "duplex.input", "mode": "append_audio_chunk", "audio": b64(tone(0.2))})
    eid = await rt.send({"type": "duplex.input", "mode": "turn_commit_only"})
    committed = await rt.wait_for("input_audio_buffer.committed", "error", timeout=10)
    assert committed["type"] == "input_audio_buffer.committed", committed
    assert eid
    assert (await _respond(rt))["usage"]["input_tokens"] == 2 + 2
