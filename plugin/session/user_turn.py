"""The user's side of the turn in progress: whether they are speaking, and
the id of the conversation item their words will become.

The id is minted at speech onset, so ``speech_started``, the transcription
events and the committed item all name the same item (OpenAI's order:
``speech_started{item_id}`` long before ``committed{item_id}``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import numpy as np
from vllm_duplex.domain import events as ev
from vllm_duplex.domain.contracts import TurnCommitted
from vllm_duplex.domain.conversation import ContentPart, ConversationItem, ItemType, Role
from vllm_duplex.domain.payloads import INTERNAL_RATE, VadConfig
from vllm_duplex.domain.session_config import SessionConfig
from vllm_duplex.session.items import ItemStore
from vllm_duplex.session.turn_end import PAUSE_DETECT_MS


MAX_OWED = 8  # committed items awaiting their final: more than any ASR lags


class UserTurn:
    def __init__(self, make_id: Callable[[str], str]) -> None:
        self._make_id = make_id
        self.speaking = False
        self.pending_item: str | None = None  # minted at speech onset, used at commit
        self.committed_item: str | None = None  # the last turn committed
        # A final transcript that came before its commit (the commit waited
        # for it: adaptive interruptions decide from the words).
        self.early_transcript: tuple[str, str] | None = None
        self._started_ms = 0  # the VAD's span of the turn being heard (its length
        self.spoken_ms = 0  # before the commit says it exactly)
        self.onsets = 0  # speech onsets heard in the session (the idle timeout's clock)
        # Committed items whose final transcript has not come yet, oldest
        # first: (item id, where on the input timeline its audio ended). A
        # client's commit may follow server VAD's before the ASR's final for
        # the speech lands; the final then names its onset (``transcript_item``).
        self._owed: deque[tuple[str, int]] = deque(maxlen=MAX_OWED)

    def _pending(self) -> str:
        if self.pending_item is None:
            self.pending_item = self._make_id("item")
        return self.pending_item

    def item_id(self) -> str:
        """The id the turn being heard (or the next) is committed as."""
        return self._pending()

    def speech_started(self, audio_ms: int) -> ev.ServerEvent:
        self.speaking = True
        self.onsets += 1
        self._started_ms = audio_ms
        return ev.SpeechStarted(audio_start_ms=audio_ms, item_id=self._pending())

    def speech_stopped(self, audio_ms: int) -> ev.ServerEvent:
        self.speaking = False
        self.spoken_ms = max(0, audio_ms - self._started_ms)
        return ev.SpeechStopped(audio_end_ms=audio_ms, item_id=self._pending())

    def transcript_item(self, conversation: ItemStore, onset_ms: int | None = None) -> str:
        """The item a transcript belongs to: with ``onset_ms`` (a final's),
        the oldest committed item still owed its final whose audio reaches
        past that onset -- the item that holds the speech, whatever was
        committed after it; else the turn being heard, else the user item just
        committed (the final transcript lands after it)."""
        if onset_ms is not None:
            for item_id, end_ms in self._owed:
                if end_ms > onset_ms and any(item.id == item_id for item in conversation):
                    return item_id
        if self.pending_item is None:
            # The reply may already follow it (semantic_vad releases a reply
            # at the commit, before the final transcript).
            if self.committed_item is not None and any(
                    item.id == self.committed_item for item in conversation):
                return self.committed_item
            last = conversation.last
            if last is not None and last.role is Role.USER:
                return last.id
        return self._pending()

    def commit(self, audio: np.ndarray, end_ms: int) -> tuple[ConversationItem, TurnCommitted]:
        """The turn's audio (ending at ``end_ms`` of the input timeline)
        became a user item; the next turn gets a new id."""
        item_id = self._pending()
        self.pending_item = None
        self.committed_item = item_id
        early, self.early_transcript = self.early_transcript, None
        audio_ms = int(audio.size * 1000 // INTERNAL_RATE)
        transcript = early[1] if early is not None and early[0] == item_id else None
        if transcript is None:
            self._owed.append((item_id, end_ms))
        item = ConversationItem(id=item_id, type=ItemType.MESSAGE, role=Role.USER,
                                content=[ContentPart(type="input_audio", audio_ms=audio_ms,
                                                     transcript=transcript)])
        return item, TurnCommitted(item_id, audio)

    def transcribed(self, item_id: str) -> None:
        """``item_id`` has its final transcript: it is owed nothing more."""
        for owed in self._owed:
            if owed[0] == item_id:
                self._owed.remove(owed)
                return

    def dismiss(self) -> None:
        """The speech heard was not a turn (a backchannel, noise): the next
        speech gets a new item id."""
        self.speaking = False
        self.pending_item = None
        self.early_transcript = None

    @staticmethod
    def vad_config(config: SessionConfig) -> VadConfig:
        td = config.turn_detection
        assert td is not None
        # semantic_vad: the VAD reports every short pause; which one ends the
        # turn is decided by the session (turn_end.py). server_vad: the VAD
        # ends the turn after its silence, and reports the pause before that,
        # so the reply is prepared while the silence accrues (pauses.py).
        half = config.echo_cancellation is None  # the echo's residual: the main grid alone
        if td.semantic:
            return VadConfig(threshold=td.threshold, prefix_padding_ms=td.prefix_padding_ms,
                             silence_duration_ms=PAUSE_DETECT_MS, half_window_onsets=half)
        pause = PAUSE_DETECT_MS if PAUSE_DETECT_MS < td.silence_duration_ms else 0
        return VadConfig(threshold=td.threshold, prefix_padding_ms=td.prefix_padding_ms,
                         silence_duration_ms=td.silence_duration_ms, pause_ms=pause,
                         half_window_onsets=half)
