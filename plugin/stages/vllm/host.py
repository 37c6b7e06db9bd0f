"""``EngineHost``: the one owner of a vLLM engine for everything that runs on
it -- the realtime LLM and omni ports, application-session turns and the
stateless generate step.

It builds the ``AsyncLLM`` (in a worker thread: that takes tens of seconds and
must not stall the event loop) or borrows a running engine (``vllm serve``'s,
which its owner starts, restarts and stops), warms it up, and with a built
engine runs the ``EngineSupervisor`` that rebuilds it when it dies. It holds the
tokenizer and chat template, mints vLLM request ids (a ``Fence.request_id`` plus
a unique suffix, so every request in the engine is attributable to its session
and fence), and keeps the one set of counters ``/metrics`` reads.

``HostedStage`` is the stage side: a shared stage object built around one host
(``VllmLlmStage``, ``VllmOmniStage``), with the host's lifecycle and counters.
"""

from __future__ import annotations

import os

from vllm_duplex.domain.machine import MachineChoices, choose, detect

# An operator's own values win; model hubs are unreachable at run time (the
# model is a local path or already in the local Hugging Face cache).
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The machine's settings for the engine (domain/machine.py), chosen before vLLM
# reads its environment: its CPU worker's OpenMP threads are bound to the
# cores left over from the speech stages, unless the operator bound them.
MACHINE: MachineChoices = choose(detect(), os.environ)
os.environ.setdefault("VLLM_CPU_OMP_THREADS_BIND", str(MACHINE.vllm_cpu_bind.value))

# ruff: noqa: E402  (the imports below must follow the environment default)
import asyncio
import itertools
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from vllm import SamplingParams
from vllm.engine.protocol import EngineClient, StreamingInput
from vllm.outputs import RequestOutput
from vllm.sampling_params import RequestOutputKind
from vllm_duplex.domain.clock import Clock, MonotonicClock
from vllm_duplex.stages.vllm.chat import ChatTemplate
from vllm_duplex.stages.lifecycle import Lifecycle, Metered, StageCounter
from vllm_duplex.stages.vllm.supervisor import EngineSupervisor, build_in_thread

log = logging.getLogger(__name__)

T = TypeVar("T")

# How long a restart waits for vLLM to fail the dead engine's requests before
# it shuts that engine down anyway (``EngineHost._retire``).
FAN_OUT_GRACE_S = 5.0
# How long a shutdown waits for the engine's process to exit by itself. vLLM's
# default (5 s) is less than it takes on a loaded 2-core machine (its worker
# alone took 4 s, measured); then vLLM SIGKILLs it and returns without reaping
# it, so the process is still there when the stage says it closed.
ENGINE_EXIT_S = 30.0


def prefill_params(logprobs: int | None = None) -> SamplingParams:
    """A chunk that only fills the KV: one greedy token, which vLLM drops when
    the next chunk arrives. ``detokenize=False``: see ``decode.py``.
    ``logprobs``: the top ones of that token's distribution come back (the
    turn-end probe, ``live.Probe``)."""
    return SamplingParams(max_tokens=1, temperature=0.0, detokenize=False, logprobs=logprobs,
                          output_kind=RequestOutputKind.DELTA)


