"""Random crops (exported by ``augmentation_impl``): plain, size-fixed, label- and box-aware."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
from fvcore.transforms.transform import (
    CropTransform,
    NoOpTransform,
    PadTransform,
    Transform,
    TransformList,
)

from trainkit.data.mapping.record_mapper import augmentation_rng
from trainkit.data.transforms.augmentation import Augmentation

__all__ = ["FixedSizeCrop", "MinIoURandomCrop", "RandomCrop", "RandomCrop_CategoryAreaConstraint"]

_CROP_TYPES = ("relative_range", "relative", "absolute", "absolute_range")


class RandomCrop(Augmentation):
    """Crop a rectangle at a random place; its size is set by ``crop_type`` and ``crop_size``.

    - ``"relative"``: ``(H * crop_size[0], W * crop_size[1])``, fractions in (0, 1];
    - ``"relative_range"``: as relative, with each fraction drawn from ``[crop_size[i], 1]``;
    - ``"absolute"``: ``crop_size`` pixels ``(h, w)``, clipped to the image;
    - ``"absolute_range"``: height and width each drawn from ``[crop_size[0], crop_size[1]]``
      pixels, clipped to the image.
    """

    def __init__(self, crop_type: str, crop_size: Sequence[float]):
        """Args: the crop type (above) and its two numbers.

        Raises:
            ValueError: For an unknown ``crop_type`` (e.g. ``INPUT.CROP.TYPE``).
        """
        super().__init__()
        if crop_type not in _CROP_TYPES:
            raise ValueError(
                f"unknown crop type {crop_type!r} (INPUT.CROP.TYPE); choose one of "
                f"{', '.join(_CROP_TYPES)}"
            )
        self._init(locals())

    def get_transform(self, image: np.ndarray) -> Transform:
        h, w = image.shape[:2]
        crop_h, crop_w = self.get_crop_size((h, w))
        rng = augmentation_rng()
        y0 = int(rng.integers(h - crop_h + 1))
        x0 = int(rng.integers(w - crop_w + 1))
        return CropTransform(x0, y0, crop_w, crop_h)

    def get_crop_size(self, image_size: tuple[int, int]) -> tuple[int, int]:
        """Return the crop's ``(height, width)`` in pixels for an image of ``image_size``."""
        h, w = image_size
        if self.crop_type == "relative":
            ch, cw = self.crop_size
            return int(h * ch + 0.5), int(w * cw + 0.5)
        if self.crop_type == "relative_range":
            low = np.asarray(self.crop_size, dtype=np.float32)
            ch, cw = low + augmentation_rng().random(2) * (1 - low)
            return int(h * ch + 0.5), int(w * cw + 0.5)
        if self.crop_type == "absolute":
            return min(self.crop_size[0], h), min(self.crop_size[1], w)
        low, high = self.crop_size
        if low > high:
            raise ValueError(
                f"absolute_range crop size must be [min, max], got {list(self.crop_size)}"
            )
        rng = augmentation_rng()
        ch = int(rng.integers(min(h, low), min(h, high) + 1))
        cw = int(rng.integers(min(w, low), min(w, high) + 1))
        return ch, cw


class RandomCrop_CategoryAreaConstraint(Augmentation):  # noqa: N801 (detectron2's name)
    """A :class:`RandomCrop` in which no label covers more than ``single_category_max_area``.

    Up to 10 crops are drawn; the first where no single label (``ignored_category``
    excepted) exceeds that share of the crop's pixels, and at least two labels appear,
    is used, else the last one drawn.
    """

    def __init__(
        self,
        crop_type: str,
        crop_size: Sequence[float],
        single_category_max_area: float = 1.0,
        ignored_category: int | None = None,
    ):
        """Args: as :class:`RandomCrop`; the largest share of one label (1.0: no limit);
        a label exempt from it (e.g. the ignore label)."""
        self.crop_aug = RandomCrop(crop_type, crop_size)
        self._init(locals())

    def get_transform(self, image: np.ndarray, sem_seg: np.ndarray) -> Transform:
        if self.single_category_max_area >= 1.0:
            return self.crop_aug.get_transform(image)
        h, w = sem_seg.shape
        rng = augmentation_rng()
        for _ in range(10):
            crop_h, crop_w = self.crop_aug.get_crop_size((h, w))
            y0 = int(rng.integers(h - crop_h + 1))
            x0 = int(rng.integers(w - crop_w + 1))
            labels, counts = np.unique(
                sem_seg[y0 : y0 + crop_h, x0 : x0 + crop_w], return_counts=True
            )
            if self.ignored_category is not None:
                counts = counts[labels != self.ignored_category]
            if len(counts) > 1 and counts.max() < counts.sum() * self.single_category_max_area:
                break
        return CropTransform(x0, y0, crop_w, crop_h)


