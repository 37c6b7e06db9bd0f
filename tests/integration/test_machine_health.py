"""/health says what the machine is and what was chosen for it, and the
choices are the ones running: the vLLM engine's dtype, Whisper's compute
type, vLLM's CPU binding (the default pipeline on the test session's engine).

Run as an AVX2 machine (``scripts/isa-cap.sh avx2``) the same test sees
float32; on a CPU with native bf16, bfloat16."""

from __future__ import annotations

import os

import httpx
import pytest
import pytest_asyncio
from support.speech_fixtures import cascade_runtime
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401
from vllm_duplex.domain.machine import detect
from vllm_duplex.realtime.server.serving import BackgroundServer

pytestmark = pytest.mark.asyncio(loop_scope="session")


@pytest_asyncio.fixture(scope="module", loop_scope="session")
async def server(vllm_stage):  # noqa: F811
    async with BackgroundServer(cascade_runtime(vllm_stage)) as srv:
        yield srv


async def test_health_reports_the_cpu_and_the_settings_that_run(server, vllm_stage):
    async with httpx.AsyncClient(base_url=server.http_url, timeout=30) as http:
        health = (await http.get("/health")).json()
    cpu, stages = health["machine"]["cpu"], health["machine"]["stages"]
    here = detect()
    assert (cpu["model"], cpu["cores"], cpu["isa"]) == (here.model, here.count, here.isa)
    dtype = stages["llm"]["dtype"]
    assert dtype == {"value": "bfloat16" if here.native_bf16 else "float32", "source": "machine",
                     "reason": dtype["reason"]}
    # What is reported is what the engine runs.
    assert str(vllm_stage.host.engine.model_config.dtype) == f"torch.{dtype['value']}"
    assert stages["llm"]["cpu_bind"]["value"] == os.environ["VLLM_CPU_OMP_THREADS_BIND"]
    asr = server.runtime.stages[1]
    assert stages["asr"]["compute_type"]["value"] == "int8"
    assert asr.model._fw.model.compute_type.startswith("int8")  # CTranslate2 says int8_float32
    threads = stages["asr"]["threads"]
    assert threads["source"] == "machine" and 1 <= threads["value"] <= max(1, here.count - 1)
