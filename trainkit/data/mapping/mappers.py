"""Mappers: turn a dataset record into what the model consumes."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from PIL import Image

from trainkit.config import CfgNode, ConfigError
from trainkit.data.catalog import MetadataCatalog
from trainkit.data.mapping.record_mapper import batch_rng, sample_rng

logger = logging.getLogger(__name__)

__all__ = ["ClassificationDatasetMapper"]


class ClassificationDatasetMapper:
    """Read a classification record's image and, for training, augment it.

    Records hold ``file_name``, ``height``, ``width``, ``label`` and ``image_id`` (the
    ``shapes`` datasets' format); the output is ``{"image": uint8 tensor [3, H, W] (RGB,
    augmented), "label", "height", "width" (ints: the original image's, as in the record),
    "file_name", "image_id"}``. Training flips horizontally and rescales at random, from
    ``trainkit.data.sample_rng()`` (with ``scale_per_batch`` the rescale from ``batch_rng()``):
    the result depends only on the loader's seed and the sample's global position. The
    rescale multiplies the factor that caps the longest side at ``max_size_train``; testing
    only caps it at ``max_size_test`` (0: no cap), so training sees test-sized images and a
    CNN on a CPU stays fast. It does not crop, pad or normalise (the model does). An
    unreadable image is logged and ``None`` returned, so another record is tried.
    """

    def __init__(
        self,
        cfg: CfgNode | None = None,
        is_train: bool = True,
        *,
        flip_prob: float | None = None,
        scale_range: Sequence[float] | None = None,
        max_size_train: int | None = None,
        max_size_test: int | None = None,
        scale_per_batch: bool | None = None,
        dataset_names: Sequence[str] | None = None,
    ):
        """Create the mapper from ``cfg`` and/or explicit arguments (which override ``cfg``).

        Args:
            cfg: reads ``INPUT.RANDOM_FLIP_PROB``, ``INPUT.RANDOM_SCALE(_PER_BATCH)`` and
                ``INPUT.MAX_SIZE_TRAIN/TEST``; ``None``: the arguments (or no augmentation, no cap).
            is_train: augment (training) or only cap the size (testing).
            flip_prob: probability of a horizontal flip.
            scale_range: ``[min, max]`` of the uniform rescale factor.
            max_size_train, max_size_test: longest side of a training image (before the
                random rescale) and of a test image, in pixels; 0 for no cap.
            scale_per_batch: one rescale factor per batch instead of per image.
            dataset_names: the datasets it will see (e.g. ``cfg.DATASETS.TRAIN``): with ``cfg``, one
                with more ``thing_classes`` than ``MODEL.NUM_CLASSES`` fails here, not mid-training.

        Raises:
            ConfigError: A ``ValueError``: if a value is out of range, or a dataset has more
                classes than ``MODEL.NUM_CLASSES``; the message names the config key.
            TypeError: If ``dataset_names`` is given without ``cfg``.
        """
        if cfg is not None:
            flip_prob = cfg.INPUT.RANDOM_FLIP_PROB if flip_prob is None else flip_prob
            scale_range = cfg.INPUT.RANDOM_SCALE if scale_range is None else scale_range
            max_size_train = cfg.INPUT.MAX_SIZE_TRAIN if max_size_train is None else max_size_train
            max_size_test = cfg.INPUT.MAX_SIZE_TEST if max_size_test is None else max_size_test
            if scale_per_batch is None:
                scale_per_batch = cfg.INPUT.RANDOM_SCALE_PER_BATCH
        self.is_train = is_train
        self.flip_prob = 0.0 if flip_prob is None else float(flip_prob)
        self.scale_range = tuple(float(s) for s in (scale_range or (1.0, 1.0)))
        self.max_size_train = 0 if max_size_train is None else int(max_size_train)
        self.max_size_test = 0 if max_size_test is None else int(max_size_test)
        self.scale_per_batch = bool(scale_per_batch)
        self._check_ranges()
        if dataset_names is not None:
            if cfg is None:
                raise TypeError("dataset_names needs cfg: the check reads MODEL.NUM_CLASSES")
            _check_num_classes(cfg, dataset_names)

    def _check_ranges(self) -> None:
        if not 0.0 <= self.flip_prob <= 1.0:
            raise ConfigError(f"INPUT.RANDOM_FLIP_PROB must be in [0, 1], got {self.flip_prob}")
        if len(self.scale_range) != 2 or not 0.0 < self.scale_range[0] <= self.scale_range[1]:
            raise ConfigError(
                f"INPUT.RANDOM_SCALE must be [min, max] with 0 < min <= max, got "
                f"{list(self.scale_range)}; use [1.0, 1.0] to disable rescaling."
            )
        for key, size in (("TRAIN", self.max_size_train), ("TEST", self.max_size_test)):
            if size < 0:
                raise ConfigError(
                    f"INPUT.MAX_SIZE_{key} must be >= 0, got {size}; use 0 for no cap."
                )

    def __call__(self, record: dict[str, Any]) -> dict[str, Any] | None:
        """Map one record; return ``None`` if its image cannot be read."""
        file_name = record["file_name"]
        try:
            with Image.open(file_name) as f:
                image = f.convert("RGB")
        except (OSError, SyntaxError, ValueError) as e:
            # PIL raises OSError for missing/truncated files, SyntaxError for broken chunks.
            logger.warning(
                "Cannot read image %s (%s: %s); skipping it.", file_name, type(e).__name__, e
            )
            return None
        if self.is_train:
            image = self._augment(image)
        else:
            image = _resize(image, _cap_scale(image, self.max_size_test))
        pixels = np.asarray(image, dtype=np.uint8)
        return {
            "image": torch.from_numpy(np.ascontiguousarray(pixels.transpose(2, 0, 1))),
            "label": int(record["label"]),
            "height": int(record.get("height", image.height)),
            "width": int(record.get("width", image.width)),
            "file_name": file_name,
            "image_id": record.get("image_id", file_name),
        }

    def _augment(self, image: Image.Image) -> Image.Image:
        low, high = self.scale_range
        cap = _cap_scale(image, self.max_size_train)
        if self.flip_prob == 0.0 and low == high == 1.0:
            # No randomness needed, so usable outside a loader too.
            return _resize(image, cap)
        rng = sample_rng()
        # Draw both numbers every time, in a fixed order, so each has a fixed place in the
        # sample's random sequence whatever the other turned out to be.
        do_flip = rng.random() < self.flip_prob
        scale = rng.uniform(low, high)
        if self.scale_per_batch:
            # The per-image draw above is made anyway: a subclass drawing more from
            # sample_rng() then gets the same numbers in either mode.
            scale = batch_rng().uniform(low, high)
        # One resample with the product: cheaper and sharper than capping, then rescaling.
        image = _resize(image, cap * scale)
        if do_flip:  # after the resize, so it moves the fewest pixels
            image = image.transpose(Image.Transpose.FLIP_LEFT_RIGHT)
        return image

    def __repr__(self) -> str:
        return (
            f"ClassificationDatasetMapper(is_train={self.is_train}, flip_prob={self.flip_prob}, "
            f"scale_range={list(self.scale_range)}, scale_per_batch={self.scale_per_batch}, "
            f"max_size_train={self.max_size_train}, max_size_test={self.max_size_test})"
        )


def _check_num_classes(cfg: CfgNode, dataset_names: Sequence[str]) -> None:
    """Raise a ``ConfigError`` unless ``MODEL.NUM_CLASSES`` covers each one's ``thing_classes``."""
    num_classes = int(cfg.MODEL.NUM_CLASSES)
    for name in [dataset_names] if isinstance(dataset_names, str) else dataset_names:
        classes = MetadataCatalog.get(name).get("thing_classes", None)
        if classes is not None and num_classes < len(classes):
            raise ConfigError(
                f"MODEL.NUM_CLASSES={num_classes} but dataset {name!r} has {len(classes)} "
                f"classes; set MODEL.NUM_CLASSES {len(classes)}."
            )


def _cap_scale(image: Image.Image, max_size: int) -> float:
    """Factor that shrinks ``image`` so its longest side is ``max_size`` (1.0: no cap)."""
    longest = max(image.width, image.height)
    if max_size == 0 or longest <= max_size:
        return 1.0
    return max_size / longest


def _resize(image: Image.Image, scale: float) -> Image.Image:
    """Resize ``image`` by ``scale`` (bilinear, at least 1 pixel a side); 1.0 keeps it."""
    if scale == 1.0:
        return image
    size = (max(1, round(image.width * scale)), max(1, round(image.height * scale)))
    # PIL widens the bilinear kernel when shrinking, so downscaling also anti-aliases.
    return image.resize(size, Image.Resampling.BILINEAR)
