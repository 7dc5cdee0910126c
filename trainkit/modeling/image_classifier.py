"""``ImageClassifier``: a small CNN for batches of images of different sizes (padding-blind)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from trainkit.config import CfgNode, ConfigError, configurable
from trainkit.modeling.build import META_ARCH_REGISTRY
from trainkit.modeling.image_batch import (
    INPUT_NORMS,
    classify_padded_batch,
    masked_cross_entropy,
    normalize_image,
    pad_images,
    to_device,
)
from trainkit.modeling.masked_conv import MaskedBatchNorm2d, MaskedConvStage
from trainkit.modeling.shape_plan import ShapePlan, shape_plans_from_config

# MaskedBatchNorm2d lives in masked_conv (shared with ViTClassifier's stem); it is still
# importable from here, where it was first defined.
__all__ = ["ImageClassifier", "MaskedBatchNorm2d"]

_POOLS = ("avg", "max", "avgmax")


@META_ARCH_REGISTRY.register()
class ImageClassifier(nn.Module):
    """Classify each image of a batch; images may differ in size.

    Input: a list of dicts with ``"image"`` (uint8 or float tensor [3, H, W], RGB, 0-255)
    and, in training, ``"label"`` (int), as produced by ``ClassificationDatasetMapper``.

    1. Each image is normalised on its own (``MODEL.CLASSIFIER.INPUT_NORM``): ``"image"``
       subtracts the image's per-channel mean and divides by its standard deviation, both
       over its valid pixels; ``"pixel"`` uses the fixed ``MODEL.PIXEL_MEAN/STD``.
    2. The batch is zero-padded to a common size rounded up to ``CLASSIFIER.SIZE_DIVISIBILITY``.
    3. One stage per entry of ``MODEL.CLASSIFIER.CHANNELS``: a stride-2 conv then
       ``CONVS_PER_STAGE - 1`` stride-1 convs, each with masked BN and ReLU.
    4. Global pooling over valid pixels (``MODEL.CLASSIFIER.POOL``: average, max, or both
       concatenated) and a linear head.

    A mask of valid pixels follows the features: padding is zeroed after every conv, and
    batch-norm statistics and the pooling count valid pixels only. In eval mode an image's
    logits therefore do not depend on its batch-mates, nor on the padding they force on it.

    Output: ``{"loss_cls": cross-entropy}`` (with ``MODEL.CLASSIFIER.LABEL_SMOOTHING``) in
    training mode, logits [N, NUM_CLASSES] in eval mode. It does not resize images (the
    mapper does) or post-process predictions.

    Compiling (``MODEL.COMPILE.ENABLED``): steps 1-2 stay eager; steps 3-4 and the loss are
    the methods ``train_network`` and ``eval_network`` that ``compiled_methods`` names
    (:mod:`trainkit.modeling.compile`). With ``shape_plans`` each batch is padded to a
    planned shape (:mod:`trainkit.modeling.shape_plan`), its batch dimension included: the
    added samples have an all-zero mask, so they count in neither the loss, nor the BN
    statistics, nor the returned logits.
    """

    # The compile seam: the tensor-in, tensor-out methods compile_model compiles.
    compiled_methods = ("train_network", "eval_network")
    # The sharding seam: each stage is a block (trainkit.modeling.sharding); the head goes
    # with the root.
    block_modules = ("stages",)

    @configurable
    def __init__(
        self,
        *,
        num_classes: int,
        channels: Sequence[int] = (16, 32, 64, 96),
        convs_per_stage: int = 2,
        size_divisibility: int = 16,
        input_norm: str = "image",
        pool: str = "avgmax",
        label_smoothing: float = 0.0,
        pixel_mean: Sequence[float] = (127.5, 127.5, 127.5),
        pixel_std: Sequence[float] = (64.0, 64.0, 64.0),
        channels_last: bool = False,
        shape_plans: tuple[ShapePlan | None, ShapePlan | None] | None = None,
    ):
        """Build the network from ``cfg`` (``ImageClassifier(cfg)``) or from the arguments.

        The arguments are the ``MODEL.CLASSIFIER`` keys (lower case), ``MODEL.NUM_CLASSES``,
        ``MODEL.PIXEL_MEAN/STD`` and ``MODEL.CHANNELS_LAST`` (the padded input batch is made
        channels-last; ``build_model`` converts the weights), with their defaults; a
        LazyConfig passes them explicitly (``LazyCall(ImageClassifier)(num_classes=6, ...)``).
        ``shape_plans``: the (training, evaluation) padding plans; None pads to the batch's own
        size rounded to ``size_divisibility``. From a config they are planned when
        MODEL.COMPILE.ENABLED.

        Raises:
            ConfigError: A ``ValueError`` naming the key, for a value the checks below refuse.
        """
        super().__init__()
        channels = [int(c) for c in channels]
        num_classes = int(num_classes)
        self.size_divisibility = divisibility = int(size_divisibility)
        convs_per_stage = int(convs_per_stage)
        self.input_norm = norm = str(input_norm)
        self.pool = pool = str(pool)
        self.label_smoothing = smoothing = float(label_smoothing)
        self.channels_last = bool(channels_last)
        mean, std = list(pixel_mean), list(pixel_std)
        norms, pools = ", ".join(INPUT_NORMS), ", ".join(_POOLS)
        for valid, key, requirement, value in [
            (channels and min(channels) >= 1, "CLASSIFIER.CHANNELS", "positive ints", channels),
            (num_classes >= 1, "NUM_CLASSES", ">= 1", num_classes),
            (divisibility >= 1, "CLASSIFIER.SIZE_DIVISIBILITY", ">= 1", divisibility),
            (convs_per_stage >= 1, "CLASSIFIER.CONVS_PER_STAGE", ">= 1", convs_per_stage),
            (norm in INPUT_NORMS, "CLASSIFIER.INPUT_NORM", f"one of {norms}", repr(norm)),
            (pool in _POOLS, "CLASSIFIER.POOL", f"one of {pools}", repr(pool)),
            (0.0 <= smoothing < 1.0, "CLASSIFIER.LABEL_SMOOTHING", "in [0, 1)", smoothing),
            (
                len(mean) == 3 and len(std) == 3 and min(std) > 0,
                "PIXEL_MEAN and MODEL.PIXEL_STD",
                "3 values each (RGB, std > 0)",
                f"{mean} and {std}",
            ),
        ]:
            if not valid:
                raise ConfigError(f"MODEL.{key} must be {requirement}, got {value}")
        # Not persistent: they come from the config, so checkpoints need not carry them.
        self.register_buffer("pixel_mean", torch.tensor(mean).view(3, 1, 1), persistent=False)
        self.register_buffer("pixel_std", torch.tensor(std).view(3, 1, 1), persistent=False)
        self.stages = nn.ModuleList(
            MaskedConvStage(i, o, convs_per_stage) for i, o in zip([3, *channels[:-1]], channels)
        )
        self.head = nn.Linear(channels[-1] * (2 if pool == "avgmax" else 1), num_classes)
        self.shape_plans = shape_plans

    @classmethod
    def from_config(cls, cfg: CfgNode) -> dict[str, Any]:
        """Return the arguments ``cfg.MODEL`` gives (see ``__init__``)."""
        clf = cfg.MODEL.CLASSIFIER
        return {
            "num_classes": cfg.MODEL.NUM_CLASSES,
            "channels": clf.CHANNELS,
            "convs_per_stage": clf.CONVS_PER_STAGE,
            "size_divisibility": clf.SIZE_DIVISIBILITY,
            "input_norm": clf.INPUT_NORM,
            "pool": clf.POOL,
            "label_smoothing": clf.LABEL_SMOOTHING,
            "pixel_mean": cfg.MODEL.PIXEL_MEAN,
            "pixel_std": cfg.MODEL.PIXEL_STD,
            "channels_last": cfg.MODEL.CHANNELS_LAST,
            "shape_plans": shape_plans_from_config(cfg) if cfg.MODEL.COMPILE.ENABLED else None,
        }

    @property
    def device(self) -> torch.device:
        """The device of the model's parameters."""
        return self.pixel_mean.device

    def _normalize(self, image: Tensor) -> Tensor:
        """Normalise one float image [3, h, w] (0-255) as ``self.input_norm`` says."""
        return normalize_image(image, self.input_norm, self.pixel_mean, self.pixel_std)

    def preprocess_image(self, batched_inputs: list[dict[str, Any]]) -> tuple[Tensor, Tensor]:
        """Normalise and zero-pad the images into one batch.

        Returns:
            Images [N, 3, H, W] (float, normalised, zero padding) and a mask [N, 1, H, W]
            that is 1 on real pixels and 0 on padding. H and W are the largest height and
            width in the batch rounded up to ``size_divisibility``; with a shape plan for the
            current mode, N, H and W are the plan's (rows past the inputs are all padding).
        """
        if len(batched_inputs) == 0:
            raise ValueError("ImageClassifier got an empty batch")
        images = [to_device(x["image"], self.device) for x in batched_inputs]
        plan = None if self.shape_plans is None else self.shape_plans[0 if self.training else 1]
        batch, mask = pad_images(
            images, self._normalize, size_divisibility=self.size_divisibility, plan=plan
        )
        if self.channels_last:  # every conv and masked op after this keeps the layout
            batch = batch.contiguous(memory_format=torch.channels_last)
        return batch, mask

    def _global_pool(self, x: Tensor, mask: Tensor) -> Tensor:
        """Pool features [N, C, H, W] over the valid pixels of ``mask`` into [N, C or 2C]."""
        pooled = []
        if self.pool in ("avg", "avgmax"):
            # Padding is already zero; it must only not count in the denominator.
            pooled.append(x.sum(dim=(2, 3)) / mask.sum(dim=(2, 3)).clamp(min=1.0))
        if self.pool in ("max", "avgmax"):
            # The max picks up a local detail (a corner, a tip) wherever it is, which the
            # average dilutes in large images. Padding is excluded explicitly rather than
            # relying on ReLU outputs being >= 0. Every image keeps its top-left pixel
            # valid at every stage, so no row is all -inf.
            pooled.append(x.masked_fill(mask == 0, float("-inf")).amax(dim=(2, 3)))
        return torch.cat(pooled, dim=1) if len(pooled) > 1 else pooled[0]

    def _logits(self, x: Tensor, mask: Tensor) -> Tensor:
        """Stages, pooling and head: logits [N, C] of a padded batch; 0 rows for empty samples."""
        valid = mask.flatten(1).amax(dim=1, keepdim=True) > 0  # [N, 1]: False for added rows
        for stage in self.stages:
            x, mask = stage(x, mask)
        # An added sample pools to -inf (max over no pixel): zero it, so no inf or NaN
        # reaches the head, the loss or the gradients.
        pooled = torch.where(valid, self._global_pool(x, mask), 0.0)
        return self.head(pooled)

    def eval_network(self, images: Tensor, mask: Tensor) -> Tensor:
        """Return the logits [N, C] of a preprocessed batch (the compiled part, eval mode)."""
        return self._logits(images, mask)

    def train_network(self, images: Tensor, mask: Tensor, labels: Tensor) -> Tensor:
        """Return the mean cross-entropy over the batch's real samples (compiled, training).

        Args:
            images, mask: from :meth:`preprocess_image`.
            labels: int64 [N], anything for the added (all-padding) rows.
        """
        logits = self._logits(images, mask)
        return masked_cross_entropy(logits, labels, mask, self.label_smoothing)

    def forward(self, batched_inputs: list[dict[str, Any]]) -> dict[str, Tensor] | Tensor:
        """Return ``{"loss_cls": ...}`` in training mode, logits [N, C] in eval mode.

        Raises:
            KeyError: In training mode, if an input has no ``"label"``.
        """
        return classify_padded_batch(self, batched_inputs)
