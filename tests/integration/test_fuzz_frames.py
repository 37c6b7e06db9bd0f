"""Fuzzing client frames (issue 5, item 4).

The property: no client frame, however malformed, crashes or hangs the server;
every bad frame is answered by exactly one typed ``error`` (a code from
``ERRORS``), the socket stays open, and the session still answers a turn
afterwards. Frames: random bytes and text, random JSON, events of every client
type with fields of the wrong type (ints, floats incl. NaN/Infinity/1e400,
huge and empty strings, nested objects, lists, null), bad base64, truncated
and deeply nested JSON, random event order.

Two layers:

* Sans-I/O (fast, shrinking): ``@given`` straight on ``RealtimeCodec.parse``
  and the text-surface parsers (``parse_generate``, ``parse_control``,
  ``parse_messages``, ``InputSequence``). Each returns a typed value or raises
  ``DuplexError``; any other exception is a crash of the server's reader (the
  reader only catches ``DuplexError``) or a 500 on HTTP.
* Live (one real loopback server, scripted pipeline). pytest-asyncio cannot
  run an ``@given`` coroutine, and a sync ``@given`` test that starts a loop
  per example could not share the module's server. So frames are *drawn* with
  hypothesis in a plain sync helper (``draw``: an inner ``@given`` function,
  generate phase only, derandomized so that a run is reproducible; set
  ``FUZZ_RANDOM=1`` for fresh examples) and *replayed* against the server by
  the async tests. The local codec is the oracle for bad frames: each must get
  the code the codec gives it. Answers are matched as a multiset of
  ``(code, echoed event_id)``: framing errors are sent by the reader, journaled
  ones by the session's writer, and the two may interleave. Frames are
  independent, so a failure names the one frame at fault (no shrinking needed).
  Random *valid* events (and some bad ones) in random order must only yield
  normal events or typed errors (never ``internal_error``), keep seq +1 and
  fences monotonic, and leave a session that completes a turn; ``/health``
  stays ok. Ids like ``$item`` are resolved at send time to the live
  response's item, so truncate/delete/cancel hit real targets.

Documents are built from templates of the real field names (``support.fuzz``):
``noisy`` puts wrong types at every level, ``mutated`` takes a plausible
document and breaks one node at any depth (reaching checks that sit behind
valid fields). ``@example`` pins inputs this search found. Sizes: ``FUZZ_EXAMPLES`` (sans-I/O,
per test, default 400), ``FUZZ_LIVE_EXAMPLES`` (live lists, default 40).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import os
from collections import Counter
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from support.fuzz import (
    BIG_INTS,
    JSON_VALUES,
    MAX_EVENT,
    MESSAGES,
    NUMBERS,
    TEXT,
    WRONG,
    draw,
    generate_bodies,
    mutated,
    noisy,
    one_of_values,
    plausible,
    shaped,
    weighted,
)
from support.realtime_fixtures import (  # noqa: F401  (no_leaked_tasks overrides the conftest fixture)
    b64,
    module_server,
    no_leaked_tasks,
    scripted_config,
    silence,
    tone,
)
from vllm_duplex.domain import events as server_events
from vllm_duplex.domain.commands import Command
from vllm_duplex.domain.contracts import InputMode
from vllm_duplex.domain.errors import ERRORS, DuplexError
from vllm_duplex.domain.input_sequence import Accepted, InputSequence
from vllm_duplex.realtime.client.realtime import Event, RealtimeClient
from vllm_duplex.realtime.wire.codec import CLIENT_EVENT_TYPES, RealtimeCodec
from vllm_duplex.text.requests import (
    GenerateSpec,
    parse_control,
    parse_generate,
    parse_messages,
)

# The async (live) tests share the module's loop and server. Marked one by one: a
# module-wide ``pytestmark`` would also mark the sync property tests (a warning each).
live = pytest.mark.asyncio(loop_scope="module")
pytestmark = pytest.mark.filterwarnings("ignore:Generating overly large repr")

MAX_FRAME = 256 << 10  # ... the transport closes (1009) above this: never sent here
MODEL = "duplex-scripted"
NO_HEALTH = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much,
             HealthCheck.large_base_example, HealthCheck.function_scoped_fixture]
SANS_IO = settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "400")), deadline=None,
                   suppress_health_check=NO_HEALTH)

# ---- strategies: audio, images, ids (values and templates: support.fuzz) -----------


def _not_base64(s: str) -> bool:
    try:
        base64.b64decode(s, validate=True)
    except (binascii.Error, ValueError):
        return True
    return False


AUDIO = st.binary(max_size=96).map(b64)
# (Python's decoder takes excess padding, "Zm9v=": not counted as bad here.)
BAD_B64 = st.one_of(
    st.sampled_from(["!!not base64!!", "AAA", "A", "=", "====", "YQ", " Zm9v", "Zm9v\n",
                     "Zm9v YmFy", "\u00e9", "-_-_", "AA==AA==", "\U0001f600"]),
    st.text(max_size=24),
).filter(_not_base64)
AUDIO_FIELD = AUDIO | BAD_B64
IMAGE_URL = st.sampled_from(["data:image/png;base64,iVBORw0KGgo=", "data:image/png;base64,!!",
                             "data:image/png,raw", "data:;base64,", "https://example.com/a.png"]) | st.text()
IDS = st.one_of(st.sampled_from(["item_1", "a", "root", ""]), st.text(max_size=10))


AUDIO_FORMAT = (one_of_values("pcm16", "g711_ulaw", "g711_alaw", "opus", "audio/pcm")
                | shaped({"type": one_of_values("audio/pcm", "audio/pcmu", "audio/pcma", "audio/opus"),
                          "rate": one_of_values(8000, 16000, 24000, 48000, 7999, 48001, 0, -1, 10**400)}))
TURN_DETECTION = st.none() | shaped({
    "type": one_of_values("server_vad", "semantic_vad", "none", ""),
    "threshold": st.floats(-1.0, 2.0), "prefix_padding_ms": st.integers(-5, 10**6) | BIG_INTS,
    "silence_duration_ms": st.integers(-5, 10**6) | BIG_INTS, "create_response": st.booleans(),
    "interrupt_response": st.booleans(), "idle_timeout_ms": st.none() | st.integers(-5, 10**6),
    "eagerness": one_of_values("low", "auto")})
TRANSCRIPTION = st.none() | shaped({"model": TEXT, "language": TEXT, "prompt": TEXT})
MODALITIES = st.lists(one_of_values("text", "audio", "video", ""), max_size=3)
MAX_TOKENS = st.integers(-2, 10**6) | one_of_values("inf", "INF", 10**400)
TOOLS = shaped([{"type": one_of_values("function", "mcp"), "name": one_of_values("f", "g", "", "f"),
                 "description": TEXT, "parameters": shaped({"type": st.just("object")})}])
TOOL_CHOICE = one_of_values("auto", "none", "required", "any") | shaped(
    {"type": one_of_values("function", "mcp"), "name": TEXT})
SESSION = shaped({
    "type": one_of_values("realtime", "transcription"), "model": one_of_values(MODEL, "other"),
    "policy": one_of_values("scripted", "cascade"), "instructions": TEXT, "output_modalities": MODALITIES,
    "audio": {"input": {"format": AUDIO_FORMAT, "transcription": TRANSCRIPTION,
                        "turn_detection": TURN_DETECTION, "noise_reduction": st.none()},
              "output": {"format": AUDIO_FORMAT, "speed": st.floats(0.0, 2.0),
                         "voice": TEXT | shaped({"id": TEXT})}},
    "tools": TOOLS, "tool_choice": TOOL_CHOICE, "max_output_tokens": MAX_TOKENS,
    "temperature": st.floats(-1.0, 3.0),
    # beta aliases
    "modalities": MODALITIES, "max_response_output_tokens": MAX_TOKENS, "voice": TEXT,
    "input_audio_format": AUDIO_FORMAT, "output_audio_format": AUDIO_FORMAT,
    "input_audio_transcription": TRANSCRIPTION, "turn_detection": TURN_DETECTION,
    "input_audio_noise_reduction": st.none(), "speed": st.floats(0.0, 2.0),
})
ITEM = shaped({
    "id": IDS, "type": one_of_values("message", "function_call", "function_call_output", "mcp_call"),
    "role": one_of_values("user", "assistant", "system", "tool"),
    "content": [{"type": one_of_values("input_text", "input_audio", "input_image", "output_text",
                                       "output_audio", "text", "audio", "image"),
                 "text": TEXT, "audio": AUDIO_FIELD, "transcript": TEXT, "image_url": IMAGE_URL}],
    "call_id": TEXT, "name": TEXT, "arguments": TEXT, "output": TEXT, "status": TEXT})
RESPONSE = shaped({
    "output_modalities": MODALITIES, "modalities": MODALITIES, "max_output_tokens": MAX_TOKENS,
    "max_response_output_tokens": MAX_TOKENS, "instructions": TEXT,
    "metadata": st.dictionaries(st.text(max_size=6), TEXT, max_size=3),
    "conversation": one_of_values("auto", "none", "other"), "input": [ITEM]})
MODES = one_of_values(*(m.value for m in InputMode), "bogus")
EVENT_FIELDS: dict[str, dict[str, Any]] = {
    "session.update": {"session": SESSION},
    "input_audio_buffer.append": {"audio": AUDIO_FIELD, "seq": st.integers(-1, 5)},
    "input_audio_buffer.commit": {},
    "input_audio_buffer.clear": {},
    "conversation.item.create": {"item": ITEM, "previous_item_id": IDS},
    "conversation.item.retrieve": {"item_id": IDS},
    "conversation.item.delete": {"item_id": IDS},
    "conversation.item.truncate": {"item_id": IDS, "content_index": st.integers(-1, 3),
                                   "audio_end_ms": st.integers(-1, 10**6) | BIG_INTS},
    "response.create": {"response": RESPONSE},
    "response.cancel": {"response_id": IDS},
    "duplex.input": {"mode": MODES, "text": TEXT, "audio": AUDIO_FIELD, "checkpoint": TEXT},
    "session.close": {"reason": TEXT},
    "session.resume": {"session_id": IDS, "resume_token": TEXT, "last_seq": st.integers(-1, 50) | BIG_INTS,
                       "generation": st.integers(-1, 5) | BIG_INTS},
    "session.event_ack": {"seq": st.integers(-1, 50) | BIG_INTS},
    "duplex.video.frame": {"image": AUDIO_FIELD, "timestamp_ms": st.integers(-1, 10**6) | BIG_INTS},
    "duplex.video.chunk": {"container": one_of_values("webm", "mp4", "avi"), "data": AUDIO_FIELD},
    "output_audio_buffer.clear": {},  # WebRTC calls; a plain socket refuses it (SEMANTIC_BAD)
}
# Names a client might send that this server does not take (beta-only, server-side, typos).
OTHER_TYPES = one_of_values("transcription_session.update", "output_audio_buffer.cleared",
                            "session.created", "error", "", "response.create ", "Response.Create",
                            "conversation.item.create.", "input_audio_buffer")
EVENT_IDS = st.text(max_size=12) | WRONG


def _event(kind: str) -> st.SearchStrategy[dict[str, Any]]:
    fields = EVENT_FIELDS.get(kind, {})  # a new type without a template: wrong fields only
    noisy_event = st.fixed_dictionaries({"type": st.just(kind)}, optional={
        "event_id": EVENT_IDS, **{k: shaped(v) | WRONG for k, v in fields.items()}})
    plausible_event = st.fixed_dictionaries({"type": st.just(kind)}, optional={
        "event_id": TEXT, **{k: plausible(v) for k, v in fields.items()}})
    return noisy_event | mutated(plausible_event)


EVENTS = st.one_of(
    *(_event(kind) for kind in sorted(CLIENT_EVENT_TYPES | set(EVENT_FIELDS))),
    st.fixed_dictionaries({"type": OTHER_TYPES | WRONG}, optional={"event_id": EVENT_IDS}),
    st.fixed_dictionaries({}, optional={"event_id": EVENT_IDS, "session": SESSION}),
)


def dump(doc: Any, ascii_only: bool, big_floats: bool) -> str:
    text = json.dumps(doc, ensure_ascii=ascii_only)  # NaN / Infinity: not JSON
    if big_floats:  # ... or JSON numbers that overflow to +-inf when parsed
        text = text.replace("-Infinity", "-1e400").replace("Infinity", "1e400")
    return text


def _deep(n: int, kind: str) -> str:
    inner = "[" * n + "]" * n
    if kind == "array":
        return inner
    return json.dumps({"type": kind, "session": {"instructions": "x"}}).replace('"x"', inner)


EVENT_TEXT = st.builds(dump, EVENTS, st.booleans(), st.booleans())
FRAMES: st.SearchStrategy[str | bytes] = st.one_of(
    st.binary(max_size=64),
    st.text(max_size=64),
    st.builds(dump, JSON_VALUES, st.booleans(), st.booleans()),
    EVENT_TEXT,
    EVENT_TEXT.map(lambda s: s.encode("utf-8", "surrogatepass")),  # binary frames carry JSON too
    st.builds(lambda s, k: s[:k], EVENT_TEXT, st.integers(0, 40)),  # truncated JSON
    st.builds(_deep, st.integers(500, 20_000), one_of_values("array", "session.update")),
    st.builds(lambda n, eid: json.dumps({"type": "input_audio_buffer.append", "event_id": eid,
                                         "audio": "AAAA" * (n // 4)}),
              st.integers(MAX_EVENT - 200, MAX_EVENT + 4000), TEXT),  # around the size limit
)


# ---- the oracle ------------------------------------------------------------------------


def oracle(frame: str | bytes) -> tuple[str | None, str | None]:
    """What the codec makes of ``frame``: ``(error code, event_id)``, or
    ``(None, event_id)`` for a command. Fails on any other exception."""
    codec = RealtimeCodec(max_event_bytes=MAX_EVENT)
    try:
        command = codec.parse(frame)
    except DuplexError as err:
        assert err.code in ERRORS, err
        wire = json.loads(codec.render_error(err))  # renders to valid JSON, whatever was echoed
        assert wire["error"]["code"] == err.code
        return err.code, err.event_id
    assert isinstance(command, Command), command
    return None, command.event_id


def readable_event_id(frame: str | bytes) -> str | None:
    """The client event_id the error must echo: a string event_id of a JSON
    object within the size limit."""
    raw = frame if isinstance(frame, bytes) else frame.encode("utf-8", "surrogatepass")
    if len(raw) > MAX_EVENT:
        return None
    try:
        obj = json.loads(frame if isinstance(frame, str) else raw.decode("utf-8"),
                         parse_constant=lambda c: 1 / 0)
    except (ValueError, RecursionError, ZeroDivisionError):
        return None
    eid = obj.get("event_id") if isinstance(obj, dict) else None
    return eid if isinstance(eid, str) else None


# ---- sans-I/O: the codec ------------------------------------------------------------


def test_every_client_event_type_has_a_fuzz_template():
    assert set(EVENT_FIELDS) == CLIENT_EVENT_TYPES


@SANS_IO
@given(frame=FRAMES)
def test_codec_answers_every_frame_with_a_command_or_a_typed_error(frame):
    code, event_id = oracle(frame)
    assert event_id == readable_event_id(frame)  # echoed whenever it could be read


@SANS_IO
@given(doc=EVENTS)
def test_codec_typed_events_with_wrong_fields(doc):
    code, event_id = oracle(json.dumps(doc))
    if code is None:
        assert isinstance(doc.get("type"), str) and doc["type"] in CLIENT_EVENT_TYPES


@given(audio=BAD_B64, kind=one_of_values("input_audio_buffer.append", "duplex.input"))
def test_codec_bad_base64_is_invalid_audio(audio, kind):
    frame = json.dumps({"type": kind, "event_id": "e1", "audio": audio, "mode": "append_audio_chunk"})
    assert oracle(frame) == ("invalid_audio", "e1")


# ---- sans-I/O: the text surfaces ------------------------------------------------------

GENERATE_BODY = generate_bodies("m")


def only_typed_errors(fn, *args, **kwargs) -> Any:
    try:
        return fn(*args, **kwargs)
    except DuplexError as err:
        assert err.code in ERRORS
        json.dumps(err.to_wire())
        return err


USER = [{"role": "user", "content": "hi"}]


@SANS_IO
@given(body=GENERATE_BODY | JSON_VALUES, required=st.booleans())
# Found by this search (each raised something other than DuplexError):
@example(body={"model": "m", "messages": USER, "deadline_ms": -(10**400)}, required=True)
@example(body={"model": "m", "messages": USER, "tool_choice": {"type": "function", "function": {"name": []}}},
         required=True)
@example(body={"model": "m", "messages": [{"role": "assistant", "tool_calls": [
    {"function": {"name": "w", "arguments": "[" * 50_000}}]}]}, required=True)
def test_parse_generate_raises_only_typed_errors(body, required):
    spec = only_typed_errors(parse_generate, body, served_model="m", max_tokens_cap=16,
                             extra_fields=("stream",), model_required=required,
                             messages_required=required)
    if isinstance(spec, GenerateSpec):  # what the generator does next must not crash either
        assert 1 <= spec.sampling.max_tokens <= 16
        spec.context()
        spec.callable_tools()
        json.dumps([m.wire() for m in spec.messages])


@SANS_IO
@given(body=shaped({"max_tokens": NUMBERS, "reasoning_budget": NUMBERS | st.none(), "model": TEXT})
       | JSON_VALUES)
@example(body={"max_tokens": 10**400})
def test_parse_control_raises_only_typed_errors(body):
    changes = only_typed_errors(parse_control, body, 16)
    if isinstance(changes, dict):
        assert set(changes) <= {"max_tokens", "reasoning_budget"}


@SANS_IO
@given(raw=MESSAGES | mutated(MESSAGES) | JSON_VALUES, allow_empty=st.booleans())
@example(raw=[{"role": "assistant", "tool_calls": 5}], allow_empty=False)
def test_parse_messages_raises_only_typed_errors(raw, allow_empty):
    only_typed_errors(parse_messages, raw, allow_empty=allow_empty)


@SANS_IO
@given(steps=st.lists(st.tuples(one_of_values("accept", "end"), WRONG | st.integers(-2, 12),
                                st.integers(0, 200)), max_size=30))
def test_input_sequence_raises_only_typed_errors(steps):
    seq = InputSequence(max_chunk_bytes=100, max_total_bytes=400)
    for op, value, size in steps:
        before = seq.next_seq
        result = only_typed_errors(seq.accept if op == "accept" else seq.end,
                                   *((value, size) if op == "accept" else (value,)))
        assert seq.next_seq in (before, before + 1)  # never skips, never goes back
        if result is Accepted.NEW:
            assert seq.next_seq == before + 1 and seq.total_bytes <= 400


# ---- live: frames for replay ------------------------------------------------------------


def fits(frame: str | bytes) -> bool:
    raw = frame if isinstance(frame, bytes) else frame.encode("utf-8", "surrogatepass")
    return len(raw) < MAX_FRAME - 1024


def on_the_wire(frame: str | bytes) -> str | bytes:
    """A text frame must be UTF-8: one with lone surrogates goes as bytes (the
    server then sees invalid UTF-8, which the oracle judges the same way)."""
    if isinstance(frame, str):
        try:
            frame.encode("utf-8")
        except UnicodeEncodeError:
            return frame.encode("utf-8", "surrogatepass")
    return frame


BAD_FRAMES = FRAMES.map(on_the_wire).filter(lambda f: fits(f) and oracle(f)[0] is not None)
# Frames that parse but that a fresh session must refuse: (frame, code). Their
# event ids are made unique at replay time.
SEMANTIC_BAD = st.one_of(
    st.builds(lambda kind, i: ({"type": kind, "item_id": i}, "item_not_found"),
              one_of_values("conversation.item.retrieve", "conversation.item.delete"), IDS),
    st.builds(lambda i, c, ms: ({"type": "conversation.item.truncate", "item_id": i,
                                 "content_index": c, "audio_end_ms": ms}, "item_not_found"),
              IDS, st.integers(0, 3), st.integers(0, 10**6)),
    st.builds(lambda p: ({"type": "conversation.item.create", "previous_item_id": p,
                          "item": {"type": "message", "role": "user", "content": []}},
                         "item_not_found"), IDS.filter(lambda p: p != "root")),
    st.just(({"type": "input_audio_buffer.commit"}, "input_audio_buffer_empty")),
    st.builds(lambda r: ({"type": "response.cancel", "response_id": r}, "response_cancel_not_active"),
              st.none() | IDS),
    st.builds(lambda m: ({"type": "duplex.input", "mode": m, "text": "x"}, "capability_unsupported"),
              one_of_values("replace_latest_chunk", "reencode_context", "rollback_to_checkpoint")),
    st.builds(lambda k, v: ({"type": "session.update", "session": {k: v}}, "immutable_field"),
              one_of_values("model", "policy"), st.text(min_size=1, max_size=8).filter(
                  lambda v: v not in (MODEL, "scripted"))),
    st.builds(lambda t, q: ({"type": "session.resume", "session_id": "sess_x", "resume_token": t,
                             "last_seq": q}, "invalid_event"), TEXT, st.integers(0, 9)),
    st.builds(lambda q: ({"type": "session.event_ack", "seq": q}, "invalid_value"),
              st.integers(10**6, 10**9)),
    st.just(({"type": "output_audio_buffer.clear"}, "capability_unsupported")),
)
BAD_LISTS = st.lists(weighted((2, BAD_FRAMES.map(lambda f: (f, None))), (1, SEMANTIC_BAD)),
                     min_size=4, max_size=16)


# ---- live: valid events in random order ----------------------------------------------

VALID_SESSION = st.fixed_dictionaries({}, optional={
    "instructions": TEXT,
    "output_modalities": one_of_values(["audio"], ["text"], ["audio", "text"]),
    "audio": st.fixed_dictionaries({}, optional={
        "input": st.fixed_dictionaries({}, optional={
            "format": one_of_values({"type": "audio/pcm", "rate": 24000}, {"type": "audio/pcm", "rate": 16000},
                                    {"type": "audio/pcm", "rate": 8000}, {"type": "audio/pcmu"},
                                    {"type": "audio/pcma"}),
            "turn_detection": st.none() | st.fixed_dictionaries({"type": st.just("server_vad")}, optional={
                "threshold": st.floats(0.0, 1.0), "prefix_padding_ms": st.integers(0, 1000),
                "silence_duration_ms": st.integers(0, 1500), "create_response": st.booleans(),
                "interrupt_response": st.booleans(),
                "idle_timeout_ms": st.none() | st.integers(200, 5000)}),
            "transcription": st.none() | st.just({"model": "default"})}),
        "output": st.fixed_dictionaries({}, optional={
            "format": one_of_values({"type": "audio/pcm", "rate": 24000}, {"type": "audio/pcm", "rate": 48000},
                                    {"type": "audio/pcmu"}, {"type": "audio/pcma"}),
            "voice": one_of_values("alloy", "default"), "speed": st.just(1.0)})}),  # only 1.0 is honoured
    "max_output_tokens": st.integers(1, 40) | st.just("inf"),
    "temperature": st.floats(0.0, 2.0),
    "tools": st.just([{"type": "function", "name": "f", "parameters": {"type": "object"}}]),
    "tool_choice": one_of_values("auto", "none"),
    "turn_detection": st.none(),  # beta alias
})
POOL = one_of_values("it_a", "it_b", "it_c", "nope")
# Resolved when sent, to the latest response's item / response seen so far (see ``resolve``).
LIVE_IDS = POOL | one_of_values("$item", "$item")
SPEECH = st.builds(lambda s, q: b64(tone(s) + silence(q)), st.floats(0.0, 0.4), st.floats(0.0, 0.8))
VALID_ITEM = st.one_of(
    st.fixed_dictionaries({"type": st.just("message"), "role": st.just("user"),
                           "content": st.just([{"type": "input_text", "text": "Hi there."}])},
                          optional={"id": POOL}),
    st.fixed_dictionaries({"type": st.just("message"), "role": st.just("user"),
                           "content": st.just([{"type": "input_audio", "audio": b64(tone(0.1)),
                                                "transcript": "Hm."}])},  # audio alone is refused
                          optional={"id": POOL}),
    st.fixed_dictionaries({"type": st.just("message"), "role": one_of_values("assistant", "system"),
                           "content": st.just([{"type": "output_text", "text": "Earlier."}])},
                          optional={"id": POOL}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": st.just("call_1"),
                           "output": st.just("{}")}, optional={"id": POOL}),
)
VALID_EVENTS = st.one_of(
    st.builds(lambda s: {"type": "session.update", "session": s}, VALID_SESSION),
    st.builds(lambda a, q: {"type": "input_audio_buffer.append", "audio": a, **({"seq": q} if q else {})},
              SPEECH | st.binary(max_size=480).map(b64), st.none() | st.integers(1, 4)),
    st.just({"type": "input_audio_buffer.commit"}),
    st.just({"type": "input_audio_buffer.clear"}),
    st.builds(lambda r: {"type": "response.create", **({"response": r} if r else {})},
              st.none() | st.fixed_dictionaries({}, optional={
                  "output_modalities": one_of_values(["audio"], ["text"]),
                  "max_output_tokens": st.integers(1, 30), "instructions": TEXT,
                  "conversation": one_of_values("auto", "none"), "metadata": st.just({"k": "v"})})),
    st.builds(lambda r: {"type": "response.cancel", **({"response_id": r} if r else {})},
              st.none() | one_of_values("resp_nope", "$response")),
    st.builds(lambda i, p: {"type": "conversation.item.create", "item": i,
                            **({"previous_item_id": p} if p else {})},
              VALID_ITEM, st.none() | LIVE_IDS | st.just("root")),
    st.builds(lambda k, i: {"type": k, "item_id": i},
              one_of_values("conversation.item.retrieve", "conversation.item.delete"), LIVE_IDS),
    st.builds(lambda i, c, ms: {"type": "conversation.item.truncate", "item_id": i,
                                "content_index": c, "audio_end_ms": ms},
              LIVE_IDS, st.integers(0, 1), st.integers(0, 3000)),
    st.builds(lambda m, t: {"type": "duplex.input", "mode": m, "text": t},
              one_of_values("append_tokens", "turn_commit_only"), TEXT),
)
# A bad frame mixed into the valid ones: a JSON object the codec refuses with
# an error that echoes its (unique) event_id.
MIXED_LISTS = st.lists(weighted((3, VALID_EVENTS.map(lambda e: (e, False))), (1, EVENTS.map(lambda e: (e, True)))),
                       min_size=6, max_size=24)

SERVER_EVENT_TYPES = {cls.type for cls in vars(server_events).values()
                      if isinstance(cls, type) and isinstance(getattr(cls, "type", None), str)}


# ---- live: helpers ------------------------------------------------------------------


server = module_server(scripted_config(max_event_bytes=MAX_EVENT, max_frame_bytes=MAX_FRAME))


def check_error_shape(event: Event) -> tuple[str, str | None]:
    assert event["type"] == "error", event
    err = event["error"]
    code = err["code"]
    assert code in ERRORS and code != "internal_error", event  # internal_error: a contained crash
    spec = ERRORS[code]
    assert (err["type"], err["retryable"]) == (spec.type, spec.retryable), event
    assert isinstance(err["message"], str) and err["message"], event
    assert "fence" in event.get("metadata", {}), event
    return code, err.get("event_id")


async def read_until_answer(rt: RealtimeClient, event_id: str, kind: str = "error") -> list[Event]:
    """Events up to and including the first ``kind`` event, or the error that
    echoes ``event_id``."""
    out: list[Event] = []
    async with asyncio.timeout(15):
        while True:
            event = await rt.recv()
            out.append(event)
            if event["type"] == kind and kind != "error" or (
                    event["type"] == "error" and event["error"].get("event_id") == event_id):
                return out


async def sentinel(rt: RealtimeClient, tag: str) -> list[Event]:
    """Round-trip a journaled error: everything sent before it has been handled
    and answered once this returns (framing errors are sent before the next
    frame is read; journaled ones in order)."""
    eid = f"sentinel-{tag}"
    await rt.send({"type": "conversation.item.retrieve", "item_id": eid, "event_id": eid})
    events = await read_until_answer(rt, eid)
    assert events[-1]["error"]["code"] == "item_not_found", events[-1]
    return events[:-1]


async def assert_session_works(rt: RealtimeClient, tag: str) -> None:
    """A user text item and response.create get a completed response.done
    (retrying while a response started earlier, e.g. by server VAD, runs)."""
    eid = f"setup-{tag}"
    await rt.send({"type": "session.update", "event_id": eid, "session": {
        "audio": {"input": {"turn_detection": None}}, "max_output_tokens": "inf"}})
    events = await read_until_answer(rt, eid, "session.updated")
    assert events[-1]["type"] == "session.updated", events[-1]
    await rt.send({"type": "conversation.item.create", "event_id": f"say-{tag}", "item": {
        "type": "message", "role": "user", "content": [{"type": "input_text", "text": "Still there?"}]}})
    for attempt in range(6):
        rid = f"go-{tag}-{attempt}"
        await rt.send({"type": "response.create", "event_id": rid,
                       "response": {"output_modalities": ["text"]}})
        refused, created = False, set()
        async with asyncio.timeout(30):
            while True:
                event = await rt.recv()
                if event["type"] == "error":
                    code, echoed = check_error_shape(event)
                    if echoed == rid:
                        assert code == "conversation_already_has_active_response", event
                        refused = True
                elif event["type"] == "response.created":
                    created.add(event["response"]["id"])
                elif event["type"] == "response.done":
                    if refused:
                        break  # the earlier response is over: ask again
                    if event["response"]["id"] in created:
                        assert event["response"]["status"] == "completed", event
                        return
    pytest.fail(f"no response could be created ({tag})")


async def assert_healthy(server) -> None:
    async with httpx.AsyncClient(base_url=server.http_url, timeout=10) as http:
        response = await http.get("/health")
    assert response.status_code == 200 and response.json()["status"] == "ok", response.text


def assert_journal_consistent(events: list[Event]) -> None:
    """Journaled events: seq strictly +1, fences never decrease, known types,
    one response.done per response.created."""
    journaled = [e for e in events if "seq" in e]
    seqs = [e["seq"] for e in journaled]
    assert seqs == list(range(seqs[0], seqs[0] + len(seqs))), seqs
    fences = [(e["metadata"]["fence"]["incarnation"], e["metadata"]["fence"]["epoch"]) for e in journaled]
    assert fences == sorted(fences), fences
    for e in events:
        assert e["type"] in SERVER_EVENT_TYPES, e
        if e["type"] == "error":
            check_error_shape(e)
    created = Counter(e["response"]["id"] for e in events if e["type"] == "response.created")
    done = Counter(e["response"]["id"] for e in events if e["type"] == "response.done")
    assert set(created.values()) <= {1} and set(done.values()) <= {1}, (created, done)
    assert set(done) <= set(created), (created, done)


async def resolve(rt: RealtimeClient, event: dict[str, Any]) -> dict[str, Any]:
    """Replace ``$item`` / ``$response`` by the latest response item / response
    the socket has delivered by now (what arrived is read first)."""
    keys = [k for k in ("item_id", "previous_item_id", "response_id")
            if event.get(k) in ("$item", "$response")]
    if not keys:
        return event
    try:
        while True:
            await rt.recv(timeout=0.02)
    except TimeoutError:
        pass
    items = [e["item"]["id"] for e in rt.events if e["type"] == "response.output_item.added"]
    responses = [e["response"]["id"] for e in rt.events if e["type"] == "response.created"]
    latest = {"$item": items[-1] if items else "no-item-yet",
              "$response": responses[-1] if responses else "no-response-yet"}
    return {**event, **{k: latest[event[k]] for k in keys}}


# ---- live: bad frames ------------------------------------------------------------------


@live
async def test_every_bad_frame_gets_one_typed_error_and_the_session_survives(server):
    examples = draw(BAD_LISTS, int(os.environ.get("FUZZ_LIVE_EXAMPLES", "40")))
    sent = 0
    for n, frames in enumerate(examples):
        async with asyncio.timeout(60), await RealtimeClient.connect(server.ws_url) as rt:
            expected: Counter[tuple[str, str | None]] = Counter()
            for k, (frame, code) in enumerate(frames):
                if code is None:  # a frame the codec refuses
                    expected[oracle(frame)] += 1
                    await rt.ws.send(frame)
                else:  # a well-formed event a fresh session refuses
                    eid = f"sem-{n}-{k}"
                    expected[(code, eid)] += 1
                    await rt.ws.send(json.dumps({**frame, "event_id": eid}))
            answers = await sentinel(rt, str(n))
            got = Counter(check_error_shape(e) for e in answers)
            assert not [e for e in answers if e["type"] != "error"], answers
            assert got == expected, f"frames {frames!r}: expected {expected}, got {got}"
            sent += len(frames)
            if n % 5 == 0:
                await assert_session_works(rt, f"bad-{n}")
                assert_journal_consistent(rt.events)
        await assert_healthy(server)
    assert sent >= 200, sent


# ---- live: valid (and some bad) events in random order ---------------------------------


@live
async def test_random_event_order_keeps_the_session_consistent(server):
    examples = draw(MIXED_LISTS, int(os.environ.get("FUZZ_LIVE_EXAMPLES", "40")) * 3 // 4)
    for n, events in enumerate(examples):
        async with asyncio.timeout(90), await RealtimeClient.connect(server.ws_url) as rt:
            bad: dict[str, str | None] = {}
            for k, (event, is_bad) in enumerate(events):
                eid = f"ev-{n}-{k}"
                event = event if is_bad else await resolve(rt, event)
                frame = on_the_wire(dump({**event, "event_id": eid}, False, False))
                if is_bad:
                    code, echoed = oracle(frame)
                    if code is None or echoed != eid or not fits(frame):
                        continue  # taken, or too large to echo: the bad-frames test covers it
                    bad[eid] = code
                await rt.ws.send(frame)
                if k % 7 == 6:
                    await asyncio.sleep(0.05)  # let some responses and VAD events interleave
            await sentinel(rt, f"mixed-{n}")
            for eid, code in bad.items():
                answers = [e for e in rt.events
                           if e["type"] == "error" and e["error"].get("event_id") == eid]
                assert [e["error"]["code"] for e in answers] == [code], (eid, events, answers)
            await assert_session_works(rt, f"mixed-{n}")
            assert not [e for e in rt.events if e["type"] == "session.closed"]
            assert_journal_consistent(rt.events)
        await assert_healthy(server)
