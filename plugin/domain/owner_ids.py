"""Ids that name their owner: ``<kind>_<24 random url-safe chars>.<owner>``.

Every id a server mints for something that lives in one process — a realtime
session, an application session, a generation's request id — ends with the
instance id of its owner (``sess_Zk3…Qw.w2``, ``gen_…​.m2w3``), so a router can
send every later request that names it to that owner exactly (an nginx
``map`` on the owner part; see ``vllm_duplex.fleet.router``), and the owner can
refuse one that reached it by mistake. Ids a client chooses carry no owner;
a client names the owner of those in the ``Duplex-Owner-Instance`` header.

A *routable* owner is 1–32 ASCII letters and digits (``w1``, ``m2w3``): the
router's regex accepts exactly these, so an id whose owner part is anything
else never matches a route and is refused there, never routed at random.
"""

from __future__ import annotations

import re
import secrets

from vllm_duplex.domain.errors import DuplexError

OWNER_HEADER = "Duplex-Owner-Instance"
ROUTABLE_OWNER = re.compile(r"[A-Za-z0-9]{1,32}")
# The same shape as the router's (vllm_duplex.fleet.router.MINTED_ID_REGEX).
_MINTED = re.compile(r"(?P<kind>[a-z]+)_[A-Za-z0-9_-]{24}\.(?P<owner>[A-Za-z0-9]{1,32})")


def mint(kind: str, owner: str) -> str:
    """A fresh id of ``kind`` (``sess``, ``gen``) owned by ``owner``. An owner
    that is not routable still gets an id (a lone server needs no router),
    but no router will ever find it by its id."""
    if not kind.isalpha() or not kind.islower():
        raise ValueError(f"id kind must be lowercase letters, not {kind!r}")
    return f"{kind}_{secrets.token_urlsafe(18)}.{owner}"


def owner_of(any_id: str) -> str | None:
    """The routable owner a minted id names; None for every other id."""
    m = _MINTED.fullmatch(any_id)
    return m.group("owner") if m else None


def check_routable(owner: str) -> str:
    """An owner id a router can route to (``ValueError`` otherwise)."""
    if not ROUTABLE_OWNER.fullmatch(owner):
        raise ValueError(f"instance id {owner!r} is not routable: use 1-32 letters and digits "
                         "(w1, m2w3)")
    return owner


def check_routed_id(routed: str | None, named: str, param: str = "session_id") -> None:
    """A request routed by an id outside its body (``/v1/realtime?resume=1&
    session_id=<id>``: browsers cannot set WebSocket headers, so the router
    reads the query) must name the same id in its body (``session.resume``);
    otherwise the router chose the owner of another session. No routed id
    (a direct connection) is fine."""
    if routed is not None and routed != named:
        raise DuplexError("invalid_value", f"the {param} in the URL ({routed!r}) is not the one "
                          f"this request names ({named!r})", param=param)
