"""Close reasons are wire contract: their texts, their WebSocket close codes
(docs/errors.md), and the labels of ``duplex_sessions_closed_total``."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.errors import ERRORS

DOCS = Path(__file__).resolve().parents[2] / "docs" / "errors.md"


def documented_codes() -> dict[str, int]:
    """reason -> close code, from the close-code table of docs/errors.md."""
    table = DOCS.read_text().split("## WebSocket close codes", 1)[1]
    codes: dict[str, int] = {}
    for code, reasons in re.findall(r"^\| (\d{4}) \| ([^|]*)\|", table, re.M):
        for reason in re.findall(r"`([a-z_]+)`", reasons):
            codes.setdefault(reason, int(code))
    return codes


@pytest.mark.parametrize("reason", [r for r in CloseReason if r is not CloseReason.START_FAILED])
def test_every_reason_a_socket_can_see_is_documented_with_its_code(reason):
    assert documented_codes()[reason.value] == reason.code


def test_the_wire_values_did_not_move():
    assert {r.value: r.code for r in CloseReason} == {
        "client": 1000, "disconnect": 1000, "expired": 1000, "shutdown": 1001,
        "slow_consumer": 1008, "engine_dead": 1011, "start_failed": 1000, "hangup": 1000,
        "max_duration": 1000, "moved": 4009}


def test_every_terminal_error_names_a_close_reason():
    """A terminal stage error closes the session with ``CloseReason(code)``."""
    for spec in ERRORS.values():
        if spec.terminal:
            assert CloseReason(spec.code).value == spec.code


def test_the_manager_s_plain_strings_are_reasons():
    assert CloseReason("expired") is CloseReason.EXPIRED and CloseReason.SHUTDOWN == "shutdown"
    assert f"{CloseReason.SLOW_CONSUMER}" == "slow_consumer"
    with pytest.raises(ValueError):
        CloseReason("bye")
