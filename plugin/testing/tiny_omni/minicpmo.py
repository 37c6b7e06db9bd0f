"""A tiny MiniCPM-o (random weights) that vLLM's ``MiniCPMO`` loads: the real
architecture -- SigLIP vision tower, resampler, Whisper audio encoder and
projector, Qwen language model -- shrunk to a few layers and a small width.

Version 4.5 (Qwen3 language model, ``Resampler4_5``) runs images on vLLM's
CPU backend; version 2.6 (Qwen2, ``Resampler2_5``) runs audio there, but its
resampler calls ``torch.cuda.is_current_stream_capturing()``, which raises on
a CPU-only torch ("Tried to instantiate dummy base class
_cuda_isCurrentStreamCapturing") and kills the engine at the first image.

The checkpoint's remote code (its config class, tokenizer and image
processor) has no copy in transformers; ``remote/`` holds versions written
for these models, copied into the model directory (``trust_remote_code``).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from vllm_duplex.testing.tiny_omni.tokenizer import byte_level_bpe, chatml_template

REMOTE = Path(__file__).with_name("remote")
SPECIALS = ("<unk>", "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<image>", "</image>", "<slice>",
            "</slice>", "<image_id>", "</image_id>", "<unit>", "</unit>", "<|audio_start|>", "<|audio|>",
            "<|audio_end|>", "<|spk_bos|>", "<|spk|>", "<|spk_eos|>", "<|tts_bos|>", "<|tts_eos|>",
            "<ref>", "</ref>", "<box>", "</box>", "<quad>", "</quad>", "<point>", "</point>")
SYSTEM = "You are a helpful assistant. You can accept video, audio and text input and output voice and text."

VOCAB = 384
HIDDEN = 128  # the resampler has HIDDEN // 128 heads: at least 128
QUERIES = 16  # tokens per image slice (the real model: 64)
VISION = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=2,
              image_size=980, patch_size=14, num_channels=3)
AUDIO = dict(d_model=64, encoder_layers=2, encoder_attention_heads=2, encoder_ffn_dim=256,
             num_mel_bins=80, max_source_positions=1500, decoder_layers=1,
             decoder_attention_heads=2, decoder_ffn_dim=128, vocab_size=VOCAB)
POOL_STEP = {"2.6": 2, "4.5": 5}  # audio frames (50/s) pooled per token


def text_config(ids: dict[str, int]) -> dict[str, Any]:
    return dict(vocab_size=VOCAB, hidden_size=HIDDEN, intermediate_size=256, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=32,
                max_position_embeddings=4096, tie_word_embeddings=False,
                rope_parameters={"rope_type": "default", "rope_theta": 1000000.0},
                bos_token_id=ids["<|im_start|>"], eos_token_id=ids["<|im_end|>"],
                pad_token_id=ids["<|endoftext|>"])


def build(out: Path, version: str = "4.5", seed: int = 0) -> None:
    """Write the model directory ``out`` (it must not exist yet)."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoTokenizer, Qwen2TokenizerFast

    out.mkdir(parents=True)
    for name in ("configuration_minicpm.py", "tokenization_minicpmo_fast.py", "image_processing_minicpmv.py"):
        shutil.copy(REMOTE / name, out / name)

    tok = byte_level_bpe(SPECIALS)
    ids = {s: tok.token_to_id(s) for s in SPECIALS}
    fast = Qwen2TokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                              unk_token="<unk>", bos_token=None)
    fast.chat_template = chatml_template(SYSTEM, {"image": "(<image>./</image>)", "audio": "(<audio>./</audio>)"})
    fast.save_pretrained(out)
    _edit(out / "tokenizer_config.json", tokenizer_class="MiniCPMOTokenizerFast", auto_map={
        "AutoTokenizer": ["tokenization_minicpmo_fast.MiniCPMOTokenizerFast"] * 2})
    AutoTokenizer.from_pretrained(out, trust_remote_code=True)  # it loads, and names its markup

    text = text_config(ids)
    config = {"architectures": ["MiniCPMO"], "model_type": "minicpmo",
              "auto_map": {"AutoConfig": "configuration_minicpm.MiniCPMOConfig"},
              **text, "vision_config": VISION, "audio_config": AUDIO, "version": float(version),
              "query_num": QUERIES, "image_size": 448, "patch_size": 14, "slice_mode": True,
              "max_slice_num": 9, "use_image_id": True, "drop_vision_last_layer": False,
              "batch_vision_input": True, "audio_pool_step": POOL_STEP[version],
              "audio_chunk_length": 1.0, "torch_dtype": "float32"}
    (out / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    # One file for the image processor (remote code) and the Whisper feature
    # extractor, as the real checkpoint has; processor_class names the
    # processor vLLM ships for MiniCPM-o.
    (out / "preprocessor_config.json").write_text(json.dumps({
        "processor_class": "MiniCPMOProcessor", "image_processor_type": "MiniCPMVImageProcessor",
        "auto_map": {"AutoImageProcessor": "image_processing_minicpmv.MiniCPMVImageProcessor"},
        "max_slice_nums": 9, "scale_resolution": 448, "patch_size": 14, "image_feature_size": QUERIES,
        "slice_mode": True, "use_image_id": True, "norm_mean": [0.5] * 3, "norm_std": [0.5] * 3,
        "version": float(version),
        "feature_extractor_type": "WhisperFeatureExtractor", "feature_size": AUDIO["num_mel_bins"],
        "sampling_rate": 16000, "hop_length": 160, "chunk_length": 30, "n_fft": 400,
        "padding_value": 0.0, "padding_side": "right", "return_attention_mask": False,
    }, indent=2) + "\n")

    torch.manual_seed(seed)
    weights = _weights(version, text)
    never_ends(weights["llm.lm_head.weight"], ids["<|im_end|>"])
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})


