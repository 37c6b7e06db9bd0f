"""One SIP dialog on our side (RFC 3261 UAS): the INVITE we answer, the
final response we retransmit until its ACK, and the requests we send in it
(BYE, REFER) with their answers.

It knows its peer only as a ``send(bytes)`` callable (the agent's transport
toward the address the INVITE came from), so the same dialog runs over UDP
and TCP; over UDP, final responses and our requests are retransmitted with
RFC 3261's timers (T1 = 500 ms doubling to T2 = 4 s), over TCP they are not.
"""

from __future__ import annotations

import asyncio
import enum
import secrets
from collections.abc import Callable

from vllm_duplex.realtime.server.telephony import sip_message as sm
from vllm_duplex.realtime.server.telephony.sdp import Offer

T1, T2, TIMEOUT = 0.5, 4.0, 32.0
_ALLOW = "INVITE, ACK, BYE, CANCEL, OPTIONS, NOTIFY, INFO"  # what we take (we send REFER)


class DialogState(enum.Enum):
    RINGING = "ringing"  # 180 sent: waiting for accept or reject
    ANSWERED = "answered"  # 200 sent, no ACK yet
    CONFIRMED = "confirmed"  # ACKed: the call is up
    ENDED = "ended"  # rejected, cancelled, or BYE either way


def allow_header() -> tuple[str, str]:
    return ("Allow", _ALLOW)


