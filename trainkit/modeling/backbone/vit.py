"""detectron2's ViT backbone and its simple feature pyramid: placeholders (not shipped)."""

from trainkit.modeling.backbone import SimpleFeaturePyramid, ViT, get_vit_lr_decay_rate

__all__ = ["SimpleFeaturePyramid", "ViT", "get_vit_lr_decay_rate"]

_PLACEHOLDER_MODULE = True
