"""The server's SIP user agent: it listens (UDP and TCP, and TLS with
``tls_port``: ``sip:`` in the deployment config), answers INVITEs, and turns
each into a call.

An INVITE with an offer we can answer (``sdp``) gets 100 Trying and a call
id (``sip_…``); then either it is accepted at once with ``sip.accept`` as
its session, or it rings (180) while ``realtime.call.incoming`` is POSTed to
``sip.webhook_url`` and waits for ``POST /v1/realtime/calls/{id}/accept`` or
``/reject`` (or ``ring_timeout_s``: 480). An accepted call is a ``SipCall``
in the server's call registry, beside WebRTC calls: the same sideband
sockets and ``…/hangup`` route reach both.

Anything malformed is answered (400, 505, 413 ...) when it can be, and
counted in ``malformed``; it touches no other call. Requests we do not
serve get 405 with ``Allow``; requests about no dialog we know, 481.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from vllm_duplex.domain.errors import Capacity, DuplexError
from vllm_duplex.domain.session_config import SessionPatch
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.host.sip import Sip
from vllm_duplex.realtime.server.port.session_port import Codec, realtime_codec
from vllm_duplex.realtime.server.telephony import sdp
from vllm_duplex.realtime.server.telephony import sip_message as sm
from vllm_duplex.realtime.server.telephony.sip_call import SipCall
from vllm_duplex.realtime.server.telephony.sip_dialog import DialogState, SipDialog, allow_header
from vllm_duplex.realtime.server.telephony.webhooks import WebhookSender, incoming_call

log = logging.getLogger(__name__)

_PORT_TRIES = 20  # port 0: picks of a port free for both UDP and TCP

_REQUEST_LINE = re.compile(rb"[A-Z]+ \S+ SIP/")
_METHODS = frozenset(("INVITE", "ACK", "BYE", "CANCEL", "OPTIONS", "NOTIFY", "INFO"))
_PASSED_HEADERS = ("from", "to", "call-id", "contact", "user-agent", "subject", "diversion",
                   "p-asserted-identity", "remote-party-id")


def _sip_headers(invite: sm.SipRequest) -> list[tuple[str, str]]:
    """What the webhook tells of the caller: the INVITE's identity headers
    and every ``X-`` header (a trunk's own), untrusted as they came."""
    return [(n, v) for n, v in invite.headers
            if sm._canonical(n) in _PASSED_HEADERS or n.lower().startswith("x-")]


class _Udp(asyncio.DatagramProtocol):
    def __init__(self, agent: SipAgent) -> None:
        self.agent = agent
        self.transport: asyncio.DatagramTransport | None = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def datagram_received(self, data: bytes, addr: Any) -> None:
        transport = self.transport
        if transport is None or data.strip(b"\r\n") == b"":
            return  # a keep-alive

        def send(out: bytes) -> None:
            if not transport.is_closing():
                transport.sendto(out, addr)
        self.agent.received(data, send, transport="udp", peer=addr)


class _Tcp(asyncio.Protocol):
    """One TCP (or TLS) connection: a stream of SIP messages both ways."""

    def __init__(self, agent: SipAgent, transport: str) -> None:
        self.agent, self.name = agent, transport
        self.framer = sm.StreamFramer()
        self.transport: asyncio.Transport | None = None
        self.peer: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.peer = transport.get_extra_info("peername")
        self.agent._connections.add(transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.agent._connections.discard(self.transport)

    def _send(self, out: bytes) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(out)

    def data_received(self, data: bytes) -> None:
        try:
            messages = self.framer.feed(data)
        except sm.SipParseError as err:  # the stream cannot be framed any more: end it
            self.agent.count_malformed(err.status)
            self._send(f"SIP/2.0 {err.status} {sm.REASONS.get(err.status, 'Bad Request')}\r\n"
                       "Content-Length: 0\r\n\r\n".encode())
            assert self.transport is not None
            self.transport.close()
            return
        for message in messages:
            self.agent.received(message, self._send, transport=self.name, peer=self.peer)


class SipAgent:
    def __init__(self, sessions: RealtimeSessions, calls: Any, config: Sip) -> None:
        self.sessions, self.calls, self.config = sessions, calls, config
        self.codec = realtime_codec(sessions)
        self.port = config.port
        self.tls_port = config.tls_port
        self.malformed: Counter[int] = Counter()  # by the status they were answered with
        self._malformed_metric = sessions.counter(
            "duplex_sip_malformed_total", "SIP messages that could not be parsed, by the status "
            "they were answered with")
        self.ringing: dict[str, SipDialog] = {}  # our call id -> a dialog not yet accepted
        self._rings: dict[str, asyncio.Task[None]] = {}  # its ring timeout
        self._dialogs: dict[str, SipDialog] = {}  # SIP Call-ID -> dialog
        self._calls: dict[str, SipCall] = {}  # SIP Call-ID -> its accepted call
        self._tasks: set[asyncio.Task[Any]] = set()
        self._servers: list[Any] = []
        self._connections: set[Any] = set()
        self._webhook = (WebhookSender(config.webhook_url, config.webhook_secret)
                         if config.webhook_url else None)
        self._auto: SessionPatch | None = (self.codec.session_patch(config.accept)
                                           if config.accept is not None else None)

    # ---- life -----------------------------------------------------------------------

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        host = self.config.host
        # Port 0 (tests): the OS picks UDP's port, and TCP must take the same
        # one, which another socket may hold -- pick again, a few times.
        tries = _PORT_TRIES if self.config.port == 0 else 1
        for attempt in range(tries):
            try:
                port = await self._listen(loop, host, self.config.port)
                break
            except OSError:
                for server in self._servers:
                    server.close()
                self._servers.clear()
                if attempt == tries - 1:
                    raise
        self.port = port
        tls = self.config.tls_context()
        if tls is not None:
            server = await loop.create_server(lambda: _Tcp(self, "tls"), host,
                                              self.config.tls_port, ssl=tls)
            self._servers.append(server)
            self.tls_port = server.sockets[0].getsockname()[1]
        log.info("SIP on %s:%d (%s)%s", host, port, "+".join(self.config.transports),
                 f", TLS on {self.tls_port}" if tls is not None else "")

    async def _listen(self, loop: asyncio.AbstractEventLoop, host: str, port: int) -> int:
        """UDP and TCP on one port (SIP's); returns it."""
        if "udp" in self.config.transports:
            transport, _ = await loop.create_datagram_endpoint(lambda: _Udp(self),
                                                               local_addr=(host, port))
            self._servers.append(transport)
            port = transport.get_extra_info("sockname")[1]  # port 0: the one chosen
        if "tcp" in self.config.transports:
            server = await loop.create_server(lambda: _Tcp(self, "tcp"), host, port)
            self._servers.append(server)
            port = server.sockets[0].getsockname()[1]
        return port

    async def stop(self) -> None:
        for dialog in list(self.ringing.values()):
            dialog.respond(503)
            dialog.close()
        self.ringing.clear()
        for call_id in list(self._rings):
            self._stop_ringing(call_id)
        await asyncio.gather(*(c.hangup() for c in list(self._calls.values())),
                             return_exceptions=True)
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        for conn in list(self._connections):
            conn.close()
        for server in self._servers:
            server.close()
        if self._webhook is not None:
            await self._webhook.close()

    def _spawn(self, coro: Any, what: str) -> None:
        task = asyncio.ensure_future(coro)
        task.set_name(f"duplex-sip-{what}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # ---- messages in ------------------------------------------------------------------

    def received(self, data: bytes, send: Callable[[bytes], None], *, transport: str,
                 peer: Any) -> None:
        """One whole message from ``peer`` over ``transport`` (``udp``, ``tcp``,
        ``tls``); ``send`` answers on the same way back."""
        try:
            message = sm.parse(data)
        except sm.SipParseError as err:
            self.count_malformed(err.status)
            self._answer_malformed(data, err, send, transport != "udp")
            return
        try:
            if isinstance(message, sm.SipResponse):
                dialog = self._dialogs.get(message.call_id)
                if dialog is not None:
                    dialog.answered(message)
                return
            self._request(message, send, transport, peer)
        except Exception:  # a bug must not take the agent down: answer 500
            log.exception("SIP request failed")
            if isinstance(message, sm.SipRequest) and message.method != "ACK":
                send(sm.response(message, 500).encode())

    def count_malformed(self, status: int) -> None:
        self.malformed[status] += 1
        self._malformed_metric.inc(status=str(status))

    def _answer_malformed(self, data: bytes, err: sm.SipParseError,
                          send: Callable[[bytes], None], reliable: bool) -> None:
        """A 4xx/5xx to a request we cannot parse, with what of its headers
        can be read. A response has no answer, and neither has a UDP datagram
        that does not even start as a request (answering any datagram from
        any spoofed source would make us a reflector)."""
        if data.startswith(b"SIP/"):
            return
        if not reliable and not _REQUEST_LINE.match(data):
            return
        text = data.split(b"\r\n\r\n", 1)[0].decode("utf-8", "replace")
        keep = [line for line in text.split("\n")[1:]
                if re.match(r"(?i)\s*(via|v|from|f|to|t|call-id|i|cseq)\s*:", line)]
        reason = sm.REASONS.get(err.status, "Bad Request")
        why = re.sub(r'[^ -~]|"', "'", str(err))[:80]
        head = [f"SIP/2.0 {err.status} {reason}", *(k.strip() for k in keep),
                f"Warning: 399 vllm-duplex \"{why}\"", "Content-Length: 0"]
        send(("\r\n".join(head) + "\r\n\r\n").encode("utf-8", "replace"))

    def _request(self, req: sm.SipRequest, send: Callable[[bytes], None], transport: str,
                 peer: Any) -> None:
        method, dialog = req.method, self._dialogs.get(req.call_id)
        if method == "INVITE":
            if dialog is None:
                self._invite(req, send, transport, peer)
            elif req.cseq == dialog.invite.cseq:
                dialog.repeat()
            else:  # a re-INVITE (refresh, hold): the same media, answered again
                send(sm.response(req, 200, to_tag=dialog.local_tag, body=self._sdp(dialog),
                                 headers=[("Contact", f"<{dialog.local_uri}>"),
                                          ("Content-Type", "application/sdp")]).encode())
            return
        if method == "ACK":
            if dialog is not None:
                dialog.acked()  # a rejected call's dialog is then forgotten (``_forget``)
            return
        if method not in _METHODS:
            send(sm.response(req, 405, headers=[allow_header()]).encode())
            return
        if method == "OPTIONS":
            send(sm.response(req, 200, headers=[allow_header(),
                                                  ("Accept", "application/sdp")]).encode())
            return
        if dialog is None:
            send(sm.response(req, 481).encode())
            return
        if method == "CANCEL":
            send(sm.response(req, 200).encode())
            if dialog.state is DialogState.RINGING:
                self._end_ringing(dialog, 487)
        elif method == "BYE":
            send(sm.response(req, 200).encode())
            self._caller_hung_up(dialog)
        elif method == "NOTIFY":  # how our REFER goes (RFC 3515): a 2xx means transferred
            send(sm.response(req, 200).encode())
            if re.match(rb"SIP/2\.0 2\d\d", req.body.strip()):
                call = self._calls.get(req.call_id)
                if call is not None:
                    self._spawn(call.hangup(), "transferred")
        elif method == "INFO":  # DTMF as SIP INFO (application/dtmf-relay), as some trunks do
            send(sm.response(req, 200).encode())
            m = re.search(rb"(?im)^signal\s*=\s*([0-9*#A-D])", req.body)
            call = self._calls.get(req.call_id)
            if m and call is not None:
                call.dtmf(m.group(1).decode().upper())

    # ---- a new call ---------------------------------------------------------------------

    def _invite(self, req: sm.SipRequest, send: Callable[[bytes], None], transport: str,
                peer: Any) -> None:
        if sm.tag_of(req.get("to") or "") is not None:
            send(sm.response(req, 481).encode())  # a re-INVITE of a dialog we do not know
            return
        ctype = (req.get("content-type") or "").split(";")[0].strip().lower()
        if ctype != "application/sdp":
            send(sm.response(req, 415 if req.body else 488, headers=[
                ("Accept", "application/sdp")]).encode())  # no offer: no late offer here
            return
        try:
            offer = sdp.parse_offer(req.body.decode("utf-8", "replace"))
        except sdp.SdpError as err:
            why = re.sub(r'[^ -~]|"', "'", str(err))[:120]  # a quoted string, one line
            send(sm.response(req, 488, headers=[("Warning", f'304 vllm-duplex "{why}"')]).encode())
            return
        if len(self.ringing) >= self.config.max_ringing:
            send(sm.response(req, 486).encode())
            return
        call_id = self.sessions.mint_id("sip")
        host = self.config.advertised_address
        port = self.tls_port if transport == "tls" else self.port
        dialog = SipDialog(call_id, req, offer, send=send, reliable=transport != "udp",
                           local_uri=f"sip:duplex@{host}:{port};transport={transport}",
                           via_host=f"{host}:{port}", transport=transport,
                           peer_host=str(peer[0]) if peer else "")
        self._dialogs[req.call_id] = dialog
        dialog.respond(100)
        if self._auto is not None:
            self.ringing[call_id] = dialog
            self._spawn(self._accept_at_once(call_id), "accept")
            return
        dialog.respond(180)
        self.ringing[call_id] = dialog
        assert self._webhook is not None
        self._spawn(self._webhook.send(incoming_call(call_id, _sip_headers(req), time.time())),
                    "webhook")
        ring = asyncio.ensure_future(self._ring_timeout(dialog))
        ring.set_name(f"duplex-sip-ring-{call_id}")
        self._rings[call_id] = ring

    async def _accept_at_once(self, call_id: str) -> None:
        key = self.config.api_key or (self.sessions.api_keys[:1] or (None,))[0]
        try:
            await self.accept(call_id, key, self._auto)
        except DuplexError as err:
            log.warning("SIP call %s refused: %s", call_id, err.message)
            dialog = self.ringing.get(call_id)
            if dialog is not None:  # nobody else will answer it: say so now
                self._end_ringing(dialog, 503)

    async def _ring_timeout(self, dialog: SipDialog) -> None:
        await asyncio.sleep(self.config.ring_timeout_s)
        self._rings.pop(dialog.call_id, None)
        if self.ringing.get(dialog.call_id) is dialog:
            self._end_ringing(dialog, 480)

    def _stop_ringing(self, call_id: str) -> None:
        ring = self._rings.pop(call_id, None)
        if ring is not None and ring is not asyncio.current_task():
            ring.cancel()

    def _end_ringing(self, dialog: SipDialog, status: int) -> None:
        self.ringing.pop(dialog.call_id, None)
        self._stop_ringing(dialog.call_id)
        dialog.respond(status)  # its ACK stops the retransmissions
        self._spawn(self._forget(dialog, 32.0 if not dialog.reliable else 0.0), "forget")

    async def _forget(self, dialog: SipDialog, after_s: float) -> None:
        """Keep a rejected dialog's Call-ID until its ACK (at most ``after_s``:
        UDP repeats the INVITE until then), then drop it."""
        try:
            await asyncio.wait_for(dialog.ack.wait(), after_s)
        except asyncio.TimeoutError:
            pass
        finally:
            dialog.close()
            if self._dialogs.get(dialog.sip_call_id) is dialog:
                del self._dialogs[dialog.sip_call_id]

    def _caller_hung_up(self, dialog: SipDialog) -> None:
        if dialog.state is DialogState.RINGING:
            self.ringing.pop(dialog.call_id, None)
            self._stop_ringing(dialog.call_id)
        dialog.state = DialogState.ENDED
        dialog.close()
        self._dialogs.pop(dialog.sip_call_id, None)
        call = self._calls.get(dialog.sip_call_id)
        if call is not None:
            self._spawn(call.hangup(send_bye=False), "bye")

    def _sdp(self, dialog: SipDialog) -> bytes:
        """Our answer; the same bytes for every re-INVITE (the media never moves)."""
        if dialog.answer is None:
            call = self._calls.get(dialog.sip_call_id)
            port = call.rtp_port if call is not None else 0
            dialog.answer = sdp.answer(dialog.offer, self.config.advertised_address, port,
                                       int(time.time())).encode()
        return dialog.answer

    # ---- call control (the routes) -------------------------------------------------------

    def _ringing(self, call_id: str) -> SipDialog:
        dialog = self.ringing.get(call_id)
        if dialog is None:
            raise DuplexError("call_not_found", f"no ringing SIP call {call_id!r}",
                              param="call_id")
        return dialog

    async def accept(self, call_id: str, key: str | None, patch: SessionPatch | None, *,
                     kind: type[SipCall] = SipCall, codec: Codec | None = None) -> SipCall:
        """Answer a ringing call with a session of ``patch`` owned by ``key``
        (a ``kind`` of call speaking ``codec``'s dialect: OpenAI Realtime's
        unless a route names another, e.g. GPT-Live's ``live/sip_call.py``)."""
        dialog = self._ringing(call_id)
        del self.ringing[call_id]  # no second accept while this one opens
        try:
            call = await kind.open(self.sessions, call_id, key, patch, dialog.offer,
                                   self.config.host, dialog, on_end=self._ended, codec=codec)
        except DuplexError as err:
            self.ringing[call_id] = dialog
            if isinstance(err, Capacity):
                self._end_ringing(dialog, 486)  # busy: the trunk may try elsewhere
            raise
        if dialog.state is DialogState.ENDED:  # the caller gave up while the session opened
            await call.hangup(send_bye=False)
            raise DuplexError("call_not_found", f"the caller of {call_id!r} hung up",
                              param="call_id")
        self._stop_ringing(call_id)
        self._calls[dialog.sip_call_id] = call
        self.calls.add(call)
        dialog.on_no_ack = lambda: self._spawn(call.hangup(), "no-ack")
        dialog.respond(200, body=self._sdp(dialog))
        return call

    def reject(self, call_id: str, status: int) -> None:
        if not 300 <= status <= 699:
            raise DuplexError("invalid_value", "status_code is a SIP final failure status "
                              "(300-699)", param="status_code")
        self._end_ringing(self._ringing(call_id), status)

    def _ended(self, call: SipCall) -> None:
        self.calls.remove(call)
        for sip_call_id, known in list(self._calls.items()):
            if known is call:
                del self._calls[sip_call_id]
                self._spawn(self._forget_call(call, sip_call_id), "forget")

    async def _forget_call(self, call: SipCall, sip_call_id: str) -> None:
        """Drop an ended call's dialog once the call is over (its BYE answered)."""
        await call.ended.wait()
        dialog = self._dialogs.pop(sip_call_id, None)
        if dialog is not None:
            dialog.close()
