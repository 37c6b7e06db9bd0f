"""Unit tests for vllm_duplex.media.audio: G.711, resampling, streaming = batch."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from vllm_duplex.domain.errors import DuplexError
from vllm_duplex.domain.session_config import AudioEncoding, AudioFormat
from vllm_duplex.media.audio import (
    INTERNAL_RATE,
    AudioDecoder,
    AudioEncoder,
    Resampler,
    alaw_decode,
    alaw_encode,
    duration_ms,
    encoded_duration_ms,
    samples_for_ms,
    ulaw_decode,
    ulaw_encode,
    wire_rate,
)

PCM24 = AudioFormat(AudioEncoding.PCM16, 24000)
PCM16K = AudioFormat(AudioEncoding.PCM16, 16000)
PCMU = AudioFormat(AudioEncoding.PCMU, 8000)
PCMA = AudioFormat(AudioEncoding.PCMA, 8000)

ALL_INT16 = np.arange(-32768, 32768, dtype=np.int32).astype(np.int16)


def sine(freq: float, rate: int, seconds: float, amp: float = 12000.0) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return np.rint(amp * np.sin(2 * np.pi * freq * t)).astype(np.int16)


def peak_hz(pcm: np.ndarray, rate: int) -> float:
    x = pcm.astype(np.float64) * np.hanning(len(pcm))
    spec = np.abs(np.fft.rfft(x))
    return float(np.argmax(spec) * rate / len(pcm))


# ---- ITU-T G.191 reference (scalar, transcribed from the STL g711.c) ---------


def stl_ulaw_compress(x: int) -> int:
    absno = (((~x) >> 2) + 33) if x < 0 else ((x >> 2) + 33)
    absno = min(absno, 0x1FFF)
    i, segno = absno >> 6, 1
    while i:
        segno += 1
        i >>= 1
    code = ((8 - segno) << 4) | (15 - ((absno >> segno) & 0xF))
    return code | 0x80 if x >= 0 else code


def stl_ulaw_expand(code: int) -> int:
    sign = -1 if code < 0x80 else 1
    mantissa = ~code
    exponent = (mantissa >> 4) & 7
    step = 4 << (exponent + 1)
    return sign * ((0x80 << exponent) + step * (mantissa & 0xF) + step // 2 - 4 * 33)


def stl_alaw_compress(x: int) -> int:
    ix = ((~x) >> 4) if x < 0 else (x >> 4)
    if ix > 15:
        iexp = 1
        while ix > 16 + 15:
            ix >>= 1
            iexp += 1
        ix = ix - 16 + (iexp << 4)
    if x >= 0:
        ix |= 0x80
    return ix ^ 0x55


def stl_alaw_expand(code: int) -> int:
    ix = (code ^ 0x55) & 0x7F
    iexp, mant = ix >> 4, ix & 0xF
    if iexp > 0:
        mant += 16
    mant = (mant << 4) + 8
    if iexp > 1:
        mant <<= iexp - 1
    return mant if code > 127 else -mant


# ---- G.711 -------------------------------------------------------------------


class TestG711:
    def test_ulaw_known_values(self) -> None:
        assert ulaw_decode(b"\xff").tolist() == [0]
        assert ulaw_decode(b"\x00").tolist() == [-32124]
        assert ulaw_decode(b"\x80").tolist() == [32124]
        assert ulaw_decode(b"\x7f").tolist() == [0]  # "negative zero"
        assert ulaw_encode(np.array([0, -1, 32767, -32768], np.int16)) == b"\xff\x7f\x80\x00"

    def test_alaw_known_values(self) -> None:
        assert alaw_decode(b"\xd5").tolist() == [8]
        assert alaw_decode(b"\x55").tolist() == [-8]
        assert alaw_decode(b"\xaa").tolist() == [32256]
        assert alaw_decode(b"\x2a").tolist() == [-32256]
        assert alaw_encode(np.array([0, -1, 32767, -32768], np.int16)) == b"\xd5\x55\xaa\x2a"

    def test_decode_tables_match_itu_reference(self) -> None:
        codes = bytes(range(256))
        assert ulaw_decode(codes).tolist() == [stl_ulaw_expand(c) for c in range(256)]
        assert alaw_decode(codes).tolist() == [stl_alaw_expand(c) for c in range(256)]

    def test_encode_tables_match_itu_reference_for_every_sample(self) -> None:
        xs = ALL_INT16.tolist()
        assert ulaw_encode(ALL_INT16) == bytes(stl_ulaw_compress(x) for x in xs)
        assert alaw_encode(ALL_INT16) == bytes(stl_alaw_compress(x) for x in xs)

    def test_codes_round_trip(self) -> None:
        codes = bytes(range(256))
        assert alaw_encode(alaw_decode(codes)) == codes
        # mu-law has two zeros (0x7F and 0xFF); every other code round-trips.
        back = ulaw_encode(ulaw_decode(codes))
        assert [c for c in range(256) if back[c] != c] == [0x7F]

    @pytest.mark.parametrize(
        ("enc", "dec", "rel"), [(ulaw_encode, ulaw_decode, 1 / 16), (alaw_encode, alaw_decode, 1 / 32)]
    )
    def test_sample_round_trip_error_is_bounded(self, enc, dec, rel) -> None:
        x = ALL_INT16.astype(np.int64)
        y = dec(enc(ALL_INT16)).astype(np.int64)
        err = np.abs(y - x)
        in_range = np.abs(x) <= 32124  # beyond that, the scale's last level clips
        # Half a quantisation step: a small fraction of the magnitude, or a few LSB near zero.
        assert np.all(err[in_range] <= np.maximum(np.abs(x[in_range]) * rel, 8))
        assert err.max() <= 644
        # Companding is monotonic and odd-symmetric (up to one's complement).
        assert np.all(np.diff(y) >= 0)

    def test_encode_rejects_non_int16(self) -> None:
        with pytest.raises(TypeError):
            ulaw_encode(np.zeros(4, np.float32))
        with pytest.raises(ValueError):
            alaw_encode(np.zeros((2, 2), np.int16))


# ---- helpers -----------------------------------------------------------------


def test_duration_helpers() -> None:
    assert duration_ms(16000, 16000) == 1000
    assert duration_ms(159, 16000) == 9
    assert duration_ms(0, 8000) == 0
    assert samples_for_ms(20, 24000) == 480
    assert wire_rate(AudioFormat(AudioEncoding.PCMU)) == 8000  # default rate field is 24 kHz
    assert wire_rate(PCM24) == 24000
    assert encoded_duration_ms(960, PCM24) == 20
    assert encoded_duration_ms(160, PCMA) == 20
    with pytest.raises(ValueError):
        duration_ms(1, 0)


# ---- resampling --------------------------------------------------------------


def run_decoder(fmt: AudioFormat, data: bytes, chunks: list[int] | None = None) -> np.ndarray:
    dec = AudioDecoder(fmt)
    out: list[np.ndarray] = []
    if chunks is None:
        out.append(dec.decode(data))
    else:
        pos = 0
        for n in chunks:
            out.append(dec.decode(data[pos : pos + n]))
            pos += n
        out.append(dec.decode(data[pos:]))
    out.append(dec.flush())
    return np.concatenate(out)


def run_encoder(fmt: AudioFormat, pcm: np.ndarray, in_rate: int, chunks: list[int] | None = None) -> bytes:
    enc = AudioEncoder(fmt, in_rate=in_rate)
    out: list[bytes] = []
    if chunks is None:
        out.append(enc.encode(pcm))
    else:
        pos = 0
        for n in chunks:
            out.append(enc.encode(pcm[pos : pos + n]))
            pos += n
        out.append(enc.encode(pcm[pos:]))
    out.append(enc.flush())
    return b"".join(out)


class TestResampling:
    def test_decode_24k_to_16k_keeps_frequency_and_length(self) -> None:
        x = sine(1000, 24000, 1.0)
        y = run_decoder(PCM24, x.astype("<i2").tobytes(), chunks=[480] * 49)
        assert y.dtype == np.int16
        assert len(y) == 16000  # libsoxr compensates its delay: exact after flush
        assert abs(peak_hz(y, 16000) - 1000) <= 2
        # Amplitude is preserved away from the edges.
        assert abs(np.abs(y[2000:-2000]).max() - 12000) < 300

    def test_encode_16k_to_24k_keeps_frequency_and_length(self) -> None:
        x = sine(1000, 16000, 1.0)
        data = run_encoder(PCM24, x, in_rate=16000, chunks=[320] * 49)
        y = np.frombuffer(data, "<i2")
        assert len(y) == 24000
        assert abs(peak_hz(y, 24000) - 1000) <= 2

    def test_tts_at_24k_encoded_to_g711(self) -> None:
        x = sine(440, 24000, 0.5)
        data = run_encoder(PCMU, x, in_rate=24000)
        assert len(data) == 4000  # 8 kHz, one byte per sample
        assert abs(peak_hz(ulaw_decode(data), 8000) - 440) <= 4

    def test_g711_decoded_to_internal_rate(self) -> None:
        x = sine(1000, 8000, 0.5)
        y = run_decoder(PCMA, alaw_encode(x))
        assert len(y) == 8000
        assert abs(peak_hz(y, INTERNAL_RATE) - 1000) <= 4

    def test_no_resampler_when_rates_match(self) -> None:
        dec = AudioDecoder(PCM16K)
        assert dec._resampler is None
        x = sine(300, 16000, 0.1)
        assert np.array_equal(dec.decode(x.astype("<i2").tobytes()), x)
        assert dec.flush().size == 0
        enc = AudioEncoder(PCM16K, in_rate=16000)
        assert enc.encode(x) == x.astype("<i2").tobytes()
        assert enc.flush() == b""

    def test_downsampling_rejects_aliases(self) -> None:
        # 11 kHz is above the 8 kHz Nyquist of the output: it must be filtered
        # away, not folded back to 5 kHz.
        y = run_decoder(PCM24, sine(11000, 24000, 0.5).astype("<i2").tobytes())
        assert np.sqrt(np.mean(y[1000:-1000].astype(np.float64) ** 2)) < 20

    def test_full_scale_does_not_wrap(self) -> None:
        x = np.where(sine(50, 24000, 0.2) >= 0, 32767, -32768).astype(np.int16)  # square wave
        y = run_decoder(PCM24, x.astype("<i2").tobytes())
        # Gibbs overshoot is clipped, never wrapped around to the other sign.
        assert not np.any((y[:-1] > 30000) & (y[1:] < -30000))

    def test_resampler_reusable_after_flush(self) -> None:
        r = Resampler(24000, 16000)
        x = sine(1000, 24000, 0.1)
        a = np.concatenate([r.process(x), r.flush()])
        b = np.concatenate([r.process(x), r.flush()])
        assert np.array_equal(a, b)
        assert r.delay_samples() >= 0

    @pytest.mark.parametrize("rate", [7999, 48001, 96000])
    def test_unsupported_pcm_rate(self, rate: int) -> None:
        with pytest.raises(DuplexError) as ei:
            AudioDecoder(AudioFormat(AudioEncoding.PCM16, rate))
        assert ei.value.code == "unsupported_audio_format"
        with pytest.raises(DuplexError):
            AudioEncoder(AudioFormat(AudioEncoding.PCM16, rate))


# ---- streaming -----------------------------------------------------------------


class TestStreaming:
    def test_odd_byte_is_carried(self) -> None:
        dec = AudioDecoder(PCM16K)
        x = np.array([1, -2, 300, -32768, 32767], np.int16)
        data = x.astype("<i2").tobytes()
        assert dec.decode(data[:3]).tolist() == [1]
        assert dec.pending_bytes == 1
        assert dec.decode(data[3:4]).tolist() == [-2]
        assert dec.pending_bytes == 0
        assert dec.decode(data[4:5]).tolist() == []
        assert dec.decode(data[5:]).tolist() == [300, -32768, 32767]
        assert dec.flush().size == 0

    def test_dangling_byte_at_flush_is_invalid_audio(self) -> None:
        dec = AudioDecoder(PCM24)
        dec.decode(b"\x01\x00\x02")
        with pytest.raises(DuplexError) as ei:
            dec.flush()
        assert ei.value.code == "invalid_audio"
        # The byte was dropped; the decoder is usable and flushes its tail.
        assert dec.pending_bytes == 0
        tail = dec.flush()
        assert tail.dtype == np.int16
        assert dec.decode(b"\x00\x00" * 240).dtype == np.int16

    def test_decoder_accepts_bytearray_and_memoryview(self) -> None:
        data = np.arange(10, dtype="<i2").tobytes()
        for buf in (bytearray(data), memoryview(data)):
            assert AudioDecoder(PCM16K).decode(buf).tolist() == list(range(10))
        assert AudioDecoder(PCMU, out_rate=8000).decode(bytearray(b"\xff\x00")).tolist() == [0, -32124]

    def test_decoded_pcm_is_writable_native_int16(self) -> None:
        y = AudioDecoder(PCM16K).decode(b"\x01\x00\x02\x00")
        assert y.dtype == np.int16 and y.flags.writeable

    @settings(max_examples=60, deadline=None)
    @given(
        fmt=st.sampled_from(
            [PCM24, PCM16K, AudioFormat(AudioEncoding.PCM16, 44100),
             AudioFormat(AudioEncoding.PCM16, 8000), PCMU, PCMA]
        ),
        chunks=st.lists(st.integers(min_value=0, max_value=1500), max_size=12),
        seed=st.integers(min_value=0, max_value=2**32 - 1),
    )
    def test_decode_in_chunks_equals_one_call(self, fmt: AudioFormat, chunks: list[int], seed: int) -> None:
        rng = np.random.default_rng(seed)
        n_bytes = int(rng.integers(0, 6000))
        if fmt.bytes_per_sample == 2:
            n_bytes -= n_bytes % 2
        data = rng.integers(0, 256, n_bytes, dtype=np.uint8).tobytes()
        whole = run_decoder(fmt, data)
        assert np.array_equal(run_decoder(fmt, data, chunks), whole)

    @settings(max_examples=60, deadline=None)
    @given(
        fmt=st.sampled_from([PCM24, PCM16K, AudioFormat(AudioEncoding.PCM16, 48000), PCMU, PCMA]),
        in_rate=st.sampled_from([16000, 22050, 24000]),
        chunks=st.lists(st.integers(min_value=0, max_value=1500), max_size=12),
        seed=st.integers(min_value=0, max_value=2**32 - 1),
    )
    def test_encode_in_chunks_equals_one_call(
        self, fmt: AudioFormat, in_rate: int, chunks: list[int], seed: int
    ) -> None:
        rng = np.random.default_rng(seed)
        pcm = (rng.standard_normal(int(rng.integers(0, 5000))) * 6000).astype(np.int16)
        whole = run_encoder(fmt, pcm, in_rate)
        assert run_encoder(fmt, pcm, in_rate, chunks) == whole
