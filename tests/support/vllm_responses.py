"""vLLM's own OpenAI-compatible server (the app ``vllm serve`` builds: its
``/v1/responses``, tool calls parsed by its ``hermes`` parser) on the suite's
one shared engine, on loopback: a real external Responses backend for
GPT-Live's delegation tests without a second engine (a second ``vllm serve``
on SmolLM2 took 148-269 s to start and ~4 GiB on the 2-core CI machine).
The app is vLLM's (``build_app`` + ``init_app_state``, as its launcher
calls them); only the engine under it is the one the suite already runs."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import uvicorn
from vllm_duplex.assets.prepare import prepared_model_dir
from vllm_duplex.domain.backends import ResponsesBackend
from vllm_duplex.realtime.server.serving import free_port

HOST = "127.0.0.1"


@asynccontextmanager
async def vllm_responses_backend(engine_client, *, timeout_s: float = 120.0
                                 ) -> AsyncIterator[ResponsesBackend]:
    from vllm.entrypoints.launchers.api_server.app_state import init_app_state
    from vllm.entrypoints.launchers.app import build_app
    from vllm.entrypoints.launchers.cli_args import make_arg_parser
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    args = make_arg_parser(FlexibleArgumentParser()).parse_args([
        "--model", str(prepared_model_dir()), "--served-model-name", "smollm2",
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes"])
    app = build_app(args, ("generate",))
    await init_app_state(engine_client, app.state, args, ("generate",))
    port = free_port(HOST)
    # lifespan off: the engine is the suite's, started and stopped by its fixture
    server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=port, log_level="warning",
                                           lifespan="off"))
    task = asyncio.create_task(server.serve(), name="test-vllm-responses")
    while not server.started:
        if task.done():
            task.result()
        await asyncio.sleep(0.02)
    try:
        yield ResponsesBackend("vllm", f"http://{HOST}:{port}/v1", "smollm2",
                               timeout_s=timeout_s)
    finally:
        server.should_exit = True
        await task