class FixedSizeCrop(Augmentation):
    """Crop a random ``crop_size`` window; pad the right and bottom where the image is smaller.

    Padding uses ``pad_value`` for the image and ``seg_pad_value`` for label maps; with
    ``pad=False`` a smaller image stays smaller.
    """

    def __init__(
        self,
        crop_size: tuple[int, int],
        pad: bool = True,
        pad_value: float = 128.0,
        seg_pad_value: int = 255,
    ):
        """Args: the output ``(height, width)``; whether to pad; the two padding values."""
        super().__init__()
        self._init(locals())

    def _get_crop(self, image: np.ndarray) -> Transform:
        h, w = image.shape[:2]
        max_offset = np.maximum(np.subtract((h, w), self.crop_size), 0)
        # One draw places the window along both axes (detectron2's convention).
        y0, x0 = (int(v) for v in np.round(max_offset * augmentation_rng().uniform(0.0, 1.0)))
        return CropTransform(x0, y0, self.crop_size[1], self.crop_size[0], w, h)

    def _get_pad(self, image: np.ndarray) -> Transform:
        h, w = image.shape[:2]
        pad_h, pad_w = (int(v) for v in np.maximum(np.subtract(self.crop_size, (h, w)), 0))
        kept_h, kept_w = min(h, self.crop_size[0]), min(w, self.crop_size[1])
        return PadTransform(0, 0, pad_w, pad_h, kept_w, kept_h, self.pad_value, self.seg_pad_value)

    def get_transform(self, image: np.ndarray) -> TransformList:
        transforms = [self._get_crop(image)]
        if self.pad:
            transforms.append(self._get_pad(image))
        return TransformList(transforms)


def _iou(box: np.ndarray, boxes: np.ndarray) -> np.ndarray:
    """IoU of one XYXY box with each of ``boxes`` (Nx4)."""
    x0 = np.maximum(box[0], boxes[:, 0])
    y0 = np.maximum(box[1], boxes[:, 1])
    x1 = np.minimum(box[2], boxes[:, 2])
    y1 = np.minimum(box[3], boxes[:, 3])
    inter = np.clip(x1 - x0, 0, None) * np.clip(y1 - y0, 0, None)
    area = (box[2] - box[0]) * (box[3] - box[1])
    areas = (boxes[:, 2] - boxes[:, 0]) * (boxes[:, 3] - boxes[:, 1])
    return inter / np.maximum(area + areas - inter, 1e-12)


class MinIoURandomCrop(Augmentation):
    """Crop so that every box overlaps the crop by at least a drawn IoU (the SSD crop).

    A mode is drawn from ``(1, *min_ious, 0)``: 1 keeps the image; otherwise up to
    ``crop_trials`` windows (each side at least ``min_crop_size`` of the image's, aspect
    between 1:2 and 2:1) are tried for one whose IoU with every box is at least the mode
    and that contains the centre of at least one box. Without boxes nothing is cropped.
    """

    def __init__(
        self,
        min_ious: Sequence[float] = (0.1, 0.3, 0.5, 0.7, 0.9),
        min_crop_size: float = 0.3,
        mode_trials: int = 1000,
        crop_trials: int = 50,
    ):
        """Args: the IoU thresholds to draw from; the smallest relative side; the number of
        modes and of windows per mode to try."""
        super().__init__()
        self.min_ious = min_ious
        self.sample_mode = (1, *min_ious, 0)
        self.min_crop_size = min_crop_size
        self.mode_trials = mode_trials
        self.crop_trials = crop_trials

    def get_transform(self, image: np.ndarray, boxes: Any) -> Transform:
        if boxes is None or len(boxes) == 0:
            return NoOpTransform()
        boxes = np.asarray(boxes, dtype=np.float64)
        h, w = image.shape[:2]
        centers = (boxes[:, :2] + boxes[:, 2:]) / 2
        rng = augmentation_rng()
        for _ in range(self.mode_trials):
            mode = self.sample_mode[int(rng.integers(len(self.sample_mode)))]
            if mode == 1:
                return NoOpTransform()
            for _ in range(self.crop_trials):
                new_w = rng.uniform(self.min_crop_size * w, w)
                new_h = rng.uniform(self.min_crop_size * h, h)
                if not 0.5 <= new_h / new_w <= 2:
                    continue
                left, top = rng.uniform(0, w - new_w), rng.uniform(0, h - new_h)
                patch = np.array([left, top, left + new_w, top + new_h]).astype(int)
                if patch[2] == patch[0] or patch[3] == patch[1]:
                    continue
                if _iou(patch, boxes).min() < mode:
                    continue
                inside = (
                    (centers[:, 0] > patch[0])
                    & (centers[:, 1] > patch[1])
                    & (centers[:, 0] < patch[2])
                    & (centers[:, 1] < patch[3])
                )
                if inside.any():
                    x0, y0, x1, y1 = (int(v) for v in patch)
                    return CropTransform(x0, y0, x1 - x0, y1 - y0)
        return NoOpTransform()
