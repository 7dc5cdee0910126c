"""``ImageList``: images of different sizes padded into one batch tensor, with their sizes."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch.nn import functional as F

__all__ = ["ImageList"]


class ImageList:
    """A batch of images padded to a common size, and the size of each before padding.

    Attributes:
        tensor: ``(N, H, W)`` or ``(N, C_1, ..., C_K, H, W)``; each image at the top left,
            the rest padding.
        image_sizes: the ``(h, w)`` of each image, at most ``(H, W)``.
    """

    def __init__(self, tensor: torch.Tensor, image_sizes: list[tuple[int, int]]) -> None:
        """Wrap an already padded batch ``tensor`` and the unpadded ``image_sizes``."""
        self.tensor = tensor
        self.image_sizes = image_sizes

    def __len__(self) -> int:
        return len(self.image_sizes)

    def __getitem__(self, idx: int) -> torch.Tensor:
        """Return image ``idx`` without its padding: ``(h, w)`` or ``(C_1, ..., C_K, h, w)``."""
        height, width = self.image_sizes[idx]
        return self.tensor[idx, ..., :height, :width]

    def to(self, *args: Any, **kwargs: Any) -> ImageList:
        """Return an ``ImageList`` whose tensor is ``self.tensor.to(*args, **kwargs)``."""
        return ImageList(self.tensor.to(*args, **kwargs), self.image_sizes)

    @property
    def device(self) -> torch.device:
        """The device of :attr:`tensor`."""
        return self.tensor.device

    @staticmethod
    def from_tensors(
        tensors: Sequence[torch.Tensor],
        size_divisibility: int = 0,
        pad_value: float = 0.0,
        padding_constraints: Mapping[str, int] | None = None,
    ) -> ImageList:
        """Pad ``tensors`` to their largest height and width and stack them.

        Args:
            tensors: images of shape ``(h_i, w_i)`` or ``(C_1, ..., C_K, h_i, w_i)``; all
                dimensions but the last two must agree.
            size_divisibility: if > 1, round the padded height and width up to a multiple
                of it (a backbone's stride, e.g. 32).
            pad_value: the value of the padding.
            padding_constraints: a backbone's ``padding_constraints``:
                ``"square_size"`` > 0 pads to that square; ``"size_divisibility"`` replaces
                the argument of that name.

        Returns:
            The batch, of shape ``(N, ..., H, W)``.

        Raises:
            ValueError: If ``tensors`` is empty, not a list/tuple of tensors, or their
                leading dimensions differ.
        """
        if not isinstance(tensors, (list, tuple)) or not tensors:
            raise ValueError(
                f"ImageList.from_tensors needs a non-empty list of tensors, got {tensors!r:.80}"
            )
        lead = tensors[0].shape[:-2]
        for t in tensors:
            if not isinstance(t, torch.Tensor) or t.shape[:-2] != lead:
                what = tuple(t.shape) if isinstance(t, torch.Tensor) else type(t).__name__
                raise ValueError(
                    f"ImageList.from_tensors: every image must be a tensor of shape "
                    f"({', '.join(map(str, lead))}{', ' if lead else ''}H, W); got {what}."
                )
        image_sizes = [(int(t.shape[-2]), int(t.shape[-1])) for t in tensors]
        max_h, max_w = (max(sides) for sides in zip(*image_sizes))
        if padding_constraints:
            square_size = int(padding_constraints.get("square_size", 0))
            if square_size > 0:
                max_h = max_w = square_size
            size_divisibility = int(padding_constraints.get("size_divisibility", size_divisibility))
        if size_divisibility > 1:
            max_h = -(-max_h // size_divisibility) * size_divisibility
            max_w = -(-max_w // size_divisibility) * size_divisibility
        if len(tensors) == 1:
            # One image: F.pad makes the padded copy in one call (no fill then copy).
            height, width = image_sizes[0]
            padded = F.pad(tensors[0], [0, max_w - width, 0, max_h - height], value=pad_value)
            batch = padded.unsqueeze(0)
        else:
            batch = tensors[0].new_full((len(tensors), *lead, max_h, max_w), pad_value)
            for image, slot in zip(tensors, batch):
                slot[..., : image.shape[-2], : image.shape[-1]].copy_(image)
        return ImageList(batch.contiguous(), image_sizes)
