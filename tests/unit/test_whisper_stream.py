"""The Whisper stage's listening state on a scripted decoder: which audio each
decode gets (utterance boundaries, prebuffer, tail, caps) and when partials
run (the audio grid, the budget, backlog and silence skips). The decoders
themselves are tested on real audio in tests/integration/test_whisper_stage.py."""

from __future__ import annotations

import numpy as np
import pytest
from vllm_duplex.domain.payloads import TranscriptFinal, TranscriptPartial
from vllm_duplex.stages.listening.whisper_stream import PartialSchedule, WhisperListener

MS = 16  # samples per ms


class Decoder:
    """Records each decode's audio (as a first-sample, length pair on the
    timeline: the audio is a ramp of its own positions) and answers a word
    count of its length."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, int]] = []

    def __call__(self, pcm: np.ndarray) -> str:
        first = int(pcm[0]) if len(pcm) else -1
        self.calls.append((first, len(pcm)))
        return f"{len(pcm) // (100 * MS)} words"


def timeline(start_ms: int, ms: int, loud: bool = True) -> np.ndarray:
    """Audio whose samples count positions (mod 2**15), or silence."""
    if not loud:
        return np.zeros(ms * MS, np.int16)
    return ((np.arange(start_ms * MS, (start_ms + ms) * MS) % 30000) + 1000).astype(np.int16)


class Clock:
    def __init__(self) -> None:
        self.t = 0.0
        self.cost = 0.0

    def __call__(self) -> float:
        self.t += self.cost  # a decode reads it before and after: one cost apart
        return self.t


def feed(listener: WhisperListener, start_ms: int, ms: int, *, loud: bool = True,
         chunk_ms: int = 20, backlog: int = 0) -> list:
    out = []
    for t in range(start_ms, start_ms + ms, chunk_ms):
        out += listener.audio(timeline(t, chunk_ms, loud), t, backlog=backlog)
    return out


def test_a_vad_utterance_is_decoded_from_its_onset_with_a_tail():
    final, partial = Decoder(), Decoder()
    lis = WhisperListener(final, partial, vad_gated=True, tail_ms=300)
    assert feed(lis, 0, 1000) == []  # gated: no utterance before the VAD speaks
    lis.speech_started(600)  # the event comes after the audio it describes
    feed(lis, 1000, 1000)
    out = lis.speech_stopped(1500)
    assert out == [TranscriptFinal("12 words", 600)]
    # from the onset (prebuffered audio) to the stop point plus the tail
    assert final.calls == [(timeline(600, 1)[0], (1800 - 600) * MS)]
    assert not lis.in_utterance


def test_the_tail_is_what_has_arrived_nothing_waits_for_more():
    final = Decoder()
    lis = WhisperListener(final, None, vad_gated=True, tail_ms=300)
    lis.speech_started(0)
    feed(lis, 0, 1000)
    assert lis.speech_stopped(900) == [TranscriptFinal("10 words", 0)]
    assert final.calls[-1][1] == 1000 * MS


def test_partials_follow_the_audio_grid_and_change_only():
    final, partial = Decoder(), Decoder()
    lis = WhisperListener(final, partial, schedule=PartialSchedule(interval_ms=400,
                                                                   first_after_ms=300))
    out = feed(lis, 0, 2000)
    assert all(isinstance(p, TranscriptPartial) for p in out)
    # first at 300 ms of audio, then every 400 ms: 300, 700, 1100, 1500, 1900
    assert [n // MS for _, n in partial.calls] == [300, 700, 1100, 1500, 1900]
    assert [p.text for p in out] == ["3 words", "7 words", "11 words", "15 words", "19 words"]
    assert lis.end_of_utterance() == [TranscriptFinal("20 words", 0)]


def test_a_partial_never_takes_more_than_its_budget_of_real_time():
    partial, clock = Decoder(), Clock()
    clock.cost = 0.6  # each partial decode costs 600 ms of CPU
    lis = WhisperListener(Decoder(), partial, timer=clock,
                          schedule=PartialSchedule(interval_ms=200, budget=0.5, first_after_ms=200))
    feed(lis, 0, 5000)
    starts = [n // MS for _, n in partial.calls]
    # after a 0.6 s decode the next waits 0.6 / 0.5 = 1.2 s of audio
    assert starts == [200, 1400, 2600, 3800, 5000]


def test_partials_wait_while_the_worker_lags_and_skip_silence():
    partial = Decoder()
    lis = WhisperListener(Decoder(), partial, schedule=PartialSchedule(interval_ms=200,
                                                                       first_after_ms=200))
    feed(lis, 0, 1000, backlog=10)
    assert partial.calls == [] and lis.partials_skipped > 0
    feed(lis, 1000, 400)
    assert len(partial.calls) == 2  # caught up: every 200 ms of audio again
    before = len(partial.calls)
    feed(lis, 1400, 2000, loud=False)  # the trailing silence before speech_stopped
    assert len(partial.calls) == before


def test_a_pause_is_heard_up_to_its_end_at_once_when_the_last_partial_missed_it():
    """semantic_vad judges a pause on the words up to it: a partial the budget
    scheduled before the last word must not be the one judged."""
    partial, clock = Decoder(), Clock()
    clock.cost = 0.6  # a busy CPU: the next scheduled partial is 1.2 s of audio away
    lis = WhisperListener(Decoder(), partial, timer=clock, vad_gated=True,
                          schedule=PartialSchedule(interval_ms=200, budget=0.5, first_after_ms=300))
    lis.speech_started(0)
    out = feed(lis, 0, 1400)  # speech to 1300 ms, then the pause's first 100 ms
    assert [p.text for p in out] == ["3 words"]  # at 300 ms; the next is due at 1500 ms
    out = lis.pause(1300)
    # All the audio so far, decoded now, outside the schedule.
    assert out == [TranscriptPartial("14 words", at_pause=True)]
    assert partial.calls[-1] == (timeline(0, 1)[0], 1400 * MS)
    # The silence that follows adds no words: no scheduled partial re-decodes it.
    before = len(partial.calls)
    feed(lis, 1400, 2000, loud=False)
    assert len(partial.calls) == before


def test_a_pause_the_last_partial_heard_out_is_answered_without_a_decode():
    partial = Decoder()
    lis = WhisperListener(Decoder(), partial, vad_gated=True,
                          schedule=PartialSchedule(interval_ms=200, first_after_ms=200))
    lis.speech_started(0)
    feed(lis, 0, 1000)
    before = len(partial.calls)  # the last one at 1000 ms: past the speech's end
    assert lis.pause(900) == [TranscriptPartial("10 words", at_pause=True)]
    assert len(partial.calls) == before


def _spoken_then_quiet() -> tuple[WhisperListener, Decoder, list]:
    """Speech from 0 to 1000 ms, then quiet: the partial runs early, at 1040 ms."""
    partial = Decoder()
    lis = WhisperListener(Decoder(), partial, vad_gated=True,
                          schedule=PartialSchedule(interval_ms=300, first_after_ms=200))
    lis.speech_started(0)
    feed(lis, 0, 1000)
    out = feed(lis, 1000, 60, loud=False)
    assert out and partial.calls[-1] == (timeline(0, 1)[0], 1040 * MS)
    return lis, partial, out


def test_quiet_audio_between_the_last_partial_and_the_vads_end_needs_no_decode():
    """The VAD places the end of speech a frame or two after the last loud one
    (Silero's probability decays), past the partial made as the audio went
    quiet: that partial heard every word, and the pause is answered at once
    (a re-decode there cost each turn 200-350 ms before its reply could start)."""
    lis, partial, out = _spoken_then_quiet()
    feed(lis, 1060, 60, loud=False)
    before = len(partial.calls)
    assert lis.pause(1064) == [TranscriptPartial(out[-1].text, at_pause=True)]  # Silero's end
    assert len(partial.calls) == before


def test_a_soft_syllable_after_the_last_partial_is_heard_out_at_the_pause():
    lis, partial, _ = _spoken_then_quiet()
    feed(lis, 1060, 40)  # a last syllable after the early partial
    feed(lis, 1100, 20, loud=False)
    before = len(partial.calls)
    assert lis.pause(1100) == [TranscriptPartial("11 words", at_pause=True)]
    assert len(partial.calls) == before + 1


def test_a_pause_without_partials_uses_the_final_decoder_and_none_without_speech():
    final = Decoder()
    lis = WhisperListener(final, None, vad_gated=True)
    assert lis.pause(0) == [TranscriptPartial("", at_pause=True)]  # no utterance: no words
    lis.speech_started(0)
    feed(lis, 0, 800)
    assert lis.pause(700) == [TranscriptPartial("8 words", at_pause=True)]
    assert final.calls == [(timeline(0, 1)[0], 800 * MS)]
    assert lis.in_utterance  # a pause does not end the utterance: its final is still to come
    assert lis.speech_stopped(700) == [TranscriptFinal("8 words", 0)]


def test_long_utterances_stop_getting_partials_but_the_final_has_it_all():
    final, partial = Decoder(), Decoder()
    lis = WhisperListener(final, partial, vad_gated=False,
                          schedule=PartialSchedule(interval_ms=1000, max_partial_s=3))
    feed(lis, 0, 10_000, chunk_ms=100)
    assert max(n for _, n in partial.calls) <= 3000 * MS
    assert lis.end_of_utterance() == [TranscriptFinal("100 words", 0)]
    assert final.calls == [(timeline(0, 1)[0], 10_000 * MS)]


def test_memory_is_bounded_when_nothing_ends_the_utterance():
    final = Decoder()
    lis = WhisperListener(final, None, max_utterance_s=5.0)
    feed(lis, 0, 20_000, chunk_ms=500)
    assert sum(len(p) for _, p in lis._chunks) <= 5500 * MS
    lis.end_of_utterance()
    assert final.calls == [(timeline(15_000, 1)[0], 5000 * MS)]  # its last 5 s


def test_without_a_vad_audio_opens_and_the_first_vad_onset_restarts():
    final = Decoder()
    lis = WhisperListener(final, None)  # vad_gated=None
    feed(lis, 0, 1000)
    assert lis.in_utterance  # audio opened one (there may be no VAD)
    lis.speech_started(700)
    feed(lis, 1000, 500)
    lis.speech_stopped(1400)
    assert final.calls == [(timeline(700, 1)[0], (1500 - 700) * MS)]
    feed(lis, 1500, 500)
    assert not lis.in_utterance  # from the first VAD event on, only the VAD opens


def test_manual_end_without_audio_and_a_rewound_stream():
    final = Decoder()
    lis = WhisperListener(final, None, vad_gated=False)
    assert lis.end_of_utterance() == [TranscriptFinal("")]
    feed(lis, 5000, 500)
    feed(lis, 0, 300)  # a new audio stream starts over at 0
    lis.end_of_utterance()
    assert final.calls == [(timeline(0, 1)[0], 300 * MS)]


def test_whole_ms_start_stamps_lose_no_samples():
    final = Decoder()
    lis = WhisperListener(final, None, vad_gated=False)
    pcm, pos = np.arange(1, 16001, dtype=np.int16), 0
    for n in (333, 1000, 7, 5000, 9660):  # chunks that are not whole ms
        lis.audio(pcm[pos:pos + n], pos // MS)
        pos += n
    lis.end_of_utterance()
    assert final.calls == [(1, 16000)]


def test_schedule_validation():
    with pytest.raises(ValueError):
        PartialSchedule(budget=0)
    with pytest.raises(ValueError):
        PartialSchedule(interval_ms=0)


class Sure(Decoder):
    """A partial decoder that says how sure it is (``avg_logprob``), and
    whether its answer is a loop it could not get out of (``suspect``)."""

    def __init__(self, logprob: float, *, suspect: bool = False) -> None:
        super().__init__()
        self.logprob = logprob
        self.suspect = suspect

    def __call__(self, pcm: np.ndarray):  # type: ignore[override]
        from vllm_duplex.stages.listening.whisper_model import Transcription
        return Transcription(super().__call__(pcm), avg_logprob=self.logprob, suspect=self.suspect)


def paused_utterance(final: Decoder, partial: Decoder, **kw) -> WhisperListener:
    """Speech from 0 to 1300 ms, then the VAD's pause report at 1400 ms."""
    lis = WhisperListener(final, partial, vad_gated=True, tail_ms=300,
                          schedule=PartialSchedule(interval_ms=5000, first_after_ms=5000), **kw)
    lis.speech_started(0)
    feed(lis, 0, 1400)
    assert lis.pause(1300) == [TranscriptPartial("14 words", at_pause=True)]
    return lis


def test_a_confident_answer_at_the_pause_is_the_final_without_a_second_decode():
    final = Decoder()
    lis = paused_utterance(final, Sure(-0.1))
    assert not lis.final_pending
    feed(lis, 1400, 400, loud=False)
    assert lis.speech_stopped(1300) == [TranscriptFinal("14 words", 0)]
    assert final.calls == [] and lis.finals_from_pause == 1 and not lis.in_utterance


def test_a_loop_the_partial_decoder_could_not_leave_is_never_the_final():
    """tiny.en greedy looping ("Tell me about the Eiffel tour Tell me about
    the Eiffel tour Tell me ...") scores a high log-probability: the final
    decoder decides instead."""
    final = Decoder()
    lis = paused_utterance(final, Sure(-0.1, suspect=True))
    assert lis.final_pending
    lis.final_at_pause()
    feed(lis, 1400, 400, loud=False)
    assert lis.speech_stopped(1300) == [TranscriptFinal("14 words", 0)]
    assert len(final.calls) == 1 and lis.finals_from_pause == 0


def test_an_unsure_answer_has_the_final_decoder_hear_the_pause_while_the_silence_accrues():
    final = Decoder()
    lis = paused_utterance(final, Sure(-0.9))
    assert lis.final_pending
    lis.final_at_pause()  # the port runs it right after the answer went out
    assert final.calls == [(timeline(0, 1)[0], 1400 * MS)] and not lis.final_pending
    feed(lis, 1400, 400, loud=False)
    assert lis.speech_stopped(1300) == [TranscriptFinal("14 words", 0)]
    assert len(final.calls) == 1  # the end of speech took it: no decode on the critical path


def test_speech_after_the_pause_makes_its_answer_void():
    final = Decoder()
    lis = paused_utterance(final, Sure(-0.1))
    feed(lis, 1400, 1000)  # the user goes on
    assert lis.speech_stopped(2300) == [TranscriptFinal("24 words", 0)]
    assert final.calls == [(timeline(0, 1)[0], 2400 * MS)]  # all of it, decoded at the end


def test_without_a_confidence_threshold_the_final_decoder_always_decides():
    final = Decoder()
    lis = paused_utterance(final, Sure(-0.01), confident_logprob=None)
    assert lis.final_pending
    feed(lis, 1400, 400, loud=False)
    assert lis.speech_stopped(1300) == [TranscriptFinal("16 words", 0)]  # decoded at the end, with the tail
    assert len(final.calls) == 1


def test_a_pause_heard_by_the_final_decoder_is_the_final_with_no_second_decode():
    """``now_is_final``: the words a turn waits on are decoded as the final is
    (tiny.en beam 5 in the default): unsure or not, that answer is the final."""
    final, now = Decoder(), Sure(-0.9)
    lis = WhisperListener(final, Sure(-0.9), partial_now=now, now_is_final=True, vad_gated=True,
                          tail_ms=300, schedule=PartialSchedule(interval_ms=5000, first_after_ms=5000))
    lis.speech_started(0)
    feed(lis, 0, 1400)
    assert lis.pause(1300) == [TranscriptPartial("14 words", at_pause=True)]
    assert len(now.calls) == 1 and not lis.final_pending
    feed(lis, 1400, 400, loud=False)
    assert lis.speech_stopped(1300) == [TranscriptFinal("14 words", 0)]
    assert final.calls == []


def test_a_grid_partial_that_heard_the_pause_is_not_taken_for_the_final_decoders_answer():
    """The speech ends on the audio grid: the greedy partial decoder's answer
    heard it all, but it is not the final decoder's, and unsure -- the final
    decoder hears the pause again while the silence accrues."""
    final, grid, now = Decoder(), Sure(-0.9), Sure(-0.9)
    lis = WhisperListener(final, grid, partial_now=now, now_is_final=True, vad_gated=True,
                          tail_ms=300, timer=Clock(),
                          schedule=PartialSchedule(interval_ms=400, first_after_ms=300))
    lis.speech_started(0)
    feed(lis, 0, 1100)  # grid partials at 300, 700 and 1100 ms: the last hears the speech out
    feed(lis, 1100, 200, loud=False)
    assert grid.calls[-1] == (timeline(0, 1)[0], 1100 * MS) and now.calls == []
    assert lis.pause(1100) == [TranscriptPartial("11 words", at_pause=True)]
    assert now.calls == [] and lis.final_pending
    lis.final_at_pause()
    assert lis.speech_stopped(1100) == [TranscriptFinal("13 words", 0)]
    assert len(final.calls) == 1


def test_under_server_vad_the_final_at_a_pause_hears_the_audio_after_the_words():
    """The answer made as the audio went quiet (40 ms in) stops at the last
    loud frame, cutting a soft last consonant (a real speech's "Americans"
    was heard "American"). When the turn cannot end for a while (server_vad's
    silence, ``final_can_wait``), the final decoder hears everything held at
    the pause again while the silence accrues, and that is the final."""
    final, now = Decoder(), Sure(-0.1)
    lis = WhisperListener(final, Sure(-0.1), partial_now=now, now_is_final=True, vad_gated=True,
                          tail_ms=300, timer=Clock(),
                          schedule=PartialSchedule(interval_ms=5000, first_after_ms=300))
    lis.speech_started(0)
    feed(lis, 0, 1300)
    feed(lis, 1300, 60, loud=False)  # 40 ms quiet: the early answer, decoded up to 1340 ms
    assert now.calls == [(timeline(0, 1)[0], 1340 * MS)]
    feed(lis, 1360, 140, loud=False)  # the pause is reported with 1500 ms held
    assert lis.pause(1300, final_can_wait=True) == [TranscriptPartial("13 words", at_pause=True)]
    assert lis.final_pending
    lis.final_at_pause()
    assert final.calls == [(timeline(0, 1)[0], 1500 * MS)]
    feed(lis, 1500, 300, loud=False)
    assert lis.speech_stopped(1300) == [TranscriptFinal("15 words", 0)]
    assert len(final.calls) == 1  # nothing left to decode at the end of speech


def test_a_pause_the_session_may_end_at_once_keeps_its_answer_as_the_final():
    final, now = Decoder(), Sure(-0.1)
    lis = WhisperListener(final, Sure(-0.1), partial_now=now, now_is_final=True, vad_gated=True,
                          tail_ms=300, timer=Clock(),
                          schedule=PartialSchedule(interval_ms=5000, first_after_ms=300))
    lis.speech_started(0)
    feed(lis, 0, 1300)
    feed(lis, 1300, 200, loud=False)
    lis.pause(1300)  # semantic_vad: no second decode on the turn's critical path
    assert not lis.final_pending
    assert lis.speech_stopped(1300) == [TranscriptFinal("13 words", 0)] and final.calls == []