@dataclass(frozen=True)
class EngineSettings:
    """How to build an engine. ``model`` None: the prepared SmolLM2. On CPU
    ``dtype`` None is the machine's (``domain/machine.py``: bfloat16 where the
    CPU computes it natively, float32 where not) and the engine is eager (no
    compile time); GPUs keep vLLM's own (``auto``)."""

    model: str | None = None
    dtype: str | None = None
    enforce_eager: bool | None = None
    max_model_len: int = 2048
    enable_prefix_caching: bool = True
    engine_kwargs: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> EngineSettings:
        """The engine options of a ``vllm`` stage's config (the rest are the
        stage's own: sampling defaults, tool constraints, restart policy)."""
        known = {k: options[k] for k in ENGINE_OPTIONS if options.get(k) is not None}
        return cls(**known)

    def engine_args(self) -> Any:
        """The ``AsyncEngineArgs`` to build from. One function for the stage
        and the shared engine core: supervisor and workers must build the same
        ``VllmConfig``."""
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.platforms import current_platform

        model = self.model
        if model is None:
            from vllm_duplex.assets.prepare import prepared_model_dir

            model = str(prepared_model_dir())
        cpu = current_platform.is_cpu()
        return AsyncEngineArgs(
            model=str(model),
            dtype=self.dtype or (str(MACHINE.llm_dtype.value) if cpu else "auto"),
            enforce_eager=cpu if self.enforce_eager is None else self.enforce_eager,
            max_model_len=self.max_model_len,
            enable_prefix_caching=self.enable_prefix_caching,
            **dict(self.engine_kwargs),
        )


    def machine_settings(self) -> dict[str, object]:
        """What ``/health`` and the start-up line report: the dtype and the
        CPU binding, each with where it came from (machine, config, env)."""
        from vllm.platforms import current_platform

        if not current_platform.is_cpu():
            return {"dtype": {"value": self.dtype or "auto", "source": "config" if self.dtype
                              else "vllm", "reason": "GPU"}}
        chosen = choose(MACHINE.cpu, {}, dtype=self.dtype)
        return {"dtype": chosen.llm_dtype.to_json(), "cpu_bind": MACHINE.vllm_cpu_bind.to_json()}


# The options of a ``vllm`` stage that configure its engine.
ENGINE_OPTIONS = ("model", "dtype", "enforce_eager", "max_model_len", "enable_prefix_caching",
                  "engine_kwargs")


@dataclass
class RequestCounts:
    """vLLM requests of one kind: running now, aborted, finished replies, failures."""

    active: int = 0
    aborted: int = 0
    completed: int = 0
    failed: int = 0


@dataclass
class HostCounters:
    """Everything ``/metrics`` reads about one host. ``live``: the sessions'
    streaming-input requests (realtime, omni, application sessions); ``steps``:
    stateless generate requests. The three turn-start counters say how a reply
    found its session's live request: extended (``fast_paths``), diverged and
    re-prefilled (``rebuilds``), or absent (``fresh_prefills``)."""

    live: RequestCounts = field(default_factory=RequestCounts)
    steps: RequestCounts = field(default_factory=RequestCounts)
    fast_paths: int = 0
    rebuilds: int = 0
    fresh_prefills: int = 0


