"""detectron2's data structures: ``ImageList``, and the detection-only ones as placeholders.

The detection structures (boxes, instances, masks, keypoints) are made here, so that they
import from this package without loading a module of placeholders; detectron2's module
paths (``structures.boxes``, ``structures.instances``, ...) re-export them. Using one raises
:class:`trainkit.utils.detection_only.DetectionOnlyError`.
"""

from trainkit.structures.image_list import ImageList
from trainkit.utils.detection_only import detection_only

__all__ = [
    "BitMasks",
    "BoxMode",
    "Boxes",
    "ImageList",
    "Instances",
    "Keypoints",
    "PolygonMasks",
    "ROIMasks",
    "RotatedBoxes",
    "heatmaps_to_keypoints",
    "pairwise_ioa",
    "pairwise_iou",
    "pairwise_iou_rotated",
    "pairwise_point_box_distance",
    "polygons_to_bitmask",
]

BoxMode = detection_only("BoxMode", __name__, "box coordinate modes such as XYXY_ABS")
Boxes = detection_only("Boxes", __name__, "a tensor of axis-aligned boxes")
pairwise_iou = detection_only("pairwise_iou", __name__, "IoU between two sets of boxes")
pairwise_ioa = detection_only(
    "pairwise_ioa", __name__, "intersection over area between two sets of boxes"
)
pairwise_point_box_distance = detection_only(
    "pairwise_point_box_distance", __name__, "distances from points to box sides"
)
Instances = detection_only("Instances", __name__, "per-image detected or annotated instances")
Keypoints = detection_only("Keypoints", __name__, "per-instance keypoints")
heatmaps_to_keypoints = detection_only(
    "heatmaps_to_keypoints", __name__, "keypoint heatmap decoding"
)
BitMasks = detection_only("BitMasks", __name__, "per-instance bitmap masks")
PolygonMasks = detection_only("PolygonMasks", __name__, "per-instance polygon masks")
ROIMasks = detection_only("ROIMasks", __name__, "masks pasted from box regions")
polygons_to_bitmask = detection_only(
    "polygons_to_bitmask", __name__, "rasterising instance polygons"
)
RotatedBoxes = detection_only("RotatedBoxes", __name__, "a tensor of rotated boxes")
pairwise_iou_rotated = detection_only(
    "pairwise_iou_rotated", __name__, "IoU between two sets of rotated boxes"
)
