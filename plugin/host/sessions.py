"""``RealtimeSessions``: this process's realtime sessions -- who may open
one, is there room, and a session's life (open, resume or adopt, release,
end) -- and all a transport is given of the process.

Every transport (the realtime socket, WebRTC, SIP, Twilio; the next dialect
too) is handed this service instead of the whole ``Runtime``: it admits the
caller (``admit``: key, model, room, a call's id, in that order), opens,
resumes, releases and ends sessions, and stamps what the transport hands in
(the clock, the error counter). The ``Runtime`` assembles the process and
hands this service its parts (the manager, the store's writer, the stages,
the policy); the text service and the rest of the runtime stay out of a
transport's reach, so a wire shell cannot grow a second path into them.
``realtime/server/port/`` is the one user of the session methods.
"""

from __future__ import annotations

import dataclasses
import hmac
import time
from collections.abc import Callable, Sequence
from typing import Any, overload

from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.domain.commands import SessionResume
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.domain.owner_ids import mint
from vllm_duplex.domain.session_config import SessionConfig, SessionPatch, updated_config
from vllm_duplex.durable import live_sessions
from vllm_duplex.durable.adopt import adopt
from vllm_duplex.durable.records import LiveSessionRecord
from vllm_duplex.durable.store import Stored
from vllm_duplex.durable.takeover import store_reachable
from vllm_duplex.durable.writer import Durability
from vllm_duplex.host.capacity import VoiceCapacity
from vllm_duplex.host.deploy import DeployConfig
from vllm_duplex.leases.client_secrets import ClientSecret, ClientSecrets, is_client_secret
from vllm_duplex.leases.manager import SessionManager
from vllm_duplex.policy import ModelPolicy
from vllm_duplex.replay.journal import JournalBudget, Replay
from vllm_duplex.replay.outbox import Attachment
from vllm_duplex.session.limits import SessionLimits
from vllm_duplex.session.runner import DuplexSession
from vllm_duplex.stages.port import Stage

Resumed = tuple[DuplexSession, Attachment, Replay, dict[str, Any]]


def check_api_key(allowed: Sequence[str], secrets: ClientSecrets, key: str | None) -> None:
    """With keys configured, a request must present one of them (compared in
    constant time). Without, every caller is local and keys only scope. A
    client secret (``ek_…``) passes while it is live (it acts as the key that
    minted it; opening a session redeems it, ``RealtimeSessions.open``)."""
    if is_client_secret(key):
        secrets.owner(key)  # unknown: unauthorized; lapsed: client_secret_expired
        return
    if not allowed:
        return
    given = key.encode("utf-8", "surrogateescape") if key is not None else None
    if given is None or not any(hmac.compare_digest(given, k.encode()) for k in allowed):
        raise DuplexError("unauthorized", "missing or invalid API key (Authorization: Bearer ...)")


def _nothing_lost(session_id: str) -> DuplexError | None:
    return None


