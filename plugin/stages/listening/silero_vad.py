"""Silero VAD as a stage: the real voice-activity detector of the cascade.

The model ships inside the ``silero-vad`` package (``silero_vad/data``). We
load the file ourselves instead of calling ``silero_vad.load_silero_vad``:
that import pulls in ``utils_vad`` (torch, and torchaudio helpers we must not
touch), and its wrappers keep the recurrent state *inside* the model object,
which would force one model per session. Both backends here are stateless
functions ``(window, state) -> (probability, state)``, so one loaded model
serves every session and each session keeps only its 1 KiB state.

Backend choice: ONNX (onnxruntime, one intra-op thread) is the default, about
0.11 ms per 32 ms window against about 0.33 ms for the TorchScript model on
the same CPU, and it does not import torch at all.

Timeline rules are ``EnergyVad``'s (this class reuses its onset/offset state
machine): events are computed from ``start_ms`` and sample counts, never from
a clock, so they do not depend on chunking or arrival speed.
"""

from __future__ import annotations

import importlib.util
import logging
import threading
import warnings
from pathlib import Path
from typing import Any, Literal, Protocol

import numpy as np
from vllm_duplex.domain.clock import Clock
from vllm_duplex.domain.payloads import (
    INTERNAL_RATE,
    AudioIn,
    StageInput,
    VadConfig,
    VadSpeechStarted,
    VadSpeechStopped,
)
from vllm_duplex.stages.listening.base import ListeningPort, ListeningStage, ObservationPort
from vllm_duplex.stages.listening.energy_vad import EnergyVad
from vllm_duplex.stages.port import StagePort
from vllm_duplex.stages.scheduler import Urgency

log = logging.getLogger(__name__)

WINDOW = 512  # samples per Silero window at 16 kHz (32 ms); the model accepts nothing else
HALF = WINDOW // 2  # the onset phase's windows lie half a window after the main ones
CONTEXT = 64  # trailing samples of the previous window the model expects in front
HYSTERESIS = 0.15  # Silero's own recipe: leave speech below threshold - 0.15
# Silero's recurrent state lags the audio: the window after the last word
# still scores 0.9-1.0 and the next one ~0.5, though both hold no sound, so a
# pause is heard ~90 ms after the speech ended (p50 on the speech bench's
# voices). ``quiet_dbfs``: once speaking, a window quieter than it is silence
# whatever the model says (a room's noise floor sits below -50 dBFS, a voice
# above it; noise louder leaves Silero the judge), which hears the pause where
# the voice stopped. Off by default: on the default pipeline the VAD's lag is
# the time the words at the pause take to decode (tiny.en beam 5, begun 40 ms
# into the quiet) and to reach the live request, so hearing the pause sooner
# only moved the wait onto them -- bench/fast_turns.py, 2-core AVX2: turn gap
# p50 657 -> 806 ms with -50 dBFS. A pipeline whose ASR is faster than
# Silero's lag gains up to ~90 ms from it.
SUGGESTED_QUIET_DBFS = -50.0
# Speech starts after ``min_speech_ms`` of voiced windows (two), or at once on
# one window this far above the threshold (0.8 at the default 0.5): the
# barge-in is heard 32 ms sooner when Silero is sure. Silero's first voiced
# window of a word scored >= 0.8 in 64% of 80 spoken questions (p50 0.88).
# In 12 minutes each of fan, hiss, music and typing at -35 to -10 dBFS only
# typing reached 0.5 (9 windows: a single-window onset at any probability
# took a click for speech and committed a turn nobody spoke), none 0.8 (at
# most 0.76). bench/barge_in.py, docs/benchmarks.md.
SURE_ONSET_MARGIN = 0.3
# The onset is judged on two phases of windows: the main grid and one HALF
# later, on its own recurrent state, where one window Silero is sure of starts
# speech (two merely voiced ones stay the main grid's rule). A 32 ms grid
# falls anywhere on a voice's first sounds; the second halves how long the
# first whole voiced window waits. bench/vad_onset.py (292 onsets of real
# people and our voices through the session's input path, 2-core AMD EPYC
# AVX2): within 100 ms of the first loud 20 ms chunk 258 -> 268, p50 60 -> 40
# ms, p90 120 -> 100 ms; fan, hiss, music and typing at -35 to -10 dBFS (4
# minutes each) start nothing either way. With the two-window rule on the
# second phase too, 20 s of typing at -25 dBFS started speech (two windows
# at 0.57): a click gets twice the chances. Costs a second inference per
# window (~0.1 ms per 32 ms). Not under server echo cancellation
# (``VadConfig.half_window_onsets``): the residual's sure windows started
# replies on their own echo (bench/room_echo.py, -10 dB: 0 -> 2 of 20).
# The end of speech is the main phase's alone (unchanged).

