"""A small async client for ``/v1/realtime`` (OpenAI Realtime GA events).

Reading is lazy: nothing runs in the background, events are read only inside
``recv``/``wait_for``/``collect_response``. That keeps the client free of tasks
to leak, and lets the socket's own bounded queue provide backpressure. Every
event read is kept in ``events`` with a ``_recv_t`` (``time.monotonic()``) so
callers can compute latencies after the fact.

    async with await RealtimeClient.connect() as rt:
        await rt.append_audio(pcm16)
        await rt.commit()
        await rt.create_response()
        result = await rt.collect_response()
"""

from __future__ import annotations

import asyncio
import base64
import json
import time
import uuid
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

Event = dict[str, Any]

# GA names first; beta (``OpenAI-Beta: realtime=v1``) aliases so a beta session collects too.
_AUDIO_DELTA = {"response.output_audio.delta", "response.audio.delta"}
RESUMED = "duplex.output_audio.resumed"  # extension: the reply goes on after a backchannel
# Closing with this keeps the session for a resume; 1000 ends it (docs/errors.md).
CLOSE_DETACH = 4000
_TRANSCRIPT_DELTA = {"response.output_audio_transcript.delta", "response.audio_transcript.delta"}
_TRANSCRIPT_DONE = {"response.output_audio_transcript.done", "response.audio_transcript.done"}
_TEXT_DELTA = {"response.output_text.delta", "response.text.delta"}
_TEXT_DONE = {"response.output_text.done", "response.text.done"}
STORE_RETRY_S = 0.1  # the first pause before a resume refused ``store_unavailable`` is asked again


class RealtimeError(Exception):
    """The server answered with an ``error`` event; ``event`` is that event."""

    def __init__(self, event: Event) -> None:
        err = event.get("error") or {}
        code = err.get("code") or err.get("type") or "error"
        super().__init__(f"{code}: {err.get('message', '')}")
        self.event = event

    @property
    def code(self) -> str | None:
        return (self.event.get("error") or {}).get("code")

    @property
    def retry_after_s(self) -> float | None:
        """When a retry may succeed (a refusal at the server's capacity)."""
        return (self.event.get("error") or {}).get("retry_after_s")


def _refusal(exc: InvalidStatus) -> Exception:
    """An HTTP refusal of the upgrade, as the error event it carries (the
    server's ``{"error": {...}}`` body); any other status stays as it was."""
    try:
        body = json.loads(exc.response.body or b"")
    except ValueError:
        return exc
    if not isinstance(body, dict) or not isinstance(body.get("error"), dict):
        return exc
    error = dict(body["error"])
    retry = exc.response.headers.get("Retry-After")
    if retry is not None and "retry_after_s" not in error and retry.isdigit():
        error["retry_after_s"] = int(retry)
    return RealtimeError({"type": "error", "error": error, "http_status": exc.response.status_code})


@dataclass
class ResponseResult:
    """One response, from ``response.created`` (or what came before it) to ``response.done``."""

    audio: bytes  # decoded deltas, concatenated, in the session's output format
    transcript: str
    text: str
    done: Event
    events: list[Event] = field(default_factory=list)
    errors: list[Event] = field(default_factory=list)  # error events seen while it ran

    @property
    def response_id(self) -> str | None:
        return (self.done.get("response") or {}).get("id")

    @property
    def status(self) -> str | None:
        return (self.done.get("response") or {}).get("status")


def _with_model(url: str, model: str | None) -> str:
    if not model:
        return url
    parts = urlsplit(url)
    query = [(k, v) for k, v in parse_qsl(parts.query) if k != "model"] + [("model", model)]
    return urlunsplit(parts._replace(query=urlencode(query)))


