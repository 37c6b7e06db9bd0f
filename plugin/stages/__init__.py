"""Stages: the ``StagePort``/``Stage`` protocols and the port base (``port``),
what the host may ask of a stage (``lifecycle``), the ``Pipeline`` that
streams each stage's outputs into the next, and the stages themselves in
rooms by what they do: ``listening`` (VAD, ASR), ``speech`` (TTS), ``vision``,
``omni`` (native audio/video models) and ``vllm`` (the LLM stage).

Below sessions and text, which open ports; above policy, replay, media and
the core, whose payload types the stages consume and produce.
"""