Backend = Literal["onnx", "jit"]


def model_dir() -> Path:
    """``silero_vad/data`` located without importing the package (whose
    ``__init__`` imports torch)."""
    spec = importlib.util.find_spec("silero_vad")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("the silero-vad package is not installed")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


class SileroModel(Protocol):
    def new_state(self) -> np.ndarray: ...

    def infer(self, x: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        """``x``: float32 (1, CONTEXT + WINDOW) in -1..1; returns the speech
        probability and the next recurrent state. Thread-safe."""
        ...


class OnnxSilero:
    def __init__(self, path: Path) -> None:
        import onnxruntime as ort

        opts = ort.SessionOptions()
        # One thread per call: many sessions run in parallel on the stage's
        # workers; intra-op threads would only fight them for the cores.
        opts.intra_op_num_threads = 1
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3  # the graph has unused initializers; not our problem
        self._session = ort.InferenceSession(
            str(path), sess_options=opts, providers=["CPUExecutionProvider"]
        )
        self._sr = np.array(INTERNAL_RATE, dtype=np.int64)

    def new_state(self) -> np.ndarray:
        return np.zeros((2, 1, 128), dtype=np.float32)

    def infer(self, x: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        out, state = self._session.run(None, {"input": x, "state": state, "sr": self._sr})
        return float(out[0, 0]), state


class JitSilero:
    """The TorchScript model's inner 16 kHz network, which (unlike the
    wrapper's ``forward``) takes and returns the state explicitly."""

    def __init__(self, path: Path) -> None:
        import torch

        torch.set_num_threads(1)  # same reason as the ONNX intra-op setting
        self._torch = torch
        with warnings.catch_warnings():  # "torch.jit.load is deprecated": it is what ships
            warnings.simplefilter("ignore", DeprecationWarning)
            self._model = torch.jit.load(str(path), map_location="cpu").eval()._model

    def new_state(self) -> np.ndarray:
        return np.zeros((2, 1, 128), dtype=np.float32)

    def infer(self, x: np.ndarray, state: np.ndarray) -> tuple[float, np.ndarray]:
        torch = self._torch
        with torch.inference_mode():
            out, new = self._model(torch.from_numpy(x), torch.from_numpy(state))
        return float(out[0, 0]), new.numpy()


_MODELS: dict[str, SileroModel] = {}
_MODELS_LOCK = threading.Lock()


def load_model(backend: Backend = "onnx") -> SileroModel:
    """The process-wide model for ``backend`` (loaded once, shared)."""
    with _MODELS_LOCK:
        model = _MODELS.get(backend)
        if model is None:
            if backend == "onnx":
                model = OnnxSilero(model_dir() / "silero_vad.onnx")
            elif backend == "jit":
                model = JitSilero(model_dir() / "silero_vad.jit")
            else:
                raise ValueError(f"backend must be 'onnx' or 'jit', got {backend!r}")
            _MODELS[backend] = model
        return model


class SileroVad(EnergyVad):
    """``EnergyVad``'s timeline and onset/offset rules with Silero deciding
    which 32 ms window is voiced.

    ``VadConfig.threshold`` is Silero's speech probability: a window starts
    (or continues a pending onset) at ``p >= threshold``; once speaking, it
    stays voiced down to ``threshold - 0.15`` (hysteresis, as Silero's own
    ``VADIterator`` does), so a soft syllable does not count as silence.
    Speech starts after ``min_speech_ms`` of voiced windows, or on one window
    at ``threshold + SURE_ONSET_MARGIN``, on the main windows or on the
    onset phase's windows half a window later, where one sure window starts
    it (``onset_phases=2``, the default, and ``VadConfig.half_window_onsets``,
    off where the server cancels the echo; 1: the main windows alone),
    whichever is first.
    Once speaking, a window quieter than ``quiet_dbfs`` is silence
    (``SUGGESTED_QUIET_DBFS``; None, the default: Silero alone).
    Synchronous; call it from one thread at a time.
    """

    def __init__(
        self, model: SileroModel, *, min_speech_ms: int = 64, config: VadConfig | None = None,
        quiet_dbfs: float | None = None, onset_phases: int = 2,
    ) -> None:
        if onset_phases not in (1, 2):
            raise ValueError(f"onset_phases must be 1 or 2, got {onset_phases!r}")
        self.model = model
        self.onset_phases = onset_phases
        # Compared with the window's mean square in [-1, 1] units: no sqrt or log per window.
        self._quiet_power = None if quiet_dbfs is None else 10.0 ** (quiet_dbfs / 10.0)
        super().__init__(
            rate=INTERNAL_RATE, frame_ms=WINDOW * 1000 // INTERNAL_RATE,
            min_speech_ms=min_speech_ms, config=config,
        )
        assert self._frame == WINDOW

    def configure(self, config: VadConfig) -> None:
        self.config = config
        self._on = config.threshold
        self._off = max(config.threshold - HYSTERESIS, 0.01)
        self._sure = config.threshold + SURE_ONSET_MARGIN  # >= 1: never

    def reset(self) -> None:
        super().reset()
        self._state = self.model.new_state()
        self._x = np.zeros((1, CONTEXT + WINDOW), dtype=np.float32)
        self._half_state = self.model.new_state()
        self._half_end: int | None = None  # placed where the stream starts (first feed)
        self._stream_start = 0
        self._tail = np.zeros(0, dtype=np.int16)

    def feed(self, pcm: np.ndarray, start_ms: int) -> list[VadSpeechStarted | VadSpeechStopped]:
        events: list[VadSpeechStarted | VadSpeechStopped] = []
        data = self._take(pcm, start_ms, events)  # the base's timeline: gaps, rewinds
        assert self._pending_start is not None
        base = self._pending_start
        if self._half_end is None:  # a new stream
            self._restart_onset_phase(base)
        n = len(data) // WINDOW
        # The onset phase's windows end HALF after the main ones; its
        # samples before ``base`` are the tail kept from the last call.
        lookback = self._tail.size
        history = np.concatenate([self._tail, data]) if lookback else data
        if self.onset_phases == 1:
            self._half_end = 1 << 62  # never: the main windows alone
        for k in range(n):
            end = base + (k + 1) * WINDOW
            while self._half_end <= end - HALF:  # the onset phase's windows that end first
                self._onset_window(history, lookback, base, events)
            self._main_window(data[k * WINDOW:(k + 1) * WINDOW], base + k * WINDOW, events)
        while self._half_end <= base + len(data):
            self._onset_window(history, lookback, base, events)
        self._pending = data[n * WINDOW:]
        self._pending_start = base + n * WINDOW
        judged = history[:lookback + n * WINDOW]  # up to the next main window's start
        self._tail = judged[max(0, judged.size - CONTEXT - WINDOW):].copy()
        return events

    def _main_window(self, window: np.ndarray, begin: int,
                     events: list[VadSpeechStarted | VadSpeechStopped]) -> None:
        x = self._x
        # Shift the last CONTEXT samples to the front; the model wants them.
        x[0, :CONTEXT] = x[0, -CONTEXT:]
        x[0, CONTEXT:] = window * (1.0 / 32768.0)
        p, self._state = self.model.infer(x, self._state)
        voiced = p >= (self._off if self.speaking else self._on)
        if voiced and self.speaking and self._quiet_power is not None:
            w = x[0, CONTEXT:]
            voiced = float(np.dot(w, w)) / WINDOW >= self._quiet_power
        self._frame_done(voiced, begin // self._spms, events, sure=p >= self._sure)

    def _onset_window(self, history: np.ndarray, lookback: int, base: int,
                      events: list[VadSpeechStarted | VadSpeechStopped]) -> None:
        """The onset phase's next window (ending at ``_half_end``), on its own
        recurrent state, always kept warm. While not speaking, a window it is
        sure of starts speech (two merely voiced ones stay the main phase's
        rule: typing scores up to ~0.76, and two phases would give a click
        twice the chances of two voiced windows in a row)."""
        end = self._half_end
        self._half_end += WINDOW
        lo = end - WINDOW - CONTEXT - base + lookback  # index in ``history``
        if lo < 0 or end - WINDOW < self._stream_start:
            return  # before the stream (or a gap) began: nothing to judge
        x = history[lo:lo + CONTEXT + WINDOW].reshape(1, -1) * (1.0 / 32768.0)
        p, self._half_state = self.model.infer(x.astype(np.float32), self._half_state)
        if self.speaking or p < self._sure or not self.config.half_window_onsets:
            return
        begin_ms = (end - WINDOW) // self._spms
        # A run of the main phase's voiced windows began no later: the onset
        # is the earlier of the two.
        start_ms = min(begin_ms, self._run_start_ms) if self._run_frames else begin_ms
        self._start_speech(start_ms, begin_ms + self.frame_ms, events)

    def _gap(self, start: int, events: list[Any]) -> None:
        super()._gap(start, events)
        # The samples before the gap are not the new window's neighbours.
        self._x[0, -CONTEXT:] = 0.0
        self._restart_onset_phase(start)

    def _restart_onset_phase(self, start: int) -> None:
        self._stream_start = start
        self._tail = np.zeros(0, dtype=np.int16)
        self._half_end = start + HALF + WINDOW  # its first window lies wholly in the stream


class SileroVadStage(ListeningStage):
    """``AudioIn`` / ``VadConfig`` in; ``VadSpeechStarted`` /
    ``VadSpeechStopped`` out. Audio is not forwarded: the policy routes it.

    The model is loaded at construction (once per process and backend) so a
    missing or broken model fails at start-up, not on a caller's first word.
    Inference runs on this stage's worker threads, one job per session at a
    time (chunks stay in order; ``close()`` stops the workers), or with
    ``inline`` on the event loop, in the ``submit`` that brings the chunk
    (why, and why not yet the default: above ``_InlineSileroPort``).
    """

    accepted = (AudioIn, VadConfig)

    def __init__(
        self,
        name: str = "vad",
        *,
        clock: Clock,
        min_speech_ms: int = 64,
        quiet_dbfs: float | None = None,
        backend: Backend = "onnx",
        workers: int | None = None,
        inline: bool = False,
    ) -> None:
        if min_speech_ms < 0:
            raise ValueError("min_speech_ms must be >= 0")
        if quiet_dbfs is not None and not -120.0 <= quiet_dbfs <= 0.0:
            raise ValueError(f"quiet_dbfs must be in [-120, 0] dBFS or null, got {quiet_dbfs!r}")
        super().__init__(name, clock, workers=workers)
        self.min_speech_ms = min_speech_ms
        self.quiet_dbfs = quiet_dbfs
        self.backend = backend
        self.inline = inline
        self.model = load_model(backend)

    def port(self, session_id: str) -> StagePort:
        if self.inline:
            return _InlineSileroPort(self, session_id)
        return _ThreadedSileroPort(self, session_id)

    def new_vad(self) -> SileroVad:
        return SileroVad(self.model, min_speech_ms=self.min_speech_ms, quiet_dbfs=self.quiet_dbfs)


# ``inline``: the windows judged on the event loop, against the house rule
# that model work runs on worker threads, because a chunk's windows cost
# ~0.1-0.3 ms (onnxruntime, one thread; the input path's soxr and AEC3 already
# run there per chunk) and the hop to a worker thread and back is two turns on
# the CPU per chunk: on a loaded 2-core machine it fell behind real time and
# chunks queued for it (bench/vad_handoff.py, load 10-11: up to 27-61 queued,
# the decision's p90 96-166 ms against 7-32 ms inline). Not the default: in
# whole sessions at load 4-20 (bench/barge_in_hops.py, three runs of 10
# tries) inline was heard no sooner (4/6/8 of 10 within 100 ms against
# 4/7/8), its tails longer in two runs (up to 1.1 s) and shorter in one --
# if it loses, perhaps because each onnxruntime call gives the GIL away and
# the loop must win it back. On the quiet machine both placements met the
# 100 ms target in 20 of 20 tries each, inline with the smaller server time
# (p50 4 vs 7 ms; docs/benchmarks.md "Barge-in, hop by hop").


class _InlineSileroPort(ObservationPort):
    _stage: SileroVadStage

    def __init__(self, stage: SileroVadStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self.vad = stage.new_vad()

    async def _handle(self, item: StageInput) -> None:
        payload = item.payload
        if isinstance(payload, VadConfig):  # in order with the audio: from the next chunk on
            self.vad.configure(payload)
            return
        try:
            # Counted by the CPU scheduler, holding no slot (weight 0: never waits).
            with self._stage.scheduler.work(Urgency.TURN_END, self.name, weight=0):
                events = self.vad.feed(payload.pcm, payload.start_ms)
        except Exception as exc:
            await self._failed(item, exc)
            return
        self._stage.completed_requests += 1
        for event in events:
            await self._emit(item.fence, item.request_id, event)

    async def drained(self) -> None:
        """Everything submitted has been judged (``submit`` returns after it)."""


class _ThreadedSileroPort(ListeningPort):
    _stage: SileroVadStage

    def __init__(self, stage: SileroVadStage, session_id: str) -> None:
        super().__init__(stage, session_id)
        self.vad = stage.new_vad()

    def _work(self, payload: Any) -> list[Any]:
        if isinstance(payload, VadConfig):
            # Through the queue, not at submit: it applies from the next
            # chunk on, in order with the audio.
            self.vad.configure(payload)
            return []
        # The VAD tells when a turn ends, and a chunk's windows take a
        # fraction of a millisecond: they never wait for a slot (weight 0),
        # and the scheduler still counts them.
        with self._stage.scheduler.work(Urgency.TURN_END, self.name, weight=0):
            return self.vad.feed(payload.pcm, payload.start_ms)

    def _completed(self, payload: Any, outputs: list[Any]) -> int:
        return 0 if isinstance(payload, VadConfig) else 1  # every analysed chunk
