"""What a WebRTC call's SDP offer must hold, checked before any peer
connection exists (sans-I/O: text in, a typed error or the offer to use out).

A call is one audio track each way, Opus at 48 kHz, and the ``oai-events``
data channel (the SCTP application m-line; an offer without one gets no
events but may be driven from a sideband socket). Anything else is the
client's to fix, said before a socket is opened for it:

- not SDP, not an offer we can read, no ICE credentials, no DTLS
  fingerprint, no RTCP mux, no audio, more than one audio, or video:
  ``invalid_sdp``;
- audio without Opus/48000: ``unsupported_codec``.

Remote ICE candidates at addresses this server does not gather on are
dropped from the offer: a server that offers only loopback candidates has no
business sending checks anywhere else.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Collection
from dataclasses import dataclass

from aiortc import sdp as aiortc_sdp
from vllm_duplex.domain.errors import DuplexError

MAX_OFFER_BYTES = 64 << 10


def _bad(message: str) -> DuplexError:
    return DuplexError("invalid_sdp", message, param="sdp")


@dataclass(frozen=True)
class Offer:
    sdp: str  # the offer to apply (foreign candidates dropped)
    data_channel: bool  # it has the application m-line of a data channel


def check_offer(text: str, allowed_hosts: Collection[str] = ()) -> Offer:
    """The offer to answer, or the typed error of what is wrong with it.
    ``allowed_hosts``: the addresses the server gathers on (empty: any)."""
    if not text or not text.strip():
        raise _bad("the request has no SDP offer (send it as the body, Content-Type "
                   "application/sdp, or as the multipart field sdp)")
    if len(text.encode("utf-8", "surrogatepass")) > MAX_OFFER_BYTES:
        raise _bad(f"the SDP offer exceeds {MAX_OFFER_BYTES} bytes")
    lines = [line.rstrip("\r") for line in text.strip().splitlines()]
    if lines[0] != "v=0":
        raise _bad("not an SDP offer (it must start with v=0)")
    try:
        description = aiortc_sdp.SessionDescription.parse(text)
    except Exception as exc:  # aiortc's parser raises whatever the text trips
        raise _bad(f"the SDP offer does not parse ({type(exc).__name__}: {exc})") from None
    audio = [m for m in description.media if m.kind == "audio"]
    others = [m.kind for m in description.media if m.kind not in ("audio", "application")]
    if not audio:
        raise _bad("the SDP offer has no audio (m=audio): a call needs a microphone track")
    if len(audio) > 1 or others:
        raise _bad("a call takes one audio m-line and the oai-events data channel; "
                   f"this offer has {len(audio)} audio and {others or 'no'} other media")
    for media in description.media:
        if not media.ice.usernameFragment or not media.ice.password:
            raise _bad(f"the {media.kind} m-line has no ICE credentials (a=ice-ufrag, a=ice-pwd)")
        if not media.dtls or not media.dtls.fingerprints:
            raise _bad(f"the {media.kind} m-line has no DTLS fingerprint (a=fingerprint)")
    if not audio[0].rtcp_mux:
        raise _bad("the audio m-line must use RTCP mux (a=rtcp-mux)")
    if audio[0].direction == "inactive":
        raise _bad("the audio m-line is inactive")
    codecs = audio[0].rtp.codecs
    if not any(c.mimeType.lower() == "audio/opus" and c.clockRate == 48000 for c in codecs):
        offered = ", ".join(sorted({f"{c.mimeType}/{c.clockRate}" for c in codecs})) or "none"
        raise DuplexError("unsupported_codec", f"the audio must offer Opus at 48 kHz "
                          f"(offered: {offered})", param="sdp")
    return Offer(sdp=_keep_candidates(lines, allowed_hosts),
                 data_channel=any(m.kind == "application" for m in description.media))


def _keep_candidates(lines: list[str], allowed_hosts: Collection[str]) -> str:
    if not allowed_hosts:
        return "\r\n".join(lines) + "\r\n"
    allowed = {ipaddress.ip_address(h) for h in allowed_hosts}
    kept = []
    for line in lines:
        if line.startswith("a=candidate:"):
            bits = line.split()
            try:
                if len(bits) < 6 or ipaddress.ip_address(bits[4]) not in allowed:
                    continue
            except ValueError:  # an mDNS name (xxx.local): not reachable from here
                continue
        kept.append(line)
    return "\r\n".join(kept) + "\r\n"
