"""The SDP of a SIP call (RFC 4566 / 3264), sans-I/O: read the caller's
offer, write our answer.

We take exactly one audio stream, plain RTP (``RTP/AVP``): G.711 μ-law
(payload type 0) or A-law (8), whichever the caller lists first, plus
``telephone-event/8000`` (RFC 4733 DTMF) when offered. An offer with none of
them, or only secure media (``RTP/SAVP``: no SRTP here), cannot be answered
(488 Not Acceptable Here).
"""

from __future__ import annotations

from dataclasses import dataclass

from vllm_duplex.domain.session_config import AudioEncoding

_STATIC = {0: AudioEncoding.PCMU, 8: AudioEncoding.PCMA}
_NAMES = {"pcmu": AudioEncoding.PCMU, "pcma": AudioEncoding.PCMA}


class SdpError(ValueError):
    """An offer we cannot answer (488)."""


@dataclass(frozen=True)
class Offer:
    address: str  # where the caller wants our RTP
    port: int
    payload_type: int  # the G.711 payload type chosen
    encoding: AudioEncoding  # PCMU or PCMA
    dtmf_payload_type: int | None  # telephone-event's, if offered
    ptime_ms: int = 20


def parse_offer(sdp: str) -> Offer:
    session_address: str | None = None
    media: list[str] | None = None
    media_address: str | None = None
    rtpmap: dict[int, str] = {}
    ptime = 20
    seen_audio = False
    for raw in sdp.replace("\r\n", "\n").split("\n"):
        line = raw.strip()
        if len(line) < 2 or line[1] != "=":
            continue
        kind, value = line[0], line[2:]
        if kind == "m":
            if seen_audio:
                break  # only the first audio stream is ours; others are refused below
            fields = value.split()
            if fields and fields[0] == "audio":
                seen_audio, media = True, fields
        elif kind == "c":
            parts = value.split()
            if len(parts) >= 3 and parts[0] == "IN" and parts[1] in ("IP4", "IP6"):
                if seen_audio:
                    media_address = parts[2].split("/")[0]
                else:
                    session_address = parts[2].split("/")[0]
        elif kind == "a" and seen_audio:
            if value.startswith("rtpmap:"):
                pt, _, name = value[7:].partition(" ")
                if pt.isdigit():
                    rtpmap[int(pt)] = name.strip().lower()
            elif value.startswith("ptime:") and value[6:].strip().isdigit():
                ptime = int(value[6:].strip())
    if media is None or len(media) < 4:
        raise SdpError("the offer has no audio stream")
    if not media[1].isdigit() or not 0 < int(media[1]) < 65536:
        raise SdpError("the audio stream has no port")
    if media[2] != "RTP/AVP":
        raise SdpError(f"transport {media[2]!r} is not supported (plain RTP/AVP only: no SRTP)")
    address = media_address or session_address
    if address is None:
        raise SdpError("the offer has no connection address")
    payload_types = [int(p) for p in media[3:] if p.isdigit()]
    chosen: tuple[int, AudioEncoding] | None = None
    dtmf: int | None = None
    for pt in payload_types:
        name = rtpmap.get(pt)
        encoding = _NAMES.get(name.split("/")[0]) if name else _STATIC.get(pt)
        if encoding is not None and chosen is None and (name is None or name.endswith("/8000")):
            chosen = (pt, encoding)
        if name == "telephone-event/8000" and dtmf is None:
            dtmf = pt
    if chosen is None:
        raise SdpError("the offer has neither PCMU nor PCMA at 8000 Hz")
    return Offer(address, int(media[1]), chosen[0], chosen[1], dtmf,
                 ptime if ptime in (10, 20, 30, 40) else 20)


def answer(offer: Offer, address: str, port: int, session_id: int) -> str:
    """Our answer: the chosen codec (and DTMF) on our RTP ``address:port``."""
    family = "IP6" if ":" in address else "IP4"
    name = "PCMU" if offer.encoding is AudioEncoding.PCMU else "PCMA"
    pts = [str(offer.payload_type)]
    lines = [f"a=rtpmap:{offer.payload_type} {name}/8000"]
    if offer.dtmf_payload_type is not None:
        pts.append(str(offer.dtmf_payload_type))
        lines += [f"a=rtpmap:{offer.dtmf_payload_type} telephone-event/8000",
                  f"a=fmtp:{offer.dtmf_payload_type} 0-16"]
    return "\r\n".join([
        "v=0", f"o=vllm-duplex {session_id} {session_id} IN {family} {address}", "s=vllm-duplex",
        f"c=IN {family} {address}", "t=0 0", f"m=audio {port} RTP/AVP {' '.join(pts)}",
        *lines, "a=ptime:20", "a=sendrecv", ""])
