"""``Backbone``: the interface of a network that turns images into named feature maps."""

from __future__ import annotations

from abc import ABCMeta, abstractmethod
from typing import Any

import torch
from torch import nn

from trainkit.layers import ShapeSpec

__all__ = ["Backbone"]


class Backbone(nn.Module, metaclass=ABCMeta):
    """Abstract base of backbones: ``forward`` returns ``{feature name: tensor}``.

    A subclass implements ``forward`` and either overrides :meth:`output_shape` or sets
    ``_out_features`` (names), ``_out_feature_channels`` and ``_out_feature_strides``
    (name -> int), from which the default :meth:`output_shape` is made.
    """

    @abstractmethod
    def forward(self, *args: Any, **kwargs: Any) -> dict[str, torch.Tensor]:
        """Return the feature maps by name (e.g. ``{"res4": tensor}``)."""

    @property
    def size_divisibility(self) -> int:
        """What the input height and width must be a multiple of (0: anything)."""
        return 0

    @property
    def padding_constraints(self) -> dict[str, int]:
        """Extra padding rules for ``ImageList.from_tensors`` (``square_size``, ...); none here."""
        return {}

    def output_shape(self) -> dict[str, ShapeSpec]:
        """Return the channels and stride of each output feature map, by name."""
        channels, strides = self._out_feature_channels, self._out_feature_strides
        return {n: ShapeSpec(channels=channels[n], stride=strides[n]) for n in self._out_features}
