"""SIP messages (RFC 3261), sans-I/O: bytes in, a typed message out, and the
other way round. Nothing here touches a socket or a clock.

- ``parse(data)`` reads one whole message (a UDP datagram, or what
  ``StreamFramer`` cut out of a TCP stream); anything malformed is a
  ``SipParseError`` carrying the status a server answers it with (400, 505,
  413), so the agent can answer instead of failing.
- ``response(request, status, ...)`` builds a response that copies what RFC
  3261 §8.2.6 says a response copies (Via, From, To, Call-ID, CSeq).
- ``request(...)`` builds a request inside a dialog (BYE, REFER).

Headers keep their order and repetition (Via may repeat); names are looked
up case-insensitively, compact forms (``v``, ``f``, ``i``...) included.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

MAX_MESSAGE_BYTES = 64 << 10  # a larger SIP message is refused (413), never buffered
_COMPACT = {"v": "via", "f": "from", "t": "to", "i": "call-id", "m": "contact",
            "l": "content-length", "c": "content-type", "k": "supported", "s": "subject",
            "r": "refer-to", "b": "referred-by", "e": "content-encoding", "o": "event"}
_REQUIRED = ("via", "from", "to", "call-id", "cseq")
_TOKEN = re.compile(r"[A-Za-z0-9.!%*_+`'~-]+")
REASONS = {100: "Trying", 180: "Ringing", 200: "OK", 202: "Accepted", 400: "Bad Request",
           404: "Not Found", 405: "Method Not Allowed", 408: "Request Timeout",
           413: "Request Entity Too Large", 415: "Unsupported Media Type",
           480: "Temporarily Unavailable", 481: "Call/Transaction Does Not Exist",
           486: "Busy Here", 487: "Request Terminated", 488: "Not Acceptable Here",
           500: "Server Internal Error", 503: "Service Unavailable",
           505: "Version Not Supported", 603: "Decline"}


class SipParseError(ValueError):
    """A message that cannot be understood; ``status`` is the answer to it."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status


@dataclass
class SipMessage:
    headers: list[tuple[str, str]] = field(default_factory=list)
    body: bytes = b""

    def get(self, name: str) -> str | None:
        """The first value of header ``name`` (any case, compact or not)."""
        key = _canonical(name)
        for n, v in self.headers:
            if _canonical(n) == key:
                return v
        return None

    def get_all(self, name: str) -> list[str]:
        key = _canonical(name)
        return [v for n, v in self.headers if _canonical(n) == key]

    @property
    def call_id(self) -> str:
        return self.get("call-id") or ""

    @property
    def cseq(self) -> tuple[int, str]:
        number, _, method = (self.get("cseq") or "").partition(" ")
        return int(number), method.strip().upper()


@dataclass
class SipRequest(SipMessage):
    method: str = ""
    uri: str = ""

    def encode(self) -> bytes:
        return _encode(f"{self.method} {self.uri} SIP/2.0", self.headers, self.body)


@dataclass
class SipResponse(SipMessage):
    status: int = 200
    reason: str = "OK"

    def encode(self) -> bytes:
        return _encode(f"SIP/2.0 {self.status} {self.reason}", self.headers, self.body)


def _canonical(name: str) -> str:
    low = name.strip().lower()
    return _COMPACT.get(low, low)


def _encode(start: str, headers: list[tuple[str, str]], body: bytes) -> bytes:
    lines = [start]
    lines += [f"{n}: {v}" for n, v in headers if _canonical(n) != "content-length"]
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("utf-8") + body


