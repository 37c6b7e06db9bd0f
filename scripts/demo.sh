#!/usr/bin/env bash
# The README's main job: set up, start the server on loopback, speak a
# question to it in real-time chunks, save the spoken reply, print the
# transcript and timings, stop the server.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
CONFIG="${1:-configs/scripted.yaml}"
mkdir -p build
if ! command -v espeak-ng >/dev/null 2>&1; then
  (apt-get update -qq && apt-get install -y -qq espeak-ng >/dev/null) || true
fi
if command -v espeak-ng >/dev/null 2>&1; then
  espeak-ng -s 150 -w build/question.wav "What is the capital of France?"
else  # no TTS available: a voiced tone burst still exercises the whole path
  .venv/bin/python - <<'PY'
import wave, numpy as np
rate = 16000
t = np.arange(int(rate * 1.5)) / rate
pcm = (0.3 * 32767 * np.sin(2 * np.pi * 220 * t)).astype("<i2")
with wave.open("build/question.wav", "wb") as w:
    w.setnchannels(1); w.setsampwidth(2); w.setframerate(rate); w.writeframes(pcm.tobytes())
PY
fi
PORT=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
.venv/bin/vllm-duplex serve --config "$CONFIG" --port "$PORT" > build/server.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  if .venv/bin/python -c "import urllib.request,sys; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" 2>/dev/null; then break; fi
  if ! kill -0 $SERVER 2>/dev/null; then cat build/server.log; exit 1; fi
  sleep 0.5
done
.venv/bin/vllm-duplex talk --audio build/question.wav --out build/reply.wav \
  --url "ws://127.0.0.1:$PORT/v1/realtime"
echo "reply audio: build/reply.wav"
