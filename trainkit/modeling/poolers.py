"""detectron2's pooling of box regions over feature levels: detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = ["ROIPooler", "assign_boxes_to_levels", "convert_boxes_to_pooler_format"]

_PLACEHOLDER_MODULE = True

_FEATURE = "pooling box regions from a feature pyramid"

ROIPooler = detection_only(
    "ROIPooler", __name__, _FEATURE, "use torchvision.ops.MultiScaleRoIAlign"
)
assign_boxes_to_levels = detection_only("assign_boxes_to_levels", __name__, _FEATURE)
convert_boxes_to_pooler_format = detection_only(
    "convert_boxes_to_pooler_format", __name__, _FEATURE
)
