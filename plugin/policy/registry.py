"""The policy registry: policies are found through the entry point group
``vllm_duplex.models`` (loaded once; a broken one is logged, not fatal)."""

from __future__ import annotations

import logging
from importlib.metadata import entry_points
from typing import Any

from vllm_duplex.policy.protocol import ModelPolicy

log = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "vllm_duplex.models"

_REGISTRY: dict[str, type] = {}
_LOADED = False


def register(name: str, cls: type) -> None:
    """Register a policy class by hand (tests, embedding)."""
    _REGISTRY[name] = cls


def _load_entry_points() -> None:
    global _LOADED
    if _LOADED:
        return
    _LOADED = True
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        if ep.name in _REGISTRY:
            continue
        try:
            _REGISTRY[ep.name] = ep.load()
        except Exception:  # a broken third-party policy must not take the server down
            log.exception("failed to load policy entry point %s", ep.name)


def available_policies() -> list[str]:
    _load_entry_points()
    return sorted(_REGISTRY)


def load_policy(name: str, **options: Any) -> ModelPolicy:
    _load_entry_points()
    try:
        cls = _REGISTRY[name]
    except KeyError:
        raise LookupError(
            f"unknown policy {name!r}; installed: {', '.join(sorted(_REGISTRY)) or 'none'}"
        ) from None
    return cls(**options)