def parse(data: bytes) -> SipRequest | SipResponse:
    """One whole SIP message (see the module docstring)."""
    if len(data) > MAX_MESSAGE_BYTES:
        raise SipParseError("message too large", 413)
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        head, sep, body = data.partition(b"\n\n")  # bare LF: tolerated (RFC 3261 §7.5)
        if not sep:
            raise SipParseError("no blank line after the headers")
    try:
        text = head.decode("utf-8")
    except UnicodeDecodeError:
        raise SipParseError("headers are not UTF-8") from None
    lines = text.replace("\r\n", "\n").split("\n")
    start, rest = lines[0].strip(), lines[1:]
    headers: list[tuple[str, str]] = []
    for line in rest:
        if line[:1] in (" ", "\t") and headers:  # folded continuation
            name, value = headers[-1]
            headers[-1] = (name, f"{value} {line.strip()}")
            continue
        name, colon, value = line.partition(":")
        if not colon or not _TOKEN.fullmatch(name.strip()):
            raise SipParseError(f"malformed header line {line[:40]!r}")
        headers.append((name.strip(), value.strip()))
    message: SipRequest | SipResponse
    parts = start.split(" ", 2)
    if start.startswith("SIP/"):
        if len(parts) < 2 or parts[0] != "SIP/2.0" or not parts[1].isdigit() \
                or not 100 <= int(parts[1]) <= 699:
            raise SipParseError(f"malformed status line {start[:40]!r}")
        message = SipResponse(headers=headers, status=int(parts[1]),
                              reason=parts[2] if len(parts) > 2 else "")
    else:
        if len(parts) != 3 or not _TOKEN.fullmatch(parts[0]) or not parts[1]:
            raise SipParseError(f"malformed request line {start[:40]!r}")
        if parts[2] != "SIP/2.0":
            raise SipParseError(f"SIP version {parts[2][:16]!r} is not supported", 505)
        message = SipRequest(headers=headers, method=parts[0].upper(), uri=parts[1])
    missing = [h for h in _REQUIRED if message.get(h) is None]
    if missing:
        raise SipParseError(f"missing headers: {', '.join(missing)}")
    try:
        number, method = message.cseq
    except ValueError:
        raise SipParseError("malformed CSeq") from None
    if number < 0 or (isinstance(message, SipRequest) and method != message.method):
        raise SipParseError("CSeq does not match the request")
    length = message.get("content-length")
    if length is not None:
        if not length.isdigit() or int(length) > len(body):
            raise SipParseError("Content-Length does not match the body")
        body = body[:int(length)]
    message.body = body
    return message


def response(req: SipRequest, status: int, *, to_tag: str | None = None,
             headers: list[tuple[str, str]] | None = None, body: bytes = b"",
             reason: str | None = None) -> SipResponse:
    """The response to ``req`` (RFC 3261 §8.2.6): its Vias, From, Call-ID,
    CSeq; its To with ``to_tag`` added when it has none."""
    copied = [(n, v) for n, v in req.headers if _canonical(n) in ("via", "from", "call-id", "cseq")]
    to = req.get("to") or ""
    if to_tag and tag_of(to) is None:
        to = f"{to};tag={to_tag}"
    return SipResponse(headers=[*copied, ("To", to), *(headers or [])],
                       body=body, status=status, reason=reason or REASONS.get(status, "Unknown"))


def request(method: str, uri: str, *, via: str, from_: str, to: str, call_id: str, cseq: int,
            headers: list[tuple[str, str]] | None = None, body: bytes = b"") -> SipRequest:
    return SipRequest(method=method, uri=uri, body=body, headers=[
        ("Via", via), ("Max-Forwards", "70"), ("From", from_), ("To", to),
        ("Call-ID", call_id), ("CSeq", f"{cseq} {method}"), *(headers or [])])


def tag_of(name_addr: str) -> str | None:
    """The ``tag`` parameter of a From/To value."""
    m = re.search(r";\s*tag=([^;>\s]+)", _after_uri(name_addr))
    return m.group(1) if m else None


def uri_of(name_addr: str) -> str:
    """The URI of a From/To/Contact value (``"Bob" <sip:b@h>;tag=1`` -> ``sip:b@h``)."""
    m = re.search(r"<([^>]*)>", name_addr)
    if m:
        return m.group(1).strip()
    return name_addr.split(";", 1)[0].strip()


def _after_uri(name_addr: str) -> str:
    close = name_addr.find(">")
    return name_addr[close + 1:] if close >= 0 else name_addr


def branch_of(via: str) -> str | None:
    m = re.search(r";\s*branch=([^;\s,]+)", via)
    return m.group(1) if m else None


class StreamFramer:
    """Cuts whole SIP messages out of a TCP byte stream (by Content-Length,
    RFC 3261 §18.3); keep-alive CRLFs between messages are skipped."""

    def __init__(self) -> None:
        self._buf = bytearray()

    def feed(self, data: bytes) -> list[bytes]:
        """The whole messages ``data`` completes. Raises ``SipParseError``
        when the stream cannot be framed any more (the connection must end)."""
        self._buf += data
        out: list[bytes] = []
        while True:
            while self._buf[:2] == b"\r\n":
                del self._buf[:2]
            end = self._buf.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buf) > MAX_MESSAGE_BYTES:
                    raise SipParseError("headers too large", 413)
                return out
            head = bytes(self._buf[:end]).decode("utf-8", "replace")
            m = re.search(r"(?im)^(?:content-length|l)[ \t]*:[ \t]*(\d+)[ \t]*$", head)
            if m is None:
                raise SipParseError("a message on a stream needs Content-Length")
            total = end + 4 + int(m.group(1))
            if total > MAX_MESSAGE_BYTES:
                raise SipParseError("message too large", 413)
            if len(self._buf) < total:
                return out
            out.append(bytes(self._buf[:total]))
            del self._buf[:total]
