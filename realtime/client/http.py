"""A small async client for the HTTP text surfaces (``docs/api.md``).

    async with DuplexHttpClient("http://127.0.0.1:8000") as client:
        reply = await client.generate(model=MODEL, messages=[...]).collect()
        async for ev in client.generate(model=MODEL, messages=[...], stream_id="s1"):
            ...                                   # ev.event, ev.data, ev.seq

Every generation is an ``EventStream``: an async iterator of ``GenerateEvent``
(and an async context manager that closes its connection). One opted in with
a ``stream_id`` is resumable: after a disconnect, iterating again reconnects
with ``GET /v1/streams/{id}?from=<last seq + 1>`` (no gap, no duplicate).

Errors::

    Exception
    └── DuplexAPIError   the wire error: code, message, param, status, details
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx

OWNER_HEADER = "Duplex-Owner-Instance"


class DuplexAPIError(Exception):
    """A ``{"error": {...}}`` from the server. ``status`` is the HTTP status, or
    None for an error that arrived inside a 200 answer (an SSE ``error`` event,
    a ``stream: false`` body, a WebSocket frame). ``details`` holds the extra
    fields, e.g. ``owner_instance_id`` (``wrong_instance``) or ``expected_seq``."""

    _KNOWN = ("type", "code", "message", "param", "event_id", "retryable")

    def __init__(self, error: dict[str, Any], status: int | None = None) -> None:
        self.error = dict(error)
        self.status = status
        self.code: str = error.get("code") or "error"
        self.message: str = error.get("message") or ""
        self.param: str | None = error.get("param")
        self.type: str | None = error.get("type")
        self.retryable: bool = bool(error.get("retryable"))
        self.details = {k: v for k, v in error.items() if k not in self._KNOWN}
        super().__init__(f"{self.code}: {self.message}" + (f" (HTTP {status})" if status else ""))

    @property
    def owner_instance_id(self) -> str | None:
        return self.details.get("owner_instance_id")


@dataclass(frozen=True)
class GenerateEvent:
    """One event: ``event`` (``text-delta`` ... ``finish``), its ``data``, and
    ``seq`` (the SSE ``id:``; only resumable streams number their events)."""

    event: str
    data: dict[str, Any]
    seq: int | None = None

    @classmethod
    def of(cls, body: dict[str, Any], event: str | None = None, seq: int | None = None
           ) -> GenerateEvent:
        """From the JSON object on the wire, which repeats the event's name as
        ``type`` (kept in ``event``, not in ``data``)."""
        data = {k: v for k, v in body.items() if k != "type"}
        return cls(event or body["type"], data, seq)

    @property
    def terminal(self) -> bool:
        return self.event in ("finish", "error")


@dataclass
class Reply:
    """A whole generation, collected from its events."""

    text: str = ""
    reasoning: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # the ``tool-call`` data
    finish: dict[str, Any] = field(default_factory=dict)  # the ``finish`` data
    events: list[GenerateEvent] = field(default_factory=list)

    @property
    def finish_reason(self) -> str | None:
        return self.finish.get("finish_reason")

    def add(self, ev: GenerateEvent) -> None:
        """Take one event; an ``error`` event raises ``DuplexAPIError``."""
        self.events.append(ev)
        if ev.event == "text-delta":
            self.text += ev.data["delta"]
        elif ev.event == "reasoning-delta":
            self.reasoning += ev.data["delta"]
        elif ev.event == "tool-call":
            self.tool_calls.append(ev.data)
        elif ev.event == "finish":
            self.finish = ev.data
        elif ev.event == "error":
            raise DuplexAPIError(ev.data.get("error") or {})


async def _raise_for_status(response: httpx.Response) -> None:
    if response.is_success:
        return
    body = await response.aread()
    try:
        error = json.loads(body)["error"]
    except (ValueError, KeyError, TypeError):
        error = {"code": "http_error", "message": body.decode(errors="replace")[:500]}
    raise DuplexAPIError(error, response.status_code)


class EventStream:
    """One generation's SSE events. Iterate it; ``last_seq`` is the last seq
    seen. ``disconnect()`` (or ``break`` + ``disconnect()``, or a transport
    error) drops the connection; iterating again resumes a resumable stream
    from ``last_seq + 1``. A non-resumable one cannot be resumed."""

    def __init__(self, http: httpx.AsyncClient, method: str, url: str, *,
                 body: dict[str, Any] | None = None, headers: dict[str, str] | None = None,
                 stream_id: str | None = None, from_seq: int = 1,
                 on_owner: Callable[[str], None] | None = None) -> None:
        self._http = http
        self._on_owner = on_owner
        self._first: tuple[str, str, dict[str, Any] | None] | None = (method, url, body)
        self._headers = headers or {}
        self.stream_id = stream_id
        self.request_id: str | None = None  # from ``x-request-id`` (non-resumable generations)
        self.last_seq: int | None = from_seq - 1 if from_seq > 1 else None
        self.done = False
        self._cm: Any = None
        self._lines: Any = None

    async def _connect(self) -> None:
        if self._first is not None:
            method, url, body = self._first
            self._first = None
        elif self.stream_id is not None:
            method, url, body = "GET", f"/v1/streams/{self.stream_id}", None
            url += f"?from={(self.last_seq or 0) + 1}"
        else:
            raise RuntimeError("this generation has no stream_id: it cannot be resumed")
        self._cm = self._http.stream(method, url, json=body, headers=self._headers)
        response = await self._cm.__aenter__()
        try:
            await _raise_for_status(response)
        except BaseException:
            await self.disconnect()
            raise
        self.stream_id = response.headers.get("x-stream-id", self.stream_id)
        self.request_id = response.headers.get("x-request-id", self.request_id)
        owner = response.headers.get(OWNER_HEADER)
        if owner:  # the worker that served it (another, once its owner died)
            if OWNER_HEADER in self._headers:
                self._headers = {**self._headers, OWNER_HEADER: owner}
            if self._on_owner is not None:
                self._on_owner(owner)
        self._lines = response.aiter_lines()

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> GenerateEvent:
        if self.done:
            raise StopAsyncIteration
        if self._lines is None:
            await self._connect()
        seq, name, data = None, "message", []
        try:
            async for line in self._lines:
                if line.startswith(":"):
                    continue  # keepalive comment
                if line:
                    key, _, value = line.partition(":")
                    value = value[1:] if value.startswith(" ") else value
                    if key == "id":
                        seq = int(value)
                    elif key == "event":
                        name = value
                    elif key == "data":
                        data.append(value)
                    continue
                if not data:
                    continue
                if seq is not None:
                    self.last_seq = seq
                return GenerateEvent.of(json.loads("\n".join(data)), name, seq)
        except BaseException:
            await self.disconnect()
            raise
        self.done = True  # the server ended the stream: the generation is over
        await self.disconnect()
        raise StopAsyncIteration

    async def disconnect(self) -> None:
        """Close the connection (a resumable stream's generation goes on)."""
        cm, lines, self._cm, self._lines = self._cm, self._lines, None, None
        if lines is not None:
            await lines.aclose()
        if cm is not None:
            await cm.__aexit__(None, None, None)

    aclose = disconnect

    async def collect(self) -> Reply:
        """Read to the end; raises ``DuplexAPIError`` on an ``error`` event."""
        reply = Reply()
        async with self:
            async for ev in self:
                reply.add(ev)
        return reply

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.disconnect()


class AppSession:
    """A handle on an application session; every call names its owner
    instance (``Duplex-Owner-Instance``): the session's ``ref`` at first, then
    the worker that last served it (with a durable store another worker takes
    a session over when its owner dies). A ``wrong_instance`` answer is
    retried once at the owner it names (not a turn: ``generate`` raises it)."""

    def __init__(self, client: DuplexHttpClient, wire: dict[str, Any]) -> None:
        self.client = client
        self.wire = wire  # the last session object the server sent
        self.session_id: str = wire["id"]
        self.owner_instance_id: str | None = wire["ref"].get("owner_instance_id")

    @property
    def _headers(self) -> dict[str, str]:
        return {OWNER_HEADER: self.owner_instance_id} if self.owner_instance_id else {}

    @property
    def _path(self) -> str:
        return f"/v1/sessions/{self.session_id}"

    def _served_by(self, owner: str) -> None:
        self.owner_instance_id = owner

    async def _call(self, method: str, path: str, body: Any = None, params: Any = None) -> Any:
        for retry in (False, True):
            try:
                return await self.client._json(method, path, body, self._headers, params,
                                               on_owner=self._served_by)
            except DuplexAPIError as err:
                if retry or err.code != "wrong_instance" or not err.owner_instance_id:
                    raise
                self.owner_instance_id = err.owner_instance_id

    def generate(self, messages: list[dict[str, Any]] | None = None, **request: Any) -> EventStream:
        """Continue the session (``mode`` append by default; ``replace`` with
        ``replace_from``); ``options``, ``tools``, ``stream_id``... as on the wire."""
        body = {**request, **({"messages": messages} if messages is not None else {})}
        return EventStream(self.client.http, "POST", f"{self._path}/generate",
                           body={**body, "stream": True}, headers=self._headers,
                           stream_id=body.get("stream_id"), on_owner=self._served_by)

    async def ask(self, messages: list[dict[str, Any]] | None = None, **request: Any) -> str:
        """The reply's text (the turn is committed to the session's history)."""
        return (await self.generate(messages, **request).collect()).text

    async def info(self, messages: bool = False) -> dict[str, Any]:
        """The session object; ``messages=True`` adds the history as ``history``."""
        params = {"messages": "true"} if messages else None
        self.wire = await self._call("GET", self._path, params=params)
        return self.wire

    async def renew(self, ttl_s: float | None = None, generation: int | None = None
                    ) -> dict[str, Any]:
        """Extend the lease (``ttl_s`` None keeps the current ttl, 0 = server
        default); ``generation`` makes it a compare-and-swap (``lease_conflict``)."""
        body = {k: v for k, v in (("ttl_s", ttl_s), ("generation", generation)) if v is not None}
        self.wire = await self._call("POST", f"{self._path}/renew", body)
        return self.wire

    async def close(self) -> dict[str, Any]:
        self.wire = await self._call("DELETE", self._path)
        return self.wire

    async def __aenter__(self) -> AppSession:
        return self

    async def __aexit__(self, exc_type: object, *rest: object) -> None:
        try:
            await self.close()
        except DuplexAPIError:
            if exc_type is None:  # do not hide the error that ended the block
                raise


class DuplexHttpClient:
    """The HTTP text surfaces of one server. ``api_key`` goes in
    ``Authorization: Bearer``; ids the server hands out are scoped to it."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None, *,
                 timeout: float | None = 120.0, http: httpx.AsyncClient | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.http = http or httpx.AsyncClient(base_url=base_url, headers=headers,
                                              timeout=httpx.Timeout(timeout))

    async def __aenter__(self) -> DuplexHttpClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self.http.aclose()

    async def _json(self, method: str, path: str, body: Any = None,
                    headers: dict[str, str] | None = None, params: Any = None, *,
                    on_owner: Callable[[str], None] | None = None) -> Any:
        response = await self.http.request(method, path, json=body, headers=headers, params=params)
        await _raise_for_status(response)
        owner = response.headers.get(OWNER_HEADER)
        if owner and on_owner is not None:
            on_owner(owner)
        return response.json()

    def _events(self, method: str, path: str, body: dict[str, Any],
                headers: dict[str, str] | None = None) -> EventStream:
        return EventStream(self.http, method, path, body={**body, "stream": True},
                           headers=headers, stream_id=body.get("stream_id"))

    # ---- stateless generate ------------------------------------------------

    def generate(self, **request: Any) -> EventStream:
        """``POST /v1/generate`` as events; fields as on the wire (``model``,
        ``messages``, ``options``, ``tools``, ``stream_id``, ``deadline_ms``...)."""
        return self._events("POST", "/v1/generate", request)

    async def generate_once(self, **request: Any) -> dict[str, Any]:
        """``stream: false``: ``{"output": {...}, "finish_reason", "usage", ...}``.
        An answer that ended in an error raises it."""
        answer = await self._json("POST", "/v1/generate", {**request, "stream": False})
        if "error" in answer:
            raise DuplexAPIError(answer["error"])
        return answer

    # ---- application sessions ------------------------------------------------

    async def open_session(self, model: str, **fields: Any) -> AppSession:
        """``POST /v1/sessions`` (``session_id``, ``ttl_s``, ``instructions``, ``messages``)."""
        return AppSession(self, await self._json("POST", "/v1/sessions", {"model": model, **fields}))

    def session(self, session_id: str, owner_instance_id: str | None = None) -> AppSession:
        """A handle on an existing session (no request is made)."""
        return AppSession(self, {"id": session_id, "ref": {"owner_instance_id": owner_instance_id}})

    # ---- streams and requests ----------------------------------------------------

    async def lookup_streams(self, stream_ids: list[str]) -> list[dict[str, Any]]:
        """``[{"stream_id", "status", "first_seq"?, "head_seq"?}]`` in request order."""
        answer = await self._json("POST", "/v1/streams/lookup", {"stream_ids": list(stream_ids)})
        return answer["data"]

    def follow_stream(self, stream_id: str, from_seq: int = 1) -> EventStream:
        """Replay a stream from ``from_seq``, then follow it live (resumable)."""
        return EventStream(self.http, "GET", f"/v1/streams/{stream_id}?from={from_seq}",
                           stream_id=stream_id, from_seq=from_seq)

    async def delete_stream(self, stream_id: str) -> dict[str, Any]:
        """Stop the generation and forget its events; idempotent."""
        return await self._json("DELETE", f"/v1/streams/{stream_id}")

    async def control_stream(self, stream_id: str, **changes: Any) -> dict[str, Any]:
        """Change ``max_tokens``/``reasoning_budget`` mid-generation;
        ``{"applied", "applied_at_seq"}``."""
        return await self._json("POST", f"/v1/streams/{stream_id}/control", changes)

    async def abort(self, request_id: str) -> dict[str, Any]:
        return await self._json("POST", f"/v1/requests/{request_id}/abort")

    async def capabilities(self) -> dict[str, Any]:
        """``GET /v1/capabilities`` (the text surfaces are under ``text``)."""
        return await self._json("GET", "/v1/capabilities")
