"""The echo canceller's reference: what the client's speaker is playing
(``audio.input.echo_cancellation``), sans-I/O.

The server knows what it sent, not when the client plays it: a socket's
reply goes out as fast as it is made (unpaced, OpenAI's way) or at playback
speed plus a lead (``pacing: realtime``). ``ClientPlayback`` models the
client's player the way an OpenAI client plays: audio starts when it
arrives, plays at real time after what it already holds, and stops where
the item is truncated (``conversation.item.truncated``: the client's
``conversation.item.truncate`` or the server's own cut at a barge-in). Its
times are the server's clock when the audio was sent.

``EchoPath`` is the session input's side: it reads the events the session
sends (``sent``: the one tap on the output, made by the core on every batch
of effects), places each microphone chunk on the same clock by its arrival
(``captured``), and gives AEC3 (``media/echo.py``) the microphone with,
sample for sample, what the model says the speaker played then; what comes
back is the microphone without the echo for the ASR and, with what is left
of it turned down as well, for the VAD (``Cancelled``).

Why the model may be rough: the real echo comes later than the model says
-- the reply's trip to the client, its output and input buffers, the air,
the microphone's trip back -- and AEC3 finds that delay itself (up to about
a second). What it cannot do is use a reference that comes *after* the
echo; the model never does, since a client cannot play audio before it was
sent. The microphone's samples were heard on the client's clock, steady; they
arrive late by a varying amount (the network, the server's own event loop
busy with a decode). So each chunk says "my samples were heard no later
than my arrival minus their length", and the stream is placed by the
earliest any chunk said (the least delayed one): a late chunk moves
nothing, so the reference never jumps with jitter. Only chunks later than
that by more than ``REANCHOR_S`` place the stream again (the client paused
its microphone), and only once ``CONFIRM_S`` of audio has come late at
about the pace of real time: a stall (the network, or our own process,
frozen for seconds) is followed by its backlog faster than that, every
chunk of it late and the last ones on time again. Placing the stream by the
first of them moved the reference seconds ahead of the echo (and dropped
the reply between as played) until the backlog came: that reply's own
echo, with no reference left for it, interrupted it. (After a real pause,
the first ``CONFIRM_S`` are heard against the stream's old place.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.payloads import INTERNAL_RATE
from vllm_duplex.domain.session_config import AudioFormat
from vllm_duplex.media.audio import AudioDecoder
from vllm_duplex.media.echo import FRAME, Cancelled, EchoCanceller
from vllm_duplex.session.effects import Emit

REANCHOR_S = 1.0  # a microphone chunk later than its place by more than this places the stream again
CONFIRM_S = 0.2  # ... once this much audio has come late
PAUSE_PACE = 0.8  # ... no faster than this against real time (a backlog comes faster)
_NO_PCM = np.zeros(0, np.int16)


@dataclass
class _Piece:
    start: float  # when the client starts playing it (server clock, s)
    item_id: str
    offset: int  # its first sample's place in the item (samples at 16 kHz)
    pcm: np.ndarray

    @property
    def end(self) -> float:
        return self.start + self.pcm.size / INTERNAL_RATE


class ClientPlayback:
    """The client's player, modelled: pieces of reply audio at 16 kHz on the
    server's clock. Memory is what has not finished playing."""

    def __init__(self) -> None:
        self._pieces: deque[_Piece] = deque()
        self._items: dict[str, int] = {}  # samples of each playing item sent so far
        self.play_end = float("-inf")  # when the player runs dry

    def sent(self, item_id: str, pcm: np.ndarray, at: float) -> None:
        """``pcm`` of ``item_id`` reached the client at ``at``: it plays after
        what the player holds."""
        if pcm.size == 0:
            return
        offset = self._items.get(item_id, 0)
        self._items = {item_id: offset + pcm.size}  # one item plays at a time
        piece = _Piece(max(at, self.play_end), item_id, offset, pcm)
        self._pieces.append(piece)
        self.play_end = piece.end

    def truncated(self, item_id: str, audio_end_ms: int) -> None:
        """The client stopped ``item_id`` at ``audio_end_ms`` of its audio:
        nothing of it past there plays."""
        cut = audio_end_ms * INTERNAL_RATE // 1000
        kept: deque[_Piece] = deque()
        for piece in self._pieces:
            if piece.item_id == item_id and piece.offset + piece.pcm.size > cut:
                if piece.offset >= cut:
                    continue
                piece = _Piece(piece.start, item_id, piece.offset, piece.pcm[:cut - piece.offset])
            kept.append(piece)
        self._pieces = kept
        self.play_end = kept[-1].end if kept else float("-inf")

    def render(self, start: float, n: int) -> np.ndarray:
        """The ``n`` samples the speaker plays from ``start`` on (silence
        where nothing plays); what played before ``start`` is forgotten."""
        out = np.zeros(n, np.int16)
        while self._pieces and self._pieces[0].end <= start:
            self._pieces.popleft()
        for piece in self._pieces:
            at = int(round((piece.start - start) * INTERNAL_RATE))
            if at >= n:
                break
            lo, hi = max(0, at), min(n, at + piece.pcm.size)
            if hi > lo:
                out[lo:hi] = piece.pcm[lo - at:hi - at]
        return out

    @property
    def pieces(self) -> int:
        return len(self._pieces)


