"""detectron2's selection of region proposals: detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = [
    "add_ground_truth_to_proposals",
    "add_ground_truth_to_proposals_single_image",
    "find_top_rpn_proposals",
]

_PLACEHOLDER_MODULE = True

_FEATURE = "region proposals for two-stage detectors"

find_top_rpn_proposals = detection_only("find_top_rpn_proposals", __name__, _FEATURE)
add_ground_truth_to_proposals = detection_only("add_ground_truth_to_proposals", __name__, _FEATURE)
add_ground_truth_to_proposals_single_image = detection_only(
    "add_ground_truth_to_proposals_single_image", __name__, _FEATURE
)
