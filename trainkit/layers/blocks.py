"""CNN building blocks: ``CNNBlockBase`` (channels and stride) and ``DepthwiseSeparableConv2d``."""

from __future__ import annotations

from collections.abc import Callable

import fvcore.nn.weight_init as weight_init
import torch
from torch import nn

from trainkit.layers.batch_norm import FrozenBatchNorm2d, NormSpec, get_norm
from trainkit.layers.wrappers import Conv2d

__all__ = ["CNNBlockBase", "DepthwiseSeparableConv2d"]

Activation = Callable[[torch.Tensor], torch.Tensor]


class CNNBlockBase(nn.Module):
    """A block mapping NCHW ``in_channels`` to NCHW ``out_channels`` at ``stride``.

    Subclasses take ``in_channels``, ``out_channels`` and ``stride`` among their ``__init__``
    arguments and keep the three attributes true of what ``forward`` does.
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int) -> None:
        """Record the block's channels and stride.

        Args:
            in_channels: channels of the input.
            out_channels: channels of the output.
            stride: how much smaller the output's height and width are than the input's.
        """
        super().__init__()
        self.in_channels = in_channels
        self.out_channels = out_channels
        self.stride = stride

    def freeze(self) -> CNNBlockBase:
        """Stop training this block: no gradients, and its batch norms frozen in place.

        Returns:
            The block itself.
        """
        for parameter in self.parameters():
            parameter.requires_grad = False
        FrozenBatchNorm2d.convert_frozen_batchnorm(self)
        return self


class DepthwiseSeparableConv2d(nn.Module):
    """A ``kernel_size`` depthwise convolution followed by a 1x1 pointwise convolution.

    Each of the two convolutions has its own optional norm and activation; a convolution
    with a norm has no bias.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int = 3,
        padding: int = 1,
        dilation: int = 1,
        *,
        norm1: NormSpec = None,
        activation1: Activation | None = None,
        norm2: NormSpec = None,
        activation2: Activation | None = None,
    ) -> None:
        """Build the depthwise and the pointwise convolution.

        Args:
            in_channels: input channels (also the depthwise convolution's groups).
            out_channels: output channels of the pointwise convolution.
            kernel_size, padding, dilation: of the depthwise convolution.
            norm1, activation1: after the depthwise convolution (see :func:`get_norm`).
            norm2, activation2: after the pointwise convolution.
        """
        super().__init__()
        self.depthwise = Conv2d(
            in_channels,
            in_channels,
            kernel_size=kernel_size,
            padding=padding,
            dilation=dilation,
            groups=in_channels,
            bias=not norm1,
            norm=get_norm(norm1, in_channels),
            activation=activation1,
        )
        self.pointwise = Conv2d(
            in_channels,
            out_channels,
            kernel_size=1,
            bias=not norm2,
            norm=get_norm(norm2, out_channels),
            activation=activation2,
        )
        weight_init.c2_msra_fill(self.depthwise)
        weight_init.c2_msra_fill(self.pointwise)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Apply the depthwise, then the pointwise convolution."""
        return self.pointwise(self.depthwise(x))
