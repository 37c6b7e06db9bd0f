"""``EspeakPhonemizer``: one ``espeak-ng`` process kept running, text lines in,
IPA lines out -- Piper's phonemes without starting a process per piece.

Why: starting a process from the server forks it, and under uvloop (what
``vllm-duplex serve`` runs) that fork holds the event loop *and* the GIL while
the kernel copies the page tables of a process holding the models: 80-250 ms
per start on the 2-core CPU (issue 21), every piece of every reply, which
froze every session at once. A process that stays up costs nothing per piece
(and saves espeak-ng's own start-up, ~10 ms).

The protocol is espeak-ng's own: it phonemizes each line as it arrives
(a line break ends a clause) and writes one line of IPA per clause. After
each text goes a marker line, whose IPA is learned at start, so the answer
is every line up to the marker's. Text never holds a line break (the TTS
port sanitizes it) nor the marker word (removed here), so the answer cannot
be cut early. Everything here is synchronous: it runs on the TTS stage's
worker threads, one phonemizer per thread, never on the event loop; the
process is started with ``subprocess.Popen`` (vfork: no page tables copied)
on that thread. A process that dies or hangs (``timeout_s``) is killed and
started again for the next text.
"""

from __future__ import annotations

import os
import re
import select
import subprocess
import threading
import time
from collections.abc import Sequence

MARKER = "qqduplexmarkqq"  # a word no reply holds; its IPA ends every answer
_MARKER_RE = re.compile(re.escape(MARKER), re.IGNORECASE)


class PhonemizerError(RuntimeError):
    pass


class EspeakPhonemizer:
    """``argv``: an ``espeak-ng --ipa`` command reading UTF-8 text on stdin
    (``piper_voice.espeak_argv``). Thread-safe (one text at a time)."""

    def __init__(self, argv: Sequence[str], *, timeout_s: float = 10.0) -> None:
        self.argv = list(argv)
        self.timeout_s = timeout_s
        self._lock = threading.Lock()
        self._proc: subprocess.Popen[bytes] | None = None
        self._buffer = b""
        self._marker_ipa = ""
        self.starts = 0  # processes started (1 unless one died or hung)

    def phonemize(self, text: str) -> str:
        """espeak-ng's IPA for ``text``: one line per clause, as the program
        writes it when run on ``text`` alone."""
        line = " ".join(_MARKER_RE.sub(" ", text).split())
        if not line:
            return ""
        with self._lock:
            if self._proc is not None and self._pending():
                self._stop()  # out of step (an answer we did not read): start afresh
            if self._proc is None:
                self._start()
            try:
                return "".join(f"{ipa}\n" for ipa in self._ask(line))
            except PhonemizerError:
                self._stop()
                raise

    def close(self) -> None:
        with self._lock:
            self._stop()

    # ---- the process -------------------------------------------------------

    def _start(self) -> None:
        self._proc = subprocess.Popen(self.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.DEVNULL, bufsize=0)
        self._buffer = b""
        self.starts += 1
        try:
            lines = self._exchange(MARKER, until=None)
        except PhonemizerError:
            self._stop()
            raise
        if not lines:
            self._stop()
            raise PhonemizerError(f"{self.argv[0]} gave no phonemes for its marker")
        self._marker_ipa = lines[-1]

    def _ask(self, line: str) -> list[str]:
        return self._exchange(f"{line}\n{MARKER}", until=self._marker_ipa)

    def _exchange(self, text: str, *, until: str | None) -> list[str]:
        """Write ``text`` (and a line break), read lines up to the one equal to
        ``until`` (None: the first non-empty line, which is returned alone)."""
        proc = self._proc
        assert proc is not None and proc.stdin is not None and proc.stdout is not None
        try:
            proc.stdin.write(text.encode("utf-8") + b"\n")
            proc.stdin.flush()
        except OSError as e:
            raise PhonemizerError(f"{self.argv[0]} stopped: {e}") from None
        deadline = time.monotonic() + self.timeout_s
        fd = proc.stdout.fileno()
        lines: list[str] = []
        while True:
            while b"\n" in self._buffer:
                raw, self._buffer = self._buffer.split(b"\n", 1)
                got = raw.decode("utf-8", errors="replace").strip()
                if until is None:
                    if got:
                        return [got]
                elif got == until:
                    return lines
                elif got:
                    lines.append(got)
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                raise PhonemizerError(f"{self.argv[0]} gave no answer within {self.timeout_s:g} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise PhonemizerError(f"{self.argv[0]} exited with {proc.poll()}")
            self._buffer += chunk

    def _pending(self) -> bool:
        """Output nobody asked for is waiting (or the process ended)."""
        assert self._proc is not None and self._proc.stdout is not None
        return bool(self._buffer) or bool(select.select([self._proc.stdout.fileno()], [], [], 0)[0])

    def _stop(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                stream.close()
        if proc.poll() is None:
            proc.kill()
        proc.wait()
