"""Acoustic echo cancellation (``audio.input.echo_cancellation``): AEC3 takes
the reply out of what a room's microphone heard for the VAD, a linear
canceller for the ASR keeps the user's words spoken over it; the
reference is what the client's speaker played when
(``ClientPlayback``, on a virtual clock); the input buffer runs it without
losing or shifting a sample; the wire refuses a bad value by name."""

from __future__ import annotations

import numpy as np
import pytest
from support.echo_frames import frames_db, speechy
from support.speech_fixtures import recognize, speak
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.events import Envelope
from vllm_duplex.domain.fence import Fence
from vllm_duplex.domain.session_config import AudioFormat
from vllm_duplex.media.echo import FRAME, Cancelled, EchoCanceller, ResidualEchoSuppressor
from vllm_duplex.media.echo_bands import BandResidualSuppressor
from vllm_duplex.session.echo import CONFIRM_S, REANCHOR_S, ClientPlayback, EchoPath
from vllm_duplex.session.effects import Emit
from vllm_duplex.session.input_buffer import InputBuffer
from vllm_duplex.testing.room import Room, impulse_response

RATE = 16000
REPLY = ("The capital of France is Paris, a city on the river Seine, famous for the "
         "Eiffel Tower, its museums and its cafes.")


def rms(x: np.ndarray) -> float:
    return float(np.sqrt(np.mean(x.astype(np.float64) ** 2))) or 1e-9


def db(a: np.ndarray, b: np.ndarray) -> float:
    return 20 * np.log10(rms(a) / rms(b))


@pytest.fixture(scope="module")
def reply() -> np.ndarray:
    return speak(REPLY, rate=RATE, lead_s=0.0, tail_s=0.3, voice="slt")


def in_room(reply: np.ndarray, gain_db: float, voice: np.ndarray | None = None) -> np.ndarray:
    """The microphone of a room whose speaker plays ``reply`` from 0 (120 ms
    away with a reverberant tail), faint noise, and ``voice`` over it."""
    noise = np.random.default_rng(3).normal(0, 30, RATE)  # about -60 dBFS
    room = Room(impulse_response(RATE, gain_db=gain_db), RATE, seconds=reply.size / RATE + 1,
                noise=noise)
    room.play(reply, 0)
    n = reply.size - reply.size % FRAME
    padded = None if voice is None else np.pad(voice, (0, max(0, n - voice.size)))[:n]
    return room.mic(0, n, padded)


def cancelled(mic: np.ndarray, reference: np.ndarray) -> np.ndarray:
    """What the VAD hears: AEC3's output with its residual turned down."""
    return EchoCanceller().process(mic, reference[:mic.size]).speech


@pytest.mark.parametrize("gain_db", [-10, 0])
def test_the_reply_heard_back_is_removed(reply, gain_db):
    mic = in_room(reply, gain_db)
    out = cancelled(mic, reply)
    assert out.size == mic.size and out.dtype == np.int16
    later = slice(2 * RATE, mic.size)  # after two seconds of learning the room
    assert db(out[later], mic[later]) < -25, db(out[later], mic[later])


def test_no_reference_no_change_to_the_voice():
    """Nothing played: the user's voice goes through as loud as it came."""
    voice = speak("What is the capital of France?", rate=RATE, lead_s=0.5, tail_s=0.3)
    voice = voice[:voice.size - voice.size % FRAME]
    out = EchoCanceller().process(voice, np.zeros_like(voice))
    loud = np.abs(voice.astype(np.int32)) > 2000
    assert abs(db(out.words[loud], voice[loud])) < 1.5
    assert abs(db(out.speech[loud], voice[loud])) < 1.5


def test_the_user_speaking_over_the_reply_is_kept(reply):
    """Double talk: a question spoken over the echo (from 2.5 s, after the
    canceller learned the room; the speaker 20 dB down, the user close to
    the microphone) keeps most of its level where it is loud, while the
    reply alone, before it, is gone. (AEC3 ducks the user during double
    talk; how much that costs Whisper, echo level by echo level, is
    bench/room_echo.py's.)"""
    question = speak("Wait, what about Berlin and Rome?", rate=RATE, lead_s=2.5, tail_s=0.0,
                     voice="rms").astype(np.float64) * 0.5
    mic = in_room(reply, -20, voice=question)
    out = cancelled(mic, reply)
    n = out.size
    q = np.pad(question, (0, max(0, n - question.size)))[:n]
    loud = np.abs(q) > 2000
    assert loud.sum() > RATE // 4
    assert db(out[loud], q[loud]) > -10, db(out[loud], q[loud])
    before = slice(RATE, int(2.4 * RATE))  # the reply alone
    assert db(out[before], mic[before]) < -20, db(out[before], mic[before])


