"""``ImageClassifier``: a small CNN for batches of images of different sizes."""

from __future__ import annotations

import logging
import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from trainkit.config import CfgNode
from trainkit.modeling.build import META_ARCH_REGISTRY

logger = logging.getLogger(__name__)

__all__ = ["ImageClassifier", "MaskedBatchNorm2d"]


class MaskedBatchNorm2d(nn.BatchNorm2d):
    """``BatchNorm2d`` whose training statistics count only valid (unpadded) pixels.

    In eval mode it is a plain ``BatchNorm2d`` (running statistics). In training mode the
    batch mean and variance are taken over the pixels where ``mask`` is 1, so how much
    padding a batch happens to carry does not shift the statistics, and the running
    statistics describe real image content, which is what eval mode sees.
    """

    def forward(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> torch.Tensor:
        """Normalise ``x`` ([N, C, H, W]) with statistics over ``mask`` ([N, 1, H, W])."""
        if mask is None or not self.training:
            return super().forward(x)
        num_valid = mask.sum().clamp(min=2.0)
        mean = (x * mask).sum(dim=(0, 2, 3)) / num_valid
        centred = x - mean[None, :, None, None]
        var = (centred.square() * mask).sum(dim=(0, 2, 3)) / num_valid
        if self.track_running_stats:
            with torch.no_grad():
                self.num_batches_tracked += 1
                momentum = self.momentum
                if momentum is None:  # cumulative moving average, as in BatchNorm2d
                    momentum = 1.0 / float(self.num_batches_tracked)
                unbiased_var = var * (num_valid / (num_valid - 1.0))
                self.running_mean.lerp_(mean.detach(), momentum)
                self.running_var.lerp_(unbiased_var.detach(), momentum)
        out = centred * torch.rsqrt(var + self.eps)[None, :, None, None]
        if self.affine:
            out = out * self.weight[None, :, None, None] + self.bias[None, :, None, None]
        return out


class _ConvStage(nn.Module):
    """3x3 conv (stride 2), masked BN, ReLU; padded positions are set back to zero."""

    def __init__(self, in_channels: int, out_channels: int):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, 3, stride=2, padding=1, bias=False)
        self.norm = MaskedBatchNorm2d(out_channels)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        # Output pixel i sees input pixels 2i-1..2i+1, so it is valid iff input pixel 2i is.
        mask = mask[:, :, ::2, ::2]
        x = F.relu(self.norm(self.conv(x), mask))
        # Re-zero the padding: BN's shift made it non-zero, and the next conv would carry it
        # into valid pixels near the border, making predictions depend on the batch.
        return x * mask, mask


