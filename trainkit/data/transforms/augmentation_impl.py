"""The built-in augmentations, with detectron2's names and arguments.

Resizing, flipping, rotating and extents are here; the crops live in ``_crop.py`` and the
colour changes in ``_color.py``, and every one is importable from this module as in
detectron2. Each draws its random numbers from
:func:`~trainkit.data.mapping.record_mapper.augmentation_rng` (keyed by the sample inside a loader).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from fvcore.transforms.transform import HFlipTransform, NoOpTransform, Transform, VFlipTransform

from trainkit.data.mapping.record_mapper import augmentation_rng
from trainkit.data.transforms._color import (
    RandomBrightness,
    RandomContrast,
    RandomLighting,
    RandomSaturation,
)
from trainkit.data.transforms._crop import (
    FixedSizeCrop,
    MinIoURandomCrop,
    RandomCrop,
    RandomCrop_CategoryAreaConstraint,
)
from trainkit.data.transforms.augmentation import Augmentation, _as_augmentation
from trainkit.data.transforms.transform import (
    ExtentTransform,
    ResizeTransform,
    RotationTransform,
)

__all__ = [
    "FixedSizeCrop",
    "MinIoURandomCrop",
    "RandomApply",
    "RandomBrightness",
    "RandomContrast",
    "RandomCrop",
    "RandomCrop_CategoryAreaConstraint",
    "RandomExtent",
    "RandomFlip",
    "RandomLighting",
    "RandomResize",
    "RandomRotation",
    "RandomSaturation",
    "Resize",
    "ResizeScale",
    "ResizeShortestEdge",
]

_BILINEAR = 2  # PIL's Image.Resampling.BILINEAR (PIL is imported only to resample)
_SAMPLE_STYLES = ("range", "choice")


def _check_sample_style(sample_style: str) -> None:
    if sample_style not in _SAMPLE_STYLES:
        raise ValueError(f"sample_style must be 'range' or 'choice', got {sample_style!r}")


class RandomApply(Augmentation):
    """Apply an augmentation (or a transform) with probability ``prob``, else nothing."""

    def __init__(self, tfm_or_aug: Augmentation | Transform, prob: float = 0.5):
        """Args: the augmentation or transform; ``prob`` in [0, 1].

        Raises:
            ValueError: If ``prob`` is outside [0, 1].
        """
        super().__init__()
        if not 0.0 <= prob <= 1.0:
            raise ValueError(f"RandomApply's prob must be in [0, 1], got {prob}")
        self.aug = _as_augmentation(tfm_or_aug)
        self.prob = prob

    def get_transform(self, *args: Any) -> Transform:
        if self._rand_range() < self.prob:
            return self.aug.get_transform(*args)
        return NoOpTransform()

    def __call__(self, aug_input: Any) -> Transform:
        # The wrapped augmentation reads its own fields, so it is called, not asked.
        if self._rand_range() < self.prob:
            return self.aug(aug_input)
        return NoOpTransform()


class RandomFlip(Augmentation):
    """Flip horizontally (or vertically) with probability ``prob``."""

    def __init__(self, prob: float = 0.5, *, horizontal: bool = True, vertical: bool = False):
        """Args: ``prob``; exactly one of ``horizontal`` / ``vertical``.

        Raises:
            ValueError: If both or neither direction is chosen.
        """
        super().__init__()
        if horizontal == vertical:
            raise ValueError(
                "RandomFlip flips one way: set exactly one of horizontal/vertical "
                "(use two RandomFlip for both)"
            )
        self._init(locals())

    def get_transform(self, image: np.ndarray) -> Transform:
        h, w = image.shape[:2]
        if self._rand_range() >= self.prob:
            return NoOpTransform()
        return HFlipTransform(w) if self.horizontal else VFlipTransform(h)


class Resize(Augmentation):
    """Resize to a fixed ``(h, w)`` (or ``shape x shape``)."""

    def __init__(self, shape: int | Sequence[int], interp: int = _BILINEAR):
        """Args: ``shape`` ``(h, w)`` or one int; ``interp`` a PIL filter."""
        shape = (shape, shape) if isinstance(shape, int) else tuple(shape)
        self._init(locals())

    def get_transform(self, image: np.ndarray) -> Transform:
        h, w = image.shape[:2]
        return ResizeTransform(h, w, self.shape[0], self.shape[1], self.interp)


class ResizeShortestEdge(Augmentation):
    """Scale the shorter side to a drawn length, the longer one capped at ``max_size``.

    A drawn length of 0 leaves the image as it is (``INPUT.MIN_SIZE_TEST 0``).
    :meth:`get_output_shape` can be used in TorchScript (``torch.jit.script``), as in
    detectron2, for models that resize their own input.
    """

    @torch.jit.unused
    def __init__(
        self,
        short_edge_length: int | Sequence[int],
        max_size: int = sys.maxsize,
        sample_style: str = "range",
        interp: int = _BILINEAR,
    ):
        """Set how the short edge's length is drawn.

        Args:
            short_edge_length: ``[min, max]`` to draw from uniformly (``"range"``), or the
                lengths to choose among (``"choice"``); one int for a fixed length.
            max_size: the cap on the longer side after resizing.
            sample_style: ``"range"`` or ``"choice"``.
            interp: a PIL filter.

        Raises:
            ValueError: For an unknown style, or a range that is not two values.
        """
        super().__init__()
        _check_sample_style(sample_style)
        self.is_range = sample_style == "range"
        if isinstance(short_edge_length, int):
            short_edge_length = (short_edge_length, short_edge_length)
        if self.is_range and len(short_edge_length) != 2:
            raise ValueError(
                "ResizeShortestEdge with sample_style 'range' takes [min, max], got "
                f"{list(short_edge_length)}; use sample_style 'choice' for a list of sizes"
            )
        self._init(locals())

    @torch.jit.unused
    def get_transform(self, image: np.ndarray) -> Any:  # Any: TorchScript cannot type Transform
        h, w = image.shape[:2]
        lengths = self.short_edge_length
        if self.is_range and lengths[0] != lengths[1]:
            size = int(augmentation_rng().integers(lengths[0], lengths[1] + 1))
        elif not self.is_range and len(lengths) > 1:
            # An int index: a config's sequence (omegaconf's) refuses numpy integers.
            size = int(lengths[int(augmentation_rng().integers(len(lengths)))])
        else:  # one possible length (the test-time resize): nothing to draw
            size = int(lengths[0])
        if size == 0:
            return NoOpTransform()
        new_h, new_w = self.get_output_shape(h, w, size, self.max_size)
        return ResizeTransform(h, w, new_h, new_w, self.interp)

    @staticmethod
    def get_output_shape(
        oldh: int, oldw: int, short_edge_length: int, max_size: int
    ) -> tuple[int, int]:
        """Return ``(new_h, new_w)``: shorter side ``short_edge_length``, longer <= ``max_size``."""
        scale = short_edge_length / min(oldh, oldw)
        if oldh < oldw:
            new_h, new_w = float(short_edge_length), oldw * scale
        else:
            new_h, new_w = oldh * scale, float(short_edge_length)
        longest = max(new_h, new_w)
        if longest > max_size:
            new_h, new_w = new_h * max_size / longest, new_w * max_size / longest
        # Round half up, so that sizes match detectron2's to the pixel.
        return int(new_h + 0.5), int(new_w + 0.5)


class ResizeScale(Augmentation):
    """Fit the image inside ``(target_height, target_width)`` times a drawn scale.

    The scale is uniform in ``[min_scale, max_scale]``; the aspect ratio is kept (the
    resize half of "resize and crop" large-scale jitter; follow with :class:`FixedSizeCrop`).
    """

    def __init__(
        self,
        min_scale: float,
        max_scale: float,
        target_height: int,
        target_width: int,
        interp: int = _BILINEAR,
    ):
        """Args: the scale range; the target box; a PIL filter."""
        super().__init__()
        self._init(locals())

    def _get_resize(self, image: np.ndarray, scale: float) -> Transform:
        h, w = image.shape[:2]
        factor = min(self.target_height * scale / h, self.target_width * scale / w)
        new_h, new_w = (int(v) for v in np.round(np.multiply((h, w), factor)))
        return ResizeTransform(h, w, new_h, new_w, self.interp)

    def get_transform(self, image: np.ndarray) -> Transform:
        return self._get_resize(image, augmentation_rng().uniform(self.min_scale, self.max_scale))


class RandomResize(Augmentation):
    """Resize to one ``(h, w)`` of ``shape_list``, chosen uniformly."""

    def __init__(self, shape_list: Sequence[Sequence[int]], interp: int = _BILINEAR):
        """Args: the ``(h, w)`` sizes to choose among; a PIL filter."""
        self.shape_list = shape_list
        self._init(locals())

    def get_transform(self, image: np.ndarray) -> Transform:
        new_h, new_w = self.shape_list[int(augmentation_rng().integers(len(self.shape_list)))]
        return ResizeTransform(image.shape[0], image.shape[1], new_h, new_w, self.interp)


class RandomRotation(Augmentation):
    """Rotate counter-clockwise by a drawn angle (degrees), about an optional drawn centre."""

    def __init__(
        self,
        angle: float | Sequence[float],
        expand: bool = True,
        center: Sequence[Any] | None = None,
        sample_style: str = "range",
        interp: int | None = None,
    ):
        """Set how the angle and the centre are drawn.

        Args:
            angle: ``[min, max]`` degrees (``"range"``) or the angles to choose among.
            expand: enlarge the output to hold the whole rotated image.
            center: relative ``[[min_x, min_y], [max_x, max_y]]`` (``"range"``) or
                ``[x, y]`` pairs to choose among, ``[0, 0]`` the top-left corner and
                ``[1, 1]`` the bottom-right; ``None`` is the image centre. With ``expand``
                it only shifts the result.
            sample_style: ``"range"`` or ``"choice"``.
            interp: a PIL filter (default bilinear).
        """
        super().__init__()
        _check_sample_style(sample_style)
        self.is_range = sample_style == "range"
        if isinstance(angle, (float, int)):
            angle = (angle, angle)
        if center is not None and isinstance(center[0], (float, int)):
            center = (center, center)
        self._init(locals())

    def get_transform(self, image: np.ndarray) -> Transform:
        h, w = image.shape[:2]
        rng = augmentation_rng()
        center = None
        if self.is_range:
            angle = rng.uniform(self.angle[0], self.angle[1])
            if self.center is not None:
                (x0, y0), (x1, y1) = self.center
                center = (rng.uniform(x0, x1), rng.uniform(y0, y1))
        else:
            angle = self.angle[int(rng.integers(len(self.angle)))]
            if self.center is not None:
                center = tuple(self.center[int(rng.integers(len(self.center)))])
        if center is not None:
            center = (w * center[0], h * center[1])  # relative -> pixels
        if angle % 360 == 0:
            return NoOpTransform()
        return RotationTransform(h, w, angle, expand=self.expand, center=center, interp=self.interp)


class RandomExtent(Augmentation):
    """Crop a randomly scaled and shifted rectangle, which may reach outside (filled with 0)."""

    def __init__(self, scale_range: Sequence[float], shift_range: Sequence[float]):
        """Set how the rectangle is drawn.

        Args:
            scale_range: ``(low, high)`` of the rectangle's size relative to the image.
            shift_range: ``(x, y)``: the rectangle's centre moves by up to ``x * w / 2``
                and ``y * h / 2`` either way; 0 keeps it centred.
        """
        super().__init__()
        self._init(locals())

    def get_transform(self, image: np.ndarray) -> Transform:
        h, w = image.shape[:2]
        rng = augmentation_rng()
        # The rectangle about the origin, scaled, shifted, then moved to the image's centre.
        rect = np.array([-0.5 * w, -0.5 * h, 0.5 * w, 0.5 * h])
        rect *= rng.uniform(self.scale_range[0], self.scale_range[1])
        rect[0::2] += self.shift_range[0] * w * (rng.random() - 0.5) + 0.5 * w
        rect[1::2] += self.shift_range[1] * h * (rng.random() - 0.5) + 0.5 * h
        x0, y0, x1, y1 = (float(v) for v in rect)
        return ExtentTransform(src_rect=(x0, y0, x1, y1), output_size=(int(y1 - y0), int(x1 - x0)))
