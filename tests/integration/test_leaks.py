"""Nothing leaks across session churn (issue 5, item 6): realtime sessions on
the embedded default (real vLLM) opened, used, closed, cancelled, dropped
mid-reply, abandoned, resumed and expired → no session, no vLLM request and no
asyncio task left, and RSS back within 10% of where it started.

CI runs 100 sessions; ``bash scripts/test.sh -m soak tests/test_leaks.py`` runs 1,000.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from vllm_duplex.host.deploy import load_config
from vllm_duplex.host.runtime import Runtime
from vllm_duplex.realtime.server.serving import BackgroundServer
from support.vllm_fixtures import no_leaked_tasks  # noqa: F401

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
from lib.churn import FATES, churn, rss_bytes, settle  # noqa: E402

pytestmark = pytest.mark.asyncio(loop_scope="session")


def churn_runtime(vllm_stage) -> Runtime:  # noqa: F811
    config = load_config("cascade-cpu")
    # The churn holds more sessions at once than the voice ceiling admits
    # (test_capacity*.py test that): leaks, not admission, are the subject here.
    limits = dataclasses.replace(config.limits, max_sessions=64, resume_grace_s=1.0,
                                 max_voice_sessions=None)
    return Runtime(dataclasses.replace(config, limits=limits), shared_stages={"vllm": vllm_stage})


async def check_churn(vllm_stage, sessions: int) -> None:  # noqa: F811
    async with BackgroundServer(churn_runtime(vllm_stage)) as server:
        runtime = server.runtime
        warm = await churn(server.ws_url, 2 * len(FATES))  # first use allocates caches and pools
        assert not warm.errors, warm.errors
        assert await settle(runtime)
        before = rss_bytes()
        result = await churn(server.ws_url, sessions)
        assert not result.errors, result.errors[:5]
        assert sum(result.fates.values()) == sessions
        assert await settle(runtime), (len(runtime.manager), vllm_stage.active_requests)
        after = rss_bytes()
        stats = runtime.manager.stats()
        assert stats["expired_total"] >= 2 * sessions // len(FATES)  # abrupt + abandoned expired
        assert runtime.journal_budget.used == 0  # every journal freed
        assert vllm_stage.engine.get_num_unfinished_requests() == 0
        assert after <= before * 1.10, f"RSS {before / 2**20:.0f} -> {after / 2**20:.0f} MiB"


async def test_churn_of_100_sessions_leaves_nothing_behind(vllm_stage):  # noqa: F811
    await check_churn(vllm_stage, 100)


@pytest.mark.soak
async def test_churn_of_1000_sessions_leaves_nothing_behind(vllm_stage):  # noqa: F811
    await check_churn(vllm_stage, 1000)
