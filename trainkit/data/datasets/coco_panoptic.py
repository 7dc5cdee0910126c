"""detectron2's COCO panoptic datasets: detection-only placeholders."""

from trainkit.data.datasets import register_coco_panoptic, register_coco_panoptic_separated
from trainkit.utils.detection_only import detection_only

__all__ = [
    "load_coco_panoptic_json",
    "merge_to_panoptic",
    "register_coco_panoptic",
    "register_coco_panoptic_separated",
]

_PLACEHOLDER_MODULE = True

load_coco_panoptic_json = detection_only(
    "load_coco_panoptic_json", __name__, "reading COCO panoptic annotations into records"
)
merge_to_panoptic = detection_only(
    "merge_to_panoptic", __name__, "merging instance and semantic records into panoptic ones"
)
