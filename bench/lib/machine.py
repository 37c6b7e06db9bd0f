"""What a bench ran on: every bench prints this line beside its figures.

Figures depend on the CPU (CTranslate2's int8 kernels and oneDNN's bf16 ones
differ by instruction set; a core count changes what runs beside what), so a
figure without its machine cannot be compared with another. The CPU is read
as the engine reads it (``vllm_duplex.domain.machine``): model, the cores this
process may use, the ISA and its vector extensions, and any cap an operator
set (``scripts/isa-cap.sh``).
"""

from __future__ import annotations

import os
from typing import Any


def info() -> dict[str, Any]:
    from vllm_duplex.domain.machine import detect

    cpu = detect()
    memory_gib = round(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30)
    return {**cpu.to_json(), "cpu_model": cpu.model, "nproc": cpu.count,
            "memory_gib": memory_gib, "summary": cpu.summary(),
            "load": [round(x, 2) for x in os.getloadavg()]}


def line() -> str:
    """``machine: <CPU>, <cores>, <ISA (extensions)>, <GiB>; load ...``."""
    i = info()
    load = " ".join(f"{x:.2f}" for x in i["load"])
    return f"machine: {i['summary']}, {i['memory_gib']} GiB; load {load}"
