"""docs/realtime-conformance.md is the SDK's reference, line for line, and the
codec does what each line says.

The reference is the installed ``openai`` SDK (``support/sdk_realtime.py``
walks its pydantic models). Every client event, server event and field must
have exactly one line; a line says honoured, refused (``unsupported_option``
naming the field) or n.a. (accepted, no effect, and why); each field's line is
tried on the codec with a value built from its path: a refused one must be
refused, an honoured session field must come back in ``session.updated``
(through ``updated_config``, as the session core applies a ``session.update``).
"""

from __future__ import annotations

import json
import re
import typing
from pathlib import Path
from typing import Any

import pytest

from support import sdk_realtime as sdk
from vllm_duplex.domain import events as server_events
from vllm_duplex.domain.commands import ResponseCreate, ResponseOptions, SessionUpdate
from vllm_duplex.domain.contracts import Capabilities
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.session_config import SessionConfig, SessionPatch, session_wire, updated_config
from vllm_duplex.realtime.wire.aliases import BETA_EVENT_TYPES, RESPONSE_BETA_TO_GA, SESSION_BETA_TO_GA
from vllm_duplex.realtime.wire.codec import CLIENT_EVENT_TYPES, RealtimeCodec

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "realtime-conformance.md"
STATUSES = ("honoured", "refused", "n.a.")


def section(title: str) -> list[list[str]]:
    """The rows of the table under ``## title``, as cells without backticks."""
    text = DOC.read_text().split(f"\n## {title}\n", 1)[1].split("\n## ", 1)[0]
    return [[c.strip().strip("`") for c in line.split("|")[1:-1]]
            for line in text.splitlines() if line.startswith("| `")]


def field_rows() -> dict[tuple[str, str], tuple[str, str]]:
    rows = section("Client event fields")
    out = {(r[0], r[1]): (r[2], r[3]) for r in rows}
    assert len(out) == len(rows), "a field has two lines"
    return out


ROWS = field_rows()


# ---- the table is the SDK's, no more, no less ----------------------------------------


def expected_fields() -> set[tuple[str, str]]:
    out = {(event, path) for event, fields in sdk.client_event_fields().items() for path in fields}
    out |= {("session.update", p) for p in sdk.session_fields() if not p.startswith("session<")}
    out |= {("response.create", p) for p in sdk.response_fields() if not p.startswith("response.input[]")}
    return out


def test_every_sdk_field_has_one_line_and_every_line_is_an_sdk_field():
    documented, expected = set(ROWS), expected_fields()
    assert sorted(expected - documented) == [], "SDK fields with no line in the doc"
    assert sorted(documented - expected) == [], "lines for fields the SDK does not have"
    assert {status for status, _ in ROWS.values()} <= set(STATUSES)


def test_the_fields_that_share_lines_are_the_same_fields():
    """A transcription session's fields, and response.create's input items,
    are documented by the lines they share: the SDK must agree they are the same."""
    for p in sdk.session_fields():
        if p.startswith("session<transcription>.") and p != "session<transcription>.type":
            assert ("session.update", "session" + p[len("session<transcription>"):]) in ROWS, p
    for p in sdk.response_fields():
        if p.startswith("response.input[]"):
            assert ("conversation.item.create", "item" + p[len("response.input[]"):]) in ROWS, p


def test_the_counts_in_the_doc_are_the_table_s():
    counts = {s: sum(1 for status, _ in ROWS.values() if status == s) for s in STATUSES}
    line = f"Fields: **{counts['honoured']} honoured, {counts['refused']} refused, {counts['n.a.']} n.a.**"
    assert line in DOC.read_text()


def test_every_refused_or_na_line_says_why():
    assert [k for k, (status, why) in ROWS.items() if status != "honoured" and not why] == []


def test_client_events_are_the_sdk_s_and_all_are_parsed():
    rows = {r[0]: r[1] for r in section("Client events")}
    assert set(rows) == set(sdk.CLIENT_EVENTS)
    assert {e for e, s in rows.items() if s == "honoured"} == set(sdk.CLIENT_EVENTS) & CLIENT_EVENT_TYPES


def _sent_types() -> set[str]:
    """Every event type the engine can send: its journaled events, their beta
    names, and the notices the call servers send themselves."""
    journaled = {cls.type for cls in vars(server_events).values()
                 if isinstance(cls, type) and isinstance(getattr(cls, "type", None), str)}
    beta = {BETA_EVENT_TYPES[t] for t in journaled if BETA_EVENT_TYPES.get(t)}
    source = "\n".join(p.read_text() for p in (ROOT / "realtime" / "server").rglob("*.py"))
    notices = {t for t in sdk.SERVER_EVENTS if f'"{t}"' in source}
    return journaled | beta | notices


