"""``ShapeSpec``: what a backbone or head knows of a tensor's shape (channels, size, stride)."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ShapeSpec"]


@dataclass
class ShapeSpec:
    """The known parts of a feature map's shape; any of them may be unknown (``None``).

    Attributes:
        channels: number of channels.
        height: height in pixels of the feature map.
        width: width in pixels of the feature map.
        stride: input pixels per feature-map pixel.
    """

    channels: int | None = None
    height: int | None = None
    width: int | None = None
    stride: int | None = None
