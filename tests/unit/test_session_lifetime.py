"""A realtime session's maximum length, through the session core at chosen
times: announced ``end_warning_s`` before, then ended with a typed error and
the ``max_duration`` close."""

from __future__ import annotations

from support.session_core import make_core, types
from vllm_duplex.domain.close_reason import CloseReason
from vllm_duplex.session import lifetime
from vllm_duplex.session.effects import ArmTimer, Close, TimerFired
from vllm_duplex.session.limits import SessionLimits


def test_the_end_is_announced_then_the_session_ends_with_its_reason():
    core = make_core(limits=SessionLimits(max_session_s=600, end_warning_s=60))
    started = core.start("tok", 100.0)
    assert ArmTimer(lifetime.WARNING, 640.0) in started and ArmTimer(lifetime.END, 700.0) in started
    warned = core.handle(TimerFired(lifetime.WARNING), 640.0)
    assert types(warned) == ["duplex.session.expiring"]
    assert warned[0].envelope.event.seconds_left == 60
    ended = core.handle(TimerFired(lifetime.END), 700.0)
    assert types(ended) == ["error", "session.closed", "Close"]
    error = ended[0].envelope.event.error
    assert error.code == "session_expired" and "10 minutes" in error.message
    assert ended[1].envelope.event.reason == "max_duration"
    assert ended[-1] == Close(CloseReason.MAX_DURATION)


def test_no_maximum_no_timers():
    core = make_core(limits=SessionLimits(max_session_s=None))
    assert not [e for e in core.start("tok", 0.0) if isinstance(e, ArmTimer)
                and e.name in (lifetime.WARNING, lifetime.END)]


def test_a_maximum_shorter_than_the_warning_only_ends():
    core = make_core(limits=SessionLimits(max_session_s=30, end_warning_s=60))
    timers = [e for e in core.start("tok", 0.0) if isinstance(e, ArmTimer)]
    assert ArmTimer(lifetime.END, 30.0) in timers
    assert not [t for t in timers if t.name == lifetime.WARNING]
