"""What keeps resumable streams beyond this process (a durable store), as the
text layer sees it: ``vllm_duplex.durable.streams`` implements both, and the
host sets ``StreamStore.keeper`` when the store outlives the process (the
text layer never imports the durable one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from vllm_duplex.text.streams import ResumableStream, StreamEvent, StreamStatus


class StreamMirror(Protocol):
    """A stream's copy beyond this process (``durable.streams``), told of each change."""

    def appended(self, ev: StreamEvent) -> None: ...

    def completed(self) -> None: ...

    def ended(self, status: StreamStatus | None) -> None:
        """Deleted or expired (dropped from the store); None: this process is
        stopping (left in the store for another worker)."""

    def holds(self, seq: int) -> bool:
        """Does the store hold event ``seq`` (or is it unreachable: events flow)?"""

    async def reached(self, seq: int) -> None:
        """Returns once ``holds(seq)`` (or the mirror ended)."""


class StreamKeeper(Protocol):
    """Keeps streams beyond this process (a durable store)."""

    async def claim(self, stream_id: str) -> int:
        """The id is unused wherever streams are kept (``duplicate_id`` otherwise);
        the generation it is held under."""

    async def unclaim(self, stream_id: str, generation: int) -> None: ...

    def keep(self, stream: ResumableStream, api_key: str | None, generation: int) -> None:
        """Mirror ``stream`` from now on (sets ``stream.mirror``)."""

    async def reach(self, stream_id: str, api_key: str | None, key_id: str | None, *,
                    patient: bool = True) -> None:
        """Take ``stream_id`` over (``StreamStore.restore``) when it is kept
        elsewhere, the caller's, and its owner is gone; ``wrong_instance`` when
        its owner lives; nothing when it is not kept (the caller answers as for
        an unknown id)."""
