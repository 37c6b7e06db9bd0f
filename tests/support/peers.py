"""Running another project's own test suite (tests/peers) against a server a
test started, and reading back each of its tests' outcome.

The peer suites run unmodified in the clients' virtualenv (their imports are
the client libraries'); ``drivers/peer_observer.py`` rides along as a pytest
plugin and writes down what crossed the socket per test. The outcomes come
from pytest's junit XML, not from its exit status: the wrapper decides which
of their tests must pass here (they check the wire) and which depend on a
model more capable than ours.
"""

from __future__ import annotations

import asyncio
import json
import os
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from support.clients import CLIENT_PYTHON, DRIVERS, ROOT, require_clients_env

PEERS = ROOT / "tests" / "peers"


@dataclass
class Outcome:
    outcome: str  # passed | failed | error | skipped
    message: str = ""
    seconds: float = 0.0
    seen: dict[str, Any] = field(default_factory=dict)  # peer_observer's notes

    def explain(self) -> str:
        """What a failing wrapper test prints: their message and what the socket carried."""
        said = self.seen.get("said")
        return (f"{self.outcome} in {self.seconds:.1f} s: {self.message[:1500]}\n"
                f"model said: {said!r}\nheard: {self.seen.get('heard')!r}\n"
                f"calls: {self.seen.get('calls')!r}\nerrors: {self.seen.get('errors')!r}\n"
                f"events: {self.seen.get('sequence')!r}")


def read_junit(path: Path) -> dict[str, Outcome]:
    """``{test name with its parameters: Outcome}`` from pytest's junit XML."""
    outcomes = {}
    for case in ET.parse(path).iter("testcase"):
        outcome, message = "passed", ""
        for child in case:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = child.get("message") or (child.text or "")
        outcomes[case.get("name")] = Outcome(outcome, message, float(case.get("time") or 0))
    return outcomes


async def run_peer_pytest(folder: str, *args: str, env: dict[str, str], tmp: Path,
                          timeout: float) -> tuple[dict[str, Outcome], str]:
    """Run ``pytest *args`` in ``tests/peers/<folder>`` with the clients' Python;
    each test's Outcome, and the run's output tail (for a run that broke).

    Asynchronous: the server under test runs in this event loop."""
    require_clients_env()
    junit, observed = tmp / "junit.xml", tmp / "observed.json"
    for stale in (junit, observed):  # a run that breaks early must not be read as an old one's
        stale.unlink(missing_ok=True)
    proc = await asyncio.create_subprocess_exec(
        str(CLIENT_PYTHON), "-m", "pytest", "-p", "no:cacheprovider", "-p", "peer_observer",
        f"--junitxml={junit}", "-rA", *args,
        cwd=str(PEERS / folder), stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(DRIVERS), "PEER_OBSERVER_OUT": str(observed),
             "PYTHONUNBUFFERED": "1", **env})
    try:
        out, _ = await asyncio.wait_for(proc.communicate(), timeout)
    except TimeoutError:
        proc.kill()
        await proc.wait()
        raise AssertionError(f"the {folder} suite did not finish within {timeout:g} s") from None
    tail = out.decode(errors="replace")[-6000:]
    if not junit.exists():
        raise AssertionError(f"the {folder} suite exited {proc.returncode} with no report:\n{tail}")
    outcomes = read_junit(junit)
    notes = json.loads(observed.read_text()) if observed.exists() else {}
    for nodeid, seen in notes.items():
        name = nodeid.rpartition("::")[2]
        if name in outcomes:
            outcomes[name].seen = seen
    return outcomes, tail
