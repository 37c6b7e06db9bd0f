"""Stored sessions and their forks, as the dialect sees them (sans-I/O).

A session started with ``store: true`` is kept (``durable/live_sessions.py``)
as what a new session needs to start where it stood: its config as the
client started it and its conversation as the SDK's ``InitialItem``
messages (``stored_items``: role and text -- what the user said as heard,
what the assistant said as spoken, appended instructions and thinking as
developer messages; tool calls and their outputs are not carried).

A fork (``WS /v1/live/sessions/{id}/fork``, the SDK's ``live.forks``) is a
new session whose ``session.start`` carries only overrides
(``ForkSessionConfig``: ``audio.format``, ``delegation``, ``store``; "do not
supply a new model"). ``fork_start`` turns it into the ``session.start`` it
means -- the stored config with the overrides, its conversation as
``session.input`` -- which the codec then parses as any other, so a fork is
validated as a session is and starts the way an initial history does
(``history.py``).

A WebRTC fork (``POST /v1/live/sessions/{id}/fork``, the SDK's
``live.sessions.fork``) is the same rewrite (``webrtc=True``) with the
SDK's two differences: WebRTC negotiates its audio, so ``audio.format`` is
refused and the stored one dropped, and ``client`` (the frontend's data
channel permissions) is a WebRTC fork's to set.
"""

from __future__ import annotations

import copy
from typing import Any

from vllm_duplex.domain.errors import DuplexError

# The Realtime content parts that carry a message's words, and where.
_TEXT = {"input_text": "text", "output_text": "text", "text": "text",
         "input_audio": "transcript", "output_audio": "transcript", "audio": "transcript"}
_ROLE = {"system": "developer", "user": "user", "assistant": "assistant"}
_OVERRIDES = ("audio", "client", "delegation", "store")


def stored_items(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A session's conversation (Realtime wire items, as its snapshot has
    them) as the SDK's ``InitialItem`` messages; items with no words are left out."""
    out = []
    for item in items:
        role = _ROLE.get(item.get("role", ""))
        if item.get("type") != "message" or role is None:
            continue
        words = [part.get(_TEXT[part.get("type", "")]) or ""
                 for part in item.get("content") or [] if part.get("type") in _TEXT]
        text = " ".join(w.strip() for w in words if w and w.strip())
        if text:
            kind = "output_text" if role == "assistant" else "input_text"
            out.append({"type": "message", "role": role,
                        "content": [{"type": kind, "text": text}]})
    return out


def fork_start(obj: dict[str, Any], config: dict[str, Any],
               items: tuple[dict[str, Any], ...], *, webrtc: bool = False) -> dict[str, Any]:
    """A fork's ``session.start`` (overrides only) as the ``session.start`` it
    means. Not a ``session.start``: returned as it is (the codec answers it).
    ``webrtc``: a fork onto a WebRTC connection (the module's docstring)."""
    if obj.get("type") != "session.start":
        return obj
    overrides = obj.get("session", {})
    if not isinstance(overrides, dict):
        raise DuplexError("invalid_value", "session must be an object", param="session")
    if "model" in overrides:
        raise DuplexError("invalid_value", "a fork inherits the stored session's model; "
                          "do not supply one", param="session.model")
    for name in overrides:
        if name not in _OVERRIDES:
            raise DuplexError("invalid_value", f"session.{name} is not a fork override "
                              f"(a fork may set {', '.join(_OVERRIDES)})", param=f"session.{name}")
    if overrides.get("client") is not None and not webrtc:
        raise DuplexError("unsupported_option", "client overrides are only supported for "
                          "WebRTC forks; this is a WebSocket fork", param="session.client")
    session = copy.deepcopy(config)
    audio = overrides.get("audio")
    if webrtc:
        if audio is not None:
            raise DuplexError("invalid_value", "WebRTC negotiates its audio format: "
                              "audio.format is only supported on WebSocket forks",
                              param="session.audio")
        (session.get("audio") or {}).pop("format", None)
        if overrides.get("client") is not None:
            session["client"] = copy.deepcopy(overrides["client"])
    elif audio is not None:
        if not isinstance(audio, dict) or set(audio) - {"format"}:
            raise DuplexError("invalid_value", "a fork's audio sets only format",
                              param="session.audio")
        if audio.get("format") is not None:
            session.setdefault("audio", {})["format"] = audio["format"]
    if overrides.get("delegation") is not None:
        session["delegation"] = _delegation(session.get("delegation"), overrides["delegation"])
    if overrides.get("store") is not None:
        session["store"] = overrides["store"]
    session["input"] = [copy.deepcopy(i) for i in items]
    out = {"type": "session.start", "session": session}
    if "event_id" in obj:
        out["event_id"] = obj["event_id"]
    return out


def _delegation(stored: Any, override: Any) -> dict[str, Any]:
    """Only a Responses delegation is overridden, and its type cannot change."""
    if not isinstance(override, dict) or override.get("type") != "responses" or \
            not isinstance(stored, dict) or stored.get("type") != "responses":
        raise DuplexError("invalid_value", "a fork overrides only a stored Responses "
                          "delegation, and its type cannot change", param="session.delegation")
    merged = {**stored, **{k: v for k, v in override.items() if k != "responses"}}
    merged["responses"] = {**(stored.get("responses") or {}), **(override.get("responses") or {})}
    return merged