def test_server_events_are_the_sdk_s_and_sent_means_sent():
    rows = {r[0]: (r[1], r[2]) for r in section("Server events")}
    assert set(rows) == set(sdk.SERVER_EVENTS)
    sent = _sent_types()
    for event, (status, why) in rows.items():
        assert status in ("sent", "not sent"), event
        assert (status == "sent") == (event in sent), event
        assert status == "sent" or why, event


# ---- building an event that sets one field -------------------------------------------

PNG = ("data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8"
       "/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg==")

# Values chosen by field name where the annotation's plain sample would be
# the default (and so prove nothing) or invalid.
SAMPLES: dict[str, Any] = {
    "rate": 16000, "image_url": PNG, "audio": "AAAA", "conversation": "none", "detail": "high",
    "parameters": {"type": "object"}, "model": "m", "arguments": "{}",
    "server_url": "http://127.0.0.1:9/mcp", "language": "en",
}
EVENT_BASE: dict[str, dict[str, Any]] = {
    "conversation.item.create": {"item": {"type": "message", "role": "user", "content": []}},
    "conversation.item.delete": {"item_id": "i"},
    "conversation.item.retrieve": {"item_id": "i"},
    "conversation.item.truncate": {"item_id": "i", "content_index": 0, "audio_end_ms": 0},
    "input_audio_buffer.append": {"audio": ""},
    "session.update": {"session": {}},
}
# What an object needs beside the field under test (by the object's name).
SIBLINGS: dict[str, dict[str, Any]] = {
    "tools[]": {"name": "f"}, "tool_choice": {"name": "f"},
    "truncation": {"type": "retention_ratio", "retention_ratio": 0.5},
    "noise_reduction": {"type": "near_field"}, "item": {"name": "f", "call_id": "c", "output": "o"},
    "prompt": {"id": "pmpt_1"},
    # by the tagged name first: what each MCP tool and item needs
    "tools[]<mcp>": {"server_label": "s", "server_url": SAMPLES["server_url"]},
    "tool_choice<mcp>": {"server_label": "s"},
    "item<mcp_call>": {"server_label": "s", "name": "f", "arguments": "{}"},
    "item<mcp_approval_request>": {"server_label": "s", "name": "f", "arguments": "{}"},
    "item<mcp_list_tools>": {"server_label": "s", "tools": []},
    "item<mcp_approval_response>": {"approval_request_id": "mcpr_1", "approve": True},
}


def sample(leaf: str, annotation: Any) -> Any:
    if leaf in SAMPLES:
        return SAMPLES[leaf]
    hint = annotation
    if typing.get_origin(hint) is typing.Union:
        hint = typing.get_args(hint)[0]
    origin = typing.get_origin(hint)
    if origin is typing.Literal:
        return typing.get_args(hint)[0]
    if origin in (list, typing.List):
        return [sample("", typing.get_args(hint)[0])]
    if origin in (dict, typing.Dict) or hint is object:
        return {"k": "v"}
    return {str: "x", int: 7, float: 0.75, bool: False}[hint]


TOKEN = re.compile(r"\[\]|<[^>]+>|[^.\[<]+")
TAG = re.compile(r"<[^>]+>")


def content_part(at: str, leaf: str) -> dict[str, Any]:
    """A content part needs the type its field belongs to."""
    out = "assistant" in at
    if leaf == "text":
        return {"type": "output_text" if out else "input_text"}
    if leaf in ("audio", "transcript"):
        return {"type": "output_audio" if out else "input_audio"}
    if leaf in ("image_url", "detail"):
        return {"type": "input_image", "image_url": PNG}
    return {}


