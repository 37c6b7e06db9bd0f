"""How ``bench/real_voices/audio`` was made (kept so it can be checked and
redone; the bench itself only reads the FLAC files, which are committed).

Reads the recordings out of local bare-git copies of their public
repositories (``--mirrors``: one ``owner+name/repo`` directory each, as
``git clone --bare`` would make; a file is read at the repository's HEAD, or
at the commit named after ``@`` where the repository has since removed it)
and writes each one as 16-bit mono FLAC at its own rate (16 kHz; the FSDD
digits stay 8 kHz, as recorded). Nothing is edited but the format: JFK's
44.1 kHz stereo is mixed to mono and resampled to 16 kHz, AudioMNIST's 48 kHz
resampled to 16 kHz. SOURCES.md names each source, its licence and its commit.

    python bench/real_voices/make.py --mirrors /work/.mirror [--only audiomnist- ls-1272]
"""

from __future__ import annotations

import argparse
import io
import subprocess
from pathlib import Path

import numpy as np
import soundfile as sf
import soxr

OUT = Path(__file__).resolve().parent / "audio"

# (repository, path in it, file name here)
FILES = [
    *[("cmusphinx/pocketsphinx", f"test/data/cards/00{i}.wav", f"cmu-cards-00{i}") for i in range(1, 6)],
    ("cmusphinx/pocketsphinx", "test/data/goforward.raw", "cmu-goforward"),
    *[("cmusphinx/pocketsphinx", f"test/data/librivox/sense_and_sensibility_01_austen_64kb-{n}.wav",
       f"librivox-sense-{n}") for n in ("0870", "0880", "0890", "0920", "0930")],
    ("openai/whisper", "tests/jfk.flac", "jfk-inaugural"),
    *[("yuekaizhang/Triton-ASR-Client", f"datasets/mini_en/wav/{u}.wav", f"ls-{u}")
      for u in ("1089-134686-0001", "1221-135766-0001", "1221-135766-0002")],
    *[("lhotse-speech/lhotse", f"test/fixtures/mix_cut_test/audio/storage/2412-153948-{u}.flac",
       f"ls-2412-153948-{u}") for u in ("0000", "0001")],
    *[("lhotse-speech/lhotse", f"test/fixtures/ljspeech/storage/LJ002-{u}.wav", f"lj-LJ002-{u}")
      for u in ("0020", "0035")],
    ("lhotse-speech/lhotse", "test/fixtures/ami/ES2011a.Headset-0-40s-46s.wav", "ami-ES2011a-headset0"),
    ("Picovoice/leopard", "resources/audio_samples/test.wav", "ls-1272-128104-0000"),
]
# AudioMNIST (soerenab/AudioMNIST): one take of one digit from each of six of its
# speakers, as SpeechBrain's tests carried them before they moved out of its tree.
AUDIOMNIST_TAKES = (("01", 0, 0), ("02", 5, 10), ("08", 2, 8), ("42", 9, 10),
                    ("51", 3, 37), ("56", 6, 49))  # (speaker, digit, take)
FILES += [("speechbrain/speechbrain@089e7f3e09eaabebcd2199a4f95f581e2ab26969",
           f"tests/samples/AudioMNIST/data/{s}/{d}_{s}_{t}.wav", f"audiomnist-{d}_{s}_{t}")
          for s, d, t in AUDIOMNIST_TAKES]
FSDD_SPEAKERS = ("jackson", "nicolas", "george", "theo", "yweweler", "lucas")
FSDD_TAKES = ((5, 0), (5, 1), (7, 2), (3, 3), (1, 4), (4, 5), (8, 6), (0, 7))  # (digit, take)
FILES += [("Jakobovski/free-spoken-digit-dataset", f"recordings/{d}_{s}_{t}.wav", f"fsdd-{d}_{s}_{t}")
          for s in FSDD_SPEAKERS for d, t in FSDD_TAKES]


def blob(mirrors: Path, repo: str, path: str) -> bytes:
    """``path`` at HEAD of ``repo``, or at the commit after its ``@``."""
    repo, _, ref = repo.partition("@")
    git = mirrors / repo.replace("/", "+") / "repo"
    return subprocess.run(["git", f"--git-dir={git}", "show", f"{ref or 'HEAD'}:{path}"],
                          capture_output=True, check=True).stdout


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--mirrors", type=Path, default=Path("/work/.mirror"))
    p.add_argument("--only", nargs="*", default=[],
                   help="make only the files whose names start so (the others' mirrors need not be here)")
    args = p.parse_args()
    OUT.mkdir(exist_ok=True)
    for repo, path, name in FILES:
        if args.only and not name.startswith(tuple(args.only)):
            continue
        data = blob(args.mirrors, repo, path)
        if path.endswith(".raw"):  # pocketsphinx's raw files: 16 kHz 16-bit little-endian mono
            pcm, rate = np.frombuffer(data, "<i2").astype(np.float32) / 32768, 16000
        else:
            pcm, rate = sf.read(io.BytesIO(data), dtype="float32", always_2d=True)
            pcm = pcm.mean(axis=1)
        if rate not in (8000, 16000):
            pcm, rate = soxr.resample(pcm, rate, 16000), 16000
        sf.write(OUT / f"{name}.flac", pcm, rate, subtype="PCM_16")
        print(name, rate, f"{len(pcm) / rate:.2f} s")


if __name__ == "__main__":
    main()
