"""GPT-Live server events checked against the ``openai`` SDK's own models
(``openai.types.live``): the exact model for the event's type, strictly
validated, with no field the SDK does not define (its models accept extras,
so that is checked here, at every depth)."""

from __future__ import annotations

import json
import typing
from typing import Any

import pydantic
from openai import BaseModel
from openai.types.live import ServerEvent
from openai.types.live.connect_server_event import ConnectServerEvent


def _by_type(union: Any) -> dict[str, type[BaseModel]]:
    out = {}
    for model in typing.get_args(typing.get_args(union)[0]):
        kind = typing.get_args(model.model_fields["type"].annotation)[0]
        out[kind] = model
    return out


SERVER_MODELS: dict[str, type[BaseModel]] = {**_by_type(ConnectServerEvent), **_by_type(ServerEvent)}


def _no_extras(obj: Any, path: str) -> None:
    if isinstance(obj, pydantic.BaseModel):
        extra = obj.model_extra or {}
        assert not extra, f"{path}: fields the SDK does not define: {sorted(extra)}"
        for name in type(obj).model_fields:
            _no_extras(getattr(obj, name), f"{path}.{name}")
    elif isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            _no_extras(v, f"{path}[{i}]")


def live_event(frame: str) -> BaseModel:
    """``frame`` as the SDK's model of its type (AssertionError or a
    ValidationError when it is not exactly that shape)."""
    raw = json.loads(frame)
    model = SERVER_MODELS.get(raw.get("type"))
    assert model is not None, f"not a GPT-Live server event: {raw.get('type')!r}"
    event = model.model_validate(raw, strict=False)
    _no_extras(event, raw["type"])
    return event


def _responses_models() -> dict[str, type[BaseModel]]:
    from openai.types.responses import ResponseStreamEvent
    return _by_type(ResponseStreamEvent)


RESPONSES_MODELS: dict[str, type[BaseModel]] = _responses_models()


def responses_event(raw: dict[str, Any]) -> BaseModel:
    """A ``response.event``'s nested event as the SDK's model of its
    Responses stream event type, strictly: no field the SDK does not define."""
    model = RESPONSES_MODELS.get(raw.get("type"))
    assert model is not None, f"not a Responses stream event: {raw.get('type')!r}"
    event = model.model_validate(raw, strict=False)
    _no_extras(event, raw["type"])
    return event