def build(tokens: list[str], value: Any, at: str = "") -> Any:
    """The JSON that sets the field ``tokens`` to ``value`` (``at``: the path
    so far): unions get their discriminator, objects the siblings they need."""
    if not tokens:
        return value
    head, rest = tokens[0], tokens[1:]
    if head == "[]":
        return [build(rest, value, at + "[]")]
    if head.startswith("<"):
        obj = build(rest, value, at + head)
        tag = head[1:-1]
        if tag.startswith("message:"):
            obj.update(type="message", role=tag.split(":")[1])
            obj.setdefault("content", [])
        elif "type" not in obj or rest != ["type"]:
            obj["type"] = tag
        return obj
    obj = {head: build(rest, value, f"{at}.{head}" if at else head)}
    name = TAG.sub("", at).rsplit(".", 1)[-1]
    tagged = at.rsplit(".", 1)[-1]
    extra = content_part(at, head) if name == "content[]" else SIBLINGS.get(
        tagged, SIBLINGS.get(name, {}))
    for k, v in extra.items():
        obj.setdefault(k, v)
    return obj


def leaf_of(event: str, path: str) -> Any:
    if path.startswith("session"):
        return sdk.session_fields()[path]
    if path.startswith("response."):
        return sdk.response_fields()[path]
    return sdk.client_event_fields()[event][path]


def event_setting(event: str, path: str, value: Any = None) -> dict[str, Any]:
    leaf = leaf_of(event, path)
    name = path.rsplit(".", 1)[-1].strip("[]")
    if value is None:
        value = sample(name, leaf.annotation)
    doc = build(TOKEN.findall(path), value)
    return {"type": event, **EVENT_BASE.get(event, {}), **doc}


def param_of(path: str) -> str:
    """The ``param`` an error names for ``path``: tags dropped, first elements."""
    return TAG.sub("", path).replace("[]", "[0]")


def params_naming(path: str) -> set[str]:
    """What an error may name for ``path``: the field, an object holding it
    (a whole ``prompt``), or the ``type`` of a union member holding it (an MCP tool)."""
    tokens = TOKEN.findall(path)
    out = {param_of(path)}
    for i in range(1, len(tokens)):
        prefix = param_of("".join(t if t.startswith(("[", "<")) else "." + t for t in tokens[:i]).lstrip("."))
        out.add(prefix)
        if tokens[i].startswith("<"):
            out.add(prefix + ".type")
    return out


def parse(doc: dict[str, Any]) -> Any:
    return RealtimeCodec().parse(json.dumps(doc))


def lines(status: str, events: tuple[str, ...] | None = None) -> list[tuple[str, str]]:
    return sorted(k for k, (s, _) in ROWS.items() if s == status and (events is None or k[0] in events))


# ---- the codec does what each line says ----------------------------------------------


@pytest.mark.parametrize(("event", "path"), lines("refused"))
def test_a_refused_field_is_unsupported_option_naming_it(event, path):
    with pytest.raises(DuplexError) as ei:
        parse(event_setting(event, path))
    err = ei.value
    assert err.code == "unsupported_option", (err.code, err.message)
    assert err.param in params_naming(path), (err.param, path)
    assert err.param in err.message


@pytest.mark.parametrize(("event", "path"), lines("n.a.") + lines("honoured"))
def test_an_honoured_or_na_field_is_accepted(event, path):
    command = parse(event_setting(event, path))
    if path == "event_id":
        assert command.event_id == "x"


# A policy that offers every GA turn detection (the cascade's).
CAPS = Capabilities(input_modes=frozenset(), turn_detection=frozenset({"server_vad", "semantic_vad"}))

# Honoured session fields that session.updated does not echo as sent, and why.
NOT_ECHOED = {
    "session.parallel_tool_calls": "validated only: one call per response honours both values",
    "session.model": "immutable once open: checked by test_the_model_is_read",
    "session.tools[]<mcp>.headers": "a secret: sent to the MCP server, never echoed (tests/unit/test_mcp_tools_core.py)",
    "session.tools[]<mcp>.authorization": "a secret: sent to the MCP server, never echoed",
}


@pytest.mark.parametrize(("event", "path"), [k for k in lines("honoured", ("session.update",))
                                             if k[1].startswith("session.")])
def test_an_honoured_session_field_comes_back_in_session_updated(event, path):
    if path in NOT_ECHOED:
        pytest.skip(NOT_ECHOED[path])
    doc = event_setting(event, path)
    command = parse(doc)
    assert isinstance(command, SessionUpdate)
    # what the session core does with a session.update (session/core.py _on_update)
    config = updated_config(SessionConfig(model="m", policy="p"), command.patch, CAPS, "p")
    echoed: Any = session_wire(config, session_id="s")
    sent: Any = doc["session"]
    for token in TOKEN.findall(path)[1:]:
        if token.startswith("<"):
            continue
        key: Any = 0 if token == "[]" else token
        echoed, sent = echoed[key], sent[key]
    assert echoed == sent


