"""The machine we run on, and the settings that are its best.

The project runs on x86-64 machines that are not alike: an AVX2 core without
VNNI or native bfloat16, an AVX-512 one with VNNI and BF16 (and AMX), two cores
or sixty-four. Settings right on one are wrong on another (measured,
``bench/machine_choices.py``: SmolLM2-135M greedy on a 2-core AVX-512 BF16 CPU
runs 1.6x faster in bfloat16 than float32, with the same text; on AVX2 without
native bf16, bfloat16 is emulated and slower). So the settings the config
leaves open are chosen here, once, from what the CPU says it can do:

- the LLM's dtype: ``bfloat16`` where the CPU computes it natively
  (``avx512_bf16`` or ``amx_bf16``), ``float32`` where not;
- Whisper's compute type (CTranslate2 has int8 kernels for every x86 ISA it
  dispatches to, and no bf16 on CPU) and its threads: the final decoder gets
  the cores the LLM does not, up to four; partials keep one;
- vLLM's OpenMP binding (``VLLM_CPU_OMP_THREADS_BIND``): the LLM gets the last
  half of the cores this process may use (one on two cores, the rest left to
  the speech stages, which the placement bench measured faster than vLLM on
  both), so its threads never migrate onto the cores Whisper and Piper use.

An operator's values win: a config that names a dtype, compute type or thread
count, or an environment that sets ``VLLM_CPU_OMP_THREADS_BIND``, is used as
it is, and the report says so. ``VLLM_DUPLEX_CPU_ISA`` (``avx2``,
``avx512``...) caps what the detection believes, to run a bigger machine as a
smaller one; oneDNN's ``ONEDNN_MAX_CPU_ISA`` is honoured the same way, so a
cap set for the libraries (``scripts/isa-cap.sh``) is one the choices see.

Everything but ``detect`` is a pure function of values (tested by value);
``detect`` reads ``/proc/cpuinfo`` and the process's CPU affinity once.
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Mapping
from dataclasses import dataclass, field

# The x86 ISA levels a cap may name, lowest first, with the flags each adds.
_LEVELS: tuple[tuple[str, frozenset[str]], ...] = (
    ("generic", frozenset()),
    ("avx", frozenset({"avx"})),
    ("avx2", frozenset({"avx2", "fma", "f16c"})),
    ("avx2_vnni", frozenset({"avx_vnni"})),
    ("avx512", frozenset({"avx512f", "avx512cd", "avx512bw", "avx512dq", "avx512vl"})),
    ("avx512_vnni", frozenset({"avx512_vnni"})),
    ("avx512_bf16", frozenset({"avx512_bf16"})),
    ("amx", frozenset({"amx_bf16", "amx_tile", "amx_int8", "avx512_fp16"})),
)
# Flags that belong to some level: a cap removes those above it.
_LEVELLED = frozenset().union(*(flags for _, flags in _LEVELS))
# What oneDNN's ONEDNN_MAX_CPU_ISA names, as our levels.
_ONEDNN = {"sse41": "generic", "avx": "avx", "avx2": "avx2", "avx2_vnni": "avx2_vnni",
           "avx2_vnni_2": "avx2_vnni", "avx512_core": "avx512",
           "avx512_core_vnni": "avx512_vnni", "avx512_core_bf16": "avx512_bf16",
           "avx10_1_512": "amx", "avx512_core_amx": "amx", "avx512_core_amx_fp16": "amx",
           "all": "amx"}
_SHOWN = ("avx2", "avx512f", "avx_vnni", "avx512_vnni", "avx512_bf16", "amx_bf16", "avx512_fp16")


def _level_index(name: str) -> int:
    for i, (level, _) in enumerate(_LEVELS):
        if level == name:
            return i
    raise ValueError(f"unknown ISA level {name!r}; one of {', '.join(n for n, _ in _LEVELS)}")


def isa_cap(env: Mapping[str, str]) -> str | None:
    """The ISA level an operator capped the machine at (ours, else oneDNN's)."""
    ours = env.get("VLLM_DUPLEX_CPU_ISA", "").strip().lower()
    if ours:
        _level_index(ours)  # an unknown name is an error, not a silent no-cap
        return ours
    onednn = env.get("ONEDNN_MAX_CPU_ISA", "").strip().lower()
    return _ONEDNN.get(onednn) if onednn else None


@dataclass(frozen=True)
class Cpu:
    """What this process may run on: the CPU's name, the cores it may use and
    the flags it may use (the detected ones, less those above a cap)."""

    model: str
    cores: tuple[int, ...]  # CPU ids of the process's affinity, ascending
    flags: frozenset[str]
    arch: str = "x86_64"
    cap: str | None = None  # the ISA level the flags were capped at

    @classmethod
    def parse(cls, cpuinfo: str, cores: tuple[int, ...], env: Mapping[str, str],
              arch: str = "x86_64") -> Cpu:
        """From the text of ``/proc/cpuinfo`` (its first processor's block)."""
        model, flags = "unknown CPU", frozenset[str]()
        for line in cpuinfo.splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key == "model name" and model == "unknown CPU":
                model = " ".join(value.split())
            elif key in ("flags", "Features") and not flags:
                flags = frozenset(value.split())
        cap = isa_cap(env)
        if cap is not None:
            allowed = frozenset().union(*(f for _, f in _LEVELS[:_level_index(cap) + 1]))
            flags = frozenset(f for f in flags if f not in _LEVELLED or f in allowed)
        return cls(model, tuple(sorted(cores)) or (0,), flags, arch, cap)

    @property
    def count(self) -> int:
        return len(self.cores)

    @property
    def isa(self) -> str:
        """The highest level whose every flag is here (x86); the arch elsewhere."""
        if self.arch not in ("x86_64", "AMD64", "i686"):
            return self.arch
        best = "generic"
        for level, needs in _LEVELS[1:]:
            # Not a strict chain: AMD's Zen 4 has AVX-512 VNNI without AVX-VNNI.
            if needs <= self.flags and (level == "avx2_vnni" or "avx2" in self.flags):
                best = level
        return best

    @property
    def native_bf16(self) -> bool:
        """bfloat16 math in hardware (x86: AVX-512 BF16 or AMX; Arm: BF16)."""
        return bool({"avx512_bf16", "amx_bf16"} & self.flags) or (
            self.arch == "aarch64" and "bf16" in self.flags)

    def summary(self) -> str:
        """One line for a start-up log or a bench header."""
        shown = [f for f in _SHOWN if f in self.flags]
        capped = f", capped at {self.cap}" if self.cap else ""
        return (f"{self.model}, {self.count} core{'s' if self.count != 1 else ''}, "
                f"{self.isa} ({' '.join(shown) or 'no vector extensions'}){capped}")

    def to_json(self) -> dict[str, object]:
        return {"model": self.model, "cores": self.count, "isa": self.isa,
                "native_bf16": self.native_bf16, "cap": self.cap,
                "flags": [f for f in _SHOWN if f in self.flags]}


@dataclass(frozen=True)
class Choice:
    """One setting: its value and why (``machine`` or ``config``/``env``)."""

    value: object
    source: str
    reason: str = ""

    def to_json(self) -> dict[str, object]:
        return {"value": self.value, "source": self.source, "reason": self.reason}


@dataclass(frozen=True)
class MachineChoices:
    """The settings chosen for ``cpu`` (see the module docstring)."""

    cpu: Cpu
    llm_dtype: Choice
    whisper_compute_type: Choice
    whisper_threads: Choice
    vllm_cpu_bind: Choice
    stage_slots: Choice = Choice(1, "machine")
    llm_cores: tuple[int, ...] = field(default=())

    def to_json(self) -> dict[str, object]:
        return {"cpu": self.cpu.to_json(), "llm_dtype": self.llm_dtype.to_json(),
                "whisper_compute_type": self.whisper_compute_type.to_json(),
                "whisper_threads": self.whisper_threads.to_json(),
                "vllm_cpu_bind": self.vllm_cpu_bind.to_json(),
                "stage_slots": self.stage_slots.to_json()}

    def summary(self) -> str:
        def one(name: str, c: Choice) -> str:
            return f"{name} {c.value}" + ("" if c.source == "machine" else f" ({c.source})")
        return ", ".join((one("llm dtype", self.llm_dtype),
                          one("whisper", self.whisper_compute_type),
                          one("whisper threads", self.whisper_threads),
                          one("vllm cores", self.vllm_cpu_bind),
                          one("stage slots", self.stage_slots)))


def choose(cpu: Cpu, env: Mapping[str, str], *, dtype: str | None = None,
           compute_type: str | None = None, threads: int | None = None,
           compute_types: frozenset[str] = frozenset({"int8", "float32"})) -> MachineChoices:
    """The best settings for ``cpu``; a non-None argument (the config's) or
    an operator's ``VLLM_CPU_OMP_THREADS_BIND`` is kept as it is.
    ``compute_types``: what CTranslate2 says this CPU supports."""
    n = cpu.count
    llm_n = max(1, n // 2)
    llm_cores = cpu.cores[n - llm_n:]
    if dtype is not None:
        llm_dtype = Choice(dtype, "config")
    elif cpu.native_bf16:
        llm_dtype = Choice("bfloat16", "machine", "native bf16 (" + " ".join(
            sorted({"avx512_bf16", "amx_bf16", "bf16"} & cpu.flags)) + ")")
    else:
        llm_dtype = Choice("float32", "machine", "no native bf16")
    if compute_type is not None:
        ct = Choice(compute_type, "config")
    elif "int8" in compute_types:
        ct = Choice("int8", "machine", "int8 kernels for " + cpu.isa)
    else:
        ct = Choice("float32", "machine", "no int8 kernels on this CPU")
    if threads is not None:
        th = Choice(threads, "config")
    else:
        th = Choice(max(1, min(4, n - llm_n)), "machine", f"{n} cores, {llm_n} for the LLM")
    bound = env.get("VLLM_CPU_OMP_THREADS_BIND")
    if bound:
        bind = Choice(bound, "env")
    else:
        bind = Choice(_id_list(llm_cores), "machine", f"the last {llm_n} of {n} cores")
    raw_slots = env.get("VLLM_DUPLEX_CPU_SLOTS", "").strip()
    if raw_slots:
        if not raw_slots.isdigit() or int(raw_slots) < 1:
            raise ValueError(f"VLLM_DUPLEX_CPU_SLOTS must be a whole number >= 1, got {raw_slots!r}")
        slots = Choice(int(raw_slots), "env")
    else:
        slots = Choice(max(2, n - llm_n), "machine",
                       f"the {n - llm_n} core{'s' if n - llm_n != 1 else ''} the LLM does not take"
                       + (", and one beside the LLM's" if n - llm_n < 2 else ""))
    return MachineChoices(cpu, llm_dtype, ct, th, bind, slots, llm_cores)


def _id_list(ids: tuple[int, ...]) -> str:
    """``(2, 3, 4, 7)`` -> ``"2-4,7"`` (vLLM's CPU list form)."""
    parts: list[str] = []
    run: list[int] = []
    for i in ids:
        if run and i == run[-1] + 1:
            run.append(i)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [i]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts)


@functools.lru_cache(maxsize=1)
def detect() -> Cpu:
    """This machine, read once per process (``/proc/cpuinfo``, affinity)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            text = f.read()
    except OSError:
        text = ""
    try:
        cores = tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        cores = tuple(range(os.cpu_count() or 1))
    if not text:
        text = f"model name: {platform.processor() or 'unknown CPU'}"
    return Cpu.parse(text, cores, os.environ, platform.machine() or "x86_64")
