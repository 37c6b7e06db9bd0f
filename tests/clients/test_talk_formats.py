"""``vllm-duplex talk`` reads what people have and writes what they ask for:
every format soundfile (libsndfile) handles, any rate and channel count
(soxr converts), and a bad or unwritable file is a one-line error naming it,
before any connection. The CLI itself, as a process, against the scripted
pipeline."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from support.realtime_fixtures import no_leaked_tasks, serve  # noqa: F401
from vllm_duplex.realtime.client import talk

CLI = str(Path(sys.executable).with_name("vllm-duplex"))
# (extension, format, subtype, rate, channels): what people have
INPUTS = [(".wav", "WAV", "PCM_16", 16000, 1), (".wav", "WAV", "PCM_24", 44100, 2),
          (".wav", "WAV", "FLOAT", 8000, 1), (".flac", "FLAC", "PCM_16", 48000, 2),
          (".ogg", "OGG", "VORBIS", 22050, 1), (".opus", "OGG", "OPUS", 48000, 2),
          (".mp3", "MP3", "MPEG_LAYER_III", 44100, 2), (".aiff", "AIFF", "PCM_16", 32000, 1)]


def speechlike(rate: int, channels: int, seconds: float = 1.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    mono = 0.5 * np.sin(2 * np.pi * 220 * t) * (0.6 + 0.4 * np.sin(2 * np.pi * 3 * t))
    return np.repeat(mono[:, None], channels, axis=1).astype(np.float32)


@pytest.mark.parametrize(("ext", "fmt", "subtype", "rate", "channels"), INPUTS)
def test_any_input_becomes_session_rate_mono(tmp_path, ext, fmt, subtype, rate, channels):
    path = tmp_path / f"in{ext}"
    sf.write(path, speechlike(rate, channels), rate, format=fmt, subtype=subtype)
    pcm = np.frombuffer(talk.load_audio_pcm16(str(path), 24000), "<i2")
    assert abs(len(pcm) - 24000) < 24000 * 0.08  # 1 s at 24 kHz (codecs pad a little)
    assert 0.3 < np.abs(pcm).max() / 32768 < 0.6  # the 0.5 peak survives the round trip


@pytest.mark.parametrize(("ext", "fmt"), [(".wav", "WAV"), (".flac", "FLAC"), (".ogg", "OGG"),
                                         (".opus", "OGG"), (".mp3", "MP3")])
def test_the_reply_is_written_as_its_extension_says(tmp_path, ext, fmt):
    reply = (speechlike(24000, 1)[:, 0] * 32767).astype("<i2").tobytes()
    path = tmp_path / f"reply{ext}"
    assert talk.write_audio(str(path), reply, 24000, out_rate=48000, channels=2) == 48000
    info = sf.info(path)
    assert (info.format, info.samplerate, info.channels) == (fmt, 48000, 2)
    assert abs(info.duration - 1.0) < 0.08


@pytest.mark.parametrize(("name", "content", "says"), [
    ("garbage.wav", b"RIFF, but not really", "cannot read"),
    ("empty.flac", b"", "cannot read"),
    ("missing.mp3", None, "cannot read"),
])
def test_a_bad_input_is_one_line_naming_it(tmp_path, capsys, name, content, says):
    path = tmp_path / name
    if content is not None:
        path.write_bytes(content)
    args = _args(path, tmp_path / "out.wav")
    assert talk.run_talk(args) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"error: {says} {path}")


@pytest.mark.parametrize(("out", "says"), [("reply.xyz", "unknown audio format"),
                                           ("no/such/folder/reply.wav", "not a writable folder")])
def test_an_unwritable_output_is_refused_before_connecting(tmp_path, capsys, out, says):
    inp = tmp_path / "in.wav"
    sf.write(inp, speechlike(16000, 1), 16000)
    assert talk.run_talk(_args(inp, tmp_path / out)) == 2  # the URL is never tried
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and says in err and str(tmp_path / out) in err


def _args(audio: Path, out: Path):
    import argparse

    return argparse.Namespace(audio=str(audio), out=str(out), url="ws://127.0.0.1:1/v1/realtime",
                              api_key=None, model=None, chunk_ms=20, no_realtime=True, timeout=2.0,
                              out_rate=None, out_channels=1)


@pytest.mark.asyncio(loop_scope="module")
async def test_the_cli_talks_flac_in_mp3_out(tmp_path):
    """A 44.1 kHz stereo FLAC question, an MP3 reply, the per-turn figures printed."""
    utterance = np.concatenate([speechlike(44100, 2, 0.8), np.zeros((44100, 2), np.float32)])
    sf.write(tmp_path / "q.flac", utterance, 44100, subtype="PCM_16")
    async with serve() as server:
        proc = await asyncio.create_subprocess_exec(
            CLI, "talk", "--audio", str(tmp_path / "q.flac"), "--out", str(tmp_path / "a.mp3"),
            "--url", server.ws_url, "--no-realtime", "--out-rate", "44100",
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
        out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    for figure in ("assistant: Hello from the scripted", "TTFA (speech_stopped -> first audio)",
                   "end of input (speech_stopped) -> response.done", "audio in: 1.80 s",
                   "critical path (server, ms): vad ",
                   "wrote " + str(tmp_path / "a.mp3") + " (44100 Hz, 1 channel)"):
        assert figure in text, text
    info = sf.info(tmp_path / "a.mp3")
    assert (info.format, info.samplerate) == ("MP3", 44100) and abs(info.duration - 1.44) < 0.1
