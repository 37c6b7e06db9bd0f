"""``Runtime``: everything one server process shares — the deployment
config, the stages (one engine for all sessions), the policy, the session
manager, the clock and the metrics. Transports open sessions through it.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

from vllm_duplex.core.clock import Clock, MonotonicClock
from vllm_duplex.core.close_reason import CloseReason
from vllm_duplex.core.commands import SessionResume
from vllm_duplex.core.errors import DuplexError
from vllm_duplex.core.machine import detect
from vllm_duplex.core.metrics import Metrics
from vllm_duplex.core.owner_ids import mint
from vllm_duplex.core.session_config import (
    EAGERNESS,
    SessionConfig,
    SessionPatch,
    TurnDetection,
    updated_config,
)
from vllm_duplex.durable.adopt import adopt
from vllm_duplex.durable.memory import MemoryStore
from vllm_duplex.durable.store import Bounds, SessionStore, Stored
from vllm_duplex.durable.takeover import store_reachable
from vllm_duplex.durable.writer import Durability
from vllm_duplex.host.capacity import VoiceCapacity
from vllm_duplex.host.deploy import DeployConfig
from vllm_duplex.host.loop_lag import LoopLagMonitor, freeze_startup_heap
from vllm_duplex.host.stage_types import build_stage
from vllm_duplex.leases.client_secrets import ClientSecret, ClientSecrets, is_client_secret
from vllm_duplex.leases.manager import SessionManager
from vllm_duplex.policy import ModelPolicy, load_policy
from vllm_duplex.replay.journal import JournalBudget, Replay
from vllm_duplex.replay.outbox import Attachment
from vllm_duplex.session.limits import SessionLimits
from vllm_duplex.session.runner import DuplexSession
from vllm_duplex.session.video_input import VideoLimits
from vllm_duplex.stages.pipeline import check_routes
from vllm_duplex.stages.lifecycle import Lifecycle, MachineTuned, Metered, ServesText, StageCounter
from vllm_duplex.stages.port import Stage
from vllm_duplex.stages.scheduler import cpu_scheduler, slots_choice

_SESSION_DEFAULT_KEYS = ("instructions", "output_modalities", "voice", "temperature",
                         "max_output_tokens", "turn_detection")


def _turn_detection(raw: Any) -> TurnDetection | None:
    """A deploy config's default ``turn_detection`` (the GA shape; null: manual commits)."""
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise ValueError("session.turn_detection must be a mapping or null")
    fields = {f.name for f in dataclasses.fields(TurnDetection)}
    unknown = set(raw) - fields
    if unknown:
        raise ValueError(f"unknown session.turn_detection keys: {sorted(unknown)}")
    td = TurnDetection(**raw)
    if td.type not in ("server_vad", "semantic_vad"):
        raise ValueError(f"session.turn_detection.type {td.type!r} is not server_vad or semantic_vad")
    if td.eagerness not in EAGERNESS:
        raise ValueError(f"session.turn_detection.eagerness must be one of {EAGERNESS}")
    return td