class EngineHost:
    """One engine (built from ``settings`` or the borrowed ``engine``) and what
    every user of it shares. ``warm_prompt`` makes the warm-up prompt from the
    chat template (default: the text "Hi"), or a list of them: the chunks of
    one streaming-input request."""

    def __init__(self, name: str, settings: EngineSettings, *, engine: EngineClient | None = None,
                 clock: Clock | None = None, restart_on_failure: bool = True,
                 restart_backoff_s: float = 1.0,
                 warm_prompt: Callable[[ChatTemplate], Any] | None = None,
                 build_engine: Callable[[EngineSettings], EngineClient] | None = None) -> None:
        self.name = name
        self.settings = settings
        self.clock = clock or MonotonicClock()
        self.counters = HostCounters()
        # Top logprobs on every chunk of a streaming request (None: none). The
        # LLM stage reads P(end of turn) from them; every chunk asks for the
        # same, since vLLM 0.32 sets a request's logprobs up from its first chunk.
        self.probe_logprobs: int | None = None
        self.engine_start_s: float | None = None
        self._engine = engine
        self._owns_engine = engine is None
        self._chat: ChatTemplate | None = None
        self._warm_prompt = warm_prompt
        self._build = build_engine or _build_async_llm
        self._start_lock = asyncio.Lock()
        self._ids = itertools.count()
        self.restart_on_failure = restart_on_failure and self._owns_engine
        self.supervisor = EngineSupervisor(
            f"stage {name}", is_dead=lambda: self._engine is not None and self._engine.errored,
            restart=self._restart, clock=self.clock, backoff_s=restart_backoff_s)

    # ---- what users read -------------------------------------------------

    @property
    def engine(self) -> EngineClient:
        if self._engine is None:
            raise RuntimeError(f"stage {self.name!r} is not started")
        return self._engine

    @property
    def healthy(self) -> bool:
        """For ``/health``: False once the engine died (until a restart
        replaced it) or before it started."""
        return self._engine is not None and not self._engine.errored

    @property
    def chat(self) -> ChatTemplate:
        if self._chat is None:
            raise RuntimeError(f"stage {self.name!r} is not started")
        return self._chat

    @property
    def max_model_len(self) -> int:
        return self.settings.max_model_len

    def machine_settings(self) -> dict[str, object]:
        """The engine's machine settings for ``/health``: a borrowed engine
        (``vllm serve``'s) runs as its own flags say."""
        if not self._owns_engine and self._engine is not None:
            dtype = str(self._engine.model_config.dtype).removeprefix("torch.")
            return {"dtype": {"value": dtype, "source": "engine", "reason": "the served engine's"}}
        return self.settings.machine_settings()

    def request_id(self, base: str) -> str:
        """A vLLM request id: ``base`` (a ``Fence.request_id``) made unique."""
        return f"{base}.{next(self._ids)}"

    @staticmethod
    async def off_loop(fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)`` in a worker thread (chat templates, long tokenizations)."""
        return await asyncio.to_thread(fn, *args)

    # ---- requests ----------------------------------------------------------

    def generate(self, prompt: Any, params: SamplingParams, request_id: str
                 ) -> AsyncIterator[RequestOutput]:
        return self.engine.generate(prompt, params, request_id)

    async def abort(self, request_ids: Sequence[str]) -> None:
        """Abort ``request_ids``; a dead engine has nothing left to abort."""
        if not request_ids:
            return
        try:
            await self.engine.abort(list(request_ids))
        except Exception:
            log.debug("abort of %s failed", request_ids, exc_info=True)

    async def render(self, prompt: dict[str, Any]) -> Any:
        """A prompt dict (text with multimodal placeholders and data) as an
        engine input, rendered by the engine's renderer (its tokenizer and
        multimodal processor run in its worker threads). Chunks continue a
        context: no BOS or other special tokens are added."""
        renderer = self.engine.renderer
        params = renderer.default_cmpl_tok_params.with_kwargs(add_special_tokens=False)
        (engine_input,) = await renderer.render_cmpl_async([prompt], params)
        return engine_input

    # ---- lifecycle ---------------------------------------------------------

    async def start(self) -> None:
        """Build (or take) the engine, load its tokenizer, warm it up; idempotent."""
        async with self._start_lock:
            if self._chat is not None:
                return
            started = time.monotonic()
            if self._engine is None:
                self._engine = await build_in_thread(self._build_engine, _shut_down)
            self._chat = ChatTemplate(self._engine.get_tokenizer())
            await self._warm_up(self._engine)
            self.engine_start_s = time.monotonic() - started
            log.info("stage %s: engine ready in %.1f s", self.name, self.engine_start_s)
            if self.restart_on_failure:
                self.supervisor.start()

    async def _warm_up(self, engine: EngineClient) -> None:
        # Through the engine before any session: starts its output handler on
        # this loop (it must exist before sessions) and proves the engine
        # works. A list of prompts goes as the chunks of one streaming-input
        # request, with the logprobs every live request asks for.
        prompt = self._warm_prompt(self.chat) if self._warm_prompt else {"prompt": "Hi"}
        request_id = f"duplex-warmup.{uuid.uuid4().hex}"
        if not isinstance(prompt, list):
            async for _ in engine.generate(prompt, prefill_params(), request_id):
                pass
            return
        params = prefill_params(self.probe_logprobs)

        async def chunks() -> AsyncIterator[StreamingInput]:
            for chunk in prompt:
                yield StreamingInput(chunk, params)

        async for _ in engine.generate(chunks(), params, request_id):
            pass

    async def _restart(self) -> None:
        """The supervisor's: replace the dead engine with a new, warm one. The
        dead one stays ``engine`` (unhealthy; new work fails at once with
        ``engine_dead``) until the swap."""
        started = time.monotonic()
        log.warning("stage %s: the vLLM engine died; restarting it", self.name)
        if self._engine is not None:
            await self._retire(self._engine)
        engine = await build_in_thread(self._build_engine, _shut_down)
        try:
            await self._warm_up(engine)
        except BaseException:
            _shut_down(engine)
            raise
        self._engine = engine
        self.engine_start_s = time.monotonic() - started
        log.warning("stage %s: engine restarted in %.1f s", self.name, self.engine_start_s)

    async def _retire(self, dead: EngineClient) -> None:
        """Shut the dead engine's client side down once vLLM has failed its
        running requests, in a worker thread.

        vLLM learns of the death twice: its monitor thread sets ``errored``
        (what the supervisor polls) at once; then its output handler, a task
        on this loop, fails every running request with ``EngineDeadError``
        and ends (``is_running`` turns False). ``shutdown`` cancels that
        handler: called in between, it left every request waiting for ever
        and their sessions never got ``engine_dead`` (a flaky run of
        ``test_engine_faults``). The wait is bounded (``FAN_OUT_GRACE_S``):
        a handler that never ends must not stop the restart. The shutdown
        joins processes: never on the loop."""
        deadline = self.clock.now() + FAN_OUT_GRACE_S
        while dead.is_running and self.clock.now() < deadline:
            await self.clock.sleep(self.supervisor.poll_s)
        if dead.is_running:
            log.warning("stage %s: the dead engine had not failed its requests after %.1f s; "
                        "shutting it down anyway", self.name, FAN_OUT_GRACE_S)
        await asyncio.to_thread(_shut_down, dead)

    def _build_engine(self) -> EngineClient:
        return self._build(self.settings)

    async def close(self) -> None:
        """Stop the engine if this host built it (a borrowed one is its
        owner's). Synchronous shutdown on purpose: from a worker thread the
        output handler would see the engine die first and log a spurious
        EngineDeadError; this runs once, at process end."""
        await self.supervisor.close()  # first: no restart after this
        if self._owns_engine and self._engine is not None:
            engine, self._engine = self._engine, None
            _shut_down(engine)


def _shut_down(engine: EngineClient) -> None:
    """Stop ``engine``; when this returns its process has exited (within
    ``ENGINE_EXIT_S``)."""
    engine.shutdown(timeout=ENGINE_EXIT_S)


def _build_async_llm(settings: EngineSettings) -> EngineClient:
    from vllm.v1.engine.async_llm import AsyncLLM

    return AsyncLLM.from_engine_args(settings.engine_args())


class HostedStage(Lifecycle, Metered):
    """A shared stage built around one ``EngineHost``: one engine for every
    session's port, started once, its counters shared by all ports."""

    accepted: ClassVar[tuple[type, ...]] = ()
    host: EngineHost

    @property
    def name(self) -> str:
        return self.host.name

    def machine_settings(self) -> dict[str, object]:
        return self.host.machine_settings()

    @property
    def clock(self) -> Clock:
        return self.host.clock

    @property
    def engine(self) -> EngineClient:
        return self.host.engine

    @property
    def healthy(self) -> bool:
        return self.host.healthy

    @property
    def max_model_len(self) -> int:
        return self.host.max_model_len

    @property
    def engine_start_s(self) -> float | None:
        return self.host.engine_start_s

    async def start(self) -> None:
        await self.host.start()

    async def close(self) -> None:
        """What ``Runtime.stop`` calls on every stage."""
        await self.host.close()

    # ---- counters (/metrics) ----------------------------------------------

    @property
    def active_requests(self) -> int:
        return self.host.counters.live.active

    @property
    def aborted_requests(self) -> int:
        return self.host.counters.live.aborted

    @property
    def completed_requests(self) -> int:
        return self.host.counters.live.completed

    @property
    def failed_requests(self) -> int:
        return self.host.counters.live.failed

    @property
    def engine_restarts(self) -> int:
        return self.host.supervisor.restarts

    @property
    def fast_paths(self) -> int:
        return self.host.counters.fast_paths

    @property
    def rebuilds(self) -> int:
        return self.host.counters.rebuilds

    @property
    def fresh_prefills(self) -> int:
        return self.host.counters.fresh_prefills

    def counters(self) -> dict[StageCounter, float]:  # Metered: /metrics
        return {StageCounter.ABORTED_REQUESTS: self.aborted_requests,
                StageCounter.ACTIVE_REQUESTS: self.active_requests,
                StageCounter.ENGINE_RESTARTS: self.engine_restarts}
