"""One GPT-Live WebSocket (``/v1/live/sessions``): a thin I/O loop around a
``SessionPort`` with the GPT-Live codec (``realtime/wire/live/codec.py``).

The same port and ``SessionCore`` as ``/v1/realtime``; what differs is the
dialect's few rules, kept here:

- The first event is ``session.start``; the session opens with its config
  (anything else first is answered with an error, and the socket waits).
- The session is *played here*: the server paces its audio
  (``SessionPatch.played_here``), because a GPT-Live client plays every
  frame it gets and has no ``output_audio_buffer.clear`` or truncate; pacing
  is what makes a barge-in stop the voice the client hears.
- Mute and unmute are the codec's gate, acknowledged on the wire at once.
- A session's initial history (``session.input``) is created before it
  hears anything; an audio fixture is played here, paced as the session's
  own audio (``fixture.py``).
- A stored session (``store: true``) is recorded and saved when it starts,
  after each reply and when it ends (``stored.py``); a fork (``fork_of``) starts from one, its
  ``session.start`` read as the overrides it is (``realtime/wire/live/forks.py``).
- One client event may be several commands (``LiveCommands``: an answer to
  a delegation and the reply it asks for), and one session event several
  GPT-Live events (``LiveCodec.frames``); a reply the codec asked for while
  another was shown is delivered when the writer has seen that one end
  (``LiveCodec.due``).
- There is no resume: a GPT-Live reconnect is a new session (the SDK and
  LiveKit start one), so when the socket ends, the session ends with it.
- Decisions are evaluated beside the session, not in it: the codec makes a
  ``DecisionRun`` (``decision.create``, a trigger firing) and the socket's
  ``DecisionRunner`` (``decisions.py``) answers it on the ``chooser`` (the
  engine's own LLM), or the codec refuses them where there is none.
- Sidebands may attach (``sideband.py``): the socket's ``LiveLine`` sends
  them every frame it sends, the microphone's audio as it came (before the
  mute), and carries a sideband's acknowledgements back to this socket.
  ``transport.dtmf.send`` is a sideband's, for SIP calls: refused here.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import Any

from starlette.websockets import WebSocket
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.commands import AudioAppend
from vllm_duplex.domain.decisions import Chooser
from vllm_duplex.domain.errors import Capacity, Closed, DuplexError
from vllm_duplex.domain.session_config import SessionPatch
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.realtime.server.auth import bearer_key
from vllm_duplex.realtime.server.live.backend import RemoteRunner
from vllm_duplex.realtime.server.live.decisions import DecisionRunner
from vllm_duplex.realtime.server.live.lines import LiveLine, LiveLines
from vllm_duplex.realtime.server.live.stored import StoredSession
from vllm_duplex.realtime.server.port.session_port import SessionPort
from vllm_duplex.realtime.server.live.fixture import play_fixture
from vllm_duplex.realtime.server.websocket_frames import next_frame
from vllm_duplex.realtime.wire.live.codec import LiveCodec
from vllm_duplex.realtime.wire.live.commands import LiveAck, LiveDtmf, LiveStart
from vllm_duplex.realtime.wire.live.decisions import DecisionRun, ItemReply
from vllm_duplex.realtime.wire.live.delegated import each_command
from vllm_duplex.realtime.wire.live.fixtures import FixturePlay
from vllm_duplex.realtime.wire.live.forks import fork_start
from vllm_duplex.realtime.wire.live.remote import RemoteRun

log = logging.getLogger(__name__)


class LiveSocket:
    def __init__(self, sessions: RealtimeSessions, ws: WebSocket,
                 lines: LiveLines | None = None, chooser: Chooser | None = None, *,
                 fork_of: str | None = None) -> None:
        self.sessions = sessions
        self.ws = ws
        self.lines = lines
        self.line: LiveLine | None = None
        self._relayed: set[asyncio.Task[None]] = set()  # a sideband's acks on their way here
        self.fork_of = fork_of  # the stored session this socket forks, if any
        # The stored session a fork starts from: its config and conversation
        # (the host's store keeps the record; a shell never reads the store).
        self._forked: tuple[dict[str, Any], tuple[dict[str, Any], ...]] | None = None
        self._key: str | None = None
        self.stored: StoredSession | None = None  # its recording and saves, when store: true
        self.codec = LiveCodec(max_event_bytes=sessions.max_event_bytes,
                               model_aliases=sessions.model_aliases, clock=sessions.now,
                               context_limit=sessions.context_limit,
                               default_instructions=sessions.session_config().instructions)
        # Decisions run on the engine's chooser, or on a backend the decisions config names.
        self.codec.decisions.available = chooser is not None or bool(sessions.responses_backends)
        self._chooser = chooser
        self.decider: DecisionRunner | None = None
        # Delegations on external Responses backends (backend.py), where the deployment names any
        self.codec.remote.backends = dict(sessions.responses_backends)
        self.remote: RemoteRunner | None = None
        self._send_lock = asyncio.Lock()
        self._fixture: asyncio.Task[None] | None = None  # the fixture playing, if any

    def _decisions_chooser(self) -> Chooser:
        """What evaluates a decision now: the backend the session's decisions
        config names (``delegation.decisions.model``), else the engine's own."""
        name = ((self.codec.delegation or {}).get("decisions") or {}).get("model")
        backend = self.codec.remote.backends.get(name or "")
        if backend is not None and self.remote is not None:
            return self.remote.chooser(backend)
        if self._chooser is None:
            raise DuplexError("capability_unsupported", f"decisions model {name!r} names none of "
                              "this deployment's Responses backends, and this engine's LLM "
                              "cannot evaluate decisions", param="delegation.decisions.model")
        return self._chooser

    async def _send(self, text: str) -> None:
        async with self._send_lock:
            await self.ws.send_text(text)

    async def serve(self) -> None:
        offered = list(self.ws.scope.get("subprotocols") or [])
        key = bearer_key(self.ws.headers, offered)
        await self.ws.accept()
        self._key = key
        try:
            self.sessions.check_key(key)
            if self.fork_of is not None:
                stored = await self.sessions.find_live(self.fork_of, key)
                self._forked = (stored.config, stored.items)
        except DuplexError as err:
            await self._send(self.codec.render_error(err))
            await self.ws.close(code=1008, reason=err.code)
            return
        port = await self._start(key)
        if port is None:
            return
        line = self.line = LiveLine(self.codec, port, transport="websocket")
        line.primary = self._relay
        if self.lines is not None:
            self.lines.add(port.session.session_id, line)
        if self.codec.remote.backends:
            self.remote = RemoteRunner(self.codec, self._send_and_share, port.deliver,
                                       self.sessions.sleep)
        if self.codec.decisions.available:
            self.decider = DecisionRunner(self._decisions_chooser, self.codec,
                                          self._send_and_share)
        writer = asyncio.create_task(self._write(port),
                                     name=f"duplex-live-writer-{port.session.session_id}")
        try:
            await self._read(port)
        finally:
            if self.decider is not None:  # a decision under way is aborted with its socket
                await self.decider.close()
            if self.remote is not None:  # so is a delegated run, its HTTP request closed
                await self.remote.close()
            # No resume in GPT-Live: the session ends with its socket.
            if self._fixture is not None:
                self._fixture.cancel()
            await self._keep(port, tell=False)  # a stored session's last save
            await port.release(client_closed=True)
            await asyncio.gather(writer, *filter(None, [self._fixture]), return_exceptions=True)
            line.end()
            for task in list(self._relayed):
                task.cancel()
            await asyncio.gather(*self._relayed, return_exceptions=True)

    def _relay(self, text: str | None) -> None:
        """A frame a sideband caused (its mute's acknowledgement) to this socket."""
        if text is None:
            return
        task = asyncio.create_task(self._try_send(text), name="duplex-live-relay")
        self._relayed.add(task)
        task.add_done_callback(self._relayed.discard)

    async def _start(self, key: str | None) -> SessionPort | None:
        """Wait for ``session.start`` and open the session; None when the
        socket ended first or the session was refused (answered and closed)."""
        while (frame := await self._receive()) is not None:
            try:
                command = self.codec.parse(self._as_started(frame))
                if not isinstance(command, LiveStart):
                    raise DuplexError("invalid_event", "the first event is session.start",
                                      param="type", event_id=getattr(command, "event_id", None))
            except DuplexError as err:
                self.sessions.count_error(err.code)
                await self._send(self.codec.render_error(err))
                continue  # the client may still start its session
            try:
                port = await SessionPort.open(self.sessions, self.codec, key, command.patch,
                                              transport=SessionPatch.played_here())
                for item in command.history:  # the conversation it starts with
                    port.deliver(item)
            except DuplexError as err:
                await self._send(self.codec.render_error(err.with_event_id(command.event_id)))
                await self.ws.close(code=1013 if isinstance(err, Capacity) else 1008,
                                    reason=err.code)
                return None
            if self.codec.store:
                self.stored = StoredSession(self.sessions, port, self.codec, key)
            await self._keep(port)
            return port
        return None

    def _as_started(self, frame: str | bytes) -> str | bytes:
        """A fork's ``session.start`` (its overrides) as the one it means;
        any other frame as it is."""
        if self._forked is None:
            return frame
        try:
            obj = json.loads(frame)
        except (ValueError, RecursionError):
            return frame  # the codec answers it
        if not isinstance(obj, dict):
            return frame
        try:
            return json.dumps(fork_start(obj, *self._forked))
        except DuplexError as err:
            eid = obj.get("event_id")
            raise err.with_event_id(eid if isinstance(eid, str) else None) from None

    async def _keep(self, port: SessionPort, *, tell: bool = True) -> None:
        """Save a stored session now (its conversation and recording so far);
        a store that cannot take it is the client's typed error, and the
        session goes on."""
        if self.stored is None:
            return
        err = await self.stored.keep()
        if err is not None and tell:
            await self._try_send(port.error(err))

    async def _receive(self) -> str | bytes | None:
        # The close code does not matter here: the session ends with its socket.
        return (await next_frame(self.ws))[0]

    def _feed(self, port: SessionPort, frame: str | bytes) -> str | None:
        """One frame after the start: delivered to the session, or the reply
        the dialect gives itself (mute, unmute). Refusals raise, counted."""
        try:
            command = self.codec.parse(frame)
            if isinstance(command, LiveStart):
                raise DuplexError("invalid_event", "the session has started already",
                                  param="type", event_id=command.event_id)
            if isinstance(command, LiveDtmf):
                raise DuplexError("capability_unsupported", "transport.dtmf.send is a sideband "
                                  "command for SIP calls; this socket is a primary WebSocket",
                                  param="type", event_id=command.event_id)
            assert self.line is not None
            if isinstance(command, (LiveAck, ItemReply)):
                ack = self.codec.render_ack(command)
                self.line.to_sidebands(ack)
                return ack
            if isinstance(command, DecisionRun):
                assert self.decider is not None  # the codec refuses runs without a chooser
                self.decider.submit(command)
                delegated = self.codec.render_delegated(command)
                self.line.to_sidebands(delegated)
                return delegated
            if isinstance(command, RemoteRun):  # response.create continuing a remote run
                assert self.remote is not None  # only a configured backend makes one
                self.remote.submit(command)
                return None
            if isinstance(command, FixturePlay):
                self._play(port, command)
                return None
            if isinstance(command, AudioAppend):
                self.line.reflect(self.codec.raw_audio, port.config.input_format)
                if self.stored is not None:
                    self.stored.heard(command.audio)  # as heard: a mute's silence
            for one in each_command(command):
                port.deliver(one)
            return None
        except DuplexError as err:
            self.sessions.count_error(err.code)
            raise

    def _play(self, port: SessionPort, play: FixturePlay) -> None:
        """A validated fixture: the reply being sent stops, and it plays."""
        cancel = self.codec.fixtures.begin(play)
        if cancel is not None:
            port.deliver(cancel)
        config = port.config
        self._fixture = asyncio.create_task(
            play_fixture(play, self.codec, self._send, fmt=config.output_format,
                         lead_ms=config.pacing.lead_ms, clock=self.sessions.now,
                         on_audio=None if self.stored is None else self.stored.played_audio),
            name=f"duplex-live-fixture-{port.session.session_id}")

    async def _read(self, port: SessionPort) -> None:
        while (frame := await self._receive()) is not None:
            try:
                reply = self._feed(port, frame)
            except DuplexError as err:
                reply = port.error(err)
                if isinstance(err, Closed):
                    await self._try_send(reply)
                    return
            if reply is not None and not await self._try_send(reply):
                return

    async def _try_send(self, text: str) -> bool:
        try:
            await self._send(text)
            return True
        except Exception:
            return False

    async def _send_and_share(self, text: str) -> bool:
        """A decision's answer: to this socket and to the sidebands."""
        if self.line is not None:
            self.line.to_sidebands(text)
        return await self._try_send(text)

    async def _write(self, port: SessionPort) -> None:
        session = port.session
        try:
            async for item in port.events():
                if self.stored is not None:
                    self.stored.played(item.event)
                if isinstance(item.event, ev.ResponseDone):
                    await self._keep(port)  # a stored session, after each reply
                cancel = self.codec.fixtures.on_event(item.event)  # a reply over a fixture
                if cancel is not None:
                    with contextlib.suppress(DuplexError):  # the session is ending
                        port.deliver(cancel)
                texts = self.codec.frames(item)
                for text in texts:
                    await self._send(text)
                if self.line is not None:
                    for text in texts or [None]:  # the reply's audio is reflected even unsent
                        self.line.share(item, text)
                for run in self.codec.decisions.take_runs():  # triggers this event fired
                    if self.decider is not None:
                        self.decider.offer(run)
                for run in self.codec.remote.take_runs():  # the voice delegated a turn
                    try:
                        assert self.remote is not None
                        self.remote.submit(run)
                    except DuplexError as err:
                        await self._send(self.codec.render_error(err))
                for command in self.codec.due():
                    try:
                        port.deliver(command)
                    except DuplexError as err:  # the session is closing: nothing to ask of it
                        log.debug("live: %s not delivered: %s", type(command).__name__, err)
            reason = session.close_reason or CloseReason.CLIENT
            await self.ws.close(code=reason.code, reason=reason.value)
        except Exception:  # the socket went away under us; the reader will notice
            log.debug("live writer for %s stopped", session.session_id, exc_info=True)
