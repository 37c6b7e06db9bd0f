"""MiniCPM-o 2.6's model configuration (``model_type: minicpmo``), written for
the tiny test model: transformers has no class for it (the real checkpoint
ships its own as remote code), and vLLM's ``MiniCPMO`` reads these fields.

A Qwen language model (MiniCPM-o 2.6's is Qwen2.5, 4.5's Qwen3; vLLM picks by
``version``, and the fields of Qwen3's config cover both) plus a SigLIP
vision tower (``vision_config``), a Whisper audio encoder (``audio_config``)
and the resampler's ``query_num`` queries per image slice.
"""

from huggingface_hub.dataclasses import strict
from transformers import Qwen3Config, SiglipVisionConfig, WhisperConfig


@strict
class MiniCPMOConfig(Qwen3Config):
    model_type = "minicpmo"
    sub_configs = {"vision_config": SiglipVisionConfig, "audio_config": WhisperConfig}

    vision_config: dict | SiglipVisionConfig | None = None
    audio_config: dict | WhisperConfig | None = None
    version: float = 2.6
    query_num: int = 64  # resampler queries: tokens per image slice
    image_size: int = 448  # the slicing resolution
    patch_size: int = 14
    slice_mode: bool = True
    max_slice_num: int = 9
    use_image_id: bool = True
    drop_vision_last_layer: bool = False
    batch_vision_input: bool = True
    vision_batch_size: int = 16
    audio_pool_step: int = 2
    audio_chunk_length: float = 1.0

    def __post_init__(self, **kwargs):
        if not isinstance(self.vision_config, SiglipVisionConfig):
            self.vision_config = SiglipVisionConfig(**(self.vision_config or {}))
        if not isinstance(self.audio_config, WhisperConfig):
            self.audio_config = WhisperConfig(**(self.audio_config or {}))
        super().__post_init__(**kwargs)
