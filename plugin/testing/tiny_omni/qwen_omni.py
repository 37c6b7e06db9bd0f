"""A tiny Qwen2.5-Omni (random weights): the thinker -- audio encoder, vision
encoder, Qwen2 language model with M-RoPE -- shrunk to a few layers, saved
the way the real checkpoint is (``Qwen2_5OmniModel``, weights under
``thinker.``), with the tokenizer's special tokens and the processor's
config.

vLLM 0.32 cannot load it without torchvision: its ``qwen2_vl`` module (which
``qwen2_5_omni_thinker`` and ``qwen3_omni_moe_thinker`` import) imports
``transformers.models.qwen2_vl.image_processing_qwen2_vl``, a torchvision
module ("No module named 'torchvision'"), and transformers 5.19's
``Qwen2_5OmniProcessor`` needs a torchvision video processor. The only
torchvision wheels for torch 2.13 are CUDA builds that fail on the CPU torch
("operator torchvision::nms does not exist"), so on this CPU stack the model
is built but not served; a GPU install of vLLM (which has torchvision) loads it.
"""

from __future__ import annotations

import json
from pathlib import Path

from vllm_duplex.testing.tiny_omni.minicpmo import never_ends
from vllm_duplex.testing.tiny_omni.tokenizer import byte_level_bpe, chatml_template

SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|AUDIO|>", "<|audio_bos|>", "<|audio_eos|>",
            "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_bos|>", "<|vision_eos|>",
            "<|vision_pad|>", "<|IMAGE|>", "<|VIDEO|>")
SYSTEM = ("You are Qwen, a virtual human developed by the Qwen Team, Alibaba Group, capable of perceiving "
          "auditory and visual inputs, as well as generating text and speech.")
VOCAB = 384


def build(out: Path, seed: int = 0) -> None:
    """Write the model directory ``out`` (it must not exist yet)."""
    import torch
    from safetensors.torch import save_file
    from transformers import (
        Qwen2_5OmniConfig,
        Qwen2_5OmniThinkerConfig,
        Qwen2_5OmniThinkerForConditionalGeneration,
        Qwen2TokenizerFast,
    )

    out.mkdir(parents=True)
    tok = byte_level_bpe(SPECIALS)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    names = {"image_token": "<|IMAGE|>", "audio_token": "<|AUDIO|>", "video_token": "<|VIDEO|>",
             "vision_bos_token": "<|vision_bos|>", "vision_eos_token": "<|vision_eos|>",
             "audio_bos_token": "<|audio_bos|>", "audio_eos_token": "<|audio_eos|>"}
    fast = Qwen2TokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                              bos_token=None, unk_token=None, extra_special_tokens=names)
    fast.chat_template = chatml_template(SYSTEM, {
        "image": "<|vision_bos|><|IMAGE|><|vision_eos|>", "audio": "<|audio_bos|><|AUDIO|><|audio_eos|>",
        "video": "<|vision_bos|><|VIDEO|><|vision_eos|>"})
    fast.save_pretrained(out)

    text = dict(vocab_size=VOCAB, hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0, "mrope_section": [4, 6, 6]},
                tie_word_embeddings=False, eos_token_id=ids["<|im_end|>"], pad_token_id=ids["<|endoftext|>"])
    audio = dict(num_mel_bins=128, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=128,
                 d_model=64, max_source_positions=1500, n_window=100, output_dim=128)
    vision = dict(depth=2, hidden_size=64, intermediate_size=128, num_heads=2, in_channels=3, patch_size=14,
                  spatial_merge_size=2, temporal_patch_size=2, window_size=112, out_hidden_size=128,
                  fullatt_block_indexes=[1])
    thinker = Qwen2_5OmniThinkerConfig(
        audio_config=audio, vision_config=vision, text_config=text,
        audio_token_index=ids["<|AUDIO|>"], image_token_index=ids["<|IMAGE|>"],
        video_token_index=ids["<|VIDEO|>"], audio_start_token_id=ids["<|audio_bos|>"],
        audio_end_token_id=ids["<|audio_eos|>"], vision_start_token_id=ids["<|vision_bos|>"],
        vision_end_token_id=ids["<|vision_eos|>"], vision_token_id=ids["<|vision_pad|>"],
        bos_token_id=ids["<|im_start|>"], eos_token_id=ids["<|im_end|>"],
        pad_token_id=ids["<|endoftext|>"], user_token_id=0)
    thinker.architectures = ["Qwen2_5OmniThinkerForConditionalGeneration"]
    config = Qwen2_5OmniConfig(thinker_config=thinker.to_dict(), enable_audio_output=False)
    config.architectures = ["Qwen2_5OmniModel"]
    config.save_pretrained(out)
    (out / "preprocessor_config.json").write_text(json.dumps({
        "processor_class": "Qwen2_5OmniProcessor",
        "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": 128, "sampling_rate": 16000,
        "hop_length": 160, "chunk_length": 30, "n_fft": 400, "padding_value": 0.0,
        "padding_side": "right", "return_attention_mask": True, "dither": 0.0,
        "image_processor_type": "Qwen2VLImageProcessor", "min_pixels": 3136, "max_pixels": 12845056,
        "patch_size": 14, "temporal_patch_size": 2, "merge_size": 2,
        "image_mean": [0.48145466, 0.4578275, 0.40821073], "image_std": [0.26862954, 0.26130258, 0.27577711],
        "do_resize": True, "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True,
        "do_convert_rgb": True,
    }, indent=2) + "\n")

    torch.manual_seed(seed)
    model = Qwen2_5OmniThinkerForConditionalGeneration(thinker)
    weights = {f"thinker.{k}": v.detach().to(torch.float32).contiguous() for k, v in model.state_dict().items()}
    never_ends(weights["thinker.lm_head.weight"], ids["<|im_end|>"])
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
