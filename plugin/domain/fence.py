"""The session fence and the stage request ids that carry it.

A ``Fence(session_id, incarnation, epoch)`` identifies *which* version of a
session's model state (incarnation) and output stream (epoch) a piece of work
belongs to. Outputs tagged with an older ``(incarnation, epoch)`` than the
session's current fence are stale and never reach the client.
"""

from __future__ import annotations

import base64
import functools
import re
from dataclasses import dataclass

_ROLE_RE = re.compile(r"^[A-Za-z0-9_-]+$")
_REQUEST_ID_RE = re.compile(
    r"^duplex-s\.(?P<sid>[A-Za-z0-9_-]*)\.i\.(?P<inc>0|[1-9][0-9]*)"
    r"\.e\.(?P<epoch>0|[1-9][0-9]*)\.r\.(?P<role>[A-Za-z0-9_-]+)$"
)


@dataclass(frozen=True, order=True)
class Fence:
    """Immutable and totally ordered within a session (lexicographic)."""

    session_id: str
    incarnation: int = 0
    epoch: int = 0

    def next_epoch(self) -> Fence:
        """An interruption: outputs of the current epoch become stale."""
        return Fence(self.session_id, self.incarnation, self.epoch + 1)

    def next_incarnation(self) -> Fence:
        """Model state was rebuilt. The epoch also advances so that
        ``(incarnation, epoch)`` pairs stay strictly increasing."""
        return Fence(self.session_id, self.incarnation + 1, self.epoch + 1)

    def is_stale_against(self, current: Fence) -> bool:
        """True when work tagged with ``self`` must not reach a client whose
        session is now at ``current``."""
        if self.session_id != current.session_id:
            return True
        return (self.incarnation, self.epoch) < (current.incarnation, current.epoch)

    def wire(self) -> dict[str, int]:
        return {"incarnation": self.incarnation, "epoch": self.epoch}

    def request_id(self, role: str) -> str:
        """A stage request id that encodes this fence (see ``parse_request_id``)."""
        return _request_id(self, role)


@functools.lru_cache(maxsize=8192)  # every audio frame asks for the same few ids
def _request_id(fence: Fence, role: str) -> str:
    if not _ROLE_RE.match(role):
        raise ValueError(f"role must match [A-Za-z0-9_-]+, got {role!r}")
    sid = base64.urlsafe_b64encode(fence.session_id.encode()).rstrip(b"=").decode()
    return f"duplex-s.{sid}.i.{fence.incarnation}.e.{fence.epoch}.r.{role}"


def parse_request_id(request_id: str) -> tuple[Fence, str]:
    """Inverse of ``Fence.request_id``: returns ``(fence, role)``.

    Raises ``ValueError`` for anything that is not a duplex request id, so a
    stage can tell its own requests from foreign ones.
    """
    m = _REQUEST_ID_RE.match(request_id)
    if m is None:
        raise ValueError(f"not a duplex request id: {request_id!r}")
    raw = m["sid"]
    try:
        sid = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
    except (ValueError, UnicodeDecodeError) as exc:
        raise ValueError(f"bad session id in request id: {request_id!r}") from exc
    fence = Fence(sid, int(m["inc"]), int(m["epoch"]))
    if fence.request_id(m["role"]) != request_id:  # reject non-canonical base64
        raise ValueError(f"non-canonical request id: {request_id!r}")
    return fence, m["role"]
