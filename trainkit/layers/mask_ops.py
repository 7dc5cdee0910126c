"""detectron2's operations on instance masks: detection-only placeholders."""

from trainkit.layers import paste_masks_in_image
from trainkit.utils.detection_only import detection_only

__all__ = ["pad_masks", "paste_mask_in_image_old", "paste_masks_in_image", "scale_boxes"]

_PLACEHOLDER_MODULE = True

paste_mask_in_image_old = detection_only(
    "paste_mask_in_image_old", __name__, "pasting one instance mask into the image"
)
pad_masks = detection_only("pad_masks", __name__, "padding instance masks")
scale_boxes = detection_only("scale_boxes", __name__, "scaling boxes about their centres")