def test_the_model_is_read():
    command = parse(event_setting("session.update", "session.model", "other"))
    with pytest.raises(DuplexError) as ei:
        updated_config(SessionConfig(model="m", policy="p"), command.patch, CAPS, "p")
    assert (ei.value.code, ei.value.param) == ("immutable_field", "session.model")


@pytest.mark.parametrize(("event", "path"), [k for k in lines("honoured", ("response.create",))
                                             if k[1].startswith("response.")])
def test_an_honoured_response_field_changes_the_response(event, path):
    command = parse(event_setting(event, path))
    assert isinstance(command, ResponseCreate)
    assert command.options != ResponseOptions()


def test_parallel_tool_calls_is_validated_not_ignored():
    for event, key in (("session.update", "session"), ("response.create", "response")):
        with pytest.raises(DuplexError) as ei:
            parse({"type": event, key: {"parallel_tool_calls": "yes"}})
        assert (ei.value.code, ei.value.param) == ("invalid_value", f"{key}.parallel_tool_calls")


def test_the_accepted_values_of_refused_fields_pass():
    """Refusal is of what cannot be honoured: the defaults still pass."""
    su = lambda s: {"type": "session.update", "session": s}  # noqa: E731
    assert parse(su({"audio": {"output": {"speed": 1.0}}})).patch.speed == 1.0
    assert parse(su({"include": [], "prompt": None, "reasoning": {"effort": None}})).patch.fields_set() == {}
    assert parse(su({"audio": {"input": {"transcription": {"model": "m", "language": None}}}}))
    item = {"type": "message", "role": "user",
            "content": [{"type": "input_image", "image_url": PNG, "detail": "auto"},
                        {"type": "input_audio", "audio": "AAAA", "transcript": "hi"}]}
    parsed = parse({"type": "conversation.item.create", "item": item}).item
    assert [p.transcript for p in parsed.content] == [None, "hi"]


def test_tracing_is_validated():
    with pytest.raises(DuplexError) as ei:
        parse({"type": "session.update", "session": {"tracing": {"group_id": 3}}})
    assert (ei.value.code, ei.value.param) == ("invalid_value", "session.tracing.group_id")
    with pytest.raises(DuplexError):
        parse({"type": "session.update", "session": {"tracing": "manual"}})


# ---- beta aliases ----------------------------------------------------------------------

BETA_SAMPLES = {
    "modalities": ["text"], "max_response_output_tokens": 9, "input_audio_format": "g711_ulaw",
    "input_audio_transcription": {"model": "m", "prompt": "p"},
    "turn_detection": {"type": "server_vad", "silence_duration_ms": 900},
    "input_audio_noise_reduction": {"type": "far_field"}, "output_audio_format": "g711_alaw",
    "voice": "verse", "speed": 1.2, "temperature": 0.3,
}
RESPONSE_FLAT = ("output_audio_format", "voice")  # read flat by response.create too


def outcome(doc: dict[str, Any]) -> Any:
    """The patch or options an event parses to, or its error's code."""
    try:
        command = parse(doc)
    except DuplexError as err:
        return err.code
    return command.patch if isinstance(command, SessionUpdate) else command.options


def nest(path: list[str], value: Any) -> Any:
    for key in reversed(path):
        value = {key: value}
    return value


def test_beta_aliases_are_the_codec_s_and_behave_as_their_ga_field():
    rows = {r[0]: (r[1], r[2]) for r in section("Beta aliases")}
    session = {f"session.{k}" for k in SESSION_BETA_TO_GA} | {"session.temperature"}
    response = {f"response.{k}" for k in (*RESPONSE_BETA_TO_GA, *RESPONSE_FLAT)}
    assert set(rows) == session | response
    for alias, (ga, status) in rows.items():
        scope, key = alias.split(".", 1)
        event = "session.update" if scope == "session" else "response.create"
        got = outcome({"type": event, scope: {key: BETA_SAMPLES[key]}})
        assert (got == "unsupported_option") == (status == "refused"), (alias, got)
        assert not isinstance(got, str) or status == "refused", (alias, got)
        assert got not in (ResponseOptions(), SessionPatch()), alias  # it did something
        if ga.startswith(scope):  # the GA field it stands for does the same
            ga_doc = {"type": event, scope: nest(ga.split(".")[1:], BETA_SAMPLES[key])}
            assert outcome(ga_doc) == got, alias