@META_ARCH_REGISTRY.register()
class ImageClassifier(nn.Module):
    """Classify each image of a batch; images may differ in size.

    Input: a list of dicts with ``"image"`` (uint8 or float tensor [3, H, W], RGB, 0-255)
    and, in training, ``"label"`` (int), as produced by ``ClassificationDatasetMapper``.

    The batch is normalised with ``MODEL.PIXEL_MEAN/STD``, zero-padded to a common size
    rounded up to ``MODEL.CLASSIFIER.SIZE_DIVISIBILITY``, and passed through one stage per
    entry of ``MODEL.CLASSIFIER.CHANNELS`` (conv stride 2, BN, ReLU). A mask of valid
    pixels follows the features: padding is zeroed after every stage, batch-norm
    statistics and the global average pool count valid pixels only. In eval mode an
    image's logits therefore do not depend on what else is in its batch.

    Output: ``{"loss_cls": cross-entropy}`` in training mode, logits [N, NUM_CLASSES] in
    eval mode. It does not resize images (the mapper does) or post-process predictions.
    """

    def __init__(self, cfg: CfgNode):
        """Build the network from ``cfg.MODEL``.

        Raises:
            ValueError: For an empty channel list, a non-positive class count or size
                divisibility, or a pixel mean/std that is not 3 values (std > 0).
        """
        super().__init__()
        channels = [int(c) for c in cfg.MODEL.CLASSIFIER.CHANNELS]
        num_classes = int(cfg.MODEL.NUM_CLASSES)
        self.size_divisibility = int(cfg.MODEL.CLASSIFIER.SIZE_DIVISIBILITY)
        if not channels or min(channels) < 1:
            raise ValueError(f"MODEL.CLASSIFIER.CHANNELS must be positive ints, got {channels}")
        if num_classes < 1:
            raise ValueError(f"MODEL.NUM_CLASSES must be >= 1, got {num_classes}")
        if self.size_divisibility < 1:
            raise ValueError(
                f"MODEL.CLASSIFIER.SIZE_DIVISIBILITY must be >= 1, got {self.size_divisibility}"
            )
        mean, std = list(cfg.MODEL.PIXEL_MEAN), list(cfg.MODEL.PIXEL_STD)
        if len(mean) != 3 or len(std) != 3 or min(std) <= 0:
            raise ValueError(
                f"MODEL.PIXEL_MEAN and MODEL.PIXEL_STD must be 3 values each (RGB, std > 0), "
                f"got {mean} and {std}"
            )
        # Not persistent: they come from the config, so checkpoints need not carry them.
        self.register_buffer("pixel_mean", torch.tensor(mean).view(3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(std).view(3, 1, 1), persistent=False)
        in_channels = [3, *channels[:-1]]
        self.stages = nn.ModuleList(_ConvStage(i, o) for i, o in zip(in_channels, channels))
        self.head = nn.Linear(channels[-1], num_classes)

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters."""
        return self.pixel_mean.device

    def preprocess_image(
        self, batched_inputs: list[dict[str, Any]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Normalise and zero-pad the images into one batch.

        Returns:
            Images [N, 3, H, W] (float, normalised, zero padding) and a mask [N, 1, H, W]
            that is 1 on real pixels and 0 on padding. H and W are the largest height and
            width in the batch rounded up to ``size_divisibility``.
        """
        if len(batched_inputs) == 0:
            raise ValueError("ImageClassifier got an empty batch")
        images = [x["image"].to(self.device, non_blocking=True) for x in batched_inputs]
        height = max(image.shape[-2] for image in images)
        width = max(image.shape[-1] for image in images)
        height = math.ceil(height / self.size_divisibility) * self.size_divisibility
        width = math.ceil(width / self.size_divisibility) * self.size_divisibility
        batch = images[0].new_zeros((len(images), 3, height, width), dtype=torch.float32)
        mask = batch.new_zeros((len(images), 1, height, width))
        for i, image in enumerate(images):
            h, w = image.shape[-2:]
            batch[i, :, :h, :w] = (image.float() - self.pixel_mean) / self.pixel_std
            mask[i, :, :h, :w] = 1.0
        return batch, mask

    def forward(
        self, batched_inputs: list[dict[str, Any]]
    ) -> dict[str, torch.Tensor] | torch.Tensor:
        """Return ``{"loss_cls": ...}`` in training mode, logits [N, C] in eval mode.

        Raises:
            KeyError: In training mode, if an input has no ``"label"``.
        """
        x, mask = self.preprocess_image(batched_inputs)
        for stage in self.stages:
            x, mask = stage(x, mask)
        # Masked global average pool: padding (already zero) must not count in the mean.
        pooled = x.sum(dim=(2, 3)) / mask.sum(dim=(2, 3)).clamp(min=1.0)
        logits = self.head(pooled)
        if not self.training:
            return logits
        try:
            labels = [int(inp["label"]) for inp in batched_inputs]
        except KeyError:
            raise KeyError(
                "ImageClassifier in training mode needs a 'label' in every input dict; use a "
                "mapper that keeps it (ClassificationDatasetMapper) or call model.eval()."
            ) from None
        targets = torch.as_tensor(labels, device=logits.device)
        return {"loss_cls": F.cross_entropy(logits, targets)}
