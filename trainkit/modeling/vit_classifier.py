"""``ViTClassifier``: a small Vision Transformer for batches of images of different sizes.

The transformer counterpart of :class:`~trainkit.modeling.image_classifier.ImageClassifier`,
with the same inputs and outputs, built to be sharded block by block
(:mod:`trainkit.modeling.sharding`): its transformer blocks are the ``ModuleList``
``blocks``, each one FSDP unit and one activation-checkpointing unit.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Sequence
from typing import Any

import torch
import torch.nn.functional as F
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
from trainkit.modeling.masked_conv import MaskedConvStage
from trainkit.modeling.shape_plan import ShapePlan, shape_plans_from_config

__all__ = ["ViTClassifier"]

logger = logging.getLogger(__name__)

# The longest side, in pixels, the position embeddings cover when INPUT.MAX_SIZE_* is 0 (no
# cap): patches beyond it share the last row's or column's embedding.
_UNCAPPED_SIDE = 1024


class _Attention(nn.Module):
    """Multi-head self-attention whose keys leave out the padded patches."""

    def __init__(self, dim: int, heads: int):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: Tensor, keys: Tensor) -> Tensor:
        """Attend over tokens ``x`` [N, L, D]; ``keys`` [N, 1, 1, L]: True where one may attend."""
        n, length, dim = x.shape
        qkv = self.qkv(x).view(n, length, 3, self.heads, dim // self.heads)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each [N, heads, L, D / heads]
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=keys)
        return self.proj(out.transpose(1, 2).reshape(n, length, dim))


class _Block(nn.Module):
    """A pre-norm transformer block: ``x + attention(norm(x))``, then ``x + mlp(norm(x))``."""

    def __init__(self, dim: int, heads: int, mlp_ratio: float):
        super().__init__()
        hidden = int(round(dim * mlp_ratio))
        self.norm1 = nn.LayerNorm(dim)
        self.attn = _Attention(dim, heads)
        self.norm2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))

    def forward(self, x: Tensor, keys: Tensor) -> Tensor:
        """Return the block's output for tokens ``x`` [N, L, D] (``keys``: see _Attention)."""
        x = x + self.attn(self.norm1(x), keys)
        return x + self.mlp(self.norm2(x))


