"""Admission by measured capacity: how many voice sessions one server holds
before everyone's turns slow down, and the refusal past it.

A voice session is a realtime session (a socket, a WebRTC call; a
conversation or a transcription): each holds the CPU stages' per-session
work (VAD, Whisper, Piper) and its turns. Past the machine's capacity every
session's turn gap grows together (``bench/capacity.py``), so a server with a
ceiling refuses the session over it at once, with a typed, retryable error
and a hint of when to come back -- HTTP 429 with ``Retry-After`` before the
WebSocket upgrade, the same for a WebRTC call's offer -- instead of slowing
everyone. A resume is never refused: the session it names already holds its
seat (detached sessions waiting for their resume count, as they will talk
again). Behind ``serve --workers N`` the router tries the next worker on a
429 (``fleet/router.py``), so a new session is refused only when every
worker is full.

``limits.max_voice_sessions``: a number, ``auto`` (the machine's: the
sessions per core measured for the default pipeline, ``SESSIONS_PER_CORE``,
times the cores this process may use, shared by the workers of one machine),
or null (no ceiling but ``max_sessions``). How to measure it for another
machine or pipeline: ``bench/capacity.py`` prints the largest N whose turn
gap p90 stays within the target (docs/capacity.md).
"""

from __future__ import annotations

import math
import os

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.machine import Choice, detect

# Voice sessions per core of the default pipeline: bench/capacity.py on a
# 2-core AMD EPYC (AVX-512 BF16), the most talkers whose turn gap p90 stayed
# within 1200 ms with every turn answered (docs/capacity.md).
SESSIONS_PER_CORE = 3
RETRY_AFTER_S = 5  # a voice session lasts minutes: a seat is not freed sooner than this, typically


def ceiling_choice(raw: int | str | None, *, workers: int = 1) -> Choice | None:
    """The ceiling ``limits.max_voice_sessions`` asks for (None: none)."""
    if raw is None:
        return None
    if raw == "auto":
        cores = detect().count
        share = f", shared by {workers} workers" if workers > 1 else ""
        return Choice(max(1, math.floor(SESSIONS_PER_CORE * cores / max(1, workers))), "machine",
                      f"{SESSIONS_PER_CORE} per core (bench/capacity.py), {cores} cores{share}")
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 1:
        raise ValueError(f'limits.max_voice_sessions must be a number >= 1, "auto" or null, got {raw!r}')
    return Choice(raw, "config")


class VoiceCapacity:
    """The ceiling and the refusal; the count is the caller's (live realtime sessions)."""

    def __init__(self, raw: int | str | None, *, retry_after_s: int = RETRY_AFTER_S) -> None:
        workers = int(os.environ.get("VLLM_DUPLEX_FLEET_WORKERS", "1") or 1)
        self.choice = ceiling_choice(raw, workers=workers)
        self.retry_after_s = retry_after_s
        self.refused = 0

    @property
    def ceiling(self) -> int | None:
        return None if self.choice is None else int(self.choice.value)  # type: ignore[arg-type]

    def check(self, live: int) -> None:
        """Raise ``at_capacity`` when ``live`` sessions fill the ceiling."""
        ceiling = self.ceiling
        if ceiling is not None and live >= ceiling:
            self.refused += 1
            raise DuplexError(
                "at_capacity",
                f"this server holds its ceiling of {ceiling} voice sessions; retry in "
                f"{self.retry_after_s} s", details={"retry_after_s": self.retry_after_s,
                                                    "max_voice_sessions": ceiling})

    def to_json(self, live: int) -> dict[str, object]:
        ceiling = self.ceiling
        return {"max_voice_sessions": None if self.choice is None else self.choice.to_json(),
                "voice_sessions": live,
                "room": None if ceiling is None else max(0, ceiling - live),
                "refused": self.refused}
