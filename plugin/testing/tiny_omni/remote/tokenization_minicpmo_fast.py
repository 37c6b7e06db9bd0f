"""MiniCPM-o 2.6's tokenizer class, written for the tiny test model: a Qwen2
tokenizer that names the model's markup tokens (images, slices, audio,
speaker), which vLLM's MiniCPM-o processor reads as ``tokenizer.im_start_id``
and the like. The real checkpoint ships its own as remote code.
"""

from transformers import Qwen2TokenizerFast

_MARKUP = {
    "im_start": "<image>", "im_end": "</image>",
    "slice_start": "<slice>", "slice_end": "</slice>",
    "im_id_start": "<image_id>", "im_id_end": "</image_id>",
    "ref_start": "<ref>", "ref_end": "</ref>",
    "box_start": "<box>", "box_end": "</box>",
    "quad_start": "<quad>", "quad_end": "</quad>",
    "point_start": "<point>", "point_end": "</point>",
    "audio_start": "<|audio_start|>", "audio_end": "<|audio_end|>",
    "spk_start": "<|spk_bos|>", "spk_end": "<|spk_eos|>",
    "tts_start": "<|tts_bos|>", "tts_end": "<|tts_eos|>",
}


class MiniCPMOTokenizerFast(Qwen2TokenizerFast):
    @property
    def eos_id(self):
        return self.eos_token_id

    @property
    def bos_id(self):
        return self.bos_token_id

    @property
    def unk_id(self):
        return self.unk_token_id

    @property
    def newline_id(self):
        return self.encode("\n", add_special_tokens=False)[0]


def _markup(name: str, token: str) -> None:
    setattr(MiniCPMOTokenizerFast, name, property(lambda self: token))
    setattr(MiniCPMOTokenizerFast, f"{name}_id",
            property(lambda self: self.convert_tokens_to_ids(token)))


for _name, _token in _MARKUP.items():
    _markup(_name, _token)