def test_words_over_a_loud_echo_reach_the_asr_not_gated_with_it(reply):
    """Double talk with the echo as loud as the reply played (0 dB) and the
    user quieter than it at the microphone: the residual suppressor takes
    their frames down with the echo's, so the VAD's view loses them (fine:
    an onset needs speech over the echo); the ASR's view keeps them, over 5
    dB louder than the VAD's. The echo alone is gone from the VAD's view
    (AEC3 and the suppressor); the ASR's linear filter takes it down less
    while it is still learning the room (the next test)."""
    question = speak("Wait, what about Berlin and Rome?", rate=RATE, lead_s=2.5, tail_s=0.0,
                     voice="rms").astype(np.float64) * 0.25
    mic = in_room(reply, 0, voice=question)
    out = EchoCanceller().process(mic, reply[:mic.size])
    q = np.pad(question, (0, max(0, mic.size - question.size)))[:mic.size]
    loud = np.abs(q) > 1000
    assert db(mic[loud], q[loud]) > 5  # the echo louder than the user
    words, speech = db(out.words[loud], q[loud]), db(out.speech[loud], q[loud])
    assert words > -15, words
    assert speech < words - 5, (words, speech)
    before = slice(RATE, int(2.4 * RATE))  # the reply alone
    assert db(out.speech[before], mic[before]) < -25
    assert db(out.words[before], mic[before]) < -5


