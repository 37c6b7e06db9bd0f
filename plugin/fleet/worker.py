"""The runtime of one worker process of ``serve --workers N``.

A worker is an ordinary ``Runtime`` with an owner id (``w1``) and, when the
config has a ``vllm`` stage, that stage borrowing an ``AsyncLLM`` client of
the shared engine core (``engine_core.connect_client``) instead of building
its own engine: the worker owns the client, the supervisor owns the core.

A worker that dies takes its sessions with it. When the supervisor restarts
it (same owner id, a new *life*), a resume of a session minted by the dead
life reaches the new one through the router; it answers ``engine_dead``
("the process that held it died"), not ``session_not_found``, for as long as
such a session could still have been resumable (the grace window plus the
session TTL after the restart). A resume of an id this life never minted
cannot be told apart from one of the dead life, so within that window it
gets ``engine_dead`` too; after it, ``session_not_found`` as usual.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from vllm_duplex.domain.clock import Clock, MonotonicClock
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.owner_ids import owner_of
from vllm_duplex.host.deploy import DeployConfig
from vllm_duplex.fleet.engine_core import WorkerSlot, connect_client
from vllm_duplex.host.runtime import Runtime

log = logging.getLogger(__name__)


class WorkerRuntime(Runtime):
    """A ``Runtime`` that knows it replaced a dead worker of the same id."""

    def __init__(self, config: DeployConfig, *, instance_id: str, life: int = 1,
                 clock: Clock | None = None, **kwargs: Any) -> None:
        clock = clock or MonotonicClock()
        super().__init__(config, clock=clock, instance_id=instance_id, **kwargs)
        self.life = life
        limits = config.limits
        self._lost_until = (clock.now() + limits.resume_grace_s + limits.session_ttl_s
                            if life > 1 else float("-inf"))

    def gone(self, session_id: str) -> DuplexError | None:
        """A resume that finds no session: ``engine_dead`` when a dead life of
        this worker may have held it (``RealtimeSessions`` asks)."""
        if not self._lost(session_id):
            return None
        return DuplexError(
            "engine_dead", f"session {session_id!r} ended: its worker "
            f"{self.manager.instance_id!r} died and was restarted", param="session_id",
            details={"owner_instance_id": self.manager.instance_id})

    def _lost(self, session_id: str) -> bool:
        return (owner_of(session_id) == self.manager.instance_id
                and self.clock.now() < self._lost_until)


def worker_runtime(config: DeployConfig, *, instance_id: str | None, slot: WorkerSlot | None,
                   life: int = 1) -> tuple[Runtime, Callable[[], None]]:
    """The worker's runtime and what to call once its server has stopped.
    With ``slot`` the ``vllm`` stage runs on the shared core (this blocks
    until the client has joined it)."""
    shared: dict[str, Any] = {}
    client = None
    if slot is not None:
        from vllm_duplex.stages.vllm.llm import VllmLlmStage

        spec = next(s for s in config.stages if s.type == "vllm")
        client = connect_client(spec.options, slot)
        shared["vllm"] = VllmLlmStage(engine=client, **spec.options)
    if instance_id is None:
        runtime: Runtime = Runtime(config, shared_stages=shared)
    else:
        runtime = WorkerRuntime(config, instance_id=instance_id, life=life, shared_stages=shared)

    def close() -> None:
        if client is not None:
            client.shutdown()  # the client only: the core belongs to the supervisor

    return runtime, close