@META_ARCH_REGISTRY.register()
class ViTClassifier(nn.Module):
    """Classify each image of a batch with a Vision Transformer; images may differ in size.

    Input and output as :class:`~trainkit.modeling.image_classifier.ImageClassifier`: a list
    of dicts with ``"image"`` (uint8 or float tensor [3, H, W], RGB, 0-255) and, in training,
    ``"label"`` (int); ``{"loss_cls": cross-entropy}`` in training mode, logits
    [N, NUM_CLASSES] in eval mode.

    1. Each image is normalised on its own (``MODEL.CLASSIFIER.INPUT_NORM``) and the batch is
       zero-padded to a common size rounded up to ``MODEL.VIT.PATCH_SIZE``.
    2. An optional convolutional stem (the ViT paper's "hybrid"; "early convolutions help
       transformers see better"): one stage per entry of ``MODEL.VIT.STEM_CHANNELS``, each
       ``MODEL.CLASSIFIER.CONVS_PER_STAGE`` 3x3 convs (the first of stride 2) with masked
       batch norm and ReLU: ``ImageClassifier``'s stages (``MaskedConvStage``), so padded
       pixels stay exactly zero.
    3. Patch embedding: a conv with kernel and stride ``PATCH_SIZE / 2**len(STEM_CHANNELS)``
       (``PATCH_SIZE`` without a stem) to ``MODEL.VIT.DIM`` channels, one token per
       ``PATCH_SIZE`` x ``PATCH_SIZE`` patch of the image, plus a learned position
       embedding: a row embedding plus a column embedding, taken from the top-left of a
       grid sized for the largest image the config allows (``INPUT.MAX_SIZE_TRAIN`` times
       ``RANDOM_SCALE[1]``, and ``INPUT.MAX_SIZE_TEST``); patches past it share the grid's
       last row or column.
    4. ``MODEL.VIT.DEPTH`` pre-norm transformer blocks (``MODEL.VIT.HEADS`` attention heads,
       an MLP of ``MLP_RATIO * DIM`` hidden units).
    5. A final layer norm, the mean over the image's patches and a linear head.

    A patch is valid when it holds at least one real pixel. Padded patches are left out of
    every attention's keys and of the mean, and a valid patch's embedding does not depend
    on the padded size, so in eval mode an image's logits do not depend on its batch-mates
    (up to rounding).

    Sharding: ``block_modules = ("blocks",)``; the stem, the patch and position embeddings,
    the final norm and the head go with the root. Compiling (``MODEL.COMPILE.ENABLED``): step
    1 stays eager; steps 2-5 and the loss are ``train_network`` and ``eval_network``, and batches
    are padded to the shape plans (samples added to a batch have no valid patch and count
    nowhere), as for ``ImageClassifier``.
    """

    # The compile seam: the tensor-in, tensor-out methods compile_model compiles.
    compiled_methods = ("train_network", "eval_network")
    # The sharding seam: each transformer block is an FSDP unit and a checkpointing unit.
    block_modules = ("blocks",)

    @configurable
    def __init__(
        self,
        *,
        num_classes: int,
        patch_size: int = 8,
        stem_channels: Sequence[int] = (),
        stem_convs_per_stage: int = 2,
        dim: int = 64,
        depth: int = 4,
        heads: int = 4,
        mlp_ratio: float = 2.0,
        pos_grid: int = 16,
        input_norm: str = "image",
        label_smoothing: float = 0.0,
        pixel_mean: Sequence[float] = (127.5, 127.5, 127.5),
        pixel_std: Sequence[float] = (64.0, 64.0, 64.0),
        channels_last: bool = False,
        shape_plans: tuple[ShapePlan | None, ShapePlan | None] | None = None,
    ):
        """Build the network from ``cfg`` (``ViTClassifier(cfg)``) or from the arguments.

        Args:
            num_classes: ``MODEL.NUM_CLASSES``.
            patch_size, stem_channels, dim, depth, heads, mlp_ratio: the ``MODEL.VIT`` keys
                (lower case); ``stem_channels`` empty: no stem (a linear patch embedding).
            stem_convs_per_stage: ``MODEL.CLASSIFIER.CONVS_PER_STAGE``: 3x3 convs per stem
                stage, as in ``ImageClassifier``'s stages (read only with a stem).
            pos_grid: patches per side the position embeddings cover; from a config, the
                largest image ``INPUT.MAX_SIZE_TRAIN/TEST`` and ``RANDOM_SCALE`` allow.
            input_norm, label_smoothing: ``MODEL.CLASSIFIER.INPUT_NORM/LABEL_SMOOTHING``.
            pixel_mean, pixel_std: ``MODEL.PIXEL_MEAN/STD`` (read with input norm "pixel").
            channels_last: ``MODEL.CHANNELS_LAST``: the padded input batch is channels-last.
            shape_plans: the (training, evaluation) padding plans; None pads to the batch's
                own size rounded up to ``patch_size``. From a config they are planned when
                ``MODEL.COMPILE.ENABLED``.

        Raises:
            ConfigError: A ``ValueError`` naming the key, for a value the checks below refuse.
        """
        super().__init__()
        num_classes, self.patch_size = int(num_classes), int(patch_size)
        dim, depth, heads, pos_grid = int(dim), int(depth), int(heads), int(pos_grid)
        mlp_ratio = float(mlp_ratio)
        stem = [int(c) for c in stem_channels]
        stem_stride, stem_convs = 2 ** len(stem), int(stem_convs_per_stage)
        self.input_norm = norm = str(input_norm)
        self.label_smoothing = smoothing = float(label_smoothing)
        self.channels_last = bool(channels_last)
        mean, std = list(pixel_mean), list(pixel_std)
        for valid, key, requirement, value in [
            (num_classes >= 1, "NUM_CLASSES", ">= 1", num_classes),
            (self.patch_size >= 1, "VIT.PATCH_SIZE", ">= 1", self.patch_size),
            (min(stem, default=1) >= 1, "VIT.STEM_CHANNELS", "positive ints (or [])", stem),
            (
                stem_convs >= 1 or not stem,
                "CLASSIFIER.CONVS_PER_STAGE",
                ">= 1 (with MODEL.VIT.STEM_CHANNELS)",
                stem_convs,
            ),
            (
                self.patch_size % stem_stride == 0,
                "VIT.PATCH_SIZE",
                f"divisible by the stride {stem_stride} of MODEL.VIT.STEM_CHANNELS={stem}",
                self.patch_size,
            ),
            (heads >= 1, "VIT.HEADS", ">= 1", heads),
            (dim >= 1 and dim % heads == 0, "VIT.DIM", "a positive multiple of HEADS", dim),
            (depth >= 1, "VIT.DEPTH", ">= 1", depth),
            (mlp_ratio > 0, "VIT.MLP_RATIO", "> 0", mlp_ratio),
            (pos_grid >= 1, "INPUT.MAX_SIZE_TRAIN/TEST (the position grid)", ">= 1", pos_grid),
            (norm in INPUT_NORMS, "CLASSIFIER.INPUT_NORM", f"one of {INPUT_NORMS}", repr(norm)),
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
        # Each stage halves the resolution: the patch embedding's kernel covers what is left
        # of a patch, so a token still stands for PATCH_SIZE x PATCH_SIZE pixels.
        self.stem = nn.ModuleList(
            MaskedConvStage(i, o, stem_convs) for i, o in zip([3, *stem[:-1]], stem)
        )
        embed_in, self.embed_size = (stem or [3])[-1], self.patch_size // stem_stride
        self.patch_embed = nn.Conv2d(embed_in, dim, self.embed_size, stride=self.embed_size)
        # Row plus column embeddings: parameters grow with the side, not the area, of the
        # largest image (an uncapped config would otherwise need a huge 2-D grid).
        self.pos_row = nn.Parameter(torch.zeros(pos_grid, dim))
        self.pos_col = nn.Parameter(torch.zeros(pos_grid, dim))
        self.blocks = nn.ModuleList(_Block(dim, heads, mlp_ratio) for _ in range(depth))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        self.shape_plans = shape_plans
        self._warned_grid = False
        self._init_weights()

    def _init_weights(self) -> None:
        # The usual ViT initialisation (small truncated-normal weights, zero biases); the
        # order of the draws is fixed, so a seed gives the same model.
        nn.init.trunc_normal_(self.pos_row, std=0.02)
        nn.init.trunc_normal_(self.pos_col, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                nn.init.zeros_(module.bias)

    @classmethod
    def from_config(cls, cfg: CfgNode) -> dict[str, Any]:
        """Return the arguments ``cfg`` gives (see ``__init__``)."""
        vit = cfg.MODEL.VIT
        patch = int(vit.PATCH_SIZE)
        sides = [
            int(cfg.INPUT.MAX_SIZE_TRAIN) * max(float(s) for s in cfg.INPUT.RANDOM_SCALE),
            int(cfg.INPUT.MAX_SIZE_TEST),
        ]
        longest = max(side if side > 0 else _UNCAPPED_SIDE for side in sides)
        return {
            "num_classes": cfg.MODEL.NUM_CLASSES,
            "patch_size": patch,
            "stem_channels": vit.STEM_CHANNELS,
            "stem_convs_per_stage": cfg.MODEL.CLASSIFIER.CONVS_PER_STAGE,
            "dim": vit.DIM,
            "depth": vit.DEPTH,
            "heads": vit.HEADS,
            "mlp_ratio": vit.MLP_RATIO,
            "pos_grid": math.ceil(longest / patch) if patch >= 1 else 1,
            "input_norm": cfg.MODEL.CLASSIFIER.INPUT_NORM,
            "label_smoothing": cfg.MODEL.CLASSIFIER.LABEL_SMOOTHING,
            "pixel_mean": cfg.MODEL.PIXEL_MEAN,
            "pixel_std": cfg.MODEL.PIXEL_STD,
            "channels_last": cfg.MODEL.CHANNELS_LAST,
            "shape_plans": (
                shape_plans_from_config(cfg, divisibility=patch)
                if cfg.MODEL.COMPILE.ENABLED
                else None
            ),
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
            width in the batch rounded up to the patch size; with a shape plan for the
            current mode, N, H and W are the plan's (rows past the inputs are all padding).
        """
        if len(batched_inputs) == 0:
            raise ValueError("ViTClassifier got an empty batch")
        images = [to_device(x["image"], self.device) for x in batched_inputs]
        plan = None if self.shape_plans is None else self.shape_plans[0 if self.training else 1]
        batch, mask = pad_images(
            images, self._normalize, size_divisibility=self.patch_size, plan=plan
        )
        grid = max(batch.shape[-2:]) // self.patch_size
        if grid > self.pos_row.shape[0] and not self._warned_grid:
            self._warned_grid = True
            logger.warning(
                "ViTClassifier: a batch %d patches across is larger than the %d patches the "
                "position embeddings cover; the patches past them share the last row's or "
                "column's. Raise INPUT.MAX_SIZE_TRAIN/TEST to the largest image size.",
                grid,
                self.pos_row.shape[0],
            )
        if self.channels_last:
            batch = batch.contiguous(memory_format=torch.channels_last)
        return batch, mask

    def _position_embedding(self, rows: int, cols: int) -> Tensor:
        """Return the embeddings [rows * cols, D] of the top-left patches, row-major."""
        last = self.pos_row.shape[0] - 1
        row = self.pos_row[torch.arange(rows, device=self.pos_row.device).clamp(max=last)]
        col = self.pos_col[torch.arange(cols, device=self.pos_col.device).clamp(max=last)]
        return (row[:, None, :] + col[None, :, :]).flatten(0, 1)

    def _logits(self, images: Tensor, mask: Tensor) -> Tensor:
        """Stem, embedding, blocks, pooling and head: logits [N, C] of a padded batch."""
        for stage in self.stem:
            images, mask = stage(images, mask)
        tokens = self.patch_embed(images)  # [N, D, rows, cols]
        rows, cols = tokens.shape[-2:]
        tokens = tokens.flatten(2).transpose(1, 2) + self._position_embedding(rows, cols)
        # A patch is valid when it holds a real pixel; a sample the shape plan added has
        # none, and attends to all its (padding) tokens instead, so no softmax row is empty.
        # (After the stem, a mask pixel is its stride's top-left input pixel, and a patch's
        # top-left pixel is real iff any of its pixels is: the test is the same.)
        valid = F.max_pool2d(mask, self.embed_size).flatten(1) > 0  # [N, L]
        keys = valid | ~valid.any(dim=1, keepdim=True)
        keys = keys[:, None, None, :]  # broadcast over heads and queries
        for block in self.blocks:
            tokens = block(tokens, keys)
        weights = valid.to(tokens.dtype)[:, :, None]
        pooled = (self.norm(tokens) * weights).sum(dim=1) / weights.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)

    def eval_network(self, images: Tensor, mask: Tensor) -> Tensor:
        """Return the logits [N, C] of a preprocessed batch (the compiled part, eval mode)."""
        return self._logits(images, mask)

    def train_network(self, images: Tensor, mask: Tensor, labels: Tensor) -> Tensor:
        """Return the mean cross-entropy over the batch's real samples (compiled, training).

        Args:
            images: from :meth:`preprocess_image`.
            mask: from :meth:`preprocess_image`.
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
