"""A session's chain of stage ports, and the pumps that move their outputs.

One pump task per port reads ``port.outputs()`` and hands every output to the
session's sink, as it appears. The pipeline never judges staleness: the
session's ``FenceGate`` is the one place stale outputs are dropped, and the
session calls ``forward`` for outputs the gate admitted and the policy chose
to pass on. Stages are addressed by name (their role: ``vad``, ``asr``,
``llm``, ``tts``...), never by position: the policy names where each output
goes (text deltas reach TTS while the LLM is still generating), and a
deployment is checked at load (``check_routes``) so that every name a policy
addresses is one stage that takes what is sent to it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.contracts import StageNeeds
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.payloads import StageFailed, StageInput, StageOutput
from vllm_duplex.stages.port import StagePort

log = logging.getLogger(__name__)

OutputSink = Callable[[StageOutput], Awaitable[None]]


def check_routes(stages: Sequence[Any], needs: StageNeeds) -> list[str]:
    """What is wrong with ``stages`` (objects with a ``name`` and the payload
    types they take, ``accepted``) for a policy that ``needs`` them: each
    name it addresses must be exactly one stage, taking what is sent to it.
    An empty list: the routes are sound."""
    by_name: dict[str, list[Any]] = {}
    for stage in stages:
        by_name.setdefault(stage.name, []).append(stage)
    problems = [f"{len(found)} stages are named {name!r} ({', '.join(type(s).__name__ for s in found)}): "
                "a stage is addressed by its name, so give all but one a `name:`"
                for name, found in by_name.items() if len(found) > 1]
    problems += [f"no stage is named {name!r}" for name in needs.names if name not in by_name]
    for name, kinds in needs.sends.items():
        for stage in by_name.get(name, ())[:1]:
            taken = getattr(stage, "accepted", None)
            refused = [k.__name__ for k in kinds if taken is not None and not issubclass(k, taken)]
            if refused:
                problems.append(f"stage {name!r} ({type(stage).__name__}) does not take "
                                f"{', '.join(refused)}")
    return problems


@dataclass
class PipelineStats:
    submitted: int = 0  # submissions made by the session (policy plans)
    forwarded: int = 0  # outputs passed on to the stage they were forwarded to (by name)
    outputs: int = 0  # outputs delivered to the sink (stage failures included)
    failures: int = 0  # pumps that stopped because their port raised


class Pipeline:
    """Ports in stream order, e.g. ``vad -> llm -> tts``."""

    def __init__(
        self, ports: Sequence[StagePort], sink: OutputSink, *, clock: Clock
    ) -> None:
        names = [p.name for p in ports]
        if len(set(names)) != len(names):
            raise ValueError(f"stage names must be unique in a pipeline, got {names}")
        self._ports: tuple[StagePort, ...] = tuple(ports)
        self._index = {p.name: i for i, p in enumerate(self._ports)}
        self._sink = sink
        self._clock = clock
        self._pumps: list[asyncio.Task[None]] = []
        # The newest fence seen; a pump failure is reported under it so that
        # the gate admits the failure instead of dropping it as stale.
        self._fence: Fence | None = None
        self._opened = False
        self._closed = False
        self._close_done = asyncio.Event()
        self.stats = PipelineStats()

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self._ports)

    @property
    def ports(self) -> tuple[StagePort, ...]:
        return self._ports

    @property
    def closed(self) -> bool:
        return self._closed

    def port(self, stage: str) -> StagePort:
        try:
            return self._ports[self._index[stage]]
        except KeyError:
            raise KeyError(
                f"unknown stage {stage!r}; this pipeline has: {', '.join(self.names) or 'none'}"
            ) from None

    # ---- lifecycle ---------------------------------------------------------

    async def open(self, fence: Fence) -> None:
        """Open every port, then start one pump per port."""
        if self._opened or self._closed:
            raise RuntimeError("a pipeline is opened once")
        self._opened = True
        self._fence = fence
        opened: list[StagePort] = []
        try:
            for port in self._ports:
                await port.open(fence)
                opened.append(port)
        except BaseException:
            # Do not leave half a pipeline holding engine resources.
            for port in reversed(opened):
                await self._close_port(port)
            self._closed = True
            self._close_done.set()
            raise
        for port in self._ports:
            self._pumps.append(
                asyncio.create_task(
                    self._pump(port), name=f"duplex-pump-{port.name}-{fence.session_id}"
                )
            )

    async def close(self) -> None:
        """Idempotent. Close every port (which stops its work and ends its
        outputs), then cancel and await the pumps, so no task outlives it."""
        if self._closed:
            await self._close_done.wait()
            return
        self._closed = True
        try:
            for port in self._ports:
                await self._close_port(port)
            me = asyncio.current_task()
            pumps = [t for t in self._pumps if t is not me]  # close() called from a sink
            for task in pumps:
                task.cancel()
            for result in await asyncio.gather(*pumps, return_exceptions=True):
                if isinstance(result, Exception):
                    log.error("pump ended with %r", result)
        finally:
            self._close_done.set()

    @staticmethod
    async def _close_port(port: StagePort) -> None:
        try:
            await port.close()
        except Exception:  # one broken port must not keep the others open
            log.exception("closing stage port %s failed", port.name)

    # ---- work --------------------------------------------------------------

    async def submit(self, stage: str, fence: Fence, role: str, payload: Any) -> str:
        """Send ``payload`` to ``stage`` under ``fence``; returns the request id."""
        port = self.port(stage)
        if self._closed:
            raise RuntimeError("pipeline is closed")
        request_id = fence.request_id(role)
        self._see(fence)
        await port.submit(StageInput(fence=fence, request_id=request_id, payload=payload))
        self.stats.submitted += 1
        return request_id

    async def forward(self, output: StageOutput, to: str) -> bool:
        """Pass ``output.payload`` to the stage called ``to``, keeping the fence
        and request id so that stage's outputs stay attributable (and
        abortable) with the original request. False: this pipeline has no
        such stage (a policy's optional stage, e.g. omni's ``tts``)."""
        i = self._index.get(to)
        if self._closed or i is None:
            return False
        await self._ports[i].submit(
            StageInput(fence=output.fence, request_id=output.request_id, payload=output.payload)
        )
        self.stats.forwarded += 1
        return True

    async def cancel(self, fence: Fence) -> None:
        """Abort, in every stage, the work that is older than ``fence``."""
        self._see(fence)
        # All ports at once: an abort costs a few loop turns per stage, and a
        # barge-in should not pay them one stage after another.
        results = await asyncio.gather(*(p.cancel(fence) for p in self._ports),
                                       return_exceptions=True)
        for port, result in zip(self._ports, results):
            if isinstance(result, BaseException):
                # Best effort across ports: the gate still drops whatever a
                # broken port keeps producing, and the others were aborted.
                log.error("cancel in stage %s failed: %r", port.name, result)

    def _see(self, fence: Fence) -> None:
        if self._fence is None or self._fence.is_stale_against(fence):
            if self._fence is None or fence.session_id == self._fence.session_id:
                self._fence = fence

    # ---- pumps -------------------------------------------------------------

    async def _pump(self, port: StagePort) -> None:
        outputs: AsyncIterator[StageOutput] | None = None
        while True:
            try:
                if outputs is None:
                    outputs = port.outputs().__aiter__()
                output = await outputs.__anext__()
            except StopAsyncIteration:
                return
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("stage %s failed; its pump stops", port.name)
                self.stats.failures += 1
                await self._deliver(self._failure(port, exc))
                return
            await self._deliver(output)

    async def _deliver(self, output: StageOutput) -> None:
        self.stats.outputs += 1
        try:
            await self._sink(output)
        except asyncio.CancelledError:
            raise
        except Exception:
            # A sink bug loses this one output; it must not silence the stage.
            log.exception("output sink raised on %s output", output.stage)

    def _failure(self, port: StagePort, exc: Exception) -> StageOutput:
        assert self._fence is not None  # pumps start after open
        error = DuplexError("stage_failed", f"stage {port.name!r} failed: {exc!r}")
        return StageOutput(
            fence=self._fence,
            request_id=self._fence.request_id("stage_failed"),
            stage=port.name,
            payload=StageFailed(error),
            created_at=self._clock.now(),
        )
