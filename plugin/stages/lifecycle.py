"""What the host may ask of a shared stage beyond its ports: its lifecycle and
its counters, as typed protocols.

One server process starts every stage before the first session (so nobody
waits for a vLLM engine to build), asks each whether it can serve
(``/health``), shows its counters (``/metrics``) and closes the stages it
built. A stage says it takes part by implementing these protocols —
explicitly, through a base class (``StageBase`` implements both, the vLLM
stages their own) — instead of the host probing for attributes it happens to
find:

* ``Lifecycle``: ``start`` (idempotent, may take long: build engines, load
  models), ``close`` (free threads, processes, engines; idempotent) and
  ``healthy`` (False while the stage cannot serve, e.g. its engine died).
  ``AlwaysReady`` is the lifecycle of a stage with nothing to build or free.
* ``Metered``: ``counters()``, the stage's current values of the
  ``StageCounter``s it publishes. The set of counters a stage publishes never
  changes; ``/metrics`` shows each as ``duplex_stage_<counter>{stage=<name>}``.
* ``ServesText``: the stage the HTTP text surfaces run on (the vLLM LLM stage
  says ``serves_text = True``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import ClassVar, Protocol, runtime_checkable


@runtime_checkable
class Lifecycle(Protocol):
    async def start(self) -> None: ...

    async def close(self) -> None: ...

    @property
    def healthy(self) -> bool: ...


class AlwaysReady(Lifecycle):
    """A stage with nothing to start or close, always able to serve."""

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None

    @property
    def healthy(self) -> bool:
        return True


class StageCounter(enum.Enum):
    """A counter a stage may publish; the value is its name in ``/metrics``."""

    ABORTED_REQUESTS = "aborted_requests"
    ACTIVE_REQUESTS = "active_requests"
    ENGINE_RESTARTS = "engine_restarts"

    @property
    def metric(self) -> str:
        return f"duplex_stage_{self.value}"

    @property
    def help(self) -> str:
        return _HELP[self]


_HELP = {
    StageCounter.ABORTED_REQUESTS: "Stage requests (aborted), by stage",
    StageCounter.ACTIVE_REQUESTS: "Stage requests (active), by stage",
    StageCounter.ENGINE_RESTARTS: "Engines rebuilt after they died, by stage",
}


@runtime_checkable
class Metered(Protocol):
    def counters(self) -> Mapping[StageCounter, float]:
        """The current value of every counter this stage publishes."""
        ...


@runtime_checkable
class MachineTuned(Protocol):
    def machine_settings(self) -> Mapping[str, object]:
        """The settings this stage took from the machine or its config, each
        with its source (``domain/machine.py``): what ``/health`` reports."""
        ...


@runtime_checkable
class Hears(Protocol):
    def languages(self) -> frozenset[str] | None:
        """The spoken languages this ASR stage transcribes (ISO-639-1 codes,
        as a session's ``transcription.language`` names them); None: any."""
        ...


@runtime_checkable
class ServesText(Protocol):
    serves_text: ClassVar[bool]
