"""Deployment configs: one YAML file = one servable pipeline.

A config names the policy, the stages (in pipeline order), session defaults,
limits and server settings. Unknown keys are errors: a typo in a deployment
file should fail loudly at start, not silently run defaults.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml
from vllm_duplex.domain.backends import ResponsesBackend
from vllm_duplex.domain.devices import Device
from vllm_duplex.host.backends import backends_from_raw
from vllm_duplex.host.sip import Sip
from vllm_duplex.host.store_config import StoreConfig
from vllm_duplex.host.topology import Workers
from vllm_duplex.host.twilio import Twilio

DEFAULT_CONFIG = "cascade-cpu"  # `vllm-duplex serve` with no arguments
CONFIG_DIRS = (Path.cwd() / "configs", Path(__file__).resolve().parents[2] / "configs")


@dataclass(frozen=True)
class StageSpec:
    type: str
    options: dict[str, Any] = field(default_factory=dict)
    device: Device | None = None  # `device:` in the config (domain/devices.py); None: the stage's default


@dataclass(frozen=True)
class Limits:
    max_sessions: int = 256
    # Voice sessions (realtime sockets and calls) past the measured capacity
    # are refused (429 before the upgrade): a number, "auto" (the machine's,
    # host/capacity.py) or None (no ceiling but max_sessions).
    max_voice_sessions: int | str | None = None
    max_sessions_per_key: int | None = None
    max_event_bytes: int = 1 << 20  # larger events get `event_too_large`, socket stays open
    max_frame_bytes: int = 16 << 20  # larger frames are refused by the WebSocket layer (close 1009)
    session_ttl_s: float = 60.0
    mailbox_capacity: int = 1024
    outbound_capacity: int = 8192  # events queued for one socket; beyond: cut off (4008)
    outbound_bytes: int = 16 << 20
    # Resume: a dropped socket's session waits this long for `session.resume`
    # (0: it closes with its socket). Its journal is bounded per session and in total.
    resume_grace_s: float = 30.0
    # A realtime session's maximum length, as OpenAI's 60 minutes (0: none),
    # announced `session_end_warning_s` before (duplex.session.expiring).
    max_session_s: float = 3600.0
    session_end_warning_s: float = 60.0
    # One list or call of a session's remote MCP server, all of it (session/mcp_client.py).
    mcp_timeout_s: float = 30.0
    journal_events: int = 4096
    journal_bytes: int = 8 << 20
    journal_age_s: float = 300.0
    journal_total_bytes: int = 256 << 20
    # Video: frames are sampled to `video_fps` for the vision stage; beyond the
    # hard limits (per session, over 1 s) a frame or chunk gets `rate_limited`.
    video_fps: float = 2.0
    video_max_fps: float = 30.0
    video_max_bytes_per_s: int = 8 << 20
    # HTTP text surfaces (application sessions, generate, resumable streams)
    max_request_bytes: int = 1 << 20  # larger HTTP bodies get `payload_too_large`
    max_output_tokens: int = 1024  # cap of a generation's max_tokens (also bounded by the context)
    max_app_sessions: int = 256
    max_session_ttl_s: float = 3600.0
    max_resident_sessions: int = 32  # app sessions keeping a live vLLM request (KV) between turns
    max_streams: int = 1024
    stream_max_events: int = 4096
    stream_max_bytes: int = 1 << 20
    streams_max_total_bytes: int = 64 << 20
    stream_ttl_s: float = 300.0  # retention after a stream completed
    max_input_chunk_bytes: int = 64 << 10  # one streaming-input chunk
    max_input_bytes: int = 1 << 20  # all input of one streaming-input generation


@dataclass(frozen=True)
class WebRtc:
    """``webrtc:`` -- how ``POST /v1/realtime/calls`` connects (ICE).

    ``host_addresses``: the local addresses ICE host candidates are gathered
    on (``[]``: every non-loopback address, aiortc's own choice);
    ``ice_servers``: STUN/TURN servers (``{urls, username?, credential?}``);
    none by default: a server with a reachable address needs none.
    ``connect_timeout_s``: a call whose peer never connects is hung up."""

    host_addresses: tuple[str, ...] = ("127.0.0.1",)
    ice_servers: tuple[dict[str, Any], ...] = ()
    connect_timeout_s: float = 20.0

    @classmethod
    def from_raw(cls, raw: Any) -> WebRtc:
        if raw is None:
            return cls()
        if not isinstance(raw, dict):
            raise ValueError("webrtc must be a mapping")
        bad = set(raw) - {f.name for f in fields(cls)}
        if bad:
            raise ValueError(f"unknown webrtc keys: {sorted(bad)}")
        servers = tuple(dict(s) for s in raw.get("ice_servers") or ())
        for s in servers:
            if "urls" not in s or set(s) - {"urls", "username", "credential"}:
                raise ValueError("webrtc.ice_servers entries are {urls, username?, credential?}")
        return cls(host_addresses=tuple(raw.get("host_addresses", cls.host_addresses)),
                   ice_servers=servers,
                   connect_timeout_s=float(raw.get("connect_timeout_s", cls.connect_timeout_s)))


@dataclass(frozen=True)
class DeployConfig:
    name: str
    model: str
    policy: str
    stages: tuple[StageSpec, ...]
    policy_options: dict[str, Any] = field(default_factory=dict)
    session: dict[str, Any] = field(default_factory=dict)
    limits: Limits = Limits()
    host: str = "127.0.0.1"
    port: int = 8000
    grpc_port: int | None = None  # server.grpc_port: the OpenEngine gRPC services; unset: off
    # server.loop_lag_warning_ms: an event-loop stall this long logs a WARNING
    # with the stack that held the loop (host/loop_lag.py); 0: no warnings.
    loop_lag_warning_ms: float = 250.0
    api_keys: tuple[str, ...] = ()
    workers: Workers = Workers()  # `serve --workers N` behind a router (host/topology.py)
    webrtc: WebRtc = WebRtc()  # POST /v1/realtime/calls (realtime/server/webrtc)
    sip: Sip | None = None  # the SIP user agent (host/sip.py); None: no SIP
    twilio: Twilio | None = None  # Twilio Media Streams (host/twilio.py); None: no Twilio routes
    # Other names clients may use for ``model`` (like vLLM's --served-model-name):
    # each client's default (``gpt-realtime``...) works unchanged; /v1/models lists them.
    served_model_names: tuple[str, ...] = ()
    # Where sessions are kept: memory (one process) or redis (host/store_config.py).
    durability: StoreConfig = StoreConfig()
    # External Responses endpoints GPT-Live delegations may name (host/backends.py)
    responses_backends: dict[str, ResponsesBackend] = field(default_factory=dict)

    @property
    def model_names(self) -> tuple[str, ...]:
        """Every name this deployment answers to, the canonical ``model`` first."""
        return tuple(dict.fromkeys((self.model, *self.served_model_names)))

    def serves(self, name: str | None) -> bool:
        return name in self.model_names

    @classmethod
    def from_dict(cls, raw: dict[str, Any]) -> DeployConfig:
        known = {f.name for f in fields(cls)} | {"server"}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"unknown config keys: {sorted(unknown)}")
        server = raw.get("server") or {}
        stages = []
        for i, spec in enumerate(raw.get("stages") or []):
            spec = dict(spec)
            device = spec.pop("device", None)
            try:
                placed = Device.parse(device) if device is not None else None
            except ValueError as e:
                raise ValueError(f"stages[{i}].device: {e}") from None
            stages.append(StageSpec(type=spec.pop("type"), options=spec, device=placed))
        limits_raw = raw.get("limits") or {}
        bad = set(limits_raw) - {f.name for f in fields(Limits)}
        if bad:
            raise ValueError(f"unknown limits keys: {sorted(bad)}")
        aliases = raw.get("served_model_names") or ()
        if not isinstance(aliases, (list, tuple)) or not all(isinstance(a, str) and a for a in aliases):
            raise ValueError("served_model_names must be a list of non-empty names")
        keys = tuple(raw.get("api_keys") or ())
        env_keys = os.environ.get("VLLM_DUPLEX_API_KEYS")
        if env_keys:  # a comma-separated list; keeps secrets out of config files
            keys = tuple(k for k in env_keys.split(",") if k)
        return cls(
            name=raw["name"], model=raw["model"], policy=raw["policy"], stages=tuple(stages),
            policy_options=dict(raw.get("policy_options") or {}),
            session=dict(raw.get("session") or {}), limits=Limits(**limits_raw),
            host=server.get("host", "127.0.0.1"), port=int(server.get("port", 8000)),
            grpc_port=int(server["grpc_port"]) if server.get("grpc_port") is not None else None,
            loop_lag_warning_ms=_loop_lag_warning_ms(server),
            api_keys=keys, workers=Workers.from_raw(raw.get("workers")),
            served_model_names=tuple(aliases), webrtc=WebRtc.from_raw(raw.get("webrtc")),
            sip=Sip.from_raw(raw.get("sip")), twilio=Twilio.from_raw(raw.get("twilio")),
            durability=StoreConfig.from_raw(raw.get("durability")),
            responses_backends=backends_from_raw(raw.get("responses_backends")),
        )


def _loop_lag_warning_ms(server: dict[str, Any]) -> float:
    raw = server.get("loop_lag_warning_ms", 250.0)
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw < 0:
        raise ValueError(f"server.loop_lag_warning_ms must be a number of ms >= 0 (0: off), "
                         f"got {raw!r}")
    return float(raw)


def resolve_config_path(name_or_path: str | None) -> Path:
    """A path, or a bare name looked up in ``configs/``."""
    candidate = Path(name_or_path or DEFAULT_CONFIG)
    if candidate.suffix in (".yaml", ".yml") and candidate.exists():
        return candidate
    for folder in CONFIG_DIRS:
        path = folder / f"{candidate.stem}.yaml"
        if path.exists():
            return path
    raise FileNotFoundError(f"no deployment config {name_or_path!r} (looked in configs/)")


def load_config(name_or_path: str | None = None) -> DeployConfig:
    path = resolve_config_path(name_or_path)
    with open(path) as f:
        return DeployConfig.from_dict(yaml.safe_load(f) or {})