def never_ends(lm_head: Any, end_id: int) -> None:
    """Zero the end-of-turn row of the output layer: its logit is then 0,
    below the largest of the other random logits (hundreds of them, centred
    on 0) in every step, so a greedy reply of the tiny model never ends by
    itself -- it runs to ``max_tokens``, long enough for a test to talk over."""
    lm_head[end_id].zero_()


def _weights(version: str, text: dict[str, Any]) -> dict[str, Any]:
    """Random weights under the checkpoint's names (``llm.``, ``vpm.``,
    ``resampler.``, ``apm.``, ``audio_projection_layer.``), from transformers'
    own modules where it has them."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM, WhisperConfig
    from transformers.models.idefics2.configuration_idefics2 import Idefics2VisionConfig
    from transformers.models.idefics2.modeling_idefics2 import Idefics2VisionTransformer
    from transformers.models.whisper.modeling_whisper import WhisperEncoder

    llm = (Qwen3ForCausalLM(Qwen3Config(**text)) if version == "4.5"
           else Qwen2ForCausalLM(Qwen2Config(**text)))
    parts = {"llm": llm, "vpm": Idefics2VisionTransformer(Idefics2VisionConfig(**VISION)),
             "apm": WhisperEncoder(WhisperConfig(**AUDIO))}
    sd = {f"{prefix}.{k}": v for prefix, m in parts.items() for k, v in m.state_dict().items()}

    def normal(*shape: int) -> Any:
        return torch.randn(*shape) * 0.02

    e, kv, audio_dim = HIDDEN, VISION["hidden_size"], AUDIO["encoder_ffn_dim"] // 4
    sd.update({
        "resampler.query": normal(QUERIES, e), "resampler.kv_proj.weight": normal(e, kv),
        "resampler.attn.in_proj_weight": normal(3 * e, e), "resampler.attn.in_proj_bias": torch.zeros(3 * e),
        "resampler.attn.out_proj.weight": normal(e, e), "resampler.attn.out_proj.bias": torch.zeros(e),
        "resampler.proj": normal(e, e),
        **{f"resampler.{ln}.{p}": (torch.ones(e) if p == "weight" else torch.zeros(e))
           for ln in ("ln_q", "ln_kv", "ln_post") for p in ("weight", "bias")},
        "audio_projection_layer.linear1.weight": normal(e, audio_dim),
        "audio_projection_layer.linear1.bias": torch.zeros(e),
        "audio_projection_layer.linear2.weight": normal(e, e),
        "audio_projection_layer.linear2.bias": torch.zeros(e),
    })
    return {k: v.detach().to(torch.float32).contiguous() for k, v in sd.items()}


def _edit(path: Path, **fields: Any) -> None:
    data = json.loads(path.read_text())
    data.update(fields)
    path.write_text(json.dumps(data, indent=2) + "\n")
