"""MiniCPM-V's image processor (slices and patches, PIL + numpy), written for
the tiny MiniCPM-o test model: the real checkpoint ships its own as remote
code, and vLLM's ``MiniCPMO`` processing calls it for the pixel values and
for each image's placeholder text.

An image is resized to about ``scale_resolution`` squared pixels (its
"source"); a larger one is also cut into a grid of up to ``max_slice_nums``
slices, each resized the same way. Every slice is ``image_feature_size``
tokens (the resampler's queries) between ``<image>``/``</image>`` (the source)
or ``<slice>``/``</slice>``. Pixel values are ``[3, patch, L]`` per slice
(patches laid side by side), with the slice's size in patches in
``tgt_sizes``.
"""

import math

import numpy as np
import torch
from PIL import Image
from transformers.image_processing_utils import BaseImageProcessor, BatchFeature


def _multiple(length: float, unit: int) -> int:
    return max(round(length / unit) * unit, unit)


class MiniCPMVImageProcessor(BaseImageProcessor):
    model_input_names = ["pixel_values"]

    def __init__(self, max_slice_nums=9, scale_resolution=448, patch_size=14, image_feature_size=64,
                 slice_mode=True, use_image_id=True, norm_mean=(0.5, 0.5, 0.5), norm_std=(0.5, 0.5, 0.5),
                 version=2.6, im_start="<image>", im_end="</image>", slice_start="<slice>",
                 slice_end="</slice>", im_id_start="<image_id>", im_id_end="</image_id>", unk="<unk>",
                 **kwargs):
        super().__init__(**kwargs)
        self.max_slice_nums = max_slice_nums
        self.scale_resolution = scale_resolution
        self.patch_size = patch_size
        self.image_feature_size = image_feature_size
        self.slice_mode = slice_mode
        self.use_image_id = use_image_id
        self.norm_mean = list(norm_mean)
        self.norm_std = list(norm_std)
        self.version = version
        self.im_start, self.im_end = im_start, im_end
        self.slice_start, self.slice_end = slice_start, slice_end
        self.im_id_start, self.im_id_end = im_id_start, im_id_end
        self.unk = unk

    # ---- geometry ------------------------------------------------------------

    def _fit(self, size, *, upscale: bool) -> tuple[int, int]:
        """``size`` (w, h) scaled to about ``scale_resolution``² pixels (down
        only, unless ``upscale``), each side a multiple of the patch size."""
        w, h = size
        if upscale or w * h > self.scale_resolution ** 2:
            ratio = w / h
            h = int(self.scale_resolution / math.sqrt(ratio))
            w = int(h * ratio)
        return _multiple(w, self.patch_size), _multiple(h, self.patch_size)

    def get_sliced_grid(self, image_size, max_slice_nums=None, nerver_split=False):
        """``[cols, rows]`` of the slices, or None when the image is small
        enough to be its source alone."""
        max_slice_nums = self.max_slice_nums if max_slice_nums is None else int(max_slice_nums)
        w, h = image_size
        n = min(math.ceil(w * h / self.scale_resolution ** 2), max_slice_nums)
        if n <= 1 or nerver_split:
            return None
        grids = [[c, k // c] for k in (n - 1, n, n + 1) if 1 < k <= max_slice_nums
                 for c in range(1, k + 1) if k % c == 0]
        log_ratio = math.log(w / h)
        return min(grids, key=lambda g: abs(log_ratio - math.log(g[0] / g[1])))

    def _slices(self, image: Image.Image, max_slice_nums) -> list[Image.Image]:
        if not self.slice_mode:
            return [image]
        grid = self.get_sliced_grid(image.size, max_slice_nums)
        source = image.resize(self._fit(image.size, upscale=grid is None), Image.Resampling.BICUBIC)
        if grid is None:
            return [source]
        cols, rows = grid
        cell = self._fit((_multiple(image.size[0], cols) / cols, _multiple(image.size[1], rows) / rows),
                         upscale=True)
        refined = image.resize((cell[0] * cols, cell[1] * rows), Image.Resampling.BICUBIC)
        cuts = [refined.crop((c * cell[0], r * cell[1], (c + 1) * cell[0], (r + 1) * cell[1]))
                for r in range(rows) for c in range(cols)]
        return [source, *cuts]

    # ---- placeholders --------------------------------------------------------

    def get_slice_image_placeholder(self, image_size, image_idx=0, max_slice_nums=None, use_image_id=None):
        tokens = self.unk * self.image_feature_size
        text = self.im_start + tokens + self.im_end
        if self.use_image_id if use_image_id is None else use_image_id:
            text = f"{self.im_id_start}{image_idx}{self.im_id_end}" + text
        grid = self.get_sliced_grid(image_size, max_slice_nums) if self.slice_mode else None
        if grid is not None:
            cols, rows = grid
            row = (self.slice_start + tokens + self.slice_end) * cols
            text += "\n".join([row] * rows)
        return text

    # ---- pixels --------------------------------------------------------------

    def _patches(self, image: Image.Image) -> tuple[torch.Tensor, tuple[int, int]]:
        """``[3, patch, L]`` (patches side by side) and the size in patches."""
        x = np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0
        x = (x - np.asarray(self.norm_mean, np.float32)) / np.asarray(self.norm_std, np.float32)
        chw = torch.from_numpy(np.ascontiguousarray(x.transpose(2, 0, 1)))
        p = self.patch_size
        cols = torch.nn.functional.unfold(chw.unsqueeze(0), (p, p), stride=(p, p))[0]  # [3*p*p, n]
        patches = cols.reshape(3, p, p, -1).permute(0, 1, 3, 2).reshape(3, p, -1)
        return patches, (chw.shape[1] // p, chw.shape[2] // p)

    def preprocess(self, images, do_pad=True, max_slice_nums=None, return_tensors=None, **kwargs):
        if isinstance(images, Image.Image):
            batches = [[images]]
        elif images and isinstance(images[0], Image.Image):
            batches = [list(images)]
        else:
            batches = [list(b or []) for b in images]
        pixel_values, image_sizes, tgt_sizes = [], [], []
        for batch in batches:
            values, sizes, grids = [], [], []
            for image in batch:
                if not isinstance(image, Image.Image):
                    image = Image.fromarray(np.asarray(image))
                image = image.convert("RGB")
                sizes.append(image.size)
                for part in self._slices(image, max_slice_nums):
                    patches, grid = self._patches(part)
                    values.append(patches)
                    grids.append(grid)
            pixel_values.append(values)
            image_sizes.append(sizes)
            tgt_sizes.append(torch.tensor(grids, dtype=torch.int32) if grids else [])
        return BatchFeature(data={"pixel_values": pixel_values, "image_sizes": image_sizes,
                                  "tgt_sizes": tgt_sizes})

    __call__ = preprocess
