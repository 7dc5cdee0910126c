"""detectron2's rotated region proposal network: detection-only placeholders."""

from trainkit.utils.detection_only import detection_only

__all__ = ["RRPN", "find_top_rrpn_proposals"]

_PLACEHOLDER_MODULE = True

_FEATURE = "rotated region proposals for two-stage detectors"

RRPN = detection_only("RRPN", __name__, _FEATURE)
find_top_rrpn_proposals = detection_only("find_top_rrpn_proposals", __name__, _FEATURE)
