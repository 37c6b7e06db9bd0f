"""The soak (``bench/soak.py``) as a test: 10 minutes of realtime sessions on
the default pipeline -- sequential and overlapping, pauses, interruptions,
backchannels, clients that vanish -- with ``/health`` polled every 250 ms.
Run with ``-m soak`` (CI runs the quick suites; this takes ~12 minutes).

It asserts what does not depend on the machine: every question is answered,
no stall is blamed on code on the loop (a busy machine's are its own, and
named so), and nothing is left behind (sessions, tasks, memory). The /health
latencies are measured, not asserted: they are the bench's figures.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

pytestmark = pytest.mark.soak


async def test_ten_minutes_of_sessions_never_freeze_the_server():
    import soak

    out = await soak.soak(argparse.Namespace(minutes=10.0, lanes=2, config="cascade-cpu", seed=1))
    soak.report(out)
    failed = [s for s in out["sessions"] if s["status"] not in ("answered", "vanished")]
    assert not failed, failed
    assert out["answered"] == out["asked"] > 20
    assert out["loop_lag"]["stalls"]["blocked"] == 0, out["loop_lag"]["warnings"]
    assert out["sessions_live_after"] == 0
    assert out["tasks_after"] <= out["tasks_before"]
    assert out["rss_after_mib"] <= 1.10 * out["rss_before_mib"]
