"""Stored GPT-Live sessions (``store: true``): what a fork starts from.

The same session store as every other kind (memory, or Redis shared by the
fleet: ``store.py``), under its own keys (``live:<session id>``): a stored
session is saved after each of its replies and when it ends, and kept as
long as the store keeps any session's keys after their last write
(``Bounds.keep_s``). One writer per stored session -- the socket that serves
it -- so its record is created under generation 1 and saved under it; a fork
only reads it.

Its recording (``media/recording.py``: a stereo WAV, caller left, assistant
right) is part of the record, so it has the same owner, store and lifetime,
and is as fresh as the last save: a session still running has its recording
up to its last reply.

A session stored by another API key is not found, as everywhere else.
"""

from __future__ import annotations

import hmac
import time
from typing import Any

from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.durable.records import LIVE_PREFIX, LiveSessionRecord
from vllm_duplex.durable.store import Save, SessionStore, StoreUnavailable, sha

_GENERATION = 1  # its one writer's, from its first save on
# The lease its first save creates (a store's Save needs one; Redis takes no
# zero expiry): nothing renews it, as nothing waits on a stored session's lease.
_LEASE_S = 1.0


async def keep(store: SessionStore, holder: str, session_id: str, *, config: dict[str, Any],
               items: list[dict[str, Any]], api_key: str | None,
               recording: bytes = b"") -> None:
    """Save the stored session now (created by its first save)."""
    record = LiveSessionRecord(config=config, items=tuple(items), key_sha=sha(api_key),
                               stored_at=time.time(), recording=recording)
    try:
        await store.apply([Save(LIVE_PREFIX + session_id, _GENERATION, record,  # type: ignore[arg-type]
                                holder=holder, ttl_s=_LEASE_S)])
    except StoreUnavailable:
        raise DuplexError("store_unavailable", "the session store cannot be reached: the "
                          "session was not stored", param="session.store") from None


async def find(store: SessionStore, session_id: str, api_key: str | None) -> LiveSessionRecord:
    """The stored session ``session_id`` (``session_not_found`` when there is
    none, it was not stored, or another key stored it)."""
    try:
        stored = await store.load(LIVE_PREFIX + session_id)
    except StoreUnavailable:
        raise DuplexError("store_unavailable", "the session store cannot be reached",
                          param="session_id") from None
    record = None if stored is None else stored.state
    if not isinstance(record, LiveSessionRecord) or (record.key_sha is not None and (
            api_key is None or not hmac.compare_digest(record.key_sha, sha(api_key) or ""))):
        raise DuplexError("session_not_found", f"no stored session {session_id!r} (a session "
                          "is stored when it starts with store: true)", param="session_id")
    return record
