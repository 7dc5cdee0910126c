"""detectron2's Swin transformer backbone: a placeholder (not shipped)."""

from trainkit.modeling.backbone import SwinTransformer

__all__ = ["SwinTransformer"]

_PLACEHOLDER_MODULE = True
