"""``session.output_audio.fixture.play``: one complete piece of audio the
client asks the session to play (a greeting, a hold tone, a prompt), and
what the dialect does around it, sans-I/O.

As the SDK describes OpenAI's server (``output_audio_fixture_play_event.py``):
the audio is raw mono PCM16 little-endian at 24 kHz whatever the session's
format, at most 30 s; the whole payload is validated before anything happens
(``parse``: a refusal changes nothing); then model speech is interrupted and
input is muted; one fixture at a time; input arriving during playback is
dropped, not replayed. ``fixture.playing`` acknowledges acceptance and
``fixture.played`` reports that the output drained (not sent for a playback
cut short by the session's end).

``Fixtures`` is that state, one per connection, owned by the codec:

- while a fixture plays, the codec's input gate sends silence of the same
  length in place of the microphone (as mute does: the session's clock runs
  on and nothing said meanwhile is heard, nor heard later);
- the model's audio and transcript are not sent (``drops``), and a reply
  the session starts meanwhile is cancelled (``on_event`` returns the
  cancel for the shell to deliver), so the fixture is all the client hears;
- the cancel of a reply that ended on its own first is not the client's
  error (``own_error``).

The pacing of the fixture's audio is the shell's (``realtime/server/live/fixture.py``).
"""

from __future__ import annotations

import base64
import binascii
import itertools
from dataclasses import dataclass
from typing import Any

from vllm_duplex.domain import events as ev
from vllm_duplex.domain.commands import ResponseCancel
from vllm_duplex.domain.errors import DuplexError

FIXTURE_PLAY = "session.output_audio.fixture.play"
FIXTURE_RATE = 24000  # the SDK: "at 24 kHz, regardless of the session audio format"
MAX_FIXTURE_S = 30
_MAX_BYTES = FIXTURE_RATE * 2 * MAX_FIXTURE_S
# The largest frame a fixture needs: its base64 and the event around it.
FIXTURE_FRAME_BYTES = (_MAX_BYTES + 2) // 3 * 4 + 4096
_CANCEL_ID = "fixture_cancel_"  # the event_id of the cancels this module asks for


@dataclass(frozen=True)
class FixturePlay:
    """A validated fixture: PCM16 mono 24 kHz, little-endian."""

    pcm: bytes
    event_id: str | None = None

    @property
    def seconds(self) -> float:
        return len(self.pcm) / (2 * FIXTURE_RATE)


class Fixtures:
    def __init__(self) -> None:
        self.playing: FixturePlay | None = None
        self._reply: str | None = None  # the session's reply being sent, if any
        self._cancels = (f"{_CANCEL_ID}{n}" for n in itertools.count(1))

    def parse(self, obj: dict[str, Any], eid: str | None) -> FixturePlay:
        """The whole payload checked before anything changes (typed errors)."""
        audio = obj.get("audio")
        if not isinstance(audio, str):
            raise DuplexError("invalid_value", "audio must be a base64 string", param="audio")
        # A base64 string over 4/3 of the limit cannot fit: refused before decoding it.
        if len(audio) > (_MAX_BYTES + 2) // 3 * 4:
            raise DuplexError("invalid_audio", f"a fixture is at most {MAX_FIXTURE_S} s of "
                              "PCM16 at 24 kHz", param="audio")
        try:
            pcm = base64.b64decode(audio, validate=True)
        except (binascii.Error, ValueError):
            raise DuplexError("invalid_audio", "audio is not valid base64", param="audio") from None
        if not pcm:
            raise DuplexError("invalid_audio", "a fixture needs audio", param="audio")
        if len(pcm) % 2:
            raise DuplexError("invalid_audio", "PCM16 audio has an even number of bytes "
                              f"(got {len(pcm)})", param="audio")
        if len(pcm) > _MAX_BYTES:
            raise DuplexError("invalid_audio", f"a fixture is at most {MAX_FIXTURE_S} s of "
                              f"PCM16 at 24 kHz (got {len(pcm) / (2 * FIXTURE_RATE):.1f} s)",
                              param="audio")
        if self.playing is not None:
            raise DuplexError("fixture_already_playing", "a fixture is playing; one plays at "
                              "a time (wait for session.output_audio.fixture.played)",
                              param="type")
        return FixturePlay(pcm=pcm, event_id=eid)

    # ---- the playback's life (the shell's) ---------------------------------------------

    def begin(self, play: FixturePlay) -> ResponseCancel | None:
        """The fixture starts: the cancel of the reply being sent, if any."""
        self.playing = play
        return self._cancel()

    def end(self) -> None:
        self.playing = None

    # ---- the session's events (the codec's render) -------------------------------------

    def on_event(self, e: Any) -> ResponseCancel | None:
        """Follows the session's replies; a reply started while a fixture
        plays is cancelled (the returned command)."""
        if isinstance(e, ev.ResponseCreated):
            self._reply = e.response.get("id") if isinstance(e.response, dict) else None
            return self._cancel()
        if isinstance(e, ev.ResponseDone):
            self._reply = None
        return None

    def drops(self, e: Any) -> bool:
        """Whether the event is the model's voice, not sent while a fixture plays."""
        return self.playing is not None and isinstance(
            e, (ev.OutputAudioDelta, ev.OutputAudioTranscriptDelta))

    @staticmethod
    def own_error(err: DuplexError) -> bool:
        """A cancel of ours that found the reply already done: nobody's error."""
        return bool(err.event_id and err.event_id.startswith(_CANCEL_ID))

    def _cancel(self) -> ResponseCancel | None:
        if self.playing is None or self._reply is None:
            return None
        return ResponseCancel(response_id=self._reply, event_id=next(self._cancels))
