"""What one realtime session may hold: every queue and buffer it owns is
bounded by one of these (the deployment's ``limits:`` fill them in)."""

from __future__ import annotations

from dataclasses import dataclass

from vllm_duplex.session.video_input import VideoLimits


@dataclass(frozen=True)
class SessionLimits:
    mailbox_capacity: int = 1024  # queued client data commands
    # Queued stage outputs. When the session lags this far, adjacent text
    # and audio deltas of one request are merged, and otherwise the stage
    # waits (backpressure) -- the session never waits on a stage.
    stage_capacity: int = 256
    outbound_capacity: int = 8192  # events waiting for a slow socket
    outbound_bytes: int = 16 << 20
    journal_events: int = 4096  # recent events kept for replay
    journal_bytes: int = 8 << 20
    journal_age_s: float = 300.0
    survives_disconnect: bool = False  # detach (and await a resume) instead of closing
    video: VideoLimits = VideoLimits()
    max_items: int = 4096  # conversation items
    max_buffer_ms: int = 10 * 60 * 1000  # uncommitted input audio
    # The session's maximum length (None: none), announced end_warning_s before
    # it ends (session/lifetime.py).
    max_session_s: float | None = None
    end_warning_s: float = 60.0
    # How long one MCP list or call may take, all of it (connect, initialize,
    # the request): past it the item fails with http_error 504 (mcp_client.py).
    mcp_timeout_s: float = 30.0
