"""Who can reach a server, and whether it may start so.

A server bound beyond loopback (``--host 0.0.0.0``, a LAN address) with no
API key lets anyone on the network open sessions, spend its CPU and mint
client secrets. It starts so only when asked to in so many words
(``--allow-unauthenticated``); otherwise it is refused with the two ways out.
Loopback needs no key: every caller is on the machine. Sans-I/O: the CLI
prints what these return.
"""

from __future__ import annotations

import ipaddress

REFUSED_EXIT = 2


def is_loopback(host: str) -> bool:
    """``host`` as a bind address reaches only this machine (``localhost``,
    127.0.0.0/8, ``::1``). A name other than ``localhost`` may resolve to
    anything, so it counts as exposed."""
    if host.strip().lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip().strip("[]")).is_loopback
    except ValueError:
        return False


def refusal(host: str, api_keys: tuple[str, ...], allow_unauthenticated: bool) -> str | None:
    """Why a server may not start on ``host`` (None: it may)."""
    if api_keys or allow_unauthenticated or is_loopback(host):
        return None
    return (f"refusing to serve on {host} without API keys: anyone who can reach it could open "
            "sessions and mint client secrets. Set api_keys in the config (or "
            "VLLM_DUPLEX_API_KEYS=key1,key2), or pass --allow-unauthenticated to serve it open "
            "on purpose.")


def keys_line(host: str, api_keys: tuple[str, ...]) -> str:
    """The start-up line that says which keys mode is in force."""
    if api_keys:
        n = len(api_keys)
        return f"API keys: {n} configured; every request needs one (or a client secret)"
    if is_loopback(host):
        return "API keys: none (loopback only: every caller is on this machine)"
    return f"API keys: none -- open to anyone who can reach {host} (--allow-unauthenticated)"
