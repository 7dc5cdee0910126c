"""detectron2's multiscale vision transformer backbone: a placeholder (not shipped)."""

from trainkit.modeling.backbone import MViT

__all__ = ["MViT"]

_PLACEHOLDER_MODULE = True
