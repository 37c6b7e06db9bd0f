"""Where a stage's model runs: ``device: cpu | cuda | cuda:N`` on a stage spec.

Parsed once, when the deployment config loads; a stage type that can run on
a GPU takes ``device`` in its constructor and maps it to its library
(faster-whisper's ``device``/``device_index``, onnxruntime's execution
providers). A stage type without a ``device`` option runs on the CPU, and a
config that puts it on a GPU is refused at load, not ignored. Nothing here
touches a GPU: there is none in CI, so GPU placement is passed through, not
tested (docs/deploy.md says what is untested).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

_FORM = re.compile(r"^(cpu|cuda)(?::(\d{1,3}))?$")


@dataclass(frozen=True)
class Device:
    kind: Literal["cpu", "cuda"] = "cpu"
    index: int = 0

    @classmethod
    def parse(cls, raw: Any) -> Device:
        """``cpu``, ``cuda`` (GPU 0) or ``cuda:N``; anything else is a ValueError
        that shows the accepted forms."""
        if isinstance(raw, Device):
            return raw
        m = _FORM.match(raw) if isinstance(raw, str) else None
        if m is None or (m[1] == "cpu" and m[2] is not None):
            raise ValueError(f"device must be 'cpu', 'cuda' or 'cuda:N', not {raw!r}")
        return cls(m[1], int(m[2] or 0))  # type: ignore[arg-type]

    @property
    def is_gpu(self) -> bool:
        return self.kind == "cuda"

    def onnx_providers(self) -> list[Any]:
        """onnxruntime's providers for this device (CPU kept as the fallback
        for operators the CUDA provider lacks)."""
        if self.is_gpu:
            return [("CUDAExecutionProvider", {"device_id": self.index}), "CPUExecutionProvider"]
        return ["CPUExecutionProvider"]

    def __str__(self) -> str:
        return "cpu" if not self.is_gpu else f"cuda:{self.index}"


CPU = Device()