@pytest.mark.parametrize("gain_db", [-10, 0, 6])
def test_the_asr_hears_the_user_over_a_loud_echo_and_little_of_the_echo(reply, gain_db):
    """What the ASR is given where the user speaks over the reply (from 2.5
    s, as loud at the microphone as the echo): Whisper hears their question
    in it, and their voice keeps more of its level than in AEC3's output
    (some 5 dB down where the echo's bands are turned down with it; AEC3
    ducks it 9-11 dB here). The echo alone after them is taken more than 22 dB
    down: the linear filter's residual turned down band by band (the filter
    alone left it 19-20 dB down here)."""
    said = speak("Wait, what about Berlin and Rome?", rate=RATE, lead_s=2.5, tail_s=0.0,
                 voice="rms").astype(np.float64)
    alone = in_room(reply, gain_db)
    question = slice(int(2.5 * RATE), said.size)
    said *= rms(alone[question]) / rms(said[question])  # as loud as the echo there
    mic = in_room(reply, gain_db, voice=said)
    words = EchoCanceller().process(mic, reply[:mic.size]).words
    aec3 = EchoCanceller(words="aec3").process(mic, reply[:mic.size]).words
    q = np.pad(said, (0, max(0, mic.size - said.size)))[:mic.size]
    loud = np.abs(q) > np.abs(q).max() / 4
    assert abs(db(mic[loud], q[loud])) < 3  # the echo about as loud as the user
    assert db(words[loud], q[loud]) > db(aec3[loud], q[loud]) + 3
    heard = recognize(words[int(2.3 * RATE):said.size + RATE // 2], RATE)
    assert "berlin" in heard and "rome" in heard, heard
    after = slice(said.size + RATE // 10, mic.size)  # the reply alone again
    assert db(words[after], mic[after]) < -22, db(words[after], mic[after])


def test_an_echo_later_than_the_linear_filter_reaches_is_met_by_the_aligner_for_the_asr(reply):
    """The reference leads the echo by more than the linear filter spans (a
    client's long playback buffer: 470 ms here, the filter 250): the
    canceller holds the reference back to meet its echo
    (``media/echo_lag.py``), and the ASR's view has it as far down after two
    seconds as an echo 120 ms late (within 3 dB, over 18 dB). With the
    reference as it came the filter cannot reach it and the ASR would hear
    nearly all of it."""
    def words_db(delay_ms: int, align: bool) -> float:
        noise = np.random.default_rng(3).normal(0, 30, RATE)
        room = Room(impulse_response(RATE, gain_db=-10, delay_ms=delay_ms), RATE,
                    seconds=reply.size / RATE + 1, noise=noise)
        room.play(reply, 0)
        n = reply.size - reply.size % FRAME
        mic = room.mic(0, n)
        words = EchoCanceller(align=align).process(mic, reply[:n]).words
        later = slice(2 * RATE, n)
        return db(words[later], mic[later])

    late, near = words_db(470, True), words_db(120, True)
    assert late < -18 and abs(late - near) < 3, (late, near)
    assert words_db(470, False) > -5  # the aligner is what reaches it


def test_whole_frames_of_the_same_length_only():
    with pytest.raises(ValueError):
        EchoCanceller().process(np.zeros(FRAME + 1, np.int16), np.zeros(FRAME + 1, np.int16))
    with pytest.raises(ValueError):
        EchoCanceller().process(np.zeros(FRAME, np.int16), np.zeros(2 * FRAME, np.int16))


# ---- the reference: the client's playback, on a virtual clock ---------------------


def ramp(n: int, start: int = 1) -> np.ndarray:
    return (np.arange(start, start + n) % 30000).astype(np.int16)


def test_audio_sent_faster_than_real_time_plays_at_real_time():
    """Four half-second deltas sent 10 ms apart (an unpaced socket) play back
    to back from the first's arrival; a later one, after the speaker ran
    dry, plays from its own arrival."""
    play = ClientPlayback()
    pcm = ramp(4 * 8000)
    for i in range(4):
        play.sent("item_a", pcm[i * 8000:(i + 1) * 8000], at=10.0 + 0.01 * i)
    assert play.play_end == pytest.approx(12.0)
    assert np.array_equal(play.render(11.0, 160), pcm[16000:16160])
    assert np.array_equal(play.render(11.99, 320)[:160], pcm[-160:])
    assert not play.render(11.99, 320)[160:].any()  # dry after 12.0
    play.sent("item_b", ramp(1600, 7), at=20.0)
    assert not play.render(19.9, 1600).any()
    assert np.array_equal(play.render(20.0, 1600), ramp(1600, 7))


def test_a_truncated_item_stops_playing_where_it_was_cut():
    play = ClientPlayback()
    play.sent("item_a", ramp(16000), at=0.0)
    play.sent("item_a", ramp(16000, 16001), at=0.1)
    play.truncated("item_a", 1500)  # the client stopped at 1.5 s of the item
    assert play.play_end == pytest.approx(1.5)
    assert np.array_equal(play.render(1.4, 1600), ramp(1600, 22401))
    assert not play.render(1.5, 16000).any()
    play.sent("item_b", ramp(160), at=1.6)  # the next reply plays at once
    assert np.array_equal(play.render(1.6, 160), ramp(160))


def test_what_played_is_forgotten():
    play = ClientPlayback()
    for i in range(100):
        play.sent("item_a", ramp(1600), at=i * 0.1)
    play.render(9.95, 160)
    assert play.pieces == 1


class Recording(EchoCanceller):
    """The canceller's inputs, kept; the microphone goes through unchanged."""

    def __init__(self) -> None:
        self.references: list[np.ndarray] = []

    def process(self, mic: np.ndarray, reference: np.ndarray) -> Cancelled:
        assert mic.size == reference.size
        self.references.append(reference)
        return Cancelled(mic, mic)


def delta(item: str, pcm16k: np.ndarray) -> Emit:
    event = ev.OutputAudioDelta(response_id="r", item_id=item, output_index=0, content_index=0,
                                delta=pcm16k.astype("<i2").tobytes())
    return Emit(Envelope(1, Fence("s"), event))


def test_the_microphone_hears_the_reply_at_the_time_it_played():
    """A reply sent at t=1.0 in one burst; the microphone streams 20 ms
    chunks at real time from t=0, each arriving as it ends or late by up to
    300 ms (the network, a busy event loop). The reference given with each
    sample is what the speaker played then: silence before 1.0, the reply
    from 1.0 on, whatever the jitter; a pause in the stream places it on the
    clock again."""
    rec = Recording()
    path = EchoPath(AudioFormat(rate=16000), canceller=rec)
    reply = ramp(64000, 5)  # plays from 1.0 to 5.0
    chunk = 320
    jitter = np.random.default_rng(0).uniform(0, 0.03, 100)
    jitter[0] = 0.0
    jitter[60:70] = np.linspace(0.3, 0.0, 10)  # a stall, then the backlog
    for i in range(100):  # 2 s of microphone
        at = (i + 1) * 0.02 + jitter[i]
        if i == 50:
            path.sent([delta("item_a", reply)], at=1.0)
        path.captured(chunk, at)
        path.process(np.zeros(chunk, np.int16))
    reference = np.concatenate(rec.references)
    assert not reference[:16000].any()
    assert np.array_equal(reference[16000:32000], reply[:16000])
    # The client stops streaming for 1.5 s: once its chunks have come late at
    # real time for CONFIRM_S, the stream is placed by their arrival (heard
    # from 3.5 s), not where it had stopped (2.0 s).
    resumed = 2.02 + REANCHOR_S + 0.5
    for k in range(int(CONFIRM_S / 0.02) + 2):
        path.captured(chunk, resumed + 0.02 * k)
        path.process(np.zeros(chunk, np.int16))
    heard = int((resumed - 0.02 + 0.02 * k - 1.0) * RATE)
    assert np.array_equal(rec.references[-1], reply[heard:heard + chunk])


def test_a_stall_then_its_backlog_keeps_the_reply_where_it_played():
    """The microphone streams at real time while the reply plays, then
    nothing comes for 2.7 s (the network, or the server's own process
    frozen), then the backlog faster than real time, and real time again. Every
    sample was heard when its place says: the reference goes on with the
    reply where it was, without a gap or a jump."""
    rec = Recording()
    path = EchoPath(AudioFormat(rate=16000), canceller=rec)
    reply = ramp(16000 * 8, 5)  # plays from 0.5 to 8.5
    path.sent([delta("item_a", reply)], at=0.5)
    chunk = 320
    arrivals = [(i + 1) * 0.02 for i in range(100)]  # 2 s at real time
    # 2.7 s of it twice as fast as real time (the server reading the backlog
    # as fast as it handles each chunk), then real time again
    arrivals += [4.7 + 0.01 * k for k in range(135)]
    arrivals += [arrivals[-1] + (k + 1) * 0.02 for k in range(50)]
    for at in arrivals:
        path.captured(chunk, at)
        path.process(np.zeros(chunk, np.int16))
    reference = np.concatenate(rec.references)
    expected = np.zeros(reference.size, np.int16)
    expected[8000:] = reply[:reference.size - 8000]
    assert np.array_equal(reference, expected)


# ---- the input buffer ----------------------------------------------------------------


def test_the_input_buffer_loses_and_shifts_nothing_with_echo_cancellation():
    """24 kHz chunks of odd sizes through the canceller and the suppressor:
    the turn holds as many samples as without them, every chunk is stamped
    where it lies, and turning echo cancellation on and off mid-turn keeps
    the audio held."""
    pcm24 = np.random.default_rng(1).normal(0, 3000, 24000).astype(np.int16)
    sizes = [int(n) for n in np.random.default_rng(2).integers(37, 700, 100)]
    cuts = [n for n in np.cumsum(sizes) if n < pcm24.size]
    sizes = [int(n) for n in np.diff([0, *cuts, pcm24.size])]
    clock = [0.0]

    def run(buf: InputBuffer) -> tuple[np.ndarray, list]:
        chunks, at = [], 0
        for i, n in enumerate(sizes):
            if i == len(sizes) // 3:
                buf.set_echo_cancellation("server", AudioFormat())
            if i == 2 * len(sizes) // 3:
                buf.set_echo_cancellation(None, AudioFormat())
                buf.set_echo_cancellation("server", AudioFormat())
            clock[0] += n / 24000
            chunk = buf.append(pcm24[at:at + n].astype("<i2").tobytes())
            at += n
            if chunk is not None:
                chunks.append(chunk)
        audio, errors = buf.commit()
        assert not errors
        return audio, chunks

    plain = InputBuffer(AudioFormat(), max_ms=5000)
    for n, at in zip(sizes, np.cumsum([0, *sizes])):
        plain.append(pcm24[at:at + n].astype("<i2").tobytes())
    plain_audio, _ = plain.commit()
    buf = InputBuffer(AudioFormat(), max_ms=5000, clock=lambda: clock[0])
    buf.set_noise_reduction("near_field")
    audio, chunks = run(buf)
    assert audio.size == plain_audio.size
    stamps = [c.start_ms for c in chunks]
    lengths = np.cumsum([0] + [c.pcm.size for c in chunks])[:-1]
    assert stamps == [int(n) * 1000 // RATE for n in lengths]


def test_the_turn_keeps_what_the_asr_hears_and_each_chunk_carries_the_vad_s_view():
    """With echo cancellation a chunk's ``pcm`` is the ASR's (AEC3's output)
    and its ``vad_pcm`` the VAD's, sample for sample; the committed turn is
    the ASR's. Without it there is one view."""
    reply = np.random.default_rng(5).normal(0, 3000, 16000).astype(np.int16)
    mic = np.concatenate([np.zeros(1600), reply * 0.3])[:16000]
    pcm24 = np.round(np.repeat(mic, 3)[::2]).astype(np.int16)  # 24 kHz, roughly
    clock = [0.0]
    buf = InputBuffer(AudioFormat(), max_ms=5000, clock=lambda: clock[0])
    buf.set_echo_cancellation("server", AudioFormat(rate=16000))
    buf.sent([delta("item_a", reply)], at=0.0)
    chunks = []
    for at in range(0, pcm24.size, 480):
        clock[0] = (at + 480) / 24000
        chunk = buf.append(pcm24[at:at + 480].astype("<i2").tobytes())
        if chunk is not None:
            chunks.append(chunk)
    assert all(c.vad_pcm is not None and c.vad_pcm.size == c.pcm.size for c in chunks)
    asr = np.concatenate([c.pcm for c in chunks])
    vad = np.concatenate([c.vad_pcm for c in chunks])
    assert rms(vad[8000:]) < rms(asr[8000:])  # the residual turned down for the VAD alone
    audio, _ = buf.commit()
    assert np.array_equal(audio[:asr.size], asr)
    plain = InputBuffer(AudioFormat(), max_ms=5000)
    assert plain.append(pcm24[:4800].astype("<i2").tobytes()).vad_pcm is None


def test_echo_cancellation_without_libspeexdsp_is_refused(monkeypatch):
    from vllm_duplex.domain.errors import DuplexError
    from vllm_duplex.media import echo_linear

    monkeypatch.setattr(echo_linear, "_LIBRARY", "libspeexdsp-not-installed.so.1")
    echo_linear._speexdsp.cache_clear()
    try:
        with pytest.raises(DuplexError) as err:
            InputBuffer(AudioFormat(), max_ms=5000).set_echo_cancellation("server", AudioFormat())
    finally:
        echo_linear._speexdsp.cache_clear()  # the real library for the tests after
    assert err.value.code == "capability_unsupported"
    assert err.value.param == "session.audio.input.echo_cancellation"
    assert "libspeexdsp" in err.value.message


def test_echo_cancellation_without_livekit_is_refused(monkeypatch):
    import sys

    from vllm_duplex.domain.errors import DuplexError
    monkeypatch.setitem(sys.modules, "livekit.rtc", None)  # as if not installed
    with pytest.raises(DuplexError) as err:
        InputBuffer(AudioFormat(), max_ms=5000).set_echo_cancellation("server", AudioFormat())
    assert err.value.code == "capability_unsupported"
    assert err.value.param == "session.audio.input.echo_cancellation"


# ---- the session core ------------------------------------------------------------------


def test_a_session_update_turns_it_on_and_says_so():
    from support.session_core import emitted, make_core
    from vllm_duplex.domain import commands as cmd
    from vllm_duplex.domain.session_config import SessionPatch

    from vllm_duplex.session.effects import Submit

    core = make_core()
    for kind, half in (("server", False), (None, True)):
        effects = core.handle(cmd.SessionUpdate(patch=SessionPatch(echo_cancellation=kind)), 0.0)
        # the VAD hears of it (no second onset grid over the echo's residual)
        [vad] = [e.payload for e in effects if isinstance(e, Submit) and e.stage == "vad"]
        assert vad.half_window_onsets is half
        [updated] = emitted([e for e in effects if not isinstance(e, Submit)])
        expected = {"type": kind} if kind else None
        assert updated.session["audio"]["input"]["echo_cancellation"] == expected


def test_without_livekit_the_update_is_refused_whole(monkeypatch):
    import sys

    from support.session_core import emitted, make_core
    from vllm_duplex.domain import commands as cmd
    from vllm_duplex.domain.session_config import SessionPatch

    monkeypatch.setitem(sys.modules, "livekit.rtc", None)  # as if not installed
    core = make_core()
    [err] = emitted(core.handle(cmd.SessionUpdate(
        patch=SessionPatch(echo_cancellation="server", instructions="be brief"),
        event_id="u1"), 0.0))
    assert (err.error.code, err.error.param, err.error.event_id) == (
        "capability_unsupported", "session.audio.input.echo_cancellation", "u1")
    session = core.session_object()
    assert session["audio"]["input"]["echo_cancellation"] is None
    assert session["instructions"] != "be brief"  # nothing of it applied


# ---- the residual echo suppressor's rule (no AEC3: frames made to measure) ----



def _suppressed(pre: np.ndarray, post: np.ndarray, reference: np.ndarray,
                linear: np.ndarray | None = None) -> np.ndarray:
    s = ResidualEchoSuppressor()
    step = 3 * FRAME  # 30 ms chunks, as the input buffer gives them
    n = pre.size - pre.size % step
    signals = [x for x in (pre, post, reference, linear) if x is not None]
    as16 = [np.clip(x, -32768, 32767).astype(np.int16) for x in signals]
    return np.concatenate([s.process(*(x[i:i + step] for x in as16)) for i in range(0, n, step)])



def test_the_suppressor_pushes_echo_alone_down_and_lets_the_user_through():
    """The reference at -20 dBFS; its echo 10 dB down, 80 ms later; AEC3's
    residual 12 dB under that (what a reverberant room leaves). After a
    second of learning the room, the residual alone comes out as silence
    (Silero still hears the reply's voice in one 30 dB down); the user (their voice as loud at the microphone as the
    reference, ducked 8 dB by AEC3 in double talk) comes through untouched
    from 20 ms after their onset through the first syllable, and mostly
    after it."""
    seconds, onset = 4.0, 3.0
    reference = speechy(seconds, -20, seed=1)
    late = np.concatenate([np.zeros(RATE * 80 // 1000), reference])[:reference.size]
    echo = late * 10 ** (-10 / 20)
    user = speechy(seconds, -20, seed=2)
    user[:int(onset * RATE)] = 0
    pre = echo + user + np.random.default_rng(3).normal(0, 30, echo.size)
    post = echo * 10 ** (-12 / 20) + user * 10 ** (-8 / 20)
    out = _suppressed(pre, post, reference)
    loss = frames_db(out) - frames_db(post[:out.size])
    echo_alone = slice(100, int(onset * 100))  # frames 1 s .. the onset
    loud = frames_db(post[:out.size])[echo_alone] > frames_db(post).max() - 30
    assert np.all(loss[echo_alone][loud] < -20), loss[echo_alone][loud].max()
    alone = out[:out.size - out.size % FRAME].reshape(-1, FRAME)[echo_alone]
    assert not alone.any(), np.abs(alone).max()  # digital silence
    voiced = frames_db(user[:out.size]) > frames_db(user).max() - 15
    frame = np.arange(loss.size)
    first = (frame >= int(onset * 100) + 2) & (frame < int(onset * 100) + 25)  # 20-250 ms in
    strong = frames_db(user[:out.size]) > frames_db(user).max() - 10
    assert np.all(loss[strong & first] > -1.0), loss[strong & first].min()
    # Later, a syllable's fading end may be taken for echo (the rule is broadband: what is
    # left of the user after AEC3's ducking must be over the echo that can be there).
    later = frame >= int(onset * 100) + 25
    assert np.mean(loss[strong & later] > -1.0) > 0.75, np.sort(loss[strong & later])[:10]
    assert np.mean(loss[voiced & later] > -1.0) > 0.6, np.sort(loss[voiced & later])[:10]


def _double_talk(seed: int):
    """4.5 s of a reference at -20 dBFS, its echo 80 ms later and 10 dB down,
    the user as loud as the reference from 3.5 s, and a faint background."""
    seconds, onset = 4.5, 3.5
    reference = speechy(seconds, -20, seed=10 * seed)
    late = np.concatenate([np.zeros(RATE * 80 // 1000), reference])[:reference.size]
    echo = late * 10 ** (-10 / 20)
    user = speechy(seconds, -20, seed=10 * seed + 1)
    user[:int(onset * RATE)] = 0
    noise = np.random.default_rng(3).normal(0, 30, echo.size)
    return reference, echo, user, noise, onset


@pytest.mark.parametrize("seed", [1, 2])
def test_aec3_letting_go_of_the_echo_for_a_moment_is_not_someone_speaking(seed):
    """AEC3's output is, for 200 ms mid-reply, the echo itself (its double-
    talk detector fooled, as in the room bench's large room), while the
    microphone has not risen and the linear filter beside it still takes
    10 dB out (what it does in the bench's medium room): those frames are
    turned down as echo. Judged on AEC3's output alone they come through.
    The user speaking later (ducked 8 dB by AEC3, untouched by the linear
    filter) comes through as before."""
    reference, echo, user, noise, onset = _double_talk(seed)
    pre = echo + user + noise
    residual = echo * 10 ** (-20 / 20)
    let_go = slice(int(2.5 * RATE), int(2.7 * RATE))
    residual[let_go] = echo[let_go] * 10 ** (-1 / 20)
    post = residual + user * 10 ** (-8 / 20) + noise
    linear = echo * 10 ** (-10 / 20) + user + noise
    let_go_frames = slice(250, 270)
    for given, let_go_loss in ((linear, -40.0), (None, None)):
        out = _suppressed(pre, post, reference, given)
        loss = frames_db(out) - frames_db(post[:out.size])
        if given is None:  # AEC3's output alone: the echo passes as a voice
            assert loss[let_go_frames].max() > -1.0, loss[let_go_frames]
        else:
            assert loss[let_go_frames].max() < let_go_loss, loss[let_go_frames]
        frame = np.arange(loss.size)
        first = (frame >= int(onset * 100) + 2) & (frame < int(onset * 100) + 25)
        strong = frames_db(user[:out.size]) > frames_db(user).max() - 10
        assert np.all(loss[strong & first] > -1.0), loss[strong & first].min()


@pytest.mark.parametrize("seed", [1, 2])
def test_a_voice_aec3_ducks_deep_passes_from_its_first_frames_as_the_linear_canceller_kept_it(
        seed):
    """The user as loud at the microphone as the reference (10 dB over its
    echo), ducked 16 dB by AEC3 in double talk, as AEC3 does for its first
    hundreds of ms: under the whole echo in AEC3's output. AEC3 leaves the
    echo alone 25 dB down, the linear canceller 15 dB, and the user as said.
    Each output is far over what its canceller leaves of the echo, so the
    user's strong frames pass from 20 ms in, at the linear canceller's level
    (the filter has had the room for seconds), 12 dB and more louder than
    AEC3 left them; the echo alone before stays silence. With AEC3's output
    alone, judged against the whole echo, the same frames are turned down."""
    reference, echo, user, noise, onset = _double_talk(seed)
    pre = echo + user + noise
    post = echo * 10 ** (-25 / 20) + user * 10 ** (-16 / 20) + noise
    linear = echo * 10 ** (-15 / 20) + user + noise
    frame = np.arange(pre.size // FRAME)
    first = (frame >= int(onset * 100) + 2) & (frame < int(onset * 100) + 25)  # 20-250 ms in
    strong = frames_db(user) > frames_db(user).max() - 10
    echo_alone = slice(100, int(onset * 100))
    out = _suppressed(pre, post, reference, linear)
    n = out.size // FRAME
    assert not out[:n * FRAME].reshape(n, FRAME)[echo_alone].any()  # digital silence
    over_aec3 = frames_db(out) - frames_db(post[:out.size])
    as_said = frames_db(out) - frames_db(linear[:out.size])
    assert np.all(over_aec3[(strong & first)[:n]] > 12.0), over_aec3[(strong & first)[:n]].min()
    assert np.all(np.abs(as_said[(strong & first)[:n]]) < 1.0), as_said[(strong & first)[:n]]
    alone = _suppressed(pre, post, reference)
    loss = frames_db(alone) - frames_db(post[:alone.size])
    assert np.mean(loss[(strong & first)[:loss.size]] < -20) > 0.5


def test_the_suppressor_changes_nothing_without_a_reference():
    voice = speechy(1.0, -20, seed=4)
    pre = np.clip(voice, -32768, 32767).astype(np.int16)
    out = _suppressed(pre, pre, np.zeros_like(voice))
    assert np.array_equal(out, pre[:out.size])


@pytest.mark.parametrize("turn_detection", ["server_vad", "semantic_vad"])
def test_where_the_server_cancels_the_echo_the_vad_decides_onsets_on_its_main_windows(
        turn_detection):
    # The echo's residual scores windows Silero is sure of: a second grid of
    # windows (a sooner barge-in) would give it twice the chances.
    from vllm_duplex.domain.session_config import SessionConfig, TurnDetection
    from vllm_duplex.session.user_turn import UserTurn

    td = TurnDetection(type=turn_detection)
    plain = SessionConfig(model="m", policy="cascade", turn_detection=td)
    cancelled = SessionConfig(model="m", policy="cascade", turn_detection=td,
                              echo_cancellation="server")
    assert UserTurn.vad_config(plain).half_window_onsets
    assert not UserTurn.vad_config(cancelled).half_window_onsets


# ---- the residual echo suppressor band by band (no AEC3: frames made to measure) ----


def _band_limited(x: np.ndarray, lo_hz: float, hi_hz: float) -> np.ndarray:
    spectrum = np.fft.rfft(x)
    hz = np.fft.rfftfreq(x.size, 1 / RATE)
    spectrum[(hz < lo_hz) | (hz > hi_hz)] = 0
    y = np.fft.irfft(spectrum, x.size)
    return y / rms(y) * rms(x)


def _band_suppressed(pre: np.ndarray, post: np.ndarray, reference: np.ndarray,
                     step: int = 2 * FRAME) -> np.ndarray:
    s = BandResidualSuppressor()
    n = pre.size - pre.size % step
    as16 = [np.clip(x, -32768, 32767).astype(np.int16) for x in (pre, post, reference)]
    return np.concatenate([s.process(*(x[i:i + step] for x in as16)) for i in range(0, n, step)])


def _room_with_user(user_band: tuple[float, float], user_db: float):
    """The reference (speech-like noise under 1.5 kHz) at -20 dBFS; its echo
    as loud at the microphone, 80 ms later; AEC3's residual 15 dB under it;
    from 3 s the user at ``user_db`` dBFS in ``user_band``, ducked 8 dB by
    AEC3; a background at -60 dBFS."""
    seconds, onset = 4.0, 3.0
    reference = _band_limited(speechy(seconds, -20, seed=1), 100, 1500)
    echo = np.concatenate([np.zeros(RATE * 80 // 1000), reference])[:reference.size]
    user = _band_limited(speechy(seconds, user_db, seed=2), *user_band)
    user[:int(onset * RATE)] = 0
    background = np.random.default_rng(3).normal(0, 32768 * 10 ** (-60 / 20), echo.size)
    pre = echo + user + background
    post = echo * 10 ** (-15 / 20) + user * 10 ** (-8 / 20) + background
    return pre, post, reference, user, onset


def test_the_band_suppressor_keeps_the_user_where_the_echo_is_not():
    """The user above the echo's bands (2-6 kHz), no louder than the echo:
    the broadband rule turns their frames down with the echo; band by band
    their voice comes through within 3 dB where it is loud, while the
    echo alone before it goes down to the room's background (comfort noise,
    no louder than 6 dB over it), from 20 dB and more over it."""
    pre, post, reference, user, onset = _room_with_user((2000, 6000), -20)
    out = _band_suppressed(pre, post, reference)
    n = out.size
    frame = np.arange(n // FRAME)
    echo_alone = (frame >= 100) & (frame < int(onset * 100))
    background = 10 * np.log10((32768 * 10 ** (-60 / 20)) ** 2)
    loud = frames_db(post[:n]) > background + 20
    assert loud[echo_alone].mean() > 0.25  # the residual's syllables
    assert np.all(frames_db(out)[echo_alone & loud] < background + 6), \
        frames_db(out)[echo_alone & loud].max() - background
    said = frames_db(user[:n]) > frames_db(user).max() - 10
    mine = _band_limited(out.astype(np.float64), 2000, 6000)  # the user's bands of the output
    theirs = _band_limited(user[:n] * 10 ** (-8 / 20), 2000, 6000)
    kept = frames_db(mine) - frames_db(theirs)
    assert np.median(kept[said]) > -3, np.median(kept[said])
    broadband = _suppressed(pre, post, reference)  # the broadband rule, for contrast
    m = broadband.size // FRAME
    lost = (frames_db(_band_limited(broadband.astype(np.float64), 2000, 6000))
            - frames_db(theirs[:m * FRAME]))
    assert np.median(lost[said[:m]]) < -10, np.median(lost[said[:m]])


def test_the_band_suppressor_fills_what_it_took_with_the_room_s_background():
    """Where the echo is turned down the output is the room's background
    level (comfort noise), not digital silence: a faint leak of the echo
    in silence would be the loudest thing the VAD hears."""
    pre, post, reference, _, onset = _room_with_user((2000, 6000), -20)
    out = _band_suppressed(pre, post, reference)
    background = 20 * np.log10(32768 * 10 ** (-60 / 20))
    echo_alone = slice(RATE, int(onset * RATE) - RATE // 5)
    level = 20 * np.log10(rms(out[echo_alone]))
    assert background - 6 < level < background + 6, (level, background)


def test_the_band_suppressor_changes_nothing_without_a_reference():
    voice = speechy(1.0, -20, seed=4)
    pre = np.clip(voice, -32768, 32767).astype(np.int16)
    out = _band_suppressed(pre, pre, np.zeros_like(voice))
    assert np.array_equal(out, pre[:out.size])


def test_the_band_suppressor_gives_the_same_samples_however_the_input_is_cut():
    """The input buffer hands it 10, 20 or 30 ms at a time: no sample moves."""
    pre, post, reference, _, _ = _room_with_user((2000, 6000), -20)
    coarse = _band_suppressed(pre, post, reference, step=6 * FRAME)
    fine = _band_suppressed(pre, post, reference, step=FRAME)
    assert coarse.size > 3 * RATE
    assert np.array_equal(coarse, fine[:coarse.size])


def test_after_the_reply_s_tail_the_band_suppressor_passes_the_input_as_it_is():
    """A second of reply, then none: once its tail is over (60 dB in 0.6 s
    and the hold), no comfort noise and no filter: the input, bit for bit."""
    pre, post, reference, _, _ = _room_with_user((2000, 6000), -20)
    reference[RATE:] = 0
    post = post.copy()
    post[RATE:] = pre[RATE:]  # no echo left either: the room's background and the user
    out = _band_suppressed(pre, post, reference)
    after = slice(int(2.5 * RATE), out.size)
    assert np.array_equal(out[after], np.clip(post, -32768, 32767).astype(np.int16)[after])


@pytest.mark.parametrize("seed", [1, 2])
def test_until_a_canceller_has_the_room_the_echo_it_leaves_whole_now_and_then_is_no_one(seed):
    """A session's first seconds in a large room at 0 dB: the echo as loud as
    the reference, AEC3 taking 10 dB out of it and letting go (1 dB) for
    200 ms every 700 ms, the linear filter not yet converged (3 dB). Those
    frames stand as near the whole echo as a voice would, and the gate let
    them through; neither canceller has the room, so they must also stand
    over the most each leaves: turned down. The user 10 dB over the echo
    from 3.5 s still passes from their first strong frames."""
    reference, echo, user, noise, onset = _double_talk(seed)
    echo *= 10 ** (10 / 20)  # 0 dB
    user *= 10 ** (20 / 20)  # 10 dB over it
    pre = echo + user + noise
    residual = echo * 10 ** (-10 / 20)
    let_go = np.zeros(pre.size, bool)
    for start in np.arange(0.6, onset - 0.2, 0.7):
        let_go[int(start * RATE):int((start + 0.2) * RATE)] = True
    residual[let_go] = echo[let_go] * 10 ** (-1 / 20)
    post = residual + user * 10 ** (-8 / 20) + noise
    linear = echo * 10 ** (-3 / 20) + user + noise
    out = _suppressed(pre, post, reference, linear)
    n = out.size // FRAME
    # from 0.5 s to the voice: the gate's floor (-80 dB), a sample or two of the echo left
    alone = np.abs(out[:n * FRAME].reshape(n, FRAME)[50:int(onset * 100)]).max(1)
    assert np.all(alone <= 2), np.flatnonzero(alone > 2) / 100 + 0.5
    loss = frames_db(out) - frames_db(post[:out.size])  # AEC3's (the linear one has no room)
    frame = np.arange(loss.size)
    first = (frame >= int(onset * 100) + 2) & (frame < int(onset * 100) + 25)  # 20-250 ms in
    strong = frames_db(user[:out.size]) > frames_db(user).max() - 6
    # each passes (at most the gain's ramp in, where the frame before was turned down)
    assert np.all(loss[strong & first] > -3.0), loss[strong & first].min()


@pytest.mark.parametrize("seed", [1, 2])
@pytest.mark.parametrize("aec3_out, linear_out", [(1, 2), (9, 5)],
                         ids=["both let go", "both take a little out"])
def test_both_cancellers_letting_go_in_the_ring_of_louder_words_is_no_one(
        seed, aec3_out, linear_out):
    """Late in a long reply in a large room: after a passage 10 dB louder,
    the room rings on (RT60 0.7 s) over the quieter words that follow, past
    what either filter spans, and for 150 ms both cancellers let go of it at
    once (their outputs 1-2 dB under the microphone; or AEC3's 9 dB and the
    linear filter's 5 dB, as a live reply in the large room at 0 dB showed)
    while the reference still plays. Both outputs stand far over what each
    leaves of the echo, so the gate let them through; the microphone is no
    louder than the echo it heard a moment ago: turned down. The user (as
    loud as the reference, 10 dB over its echo) from 3.5 s still passes from
    their first strong frames."""
    reference, echo, user, noise, onset = _double_talk(seed)
    loud = slice(int(2.5 * RATE), int(2.8 * RATE))
    reference[loud] *= 10 ** (10 / 20)
    echo[int(2.58 * RATE):int(2.88 * RATE)] *= 10 ** (10 / 20)  # 80 ms later
    t = np.arange(echo.size - int(2.88 * RATE)) / RATE
    ring = np.random.default_rng(seed).normal(0, 1, t.size) * np.exp(-6.9 * t / 0.7)
    # the tail a few dB under the words that fed it
    echo[int(2.88 * RATE):] += ring * rms(echo[int(2.58 * RATE):int(2.88 * RATE)]) * 10 ** (-3 / 20)
    pre = echo + user + noise
    post = echo * 10 ** (-30 / 20) + user * 10 ** (-8 / 20) + noise
    linear = echo * 10 ** (-22 / 20) + user + noise
    let_go = slice(int(2.9 * RATE), int(3.05 * RATE))
    post[let_go] = pre[let_go] * 10 ** (-aec3_out / 20)
    linear[let_go] = pre[let_go] * 10 ** (-linear_out / 20)
    out = _suppressed(pre, post, reference, linear)
    n = out.size // FRAME
    alone = np.abs(out[:n * FRAME].reshape(n, FRAME)[100:int(onset * 100)]).max(1)
    assert np.all(alone <= 2), np.flatnonzero(alone > 2) / 100 + 1.0
    as_said = frames_db(out) - frames_db(linear[:out.size])  # the filter has the room
    frame = np.arange(as_said.size)
    first = (frame >= int(onset * 100) + 2) & (frame < int(onset * 100) + 25)  # 20-250 ms in
    strong = frames_db(user[:out.size]) > frames_db(user).max() - 10
    assert np.all(as_said[strong & first] > -3.0), as_said[strong & first].min()
