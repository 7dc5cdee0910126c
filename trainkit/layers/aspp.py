"""``ASPP``: atrous spatial pyramid pooling, the context module of DeepLab heads."""

from __future__ import annotations

import copy
from collections.abc import Callable, Sequence

import fvcore.nn.weight_init as weight_init
import torch
from torch import nn
from torch.nn import functional as F

from trainkit.layers.batch_norm import NormSpec, get_norm
from trainkit.layers.blocks import DepthwiseSeparableConv2d
from trainkit.layers.wrappers import Conv2d
from trainkit.utils.errors import UsageError

__all__ = ["ASPP"]


class ASPP(nn.Module):
    """Five parallel branches over one feature map, concatenated and projected.

    The branches are a 1x1 convolution, three 3x3 convolutions dilated by ``dilations`` and
    an image-pooling branch (average pool, 1x1 convolution, resized back). A 1x1 projection
    maps the ``5 * out_channels`` concatenation to ``out_channels``; dropout follows.
    """

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        dilations: Sequence[int],
        *,
        norm: NormSpec,
        activation: Callable[[torch.Tensor], torch.Tensor],
        pool_kernel_size: Sequence[int] | None = None,
        dropout: float = 0.0,
        use_depthwise_separable_conv: bool = False,
    ) -> None:
        """Build the five branches and the projection.

        Args:
            in_channels: channels of the input feature map.
            out_channels: channels of every branch and of the output.
            dilations: exactly three dilation rates for the 3x3 branches.
            norm: normalisation of every convolution but the pooling branch's (a 1x1 map has
                no statistics to normalise); see :func:`get_norm`. ``""`` gives biases instead.
            activation: applied after every convolution; each branch gets its own copy.
            pool_kernel_size: ``(kh, kw)`` of the pooling branch's average pool; ``None`` pools
                globally. Set it to the training feature size so that inference on larger
                inputs pools over the same window.
            dropout: dropout rate on the output (training only).
            use_depthwise_separable_conv: make the dilated branches depthwise separable.

        Raises:
            UsageError: If ``dilations`` does not have three entries.
        """
        super().__init__()
        if len(dilations) != 3:
            raise UsageError(f"ASPP takes exactly 3 dilations, got {list(dilations)}.")
        self.pool_kernel_size = pool_kernel_size
        self.dropout = dropout
        use_bias = norm == ""

        def conv(in_ch: int, k: int = 1, **kwargs: int) -> Conv2d:
            layer = Conv2d(
                in_ch,
                out_channels,
                kernel_size=k,
                bias=use_bias,
                norm=get_norm(norm, out_channels),
                activation=copy.deepcopy(activation),
                **kwargs,
            )
            weight_init.c2_xavier_fill(layer)
            return layer

        self.convs = nn.ModuleList([conv(in_channels)])
        for dilation in dilations:
            if use_depthwise_separable_conv:
                self.convs.append(
                    DepthwiseSeparableConv2d(
                        in_channels,
                        out_channels,
                        kernel_size=3,
                        padding=dilation,
                        dilation=dilation,
                        norm1=norm,
                        activation1=copy.deepcopy(activation),
                        norm2=norm,
                        activation2=copy.deepcopy(activation),
                    )
                )
            else:
                self.convs.append(conv(in_channels, 3, padding=dilation, dilation=dilation))
        pool: nn.Module
        if pool_kernel_size is None:
            pool = nn.AdaptiveAvgPool2d(1)
        else:
            pool = nn.AvgPool2d(kernel_size=tuple(pool_kernel_size), stride=1)
        pool_conv = Conv2d(
            in_channels, out_channels, 1, bias=True, activation=copy.deepcopy(activation)
        )
        weight_init.c2_xavier_fill(pool_conv)
        self.convs.append(nn.Sequential(pool, pool_conv))
        self.project = conv(5 * out_channels)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return the ASPP features of ``x`` (N, out_channels, H, W).

        Raises:
            UsageError: If ``pool_kernel_size`` does not divide the input's height and width.
        """
        size = x.shape[-2:]
        if self.pool_kernel_size is not None and (
            size[0] % self.pool_kernel_size[0] or size[1] % self.pool_kernel_size[1]
        ):
            raise UsageError(
                f"ASPP's pool_kernel_size {tuple(self.pool_kernel_size)} does not divide the "
                f"input size {tuple(size)}; feed inputs of a multiple of it (e.g. a fixed "
                "training crop) or build ASPP with pool_kernel_size=None."
            )
        branches = [branch(x) for branch in self.convs]
        branches[-1] = F.interpolate(branches[-1], size=size, mode="bilinear", align_corners=False)
        out = self.project(torch.cat(branches, dim=1))
        if self.dropout > 0:
            out = F.dropout(out, self.dropout, training=self.training)
        return out
