"""Convolutions over zero-padded batches that keep the padding exactly zero.

The conv layers the built-in classifiers share: ``ImageClassifier``'s stages and
``ViTClassifier``'s convolutional stem (``MODEL.VIT.STEM_CHANNELS``). They take the mask of
:func:`~trainkit.modeling.image_batch.pad_images` (1 on real pixels) and carry it down with
the resolution: batch-norm statistics count only real pixels and padded positions are set
back to zero after every conv, so in eval mode an image's features do not depend on the
images it is batched with.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["MaskedBatchNorm2d", "MaskedConvStage"]


class MaskedBatchNorm2d(nn.BatchNorm2d):
    """``BatchNorm2d`` whose training statistics count only valid (unpadded) pixels.

    In eval mode it is a plain ``BatchNorm2d`` (running statistics). In training mode the
    batch mean and variance are taken over the pixels where ``mask`` is 1, so how much
    padding a batch happens to carry does not shift the statistics, and the running
    statistics describe real image content, which is what eval mode sees.
    """

    def forward(self, x: Tensor, mask: Tensor | None = None) -> Tensor:
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


class MaskedConvStage(nn.Module):
    """``num_convs`` 3x3 convs, each followed by masked BN and ReLU; the first has stride 2.

    Padded positions, which BN's shift makes non-zero, are set back to zero after every conv,
    so the next conv sees exactly the zeros it would see at the border of the image run alone
    (predictions then do not depend on the batch).
    """

    def __init__(self, in_channels: int, out_channels: int, num_convs: int):
        super().__init__()
        inputs = [in_channels] + [out_channels] * (num_convs - 1)
        self.convs = nn.ModuleList(  # bias=False: BN's shift replaces the bias
            nn.Conv2d(c, out_channels, 3, stride=2 if k == 0 else 1, padding=1, bias=False)
            for k, c in enumerate(inputs)
        )
        self.norms = nn.ModuleList(MaskedBatchNorm2d(out_channels) for _ in range(num_convs))

    def forward(self, x: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
        # After the stride-2 conv, output pixel i sees input pixels 2i-1..2i+1, so it is
        # valid iff input pixel 2i is; the stride-1 convs keep the mask as it is.
        mask = mask[:, :, ::2, ::2]
        for conv, norm in zip(self.convs, self.norms):
            x = F.relu(norm(conv(x), mask)) * mask
        return x, mask