class SipDialog:
    def __init__(self, call_id: str, invite: sm.SipRequest, offer: Offer, *,
                 send: Callable[[bytes], None], reliable: bool, local_uri: str,
                 via_host: str, transport: str, peer_host: str = "",
                 timers: tuple[float, float, float] = (T1, T2, TIMEOUT)) -> None:
        self.call_id = call_id  # ours (sip_…)
        self.invite = invite
        self.offer = offer
        self.state = DialogState.RINGING
        self.local_tag = secrets.token_hex(6)
        self.send, self.reliable = send, reliable
        self.local_uri = local_uri  # our Contact
        self.peer_host = peer_host  # where the INVITE came from
        self._via = f"SIP/2.0/{transport.upper()} {via_host}"
        self._cseq = 0
        self._t1, self._t2, self._timeout = timers
        self._final: bytes | None = None  # our final response to the INVITE (resent on repeats)
        self._last: bytes | None = None  # our latest response to it, provisional or final
        # Called when a 2xx was resent for TIMEOUT without its ACK: the caller
        # is gone, and RFC 3261 §13.3.1.4 says to end the call (BYE).
        self.on_no_ack: Callable[[], None] | None = None
        self._retransmit: asyncio.Task[None] | None = None
        self._waiting: dict[int, asyncio.Future[sm.SipResponse]] = {}
        self.ack = asyncio.Event()  # the ACK of our final response came
        self.answer: bytes | None = None  # our SDP, once accepted

    @property
    def sip_call_id(self) -> str:
        return self.invite.call_id

    def respond(self, status: int, *, body: bytes = b"", headers: list[tuple[str, str]] | None = None
                ) -> None:
        """Answer the INVITE; a final answer is kept, and over UDP resent
        until its ACK arrives (or ``TIMEOUT``)."""
        hdrs = list(headers or [])
        if status >= 200:
            hdrs.append(("Contact", f"<{self.local_uri}>"))
        if body:
            hdrs.append(("Content-Type", "application/sdp"))
        message = sm.response(self.invite, status, to_tag=self.local_tag if status > 100 else None,
                              headers=[*hdrs, allow_header()] if status == 200 else hdrs,
                              body=body).encode()
        self.send(message)
        self._last = message
        if status < 200:
            return
        self._final = message
        self.state = DialogState.ANSWERED if status < 300 else DialogState.ENDED
        if not self.reliable:
            self._retransmit = asyncio.ensure_future(self._resend(message))
            self._retransmit.set_name(f"duplex-sip-retransmit-{self.call_id}")

    async def _resend(self, message: bytes) -> None:
        interval, waited = self._t1, 0.0
        while waited < self._timeout:
            await asyncio.sleep(interval)
            waited += interval
            self.send(message)
            interval = min(interval * 2, self._t2)
        self._retransmit = None
        if self.state is DialogState.ANSWERED and self.on_no_ack is not None:
            self.on_no_ack()

    def repeat(self) -> None:
        """The INVITE came again (a UDP retransmission): say the latest again."""
        if self._last is not None:
            self.send(self._last)

    def acked(self) -> None:
        self.ack.set()
        if self._retransmit is not None:
            self._retransmit.cancel()
            self._retransmit = None
        if self.state is DialogState.ANSWERED:
            self.state = DialogState.CONFIRMED

    # ---- requests we send ---------------------------------------------------------

    def _request(self, method: str, headers: list[tuple[str, str]] | None = None) -> sm.SipRequest:
        """A request in this dialog: From us (the INVITE's To, our tag), To the
        caller (the INVITE's From), to the caller's Contact."""
        self._cseq += 1
        invite = self.invite
        contact = invite.get("contact")
        target = sm.uri_of(contact) if contact else sm.uri_of(invite.get("from") or "")
        return sm.request(method, target, via=f"{self._via};branch=z9hG4bK{secrets.token_hex(8)};rport",
                          from_=f"{invite.get('to')};tag={self.local_tag}"
                          if sm.tag_of(invite.get("to") or "") is None else invite.get("to") or "",
                          to=invite.get("from") or "", call_id=invite.call_id, cseq=self._cseq,
                          headers=[("Contact", f"<{self.local_uri}>"), *(headers or [])])

    async def transact(self, method: str, headers: list[tuple[str, str]] | None = None,
                       *, timeout_s: float = 8.0) -> sm.SipResponse:
        """Send a request and wait for its final response
        (``asyncio.TimeoutError``; ``ConnectionError`` when the dialog ends first)."""
        req = self._request(method, headers)
        loop = asyncio.get_running_loop()
        done: asyncio.Future[sm.SipResponse] = loop.create_future()
        self._waiting[self._cseq] = done
        data, interval = req.encode(), self._t1
        deadline = loop.time() + timeout_s
        try:
            self.send(data)
            while True:
                left = deadline - loop.time()
                if left <= 0:
                    raise asyncio.TimeoutError(f"no answer to {method}")
                try:
                    return await asyncio.wait_for(asyncio.shield(done),
                                                  left if self.reliable else min(interval, left))
                except asyncio.TimeoutError:
                    if not self.reliable:  # UDP: no answer yet, say it again
                        self.send(data)
                        interval = min(interval * 2, self._t2)
        finally:
            self._waiting.pop(req.cseq[0], None)

    def answered(self, resp: sm.SipResponse) -> None:
        """A response to one of our requests."""
        number, _ = resp.cseq
        done = self._waiting.get(number)
        if done is not None and not done.done() and resp.status >= 200:
            done.set_result(resp)

    async def bye(self) -> None:
        """End the call from our side (once; not after the caller's BYE)."""
        if self.state in (DialogState.ANSWERED, DialogState.CONFIRMED):
            self.state = DialogState.ENDED
            self.close()
            await self.transact("BYE", timeout_s=4.0)

    async def refer(self, target_uri: str) -> int:
        """Ask the caller's side to call ``target_uri`` instead (RFC 3515);
        its answer's status (202: it will try)."""
        resp = await self.transact("REFER", [("Refer-To", f"<{target_uri}>"),
                                             ("Referred-By", f"<{self.local_uri}>")])
        return resp.status

    def close(self) -> None:
        if self._retransmit is not None:
            self._retransmit.cancel()
            self._retransmit = None
        for done in self._waiting.values():
            if not done.done():
                done.set_exception(ConnectionError("the dialog ended"))
