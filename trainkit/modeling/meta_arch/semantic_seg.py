"""Semantic segmentation: ``SemanticSegmentor``, ``SEM_SEG_HEADS_REGISTRY`` and ``SemSegFPNHead``.

``SemanticSegmentor`` (in META_ARCH_REGISTRY) runs a backbone from MODEL.BACKBONE.NAME and a
head from MODEL.SEM_SEG_HEAD.NAME. A head is called as ``head(features, targets)`` and
returns ``(None, {loss name: loss})`` in training and ``(scores N x C x H x W, {})`` in
inference, scores at the input resolution (before ``sem_seg_postprocess``).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import fvcore.nn.weight_init as weight_init
import torch
from torch import nn
from torch.nn import functional as F

from trainkit.config import CfgNode, configurable
from trainkit.layers import Conv2d, ShapeSpec, get_norm
from trainkit.modeling.backbone import Backbone, build_backbone
from trainkit.modeling.build import META_ARCH_REGISTRY
from trainkit.modeling.postprocessing import sem_seg_postprocess
from trainkit.structures import ImageList
from trainkit.utils.errors import UnknownNameError, UsageError
from trainkit.utils.registry import Registry

__all__ = ["SEM_SEG_HEADS_REGISTRY", "SemSegFPNHead", "SemanticSegmentor", "build_sem_seg_head"]

SEM_SEG_HEADS_REGISTRY = Registry("SEM_SEG_HEADS")
SEM_SEG_HEADS_REGISTRY.__doc__ = """Registry of semantic segmentation heads.

