"""The Realtime GA reference, read from the installed ``openai`` SDK's
pydantic models: every client event, server event and the dotted path of every
field a client may send (``tests/unit/test_realtime_conformance.py`` checks
``docs/realtime-conformance.md`` against it, so the table cannot drift from
the SDK).

Path notation (also the doc table's): ``a.b`` a nested field, ``[]`` the
elements of a list, ``<x>`` the member of a union whose discriminator
(``type``, or ``role`` for messages) is ``x``. Leaves are fields whose value is
not an object (or is a free-form map, such as ``metadata`` or a JSON schema).
"""

from __future__ import annotations

import types
import typing
from dataclasses import dataclass
from typing import Any

import pydantic
from openai.types.realtime import (
    RealtimeClientEvent,
    RealtimeResponseCreateParams,
    RealtimeServerEvent,
    RealtimeSessionCreateRequest,
    RealtimeTranscriptionSessionCreateRequest,
)


def _members(union: Any) -> list[type]:
    """The models of a (possibly ``Annotated``) discriminated union."""
    while typing.get_origin(union) is typing.Annotated:
        union = typing.get_args(union)[0]
    return list(typing.get_args(union))


def event_types(union: Any) -> list[str]:
    return [typing.get_args(m.model_fields["type"].annotation)[0] for m in _members(union)]


CLIENT_EVENTS = event_types(RealtimeClientEvent)
SERVER_EVENTS = event_types(RealtimeServerEvent)


@dataclass(frozen=True)
class Leaf:
    path: str  # in the notation above
    annotation: Any  # the SDK's annotation of the leaf (with None/Optional removed)


def _strip(hint: Any) -> Any:
    """``Optional[X]``/``Annotated[X, ...]`` -> ``X`` (or a ``Union`` of the rest)."""
    while True:
        origin = typing.get_origin(hint)
        if origin is typing.Annotated:
            hint = typing.get_args(hint)[0]
            continue
        if origin in (typing.Union, types.UnionType):
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            if len(args) == 1:
                hint = args[0]
                continue
            return typing.Union[tuple(args)]
        return hint


def _is_model(t: Any) -> bool:
    return isinstance(t, type) and issubclass(t, pydantic.BaseModel)


def _tag(model: type) -> str | None:
    """The discriminator value naming ``model`` inside a union."""
    for key in ("type", "role"):
        f = model.model_fields.get(key)
        if f is not None and typing.get_origin(_strip(f.annotation)) is typing.Literal:
            values = typing.get_args(_strip(f.annotation))
            if len(values) == 1:
                return str(values[0])
    return None


def _message_tag(model: type) -> str | None:
    """Messages share ``type: "message"``; their role tells them apart."""
    kind, role = model.model_fields.get("type"), model.model_fields.get("role")
    if kind is None or role is None:
        return _tag(model)
    return f"message:{typing.get_args(_strip(role.annotation))[0]}"


def _walk(hint: Any, path: str, out: dict[str, Leaf], seen: tuple[type, ...]) -> None:
    hint = _strip(hint)
    origin = typing.get_origin(hint)
    if _is_model(hint):
        if hint in seen:  # recursive types: listed once
            out.setdefault(path, Leaf(path, hint))
            return
        for name, field in hint.model_fields.items():
            _walk(field.annotation, f"{path}.{name}" if path else name, out, (*seen, hint))
        return
    if origin in (list, typing.List):
        _walk(typing.get_args(hint)[0], path + "[]", out, seen)
        return
    if origin is typing.Union:
        models = [a for a in typing.get_args(hint) if _is_model(_strip(a))]
        if len(models) > 1:
            for m in models:
                _walk(m, f"{path}<{_message_tag(_strip(m))}>", out, seen)
            others = [a for a in typing.get_args(hint) if not _is_model(_strip(a))]
            if others:  # a union of a scalar and objects ("auto" or {...})
                out[path] = Leaf(path, typing.Union[tuple(others)])
            return
        if len(models) == 1:
            _walk(models[0], path, out, seen)
            others = [a for a in typing.get_args(hint) if not _is_model(_strip(a))]
            out.setdefault(path, Leaf(path, typing.Union[tuple(others)] if len(others) > 1 else others[0]))
            return
    out[path] = Leaf(path, hint)


def leaves(model: Any, prefix: str) -> dict[str, Leaf]:
    out: dict[str, Leaf] = {}
    _walk(model, prefix, out, ())
    return out


def client_event_fields() -> dict[str, dict[str, Leaf]]:
    """client event type -> its fields (``session.update`` and
    ``response.create`` are given whole by ``session_fields``/``response_fields``)."""
    out: dict[str, dict[str, Leaf]] = {}
    for model in _members(RealtimeClientEvent):
        kind = _tag(model)
        fields = leaves(model, "")
        out[kind] = {p: leaf for p, leaf in fields.items()
                     if not p.startswith(("session.", "session<", "response."))}
    return out


def session_fields() -> dict[str, Leaf]:
    """Every ``session`` field of ``session.update`` (a realtime session; the
    transcription session's own shape is under ``session<transcription>``)."""
    out = leaves(RealtimeSessionCreateRequest, "session")
    out.update(leaves(RealtimeTranscriptionSessionCreateRequest, "session<transcription>"))
    return out


def response_fields() -> dict[str, Leaf]:
    return leaves(RealtimeResponseCreateParams, "response")
