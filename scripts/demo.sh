#!/usr/bin/env bash
# The README's main job: set up everything on a fresh machine, prepare the
# models, start the server on loopback (the embedded CPU default: Silero VAD ->
# Whisper -> vLLM SmolLM2 -> Piper), speak a question to it in real-time
# chunks, save the spoken reply, print what it heard and answered, and timings.
#   bash scripts/demo.sh [configs/<name>.yaml] ["question text"]
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
CONFIG="${1:-configs/cascade-cpu.yaml}"
QUESTION="${2:-What is the capital of France?}"
export HF_HUB_OFFLINE=1
mkdir -p build
.venv/bin/vllm-duplex prepare
# The question, spoken on the spot by Flite (any voice: Whisper hears them all).
flite -voice slt -t "$QUESTION" -o build/question.wav
PORT=$(.venv/bin/python -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
.venv/bin/vllm-duplex serve --config "$CONFIG" --port "$PORT" > build/server.log 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
echo "starting the server ($CONFIG; the vLLM engine takes ~30 s on 2 cores) ..."
for _ in $(seq 1 600); do
  if .venv/bin/python -c "import urllib.request; urllib.request.urlopen('http://127.0.0.1:$PORT/health', timeout=1)" 2>/dev/null; then break; fi
  if ! kill -0 $SERVER 2>/dev/null; then tail -n 40 build/server.log; exit 1; fi
  sleep 0.5
done
echo "question: $QUESTION"
.venv/bin/vllm-duplex talk --audio build/question.wav --out build/reply.wav \
  --url "ws://127.0.0.1:$PORT/v1/realtime"
echo "reply audio: build/reply.wav"
