"""The session's fence gate: the one place where stale stage outputs die.

Outputs tagged with an older ``(incarnation, epoch)`` are dropped before they
reach the client — always, at one place, never by per-call-site
checks. The session owns one ``FenceGate``, advances it on every fence bump
and asks it about every stage output before rendering or forwarding it.
"""

from __future__ import annotations

from collections import Counter

from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import InputObservation, StageOutput


class FenceGate:
    """Admits outputs of the current fence; counts what it drops."""

    def __init__(self, fence: Fence) -> None:
        self._fence = fence
        self.dropped = 0
        self.admitted = 0
        # Per-stage drop counts, so /metrics can tell which stage kept
        # producing for nobody (a sign that cancel is not reaching it).
        self.dropped_by_stage: Counter[str] = Counter()

    @property
    def fence(self) -> Fence:
        return self._fence

    def advance(self, new_fence: Fence) -> None:
        """Move to ``new_fence``, which must be strictly newer (same session,
        greater ``(incarnation, epoch)``); anything else is a control-plane
        bug, so it raises ``ValueError`` instead of silently re-admitting
        outputs that were already declared stale."""
        if new_fence.session_id != self._fence.session_id:
            raise ValueError(
                f"fence of session {new_fence.session_id!r} cannot advance a gate "
                f"of session {self._fence.session_id!r}"
            )
        if not self._fence.is_stale_against(new_fence):
            raise ValueError(f"fence must grow: {new_fence} is not newer than {self._fence}")
        self._fence = new_fence

    def admit(self, output: StageOutput) -> bool:
        if self._is_stale(output):
            self.dropped += 1
            self.dropped_by_stage[output.stage] += 1
            return False
        self.admitted += 1
        return True

    def _is_stale(self, output: StageOutput) -> bool:
        fence, current = output.fence, self._fence
        if isinstance(output.payload, InputObservation):  # heard, not said: see its docstring
            return fence.session_id != current.session_id
        return fence.is_stale_against(current)