A registered object is called as ``obj(cfg, input_shape)``, ``input_shape`` being the
backbone's ``{feature name: ShapeSpec}``, and returns an ``nn.Module`` with an
``ignore_value`` attribute (the label that targets are padded with).
"""


def build_sem_seg_head(cfg: CfgNode, input_shape: Mapping[str, ShapeSpec]) -> nn.Module:
    """Build the head registered as ``cfg.MODEL.SEM_SEG_HEAD.NAME``.

    Args:
        cfg: the config.
        input_shape: the backbone's output shapes by feature name.

    Raises:
        UnknownNameError: A ``KeyError``: if the name is not registered (the message lists
            those that are).
    """
    name = cfg.MODEL.SEM_SEG_HEAD.NAME
    if name not in SEM_SEG_HEADS_REGISTRY:
        raise UnknownNameError(
            SEM_SEG_HEADS_REGISTRY.unknown_name_message(name, key="MODEL.SEM_SEG_HEAD.NAME")
        )
    return SEM_SEG_HEADS_REGISTRY.get(name)(cfg, input_shape)


@META_ARCH_REGISTRY.register()
class SemanticSegmentor(nn.Module):
    """Backbone + semantic segmentation head, on records from ``DatasetMapper``.

    Inputs are dicts with ``"image"`` (C x H x W, the model's pixel format) and, for
    training, ``"sem_seg"`` (H x W integer labels); ``"height"``/``"width"`` choose the
    output resolution in inference. Training returns the head's losses; inference returns
    ``[{"sem_seg": C x height x width scores}]``.
    """

    @configurable
    def __init__(
        self,
        *,
        backbone: Backbone,
        sem_seg_head: nn.Module,
        pixel_mean: Sequence[float],
        pixel_std: Sequence[float],
    ) -> None:
        """Build the segmentor from its parts.

        Args:
            backbone: maps normalised images to named feature maps.
            sem_seg_head: maps those features (and targets) to scores and losses.
            pixel_mean, pixel_std: per-channel normalisation of the input images.
        """
        super().__init__()
        self.backbone = backbone
        self.sem_seg_head = sem_seg_head
        self.register_buffer("pixel_mean", torch.tensor(pixel_mean).view(-1, 1, 1), False)
        self.register_buffer("pixel_std", torch.tensor(pixel_std).view(-1, 1, 1), False)

    @classmethod
    def from_config(cls, cfg: CfgNode) -> dict[str, Any]:
        backbone = build_backbone(cfg)
        return {
            "backbone": backbone,
            "sem_seg_head": build_sem_seg_head(cfg, backbone.output_shape()),
            "pixel_mean": cfg.MODEL.PIXEL_MEAN,
            "pixel_std": cfg.MODEL.PIXEL_STD,
        }

    @property
    def device(self) -> torch.device:
        """The device the model is on."""
        return self.pixel_mean.device

    def forward(self, batched_inputs: list[dict[str, Any]]) -> Any:
        """Return losses (training) or per-image ``{"sem_seg": scores}`` (inference)."""
        divisibility = self.backbone.size_divisibility
        constraints = self.backbone.padding_constraints
        images = [
            (x["image"].to(self.device) - self.pixel_mean) / self.pixel_std for x in batched_inputs
        ]
        images = ImageList.from_tensors(images, divisibility, padding_constraints=constraints)
        features = self.backbone(images.tensor)
        targets = None
        if "sem_seg" in batched_inputs[0]:
            # Padding is labelled ignore_value so that it adds nothing to the loss.
            targets = ImageList.from_tensors(
                [x["sem_seg"].to(self.device) for x in batched_inputs],
                divisibility,
                self.sem_seg_head.ignore_value,
                padding_constraints=constraints,
            ).tensor
        results, losses = self.sem_seg_head(features, targets)
        if self.training:
            return losses
        per_image = zip(results, batched_inputs, images.image_sizes)
        return [
            {"sem_seg": sem_seg_postprocess(r, s, x.get("height", s[0]), x.get("width", s[1]))}
            for r, x, s in per_image
        ]


@SEM_SEG_HEADS_REGISTRY.register()
class SemSegFPNHead(nn.Module):
    """The semantic head of Panoptic FPN: every input level is brought to ``common_stride``.

    Each level in ``in_features`` gets ``max(1, log2(stride / common_stride))`` 3x3
    convolutions of ``conv_dims`` channels, each followed by a 2x bilinear upsampling
    while the level is coarser than ``common_stride``; the levels are summed and a 1x1
    predictor gives ``num_classes`` scores. The loss is cross entropy at the input
    resolution, ``ignore_value`` excluded.
    """

    @configurable
    def __init__(
        self,
        input_shape: Mapping[str, ShapeSpec],
        *,
        num_classes: int,
        conv_dims: int,
        common_stride: int,
        loss_weight: float = 1.0,
        norm: str | None = None,
        ignore_value: int = -1,
    ) -> None:
        """Build one scale head per input feature.

        Args:
            input_shape: shapes of the input features, by name (all of them are used).
            num_classes: number of classes to predict.
            conv_dims: channels of the intermediate convolutions.
            common_stride: the stride all levels are brought to before summing.
            loss_weight: multiplier of the loss.
            norm: normalisation of the convolutions (see :func:`get_norm`).
            ignore_value: the label excluded from the loss.
        """
        super().__init__()
        shapes = sorted(input_shape.items(), key=lambda item: item[1].stride)
        self.in_features = [name for name, _ in shapes]
        self.ignore_value = ignore_value
        self.common_stride = common_stride
        self.loss_weight = loss_weight
        self.scale_heads: list[nn.Sequential] = []
        for name, shape in shapes:
            stride = shape.stride or 1  # a ShapeSpec may leave it unset
            length = max(1, int(math.log2(stride) - math.log2(common_stride)))
            ops: list[nn.Module] = []
            for k in range(length):
                conv = Conv2d(
                    shape.channels if k == 0 else conv_dims,
                    conv_dims,
                    kernel_size=3,
                    padding=1,
                    bias=not norm,
                    norm=get_norm(norm, conv_dims),
                    activation=F.relu,
                )
                weight_init.c2_msra_fill(conv)
                ops.append(conv)
                if stride != common_stride:
                    ops.append(nn.Upsample(scale_factor=2, mode="bilinear", align_corners=False))
            self.scale_heads.append(nn.Sequential(*ops))
            # Registered under the feature's name: the state-dict keys detectron2's have.
            self.add_module(name, self.scale_heads[-1])
        self.predictor = Conv2d(conv_dims, num_classes, kernel_size=1)
        weight_init.c2_msra_fill(self.predictor)

    @classmethod
    def from_config(cls, cfg: CfgNode, input_shape: Mapping[str, ShapeSpec]) -> dict[str, Any]:
        head = cfg.MODEL.SEM_SEG_HEAD
        return {
            "input_shape": {k: v for k, v in input_shape.items() if k in head.IN_FEATURES},
            "ignore_value": head.IGNORE_VALUE,
            "num_classes": head.NUM_CLASSES,
            "conv_dims": head.CONVS_DIM,
            "common_stride": head.COMMON_STRIDE,
            "norm": head.NORM,
            "loss_weight": head.LOSS_WEIGHT,
        }

    def forward(
        self, features: Mapping[str, torch.Tensor], targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor | None, dict[str, torch.Tensor]]:
        """Return ``(None, losses)`` in training, ``(scores at input resolution, {})`` else."""
        x = self.layers(features)
        if self.training:
            return None, self.losses(x, targets)
        return self._upsample(x), {}

    def layers(self, features: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Sum the levels at ``common_stride`` and predict scores there."""
        x = sum(head(features[name]) for name, head in zip(self.in_features, self.scale_heads))
        return self.predictor(x)

    def losses(
        self, predictions: torch.Tensor, targets: torch.Tensor | None
    ) -> dict[str, torch.Tensor]:
        """Cross entropy of the upsampled ``predictions`` against ``targets``."""
        if targets is None:
            raise UsageError(
                "SemSegFPNHead needs targets in training: give each record a 'sem_seg' "
                "(DatasetMapper reads it from 'sem_seg_file_name')."
            )
        loss = F.cross_entropy(
            self._upsample(predictions), targets, reduction="mean", ignore_index=self.ignore_value
        )
        return {"loss_sem_seg": loss * self.loss_weight}

    def _upsample(self, x: torch.Tensor) -> torch.Tensor:
        return F.interpolate(
            x, scale_factor=self.common_stride, mode="bilinear", align_corners=False
        )
