"""detectron2's Cityscapes panoptic datasets: detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = ["load_cityscapes_panoptic", "register_all_cityscapes_panoptic"]

_PLACEHOLDER_MODULE = True

_FEATURE = "Cityscapes panoptic segmentation records"

load_cityscapes_panoptic = detection_only("load_cityscapes_panoptic", __name__, _FEATURE)
register_all_cityscapes_panoptic = detection_only(
    "register_all_cityscapes_panoptic", __name__, _FEATURE
)