class RealtimeClient:
    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.session: Event = {}
        self.session_id: str = ""
        self.resume_token: str | None = None
        self.owner: str | None = None  # the worker holding the session, once it moved
        self.last_seq = 0  # the newest journaled event received (for session.resume)
        self.url = ""
        self.api_key: str | None = None
        self.events: list[Event] = []
        # Index into ``events`` after the last response collect_response returned, so a
        # response whose first events were read earlier (e.g. while streaming input) is
        # still collected whole, and never twice.
        self._collected = 0

    @classmethod
    async def connect(
        cls,
        url: str = "ws://127.0.0.1:8000/v1/realtime",
        *,
        api_key: str | None = None,
        model: str | None = None,
        beta: bool = False,
        max_size: int = 32 << 20,
        open_timeout: float = 10,
    ) -> RealtimeClient:
        headers: dict[str, str] = {}
        if api_key:
            headers["Authorization"] = f"Bearer {api_key}"
        if beta:
            headers["OpenAI-Beta"] = "realtime=v1"
        try:
            ws = await connect(_with_model(url, model), additional_headers=headers,
                               max_size=max_size, open_timeout=open_timeout)
        except InvalidStatus as exc:  # refused before the upgrade (429 at capacity)
            raise _refusal(exc) from exc
        client = cls(ws)
        client.url, client.api_key = url, api_key
        try:
            await client.wait_for("session.created", timeout=open_timeout, raise_on_error=True)
        except BaseException:
            await ws.close()
            raise
        return client

    @classmethod
    async def resume(
        cls,
        url: str,
        session_id: str,
        resume_token: str,
        last_seq: int,
        *,
        api_key: str | None = None,
        generation: int | None = None,
        max_size: int = 32 << 20,
        open_timeout: float = 10,
        owner: str | None = None,
    ) -> RealtimeClient:
        """Reattach to a session after a disconnect: ``session.resumed`` comes
        first (the token rotates), then every event after ``last_seq`` (or
        ``session.resync_required`` with a snapshot), then live events.
        ``owner``: the worker that holds the session now, when it moved
        (another worker adopted it: ``session.resumed``'s ``owner_instance_id``,
        or a ``wrong_instance`` refusal's); the router sends the socket there."""
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        parts = urlsplit(url)
        # The session id in the query too: a router sends the socket to the
        # session's owner by it (browsers cannot set WebSocket headers).
        query = [(k, v) for k, v in parse_qsl(parts.query)
                 if k not in ("resume", "session_id", "owner")]
        query += [("resume", "1"), ("session_id", session_id)]
        if owner is not None:
            query.append(("owner", owner))
        ws = await connect(urlunsplit(parts._replace(query=urlencode(query))),
                           additional_headers=headers, max_size=max_size, open_timeout=open_timeout)
        client = cls(ws)
        client.url, client.api_key, client.owner = url, api_key, owner
        client.session_id, client.last_seq = session_id, last_seq
        event: Event = {"type": "session.resume", "session_id": session_id,
                        "resume_token": resume_token, "last_seq": last_seq}
        if generation is not None:
            event["generation"] = generation
        try:
            await client.send(event)
            await client.wait_for("session.resumed", timeout=open_timeout, raise_on_error=True)
        except BaseException:
            await ws.close()
            raise
        return client

    async def reconnect(self, **kwargs: Any) -> RealtimeClient:
        """``resume`` this client's session from the last event it received
        (at the worker that holds it now, once a ``wrong_instance`` said where)."""
        if self.resume_token is None:
            raise RuntimeError("no resume token: the session was never opened")
        kwargs.setdefault("owner", self.owner)
        # A store that cannot be reached is answered ``store_unavailable``
        # ("retry"): the session store restarting, say. It is asked again
        # until ``open_timeout`` has passed, then the refusal is raised.
        deadline = time.monotonic() + kwargs.get("open_timeout", 10)
        pause = STORE_RETRY_S
        while True:
            try:
                return await self._resume_here_or_moved(kwargs)
            except RealtimeError as err:
                if err.code != "store_unavailable" or time.monotonic() + pause > deadline:
                    raise
            await asyncio.sleep(pause)
            pause = min(2 * pause, 1.0)

    async def _resume_here_or_moved(self, kwargs: dict[str, Any]) -> RealtimeClient:
        try:
            return await RealtimeClient.resume(self.url, self.session_id, self.resume_token,
                                               self.last_seq, api_key=self.api_key, **kwargs)
        except RealtimeError as err:
            moved = (err.event.get("error") or {}).get("owner_instance_id")
            if err.code != "wrong_instance" or not moved or moved == kwargs["owner"]:
                raise
            kwargs["owner"] = moved
            return await RealtimeClient.resume(self.url, self.session_id, self.resume_token,
                                               self.last_seq, api_key=self.api_key, **kwargs)

    async def ack(self, seq: int | None = None) -> str:
        """``session.event_ack``: the server may forget events up to ``seq``."""
        return await self.send({"type": "session.event_ack",
                                "seq": self.last_seq if seq is None else seq})

    async def __aenter__(self) -> RealtimeClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def close(self, *, end_session: bool = True) -> None:
        """Close the socket; ``end_session`` also closes the session. Otherwise
        the socket closes with 4000 (``detach``), which the server takes as
        "keep my session": it waits for ``resume`` during its grace window (a
        clean 1000 close would end it: docs/errors.md)."""
        if end_session:
            try:
                await self.send({"type": "session.close"})
            except Exception:  # the socket is gone already
                pass
            await self.ws.close()
        else:
            await self.ws.close(code=CLOSE_DETACH, reason="detach")

    # -- raw events ---------------------------------------------------------------------

    async def send(self, event: Event) -> str:
        event_id = event.get("event_id") or f"evt_{uuid.uuid4().hex[:20]}"
        event["event_id"] = event_id
        await self.ws.send(json.dumps(event))
        return event_id

    async def recv(self, timeout: float | None = None) -> Event:
        """Next event; raises ``TimeoutError`` after ``timeout`` seconds (cancelling a
        websockets ``recv`` loses no data) and ``ConnectionClosed`` when the socket ends."""
        async with asyncio.timeout(timeout):
            raw = await self.ws.recv()
        event: Event = json.loads(raw)
        event["_recv_t"] = time.monotonic()
        self.events.append(event)
        etype = event.get("type")
        if isinstance(event.get("seq"), int):
            self.last_seq = max(self.last_seq, event["seq"])
        if etype in ("session.created", "session.updated"):
            self.session = event.get("session") or {}
            self.session_id = self.session.get("id", self.session_id)
            if etype == "session.created":
                self.resume_token = event.get("resume_token")
        elif etype == "session.resumed":
            self.resume_token = event.get("resume_token")
            self.owner = event.get("owner_instance_id", self.owner)
        elif etype == "session.resync_required":
            self.session = event.get("session") or self.session
            self.last_seq = event.get("head_seq", self.last_seq)
        return event

    async def wait_for(self, *types: str, timeout: float = 30.0,
                       raise_on_error: bool = False) -> Event:
        """Next event of one of ``types``; skipped events stay recorded in ``events``.
        ``timeout`` bounds the whole wait, not each event."""
        async with asyncio.timeout(timeout):
            while True:
                event = await self.recv()
                if event.get("type") in types:
                    return event
                if raise_on_error and event.get("type") == "error":
                    raise RealtimeError(event)

    # -- commands -----------------------------------------------------------------------

    async def update_session(self, session: dict[str, Any], timeout: float = 30.0) -> Event:
        event_id = await self.send({"type": "session.update", "session": session})
        async with asyncio.timeout(timeout):
            while True:
                event = await self.wait_for("session.updated", "error")
                if event["type"] == "session.updated":
                    return self.session
                # An error about some other event we sent is not the answer to this one.
                if (event.get("error") or {}).get("event_id") in (None, event_id):
                    raise RealtimeError(event)

    async def append_audio(self, audio: bytes, *, seq: int | None = None) -> str:
        event: Event = {"type": "input_audio_buffer.append",
                        "audio": base64.b64encode(audio).decode("ascii")}
        if seq is not None:  # lets the server detect lost/duplicated chunks on resume
            event["seq"] = seq
        return await self.send(event)

    async def commit(self) -> str:
        return await self.send({"type": "input_audio_buffer.commit"})

    async def clear(self) -> str:
        return await self.send({"type": "input_audio_buffer.clear"})

    async def create_response(self, response: dict[str, Any] | None = None) -> str:
        event: Event = {"type": "response.create"}
        if response is not None:
            event["response"] = response
        return await self.send(event)

    async def cancel_response(self, response_id: str | None = None) -> str:
        event: Event = {"type": "response.cancel"}
        if response_id is not None:
            event["response_id"] = response_id
        return await self.send(event)

    # -- responses ----------------------------------------------------------------------

    def _output_samples(self) -> tuple[int, int]:
        """(rate, bytes per sample) of the session's output audio."""
        fmt = ((self.session.get("audio") or {}).get("output") or {}).get("format") or {}
        if fmt.get("type", "audio/pcm") == "audio/pcm":
            return int(fmt.get("rate") or 24000), 2
        return 8000, 1  # G.711

    async def collect_response(self, timeout: float = 60.0, *,
                               response_id: str | None = None) -> ResponseResult:
        """Read until the next ``response.done`` and assemble that response, including
        its events already read by earlier calls; with ``response_id``, until that
        response's ``response.done`` (others done before it are passed over: a reply
        cancelled when the user went on speaking, say). Raises ``RealtimeError`` if an
        error arrives during this call while no response has started (the request was
        refused: no ``response.done`` would follow) and ``TimeoutError`` if no
        ``response.done`` comes within ``timeout`` seconds."""
        start, fresh = self._collected, len(self.events)
        async with asyncio.timeout(timeout):
            i = start
            while True:
                while i >= len(self.events):
                    await self.recv()
                event = self.events[i]
                i += 1
                etype = event.get("type")
                if etype == "response.done" and response_id in (None, event["response"].get("id")):
                    break
                # Errors read before this call were already the caller's to handle.
                if etype == "error" and i > fresh and not any(
                        e.get("type") == "response.created" for e in self.events[start:i]):
                    self._collected = i
                    raise RealtimeError(event)
        self._collected = i
        done = self.events[i - 1]
        rid = (done.get("response") or {}).get("id")
        window = self.events[start:i]
        mine = [e for e in window
                if e.get("response_id") == rid or (e.get("response") or {}).get("id") == rid]
        return ResponseResult(
            audio=assemble_audio(mine, *self._output_samples()),
            transcript=_joined(mine, _TRANSCRIPT_DELTA, _TRANSCRIPT_DONE, "transcript"),
            text=_joined(mine, _TEXT_DELTA, _TEXT_DONE, "text"),
            done=done,
            events=mine,
            errors=[e for e in window if e.get("type") == "error"],
        )


def assemble_audio(events: list[Event], rate: int, sample_bytes: int) -> bytes:
    """The reply's audio as a listener gets it: the deltas in order, and at a
    ``duplex.output_audio.resumed`` (speech over the reply was a backchannel)
    the audio cut back to its ``audio_start_ms``, where the resent audio
    continues."""
    audio = bytearray()
    for e in events:
        etype = e.get("type")
        if etype in _AUDIO_DELTA:
            audio += base64.b64decode(e.get("delta", ""))
        elif etype == RESUMED:
            cut = int(e.get("audio_start_ms", 0)) * rate // 1000 * sample_bytes
            del audio[max(0, cut):]
    return bytes(audio)


def _joined(events: list[Event], delta: set[str], done: set[str], key: str) -> str:
    """The ``done`` events' full strings when present (authoritative), else the deltas."""
    finals = [e.get(key, "") for e in events if e.get("type") in done]
    if finals:
        return "".join(finals)
    return "".join(e.get("delta", "") for e in events if e.get("type") in delta)
