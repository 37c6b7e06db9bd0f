"""What the store keeps of the copies that are not realtime sessions.

Plain values only (strings, numbers, tuples of dicts): they are pickled into
a shared store and loaded back with an allow-list (``store.decode``), so
they name no class outside this module and the core.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

APP_PREFIX = "app:"  # application sessions' keys in the store (ids a client chose
# may look like a realtime session's: the prefix keeps the two apart)


@dataclass(frozen=True)
class AppSessionRecord:
    """What an application session is rebuilt from on another worker: its
    model, its history as the client sent and got it (``Message.wire()``),
    its API key's hash, and its lease as the client knows it (the expiry in
    unix seconds, so a process with another clock reads it right)."""

    model: str
    messages: tuple[dict[str, Any], ...]
    key_sha: str | None
    ttl_s: float
    expires_at: float
    lease_generation: int
    turns: int
    created_at: float
    incarnation: int = 0


STREAM_PREFIX = "stream:"  # resumable streams' keys in the store


@dataclass(frozen=True)
class StreamRecord:
    """What a resumable stream is rebuilt from on another worker (its events
    are the journal, each ``(seq, event, data)``): its status (``active`` or
    ``completed``), its API key's hash, its TTL and when it completed and
    was created (unix seconds, so a process with another clock reads it
    right), and the worker its generation ran on."""

    status: str
    key_sha: str | None
    ttl_s: float
    completed_at: float | None
    created_at: float
    generated_by: str = ""


LIVE_PREFIX = "live:"  # stored GPT-Live sessions' keys (store: true; forks read them)


@dataclass(frozen=True)
class LiveSessionRecord:
    """A stored GPT-Live session (``durable/live_sessions.py``): its config as
    the client started it (the SDK's ``SessionConfig``, without ``input``),
    its conversation as the SDK's ``InitialItem`` messages (role and text),
    its API key's hash, when it was stored (unix seconds), and its recording
    so far (a stereo WAV, ``media/recording.py``; ``GET …/{id}/content``)."""

    config: dict[str, Any]
    items: tuple[dict[str, Any], ...]
    key_sha: str | None
    stored_at: float
    recording: bytes = b""
