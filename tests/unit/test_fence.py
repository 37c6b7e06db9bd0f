"""Fence ordering, bumps, staleness, and the request ids that carry a fence."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from vllm_duplex.domain.fence import Fence, parse_request_id

ROLES = st.from_regex(r"[A-Za-z0-9_-]+", fullmatch=True)
COUNTS = st.integers(min_value=0, max_value=10**12)


def test_fences_order_by_incarnation_then_epoch() -> None:
    a = Fence("s", 0, 5)
    b = Fence("s", 1, 0)
    c = Fence("s", 1, 1)
    assert a < b < c
    assert sorted([c, a, b]) == [a, b, c]
    assert Fence("s", 2, 3) == Fence("s", 2, 3)


def test_bumps_grow() -> None:
    f = Fence("s", 2, 7)
    e = f.next_epoch()
    i = f.next_incarnation()
    assert (e.incarnation, e.epoch) == (2, 8)
    assert (i.incarnation, i.epoch) == (3, 8)
    assert f < e and f < i and e < i
    assert e.session_id == i.session_id == "s"


def test_is_stale_against() -> None:
    f = Fence("s", 1, 1)
    assert f.is_stale_against(f.next_epoch())
    assert f.is_stale_against(f.next_incarnation())
    assert not f.is_stale_against(f)
    assert not f.next_epoch().is_stale_against(f)  # newer work is never stale
    assert f.is_stale_against(Fence("other", 0, 0))  # another session's work


def test_wire() -> None:
    assert Fence("s", 3, 4).wire() == {"incarnation": 3, "epoch": 4}


def test_request_id_shape() -> None:
    rid = Fence("sess", 1, 2).request_id("llm")
    assert rid.startswith("duplex-s.") and rid.endswith(".i.1.e.2.r.llm")


@pytest.mark.parametrize("role", ["", "a.b", "a b", "é", "x/y"])
def test_request_id_rejects_bad_roles(role: str) -> None:
    with pytest.raises(ValueError):
        Fence("s").request_id(role)


@given(sid=st.text(), inc=COUNTS, epoch=COUNTS, role=ROLES)
def test_request_id_round_trip(sid: str, inc: int, epoch: int, role: str) -> None:
    fence = Fence(sid, inc, epoch)
    assert parse_request_id(fence.request_id(role)) == (fence, role)


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        "duplex-s..i.0.e.0.r.",
        "duplex-s.c2Vzcw.i.01.e.0.r.x",  # leading zero
        "duplex-s.c2Vzcw.i.-1.e.0.r.x",
        "duplex-s.c2Vzcw==.i.0.e.0.r.x",  # padding is not canonical
        "duplex-s.c2Vzcx.i.0.e.0.r.x",  # non-canonical trailing bits
        "duplex-s.A.i.0.e.0.r.x",  # impossible base64 length
        "duplex-s._w.i.0.e.0.r.x",  # decodes to invalid UTF-8
        "cmpl-1234",
    ],
)
def test_parse_rejects_garbage(garbage: str) -> None:
    with pytest.raises(ValueError):
        parse_request_id(garbage)


@given(st.text())
def test_parse_random_text_raises_only_value_error(text: str) -> None:
    try:
        fence, role = parse_request_id(text)
    except ValueError:
        return
    assert fence.request_id(role) == text  # anything accepted is canonical


@given(sid=st.text(), inc=COUNTS, epoch=COUNTS, role=ROLES, suffix=st.text(min_size=1))
def test_parse_rejects_mangled_ids(sid: str, inc: int, epoch: int, role: str, suffix: str) -> None:
    rid = Fence(sid, inc, epoch).request_id(role) + suffix
    try:
        fence, parsed_role = parse_request_id(rid)
    except ValueError:
        return
    assert fence.request_id(parsed_role) == rid  # e.g. the suffix extended the role