class Runtime:
    def __init__(
        self,
        config: DeployConfig,
        *,
        clock: Clock | None = None,
        metrics: Metrics | None = None,
        instance_id: str | None = None,
        shared_stages: Mapping[str, Stage] | None = None,
        store: SessionStore | None = None,
    ) -> None:
        self.config = config
        self.clock = clock or MonotonicClock()
        self.metrics = metrics or Metrics()
        self.policy: ModelPolicy = load_policy(config.policy, **config.policy_options)
        # Stages passed in by type (e.g. one vLLM engine shared by a test
        # session, or the engine of `vllm serve`) are used, not built, and
        # not closed by this runtime.
        shared = dict(shared_stages or {})
        self.stages = [shared.get(spec.type) or build_stage(spec, self.clock)
                       for spec in config.stages]
        _check_stages(config, self.policy, self.stages)
        self._owned = [s for s in self.stages if all(s is not x for x in shared.values())]
        limits = config.limits
        self.manager: SessionManager[DuplexSession] = SessionManager(
            max_sessions=limits.max_sessions,
            max_sessions_per_key=limits.max_sessions_per_key,
            default_ttl_s=limits.session_ttl_s,
            clock=self.clock,
            instance_id=instance_id or os.environ.get("VLLM_DUPLEX_INSTANCE_ID"),
        )
        self.capacity = VoiceCapacity(limits.max_voice_sessions)
        self._refusals = self.metrics.counter(
            "duplex_voice_sessions_refused_total",
            "New voice sessions refused at the measured capacity (limits.max_voice_sessions)")
        if self.capacity.ceiling is not None:
            self.metrics.gauge("duplex_voice_sessions_max",
                               "The ceiling of voice sessions (limits.max_voice_sessions)",
                               lambda: float(self.capacity.ceiling or 0))
        self.client_secrets = ClientSecrets(self.clock, self.manager.instance_id)
        self.session_limits = SessionLimits(
            mailbox_capacity=limits.mailbox_capacity, outbound_capacity=limits.outbound_capacity,
            outbound_bytes=limits.outbound_bytes, journal_events=limits.journal_events,
            journal_bytes=limits.journal_bytes, journal_age_s=limits.journal_age_s,
            survives_disconnect=limits.resume_grace_s > 0,
            max_session_s=limits.max_session_s or None, end_warning_s=limits.session_end_warning_s,
            mcp_timeout_s=limits.mcp_timeout_s,
            video=VideoLimits(fps=limits.video_fps, max_fps=limits.video_max_fps,
                              max_bytes_per_s=limits.video_max_bytes_per_s))
        self.journal_budget = JournalBudget(limits.journal_total_bytes)
        # The session store (vllm_duplex.durable): memory by default; Redis
        # (durability: store: redis) lets another worker adopt a session.
        self.durability = Durability(
            store if store is not None else _build_store(config, self.clock), self._holder(),
            lease_ttl_s=config.durability.lease_ttl_s, metrics=self.metrics, clock=self.clock)
        self.metrics.gauge("duplex_journal_bytes", "Bytes of events journaled for resume, all sessions",
                           lambda: self.journal_budget.used)
        unknown = set(config.session) - set(_SESSION_DEFAULT_KEYS)
        if unknown:
            raise ValueError(f"unknown session defaults: {sorted(unknown)}")
        defaults = dict(config.session)
        if "output_modalities" in defaults:
            defaults["output_modalities"] = tuple(defaults["output_modalities"])
        if "turn_detection" in defaults:
            defaults["turn_detection"] = _turn_detection(defaults["turn_detection"])
        self.session_defaults = SessionConfig(model=config.model, policy=config.policy, **defaults)
        self.metrics.gauge("duplex_sessions_live", "Live sessions", lambda: len(self.manager))
        # The HTTP text surfaces need a vLLM text stage (a scripted pipeline has none).
        self.text: Any = None
        llm = next((s for s in self.stages if isinstance(s, ServesText) and s.serves_text), None)
        if llm is not None:
            from vllm_duplex.text.service import (
                TextService,  # imports vLLM: only when a stage uses it
            )

            self.text = TextService(llm, model=config.model, instance_id=self.manager.instance_id,
                                    limits=limits, clock=self.clock, metrics=self.metrics)
            if self.durability.store.durable:  # application sessions outlive this worker too
                from vllm_duplex.durable.app_sessions import AppSessionKeeper

                self.text.sessions.keeper = AppSessionKeeper(self.text.sessions, self.durability)
                from vllm_duplex.durable.streams import StreamKeeper  # resumable streams too

                self.text.streams.keeper = StreamKeeper(self.text.streams, self.durability)
        self._publish_stage_counters()
        cpu_scheduler().publish(self.metrics)
        self.loop_lag = LoopLagMonitor(self.metrics, warn_after_s=config.loop_lag_warning_ms / 1000)

    def _holder(self) -> str:
        """This process as a lease holder: its owner id and pid (a worker
        restarted under the same id is another holder; its supervisor marks
        the dead one by pid)."""
        return f"{self.manager.instance_id}#{os.getpid()}"

    def _publish_stage_counters(self) -> None:
        """One gauge per counter a ``Metered`` stage publishes, read at scrape time."""
        for stage in self.stages:
            if not isinstance(stage, Metered):
                continue
            published = stage.counters()
            for counter in StageCounter:  # a fixed order: /metrics reads the same every time
                if counter in published:
                    self.metrics.gauge(counter.metric, counter.help,
                                       lambda s=stage, c=counter: float(s.counters()[c]),
                                       stage=stage.name)

    @property
    def model(self) -> str:
        return self.config.model

    def machine(self) -> dict[str, Any]:
        """The CPU as detected, what each stage chose on it and the CPU
        scheduler's slots (``/health``)."""
        sched = cpu_scheduler()
        return {"cpu": detect().to_json(),
                "stages": {s.name: dict(s.machine_settings()) for s in self.stages
                           if isinstance(s, MachineTuned)},
                "scheduler": {"slots": slots_choice().to_json(),
                              "background_slots": sched.background_slots}}

    def machine_line(self) -> str:
        """The start-up line's account of the machine and the choices."""
        chosen = "; ".join(f"{name}: " + ", ".join(
            f"{key} {v['value']}" + ("" if v["source"] == "machine" else f" ({v['source']})")
            for key, v in settings.items() if isinstance(v, dict))
            for name, settings in self.machine()["stages"].items())
        slots = slots_choice()
        chosen += ("; " if chosen else "") + f"cpu scheduler: slots {slots.value}" + (
            "" if slots.source == "machine" else f" ({slots.source})")
        return f"{detect().summary()}; {chosen}"

    def stage_health(self) -> dict[str, bool]:
        """Per stage: can it serve? (a dead vLLM engine says no)."""
        return {s.name: s.healthy if isinstance(s, Lifecycle) else True for s in self.stages}

    @property
    def healthy(self) -> bool:
        return all(self.stage_health().values())

    async def start(self) -> None:
        """Start shared stage engines (e.g. vLLM, ~20 s on a 2-core CPU) before
        the first session, so no caller waits for them."""
        self.loop_lag.start()  # first: the stage starts are watched too
        try:
            for stage in self.stages:
                if isinstance(stage, Lifecycle):
                    await stage.start()
            await self.manager.start()
            await self.durability.start()
            if self.text is not None:
                await self.text.start()
        except BaseException:
            await self.loop_lag.stop()
            raise
        freeze_startup_heap()  # before the first session: what is here now stays

    async def stop(self) -> None:
        if self.text is not None:
            await self.text.stop()
        await self.manager.stop()
        await self.durability.stop()  # after the sessions: their last writes and releases
        for stage in self._owned:  # their resources: worker threads, the vLLM engine
            if isinstance(stage, Lifecycle):
                await stage.close()
        await self.loop_lag.stop()

    def session_config(self, *patches: SessionPatch | None) -> SessionConfig:
        """The config a session opens with: the deployment's defaults with
        ``patches`` applied in order (a client secret's, then the opening
        request's: ``?intent=``, a call's ``session``). The type is set here,
        once; a bad value is the typed error of ``session.update``."""
        config = self.session_defaults
        caps = self.policy.capabilities()
        for patch in patches:
            if patch is None:
                continue
            model = patch.get("model")
            if model is not None and not self.config.serves(model):
                raise DuplexError("model_not_found", f"model {model!r} is not served here",
                                  param="session.model")
            config = dataclasses.replace(config, type=patch.get("type", config.type))
            config = updated_config(config, patch.without("type", "model"), caps, self.policy.name)
        return config

    def mint_client_secret(self, api_key: str | None, patch: SessionPatch | None,
                           ttl_s: float, now_unix: float) -> tuple[str, ClientSecret, SessionConfig]:
        """A client secret for ``api_key`` (already checked) whose session
        opens with ``patch`` (checked now: a key that could not open is never
        handed out)."""
        config = self.session_config(patch)
        value, secret = self.client_secrets.mint(
            api_key, mint("sess", self.manager.instance_id), patch, ttl_s, now_unix)
        return value, secret, config

    async def open_realtime_session(self, api_key: str | None,
                                    patch: SessionPatch | None = None, *,
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
            secret = self.client_secrets.redeem(api_key)
        try:
            if secret is not None:
                _check_secret_fits(secret, patch)
                api_key = secret.owner_key
            config = self.session_config(transport, secret.patch if secret else None, patch)
            self.check_voice_room()  # with admit below, no await between: no race

            def factory(session_id: str) -> DuplexSession:
                return DuplexSession(session_id, config=config, policy=self.policy,
                                     stages=self.stages, clock=self.clock, metrics=self.metrics,
                                     limits=self.session_limits, journal_budget=self.journal_budget,
                                     extra_wire={"owner_instance_id": self.manager.instance_id,
                                                 **self._expiry(time.time())},
                                     on_closed=self.manager.release, mirror=self.durability,
                                     api_key=api_key)

            grace = self.config.limits.resume_grace_s
            # The id names its owner, so a router sends the resume here (core/owner_ids.py).
            session_id = secret.session_id if secret else mint("sess", self.manager.instance_id)
            session, _ = self.manager.admit(factory, api_key=api_key, pinned=True,
                                            session_id=session_id,
                                            ttl_s=grace if grace > 0 else None)
        except BaseException:
            if secret is not None:
                secret.used = False  # nothing was opened with it
            raise
        session.attach()  # the opening socket
        self.durability.track(session, generation=1)  # a fresh id: its first save creates it
        try:
            await session.start()
        except BaseException:
            await self.manager.release(session.session_id, CloseReason.START_FAILED)
            await session.close(CloseReason.START_FAILED)
            raise
        return session

    def _expiry(self, wall_now: float) -> dict[str, int]:
        """The session object's ``expires_at`` (seconds since the epoch, as
        OpenAI's), when sessions have a maximum length."""
        max_s = self.session_limits.max_session_s
        return {"expires_at": int(wall_now + max_s)} if max_s else {}

    def check_voice_room(self) -> None:
        """Raise ``at_capacity`` when a new voice session would pass the
        ceiling (a resume never asks: its session holds its seat)."""
        try:
            self.capacity.check(len(self.manager))
        except DuplexError:
            self._refusals.inc()
            raise

    def capacity_report(self) -> dict[str, Any]:
        """``/health``'s ``capacity``: the ceiling, the sessions, the room left."""
        return self.capacity.to_json(len(self.manager))

    def caller_key(self, key: str | None) -> str | None:
        """The API key a request that opens nothing acts as (a resume, a
        sideband socket): a client secret acts as its minting key."""
        if is_client_secret(key):
            assert key is not None
            return self.client_secrets.owner(key)
        return key

    async def end_session(self, session: DuplexSession, reason: CloseReason) -> None:
        await session.close(reason)
        await self.manager.release(session.session_id, reason)

    async def resume_or_adopt(self, api_key: str | None, c: SessionResume
                              ) -> tuple[DuplexSession, Attachment, Replay, dict[str, Any]]:
        """``resume_realtime_session``; a session not here is first looked
        for in a durable store and adopted when its owner is gone
        (``vllm_duplex.durable.adopt``)."""
        if self.durability.store.durable and self.manager.peek(c.session_id) is None:
            try:
                with store_reachable("session", c.session_id):
                    await self._adopt(api_key, c)
            except DuplexError as err:
                if err.code != "session_not_found":
                    self.metrics.resumes.inc(outcome=err.code)
                    raise
        session, att, replay, resumed = self.resume_realtime_session(api_key, c)
        if self.durability.store.durable:
            resumed["owner_instance_id"] = self.manager.instance_id
        return session, att, replay, resumed

    async def _adopt(self, api_key: str | None, c: SessionResume) -> DuplexSession:
        def make(stored: Stored) -> DuplexSession:
            extra = {**stored.state.extra_wire, "owner_instance_id": self.manager.instance_id}
            return DuplexSession(c.session_id, config=stored.state.config, policy=self.policy,
                                 stages=self.stages, clock=self.clock, metrics=self.metrics,
                                 limits=self.session_limits, journal_budget=self.journal_budget,
                                 extra_wire=extra, on_closed=self.manager.release,
                                 mirror=self.durability, api_key=api_key)

        def admit(session: DuplexSession) -> None:
            grace = self.config.limits.resume_grace_s
            self.manager.admit(lambda _id: session, api_key=api_key, pinned=False,
                               session_id=c.session_id, ttl_s=grace if grace > 0 else None)

        session = await adopt(self.durability, make, api_key, c.session_id, c.resume_token, admit)
        self.metrics.resumes.inc(outcome="adopted")
        return session

    def resume_realtime_session(self, api_key: str | None, c: SessionResume
                                ) -> tuple[DuplexSession, Attachment, Replay, dict[str, Any]]:
        """Attach a reconnecting socket to its session (``session.resume``):
        another key's session is ``session_not_found``, a lapsed one
        ``session_expired``; the token is checked in constant time and rotates;
        ``generation``, when given, is a compare-and-swap on the lease."""
        try:
            session, info = self.manager.get(c.session_id, api_key)
            generation = info.lease.generation
            if c.generation is not None:
                generation = self.manager.renew(c.session_id, api_key,
                                                generation=c.generation).generation
            att, replay, resumed = session.resume(c.resume_token, c.last_seq)
        except DuplexError as err:
            self.metrics.resumes.inc(outcome=err.code)
            raise
        self.manager.pin(c.session_id)
        self.metrics.resumes.inc(outcome="resync" if replay.resync else "ok")
        return session, att, replay, {**resumed, "generation": generation}

    async def release_socket(self, session: DuplexSession, att: Attachment, *,
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
            await self.end_session(session, session.close_reason)
        elif current and client_closed:
            await self.end_session(session, CloseReason.CLIENT)
        elif current and not self.session_limits.survives_disconnect:
            await self.end_session(session, CloseReason.DISCONNECT)
        else:
            self.manager.unpin(session.session_id)

    def capabilities(self) -> dict[str, Any]:
        limits = self.config.limits
        return {
            "object": "duplex.capabilities",
            "instance_id": self.manager.instance_id,
            "model": self.config.model,
            "policies": {self.policy.name: self.policy.capabilities().wire()},
            "stages": [s.name for s in self.stages],
            "limits": {
                "max_sessions": limits.max_sessions,
                "max_voice_sessions": self.capacity.ceiling,
                "max_sessions_per_key": limits.max_sessions_per_key,
                "max_event_bytes": limits.max_event_bytes,
                "max_frame_bytes": limits.max_frame_bytes,
                "session_ttl_s": limits.session_ttl_s,
            },
            "audio_formats": ["audio/pcm", "audio/pcmu", "audio/pcma"],
            "realtime": {"path": "/v1/realtime", "dialects": ["ga", "beta"]},
            "text": self.text.capabilities() if self.text is not None else None,
        }


def _build_store(config: DeployConfig, clock: Clock) -> SessionStore:
    limits, d = config.limits, config.durability
    bounds = Bounds(max_events=limits.journal_events, max_bytes=limits.journal_bytes,
                    max_age_s=limits.journal_age_s,
                    keep_s=max(limits.journal_age_s, limits.resume_grace_s + limits.session_ttl_s)
                    + d.lease_ttl_s)
    if not d.durable:
        return MemoryStore(clock, bounds)
    url = d.resolved_url()
    if url is None:
        raise ValueError("durability.store: redis needs durability.url (serve --workers N "
                         "starts a private redis-server and passes its URL)")
    from vllm_duplex.durable.redis_store import RedisStore  # the redis package: only when used

    return RedisStore(url, bounds)


def _check_secret_fits(secret: ClientSecret, patch: SessionPatch | None) -> None:
    """A client secret opens only the kind of session it was minted for."""
    fixed = secret.patch.get("type") if secret.patch is not None else None
    asked = patch.get("type") if patch is not None else None
    if fixed is not None and asked is not None and fixed != asked:
        raise DuplexError("client_secret_mismatch",
                          f"this client secret was minted for a {fixed.value} session, "
                          f"not a {asked.value} one", param="session.type")


def _check_stages(config: DeployConfig, policy: ModelPolicy, stages: list[Stage]) -> None:
    """Refuse a deployment whose stages do not route what its policy sends:
    a stage it addresses is missing, two stages share a name, or one does
    not take what is sent to it (found at load, not at a session's first
    audio chunk)."""
    problems = check_routes(stages, policy.stage_needs())
    if problems:
        have = ", ".join(f"{s.name} ({spec.type})" for s, spec in zip(stages, config.stages))
        raise ValueError(
            f"deployment {config.name!r}: its stages do not fit policy {policy.name!r}: "
            f"{'; '.join(problems)} (it has: {have or 'none'}); fix them under `stages:`")