class RealtimeSessions:
    """This process's realtime sessions, and the narrow door of a transport into them."""

    def __init__(self, config: DeployConfig, *, defaults: SessionConfig, policy: ModelPolicy,
                 stages: list[Stage], manager: SessionManager[DuplexSession],
                 durability: Durability, client_secrets: ClientSecrets, limits: SessionLimits,
                 journal_budget: JournalBudget, clock: Clock, metrics: Metrics,
                 gone: Callable[[str], DuplexError | None] = _nothing_lost) -> None:
        """``gone``: why a session this process cannot find is gone for good,
        if it knows (a restarted worker's dead life: ``fleet/worker.py``);
        None: ``session_not_found`` as usual."""
        self._config = config
        self.defaults = defaults  # the config a session opens with, before any patch
        self._policy = policy
        self._stages = stages  # the runtime's list: one set of stages per process
        self._manager = manager
        self._durability = durability
        self._secrets = client_secrets
        self.limits = limits  # each new session's (replaced whole by tests)
        self._journal_budget = journal_budget
        self._clock = clock
        self._metrics = metrics
        self._gone = gone
        self.model = config.model
        self.model_names: tuple[str, ...] = config.model_names
        self.model_aliases = {name: config.model for name in config.model_names}
        self.max_event_bytes = config.limits.max_event_bytes
        self.responses_backends = dict(config.responses_backends)  # GPT-Live delegations'
        self.api_keys: tuple[str, ...] = tuple(config.api_keys)
        self.capacity = VoiceCapacity(config.limits.max_voice_sessions)
        self._refusals = metrics.counter(
            "duplex_voice_sessions_refused_total",
            "New voice sessions refused at the measured capacity (limits.max_voice_sessions)")
        if self.capacity.ceiling is not None:
            metrics.gauge("duplex_voice_sessions_max",
                          "The ceiling of voice sessions (limits.max_voice_sessions)",
                          lambda: float(self.capacity.ceiling or 0))

    # ---- the door: who may come in, and is there room -------------------------------

    def check_key(self, key: str | None) -> None:
        check_api_key(self.api_keys, self._secrets, key)

    def caller_key(self, key: str | None) -> str | None:
        """The API key a request that opens nothing acts as (a resume, a
        sideband socket): a client secret acts as its minting key."""
        if is_client_secret(key):
            assert key is not None
            return self._secrets.owner(key)
        return key

    def serves(self, model: str | None) -> bool:
        return self._config.serves(model)

    def check_room(self) -> None:
        """``at_capacity`` when a new voice session would pass the ceiling
        (a resume never asks: its session holds its seat)."""
        try:
            self.capacity.check(len(self._manager))
        except DuplexError:
            self._refusals.inc()
            raise

    def capacity_report(self) -> dict[str, Any]:
        """``/health``'s ``capacity``: the ceiling, the sessions, the room left."""
        return self.capacity.to_json(len(self._manager))

    @overload
    def admit(self, key: str | None, *, model: str | None = None, room: bool = True,
              call: str) -> str: ...

    @overload
    def admit(self, key: str | None, *, model: str | None = None, room: bool = True,
              call: None = None) -> None: ...

    def admit(self, key: str | None, *, model: str | None = None, room: bool = True,
              call: str | None = None) -> str | None:
        """Every transport's admission, written once, in this order: the
        caller's ``key`` (``unauthorized``; a lapsed client secret:
        ``client_secret_expired``), the ``model`` its route asks for, if any
        (``model_not_found``, naming what is served), ``room`` for one more
        voice session (``at_capacity``: a transport that opens at once leaves
        it to ``open``, which asks again with no await before the seat is
        taken), and a new call's id when ``call`` names its prefix (``rtc``,
        ``tw``; returned, else None). A transport names only what differs,
        and says why where the order is its wire's."""
        self.check_key(key)
        if model is not None and not self.serves(model):
            raise DuplexError("model_not_found",
                              f"model {model!r} is not served here; this server serves "
                              f"{', '.join(map(repr, self.model_names))}", param="model")
        if room:
            self.check_room()
        return self.mint_id(call) if call is not None else None

    def mint_id(self, prefix: str) -> str:
        """A new id naming this worker as its owner (a call's: ``rtc``, ``sip``, ``tw``)."""
        return mint(prefix, self._manager.instance_id)

    def check_owner(self, session_id: str, key: str | None) -> None:
        """``session_not_found`` unless ``key`` owns the live session."""
        self._manager.get(session_id, self.caller_key(key))

    # ---- a new session's config, and the client secrets that carry one --------------

    def session_config(self, *patches: SessionPatch | None) -> SessionConfig:
        """The config a session opens with: the deployment's defaults with
        ``patches`` applied in order (a client secret's, then the opening
        request's: ``?intent=``, a call's ``session``). The type is set here,
        once; a bad value is the typed error of ``session.update``."""
        config = self.defaults
        caps = self._policy.capabilities()
        for patch in patches:
            if patch is None:
                continue
            model = patch.get("model")
            if model is not None and not self._config.serves(model):
                raise DuplexError("model_not_found", f"model {model!r} is not served here",
                                  param="session.model")
            config = dataclasses.replace(config, type=patch.get("type", config.type))
            config = updated_config(config, patch.without("type", "model"), caps, self._policy.name)
        return config

    def mint_client_secret(self, api_key: str | None, patch: SessionPatch | None,
                           ttl_s: float, now_unix: float) -> tuple[str, ClientSecret, SessionConfig]:
        """A client secret for ``api_key`` (already checked) whose session
        opens with ``patch`` (checked now: a key that could not open is never
        handed out)."""
        config = self.session_config(patch)
        value, secret = self._secrets.mint(
            api_key, mint("sess", self._manager.instance_id), patch, ttl_s, now_unix)
        return value, secret, config

    # ---- a session's life --------------------------------------------------------------

    def _session(self, session_id: str, config: SessionConfig, api_key: str | None,
                 extra_wire: dict[str, Any]) -> DuplexSession:
        return DuplexSession(session_id, config=config, policy=self._policy,
                             stages=self._stages, clock=self._clock, metrics=self._metrics,
                             limits=self.limits, journal_budget=self._journal_budget,
                             extra_wire=extra_wire, on_closed=self._manager.release,
                             mirror=self._durability, api_key=api_key)

    def _ttl(self) -> float | None:
        """A session's lease while no socket holds it: the resume grace (none: no resume)."""
        grace = self._config.limits.resume_grace_s
        return grace if grace > 0 else None

    async def open(self, api_key: str | None, patch: SessionPatch | None = None, *,
                   transport: SessionPatch | None = None) -> DuplexSession:
        """Admit (may raise ``resource_exhausted``) and start a session; it is
        pinned while its socket is attached. ``api_key`` may be a client
        secret (``ek_…``): it is redeemed (once), its session config comes
        first, and the session is its minting key's. ``patch``: what the
        opening request asks for (``?intent=transcription``, a call's session);
        ``transport``: the transport's own defaults, under both (a call whose
        audio the server plays is paced: ``SessionPatch.played_here``)."""
        secret: ClientSecret | None = None
        if is_client_secret(api_key):
            assert api_key is not None
            secret = self._secrets.redeem(api_key)
        try:
            if secret is not None:
                _check_secret_fits(secret, patch)
                api_key = secret.owner_key
            config = self.session_config(transport, secret.patch if secret else None, patch)
            self.check_room()  # with admit below, no await between: no race
            owner = self._manager.instance_id
            extra = {"owner_instance_id": owner, **self._expiry(time.time())}
            # The id names its owner, so a router sends the resume here (domain/owner_ids.py).
            session_id = secret.session_id if secret else mint("sess", owner)
            session, _ = self._manager.admit(
                lambda sid: self._session(sid, config, api_key, extra), api_key=api_key,
                pinned=True, session_id=session_id, ttl_s=self._ttl())
        except BaseException:
            if secret is not None:
                secret.used = False  # nothing was opened with it
            raise
        session.attach()  # the opening socket
        self._durability.track(session, generation=1)  # a fresh id: its first save creates it
        try:
            await session.start()
        except BaseException:
            await self._manager.release(session.session_id, CloseReason.START_FAILED)
            await session.close(CloseReason.START_FAILED)
            raise
        return session

    def _expiry(self, wall_now: float) -> dict[str, int]:
        """The session object's ``expires_at`` (seconds since the epoch, as
        OpenAI's), when sessions have a maximum length."""
        max_s = self.limits.max_session_s
        return {"expires_at": int(wall_now + max_s)} if max_s else {}

    async def resume(self, api_key: str | None, c: SessionResume) -> Resumed:
        """Attach a reconnecting socket to its session (``session.resume``);
        a session not here is first looked for in a durable store and
        adopted when its owner is gone (``vllm_duplex.durable.adopt``)."""
        durable = self._durability.store.durable
        if durable and self._manager.peek(c.session_id) is None:
            try:
                with store_reachable("session", c.session_id):
                    await self._adopt(api_key, c)
            except DuplexError as err:
                if err.code != "session_not_found":
                    self._metrics.resumes.inc(outcome=err.code)
                    raise
        session, att, replay, resumed = self._resume_here(api_key, c)
        if durable:
            resumed["owner_instance_id"] = self._manager.instance_id
        return session, att, replay, resumed

    async def _adopt(self, api_key: str | None, c: SessionResume) -> DuplexSession:
        def make(stored: Stored) -> DuplexSession:
            extra = {**stored.state.extra_wire, "owner_instance_id": self._manager.instance_id}
            return self._session(c.session_id, stored.state.config, api_key, extra)

        def admit(session: DuplexSession) -> None:
            self._manager.admit(lambda _id: session, api_key=api_key, pinned=False,
                                session_id=c.session_id, ttl_s=self._ttl())

        session = await adopt(self._durability, make, api_key, c.session_id, c.resume_token, admit)
        self._metrics.resumes.inc(outcome="adopted")
        return session

    def _resume_here(self, api_key: str | None, c: SessionResume) -> Resumed:
        """Attach to a session this process holds: another key's session is
        ``session_not_found`` (or why it is gone, ``gone``), a lapsed one
        ``session_expired``; the token is checked in constant time and
        rotates; ``generation``, when given, is a compare-and-swap on the lease."""
        try:
            session, info = self._manager.get(c.session_id, api_key)
            generation = info.lease.generation
            if c.generation is not None:
                generation = self._manager.renew(c.session_id, api_key,
                                                 generation=c.generation).generation
            att, replay, resumed = session.resume(c.resume_token, c.last_seq)
        except DuplexError as err:
            self._metrics.resumes.inc(outcome=err.code)
            gone = self._gone(c.session_id) if err.code == "session_not_found" else None
            if gone is not None:
                raise gone from err
            raise
        self._manager.pin(c.session_id)
        self._metrics.resumes.inc(outcome="resync" if replay.resync else "ok")
        return session, att, replay, {**resumed, "generation": generation}

    async def release(self, session: DuplexSession, att: Attachment, *,
                      client_closed: bool = False) -> None:
        """A socket of ``session`` ended. ``client_closed``: its client closed
        it cleanly (1000, 1001: the transport decides), which ends the session
        now, as ``session.close`` would -- a client that said goodbye is not
        coming back, and a session kept for its resume would hold an admission
        seat, its vLLM request and its journal through the whole grace. A
        socket that was lost ends its session only without resume (grace 0);
        otherwise the session waits, detached, for a resume. A socket another
        one replaced (not ``current``) ends nothing."""
        current = session.detach(att)
        if session.close_reason is not None:
            await self.end(session, session.close_reason)
        elif current and client_closed:
            await self.end(session, CloseReason.CLIENT)
        elif current and not self.limits.survives_disconnect:
            await self.end(session, CloseReason.DISCONNECT)
        else:
            self._manager.unpin(session.session_id)

    async def end(self, session: DuplexSession, reason: CloseReason) -> None:
        await session.close(reason)
        await self._manager.release(session.session_id, reason)

    @property
    def context_limit(self) -> int | None:
        """The LLM's context length in tokens, where a stage hosts one on vLLM
        (``max_model_len``); None where it is not known (a scripted pipeline)."""
        for stage in self._stages:
            limit = getattr(stage, "max_model_len", None)
            if isinstance(limit, int) and limit > 0:
                return limit
        return None

    # ---- stored GPT-Live sessions (store: true; durable/live_sessions.py) -------------

    async def keep_live(self, session_id: str, *, config: dict[str, Any],
                        items: list[dict[str, Any]], api_key: str | None,
                        recording: bytes = b"") -> None:
        await live_sessions.keep(self._durability.store, self._durability.holder, session_id,
                                 config=config, items=items, api_key=api_key,
                                 recording=recording)

    async def find_live(self, session_id: str, api_key: str | None) -> LiveSessionRecord:
        return await live_sessions.find(self._durability.store, session_id, api_key)

    # ---- stamps on what a transport hands in ------------------------------------------

    def now(self) -> float:
        return self._clock.now()

    async def sleep(self, seconds: float) -> None:
        """On the session clock (a virtual one in tests)."""
        await self._clock.sleep(seconds)

    def count_error(self, code: str) -> None:
        self._metrics.errors.inc(code=code)

    def counter(self, name: str, help_text: str) -> Any:
        """A transport's own counter (e.g. RTP packets dropped)."""
        return self._metrics.counter(name, help_text)


def _check_secret_fits(secret: ClientSecret, patch: SessionPatch | None) -> None:
    """A client secret opens only the kind of session it was minted for."""
    fixed = secret.patch.get("type") if secret.patch is not None else None
    asked = patch.get("type") if patch is not None else None
    if fixed is not None and asked is not None and fixed != asked:
        raise DuplexError("client_secret_mismatch",
                          f"this client secret was minted for a {fixed.value} session, "
                          f"not a {asked.value} one", param="session.type")