class EchoPath:
    """One session input's echo cancellation: the tap on what was sent, the
    microphone's clock, and the canceller."""

    def __init__(self, output_format: AudioFormat, canceller: EchoCanceller | None = None) -> None:
        self._canceller = canceller or EchoCanceller()  # refuses here when livekit is missing
        self.playback = ClientPlayback()
        self._fmt = output_format
        self._decoder: tuple[str, AudioDecoder] | None = None  # the item playing's
        self._offset: float | None = None  # mic sample k was heard at offset + k / rate
        self._heard = 0  # microphone samples so far
        # (arrival, samples heard before) of the first of the late chunks coming now
        self._late_since: tuple[float, int] | None = None
        self._reference: deque[np.ndarray] = deque()  # rendered, its mic samples not yet cancelled

    def set_output_format(self, fmt: AudioFormat) -> None:
        self._fmt = fmt

    # ---- the speaker: what the session sent --------------------------------

    def sent(self, effects: Iterable[object], at: float) -> None:
        """The effects of one message, about to be sent at ``at``: their reply
        audio joins the speaker's timeline, their truncations cut it."""
        for effect in effects:
            if type(effect) is not Emit:
                continue
            event = effect.envelope.event
            if type(event) is ev.OutputAudioDelta:
                self.playback.sent(event.item_id, self._decode(event.item_id, event.delta), at)
            elif type(event) is ev.OutputAudioBackchannel:  # the engine's "mm-hmm" echoes too
                self.playback.sent(event.backchannel_id,
                                   self._decode(event.backchannel_id, event.audio), at)
            elif type(event) is ev.ConversationItemTruncated:
                self.playback.truncated(event.item_id, event.audio_end_ms)

    def _decode(self, item_id: str, data: bytes) -> np.ndarray:
        if self._decoder is None or self._decoder[0] != item_id or self._decoder[1].fmt != self._fmt:
            self._decoder = (item_id, AudioDecoder(self._fmt))
        return self._decoder[1].decode(data)

    # ---- the microphone ------------------------------------------------------

    def captured(self, n: int, at: float) -> None:
        """``n`` microphone samples arrived at ``at``: render what the speaker
        played while they were heard."""
        if n == 0:
            return
        self._heard += n
        offset = at - self._heard / INTERNAL_RATE  # what this chunk says
        late = self._offset is not None and offset > self._offset + REANCHOR_S
        if self._offset is None or offset < self._offset:
            self._offset = offset
        elif late and self._late_since is None:
            self._late_since = (at, self._heard - n)
        elif late:
            since, heard_then = self._late_since
            audio_s = (self._heard - heard_then) / INTERNAL_RATE
            if audio_s >= CONFIRM_S and at - since >= PAUSE_PACE * audio_s:
                self._offset = offset  # late all along, at the pace of real time: a pause
        if not late:
            self._late_since = None
        start = self._offset + (self._heard - n) / INTERNAL_RATE
        self._reference.append(self.playback.render(start, n))

    def captured_silence(self, n: int) -> None:
        """``n`` microphone samples heard before the speaker was modelled."""
        if n:
            self._reference.append(np.zeros(n, np.int16))

    def process(self, mic: np.ndarray) -> Cancelled:
        """Whole 10 ms frames of the microphone (the oldest samples
        ``captured`` and not yet processed), without the echo."""
        return self._canceller.process(mic, self._take(mic.size))

    def finish(self, mic: np.ndarray) -> Cancelled:
        """A last, partial frame: padded with silence, cut back to its length."""
        if mic.size == 0:
            return Cancelled(mic, mic)
        whole = -(-mic.size // FRAME) * FRAME
        padded = np.zeros(whole, np.int16)
        padded[:mic.size] = mic
        reference = np.zeros(whole, np.int16)
        reference[:mic.size] = self._take(mic.size)
        out = self._canceller.process(padded, reference)
        return Cancelled(out.words[:mic.size], out.speech[:mic.size])

    def _take(self, n: int) -> np.ndarray:
        """The next ``n`` reference samples (every microphone sample has one:
        ``captured`` renders them as the samples arrive)."""
        parts, need = [_NO_PCM], n
        while need and self._reference:
            head = self._reference[0]
            if head.size <= need:
                parts.append(self._reference.popleft())
                need -= head.size
            else:
                parts.append(head[:need])
                self._reference[0] = head[need:]
                need = 0
        if need:
            parts.append(np.zeros(need, np.int16))
        return np.concatenate(parts)
