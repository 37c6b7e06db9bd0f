"""``RealtimeSessions``: what a transport may do with realtime sessions, and
nothing else of the ``Runtime``.

Every transport (the realtime socket, WebRTC, SIP, Twilio; the next dialect
too) is handed this service instead of the whole ``Runtime``: it checks the
caller's key, asks for room, opens, resumes, releases and ends sessions, and
stamps what the transport hands in (the clock, the error counter). The
stages, the policy, the text service, the store and the session manager stay
out of a transport's reach, so a wire shell cannot grow a second path into
them. ``realtime/server/port/`` is the one user of the session methods.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vllm_duplex.core.close_reason import CloseReason
from vllm_duplex.core.commands import SessionResume
from vllm_duplex.core.errors import DuplexError
from vllm_duplex.core.owner_ids import mint
from vllm_duplex.core.session_config import SessionPatch
from vllm_duplex.leases.client_secrets import ClientSecrets, is_client_secret
from vllm_duplex.replay.journal import Replay
from vllm_duplex.replay.outbox import Attachment
from vllm_duplex.session.runner import DuplexSession

if TYPE_CHECKING:  # the service is built from a runtime; it does not hand it on
    from vllm_duplex.host.runtime import Runtime


def check_api_key(allowed: Sequence[str], secrets: ClientSecrets, key: str | None) -> None:
    """With keys configured, a request must present one of them (compared in
    constant time). Without, every caller is local and keys only scope. A
    client secret (``ek_…``) passes while it is live (it acts as the key that
    minted it; opening a session redeems it, see ``Runtime``)."""
    if is_client_secret(key):
        secrets.owner(key)  # unknown: unauthorized; lapsed: client_secret_expired
        return
    if not allowed:
        return
    given = key.encode("utf-8", "surrogateescape") if key is not None else None
    if given is None or not any(hmac.compare_digest(given, k.encode()) for k in allowed):
        raise DuplexError("unauthorized", "missing or invalid API key (Authorization: Bearer ...)")


class RealtimeSessions:
    """The narrow door of a transport into this process's realtime sessions."""

    def __init__(self, runtime: Runtime) -> None:
        # Held privately: every method below is one named thing a transport
        # may ask, so what transports depend on is this class, read in one page.
        self._runtime = runtime
        config = runtime.config
        self.model = config.model
        self.model_names: tuple[str, ...] = config.model_names
        self.model_aliases = {name: config.model for name in config.model_names}
        self.max_event_bytes = config.limits.max_event_bytes
        self.api_keys: tuple[str, ...] = tuple(config.api_keys)

    # ---- the door: who may come in, and is there room -------------------------------

    def check_key(self, key: str | None) -> None:
        check_api_key(self.api_keys, self._runtime.client_secrets, key)

    def caller_key(self, key: str | None) -> str | None:
        """The key a request that opens nothing acts as (a client secret: its minting key)."""
        return self._runtime.caller_key(key)

    def serves(self, model: str | None) -> bool:
        return self._runtime.config.serves(model)

    def check_room(self) -> None:
        """``at_capacity`` when a new voice session would pass the ceiling."""
        self._runtime.check_voice_room()

    def mint_id(self, prefix: str) -> str:
        """A new id naming this worker as its owner (a call's: ``rtc``, ``sip``, ``tw``)."""
        return mint(prefix, self._runtime.manager.instance_id)

    def check_owner(self, session_id: str, key: str | None) -> None:
        """``session_not_found`` unless ``key`` owns the live session."""
        self._runtime.manager.get(session_id, self.caller_key(key))

    # ---- a session's life --------------------------------------------------------------

    async def open(self, key: str | None, patch: SessionPatch | None = None, *,
                   transport: SessionPatch | None = None) -> DuplexSession:
        return await self._runtime.open_realtime_session(key, patch, transport=transport)

    async def resume(self, key: str | None, command: SessionResume
                     ) -> tuple[DuplexSession, Attachment, Replay, dict[str, Any]]:
        return await self._runtime.resume_or_adopt(key, command)

    async def release(self, session: DuplexSession, att: Attachment, *,
                      client_closed: bool) -> None:
        await self._runtime.release_socket(session, att, client_closed=client_closed)

    async def end(self, session: DuplexSession, reason: CloseReason) -> None:
        await self._runtime.end_session(session, reason)

    # ---- stamps on what a transport hands in ------------------------------------------

    def now(self) -> float:
        return self._runtime.clock.now()

    def count_error(self, code: str) -> None:
        self._runtime.metrics.errors.inc(code=code)

    def counter(self, name: str, help_text: str) -> Any:
        """A transport's own counter (e.g. RTP packets dropped)."""
        return self._runtime.metrics.counter(name, help_text)
