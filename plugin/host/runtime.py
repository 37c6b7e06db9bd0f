"""``Runtime``: one server process, assembled -- the deployment config, the
stages (one engine for all sessions), the policy, the session manager and
store, the clock and the metrics, and the services built on them: the
realtime sessions (``RealtimeSessions``, ``host/sessions.py``: a session's
life, and all a transport is given) and the text service. It starts and
stops them; it opens no session itself.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

from vllm_duplex.domain.clock import Clock, MonotonicClock
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.machine import detect
from vllm_duplex.domain.metrics import Metrics
from vllm_duplex.domain.session_config import EAGERNESS, SessionConfig, TurnDetection
from vllm_duplex.durable.memory import MemoryStore
from vllm_duplex.durable.store import Bounds, SessionStore
from vllm_duplex.durable.writer import Durability
from vllm_duplex.host.deploy import DeployConfig
from vllm_duplex.host.loop_lag import LoopLagMonitor, freeze_startup_heap
from vllm_duplex.host.sessions import RealtimeSessions
from vllm_duplex.host.stage_types import build_stage
from vllm_duplex.leases.client_secrets import ClientSecrets
from vllm_duplex.leases.manager import SessionManager
from vllm_duplex.policy import ModelPolicy, load_policy
from vllm_duplex.replay.journal import JournalBudget
from vllm_duplex.session.limits import SessionLimits
from vllm_duplex.session.runner import DuplexSession
from vllm_duplex.session.video_input import VideoLimits
from vllm_duplex.stages.lifecycle import Lifecycle, MachineTuned, Metered, ServesText, StageCounter
from vllm_duplex.stages.pipeline import check_routes
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
        self.client_secrets = ClientSecrets(self.clock, self.manager.instance_id)
        session_limits = SessionLimits(
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
        # Every realtime session's life, and all a transport is given of this process.
        self.sessions = RealtimeSessions(
            config, defaults=SessionConfig(model=config.model, policy=config.policy, **defaults),
            policy=self.policy, stages=self.stages, manager=self.manager,
            durability=self.durability, client_secrets=self.client_secrets,
            limits=session_limits, journal_budget=self.journal_budget, clock=self.clock,
            metrics=self.metrics, gone=self.gone)
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

    def gone(self, session_id: str) -> DuplexError | None:
        """Why a session this process cannot find is gone for good, if it
        knows (``RealtimeSessions``' ``gone``); a plain process never does."""
        return None

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
                "max_voice_sessions": self.sessions.capacity.ceiling,
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
