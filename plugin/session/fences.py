"""``FenceMover``: the one place the session's fence moves.

The gate (``domain/gate.py``) is where stale outputs die; this is where the
fence they are judged against moves, so what a move costs is said once: a
move while the session runs voids everything under way -- it is counted,
and the stages are told to abort (the ``Cancel`` it returns); a restore
places a session rebuilt from the store past the fence its dead owner
reached, before it starts, with nothing under way to count or cancel.

The core gives one mover to the parts that move the fence (the core for a
policy's plan, the ``Floor`` for a void reply); the gate itself stays with
the readers. ``tests/unit/test_layering.py`` checks that nothing else calls
``FenceGate.advance``.
"""

from __future__ import annotations

from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.gate import FenceGate
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.session.effects import Cancel


class FenceMover:
    def __init__(self, gate: FenceGate, metrics: Metrics) -> None:
        self._gate = gate
        self._metrics = metrics

    @property
    def fence(self) -> Fence:
        return self._gate.fence

    def bump(self, fence: Fence) -> Cancel:
        """Move to ``fence`` while the session runs: outputs under way are
        stale from now on. Returns the ``Cancel`` of their requests, for the
        caller to place among its effects (the floor sends a void reply's end
        before it, the core's plan after it)."""
        incarnation = self._gate.fence.incarnation
        self._gate.advance(fence)
        self._metrics.epoch_bumps.inc()
        if fence.incarnation > incarnation:  # model state rebuilt (the epoch moved with it)
            self._metrics.incarnation_bumps.inc()
        return Cancel(fence)

    def restore(self, fence: Fence) -> None:
        """Start at ``fence``: a session rebuilt from the store, before it
        starts. Not counted as a bump (nothing ran under the old fence in this
        process) and nothing to cancel."""
        self._gate.advance(fence)
