"""Which local addresses WebRTC calls gather ICE host candidates on.

aiortc gathers through aioice, which offers every address of every interface
except loopback, and has no parameter to choose (aiortc/aioice#2, open since
2018). A deployment must choose: on this project's machines only loopback is
reachable, and a server behind a known address should not offer the others.
So the one function aioice asks (``aioice.ice.get_host_addresses``) is
replaced, once per process, by one that answers the configured addresses --
a documented choice of addresses, not a change of behaviour: aioice still
binds, gathers and checks exactly as it does.

``webrtc.host_addresses`` in a deployment config (default ``[127.0.0.1]``);
``[]`` restores aioice's own choice (every non-loopback address). STUN/TURN
servers are ``webrtc.ice_servers`` (none by default: none is reachable here).
"""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence

import aioice.ice

_original = aioice.ice.get_host_addresses
_chosen: tuple[str, ...] = ()


def _configured(use_ipv4: bool, use_ipv6: bool) -> list[str]:
    if not _chosen:
        return _original(use_ipv4, use_ipv6)
    out = []
    for address in _chosen:
        version = ipaddress.ip_address(address).version
        if (version == 4 and use_ipv4) or (version == 6 and use_ipv6):
            out.append(address)
    return out


def use_host_addresses(addresses: Sequence[str]) -> None:
    """Gather host candidates on ``addresses`` only (``[]``: aioice's choice)."""
    global _chosen
    for address in addresses:
        ipaddress.ip_address(address)  # a ValueError names a bad one
    _chosen = tuple(addresses)
    aioice.ice.get_host_addresses = _configured


def host_addresses() -> tuple[str, ...]:
    return _chosen
