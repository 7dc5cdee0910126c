"""detectron2's thin wrappers of torch layers: ``Conv2d`` with norm and activation, ``cat``, ..."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn import functional as F

__all__ = [
    "BatchNorm2d",
    "Conv2d",
    "ConvTranspose2d",
    "Linear",
    "cat",
    "interpolate",
    "move_device_like",
    "nonzero_tuple",
    "shapes_to_tensor",
]

# detectron2 once wrapped these to accept empty inputs; torch has done so for years, so they
# are torch's own classes under detectron2's names.
BatchNorm2d = nn.BatchNorm2d
ConvTranspose2d = nn.ConvTranspose2d
Linear = nn.Linear
interpolate = F.interpolate


def cat(tensors: Sequence[torch.Tensor], dim: int = 0) -> torch.Tensor:
    """Concatenate ``tensors`` along ``dim``; a single tensor is returned as is, not copied."""
    if len(tensors) == 1:
        return tensors[0]
    return torch.cat(list(tensors), dim)


def nonzero_tuple(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Return the indices of the non-zero elements of ``x``, one tensor per dimension."""
    return torch.nonzero(x, as_tuple=True)


def move_device_like(src: torch.Tensor, dst: torch.Tensor) -> torch.Tensor:
    """Return ``src`` on the device of ``dst``."""
    return src.to(dst.device)


def shapes_to_tensor(x: Sequence[int], device: torch.device | None = None) -> torch.Tensor:
    """Return the integers ``x`` (a shape) as a 1-D tensor on ``device``."""
    return torch.as_tensor(x, device=device)


class Conv2d(nn.Conv2d):
    """``torch.nn.Conv2d`` followed by an optional normalisation and activation.

    Takes ``nn.Conv2d``'s arguments, plus keyword-only ``norm`` (an ``nn.Module`` applied to
    the convolution's output, e.g. from :func:`trainkit.layers.get_norm`) and ``activation``
    (a callable applied after the norm).
    """

    def __init__(
        self,
        *args: Any,
        norm: nn.Module | None = None,
        activation: Callable[[torch.Tensor], torch.Tensor] | None = None,
        **kwargs: Any,
    ) -> None:
        super().__init__(*args, **kwargs)
        self.norm = norm
        self.activation = activation

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Convolve ``x``, then apply ``norm`` and ``activation`` when set."""
        x = self._conv_forward(x, self.weight, self.bias)
        if self.norm is not None:
            x = self.norm(x)
        if self.activation is not None:
            x = self.activation(x)
        return x
