"""detectron2's IoU-based box regression losses: detection-only placeholders."""

from trainkit.layers import ciou_loss, diou_loss

__all__ = ["ciou_loss", "diou_loss"]

_PLACEHOLDER_MODULE = True
