"""A pytest plugin loaded (``-p peer_observer``) into a peer project's own test
run in the clients' virtualenv (tests/peers, driven by tests/clients/test_peer_*.py).

It changes nothing in their tests: it only writes down, per test, what crossed
the socket, so our wrapper can say what the model said when a test that
depends on the model fails, and give a wire failure's event sequence. The
source is LiveKit's own debug log (``LK_OPENAI_DEBUG=1``: every event sent
``>>>`` and received ``<<<`` is logged with the event as ``lk.pii.event``).
At the end it writes ``{nodeid: observations}`` as JSON to ``$PEER_OBSERVER_OUT``.
"""

from __future__ import annotations

import json
import logging
import os
from typing import Any

import pytest

_current: list[str] = [""]  # the nodeid of the test now running (setup, call and teardown)
_seen: dict[str, dict[str, Any]] = {}


def _note(direction: str, event: dict[str, Any]) -> None:
    seen = _seen.setdefault(_current[0], {"said": [], "heard": [], "calls": [], "errors": [],
                                           "sequence": []})
    kind = event.get("type", "?")
    if kind == "input_audio_buffer.append" or kind.endswith(".delta"):
        return  # thousands of them; the sequence is for reading
    if kind == "response.done":  # cancelled or completed is half the story of a cancel
        kind = f"response.done({event.get('response', {}).get('status')})"
    seen["sequence"].append(f"{direction} {kind}")
    if kind in ("response.output_audio_transcript.done", "response.output_text.done"):
        seen["said"].append(event.get("transcript", event.get("text", "")))
    elif kind == "conversation.item.input_audio_transcription.completed":
        seen["heard"].append(event.get("transcript", ""))
    elif kind == "response.output_item.done" and event.get("item", {}).get("type") == "function_call":
        seen["calls"].append({"name": event["item"].get("name"),
                              "arguments": event["item"].get("arguments")})
    elif kind == "error":
        seen["errors"].append(event.get("error", {}))


class _Tap(logging.Handler):
    def emit(self, record: logging.LogRecord) -> None:
        event = record.__dict__.get("lk.pii.event")
        if isinstance(event, dict) and record.getMessage() in (">>>", "<<<"):
            _note("client" if record.getMessage() == ">>>" else "server", event)


def pytest_configure(config: pytest.Config) -> None:
    # Set before their session-scoped logging baseline is taken, so their
    # per-module restore keeps this handler and level.
    logger = logging.getLogger("livekit.agents")
    logger.setLevel(logging.DEBUG)
    logger.addHandler(_Tap())


@pytest.hookimpl(wrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    _current[0] = item.nodeid
    try:
        return (yield)
    finally:
        _current[0] = ""


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    out = os.environ.get("PEER_OBSERVER_OUT")
    if out:
        with open(out, "w", encoding="utf-8") as f:
            json.dump(_seen, f, indent=1)
