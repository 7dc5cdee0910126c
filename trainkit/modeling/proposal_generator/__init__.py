"""detectron2's region proposal generators (RPN, RRPN): detection-only placeholders."""

from trainkit.modeling import (
    PROPOSAL_GENERATOR_REGISTRY,
    RPN_HEAD_REGISTRY,
    build_proposal_generator,
    build_rpn_head,
)
from trainkit.utils.detection_only import detection_only

__all__ = [
    "PROPOSAL_GENERATOR_REGISTRY",
    "RPN",
    "RPN_HEAD_REGISTRY",
    "StandardRPNHead",
    "build_proposal_generator",
    "build_rpn_head",
]

_PLACEHOLDER_MODULE = True

_FEATURE = "region proposals for two-stage detectors"

RPN = detection_only("RPN", __name__, _FEATURE)
StandardRPNHead = detection_only("StandardRPNHead", __name__, _FEATURE)
