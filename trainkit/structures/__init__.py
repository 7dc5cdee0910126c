"""detectron2's data structures: ``ImageList``, and the detection-only ones as placeholders.

The detection structures (boxes, instances, masks, keypoints) import from here and from
detectron2's module paths (``structures.boxes``, ``structures.instances``, ...); using one
raises :class:`trainkit.utils.detection_only.DetectionOnlyError`.
"""

from trainkit.structures.boxes import Boxes, BoxMode, pairwise_ioa, pairwise_iou
from trainkit.structures.image_list import ImageList
from trainkit.structures.instances import Instances
from trainkit.structures.keypoints import Keypoints, heatmaps_to_keypoints
from trainkit.structures.masks import BitMasks, PolygonMasks, polygons_to_bitmask
from trainkit.structures.rotated_boxes import RotatedBoxes
from trainkit.structures.rotated_boxes import pairwise_iou as pairwise_iou_rotated

__all__ = [
    "BitMasks",
    "BoxMode",
    "Boxes",
    "ImageList",
    "Instances",
    "Keypoints",
    "PolygonMasks",
    "RotatedBoxes",
    "heatmaps_to_keypoints",
    "pairwise_ioa",
    "pairwise_iou",
    "pairwise_iou_rotated",
    "polygons_to_bitmask",
]
