"""Runs a GPT-Live socket's delegated turns on external Responses backends
(``realtime/wire/live/remote.py`` says what each run asks and what its
stream means; this is the I/O).

One ``httpx.AsyncClient`` per socket, closed with it: each run is one
streamed ``POST {base_url}/responses``, its lines handed to the run's
``RemoteStream`` and the events it says sent as they come. Runs of one
socket go one at a time, in order (a delegated turn, then its continuation).
A run longer than its backend's ``timeout_s`` on the session clock is
stopped (its HTTP request closed) and answered ``deadline_exceeded``; a
connection refused, an HTTP error status or a stream that is not a Responses
stream is ``backend_error``. The error names the backend, never its key;
the codec then gives the voice's call its output and the voice goes on.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable

import httpx
from vllm_duplex.domain.commands import Command
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.domain.backends import ResponsesBackend
from vllm_duplex.domain.decisions import ChoiceAsk, Chosen
from vllm_duplex.realtime.wire.live.remote import Outcome, RemoteRun, failed_status
from vllm_duplex.realtime.wire.live.remote_choice import choice_request, read_choice

log = logging.getLogger(__name__)
_QUEUED = 8  # a socket's runs waiting; more is a client asking faster than backends answer


class RemoteRunner:
    def __init__(self, codec: LiveCodec, send: Callable[[str], Awaitable[bool]],
                 deliver: Callable[[Command], None],
                 sleep: Callable[[float], Awaitable[None]] = asyncio.sleep) -> None:
        self.codec = codec
        self._send = send  # False once the socket is gone
        self._deliver = deliver  # a command to the session (the voice's answer)
        self._sleep = sleep  # the session clock's
        self._http = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=10.0))
        self._queue: asyncio.Queue[RemoteRun] = asyncio.Queue(_QUEUED)
        self._task = asyncio.create_task(self._work(), name="duplex-live-remote")

    def chooser(self, backend: ResponsesBackend) -> RemoteChooser:
        """Decisions on ``backend``, over this socket's HTTP client."""
        return RemoteChooser(backend, self._http)

    def submit(self, run: RemoteRun) -> None:
        try:
            self._queue.put_nowait(run)
        except asyncio.QueueFull:
            raise DuplexError("resource_exhausted", f"{_QUEUED} delegated runs are waiting "
                              "already", param="type", event_id=run.event_id) from None

    async def close(self) -> None:
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        await self._http.aclose()

    async def _work(self) -> None:
        while True:
            run = await self._queue.get()
            outcome = await self._run(run)
            if isinstance(outcome, DuplexError):
                frames = self.codec.render_remote(self.codec.remote.created_unannounced(run))
                frames.append(self.codec.render_error(outcome.with_event_id(run.event_id)))
                for frame in frames:
                    if not await self._send(frame):
                        return
            for command in self.codec.remote.finished(run, outcome):
                try:
                    self._deliver(command)
                except DuplexError as err:  # the session is closing: nobody to answer
                    log.debug("live: %s not delivered: %s", type(command).__name__, err)

    async def _run(self, run: RemoteRun) -> Outcome | DuplexError:
        stream = asyncio.create_task(self._stream(run), name="duplex-live-remote-run")
        deadline = asyncio.create_task(self._sleep(run.backend.timeout_s),
                                       name="duplex-live-remote-deadline")
        try:
            await asyncio.wait((stream, deadline), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (stream, deadline):
                task.cancel()
            await asyncio.gather(stream, deadline, return_exceptions=True)
        if not stream.done() or stream.cancelled():
            return DuplexError("deadline_exceeded", f"the Responses backend "
                               f"{run.backend.name!r} took longer than "
                               f"{run.backend.timeout_s:g} s; the delegated run was stopped")
        err = stream.exception()
        if err is not None:
            return err if isinstance(err, DuplexError) else _backend_error(run.backend.name, err)
        outcome = stream.result()
        return failed_status(outcome, run.backend.name) or outcome

    async def _stream(self, run: RemoteRun) -> Outcome:
        reader = self.codec.remote.stream(run)
        headers = {"Accept": "text/event-stream"}
        if run.backend.api_key:
            headers["Authorization"] = f"Bearer {run.backend.api_key}"
        async with self._http.stream("POST", run.backend.url, json=run.body,
                                     headers=headers) as response:
            if response.status_code >= 400:
                raise DuplexError("backend_error", f"the Responses backend "
                                  f"{run.backend.name!r} answered HTTP {response.status_code}")
            async for line in response.aiter_lines():
                frames = self.codec.render_remote(reader.feed(line))
                for frame in frames:
                    if not await self._send(frame):  # the socket is gone: stop the run
                        raise DuplexError("session_closed", "the socket closed")
            return reader.finish()


class RemoteChooser:
    """A ``Chooser`` (``domain/decisions.py``) on an external Responses
    backend: each ask one ``POST {base_url}/responses``
    (``wire/live/remote_choice.py`` says what it asks and reads). ``http``:
    the socket's client, closed with it. A failure is ``backend_error``; the
    decision's own deadline (``decisions.py``) and the backend's
    ``timeout_s`` both bound it, and a cancel closes the request."""

    def __init__(self, backend: ResponsesBackend, http: httpx.AsyncClient) -> None:
        self.backend = backend
        self.model = backend.model  # what the decision.event names
        self._http = http

    async def choose(self, ask: ChoiceAsk) -> Chosen:
        backend = self.backend
        headers = {"Authorization": f"Bearer {backend.api_key}"} if backend.api_key else {}
        try:
            response = await self._http.post(backend.url, json=choice_request(backend.model, ask),
                                              headers=headers, timeout=backend.timeout_s)
        except httpx.TimeoutException:
            raise DuplexError("deadline_exceeded", f"the Responses backend {backend.name!r} "
                              f"took longer than {backend.timeout_s:g} s") from None
        except httpx.HTTPError as err:
            raise _backend_error(backend.name, err) from None
        if response.status_code >= 400:
            raise DuplexError("backend_error", f"the Responses backend {backend.name!r} "
                              f"answered HTTP {response.status_code}")
        try:
            body = response.json()
        except ValueError:
            body = None
        return read_choice(body, ask.options, backend.name)


def _backend_error(name: str, err: BaseException) -> DuplexError:
    """An HTTP failure as the client's error: its kind, not its details (a
    URL's credentials or a key never leave the server)."""
    with contextlib.suppress(Exception):
        log.info("Responses backend %s: %r", name, err)
    what = ("could not be reached" if isinstance(err, httpx.ConnectError) else
            "broke off the stream" if isinstance(err, (httpx.ReadError, httpx.RemoteProtocolError))
            else f"failed ({type(err).__name__})")
    return DuplexError("backend_error", f"the Responses backend {name!r} {what}")
